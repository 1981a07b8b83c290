"""Measured timelines: per-warp-role, per-iteration stamps from an instrumented kernel, in the
simulator's trace format, overlaid on the simulated timeline of the same configuration.

Stamp file (JSON), as an instrumented kernel writes it (clock64 cycles of one SM, one CTA):

    {"meta": {"device": ..., "date": ..., "config": {...knobs...}, "problem": {...}},
     "events": [{"role": "wg0", "op": "EXP0", "tile": 0, "iter": 3, "start": 123456, "end": 124000}, ...]}

`role` and `op` use the schedule's names (fa4sim/schedules/fa3_sm90.py: load, wg{w}; QK{w},
PV{w}, MAX{w}, EXP{w}, ...); an op the kernel does not stamp is simply absent. Times are rebased
so the first stamp is cycle 0.
"""
from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

from .engine import Busy, OpRecord, Schedule, Trace
from .errors import InputError


def load_stamps(path: str) -> dict:
    """A stamps JSON (fa4kernel's instrumented build, lab/tools/timeline_sm90.py), plain or .gz."""
    try:
        raw = Path(path).read_bytes()
        doc = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError("stamps", f"cannot read {path}: {e}") from None
    events = doc.get("events")
    if not isinstance(events, list) or not events:
        raise InputError("stamps", f"{path} has no 'events' list")
    for e in events:
        missing = {"role", "op", "iter", "start", "end"} - set(e)
        if missing:
            raise InputError("stamps", f"event {e} lacks {sorted(missing)}")
        if e["end"] < e["start"]:
            raise InputError("stamps", f"event {e} ends before it starts")
    return doc


def to_trace(doc: dict, schedule: Schedule) -> Trace:
    """Measured events as a Trace of `schedule` (role rows only; no unit rows are measured)."""
    events = doc["events"]
    t0 = min(e["start"] for e in events)
    kinds = {o.name: o.kind for o in schedule.ops}
    recs = [OpRecord(e["op"], e["role"], kinds.get(e["op"], "compute"), int(e.get("tile", 0)), int(e["iter"]),
                     float(e["start"] - t0), float(e["start"] - t0), float(e["end"] - t0), "")
            for e in sorted(events, key=lambda e: e["start"])]
    unknown = {r.role for r in recs} - set(schedule.roles)
    if unknown:
        raise InputError("stamps", f"roles {sorted(unknown)} are not roles of schedule {schedule.name} ({schedule.roles})")
    busy: list[Busy] = []
    tiles = (max(r.iter for r in recs) + 1,)
    return Trace(schedule, tiles, recs, busy, max(r.end for r in recs))


def interval(trace: Trace, op: str, skip: int = 2) -> float | None:
    """Median cycles between starts of successive iterations of `op` (steady state: skip the first)."""
    starts = trace.starts(op)
    diffs = [b - a for a, b in zip(starts[skip:], starts[skip + 1:])]
    return statistics.median(diffs) if diffs else None


def overlay(simulated: Trace, measured: Trace, path: str, iterations: int = 6, title: str = "") -> str:
    """Two Gantt panels on one time axis: simulated (top) and measured (bottom) warp roles."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .gantt import KIND_COLORS

    roles = [r for r in simulated.schedule.roles if any(x.role == r for x in measured.ops)]
    fig, axes = plt.subplots(2, 1, figsize=(14, 1.0 + 0.9 * len(roles)), sharex=True)

    def panel(ax, trace, name):
        starts = trace.starts(trace.schedule.marker) or [0.0]
        first = starts[min(2, len(starts) - 1)]
        last = starts[min(2 + iterations, len(starts) - 1)]
        for i, role in enumerate(roles):
            for r in trace.ops:
                if r.role == role and r.end > first and r.start < last and not trace.schedule.op(r.name).asynchronous:
                    ax.barh(i, r.end - r.start, left=r.start - first, height=0.7,
                            color=KIND_COLORS.get(r.kind, "#999"), edgecolor="white", linewidth=0.3)
        ax.set_yticks(range(len(roles)), roles, fontsize=8)
        ax.set_title(name, fontsize=9, loc="left")
        return last - first

    span = max(panel(axes[0], simulated, "simulated"), panel(axes[1], measured, "measured (clock64 stamps)"))
    axes[1].set_xlim(0, span)
    axes[1].set_xlabel("cycles from the third KV iteration")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
