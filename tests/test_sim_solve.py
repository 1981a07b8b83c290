"""fa4sim solve: a modulo schedule by CP-SAT, its role programs, and their replay in the engine."""
import json

import pytest

from fa4sim import graph, modulo
from fa4sim.engine import Edge, Op, Schedule
from fa4sim.errors import InputError
from test_sim_graph import run_cli

pytest.importorskip("ortools")

REPLAY_TOLERANCE = 0.01  # toys: the engine replays the solver's programs at its II within 1 %


def bound_toy() -> Schedule:
    """X (3 cycles on u, latency 2) feeds Y (2 cycles on u) with a lag of 1; Y(i) feeds X(i+1):
    RecMII 8 > ResMII 5, and a schedule reaches 8."""
    ops = [Op("X", "p", (("u", 3.0),), 2.0), Op("Y", "q", (("u", 2.0),))]
    return Schedule("bound-toy", {"u": 1}, ["p", "q"], ops, [Edge("X", "Y", lag=1.0), Edge("Y", "X", 1)], marker="X")


def interplay_toy() -> Schedule:
    """A (1 cycle) feeds B and C (4 cycles each, one shared unit u); each feeds the next A after
    a lag of 5. Both recurrences are 1 + 4 + 5 = 10 = RecMII >= ResMII 8, but at II = 10 they
    pin B and C to the same cycles of u; B and C need 4 cycles apart, and each can start at most
    II - 10 cycles late: II = 14."""
    ops = [Op("A", "p", (("a", 1.0),)), Op("B", "q", (("u", 4.0),)), Op("C", "r", (("u", 4.0),))]
    edges = [Edge("A", "B"), Edge("B", "A", 1, lag=5.0), Edge("A", "C"), Edge("C", "A", 1, lag=5.0)]
    return Schedule("interplay-toy", {"a": 1, "u": 1}, ["p", "q", "r"], ops, edges, marker="A")


def pipeline_toy() -> Schedule:
    """One warp issues a load L (async, 10 cycles on tma, latency 30) into one of 4 slots, then an
    MMA M on it (async, 20 cycles on tensor, latency 5); a softmax warp runs S (15 cycles on mufu)
    on M's result, 2 buffers. Written without pipelining (skews 0) the warp waits for each load
    before its MMA; the solver issues loads iterations ahead and reaches the tensor bound."""
    ops = [Op("L", "warp", (("tma", 10.0),), 30.0, asynchronous=True, issue_cycles=1.0),
           Op("M", "warp", (("tensor", 20.0),), 5.0, asynchronous=True, issue_cycles=1.0),
           Op("S", "softmax", (("mufu", 15.0),))]
    edges = [Edge("L", "M"), Edge("M", "S"), Edge("M", "L", 4, kind="anti"), Edge("S", "M", 2, kind="anti")]
    return Schedule("pipeline-toy", {"tma": 1, "tensor": 1, "mufu": 1}, ["warp", "softmax"], ops, edges,
                    marker="M")


def solve(schedule, **kw):
    g = graph.build(schedule)
    return g, modulo.solve(g, time_limit_s=kw.pop("time_limit_s", 5.0), **kw)


def replay(schedule, sol, n=40):
    return modulo.replayed_interval(modulo.schedule_from(schedule, sol.programs), n)


def test_reaches_the_bound_where_it_is_achievable():
    s = bound_toy()
    g, sol = solve(s)
    assert sol.rec_mii == pytest.approx(8.0) and sol.res_mii == 5.0
    assert sol.ii == 8.0 and sol.status == "OPTIMAL"
    assert replay(s, sol) == pytest.approx(sol.ii, rel=REPLAY_TOLERANCE)


def test_exceeds_the_bound_where_recurrences_and_a_unit_interplay():
    s = interplay_toy()
    g, sol = solve(s)
    assert max(sol.res_mii, sol.rec_mii) == pytest.approx(10.0)
    assert sol.ii == 14.0 and sol.status == "OPTIMAL"
    assert all(sol.tried[ii] == "infeasible" for ii in range(10, 14))
    assert replay(s, sol) == pytest.approx(sol.ii, rel=REPLAY_TOLERANCE)


def test_finds_a_pipeline_the_unpipelined_program_misses():
    s = pipeline_toy()
    hand = modulo.replayed_interval(s, 40)
    g, sol = solve(s)
    assert sol.ii == 20.0 and sol.status == "OPTIMAL"  # the tensor core's 20 cycles
    assert hand >= 40  # skews 0: M waits for its own load's 10 + 30 cycles
    assert replay(s, sol) == pytest.approx(sol.ii, rel=REPLAY_TOLERANCE)
    skew = dict(sol.programs["warp"])
    assert skew["M"] - skew["L"] >= 2  # the loads run at least two iterations ahead of the MMAs


def test_programs_are_consistent_with_the_offsets():
    s = pipeline_toy()
    g, sol = solve(s)
    for role, prog in sol.programs.items():
        names = [k for k, _ in prog]
        assert sorted(names) == sorted(n.name for n in g.nodes if n.role == role)
        assert min(sk for _, sk in prog) == 0
        window = [sol.offset[k] - sol.stage[k] * sol.ii for k in names]
        assert window == sorted(window) and all(0 <= w < sol.ii for w in window)
    for e in g.loop_deps:  # every dependence edge holds at the solved offsets
        assert sol.offset[e.dst] + e.distance * sol.ii >= sol.offset[e.src] + e.delay - 1e-6


def test_order_policies_keep_what_they_say():
    from fa4sim.model import build_cta
    from fa4sim.params import Problem
    s = build_cta("b200", Problem(2, 16, 8192, 8192, 128), n_kv=64)
    g = graph.build(s)
    assert modulo.kept_order(g, "free") == []
    assert len(modulo.kept_order(g, "hand")) == len(g.order)
    code = {(d.src, d.dst) for d in modulo.kept_order(g, "code")}
    assert ("PVb0", "QK0") in code and ("MAX0", "EXPa0") in code  # the MMA warp's order, the softmax's
    assert not any("LK" in pair or "LV" in pair for pair in code)  # TMA has no issue queue: free
    compute = {(d.src, d.dst) for d in modulo.kept_order(g, "compute")}
    assert ("MAX0", "EXPa0") in compute and ("PVb0", "QK0") not in compute
    with pytest.raises(InputError, match="order"):
        modulo.kept_order(g, "sideways")


def test_an_impossible_problem_is_one_line():
    ops = [Op("a", "p", (("u", 3.0),)), Op("b", "q", (("u", 3.0),))]
    s = Schedule("bad", {"u": 1}, ["p", "q"], ops, [Edge("a", "b"), Edge("b", "a")], marker="a")
    with pytest.raises(InputError, match="deadlock") as e:
        solve(s)
    assert "\n" not in str(e.value)


def test_fa4_forward_solve_json(capsys):
    code, out, _ = run_cli(["solve", "--hw", "b200", "--schedule", "fa4", "--json"], capsys)
    assert code == 0
    j = json.loads(out)
    assert {"ii", "res_mii", "rec_mii", "replayed_interval", "hand_interval", "schedule", "status",
            "solve_wall_s", "programs"} <= set(j)
    assert j["status"] in ("OPTIMAL", "FEASIBLE")
    assert j["ii"] >= max(j["res_mii"]["value"], j["rec_mii"]["value"]) - 1e-6
    assert j["res_mii"]["critical"] == "tensor"
    assert {"offset", "stage", "role"} <= set(j["schedule"]["QK0"]) and j["schedule"]["QK0"]["role"] == "mma"
    assert j["replayed_interval"] > 0 and j["hand_interval"] > 0
    # the default order keeps the MMA warp's order: the replay agrees with the solver (docs)
    assert j["replayed_interval"] == pytest.approx(j["ii"], rel=0.02)
    assert j["programs"]["mma"]["steady"]


def test_fa3_forward_solve_text(capsys):
    code, out, _ = run_cli(["solve", "--hw", "h100", "--schedule", "fa3", "--time-limit", "2"], capsys)
    assert code == 0
    assert "II" in out and "replayed in the engine" in out and "steady   k:" in out


def test_no_tmem_what_if_is_bound_by_half_rate_m64_mmas(capsys):
    """fa3 on b200 = a Blackwell without TMEM: S, P, O in registers, M = 64 MMAs at half rate.
    Per KV block a 128-row tile runs 2 x 128 x 128 x (128 + 128) x 2 FLOPs at half of b200's rate."""
    from fa4sim import hardware
    hw = hardware.load("b200")
    code, out, _ = run_cli(["solve", "--hw", "b200", "--schedule", "fa3", "--json"], capsys)
    assert code == 0
    j = json.loads(out)
    tensor = 2 * 128 * 128 * 256 / (hw.tensor_flops_per_clk / 2)
    assert j["res_mii"]["critical"] == "tensor" and j["res_mii"]["value"] == pytest.approx(tensor)
    assert j["ii"] == pytest.approx(tensor) and j["status"] == "OPTIMAL"
    fa4 = json.loads(run_cli(["solve", "--hw", "b200", "--schedule", "fa4", "--json"], capsys)[1])
    # per 128 query rows (FA4's iteration is two tiles) TMEM's schedule is faster than the bound without it
    assert fa4["ii"] / 2 < j["ii"]


def test_no_tmem_what_if_says_what_it_is(capsys):
    code, out, _ = run_cli(["run", "--hw", "b200", "--schedule", "fa3", "--seqlen", "4096", "--json"], capsys)
    assert code == 0
    j = json.loads(out)
    assert j["arch"] == "sm100" and j["impl"] == "fa4kernel-sm90"
    assert any("without TMEM" in n for n in j["notes"])


@pytest.mark.parametrize("args,word", [
    (["solve", "--hw", "h100", "--schedule", "fa4"], "schedule"),
    (["solve", "--order", "sideways"], "--order"),
    (["solve", "--time-limit", "0"], "--time-limit"),
    (["solve", "--time-limit", "0.00001"], "no schedule found"),
    (["solve", "--set", "kv_stages=1"], "kv_stages"),
])
def test_solve_bad_input_is_one_line_exit_2(args, word, capsys):
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == ""
    assert word in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_deadlocking_replay_reports_the_engine_message(monkeypatch, capsys):
    """Programs that run an op before its same-iteration input deadlock in the engine: the
    CLI prints the engine's message (exit 3)."""
    real = modulo.solve

    def backwards(g, **kw):
        sol = real(g, **kw)
        sol.programs["softmax0"] = [(k, 0) for k, _ in reversed(sol.programs["softmax0"])]
        sol.programs["mma"] = [(k, 0) for k, _ in sol.programs["mma"]]
        return sol

    monkeypatch.setattr(modulo, "solve", backwards)
    code, out, err = run_cli(["solve", "--hw", "b200", "--seqlen", "2048"], capsys)
    assert code == 3 and "deadlock" in err and err.count("\n") == 1


def test_schedule_from_runs_the_programs():
    s = pipeline_toy()
    g, sol = solve(s)
    new = modulo.schedule_from(s, sol.programs)
    assert [o.name for o in new.ops if o.role == "warp"] == [k for k, _ in sol.programs["warp"]]
    assert {o.name: o.skew for o in new.ops} == {k: sk for prog in sol.programs.values() for k, sk in prog}
