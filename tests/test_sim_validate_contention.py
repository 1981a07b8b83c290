"""`fa4sim validate` of bench_contention's files (fa4sim/validate/contention.py): the unit
benchmark's intra kernel (warpgroups running a softmax-like mix beside their own wgmma) replayed
with the engine's interference rules. No GPU needed: it reads the recorded H100 and H200 files."""
import functools
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fa4sim import validate  # noqa: E402
from fa4sim.cli import main  # noqa: E402
from fa4sim.validate import contention  # noqa: E402

FILES = [os.path.join(ROOT, "lab", "campaigns", "issue-rate", f"contention_{g}_2026-11-22.json") for g in ("h100", "h200")]


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


def test_one_warpgroup_gemm_cost_within_4_percent_of_the_trip(result):
    """The rules' home ground: what one warpgroup's own GEMM adds to its trip (the trip with it
    less the same mix without, so the benchmark's own per-trip cost cancels)."""
    cost = [r for r in result["cases"] if r["warpgroups"] == 1 and "gemm_cost_error" in r]
    assert len(cost) == 8
    assert max(abs(r["gemm_cost_error"]) for r in cost) < 0.04, cost
    for r in cost:
        assert r["gemm_cost_error"] == pytest.approx(
            (r["gemm_cost_predicted"] - r["gemm_cost_measured"]) / r["measured"])


def test_more_mix_costs_more_in_model_and_measurement(result):
    for a in ("smem", "registers"):
        for wgs in (1, 2):
            rows = sorted((r for r in result["cases"] if r["operand_a"] == a and r["warpgroups"] == wgs
                           and r["with_mma"]), key=lambda r: r["blocks"])
            assert [r["blocks"] for r in rows] == [0, 1, 2, 3, 4]
            assert all(x["predicted"] < y["predicted"] and x["measured"] < y["measured"]
                       for x, y in zip(rows, rows[1:]))


def test_mix_pieces_fine_enough_to_converge():
    """A piece of the mix runs slowed if it starts while the tensor core is busy: a trip's mix in a
    few long pieces ran at full rate through most of the GEMMs (their cost 40-70 % low at 3-4
    blocks). The replay serves it in pieces of about 3 instructions per warp, where it converges."""
    from fa4sim import hardware
    hw = hardware.load("h200")
    mix = {"FMNMX": 35, "FFMA": 32, "MUFU.EX2": 32, "FADD": 32, "FMUL": 33, "F2FP": 16}
    for blocks in (1, 4):
        s = contention.schedule(hw, 3, blocks, True, mix, 8, 64.0, rs=False)
        assert s.op("MIX0").chunks == contention.PIECES_PER_BLOCK * blocks
    # converged, the GEMMs add as much to a trip of 4 blocks as to one of 2, as measured
    cost = {}
    for blocks in (2, 4):
        with_mma = contention.cycles_per_trip(contention.schedule(hw, 3, blocks, True, mix, 8, 64.0, rs=False))
        alone = contention.cycles_per_trip(contention.schedule(hw, 3, blocks, False, mix, 8, 64.0, rs=False))
        cost[blocks] = with_mma - alone
    assert cost[4] == pytest.approx(cost[2], rel=0.02)


@functools.lru_cache(maxsize=None)
def _replayed(path):
    return validate.compare(validate.load(path))


THREE_WG = [os.path.join(ROOT, "lab", "campaigns", "issue-rate", f"contention_intra_{n}_h200_2026-11-28.json")
            for n in ("3wg", "pingpong_off", "pingpong")]


@pytest.mark.parametrize("path", THREE_WG, ids=["3wg", "pingpong_off", "pingpong"])
def test_three_warpgroups_gemm_cost_within_6_percent_of_the_trip(path):
    """Three warpgroups, each beside its own GEMMs (FA3's hd64 tile), free-running or handing the
    GEMM issue on in turn (ping-pong): the GEMMs' cost within 6 % of the trip, never more than
    2 % high at 2-4 blocks."""
    res = _replayed(path)
    cost = [r for r in res["cases"] if r["warpgroups"] == 3 and "gemm_cost_error" in r]
    assert len(cost) == 8
    assert max(abs(r["gemm_cost_error"]) for r in cost) < 0.06, cost
    assert all(r["gemm_cost_error"] < 0.02 for r in cost if r["blocks"] >= 2)


@pytest.mark.xfail(strict=True, reason="known gap (lab/findings/issue-rate-hd64-loop.md, 'The hd64 loop'): "
                                        "three warpgroups each running 2-4 mix blocks beside their own wgmma, "
                                        "on the build with the ping-pong option: the GEMMs add up to a fifth "
                                        "more to a trip than the engine's rules give (up to 4 % of the trip, "
                                        "5 % with ping-pong); hd64's loop lives there")
@pytest.mark.parametrize("path", THREE_WG[1:], ids=["pingpong_off", "pingpong"])
def test_three_warpgroups_gemm_cost_within_3_percent_of_the_trip(path):
    res = _replayed(path)
    heavy = [r for r in res["cases"] if r["warpgroups"] == 3 and "gemm_cost_error" in r and r["blocks"] >= 2]
    assert max(abs(r["gemm_cost_error"]) for r in heavy) < 0.03


def test_cli_json_and_report(capsys):
    assert main(["validate", FILES[0], "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "contention" and doc["summary"]["hw_profile"] == "h100"
    text = contention.report(doc)
    assert "two warpgroups beside their wgmmas" in text and "registers    2   4    yes" in text
    assert "the GEMMs' cost" in text and doc["summary"]["two_warpgroups_gemm_cost"]["n"] == 8


def test_pingpong_run_is_replayed_with_its_hand_offs():
    path = THREE_WG[2]
    assert validate.load(path)["benchmarks"]["contention"]["constants"]["pingpong"] is True
    res = _replayed(path)
    assert res["summary"]["pingpong"] is True
    assert "its turn (ping-pong)" in contention.report(res)
    assert {r["warpgroups"] for r in res["cases"]} == {2, 3}


def test_replayed_schedule_has_no_attention_in_it():
    from fa4sim import hardware
    s = contention.schedule(hardware.load("h100"), 2, 3, True, {"MUFU.EX2": 32, "FFMA": 32}, 8, 64.0, rs=True)
    assert {o.name for o in s.ops} == {"MMA0", "MIX0", "WAIT0", "MMA1", "MIX1", "WAIT1"}
    pp = contention.schedule(hardware.load("h100"), 3, 3, True, {"MUFU.EX2": 32}, 8, 64.0, rs=True, pingpong=True)
    assert {"PP0", "PP1", "PP2"} <= {o.name for o in pp.ops}
    hand_offs = {(e.src, e.dst, e.distance) for e in pp.edges if e.src.startswith("PP")}
    assert hand_offs == {("PP2", "MMA0", 1), ("PP0", "MMA1", 0), ("PP1", "MMA2", 0)}
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
    replayed, the mix alone at 2-4 blocks within 4 % (the benchmark's own per-trip cost, 15-50 cycles
    with three warpgroups, is not replayed), and the report names the three-warpgroup group."""
    res = _replayed(THREE_WG[0])  # contention_intra_3wg_h200_2026-11-28.json
    three = [r for r in res["cases"] if r["warpgroups"] == 3]
    assert len(res["cases"]) == 54 and len(three) == 18
    alone = [r for r in three if not r["with_mma"] and r["blocks"] >= 2]
    assert max(abs(r["error"]) for r in alone) < 0.04, alone
    assert res["summary"]["three_warpgroups_with_mma"]["n"] == 10
    assert "three warpgroups beside their wgmmas" in contention.report(res)


def test_stamped_run_reports_each_trips_mix_and_wait():
    """bench_contention --only intra stamps each trip: the GEMMs are done when the mix ends (the
    wait after it is short) wherever a mix runs, and the report shows both parts."""
    path = os.path.join(ROOT, "lab", "campaigns", "issue-rate", "contention_intra_h100_2026-11-28.json")
    res = validate.compare(validate.load(path))
    with_mix = [r for r in res["cases"] if r["with_mma"] and r["blocks"] > 0]
    assert len(with_mix) == 16
    for r in with_mix:
        assert r["measured_wait"] < 100 < r["measured_mix"]
        assert r["measured_mix"] + r["measured_wait"] == pytest.approx(r["measured"], rel=0.1)
    assert "to the mix's end + in the wait" in contention.report(res)


def test_mix3_three_warps_per_scheduler_issue_no_slower_beside_a_gemm():
    """bench_contention --only mix3: two mix warpgroups beside one wgmma warpgroup reproduce the
    profile's issue_under_mma within 3 %; three (three warps per scheduler) issue no slower."""
    path = os.path.join(ROOT, "lab", "campaigns", "issue-rate", "contention_mix3_h200_2026-11-28.json")
    res = validate.compare(validate.load(path))
    assert res["cases"] == [] and len(res["mix3"]) == 4
    for mode in ("ss", "rs"):
        two, three = res["mix3"][f"{mode}_F2"], res["mix3"][f"{mode}_F3"]
        assert abs(two["vs_profile"]) < 0.03
        assert three["issue_share_beside_wgmma"] >= two["issue_share_beside_wgmma"]
        assert three["wgmma_slowdown"] < 1.01
    text = contention.report(res)
    assert "issue share beside wgmma" in text and text.count("\n") == 5
