"""`fa4sim validate` of bench_bursts' files (fa4sim/validate/issue_sharing.py): one to three warps
per scheduler running one code alone, against the engine's rule for warps that share issue slots
(1 - (1 - p)^k, engine.shared_rate) and the additive rule it replaced. No GPU needed."""
import glob
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fa4sim import hardware, validate  # noqa: E402
from fa4sim.cli import main  # noqa: E402
from fa4sim.validate import issue_sharing  # noqa: E402

from lab.tools.index import path_of  # noqa: E402

RESULTS = os.path.join(ROOT, "lab", "campaigns")
THREE_WARPS = str(path_of("bursts_duty3_h100_2026-11-22.json"))


def cases(path):
    return validate.compare(validate.load(path))["cases"]


def test_three_warps_per_scheduler_follow_the_shared_rule():
    """The 512-thread build (hd64's three warpgroups): the emulated mixes, whose MUFU does not
    bind, at two and three warps per scheduler."""
    rows = [r for r in cases(THREE_WARPS) if r["code"].startswith("mix_emu")]
    assert {(r["code"], r["warps"]) for r in rows} == {(c, k) for c in ("mix_emu12", "mix_emu25") for k in (2, 3)}
    for r in rows:
        assert 0 < r["measured"] < r["alone_rate"]            # a warp issues slower beside others
        assert abs(r["shared_error"]) < 0.14, r
        assert abs(r["shared_error"]) < abs(r["additive_error"]), r


def test_the_shared_rule_is_closer_wherever_the_two_rules_differ():
    """Over every recorded alone run: where the rules differ by more than 5 % of the measurement,
    the shared one is closer in most cases (the emulated mixes); a lone integer chain, latency
    bound at p = 0.2, overlaps better than independent warps would."""
    rows = [r for f in sorted(glob.glob(os.path.join(RESULTS, "*", "bursts*.json"))) for r in cases(f)]
    assert len(rows) >= 40
    differ = [r for r in rows if abs(r["shared"] - r["additive"]) > 0.05 * r["measured"]]
    closer = [r for r in differ if abs(r["shared_error"]) < abs(r["additive_error"])]
    assert len(differ) >= 15 and len(closer) >= 0.75 * len(differ)
    assert {r["code"] for r in differ if r not in closer} == {"int"}


def test_pipe_caps_bind_the_half_rate_codes():
    """FMNMX and F2FP run on the ALU pipe at half the FP32 rate: two warps share its 0.5 per clock."""
    cap = issue_sharing.pipe_cap(hardware.load("h100"), "fmnmx")
    assert cap == pytest.approx(0.496, abs=0.002)
    rows = {r["code"]: r for r in cases(str(path_of("bursts_per_code_h100_2026-11-22.json")))}
    assert abs(rows["fmnmx"]["shared_error"]) < 0.05 and abs(rows["f2fp"]["shared_error"]) < 0.05


def test_a_file_without_alone_runs_says_so(capsys):
    assert main(["validate", str(path_of("bursts_inline_h100_2026-11-24.json"))]) == 0
    assert "nothing to compare" in capsys.readouterr().out
