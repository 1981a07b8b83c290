"""The engine on its own: closed forms, invariants, async issue, deadlock, determinism."""
import pytest

from fa4sim.engine import Edge, Op, Schedule, program, shared_rate, simulate
from fa4sim.errors import DeadlockError, InputError


def one_unit(ops, edges=(), roles=("r",), units=None):
    marker = next(o.name for o in ops if o.when == "all")
    return Schedule("t", units or {"u": 1}, list(roles), list(ops), list(edges), marker=marker)


def test_one_unit_no_overlap_is_the_sum_of_its_ops():
    s = one_unit([Op("a", "r", (("u", 10),)), Op("b", "r", (("u", 7),), latency=3)])
    tr = simulate(s, [5])
    assert tr.end == 5 * (10 + 7 + 3)


def test_work_on_a_path_that_is_no_unit_changes_no_time():
    """Op.work is for the power model: the engine neither holds it nor waits for it."""
    plain = simulate(one_unit([Op("a", "r", (("u", 10),)), Op("b", "r", (("u", 7),))]), [5])
    worked = simulate(one_unit([Op("a", "r", (("u", 10),), work=(("rf_operand", 40.0),)),
                                Op("b", "r", (("u", 7),))]), [5])
    assert worked.end == plain.end == 5 * 17
    assert not any(b.unit == "rf_operand" for b in worked.busy)


def test_two_roles_share_a_unit_in_fifo_order():
    s = one_unit([Op("a", "r", (("u", 10),)), Op("b", "q", (("u", 10),))], roles=("r", "q"))
    tr = simulate(s, [4])
    assert tr.end == 80  # the unit is the bottleneck: 8 ops x 10 cycles
    assert tr.utilization()["u"] == pytest.approx(1.0)


def test_async_op_frees_its_role_and_completes_later():
    s = one_unit([Op("mma", "r", (("u", 100),), latency=20, asynchronous=True, issue_cycles=2),
                  Op("work", "r", (("v", 50),))], units={"u": 1, "v": 1})
    tr = simulate(s, [1])
    mma = next(r for r in tr.ops if r.name == "mma")
    work = next(r for r in tr.ops if r.name == "work")
    assert work.issue == 2 and mma.end == 120 and tr.end == 120


def test_loop_carried_edge_and_lag():
    # b(i) waits for a(i-1) + 5: a's 10 cycles and b's 1 cycle run in a chain
    s = one_unit([Op("a", "r", (("u", 10),)), Op("b", "q", (("v", 1),))],
                 edges=[Edge("a", "b", distance=1, lag=5)], roles=("r", "q"), units={"u": 1, "v": 1})
    tr = simulate(s, [3])
    b = sorted((r.iter, r.issue) for r in tr.ops if r.name == "b")
    assert b == [(0, 0.0), (1, 15.0), (2, 25.0)]


def test_skew_runs_previous_iteration_in_program_order():
    s = one_unit([Op("pv", "r", (("u", 1),), skew=1), Op("qk", "r", (("u", 1),))])
    order = [(s.ops[i].name, it) for i, t, it in program(s, "r", [3])]
    assert order == [("qk", 0), ("pv", 0), ("qk", 1), ("pv", 1), ("qk", 2), ("pv", 2)]


def test_first_and_last_ops_per_tile():
    s = one_unit([Op("load_q", "r", (("u", 1),), when="first"), Op("x", "r", (("u", 1),)),
                  Op("store", "r", (("u", 1),), when="last")])
    tr = simulate(s, [3, 2])
    names = [(r.name, r.tile, r.iter) for r in tr.ops]
    assert names.count(("load_q", 0, 0)) == 1 and ("load_q", 1, 0) in names
    assert ("store", 0, 2) in names and ("store", 1, 1) in names
    assert sum(1 for n in names if n[0] == "x") == 5


def test_cyclic_dependency_is_reported_as_deadlock_naming_ops():
    s = one_unit([Op("a", "r", (("u", 1),)), Op("b", "q", (("u", 1),))],
                 edges=[Edge("a", "b"), Edge("b", "a")], roles=("r", "q"))
    with pytest.raises(DeadlockError) as e:
        simulate(s, [2])
    assert "a[tile 0, iter 0]" in str(e.value) and "b[tile 0, iter 0]" in str(e.value)


def test_bad_schedule_definitions():
    with pytest.raises(InputError):
        one_unit([Op("a", "r", (("nope", 1),))])
    with pytest.raises(InputError):
        one_unit([Op("a", "r", (("u", 1),))], edges=[Edge("a", "zz")])
    with pytest.raises(InputError):
        one_unit([Op("a", "r", (("u", 1),)), Op("a", "r", (("u", 1),))])
    with pytest.raises(InputError):
        simulate(one_unit([Op("a", "r", (("u", 1),))]), [0])


def test_issue_depth_makes_two_issuers_alternate():
    # two roles each issue 4-piece async ops; with a queue of 1 piece their pieces interleave
    ops = [Op("x", "r", (("u", 40),), asynchronous=True, issue_cycles=4, chunks=4),
           Op("y", "q", (("u", 40),), asynchronous=True, issue_cycles=4, chunks=4)]
    s = Schedule("t", {"u": 1}, ["r", "q"], ops, [], marker="x", issue_depth={"u": 1})
    tr = simulate(s, [1])
    owners = [tr.ops[b.rec].name for b in sorted(tr.busy, key=lambda b: b.start)]
    assert owners[:4] != ["x"] * 4 and sorted(owners) == ["x"] * 4 + ["y"] * 4


def test_skip_first_edge_does_not_bind_a_tiles_first_iteration():
    # b waits for a (which takes 10); with skip_first, b's first instance in each tile starts at once
    def run(skip):
        s = one_unit([Op("a", "r", (("u", 10),)), Op("b", "q", (("v", 1),))],
                     edges=[Edge("a", "b", skip_first=skip)], roles=("r", "q"), units={"u": 1, "v": 1})
        tr = simulate(s, [3, 3])
        return sorted((r.tile, r.iter, r.issue) for r in tr.ops if r.name == "b")

    bound, skipped = run(False), run(True)
    assert [x[2] for x in bound if x[1] == 0] == [10, 40]  # tile 1's a(0) is the 4th a: ends at 40
    # unbound: tile 0's b(0) at once, tile 1's b(0) right after the role's previous op b(2) (30 + 1)
    assert [x[2] for x in skipped if x[1] == 0] == [0, 31]
    assert [x[2] for x in skipped if x[1] > 0] == [x[2] for x in bound if x[1] > 0] == [20, 30, 50, 60]


def test_interference_slows_a_unit_and_an_op_may_carry_its_own_factor():
    """A piece on `issue` that starts while `tensor` is busy runs at the schedule's factor, or at
    the op's own (`slowed`): a dense FP32 burst is slowed less than a softmax mix (bench_bursts)."""
    def run(slowed):
        ops = [Op("mma", "m", (("tensor", 1000),), asynchronous=True, issue_cycles=1),
               Op("x", "r", (("issue", 100),), slowed=slowed)]
        s = Schedule("t", {"tensor": 1, "issue": 1}, ["m", "r"], ops, [], marker="mma",
                     interference={"issue": ("tensor", 0.25)})
        return next(r for r in simulate(s, [1]).ops if r.name == "x")
    assert run(()).end - run(()).start == pytest.approx(400)            # 100 / 0.25
    assert run((("issue", 0.5),)).end == pytest.approx(200)             # 100 / 0.5
    assert run((("other", 0.5),)).end == pytest.approx(400)             # a unit it does not use: no change


def test_duty_holds_a_unit_longer_than_its_work():
    """An op whose dependences keep a unit working only part of the time it holds it (`duty`):
    the unit is held work / share, another role queues behind that, and `uses` stays the work
    (what the power model counts)."""
    ops = [Op("a", "r", (("mufu", 90), ("issue", 50)), duty=(("mufu", 0.9),)),
           Op("b", "s", (("mufu", 10),))]
    s = Schedule("t", {"mufu": 1, "issue": 1}, ["r", "s"], ops, [], marker="a")
    assert s.op("a").held == (("mufu", pytest.approx(100.0)), ("issue", 50))
    assert s.op("a").occupancy == pytest.approx(100.0) and dict(s.op("a").uses)["mufu"] == 90
    trace = simulate(s, [1])
    a, b = (next(r for r in trace.ops if r.name == n) for n in ("a", "b"))
    assert a.end == pytest.approx(100.0) and b.start == pytest.approx(100.0)
    with pytest.raises(InputError, match="duty on 'mufu' must name a unit, share in"):
        Schedule("t", {"mufu": 1}, ["r"], [Op("a", "r", (("mufu", 1),), duty=(("mufu", 0.0),))], [], marker="a")


def test_shared_rate_is_one_warp_alone_and_saturates():
    assert shared_rate(0.4, 1) == pytest.approx(0.4)
    assert shared_rate(0.4, 2) == pytest.approx(0.64)   # 1 - 0.6^2: less than 2 x 0.4
    assert shared_rate(0.4, 3) == pytest.approx(0.784)
    assert shared_rate(1.0, 3) == 1.0


@pytest.mark.parametrize("k", [1, 2, 3])
def test_concurrency_serves_k_roles_at_their_shared_rate(k):
    """k roles issuing at once on a unit whose ops carry concurrency p get 1 - (1 - p)^k of it
    together: the unit's work of all of them over that rate, not over 1."""
    p, work, pieces = 0.5, 100.0, 20
    ops = [Op(f"x{r}", f"r{r}", (("issue", work),), chunks=pieces, concurrency=(("issue", p),)) for r in range(k)]
    s = Schedule("t", {"issue": 1}, [f"r{r}" for r in range(k)], ops, [], marker="x0")
    end = simulate(s, [1]).end
    # the first piece of each role starts before the others are queued, so allow that one piece
    assert end == pytest.approx(k * work / shared_rate(p, k), rel=1.0 / pieces)
    plain = Schedule("t", {"issue": 1}, [f"r{r}" for r in range(k)],
                     [Op(o.name, o.role, o.uses, chunks=pieces) for o in ops], [], marker="x0")
    assert simulate(plain, [1]).end == pytest.approx(k * work)


def test_concurrency_yields_to_interference():
    """A piece that starts while the interfering unit is busy takes the interference factor (a rate
    measured with the warps it has), not the shared rate on top of it."""
    ops = [Op("mma", "m", (("tensor", 1000),), asynchronous=True, issue_cycles=1),
           Op("x", "r", (("issue", 100),), concurrency=(("issue", 0.5),))]
    s = Schedule("t", {"tensor": 1, "issue": 1}, ["m", "r"], ops, [], marker="mma",
                 interference={"issue": ("tensor", 0.25)})
    x = next(r for r in simulate(s, [1]).ops if r.name == "x")
    assert x.end - x.start == pytest.approx(400)  # 100 / 0.25, not / (0.25 x 0.5)
    with pytest.raises(InputError, match="concurrency on 'issue' must name a unit, p in"):
        Schedule("t", {"issue": 1}, ["r"], [Op("a", "r", (("issue", 1),), concurrency=(("issue", 0.0),))], [],
                 marker="a")
