"""fa4sim graph: a schedule's loop as a dependency graph, and its II bounds (ResMII, RecMII)."""
import itertools
import json
import random

import pytest

from fa4sim import graph
from fa4sim.cli import main
from fa4sim.engine import Edge, Op, Schedule
from fa4sim.errors import InputError


def resource_toy() -> Schedule:
    """A producer issues A (10 cycles on t, asynchronous); a consumer runs B (4 cycles on m)
    on A's result; two buffer slots (B -> A at distance 2)."""
    ops = [Op("A", "p", (("t", 10.0),), 0.0, asynchronous=True, issue_cycles=1.0),
           Op("B", "q", (("m", 4.0),))]
    edges = [Edge("A", "B"), Edge("B", "A", 2, kind="anti")]
    return Schedule("res-toy", {"t": 1, "m": 1}, ["p", "q"], ops, edges, marker="A")


def recurrence_toy() -> Schedule:
    """X (3 cycles on u, latency 2) feeds Y (2 cycles on u) with a lag of 1; Y feeds the next X."""
    ops = [Op("X", "p", (("u", 3.0),), 2.0), Op("Y", "q", (("u", 2.0),))]
    edges = [Edge("X", "Y", lag=1.0), Edge("Y", "X", 1)]
    return Schedule("rec-toy", {"u": 1}, ["p", "q"], ops, edges, marker="X")


def test_bounds_of_a_resource_toy_by_hand():
    g = graph.build(resource_toy())
    a, b = g.node("A"), g.node("B")
    assert (a.completion, a.hold, b.completion, b.hold) == (10.0, 1.0, 4.0, 4.0)
    res = graph.res_mii(g)
    assert res.value == 10.0 and res.critical == "t"
    assert res.loads == {"t": 10.0, "m": 4.0, "role:p": 1.0, "role:q": 4.0}
    rec = graph.rec_mii(g)
    assert rec.value == pytest.approx((10 + 4) / 2) and rec.critical in ("A -> B -> A", "B -> A -> B")


def test_bounds_of_a_recurrence_toy_by_hand():
    g = graph.build(recurrence_toy())
    res, rec = graph.res_mii(g), graph.rec_mii(g)
    assert res.value == 5.0 and res.critical in ("u", "role:p")  # u: 3 + 2; role p holds X for 3 + 2
    # X -> Y: completion 5 + lag 1; Y -> X: 2, over one iteration
    assert rec.value == pytest.approx(8.0)
    assert {(d.src, d.dst) for d in rec.cycle} == {("X", "Y"), ("Y", "X")}
    assert sum(d.distance for d in rec.cycle) == 1


def test_program_order_edges_and_their_recurrence():
    """Two ops of one role: program order a -> b (distance skew_a - skew_b) and the wrap-around
    b -> a (distance 1 + skew_b - skew_a); their holds bound II when the role runs both."""
    ops = [Op("a", "r", (("u", 3.0),)), Op("b", "r", (("v", 4.0),), 1.0, skew=1)]
    s = Schedule("order-toy", {"u": 1, "v": 1}, ["r"], ops, [Edge("a", "b")], marker="a")
    g = graph.build(s)
    order = {(d.src, d.dst): d.distance for d in g.order}
    assert order == {("a", "b"): -1, ("b", "a"): 2}
    assert graph.rec_mii(g).value == 0.0  # a -> b alone is no cycle
    with_order = graph.rec_mii(g, with_order=True)
    assert with_order.value == pytest.approx((3 + 5) / 1)  # a -> b (edge, 3) -> a (order, hold 5), distance 0 + 1
    assert graph.res_mii(g).critical == "role:r" and graph.res_mii(g).value == 8.0


def test_tile_ops_and_tile_edges_stay_out_of_the_bounds():
    ops = [Op("L", "p", (("t", 50.0),), when="first"), Op("A", "p", (("u", 2.0),)),
           Op("F", "q", (("u", 30.0),), when="last")]
    edges = [Edge("L", "A"), Edge("A", "F"), Edge("F", "A", 1, per="tile", kind="anti")]
    g = graph.build(Schedule("tile-toy", {"t": 1, "u": 1}, ["p", "q"], ops, edges, marker="A"))
    assert [n.name for n in g.loop_nodes] == ["A"]
    assert not any(d.in_loop for d in g.deps)
    assert graph.res_mii(g).value == 2.0


def test_asynchronous_op_behind_an_issue_queue():
    """8 pieces of 64 cycles issued 4 apart into a queue of depth 4: the issuer waits until the
    fifth piece finds room (after the first piece's 64 cycles), and so on."""
    op = Op("M", "mma", (("tensor", 512.0),), 100.0, asynchronous=True, issue_cycles=32.0, chunks=8)
    s = Schedule("q", {"tensor": 1}, ["mma"], [op], [], marker="M", issue_depth={"tensor": 4})
    pieces, completion, hold = graph.isolated(s, op)
    assert completion == 512 + 100
    assert hold == pytest.approx((8 - 4) * 64 + 4)
    assert pieces == (graph.Piece("tensor", 0.0, 512.0),)


def _brute_force_ratio(n, edges):
    """Max sum(delay)/sum(distance) over elementary cycles, by enumerating node sequences."""
    best = 0.0
    by_pair = {}
    for e in edges:
        by_pair.setdefault((e.src, e.dst), []).append(e)
    for k in range(1, n + 1):
        for seq in itertools.permutations(range(n), k):
            if seq[0] != min(seq):
                continue
            hops = list(zip(seq, seq[1:] + seq[:1]))
            if not all(h in by_pair for h in hops):
                continue
            for choice in itertools.product(*(by_pair[h] for h in hops)):
                dist = sum(e.distance for e in choice)
                best = max(best, sum(e.delay for e in choice) / dist)
    return best


def test_recurrence_bound_equals_brute_force_on_random_graphs():
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(2, 6)
        edges = []
        for _ in range(rng.randint(2, 12)):
            u, v = rng.randrange(n), rng.randrange(n)
            # a cycle always has a backward edge (u >= v) of distance >= 1: none spans 0 iterations
            edges.append(graph.Dep(u, v, rng.randint(0, 2) if u < v else rng.randint(1, 3), "flow", 0.0,
                                   float(rng.randint(0, 40))))
        ratio, cycle = graph.max_cycle_ratio(list(range(n)), edges)
        assert ratio == pytest.approx(_brute_force_ratio(n, edges), abs=1e-9)
        if cycle:
            assert cycle[0].src == cycle[-1].dst
            assert all(a.dst == b.src for a, b in zip(cycle, cycle[1:]))
            assert sum(e.delay for e in cycle) / sum(e.distance for e in cycle) == pytest.approx(ratio)


def test_a_cycle_within_one_iteration_is_refused():
    edges = [graph.Dep("a", "b", 0, "flow", 0.0, 3.0), graph.Dep("b", "a", 0, "flow", 0.0, 1.0)]
    with pytest.raises(InputError, match="deadlock"):
        graph.max_cycle_ratio(["a", "b"], edges)


def run_cli(args, capsys):
    try:
        code = main(args)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_graph_json_of_fa4_forward(capsys):
    code, out, _ = run_cli(["graph", "--hw", "b200", "--schedule", "fa4", "--json"], capsys)
    assert code == 0
    j = json.loads(out)
    assert {"ops", "units", "edges", "res_mii", "rec_mii", "rec_mii_hand_order"} <= set(j)
    assert j["units"]["tensor"] == 1
    names = {o["name"] for o in j["ops"]}
    assert {"QK0", "QK1", "PVa0", "MAX0", "EXPa1", "LK", "LV"} <= names
    assert all({"src", "dst", "distance", "kind", "lag"} <= set(e) for e in j["edges"])
    assert {e["kind"] for e in j["edges"]} <= {"flow", "anti", "output"}
    # every edge of the graph is an edge of the schedule the simulation replays
    from fa4sim.model import build_cta
    from fa4sim.params import Problem
    sched = build_cta("b200", Problem(2, 16, 8192, 8192, 128), n_kv=64)
    assert len(j["edges"]) == len(sched.edges)
    assert j["res_mii"]["critical"] in j["res_mii"]["loads"]
    cycle = j["rec_mii_hand_order"]["cycle"]
    assert cycle and cycle[0]["src"] == cycle[-1]["dst"]
    assert j["rec_mii_hand_order"]["value"] >= j["rec_mii"]["value"]
    assert j["rec_mii_hand_order"]["value"] == pytest.approx(
        j["rec_mii_hand_order"]["delay"] / j["rec_mii_hand_order"]["distance"], rel=1e-3)


@pytest.mark.parametrize("hw,schedule,pass_", [("h100", "fa3", "fwd"), ("b200", "fa4", "bwd"), ("h100", "fa3", "bwd")])
def test_graph_of_every_schedule(hw, schedule, pass_, capsys):
    code, out, _ = run_cli(["graph", "--hw", hw, "--schedule", schedule, "--pass", pass_, "--json", "--compact"],
                           capsys)
    assert code == 0
    j = json.loads(out)
    assert j["res_mii"]["value"] > 0 and j["mii"] == max(j["res_mii"]["value"], j["rec_mii"]["value"])


def test_graph_writes_dot_and_plot(tmp_path, capsys):
    dot, png = tmp_path / "g.dot", tmp_path / "g.png"
    code, out, _ = run_cli(["graph", "--hw", "b200", "--dot", str(dot), "--plot", str(png)], capsys)
    assert code == 0 and "ResMII" in out and "RecMII" in out
    text = dot.read_text()
    assert text.startswith('digraph "fa4"') and '"QK0" -> "MAX0"' in text and "color=red" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,word", [
    (["graph", "--dot", "x.txt"], "--dot"),
    (["graph", "--plot", "/no/such/folder/g.png"], "--plot"),
    (["graph", "--set", "no_such_knob=1"], "no_such_knob"),
    (["graph", "--hw", "h100", "--schedule", "fa4"], "schedule"),
    (["graph", "--pass", "sideways"], "pass"),
])
def test_graph_bad_input_is_one_line_exit_2(args, word, capsys):
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == ""
    assert word in err and err.count("\n") == 1 and "Traceback" not in err
