"""bench_power's loads on a share of the SMs and side by side ("A|B": a kernel load and a TMA load
on disjoint SMs), fit_power --check (loads against a profile as it is) and dram_bytes_sm90 (ncu's
HBM bytes against fa4sim's). No GPU: recorded files and stand-ins for CUDA events."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from lab.tools.index import path_of  # noqa: E402
RESULTS = ROOT / "lab" / "campaigns"
SPLIT_H100 = path_of("power_split_h100_2026-11-28.json")
SPLIT_H200 = [path_of("power_split_h200_2026-11-28.json"), path_of("power_split_h200_2026-11-28_again.json")]
DRAM = path_of("dram_bytes_h200_2026-11-28.json")


@pytest.fixture(scope="module")
def bp():
    pytest.importorskip("cutlass")
    from lab.tools.calibrate import bench_power

    return bench_power


def test_layout_splits_the_sms(bp):
    assert bp.layout("tensor256", 132) == (132, None, 0)
    assert bp.layout("tensor256+mix2_half", 132) == (66, None, 0)
    assert bp.layout("tma_hbm", 132) == (None, "tma_hbm", 132)
    assert bp.layout("tma_hbm_quarter", 132) == (None, "tma_hbm_quarter", 33)
    assert bp.layout("tensor256+mix2|tma_hbm_half", 132) == (66, "tma_hbm_half", 66)
    assert bp.layout("tensor256+mix2|tma_hbm_quarter", 132) == (99, "tma_hbm_quarter", 33)


def test_every_split_load_names_a_kernel_load_and_a_tma_load(bp):
    split = [n for n in bp.LOADS if "|" in n]
    assert len(split) >= 4
    for name in split:
        ctas, mem, mem_ctas = bp.layout(name, 132)
        assert mem.startswith("tma_") and mem in bp.LOADS and ctas + mem_ctas == 132, name
        assert bp.LOADS[name][1] == 1, name  # the kernel side runs the wgmma


class _Event:
    """A CUDA event stand-in: elapsed_time between two events is the difference of their times (ms)."""

    def __init__(self, t):
        self.t = t

    def elapsed_time(self, other):
        return other.t - self.t


def test_bytes_within_counts_the_share_of_each_launch_inside_the_window(bp):
    ts = bp.TmaStream.__new__(bp.TmaStream)  # no GPU: only the byte accounting
    ts.bytes_per_launch = 1000.0
    launches = [(_Event(0.0), _Event(10.0)), (_Event(10.0), _Event(20.0)), (_Event(20.0), _Event(30.0))]
    # window 5..25 ms: half of the first launch, all of the second, half of the third
    assert ts.bytes_within(launches, _Event(5.0), _Event(25.0)) == pytest.approx(2000.0)
    assert ts.bytes_within(launches, _Event(30.0), _Event(40.0)) == 0.0


def test_tma_activity_puts_hbm_bytes_through_l2(bp):
    ts = bp.TmaStream.__new__(bp.TmaStream)
    ts.name = "tma_hbm_half"
    act = ts.activity(2e12, 2.0)
    assert act["l2_bytes"] == act["hbm_bytes"] == pytest.approx(1000.0)
    ts.name = "tma_l2_half"
    assert ts.activity(2e12, 2.0)["hbm_bytes"] == 0.0


def test_recorded_split_loads_hold_tensor_and_memory_activity():
    from lab.tools.calibrate import fit_power

    for path in [SPLIT_H100, *SPLIT_H200]:
        _, loads, meta = fit_power.read(str(path))
        by = {ld["name"]: ld for ld in loads}
        both = by["tensor256+mix2|tma_hbm_half"]["rates"]
        # half the SMs at the full wgmma rate, the other half's HBM bytes
        assert both["tensor"] == pytest.approx(by["tensor256+mix2"]["rates"]["tensor"] / 2, rel=0.02), path
        assert both["hbm"] > 0 and both["l2"] == both["hbm"], path
        assert by["tma_hbm_quarter"]["rates"]["hbm"] > 0 and by["tma_l2_half"]["rates"]["hbm"] == 0


def test_check_reports_every_load_against_the_profile_as_it_is():
    from lab.tools.calibrate import fit_power
    from fa4sim import hardware

    base = hardware.load("h100")
    _, loads, _ = fit_power.read(str(SPLIT_H100))
    rows = fit_power.check(base, loads)
    assert [r["name"] for r in rows] == [ld["name"] for ld in loads]
    sleep = next(r for r in rows if r["name"] == "sleep")
    assert sleep["power_error"] == pytest.approx(0.0, abs=1e-9)  # the host's static power comes from it
    for r in rows:
        assert r["model_power_w"] > 0 and 0 < r["predicted_clock_ghz"] <= 1.98


def test_check_cli_prints_one_row_per_load():
    out = subprocess.run([sys.executable, "-m", "lab.tools.calibrate.fit_power", *map(str, SPLIT_H200), "--check",
                          "--profile", str(ROOT / "fa4sim" / "profiles" / "h200.json")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    n = sum(len(json.loads(p.read_text())["loads"]) for p in SPLIT_H200)
    assert out.stdout.count("tensor256+mix2|tma_hbm_half") == 2 and "(no fit)" in out.stdout
    rows = [line for line in out.stdout.splitlines() if "%" in line and line.rstrip()[-1:].isdigit()]
    assert len(rows) == n


def _csv(launches_per_problem: int, problems: int) -> str:
    head = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
    rows, i = [], 0
    for p in range(problems):
        for k in range(launches_per_problem):
            rows.append(f'"{i}","vectorized_elementwise_kernel","dram__bytes_read.sum","byte","5"')
            i += 1
            for m, v in (("dram__bytes_read.sum", 1000 * (p + 1) + k), ("dram__bytes_write.sum", 10),
                         ("lts__t_bytes.sum", "4,000"), ("gpu__time_duration.sum", 7)):
                rows.append(f'"{i}","kernel_cutlass_FlashFwdSm90_x","{m}","byte","{v}"')
            i += 1
    return "==PROF== noise\n" + "\n".join([head, *rows]) + "\n"


def test_dram_parse_keeps_each_problems_launches_and_drops_the_first():
    from lab.tools import dram_bytes_sm90 as db

    names = list(db.PROBLEMS)[:2]
    pts = db.parse(_csv(db.LAUNCHES, 2), names)
    assert [p["name"] for p in pts] == names
    assert len(pts[0]["launches"]) == db.LAUNCHES
    # launches 1..3 of problem 0 read 1001..1003 bytes: median 1002, plus 10 written
    assert pts[0]["dram_bytes"] == 1012 and pts[1]["dram_read_bytes"] == 2002 and pts[0]["l2_bytes"] == 4000
    with pytest.raises(ValueError, match="launches"):
        db.parse(_csv(db.LAUNCHES - 1, 2), names)
    with pytest.raises(ValueError, match="header"):
        db.parse("nothing here", names)


def test_recorded_hbm_bytes_at_1k_are_the_models():
    """ncu on the H200, back to back: at 1k tokens every launch moves exactly q, k, v and o
    through HBM (L2 keeps nothing from the previous launch), as fa4sim counts."""
    from lab.tools import dram_bytes_sm90 as db

    rows = {r["name"]: r for r in db.compare(json.loads(DRAM.read_text()))}
    for name, r in rows.items():
        if "-1k-" in name:
            assert r["measured_hbm_bytes"] == pytest.approx(r["inputs_and_output_bytes"], rel=0.01), name
            assert abs(r["error"]) < 0.01, name


def test_dram_report_cli_and_bad_only():
    out = subprocess.run([sys.executable, "lab/tools/dram_bytes_sm90.py", "--report", str(DRAM)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "hd128-1k-b16-h16" in out.stdout and "ncu MB" in out.stdout
    bad = subprocess.run([sys.executable, "lab/tools/dram_bytes_sm90.py", "--only", "nope", "--report", str(DRAM)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert bad.returncode == 2 and "unknown problem(s) nope; allowed:" in bad.stderr.strip().splitlines()[-1]
