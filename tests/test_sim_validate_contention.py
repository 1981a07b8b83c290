"""`fa4sim validate` of bench_contention's files (fa4sim/validate/contention.py): the unit
benchmark's intra kernel (warpgroups running a softmax-like mix beside their own wgmma) replayed
with the engine's interference rules. No GPU needed: it reads the recorded H100 and H200 files."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fa4sim import validate  # noqa: E402
from fa4sim.cli import main  # noqa: E402
from fa4sim.validate import contention  # noqa: E402

FILES = [os.path.join(ROOT, "benchmarks", "results", f"contention_{g}_2026-11-22.json") for g in ("h100", "h200")]


@pytest.fixture(scope="module", params=FILES, ids=["h100", "h200"])
def result(request):
    return validate.compare(validate.load(request.param))


def test_every_recorded_intra_case_is_replayed(result):
    doc = json.load(open(FILES[0] if "H100" in result["summary"]["device"] else FILES[1]))
    recorded = [(mode, wg, key) for mode in ("intra_ss", "intra_rs")
                for wg, runs in doc["benchmarks"]["contention"][mode].items()
                for key, run in runs.items() if "cycles_per_trip" in run]
    assert len(result["cases"]) == len(recorded) == 36
    for r in result["cases"]:
        assert r["predicted"] > 0 and r["measured"] > 0
        assert r["error"] == pytest.approx(r["predicted"] / r["measured"] - 1.0)


def test_one_warpgroup_beside_its_own_wgmma_is_within_5_percent(result):
    """The rules' home ground: one warpgroup, its mix (2-4 blocks) at least as long as its GEMM."""
    near = [r for r in result["cases"] if r["warpgroups"] == 1 and r["with_mma"] and r["blocks"] >= 2]
    assert len(near) == 6
    assert max(abs(r["error"]) for r in near) < 0.05, near


def test_more_mix_costs_more_in_model_and_measurement(result):
    for a in ("smem", "registers"):
        for wgs in (1, 2):
            rows = sorted((r for r in result["cases"] if r["operand_a"] == a and r["warpgroups"] == wgs
                           and r["with_mma"]), key=lambda r: r["blocks"])
            assert [r["blocks"] for r in rows] == [0, 1, 2, 3, 4]
            assert all(x["predicted"] < y["predicted"] and x["measured"] < y["measured"]
                       for x, y in zip(rows, rows[1:]))


@pytest.mark.xfail(strict=True, reason="known gap (docs/findings/issue-rate-beside-mma.md, 'The hd64 loop'): "
                                        "two warpgroups each running 2-4 mix blocks beside their own wgmma take "
                                        "6-20 % more cycles than the engine's rules give (the MUFU share "
                                        "counted); hd64's loop lives there")
def test_two_warpgroups_beside_their_own_wgmmas_within_8_percent(result):
    heavy = [r for r in result["cases"] if r["warpgroups"] == 2 and r["with_mma"] and r["blocks"] >= 2]
    assert max(abs(r["error"]) for r in heavy) < 0.08


def test_cli_json_and_report(capsys):
    assert main(["validate", FILES[0], "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "contention" and doc["summary"]["hw_profile"] == "h100"
    text = contention.report(doc)
    assert "two warpgroups beside their wgmmas" in text and "registers    2   4    yes" in text


def test_replayed_schedule_has_no_attention_in_it():
    from fa4sim import hardware
    s = contention.schedule(hardware.load("h100"), 2, 3, True, {"MUFU.EX2": 32, "FFMA": 32}, 8, 64.0, rs=True)
    assert {o.name for o in s.ops} == {"MMA0", "MIX0", "WAIT0", "MMA1", "MIX1", "WAIT1"}
    hw = hardware.load("h100")
    work, held = dict(s.op("MIX0").uses), dict(s.op("MIX0").held)
    assert work["mufu"] == pytest.approx(3 * 32 * 128 / hw.mufu_ex2_per_clk)  # the work, what power counts
    assert held["mufu"] == pytest.approx(work["mufu"] / hw.mix_mufu_utilization)  # the time the mix holds it


def test_two_or_more_warpgroups_of_the_mix_alone_are_within_6_percent(result):
    """Two warps of the mix per scheduler keep the MUFU mix_mufu_utilization busy (the roles kernel's
    long loop); the intra kernel's trips of 2-4 blocks agree (one block is mostly per-trip overhead)."""
    alone = [r for r in result["cases"] if r["warpgroups"] == 2 and not r["with_mma"] and r["blocks"] >= 2]
    assert len(alone) == 6
    assert max(abs(r["error"]) for r in alone) < 0.06, alone


def test_three_warpgroups_replayed_with_their_own_summary():
    """The 384-thread build (FA3's hd64 tile of 192 rows: three warps per scheduler): each case is
    replayed, the mix alone at 2-4 blocks within 3 %, and the report names the three-warpgroup group."""
    path = os.path.join(ROOT, "benchmarks", "results", "contention_intra_3wg_h200_2026-11-28.json")
    res = validate.compare(validate.load(path))
    three = [r for r in res["cases"] if r["warpgroups"] == 3]
    assert len(res["cases"]) == 54 and len(three) == 18
    alone = [r for r in three if not r["with_mma"] and r["blocks"] >= 2]
    assert max(abs(r["error"]) for r in alone) < 0.03, alone
    assert res["summary"]["three_warpgroups_with_mma"]["n"] == 10
    assert "three warpgroups beside their wgmmas" in contention.report(res)


def test_stamped_run_reports_each_trips_mix_and_wait():
    """bench_contention --only intra stamps each trip: the GEMMs are done when the mix ends (the
    wait after it is short) wherever a mix runs, and the report shows both parts."""
    path = os.path.join(ROOT, "benchmarks", "results", "contention_intra_h100_2026-11-28.json")
    res = validate.compare(validate.load(path))
    with_mix = [r for r in res["cases"] if r["with_mma"] and r["blocks"] > 0]
    assert len(with_mix) == 16
    for r in with_mix:
        assert r["measured_wait"] < 100 < r["measured_mix"]
        assert r["measured_mix"] + r["measured_wait"] == pytest.approx(r["measured"], rel=0.1)
    assert "to the mix's end + in the wait" in contention.report(res)
