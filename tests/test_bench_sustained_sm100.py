"""The Blackwell check (lab/tools/sustained_sm100.py) on the CPU: its plan, its refusal without a
B200 (one line, exit 2), and `fa4sim validate` on a recorded file shaped like a B200 run."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.tools import sustained_sm100 as b
from fa4sim import Problem, simulate, validate

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "lab/tools/sustained_sm100.py"


def test_the_points_are_the_papers_grid():
    pts = b.all_points()
    assert len(pts) == 30 and len({p.name for p in pts}) == 30
    assert all(p.batch * p.seqlen == b.TOKENS and p.heads == 16 for p in pts)
    assert {p.pass_ for p in pts} == {"fwd", "bwd"}
    assert sorted(p.name for p in b.select(None, True)) == sorted(b.QUICK)
    one = b.select("bwd-hd128-8k-causal", False)[0]
    assert one.flops == pytest.approx(2.5 * Problem(4, 16, 8192, 8192, 128, True).flops)
    with pytest.raises(ValueError, match="unknown"):
        b.select("fwd-hd999-1k", False)


def test_dry_run_and_no_gpu():
    dry = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--quick"], capture_output=True, text=True)
    assert dry.returncode == 0 and "5 points" in dry.stdout and "fwd-hd128-1k" in dry.stdout
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True)
    err = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(err) == 1 and "needs a Blackwell GPU" in err[0]
    bad = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--warm-s", "0.1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--warm-s" in bad.stderr


def test_validate_a_b200_run(tmp_path, capsys):
    """A file as the script writes it on a B200 (its times made up: 5 % slower than the model's),
    one candidate whose check failed: validate simulates flash-attn-4's forward and backward on b200."""
    points = []
    for p in b.select("fwd-hd128-8k,bwd-hd128-8k-causal", False):
        r = simulate("b200", None, Problem(p.batch, p.heads, p.seqlen, p.seqlen, p.hdim, p.causal, p.hdim_v),
                     pass_=p.pass_)
        res = {"ms": r.time_us * 1e-3 * 1.05, "check": {"ok": True}}
        results = {b.BWD: res} if p.pass_ == "bwd" else {b.FWD: res, b.OURS: {"ms": 1.0, "check": {"ok": False}}}
        points.append({**p.record(), "results": results})
    doc = {"meta": {"kind": "sustained", "device": "NVIDIA B200", "date": "2026-12-02T00:00:00+00:00"},
           "points": points}
    path = tmp_path / "sustained_b200.json"
    path.write_text(json.dumps(doc))
    res = validate.compare(validate.load(str(path)))
    assert res["summary"]["hw_profile"] == "b200"
    rows = {r["kernel"]: r for r in res["points"]}
    assert set(rows) == {b.FWD, b.BWD}  # fa4kernel's SM100 forward: timed, not simulated
    for r in rows.values():
        assert r["error"] == pytest.approx(0.05, abs=1e-6)  # the model 5 % faster than the made-up run
    assert res["summary"]["wrong_output_left_out"] == [] and "fa4kernel" not in json.dumps(res["summary"]["tflops"])
    assert validate.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert b.BWD in out and "TFLOP/s, flash-attn-4 backward" in out
