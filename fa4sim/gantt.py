"""Gantt chart of one CTA's trace (matplotlib PNG): rows = units, then warp roles.

Unit rows show when each pipe was busy and with what; role rows show what each warp role was
doing (blocking ops from issue to completion; asynchronous issues as thin ticks). Ops are
coloured by kind and labelled with their KV iteration where there is room.
"""
from __future__ import annotations

from .engine import Trace

KIND_COLORS = {"mma": "#4C72B0", "exp": "#DD8452", "softmax": "#C44E52", "correction": "#8172B3",
               "load": "#55A868", "store": "#937860", "sync": "#BBBBBB", "compute": "#64B5CD"}


def window_for(trace: Trace, iterations: int | None) -> tuple[float, float]:
    """From the start to the end of KV iteration `iterations` of the marker op (None: all)."""
    if iterations is None:
        return 0.0, trace.end
    starts = trace.starts(trace.schedule.marker)
    if iterations >= len(starts):
        return 0.0, trace.end
    return 0.0, starts[iterations]


def _merged(trace: Trace, t0: float, t1: float):
    """Busy pieces per unit, with consecutive pieces of the same op instance merged."""
    rows: dict[str, list[list]] = {}
    for b in sorted(trace.busy, key=lambda b: (b.unit, b.start)):
        if b.end <= t0 or b.start >= t1:
            continue
        lst = rows.setdefault(b.unit, [])
        if lst and lst[-1][2] == b.rec and abs(lst[-1][1] - b.start) < 1e-6:
            lst[-1][1] = b.end
        else:
            lst.append([b.start, b.end, b.rec])
    return rows


def draw(trace: Trace, path: str, title: str = "", iterations: int | None = 6, width: float = 16.0) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0, t1 = window_for(trace, iterations)
    # a role's private issue limit ("issue:softmax0") shows in its role row already
    units = [u for u in trace.schedule.units if ":" not in u]
    roles = list(trace.schedule.roles)
    rows = units + roles
    fig, ax = plt.subplots(figsize=(width, 0.42 * len(rows) + 1.6))
    ymap = {r: len(rows) - 1 - i for i, r in enumerate(rows)}
    min_label = (t1 - t0) / 90.0

    def bar(row, s, e, rec, height=0.7):
        r = trace.ops[rec]
        s, e = max(s, t0), min(e, t1)
        if e <= s:
            return
        ax.barh(ymap[row], e - s, left=s, height=height, color=KIND_COLORS.get(r.kind, "#999999"),
                edgecolor="white", linewidth=0.3)
        if e - s > min_label * len(r.name) / 3 and height > 0.5:
            ax.text((s + e) / 2, ymap[row], f"{r.name}.{r.iter}", ha="center", va="center", fontsize=6.5, color="white")

    for unit, pieces in _merged(trace, t0, t1).items():
        if unit not in units:
            continue
        for s, e, rec in pieces:
            bar(unit, s, e, rec)
    ops = trace.schedule.ops
    asynchronous = {o.name for o in ops if o.asynchronous}
    for i, r in enumerate(trace.ops):
        if r.end <= t0 or r.issue >= t1:
            continue
        if r.name in asynchronous:
            issue_len = trace.schedule.op(r.name).issue_cycles
            bar(r.role, r.issue, r.issue + max(issue_len, (t1 - t0) / 600), i, height=0.35)
        else:
            bar(r.role, r.issue, r.end, i)
    ax.set_yticks([ymap[r] for r in rows])
    ax.set_yticklabels([f"unit: {r}" if r in units else f"role: {r}" for r in rows], fontsize=8)
    ax.axhline(len(roles) - 0.5, color="black", linewidth=0.6)
    ax.set_xlim(t0, t1)
    ax.set_xlabel("cycles")
    kinds = sorted({r.kind for r in trace.ops})
    ax.legend(handles=[Patch(color=KIND_COLORS.get(k, "#999999"), label=k) for k in kinds],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 if len(rows) > 10 else -0.2), ncol=len(kinds), fontsize=8)
    ax.set_title(title or f"{trace.schedule.name}: one CTA, tile of {trace.tiles[0]} KV blocks", fontsize=10)
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
