"""Periodic steady state: simulate a few dozen KV blocks, extrapolate the rest exactly.

A schedule of fixed-duration ops with max-type synchronisation (an op starts at the latest of
its dependencies) is a max-plus linear system, and such a system becomes periodic: after a
transient, every event of iteration i + p happens exactly D cycles after the same event of
iteration i. We find p and D from the marker op's start times, and then a tile of n blocks takes
T(n') + (n - n') * D / p for any simulated n' = n (mod p) that is past the transient. A test
checks this against a full simulation.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

from .engine import Schedule, Trace, simulate

CAP = 40          # simulate at most this many KV blocks per tile before extrapolating
MAX_PERIOD = 8
TOL = 1e-6        # cycles; durations are sums of the same floats, so equality is near-exact


@dataclass(frozen=True)
class Period:
    first: int       # first iteration of the periodic regime
    period: int      # p iterations
    span: float      # D cycles per period

    @property
    def interval(self) -> float:
        """Steady-state cycles per KV block (the loop's initiation interval)."""
        return self.span / self.period


def detect(starts: Sequence[float], max_period: int = MAX_PERIOD) -> Period | None:
    """Smallest period p whose shifted differences are constant over the trace's tail."""
    n = len(starts)
    for p in range(1, max_period + 1):
        diffs = [starts[i + p] - starts[i] for i in range(n - p)]
        if len(diffs) < 2 * p + 3:
            return None
        last = diffs[-1]
        k = len(diffs) - 1
        while k > 0 and abs(diffs[k - 1] - last) <= TOL * max(1.0, abs(last)):
            k -= 1
        if len(diffs) - k >= max(3 * p, 6):
            return Period(k, p, last)
    return None


class Runs:
    """engine.simulate remembered over one prediction: equal schedules run the same tiles alike
    (a backward's schedule is the same for every tile length, so its long tiles' probe is its
    CAP-block tile; so is a forward's without a rescale threshold)."""

    def __init__(self):
        self.seen: dict[tuple, list[tuple[Schedule, Trace]]] = {}

    def __call__(self, schedule: Schedule, tiles: Sequence[int]) -> Trace:
        key = (schedule.name, tuple(tiles), len(schedule.ops))
        same = self.seen.setdefault(key, [])
        for s, trace in same:
            if s == schedule:
                return trace
        trace = simulate(schedule, key[1])
        same.append((schedule, trace))
        return trace


_shared: Runs | None = None


def runs() -> Runs:
    """A prediction's Runs: its own, or the one `shared()` holds over many predictions."""
    return _shared or Runs()


@contextlib.contextmanager
def shared():
    """Within it, every prediction remembers engine runs in one Runs: predictions that differ in
    what does not change a schedule (the power model's parameters, the memory rates) simulate
    no tile again (fa4sim.uncertainty)."""
    global _shared
    outer, _shared = _shared, _shared or Runs()
    try:
        yield _shared
    finally:
        _shared = outer


def tile_times(schedule: Schedule, n: int, cap: int = CAP, pair: bool = True,
               run=simulate, shorter: bool = False) -> tuple[float, float | None, Trace, Period | None]:
    """(T1, T2, trace, period): one tile of n blocks alone, and two such tiles back to back.

    T2 - T1 is what a further tile costs a persistent CTA (its prologue overlaps the previous
    tile's epilogue); pair False leaves T2 None, unsimulated (a launch of one CTA per tile never
    pays it). Long tiles are simulated for n' < n blocks and extrapolated. run: engine.simulate
    or a Runs. shorter: the schedule is the same at every tile length (a backward's) and its
    cap-block probe is run anyway, so a tile of n < cap blocks past the transient is that probe
    less (cap - n) blocks (the same periodicity, exact to rounding); the trace returned is then
    the probe's, not n blocks'.
    """
    if n <= cap and not (shorter and n < cap):
        one = run(schedule, [n])
        return one.end, _two(run, schedule, n, pair), one, detect(one.starts(schedule.marker))
    probe = run(schedule, [cap])
    per = detect(probe.starts(schedule.marker))
    if per is None:  # no periodic regime within cap blocks: simulate in full
        one = run(schedule, [n])
        return one.end, _two(run, schedule, n, pair), one, detect(one.starts(schedule.marker))
    n_sim = cap - ((cap - n) % per.period)  # n_sim = n (mod p), n_sim <= cap
    if min(n, n_sim) < per.first + 2 * per.period or (n < cap and n_sim != cap):
        # within the transient; or shorter than cap, where a run of n_sim != cap blocks would
        # cost more than a run of its own
        one = run(schedule, [n])
        return one.end, _two(run, schedule, n, pair), one, per
    one = probe if n_sim == cap else run(schedule, [n_sim])
    two = _two(run, schedule, n_sim, pair)
    extra = (n - n_sim) / per.period * per.span
    return one.end + extra, None if two is None else two + 2 * extra, one, per


def _two(run, schedule: Schedule, n: int, pair: bool) -> float | None:
    """Cycles of two tiles of n blocks back to back (None unless pair)."""
    return run(schedule, [n, n]).end if pair else None


def window(trace: Trace, period: Period | None):
    """The loop's steady part of a one-tile trace: (t0, t1, cycles per KV block or None, the
    KV iterations it spans as a range; None where the tile is too short for one). What
    simulate() reports and the solver's replay (modulo.replayed_interval) measures."""
    starts = trace.starts(trace.schedule.marker)
    if period is not None and len(starts) - period.first >= 2:
        return starts[period.first], starts[-1], period.interval, range(period.first, len(starts) - 1)
    if len(starts) >= 16:
        # no exact period within the simulated blocks (three warpgroups' pieces can interleave
        # without repeating): the mean interval over the second half of the tile instead
        m = len(starts) // 2
        return starts[m], starts[-1], (starts[-1] - starts[m]) / (len(starts) - 1 - m), range(m, len(starts) - 1)
    return 0.0, trace.end, None, None
