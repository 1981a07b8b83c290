"""A modulo schedule for a loop graph (fa4sim/graph.py) by OR-Tools CP-SAT, and its role programs.

The model, in integer ticks (`ticks_per_cycle` per cycle; starts are rounded down, lengths,
delays and holds up, so a tick solution is a feasible cycle schedule):

* every loop op o issues KV iteration i at t_o + i * II, with t_o = stage_o * II + r_o,
  0 <= r_o < II;
* every unit holds, at each moment modulo II, at most its capacity of ops' work. An op's work
  on a unit is one block from its first piece on the unit, as long as its pieces there add
  up to (exact for the unit that sets a blocking op's length and for an asynchronous op's
  back-to-back pieces; the engine spreads a blocking op's work on its other units over the
  op). Each block has copies shifted by -II and +II, so one NoOverlap (or Cumulative) over the
  copies is the exact modulo reservation table;
* every warp role issues one op at a time: its ops' holds do not overlap modulo II;
* every dependence edge: t_dst + distance * II >= t_src + completion(src) + lag;
* the order a role's code fixes (`order`):
    "code"  (default) what a warp's code cannot reorder: the asynchronous ops a role issues to
            a unit with an issue queue (the tensor core executes them in issue order, and the
            kernels reuse TMEM and shared-memory slots on the strength of that order), and the
            role's blocking ops among themselves (register data flow the schedule does not list
            as edges), each in the hand order with the hand's iteration distances; free: where
            a role's asynchronous issues fall among its compute, the order of ops on units
            without an issue queue (TMA), and every role's stage;
    "hand"  the hand schedule's whole program order (only the timing is free);
    "free"  none (only the schedule's edges): a bound on what a schedule with every hazard
            stated as an edge could reach; its programs may break hazards the hand schedule
            expresses only by its order.
An op's block on a unit and its hold fit in one II (an op does not overlap its own next
iteration).

The search: II = the lower bound max(ResMII, RecMII of the kept edges) first, then larger IIs
(doubling steps, then bisection), each a CP-SAT feasibility problem at a fixed II (linear, so
fast to prove or refute), then the IIs below the best not yet tried while time is left. The status is
OPTIMAL when every smaller II is proven infeasible (or the bound is reached), else FEASIBLE;
proofs hold for schedules of up to `q_max` + 1 stages (the stages an as-soon-as-possible
schedule at twice the bound spans, plus 3).
Then, at the best II: the fewest stages, then the shortest sum of flow-edge lifetimes
(t_dst + distance * II - t_src: values held in registers and buffers).

Role programs: a role's ops sorted by r_o (position in the steady-state window) run with
skew = stage - the role's smallest stage. Ops that run once per tile (prologue, epilogue) are
placed after the solve, as early as their same-iteration predecessors allow (as late as their
successors allow if they have none), and take their skew the same way.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from .engine import Schedule
from .errors import InputError
from .graph import Dep, LoopGraph, issue_order_delay, max_cycle_ratio, res_mii

ORDERS = ("code", "hand", "compute", "free")
LIST_ORDERS = ("CHOOSE_FIRST", "CHOOSE_MIN_DOMAIN_SIZE", "CHOOSE_LOWEST_MIN")  # cp_model's names
SECONDARY_S = 0.3  # seconds at most for the secondary objective (stages, lifetimes)


@dataclass
class Solution:
    ii: float                 # cycles per iteration
    status: str               # OPTIMAL (no smaller II exists) | FEASIBLE
    offset: dict              # op -> t_o, cycles (loop ops: solved; tile ops: placed)
    stage: dict               # op -> stage (0 = earliest)
    programs: dict            # role -> [(op, skew), ...] in issue order
    res_mii: float
    res_critical: str
    rec_mii: float            # over the dependence edges and the kept order edges
    rec_critical: str
    lower_bound: float        # cycles: no smaller II exists (the bound, raised past IIs proven infeasible)
    stages: int
    wall_s: float
    kept: list = field(default_factory=list)  # Dep: the order edges the model kept
    ticks_per_cycle: int = 1
    tried: dict = field(default_factory=dict)  # II in ticks -> "feasible" | "infeasible" | "unknown"


def kept_order(graph: LoopGraph, order: str) -> list:
    """The hand order edges the solver keeps under `order` (see the module docstring)."""
    if order not in ORDERS:
        raise InputError("order", f"unknown order {order!r}; allowed: {', '.join(ORDERS)}")
    if order == "free":
        return []
    if order == "hand":
        return list(graph.order)
    gated = graph.queued
    out = []
    for role in graph.roles:
        seq = [n for n in graph.loop_nodes if n.role == role]
        groups: dict = {}
        for n in seq:
            queue = sorted(u for u in n.uses if u in gated) if n.asynchronous else []
            if n.asynchronous and (not queue or order == "compute"):
                continue  # an async op on queue-less units: placed freely among the rest
            key = ("async", tuple(queue)) if n.asynchronous else ("blocking",)
            groups.setdefault(key, []).append(n)
        for members in groups.values():
            if len(members) < 2:
                continue
            for a, b in zip(members, members[1:] + members[:1]):
                wrap = 1 if b is members[0] else 0
                out.append(Dep(a.name, b.name, wrap + a.skew - b.skew, "order", 0.0,
                               issue_order_delay(a, b, gated)))
    return out


def _ticks(x: float, scale: int) -> int:
    return int(math.ceil(x * scale - 1e-9))


def _blocks(pieces, scale: int) -> list:
    """[(unit, start, length)] in ticks: per unit, one block from the first piece's start as
    long as the pieces on the unit add up to."""
    spans: dict = {}
    for p in pieces:
        if p.length > 0:
            a, busy = spans.get(p.unit, (math.inf, 0.0))
            spans[p.unit] = (min(a, p.offset), busy + p.length)
    return [(u, int(math.floor(a * scale + 1e-9)), max(1, _ticks(busy, scale)))
            for u, (a, busy) in sorted(spans.items())]


def solve(graph: LoopGraph, order: str = "code", time_limit_s: float = 0.7,
          ticks_per_cycle: int = 1, workers: int = 2) -> Solution:
    """The modulo schedule of the graph's loop with the smallest II (see the module docstring).
    Raises InputError when no II is found within the time limit or none exists."""
    from ortools.sat.python import cp_model  # noqa: F401  (loading it takes ~0.5 s: not timed)

    t_start = time.perf_counter()
    if not isinstance(ticks_per_cycle, int) or ticks_per_cycle < 1:
        raise InputError("ticks_per_cycle", f"must be an integer >= 1, got {ticks_per_cycle!r}")
    if not time_limit_s > 0:
        raise InputError("time_limit", f"must be > 0 seconds, got {time_limit_s!r}")
    if not graph.loop_nodes:
        raise InputError("schedule", f"{graph.schedule} has no op that runs every iteration: nothing to pipeline")
    kept = kept_order(graph, order)
    inst = _Instance(graph, graph.loop_deps + kept, ticks_per_cycle)
    res = res_mii(graph)

    def left() -> float:
        return time_limit_s - (time.perf_counter() - t_start)

    tried: dict = {}
    best = None

    def attempt(ii: int):
        nonlocal best
        if ii in tried or left() <= 0.01:
            return tried.get(ii)
        # list scheduling first, ops in three orders (each fast on some graphs, slow on others),
        # then CP-SAT's own portfolio
        out = None
        for choice in LIST_ORDERS:
            if out is None and left() > 0.01:
                out = inst.run(ii, max(0.01, min(left() * 0.25, max(0.15, time_limit_s / 10))), 1,
                               fixed_search=choice)
        if out is None and left() > 0.05:
            out = inst.run(ii, left() * 0.3, workers)
        tried[ii] = "unknown" if out is None else "infeasible" if out == "INFEASIBLE" else "feasible"
        if tried[ii] == "feasible" and (best is None or ii < best[0]):
            best = (ii, out)
        return tried[ii]

    # gallop up from the bound to a feasible II, then bisect, then fill the gaps below it
    step, ii = 1, inst.lb
    while ii <= inst.ub and left() > 0.01 and attempt(ii) != "feasible":
        ii, step = min(inst.ub, inst.lb + step), step * 2
        if ii in tried:
            break
    if best is not None:
        lo = max([x for x, v in tried.items() if v != "feasible" and x < best[0]], default=inst.lb - 1)
        while best[0] - lo > 1 and left() > 0.01:
            mid = (lo + best[0]) // 2
            lo = mid if attempt(mid) != "feasible" else lo
        for x in range(inst.lb, best[0]):
            if left() <= 0.01:
                break
            attempt(x)
    if best is None:
        if tried and all(v == "infeasible" for v in tried.values()) and max(tried) >= inst.ub:
            why = "no schedule exists"
        else:
            why = f"no schedule found within {time_limit_s:g} s"
        raise InputError("solve", f"{why} for {graph.schedule} (order={order}; II from {inst.lb / inst.scale:g} to "
                                  f"{inst.ub / inst.scale:g} cycles, up to {inst.q_max + 1} stages)")
    proven = inst.lb
    while tried.get(proven) == "infeasible":
        proven += 1
    status = "OPTIMAL" if proven >= best[0] else "FEASIBLE"
    ii_best, sol = best
    # at that II: the fewest stages, then the shortest lifetimes
    if left() > 0.02:
        again = inst.run(ii_best, min(left(), SECONDARY_S), 1, hint=sol, secondary=True)
        if isinstance(again, dict):
            sol = again

    ii_c = ii_best / inst.scale
    offset = {k: (sol[k][0] * ii_best + sol[k][1]) / inst.scale for k in sol}
    offset = _place_tile_ops(graph, offset)
    stage = {k: math.floor(v / ii_c + 1e-9) for k, v in offset.items()}
    low = min(stage[n.name] for n in graph.loop_nodes)
    stage = {k: v - low for k, v in stage.items()}
    offset = {k: v - low * ii_c for k, v in offset.items()}
    programs = role_programs(graph, offset, stage, ii_c)
    stages = max(stage[n.name] for n in graph.loop_nodes) + 1
    return Solution(ii_c, status, offset, stage, programs, res.value, res.critical, inst.rec, inst.rec_critical,
                    proven / inst.scale, stages, time.perf_counter() - t_start, kept, inst.scale, tried)


class _Instance:
    """The integer data of one solve and its CP-SAT model at a fixed II."""

    def __init__(self, graph: LoopGraph, edges: list, scale: int):
        self.graph, self.edges, self.scale = graph, edges, scale
        nodes = graph.loop_nodes
        self.names = [n.name for n in nodes]
        self.role = {n.name: n.role for n in nodes}
        self.rec, cycle = max_cycle_ratio(self.names, edges)
        self.rec_critical = " -> ".join([cycle[0].src] + [d.dst for d in cycle]) if cycle else "none"
        self.blocks = {n.name: _blocks(n.pieces, scale) for n in nodes}
        self.hold = {n.name: _ticks(n.hold, scale) for n in nodes}
        self.delay = [_ticks(e.delay, scale) for e in edges]
        self.footprint = max([1] + list(self.hold.values())
                             + [o + ln for bs in self.blocks.values() for _, o, ln in bs])
        loads = {u: 0 for u in graph.units}
        for bs in self.blocks.values():
            for u, _, ln in bs:
                loads[u] += ln
        roles = {r: sum(self.hold[k] for k in self.names if self.role[k] == r) for r in graph.roles}
        self.lb = max([self.footprint, _ticks(self.rec, scale)] + list(roles.values())
                      + [-(-v // graph.units[u]) for u, v in loads.items()])
        # every op alone in its own stretch: feasible once no dependence cycle spans 0 iterations
        self.ub = max(self.lb, len(self.names) * self.footprint + sum(self.delay))
        self.q_max = self._stages(2 * self.lb)
        self.topo = self._topological()
        self.anchor = cycle[0].src if cycle else self.topo[0]

    def _topological(self) -> list:
        """The ops in an order where each comes after its same-iteration predecessors (edges of
        distance 0), ties by list order."""
        preds = {k: {e.src for e in self.edges if e.dst == k and e.distance <= 0 and e.src != k} for k in self.names}
        out, done = [], set()
        while len(out) < len(self.names):
            ready = [k for k in self.names if k not in done and preds[k] <= done]
            k = ready[0] if ready else next(k for k in self.names if k not in done)
            out.append(k)
            done.add(k)
        return out

    def _stages(self, ii: int) -> int:
        """Stages an as-soon-as-possible schedule at II = ii spans (no resources), plus slack."""
        idx = {k: i for i, k in enumerate(self.names)}
        dist = [0] * len(self.names)
        for _ in range(len(self.names)):
            for e, d in zip(self.edges, self.delay):
                w = dist[idx[e.src]] + d - ii * e.distance
                if w > dist[idx[e.dst]]:
                    dist[idx[e.dst]] = w
        return min(32, max(dist) // max(ii, 1) + 4)

    def run(self, ii: int, limit_s: float, workers: int, hint: dict | None = None, secondary: bool = False,
            fixed_search: str = ""):
        """{op: (stage, r)} of a schedule at this II ("INFEASIBLE" when none exists, None when
        none was found in time); `secondary`: the fewest stages, then the shortest lifetimes."""
        from ortools.sat.python import cp_model

        if ii < self.footprint:
            return "INFEASIBLE"
        m = cp_model.CpModel()
        q_max = self.q_max
        r = {k: m.new_int_var(0, ii - 1, f"r_{k}") for k in self.names}
        q = {k: m.new_int_var(0, q_max, f"q_{k}") for k in self.names}
        t = {k: m.new_int_var(0, (q_max + 1) * ii - 1, f"t_{k}") for k in self.names}
        for k in self.names:
            m.add(t[k] == q[k] * ii + r[k])
        m.add(r[self.anchor] == 0)  # a schedule shifted in time is the same schedule
        per_unit: dict = {u: [] for u in self.graph.units}
        per_role: dict = {ro: [] for ro in self.graph.roles}
        for k in self.names:
            for shift in (-ii, 0, ii):
                for u, off, ln in self.blocks[k]:
                    per_unit[u].append(m.new_fixed_size_interval_var(r[k] + off + shift, ln, f"{k}@{u}"))
                if self.hold[k] > 0:
                    per_role[self.role[k]].append(
                        m.new_fixed_size_interval_var(r[k] + shift, self.hold[k], f"{k}@role"))
        for u, ivs in per_unit.items():
            if len(ivs) > 3:
                if self.graph.units[u] == 1:
                    m.add_no_overlap(ivs)
                else:
                    m.add_cumulative(ivs, [1] * len(ivs), self.graph.units[u])
        for ivs in per_role.values():
            if len(ivs) > 3:
                m.add_no_overlap(ivs)
        lifetimes = []
        for e, d in zip(self.edges, self.delay):
            m.add(t[e.dst] + e.distance * ii >= t[e.src] + d)
            if e.kind == "flow":
                lifetimes.append(t[e.dst] + e.distance * ii - t[e.src])
        qlow, qhigh = m.new_int_var(0, q_max, "qlow"), m.new_int_var(0, q_max, "qhigh")
        m.add_min_equality(qlow, list(q.values()))
        m.add_max_equality(qhigh, list(q.values()))
        m.add(qlow == 0)
        if secondary:
            m.minimize(qhigh * ((q_max + 2) * ii * max(1, len(lifetimes)) + 1) + sum(lifetimes))
        if hint:
            for k, (qk, rk) in hint.items():
                m.add_hint(q[k], qk)
                m.add_hint(r[k], rk)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = workers
        solver.parameters.interleave_search = workers > 1  # deterministic with several workers
        if fixed_search:  # list scheduling: each op in turn as early as it fits, backtracking
            m.add_decision_strategy([t[k] for k in self.topo], getattr(cp_model, fixed_search),
                                    cp_model.SELECT_MIN_VALUE)
            solver.parameters.search_branching = cp_model.FIXED_SEARCH
        solver.parameters.max_time_in_seconds = limit_s
        solver.parameters.max_deterministic_time = limit_s  # the same answer on a faster machine
        st = solver.solve(m)
        if st == cp_model.INFEASIBLE:
            return "INFEASIBLE"
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        return {k: (solver.value(q[k]), solver.value(r[k])) for k in self.names}


def _place_tile_ops(graph: LoopGraph, offset: dict) -> dict:
    """Offsets for the ops that run once per tile: after their same-iteration predecessors,
    else before their successors, else at the edge of their role's loop ops."""
    out = dict(offset)
    pending = [n for n in graph.nodes if n.name not in out]
    same = [d for d in graph.deps if d.per == "iter" and d.distance == 0]
    for _ in range(len(pending) + 1):
        for n in list(pending):
            preds = [d for d in same if d.dst == n.name]
            succs = [d for d in same if d.src == n.name]
            if preds and all(d.src in out for d in preds):
                out[n.name] = max(out[d.src] + d.delay for d in preds)
            elif not preds and succs and all(d.dst in out for d in succs):
                out[n.name] = min(out[d.dst] - d.delay for d in succs)
            elif not preds and not succs:
                mates = [out[m.name] for m in graph.loop_nodes if m.role == n.role] or list(offset.values())
                out[n.name] = (min(mates) - 1.0) if n.when == "first" else (max(mates) + 1.0)
            else:
                continue
            pending.remove(n)
    for n in pending:  # waiting on each other: next to the loop
        out[n.name] = max(offset.values())
    return out


def role_programs(graph: LoopGraph, offset: dict, stage: dict, ii: float) -> dict:
    """role -> [(op, skew)] in issue order: sorted by position in the window, skew = stage -
    the role's smallest stage."""
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    programs = {}
    for role in graph.roles:
        names = [n.name for n in graph.nodes if n.role == role]
        if not names:
            programs[role] = []
            continue
        low = min(stage[k] for k in names)
        names.sort(key=lambda k: (round(offset[k] - stage[k] * ii, 6), position[k]))
        programs[role] = [(k, stage[k] - low) for k in names]
    return programs


def schedule_from(schedule: Schedule, programs: dict) -> Schedule:
    """The engine schedule that runs the role programs: the same ops, units and edges, each
    role's ops in program order with the program's skews."""
    by_name = {o.name: o for o in schedule.ops}
    ops = [replace(by_name[name], skew=skew) for role in schedule.roles for name, skew in programs.get(role, [])]
    return replace(schedule, ops=ops)


def replayed_interval(schedule: Schedule, n: int) -> float | None:
    """Steady-state cycles per iteration of `schedule` on one tile of n iterations (at most
    steady_state.CAP simulated), as simulate() measures it: the marker op's period."""
    from .engine import simulate
    from .steady_state import CAP, detect, window

    trace = simulate(schedule, [min(n, CAP)])
    return window(trace, detect(trace.starts(schedule.marker)))[2]


def program_text(programs: dict, graph: LoopGraph) -> dict:
    """role -> the op instances its role iterations issue: "prologue" (role iterations 0 ..
    depth-1, KV iterations numbered from 0), "steady" (role iteration k: op(k - skew)),
    "epilogue" (the last depth role iterations of a tile of n iterations), and the ops that run
    once per tile ("first": with KV iteration 0, "last": with n-1), depth = the largest skew."""
    when = {n.name: n.when for n in graph.nodes}
    out = {}
    for role, prog in programs.items():
        loop = [(k, s) for k, s in prog if when[k] == "all"]
        depth = max((s for _, s in loop), default=0)
        out[role] = {
            "depth": depth,
            "prologue": [" ".join(f"{k}({i - s})" for k, s in loop if s <= i) for i in range(depth)],
            "steady": [f"{k}(k-{s})" if s else f"{k}(k)" for k, s in loop],
            "epilogue": [" ".join(f"{k}(n{i - s})" for k, s in loop if s > i) for i in range(depth)],
            "first": [k for k, _ in prog if when[k] == "first"],
            "last": [k for k, _ in prog if when[k] == "last"],
        }
    return out
