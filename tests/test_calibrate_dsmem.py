"""lab/tools/calibrate/bench_dsmem.py: its round compiles for sm_90a on the CPU with the st.async
(STAS) it times, and the profiles' DSMEM facts are what its recorded runs say.

Run: pytest tests/test_calibrate_dsmem.py (CPU)
"""
import json
from pathlib import Path

import pytest

from fa4sim import hardware

ROOT = Path(__file__).resolve().parents[1]
from lab.tools.index import path_of  # noqa: E402
RESULTS = ROOT / "lab" / "campaigns"


@pytest.mark.compile
def test_dsmem_round_compiles_to_st_async():
    pytest.importorskip("cutlass")
    from lab.tools.calibrate import bench_dsmem
    from lab.tools.calibrate.common import compile_for_sass, sass_count

    sass = compile_for_sass(bench_dsmem.make(), *bench_dsmem.fake_args())
    assert sass_count(sass, "STAS") >= 1
    assert sass_count(sass, "UCGABAR") + sass_count(sass, "CGAERRBAR") + sass_count(sass, "BAR") >= 1


def test_slope_is_bytes_per_cycle():
    pytest.importorskip("cutlass")
    from lab.tools.calibrate.bench_dsmem import slope

    # a fixed 500 cycles per round plus 1 cycle per 20 bytes
    pts = [(b, 500 + b / 20) for b in (4096, 16384, 32768, 65536)]
    assert slope(pts) == pytest.approx(20.0)


def test_profiles_take_the_dsmem_facts_from_the_runs():
    pytest.importorskip("cutlass")
    from lab.tools.calibrate.bench_dsmem import facts

    for gpu in ("h100", "h200"):
        got = facts(json.loads(path_of(f"dsmem_{gpu}_2026-11-27.json").read_text()))
        hw = hardware.load(gpu)
        assert hw.dsmem_bytes_per_clk == pytest.approx(got["dsmem_bytes_per_clk"], abs=0.01), gpu
        assert hw.dsmem_queue_bytes == pytest.approx(got["dsmem_queue_bytes"], abs=1), gpu
        # what the numbers say: ~19 B per clock, ~10 KB in flight when the senders go on
        assert 18 < got["dsmem_bytes_per_clk"] < 21 and 8000 < got["dsmem_queue_bytes"] < 12000, gpu
