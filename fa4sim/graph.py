"""One loop iteration of a schedule as a dependency graph, and its initiation-interval bounds.

The graph is read from the `engine.Schedule` the simulation replays (never a second copy):

* **nodes** are the schedule's ops. Each carries its *reservation table* as the engine would
  run the op alone on idle units: the pieces it reserves on each unit (offset from its issue
  and length, cycles), the cycles from issue to completion (`completion`) and the cycles it
  keeps its warp role busy (`hold`: an asynchronous op its issue time, stretched while a unit
  with an issue depth has its queue full; a blocking op until it completes).
* **dependence edges** are the schedule's edges. An edge src -> dst of distance d says
  t_dst(i) >= t_src(i - d) + delay, with delay = completion(src) + lag.
* **order edges** are the hand schedule's program order: a role issues its ops in list order,
  op a in role iteration k running KV iteration k - skew_a, so consecutive ops a -> b form an
  edge of distance skew_a - skew_b and delay hold(a), and the last op closes the loop to the
  first with distance 1 + skew_last - skew_first. They are the schedule's implicit recurrence;
  a solver is free to choose another order (fa4sim/modulo.py).
* **loop and tile ops.** Ops that run every iteration (`when="all"`) form the loop. Ops that run
  once per tile (`when="first"`: prologue, `"last"`: epilogue) and edges counted in tiles
  (`per="tile"`) or touching those ops are kept in the graph but left out of the bounds: they
  cost once per tile, nothing per iteration of a long tile.

Bounds on the initiation interval II (cycles per iteration in the steady state):

* ResMII = max over units of (sum of the loop ops' cycles on the unit) / capacity, and over warp
  roles of the sum of their ops' holds (a role issues one op at a time, in any order).
* RecMII = max over elementary cycles of sum(delay) / sum(distance). It is found exactly by
  parametric Bellman-Ford with cycle improvement: at a trial ratio L, a cycle of positive weight
  sum(delay - L * distance) is a cycle whose ratio exceeds L; its exact ratio becomes the next L,
  until no positive cycle is left. The last cycle found is the critical one. A cycle whose
  distances sum to 0 or less with positive delay admits no II: the schedule would deadlock.

Units are served at their nominal rate: a unit the schedule slows beside another
(`Schedule.interference`) is charged at that slower rate only with `slowed=True` (the rate the
engine charges a piece that starts while the other unit is busy).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .engine import Op, Schedule
from .errors import InputError


@dataclass(frozen=True)
class Piece:
    """A stretch of one unit an op reserves: offset from the op's issue and length, cycles."""

    unit: str
    offset: float
    length: float


@dataclass(frozen=True)
class Node:
    name: str
    role: str
    uses: dict           # unit -> cycles (the op's own numbers, nominal rate)
    latency: float
    asynchronous: bool
    skew: int            # the hand schedule's
    when: str
    pieces: tuple        # Piece, ... (merged where contiguous)
    completion: float    # cycles from issue to completion, alone on idle units
    hold: float          # cycles its role is busy from its issue
    label: str = ""

    @property
    def in_loop(self) -> bool:
        return self.when == "all"


@dataclass(frozen=True)
class Dep:
    src: str
    dst: str
    distance: int
    kind: str            # flow | anti | output | order
    lag: float
    delay: float         # completion(src) + lag (order edges: hold(src))
    per: str = "iter"
    in_loop: bool = True


@dataclass(frozen=True)
class Bound:
    """A lower bound on II (cycles) and what sets it: a unit or role name (ResMII) or a cycle
    of edges (RecMII)."""

    value: float
    critical: str
    cycle: tuple = ()    # Dep, ... for RecMII
    loads: dict = field(default_factory=dict)  # ResMII: per unit and role, cycles per iteration


@dataclass
class LoopGraph:
    schedule: str
    units: dict          # unit -> capacity
    roles: list
    nodes: list          # Node
    deps: list           # Dep (the schedule's edges)
    order: list          # Dep (kind "order": the hand schedule's program order among loop ops)
    queued: set = field(default_factory=set)  # units with an issue queue (served in issue order)
    slowed: bool = False

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    @property
    def loop_nodes(self) -> list:
        return [n for n in self.nodes if n.in_loop]

    @property
    def loop_deps(self) -> list:
        return [d for d in self.deps if d.in_loop]


def _rates(schedule: Schedule, op: Op, slowed: bool) -> dict:
    """unit -> factor of its nominal rate this op is charged at (1 unless slowed)."""
    if not slowed:
        return {}
    own = dict(op.slowed)
    return {u: own.get(u, f) for u, (_, f) in schedule.interference.items() if f < 1.0}


def isolated(schedule: Schedule, op: Op, slowed: bool = False) -> tuple[tuple, float, float]:
    """(pieces, completion, hold) of `op` run alone on idle units, as engine.simulate runs it:
    a blocking op reserves piece k of every unit when piece k-1 has ended on all of them; an
    asynchronous op issues a piece every issue_cycles/chunks, each waiting for room in a unit's
    issue queue, and the pieces of one unit run back to back."""
    rate = _rates(schedule, op, slowed)
    parts = [(u, c / rate.get(u, 1.0) / op.chunks) for u, c in op.held if c > 0]
    pieces: list[Piece] = []
    if not op.asynchronous:
        step = max((length for _, length in parts), default=0.0)
        for k in range(op.chunks):
            pieces += [Piece(u, k * step, length) for u, length in parts]
        completion = op.chunks * step + op.latency
        return _merge(pieces), completion, completion
    step = op.issue_cycles / op.chunks
    depth = schedule.issue_depth
    free = {u: 0.0 for u, _ in parts}
    ends: dict[str, list] = {u: [] for u, _ in parts}
    x = last = 0.0
    for k in range(op.chunks):
        if k:
            x += step
        for u, _ in parts:  # room in a gated unit's queue: fewer than depth pieces outstanding
            if u in depth:
                out = sorted(e for e in ends[u] if e > x)
                if len(out) >= depth[u]:
                    x = out[len(out) - depth[u]]
        last = max(last, x)
        for u, length in parts:
            s = max(x, free[u])
            free[u] = s + length
            ends[u].append(s + length)
            pieces.append(Piece(u, s, length))
            last = max(last, s + length)
    return _merge(pieces), last + op.latency, x + step


def _merge(pieces: list) -> tuple:
    """Join a unit's pieces that touch (a contiguous reservation is one interval)."""
    out: list[Piece] = []
    for p in sorted(pieces, key=lambda p: (p.unit, p.offset)):
        if out and out[-1].unit == p.unit and abs(out[-1].offset + out[-1].length - p.offset) < 1e-9:
            q = out.pop()
            p = Piece(p.unit, q.offset, q.length + p.length)
        out.append(p)
    return tuple(out)


def build(schedule: Schedule, slowed: bool = False) -> LoopGraph:
    """The dependency graph of `schedule`'s loop iteration (see the module docstring)."""
    nodes = []
    for op in schedule.ops:
        pieces, completion, hold = isolated(schedule, op, slowed)
        nodes.append(Node(op.name, op.role, {u: c for u, c in op.held if c > 0}, op.latency, op.asynchronous,
                          op.skew, op.when, pieces, completion, hold, op.label))
    by_name = {n.name: n for n in nodes}
    deps = [Dep(e.src, e.dst, e.distance, e.kind, e.lag, by_name[e.src].completion + e.lag, e.per,
                e.per == "iter" and by_name[e.src].in_loop and by_name[e.dst].in_loop)
            for e in schedule.edges]
    queued = set(schedule.issue_depth)
    return LoopGraph(schedule.name, dict(schedule.units), list(schedule.roles), nodes, deps,
                     order_edges(nodes, schedule.roles, queued), queued, slowed)


def order_edges(nodes: list, roles: list, queued: set) -> list:
    """The program order of each role's loop ops as edges (see the module docstring)."""
    out = []
    for role in roles:
        seq = [n for n in nodes if n.role == role and n.in_loop]
        for a, b in zip(seq, seq[1:] + seq[:1]):
            wrap = 1 if b is seq[0] else 0
            if len(seq) == 1 and a.hold <= 0:
                continue
            out.append(Dep(a.name, b.name, wrap + a.skew - b.skew, "order", 0.0, issue_order_delay(a, b, queued)))
    return out


def issue_order_delay(a: Node, b: Node, queued: set) -> float:
    """Cycles from a's issue to b's when b follows a in one role's program: a's hold, or, for
    two asynchronous ops on a unit with an issue queue (served in issue order), until a's work
    there has ended where b's begins (b's pieces start at its issue in this graph)."""
    delay = a.hold
    if a.asynchronous and b.asynchronous:
        for u in queued:
            ends = [p.offset + p.length for p in a.pieces if p.unit == u]
            starts = [p.offset for p in b.pieces if p.unit == u]
            if ends and starts:
                delay = max(delay, max(ends) - min(starts))
    return delay


def res_mii(graph: LoopGraph, roles: bool = True) -> Bound:
    """The resource bound: the busiest unit's cycles per iteration over its capacity; with
    `roles`, also each warp role's summed holds."""
    loads = {u: 0.0 for u in graph.units}
    for n in graph.loop_nodes:
        for p in n.pieces:
            loads[p.unit] += p.length
    loads = {u: v / graph.units[u] for u, v in loads.items()}
    if roles:
        for r in graph.roles:
            loads[f"role:{r}"] = sum(n.hold for n in graph.loop_nodes if n.role == r)
    critical = max(loads, key=lambda u: loads[u])
    return Bound(loads[critical], critical, loads=loads)


def rec_mii(graph: LoopGraph, with_order: bool = False) -> Bound:
    """The recurrence bound over the loop's dependence edges (and, with `with_order`, the
    hand schedule's program order): the largest sum(delay) / sum(distance) of a cycle."""
    names = [n.name for n in graph.loop_nodes]
    edges = graph.loop_deps + (graph.order if with_order else [])
    ratio, cycle = max_cycle_ratio(names, edges)
    if not cycle:
        return Bound(0.0, "no dependence cycle with a positive delay")
    path = " -> ".join([cycle[0].src] + [d.dst for d in cycle])
    return Bound(ratio, path, tuple(cycle))


def max_cycle_ratio(names: list, edges: list) -> tuple[float, list]:
    """(max over elementary cycles of sum(delay)/sum(distance), that cycle's edges in order).
    edges: objects with src, dst, delay, distance. Raises InputError for a cycle that no II
    satisfies (distances summing to <= 0 with a positive delay)."""
    index = {n: i for i, n in enumerate(names)}
    es = [(index[e.src], index[e.dst], e.delay, e.distance, e) for e in edges]
    scale = max([1.0] + [abs(e[2]) for e in es])
    eps = 1e-9 * scale
    lam, best = 0.0, []
    for _ in range(10 * len(es) + 10):
        cyc = _positive_cycle(len(names), es, lam, eps)
        if cyc is None:
            break
        delay = sum(es[k][2] for k in cyc)
        dist = sum(es[k][3] for k in cyc)
        if dist <= 0:
            path = " -> ".join([es[cyc[0]][4].src] + [es[k][4].dst for k in cyc])
            raise InputError("schedule", f"dependence cycle {path} spans {dist} iterations with {delay:g} cycles "
                                         f"of delay: no initiation interval satisfies it (a deadlock)")
        lam, best = delay / dist, [es[k][4] for k in cyc]
    if not best and _positive_cycle(len(names), es, 1.0, eps) is not None:
        raise InputError("schedule", "a dependence cycle spans a negative number of iterations (a deadlock)")
    return lam, best


def _positive_cycle(n: int, es: list, lam: float, eps: float):
    """Edge indices of a cycle with positive weight sum(delay - lam * distance), or None
    (Bellman-Ford for the longest path from a virtual source joined to every node)."""
    if n == 0:
        return None
    dist = [0.0] * n
    pred = [-1] * n
    changed = -1
    for _ in range(n):
        changed = -1
        for k, (u, v, dl, ds, _) in enumerate(es):
            w = dist[u] + dl - lam * ds
            if w > dist[v] + eps:
                dist[v], pred[v], changed = w, k, v
        if changed < 0:
            return None
    v = changed
    for _ in range(n):  # walk back into the cycle
        v = es[pred[v]][0]
    cycle, x = [], v
    while True:
        k = pred[x]
        cycle.append(k)
        x = es[k][0]
        if x == v:
            break
    return cycle[::-1]


# ---------------------------------------------------------------------------------------------
# outputs


def to_json(graph: LoopGraph, res: Bound, rec: Bound, rec_order: Bound | None = None) -> dict:
    r = lambda x: round(x, 3)  # noqa: E731
    out = {
        "schedule": graph.schedule,
        "units": graph.units,
        "roles": graph.roles,
        "slowed": graph.slowed,
        "ops": [{"name": n.name, "role": n.role, "uses": {u: r(c) for u, c in n.uses.items()},
                 "latency": r(n.latency), "completion": r(n.completion), "hold": r(n.hold),
                 "asynchronous": n.asynchronous, "skew": n.skew, "when": n.when, "in_loop": n.in_loop,
                 "label": n.label} for n in graph.nodes],
        "edges": [_dep_json(d) for d in graph.deps],
        "order_edges": [_dep_json(d) for d in graph.order],
        "res_mii": {"value": r(res.value), "critical": res.critical,
                    "loads": {u: r(v) for u, v in res.loads.items()}},
        "rec_mii": _rec_json(rec),
    }
    if rec_order is not None:
        out["rec_mii_hand_order"] = _rec_json(rec_order)
    out["mii"] = r(max(res.value, rec.value))
    return out


def _dep_json(d: Dep) -> dict:
    return {"src": d.src, "dst": d.dst, "distance": d.distance, "kind": d.kind, "lag": round(d.lag, 3),
            "delay": round(d.delay, 3), "per": d.per, "in_loop": d.in_loop}


def _rec_json(b: Bound) -> dict:
    return {"value": round(b.value, 3), "critical": b.critical,
            "cycle": [_dep_json(d) for d in b.cycle],
            "delay": round(sum(d.delay for d in b.cycle), 3), "distance": sum(d.distance for d in b.cycle)}


def to_dot(graph: LoopGraph, rec: Bound | None = None) -> str:
    """Graphviz text: one cluster per role, edges labelled with distance and delay; tile ops
    dashed, the critical cycle bold red."""
    crit = {(d.src, d.dst, d.kind, d.distance) for d in (rec.cycle if rec else ())}
    lines = [f'digraph "{graph.schedule}" {{', "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];']
    for i, role in enumerate(graph.roles):
        lines.append(f'  subgraph "cluster_{role}" {{ label="{role}";')
        for n in graph.nodes:
            if n.role == role:
                units = ", ".join(f"{u} {c:.0f}" for u, c in n.uses.items())
                style = "" if n.in_loop else ", style=dashed"
                lines.append(f'    "{n.name}" [label="{n.name}\\n{units}\\nlat {n.latency:.0f}"{style}];')
        lines.append("  }")
    for d in graph.deps + graph.order:
        attrs = [f'label="d={d.distance} {d.delay:.0f}"']
        if d.kind == "order":
            attrs.append("color=gray, style=dotted")
        elif d.kind == "anti":
            attrs.append("color=blue")
        if not d.in_loop:
            attrs.append("style=dashed")
        if (d.src, d.dst, d.kind, d.distance) in crit:
            attrs.append("color=red, penwidth=2")
        lines.append(f'  "{d.src}" -> "{d.dst}" [{", ".join(attrs)}];')
    lines.append("}")
    return "\n".join(lines) + "\n"
