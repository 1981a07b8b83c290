"""CPU-only: the SASS facts fa4sim keeps as data still match what the compiler makes.

- fa4sim/schedules/pv_wait_sm90.py: where ptxas puts the PV wait in fa4kernel's builds
  (benchmarks/pv_wait_sass.py wrote the table; a few builds are recompiled here).
- benchmarks/calibrate/bench_bursts.py: its burst loops hold exactly the instructions it times.

Run: pytest -m compile tests/test_sass_tables_compile.py
"""
import pytest

pytest.importorskip("cutlass")

import fa4kernel  # noqa: E402
from fa4kernel.config import make_config  # noqa: E402
from fa4sim.schedules.pv_wait_sm90 import TABLES  # noqa: E402

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("build", [
    {"hdim": 128, "causal": False},
    {"hdim": 128, "causal": True},
    {"hdim": 128, "causal": True, "exp_emulation": 0.125},
    {"hdim": 256, "causal": False},
])
def test_pv_wait_table_matches_fresh_sass(build):
    """If a compiler or kernel change moves the PV wait, this fails: rerun benchmarks/pv_wait_sass.py."""
    from benchmarks.pv_wait_sass import split

    row = next(frac for b, frac in TABLES["fa4kernel"]
               if all(b.get(k) == v for k, v in build.items()) and set(b) - {"tile_n", "rescale_before_pv"} == set(build))
    knobs = {k: v for k, v in build.items() if k not in ("hdim", "causal")}
    cfg = make_config("bfloat16", build["hdim"], build["causal"], False, knobs)
    got = split(fa4kernel.compile_sass(cfg, arch="sm_90a"))
    assert got == pytest.approx(row, abs=1e-3), (build, got, row)


def test_bench_bursts_loops_hold_their_planned_instructions(capsys):
    from benchmarks.calibrate import bench_bursts

    assert bench_bursts.check_sass() == 0, capsys.readouterr().out
