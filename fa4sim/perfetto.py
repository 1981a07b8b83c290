"""Chrome/Perfetto trace JSON of one CTA (open in ui.perfetto.dev or chrome://tracing).

1 cycle = 1 ns. Process 1 holds one track per unit, process 2 one track per warp role.
Every event carries its op, tile, KV iteration and the dependency that delayed its issue.
"""
from __future__ import annotations

import json

from .engine import Trace

NS_PER_US = 1000.0


def events(trace: Trace) -> list[dict]:
    out: list[dict] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "units"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "warp roles"}},
    ]
    tid = {}
    for i, u in enumerate(trace.schedule.units):
        tid[(1, u)] = i + 1
        out.append({"ph": "M", "pid": 1, "tid": i + 1, "name": "thread_name", "args": {"name": u}})
    for i, r in enumerate(trace.schedule.roles):
        tid[(2, r)] = i + 1
        out.append({"ph": "M", "pid": 2, "tid": i + 1, "name": "thread_name", "args": {"name": r}})

    def args(rec):
        return {"op": rec.name, "tile": rec.tile, "iter": rec.iter, "waited_for": rec.waited_for,
                "label": trace.schedule.op(rec.name).label}

    for b in trace.busy:
        rec = trace.ops[b.rec]
        out.append({"ph": "X", "pid": 1, "tid": tid[(1, b.unit)], "name": f"{rec.name}.{rec.iter}",
                    "cat": rec.kind, "ts": b.start / NS_PER_US, "dur": (b.end - b.start) / NS_PER_US,
                    "args": args(rec)})
    for rec in trace.ops:
        op = trace.schedule.op(rec.name)
        end = rec.issue + op.issue_cycles if op.asynchronous else rec.end
        out.append({"ph": "X", "pid": 2, "tid": tid[(2, rec.role)], "name": f"{rec.name}.{rec.iter}",
                    "cat": rec.kind, "ts": rec.issue / NS_PER_US, "dur": max(end - rec.issue, 0.0) / NS_PER_US,
                    "args": {**args(rec), "completed_at_cycle": rec.end}})
    return out


def write(trace: Trace, path: str, metadata: dict | None = None) -> str:
    with open(path, "w") as f:
        json.dump({"traceEvents": events(trace), "displayTimeUnit": "ns",
                   "otherData": {"cycle_ns": 1, **(metadata or {})}}, f)
    return path
