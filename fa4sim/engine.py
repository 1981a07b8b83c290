"""A discrete-event engine for warp-specialised kernel schedules, on SimPy.

The engine knows nothing about attention. It is given a `Schedule`:

* **units**: hardware pipes of one SM (tensor core, MUFU, FMA pipe, TMA, ...). A unit serves the
  parts of ops in the order they are issued (first come, first served), `capacity` at a time.
* **roles**: warp roles (load warp, MMA warp, softmax warpgroup, ...). Each runs its own program:
  the ops of one loop iteration, in program order, repeated for every KV block of every tile.
  A role is a plain SimPy process (a generator), as in SimPy's own examples.
* **ops**: an op names the unit(s) it occupies and for how many cycles, plus a completion
  latency. A *blocking* op holds its role until it completes; an *asynchronous* op (wgmma,
  tcgen05.mma, TMA) holds its role only for `issue_cycles`, then runs on its units on its own,
  and signals completion.
  An op of `chunks` > 1 pieces reserves its units one piece at a time: an asynchronous op as it
  issues its instructions (issue_cycles/chunks apart), a blocking op as each piece finishes.
  So two warpgroups working at once interleave on a unit (Hopper's wgmma from two consumer
  warpgroups; two softmax warpgroups sharing the MUFU), which approximates processor sharing,
  while a single issuer stays in order. A unit named in `issue_depth` accepts an asynchronous
  piece only while fewer than that many of its pieces are queued or running: the issuer stalls,
  as a warp does when the tensor core's instruction queue is full, and two issuers alternate.
  A unit named in `interference` serves a piece at a reduced rate when it starts while another
  unit is busy (measured on Hopper: warps issue and MUFU run slower beside a running wgmma).
  An op's `duty` on a unit holds the unit longer than its work (`uses`): code whose dependences
  leave a unit idle at times (a softmax keeps the MUFU 92 % busy on Hopper).
  An op's `concurrency` (unit, p) serves its pieces on a shared issue unit at 1 - (1 - p)^k of the
  unit's rate when they start while its interference cause is idle, k the number of roles with
  work outstanding on that unit (itself included): k warps on a scheduler, each ready to issue in
  a given cycle with probability p, its rate alone, fill at most that share of the slots.
* **edges**: `src -> dst`: an instance of dst may not issue before the matching instance of src
  has completed (plus `lag` cycles of signalling, e.g. an mbarrier). `distance` d > 0 makes the
  edge loop-carried: iteration g waits for iteration g - d (counted across tiles, as a
  persistent kernel's pipeline keeps running). Buffer-slot anti-dependences are such edges with
  d = number of stages.

Software pipelining: an op with `skew` s runs, in its role's k-th iteration, the instance of KV
iteration k - s (FA4's MMA warp issues PV(j-1) in iteration j). `when` restricts an op to the
first or the last KV iteration of each tile (a Q load, an epilogue).

Units are reserved when an op issues: a part starts at max(issue time, the unit's next free
time). For FIFO service with known durations this equals a queue, and it costs one event per op
instead of one per request and release: that is what keeps a whole simulation under a second.
"""
from __future__ import annotations

import bisect
import functools
import gc
import heapq
import operator
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import simpy

from .errors import DeadlockError, InputError

WHEN = ("all", "first", "last")
INF = float("inf")
EDGE_KINDS = ("flow", "anti", "output")


def shared_rate(p: float, k: int) -> float:
    """Share of a scheduler's issue slots that k warps fill, each ready to issue in a given cycle
    with probability p (its rate alone): 1 - (1 - p)^k."""
    return 1.0 - (1.0 - p) ** k


@dataclass(frozen=True)
class Op:
    """One operation of a role's loop body.

    uses: ((unit, cycles), ...) the cycles each unit is occupied (the op's initiation interval
          on that unit). Parts on different units run concurrently; the op completes when all
          parts are done, plus `latency` cycles.
    """

    name: str
    role: str
    uses: tuple[tuple[str, float], ...] = ()
    latency: float = 0.0
    kind: str = "compute"
    asynchronous: bool = False
    issue_cycles: float = 0.0
    skew: int = 0
    when: str = "all"
    label: str = ""
    chunks: int = 1  # served in this many equal pieces (see the module docstring)
    # (unit, factor) pairs: this op's own rate on `unit` while the interfering unit is busy,
    # instead of the schedule's `interference` factor (a dense stream is slowed less than a mix)
    slowed: tuple[tuple[str, float], ...] = ()
    # (unit, share) pairs: the share of the time this op holds `unit` that it keeps it working (its
    # dependences leave the rest idle), so the unit is held cycles / share; `uses` stays the work
    duty: tuple[tuple[str, float], ...] = ()
    # (unit, p) pairs: on `unit`, shared by the roles' warps, this op's pieces run at 1 - (1 - p)^k
    # of its rate (k roles issuing there at once, p one warp's rate alone) unless slowed (module docstring)
    concurrency: tuple[tuple[str, float], ...] = ()
    # (path, cycles) pairs: work on a path that is no unit of the schedule, so nothing waits for
    # it; the engine ignores it and the power model prices it (fa4sim/power.py, work_per_block)
    work: tuple[tuple[str, float], ...] = ()

    @property
    def held(self) -> tuple[tuple[str, float], ...]:
        """((unit, cycles), ...): the time each unit is held, its work over its duty share."""
        if not self.duty:
            return self.uses
        duty = dict(self.duty)
        return tuple((u, c / duty.get(u, 1.0)) for u, c in self.uses)

    @property
    def occupancy(self) -> float:
        """Longest part, in cycles: the op's duration with no queueing and no latency."""
        return max((c for _, c in self.held), default=0.0)


@dataclass(frozen=True)
class Edge:
    """dst waits for src. distance counts KV iterations (per='iter') or tiles (per='tile').
    skip_first: the first KV iteration of each tile does not wait on this edge (a hand-off the
    kernel skips when a tile starts)."""

    src: str
    dst: str
    distance: int = 0
    per: str = "iter"
    kind: str = "flow"
    lag: float = 0.0
    skip_first: bool = False


@dataclass
class Schedule:
    """Ops, units and dependencies: everything the engine needs, nothing about attention."""

    name: str
    units: dict[str, int]
    roles: list[str]
    ops: list[Op]
    edges: list[Edge]
    marker: str
    meta: dict = field(default_factory=dict)
    issue_depth: dict = field(default_factory=dict)  # unit -> max outstanding async pieces
    # unit -> (other unit, factor): a piece on `unit` that starts while `other unit` is busy runs
    # at `factor` of its rate (Hopper: softmax pipes slow down while wgmma runs)
    interference: dict = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    def op(self, name: str) -> Op:
        return self.ops[self._index[name]]

    def validate(self) -> None:
        names = [o.name for o in self.ops]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise InputError("schedule", f"duplicate op names {sorted(dup)}")
        self._index = {n: i for i, n in enumerate(names)}
        for o in self.ops:
            if o.role not in self.roles:
                raise InputError("schedule", f"op {o.name} has unknown role {o.role!r}")
            if o.when not in WHEN:
                raise InputError("schedule", f"op {o.name}: when must be one of {WHEN}")
            if o.chunks < 1:
                raise InputError("schedule", f"op {o.name}: chunks must be >= 1")
            if o.skew < 0 or o.latency < 0 or o.issue_cycles < 0:
                raise InputError("schedule", f"op {o.name}: skew, latency and issue_cycles must be >= 0")
            for unit, cycles in o.uses:
                if unit not in self.units:
                    raise InputError("schedule", f"op {o.name} uses unknown unit {unit!r}")
                if not cycles >= 0:
                    raise InputError("schedule", f"op {o.name}: {cycles} cycles on {unit} (must be >= 0)")
            for unit, share in o.duty:
                if unit not in self.units or not 0 < share <= 1:
                    raise InputError("schedule", f"op {o.name}: duty on {unit!r} must name a unit, share in (0, 1]")
            for unit, p in o.concurrency:
                if unit not in self.units or not 0 < p <= 1:
                    raise InputError("schedule", f"op {o.name}: concurrency on {unit!r} must name a unit, "
                                                 f"p in (0, 1], got {p!r}")
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in self._index:
                    raise InputError("schedule", f"edge {e.src}->{e.dst} names unknown op {end!r}")
            if e.distance < 0 or e.per not in ("iter", "tile") or e.kind not in EDGE_KINDS:
                raise InputError("schedule", f"edge {e.src}->{e.dst}: bad distance, per or kind")
        for u, (cause, factor) in self.interference.items():
            if u not in self.units or cause not in self.units or not 0 < factor <= 1:
                raise InputError("schedule", f"interference {u} <- {cause}: both must be units, factor in (0, 1]")
        if self.marker not in self._index or self.op(self.marker).when != "all":
            raise InputError("schedule", f"marker {self.marker!r} must be an op that runs every iteration")


class OpRecord(NamedTuple):
    """One executed op instance. Times in cycles. start = first unit part began (or issue)."""

    name: str
    role: str
    kind: str
    tile: int
    iter: int
    issue: float
    start: float
    end: float
    waited_for: str = ""  # the dependency that set the issue time ("" = the role itself)


class Busy(NamedTuple):
    """A unit occupied by the op record `rec` (index into Trace.ops) from start to end."""

    unit: str
    start: float
    end: float
    rec: int


@dataclass
class Trace:
    """Everything that happened, in cycles. Identical for identical input."""

    schedule: Schedule
    tiles: tuple[int, ...]
    ops: list[OpRecord]
    busy: list[Busy]
    end: float

    def starts(self, op: str, tile: int = 0) -> list[float]:
        """Start times of op's instances in one tile, by iteration."""
        rows = sorted((r.iter, r.start) for r in self.ops if r.name == op and r.tile == tile)
        return [s for _, s in rows]

    @property
    def busy_rows(self) -> list[tuple]:
        """busy as tuples of Busy's fields (unit, start, end, rec), maybe not Busy themselves: what
        a loop over every piece of a long trace reads (simulate's traces make their Busy rows
        only when busy is read)."""
        return self.busy

    def utilization(self, t0: float = 0.0, t1: float | None = None) -> dict[str, float]:
        """Fraction of [t0, t1] each unit was busy (divided by its capacity)."""
        t1 = self.end if t1 is None else t1
        span = max(t1 - t0, 1e-12)
        out = {u: 0.0 for u in self.schedule.units}
        for unit, start, end, _ in self.busy_rows:
            if end > t0 and start < t1:  # the others add nothing
                v = (end if end < t1 else t1) - (start if start > t0 else t0)
                if v > 0.0:
                    out[unit] += v
        return {u: v / (span * self.schedule.units[u]) for u, v in out.items()}


class _Recorded(Trace):
    """The Trace simulate returns: its ops and busy become OpRecord and Busy rows when first
    read (most traces are only asked for their end and their marker's starts)."""

    def __init__(self, schedule: Schedule, tiles: tuple[int, ...], ops: list, busy: list, end: float):
        self.schedule, self.tiles, self.end = schedule, tiles, end
        self._ops, self._busy = ops, busy  # rows of the fields, turned into named tuples on first read
        self._named = [False, False]

    @property
    def ops(self) -> list[OpRecord]:
        if not self._named[0]:
            self._ops, self._named[0] = [tuple.__new__(OpRecord, r) for r in self._ops], True
        return self._ops

    @ops.setter
    def ops(self, value):
        self._ops, self._named[0] = value, False

    @property
    def busy(self) -> list[Busy]:
        if not self._named[1]:
            self._busy, self._named[1] = [tuple.__new__(Busy, b) for b in self._busy], True
        return self._busy

    @busy.setter
    def busy(self, value):
        self._busy, self._named[1] = value, False

    @property
    def busy_rows(self) -> list[tuple]:
        return self._busy

    def starts(self, op: str, tile: int = 0) -> list[float]:
        rows = sorted((r[4], r[6]) for r in self._ops if r[0] == op and r[3] == tile)
        return [s for _, s in rows]


class _Unit:
    """FIFO service with `capacity` servers (simulate's reserve takes them)."""

    __slots__ = ("free", "until", "ends", "gated")

    def __init__(self, capacity: int, gated: bool = False):
        self.free = [0.0] * capacity  # a heap of the times each server becomes free
        self.until = 0.0              # when the last server becomes free (the unit is busy before)
        self.ends: list[float] = []   # end times of reserved pieces, sorted (kept only where issue_depth gates)
        self.gated = gated


def program(schedule: Schedule, role: str, tiles: Sequence[int]):
    """The op instances a role runs, in order: (op index, tile, iteration)."""
    ops = [(i, o) for i, o in enumerate(schedule.ops) if o.role == role]
    depth = max((o.skew for _, o in ops), default=0)
    for t, n in enumerate(tiles):
        for k in range(n + depth):
            for idx, o in ops:
                it = k - o.skew
                if 0 <= it < n and (o.when == "all" or (o.when == "first" and it == 0)
                                    or (o.when == "last" and it == n - 1)):
                    yield idx, t, it


class _Resolver:
    """Maps an edge and a dst instance to the src instance it waits for (or None)."""

    def __init__(self, schedule: Schedule, tiles: Sequence[int]):
        self.tiles = list(tiles)
        self.base = [0]
        for n in self.tiles:
            self.base.append(self.base[-1] + n)
        self.schedule = schedule

    def src_instance(self, edge: Edge, tile: int, it: int):
        if edge.skip_first and it == 0:
            return None
        src = self.schedule.op(edge.src)
        if edge.per == "tile":
            t = tile - edge.distance
            if t < 0:
                return None
            n = self.tiles[t]
            return t, (0 if src.when == "first" else n - 1)
        g = self.base[tile] + it - edge.distance
        if g < 0:
            return None
        t = bisect.bisect_right(self.base, g) - 1
        i = g - self.base[t]
        if src.when == "all":
            return t, i
        if src.when == "first":
            return t, 0
        # 'last': the latest last-iteration instance at or before g
        if i == self.tiles[t] - 1:
            return t, i
        return (t - 1, self.tiles[t - 1] - 1) if t > 0 else None


def gc_paused(fn):
    """fn with Python's cyclic garbage collector paused while it runs (restored after, also on
    an error). A simulation allocates hundreds of thousands of small objects (events, records)
    that live until it ends, and the collector's passes over them cost 15-30 % of a run; it
    frees nothing meanwhile: what holds cycles (SimPy's environment) is dropped at the end."""
    @functools.wraps(fn)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return paused


@gc_paused
def simulate(schedule: Schedule, tiles: Sequence[int]) -> Trace:
    """Run `schedule` for one CTA that processes tiles with the given numbers of KV blocks."""
    tiles = tuple(int(n) for n in tiles)
    if not tiles or min(tiles) < 1:
        raise InputError("tiles", "each tile needs at least one KV block")
    env = simpy.Environment()
    timeout = env.timeout
    units = {u: _Unit(c, u in schedule.issue_depth) for u, c in schedule.units.items()}
    resolver = _Resolver(schedule, tiles)
    ops = schedule.ops
    incoming: list[list[tuple[int, Edge]]] = [[] for _ in ops]
    for e in schedule.edges:
        incoming[schedule._index[e.dst]].append((schedule._index[e.src], e))
    # per op, its incoming edges as (src op, edge, lag, whether the src instance is always the dst's
    # own (tile, iteration): an edge within an iteration from an op that runs in all of them)
    deps = [[(i, e, e.lag, e.distance == 0 and e.per == "iter" and not e.skip_first and ops[i].when == "all")
             for i, e in inc] for inc in incoming]

    done: dict[tuple[int, int, int], float] = {}
    waiting: dict[tuple[int, int, int], list[simpy.Event]] = {}
    # per instance, in issue order: OpRecord's fields as a list, end filled in at completion
    records: list[list] = []
    busy: list[tuple] = []  # per unit piece: Busy's fields
    position: dict[str, tuple[int, int, int] | None] = {}
    add_busy, heapreplace, insort = busy.append, heapq.heapreplace, bisect.insort  # looked up once

    def finish(key, rec):
        done[key] = env.now
        records[rec][7] = env.now
        evs = waiting.pop(key, None)
        if evs is not None:
            for ev in evs:
                ev.succeed(env._now)

    depth = schedule.issue_depth
    slowdown = {u: v for u, v in schedule.interference.items() if v[1] < 1.0}
    # per unit some op shares by `concurrency`: role -> end of its last piece there
    issuers: dict[str, dict[str, float]] = {u: {} for o in ops for u, _ in o.concurrency}
    # per op, one piece of each part as (unit name, unit, its server heap, held cycles / chunks,
    # the unit that slows it or None, factor, shared_rate(p, k) by k for its concurrency p or
    # None, the unit's issuers or None), looked up once here: reserve runs for every piece
    # of every op; and the units whose issue_depth gates its asynchronous pieces
    parts, gates, plain = [], [], []
    for o in ops:
        own, conc = dict(o.slowed), dict(o.concurrency)
        row = []
        for unit, cycles in o.held:
            if cycles <= 0:
                continue
            slow = slowdown.get(unit)
            cause, factor = (units[slow[0]], own.get(unit, slow[1])) if slow is not None else (None, 1.0)
            p = conc.get(unit)
            rates = None if p is None else [shared_rate(p, k) for k in range(len(schedule.roles) + 1)]
            u = units[unit]
            # a unit of one server needs no heap: its server is free when the unit is (`until`)
            row.append((unit, u, u.free if len(u.free) > 1 else None, cycles * (1.0 / o.chunks), cause, factor,
                        rates, issuers.get(unit), u.ends if u.gated else None))
        parts.append(tuple(row))
        # an op whose parts are all on units of one server, none gated, and none it shares by its
        # own concurrency reserves by reserve_plain: (unit name, unit, cycles, the unit that slows
        # it or None, factor, the unit's issuers or None)
        plain.append(tuple((p_[0], p_[1], p_[3], p_[4], p_[5], p_[7]) for p_ in row)
                     if all(p_[2] is None and p_[6] is None and p_[8] is None for p_ in row) else None)
        # (a gated unit's sorted end times, its issue_depth)
        gates.append(tuple((units[u].ends, depth[u]) for u, c in o.uses if c > 0 and u in depth)
                     if o.asynchronous else ())
    heads = [(o.name, o.role, o.kind) for o in ops]  # an OpRecord's first fields
    start_of = operator.itemgetter(1)  # of a Busy's fields
    bisect_right = bisect.bisect_right

    def reserve(row, role, rec, last):
        """Reserve one piece of every unit part of an op (its `parts` row) now, each from when its
        unit is free; return the latest of `last` and their ends."""
        now = env._now
        for name, unit, free, cycles, cause, factor, rates, active, ends in row:
            if free is None:
                start = unit.until
                if start <= now:  # now itself where equal, as below (0 stays an int at the start)
                    start = now
            else:
                start = free[0] if free[0] > now else now
            # slowed while the cause unit is busy past this part's start
            if cause is not None and cause.until > start:
                cycles /= factor
            elif rates is not None:  # k roles' warps sharing the unit's issue slots
                k = 1
                for r, e in active.items():
                    if e > now and r != role:
                        k += 1
                cycles /= rates[k]
            end = start + cycles
            if free is None:
                unit.until = end  # >= until: it starts no earlier
            else:
                heapreplace(free, end)
                if end > unit.until:
                    unit.until = end
            if ends is not None:
                insort(ends, end)
            if active is not None:
                active[role] = end
            add_busy((name, start, end, rec))  # a Busy's fields
            if end > last:
                last = end
        return last

    def reserve_plain(row, role, rec, last):
        """reserve for an op of plain parts (its `plain` row): the same, with nothing to skip."""
        now = env._now
        for name, unit, cycles, cause, factor, active in row:
            start = unit.until
            if start <= now:
                start = now
            if cause is not None and cause.until > start:
                cycles /= factor
            end = start + cycles
            unit.until = end
            if active is not None:
                active[role] = end
            add_busy((name, start, end, rec))
            if end > last:
                last = end
        return last

    # per op, how it reserves a piece: (reserve or reserve_plain, its row)
    reservers = [(reserve, row) if p_ is None else (reserve_plain, p_) for row, p_ in zip(parts, plain)]

    # A role that waits `d` cycles yields timeout(d), which SimPy schedules at now + d. When no
    # other event is due by then (the queue's next is later), that timeout would be the very next
    # event: SimPy would pop it, set its clock to now + d and resume this role at once. The role
    # does just that itself (moves the clock, no event), with the same arithmetic, so every other
    # event and the order they run in stay as they were (ties: an event already due at now + d
    # runs first, so the role yields then).
    queue = env._queue
    nan = float("nan")

    def role_process(role):
        for idx, t, it in program(schedule, role, tiles):
            ready = env._now
            binding = ""
            for src_idx, e, lag, own in deps[idx]:
                if own:
                    skey = (src_idx, t, it)
                else:
                    inst = resolver.src_instance(e, t, it)
                    if inst is None:
                        continue
                    skey = (src_idx, inst[0], inst[1])
                if skey not in done:
                    # an event per waiting role: a role a shared event resumed could not see the
                    # others it resumes, which are no events in the queue (see below)
                    ev = env.event()
                    evs = waiting.get(skey)
                    if evs is None:
                        waiting[skey] = [ev]
                    else:
                        evs.append(ev)
                    position[role] = (idx, t, it)  # where a deadlock leaves it
                    yield ev
                if done[skey] + lag > ready:
                    ready, binding = done[skey] + lag, ops[src_idx].name
            if ready > env._now:
                d = ready - env._now
                if queue and queue[0][0] <= env._now + d:
                    yield timeout(d)
                else:
                    env._now += d
            op = ops[idx]
            reserve_, row = reservers[idx]
            issue = env._now
            gate = gates[idx]
            for ends, dep in gate:  # stall an async issue while a gated unit's queue is full
                while True:  # until fewer than dep of its pieces are outstanding (those ending after now)
                    del ends[:bisect_right(ends, env._now)]
                    if len(ends) < dep:
                        break
                    d = ends[len(ends) - dep] - env._now  # when the one that makes room ends
                    if queue and queue[0][0] <= env._now + d:
                        yield timeout(d)
                    else:
                        env._now += d
            rec = len(records)
            n0 = len(busy)
            last = reserve_(row, role, rec, env._now)
            first = min(map(start_of, busy[n0:]), default=env._now)  # its first piece's start
            records.append([*heads[idx], t, it, issue, first, nan, binding])
            if op.asynchronous:
                step = op.issue_cycles / op.chunks
                for _ in range(op.chunks - 1):  # issue the remaining instructions
                    if step:
                        if queue and queue[0][0] <= env._now + step:
                            yield timeout(step)
                        else:
                            env._now += step
                    for ends, dep in gate:
                        while True:
                            del ends[:bisect_right(ends, env._now)]
                            if len(ends) < dep:
                                break
                            d = ends[len(ends) - dep] - env._now
                            if queue and queue[0][0] <= env._now + d:
                                yield timeout(d)
                            else:
                                env._now += d
                    last = reserve_(row, role, rec, last if last > env._now else env._now)
                end = last + op.latency
                ev = timeout(end - env._now)
                ev.callbacks.append(lambda _e, key=(idx, t, it), rec=rec: finish(key, rec))
                if step:
                    if queue and queue[0][0] <= env._now + step:
                        yield timeout(step)
                    else:
                        env._now += step
            else:
                for _ in range(op.chunks - 1):  # piece by piece, so other roles interleave
                    if last > env._now:
                        d = last - env._now
                        if queue and queue[0][0] <= env._now + d:
                            yield timeout(d)
                        else:
                            env._now += d
                    last = reserve_(row, role, rec, env._now)
                end = last + op.latency
                if end > env._now:
                    d = end - env._now
                    if queue and queue[0][0] <= env._now + d:
                        yield timeout(d)
                    else:
                        env._now += d
                finish((idx, t, it), rec)
        position[role] = None

    for role in schedule.roles:
        position[role] = None
        env.process(role_process(role))
    env.run()

    stuck = [r for r, k in position.items() if k is not None]
    if stuck:
        blocked = []
        for r in stuck:
            idx, t, it = position[r]
            missing = []
            for src_idx, e in incoming[idx]:
                inst = resolver.src_instance(e, t, it)
                if inst is not None and (src_idx, inst[0], inst[1]) not in done:
                    missing.append(f"{ops[src_idx].name}[tile {inst[0]}, iter {inst[1]}]")
            blocked.append(f"{r}: {ops[idx].name}[tile {t}, iter {it}] waits for {', '.join(missing) or '?'}")
        raise DeadlockError(blocked)

    end = max((r[7] for r in records), default=0.0)
    return _Recorded(schedule, tiles, records, busy, end)
