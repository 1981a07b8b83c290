"""The simulator's fast paths give what the plain ones give: tile_times without the two-tile run,
the Runs memo, the engine's clock moves without an event, its lazily named trace rows, the paused
garbage collector, and tensor_gaps / utilization against their definitions. No timings here
(lab/tools/bench_sim_speed.py measures speed)."""
import gc

import pytest

from fa4sim import Problem, power
from fa4sim.engine import Busy, Edge, Op, OpRecord, Schedule, Trace, gc_paused, simulate
from fa4sim.model import build_cta
from fa4sim.steady_state import CAP, Runs, tile_times

BWD = ("h200", Problem(1, 16, 4096, 4096, 128, True), "bwd")
FWD = ("b200", Problem(1, 16, 4096, 4096, 128, False), "fwd")


def _schedule(case, n, masked=1):
    hw, problem, pass_ = case
    return build_cta(hw, problem, None, n, masked, pass_=pass_)


@pytest.mark.parametrize("case", [BWD, FWD], ids=["bwd", "fwd"])
@pytest.mark.parametrize("n", [3, CAP + 9])  # simulated in full; extrapolated past CAP
def test_tile_times_without_the_pair_is_the_same_tile(case, n):
    s = _schedule(case, n)
    t1, t2, trace, period = tile_times(s, n)
    u1, u2, other, same = tile_times(s, n, pair=False)
    assert u2 is None and t2 is not None
    assert (u1, same) == (t1, period)
    assert other.end == trace.end and [tuple(r) for r in other.ops] == [tuple(r) for r in trace.ops]


@pytest.mark.parametrize("masked", [0, 1])
def test_a_shorter_backward_tile_from_the_probe_is_its_full_simulation(masked):
    """shorter=True: a tile of n < CAP blocks is the CAP-block probe less (CAP - n) periods,
    the same as simulating it (to rounding), for every n past the transient; within the
    transient it is simulated."""
    s = _schedule(BWD, CAP, masked)
    runs = Runs()
    probe = runs(s, [CAP])
    for n in (1, 2, 3, 5, 8, 17, CAP - 1, CAP):
        t1, t2, trace, period = tile_times(s, n, pair=False, run=runs, shorter=True)
        assert t2 is None and t1 == pytest.approx(simulate(s, [n]).end, rel=1e-11), n
        past = n >= period.first + 2 * period.period
        assert (trace is probe) == (past or n == CAP), n


def test_runs_remembers_equal_schedules_and_tiles_only():
    runs = Runs()
    a = runs(_schedule(BWD, 4), [4])
    assert runs(_schedule(BWD, 4), [4]) is a  # an equal schedule, built again
    assert runs(_schedule(BWD, 4), [4, 4]) is not a
    b = runs(_schedule(FWD, 4, 0), [4])
    assert b is not a and b.end == simulate(_schedule(FWD, 4, 0), [4]).end
    t1, _, trace, _ = tile_times(_schedule(BWD, 4), 4, pair=False, run=runs)
    assert trace is a and t1 == a.end


def test_roles_one_finish_wakes_run_in_the_order_they_waited():
    """b and c wait for x; its completion wakes b, then c, both at 10, and nothing else is due.
    b's next op, after 100 cycles on u1, must not take u1 before c has (a role that moves its own
    clock where no event is due must see that c is)."""
    s = Schedule("t", {"u0": 1, "u1": 1}, ["a", "b", "c"],
                 [Op("x", "a", (("u0", 10),), asynchronous=True), Op("y", "b", (("u1", 100),)),
                  Op("y2", "b", (("u1", 5),)),
                  Op("z", "c", (("u1", 50),))],
                 [Edge("x", "y"), Edge("x", "z")], marker="x")
    tr = simulate(s, [1])
    start = {r.name: r.start for r in tr.ops}
    assert (start["x"], start["y"], start["z"], start["y2"]) == (0, 10, 110, 160)
    assert [r.name for r in tr.ops] == ["x", "y", "z", "y2"] and tr.end == 165


def test_times_keep_their_type():
    """A piece that starts at the very start keeps the clock's 0 (an int), as SimPy's clock has it."""
    tr = simulate(Schedule("t", {"u": 1}, ["r"], [Op("a", "r", (("u", 10),))], [], marker="a"), [2])
    assert [type(r.start) for r in tr.ops] == [int, float] and type(tr.busy[0].start) is int


def test_a_role_alone_moves_its_clock_through_every_piece():
    """One role, a blocking op of many pieces and an async op: the times are the closed forms."""
    s = Schedule("t", {"u": 1, "v": 1}, ["r"],
                 [Op("m", "r", (("v", 40),), latency=6, asynchronous=True, issue_cycles=8, chunks=4),
                  Op("w", "r", (("u", 64),), chunks=64)],
                 [Edge("m", "w")], marker="w")
    tr = simulate(s, [3])
    # m: 4 pieces of 10 cycles on v, issued 2 apart, done 6 after its last; w: 64 pieces of 1 cycle
    # back to back from m's end; the next m waits for v no more than for its role
    assert [r.end for r in tr.ops if r.name == "m"] == [46, 156, 266]
    assert [r.end for r in tr.ops if r.name == "w"] == [110, 220, 330]
    assert len([b for b in tr.busy if b.unit == "u"]) == 3 * 64


def test_simulated_trace_rows_are_named_tuples_when_read():
    s = _schedule(BWD, 6)
    tr = simulate(s, [6])
    before = tr.starts(s.marker)
    rows = list(tr.busy_rows)
    assert isinstance(tr, Trace)
    assert all(type(r) is OpRecord for r in tr.ops) and all(type(b) is Busy for b in tr.busy)
    assert tr.starts(s.marker) == before
    assert [tuple(b) for b in tr.busy] == [tuple(b) for b in rows] == [tuple(b) for b in tr.busy_rows]
    assert tr.end == max(r.end for r in tr.ops)
    plain = Trace(tr.schedule, tr.tiles, list(tr.ops), list(tr.busy), tr.end)
    assert plain.starts(s.marker) == before and plain.utilization() == tr.utilization()


def test_gc_paused_restores_the_collector_also_on_an_error():
    @gc_paused
    def inside():
        return gc.isenabled()

    @gc_paused
    def fails():
        raise ValueError("x")

    was = gc.isenabled()
    try:
        gc.enable()
        assert inside() is False and gc.isenabled()
        with pytest.raises(ValueError):
            fails()
        assert gc.isenabled()
        gc.disable()
        assert inside() is False and not gc.isenabled()  # left as it was found
    finally:
        (gc.enable if was else gc.disable)()


def _gaps_by_definition(trace, t0, t1, unit="tensor"):
    """tensor_gaps as its docstring defines it, spans merged pairwise, each hole against every span."""
    def merged(spans):
        out = []
        for a, b in sorted(spans):
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return out
    lo = float("-inf") if t0 is None else t0
    up = float("inf") if t1 is None else t1
    busy = merged((max(b.start, lo), min(b.end, up)) for b in trace.busy
                  if b.unit == unit and min(b.end, up) > max(b.start, lo))
    if not busy:
        return []
    edges = [busy[0][0] if t0 is None else t0] + [x for s in busy for x in s] + [busy[-1][1] if t1 is None else t1]
    holes = [(a, b) for a, b in zip(edges[0::2], edges[1::2]) if b > a]
    issuing = merged((b.start, b.end) for b in trace.busy
                     if (b.unit in power.ISSUING or b.unit.startswith("issue:")) and b.end > b.start)
    return [(b - a, sum(max(0.0, min(b, y) - max(a, x)) for x, y in issuing if y > a and x < b)) for a, b in holes]


@pytest.mark.parametrize("case", [BWD, FWD, ("h100", Problem(1, 16, 2048, 2048, 64, True), "fwd")],
                         ids=["bwd", "fwd", "h100"])
def test_tensor_gaps_and_utilization_are_their_definitions_exactly(case):
    tr = simulate(_schedule(case, 8), [8])
    for t0, t1 in ((None, tr.end), (None, None), (0.25 * tr.end, 0.75 * tr.end)):
        assert power.tensor_gaps(tr, t0, t1) == _gaps_by_definition(tr, t0, t1)
    for t0, t1 in ((0.0, None), (0.25 * tr.end, 0.75 * tr.end), (0.75 * tr.end, 0.25 * tr.end)):
        span = max((tr.end if t1 is None else t1) - t0, 1e-12)
        want = {u: 0.0 for u in tr.schedule.units}
        for b in tr.busy:
            want[b.unit] += max(0.0, min(b.end, tr.end if t1 is None else t1) - max(b.start, t0))
        assert tr.utilization(t0, t1) == {u: v / (span * tr.schedule.units[u]) for u, v in want.items()}
