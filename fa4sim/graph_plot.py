"""A drawing of a loop graph (fa4sim/graph.py): one lane per warp role, each op a box placed at
its earliest start within one iteration (longest path over the same-iteration edges: the
schedule's dependences and each role's program order) and as wide as its longest unit part,
coloured by that unit. Arrows: flow black, anti blue, program order grey; loop-carried edges
dashed with their distance; the critical recurrence red."""
from __future__ import annotations

from .graph import Bound, LoopGraph

UNIT_COLORS = {"tensor": "#4c72b0", "mufu": "#dd8452", "fma": "#55a868", "alu": "#8172b3", "tma": "#937860",
               "smem": "#da8bc3", "smem:lsu": "#da8bc3", "tmem": "#8c8c8c", "issue": "#ccb974"}


def earliest(graph: LoopGraph) -> dict:
    """op -> earliest start within one iteration (cycles): the longest path over edges of
    distance 0 (loop ops only; tile ops after their loop predecessors)."""
    start = {n.name: 0.0 for n in graph.nodes}
    edges = [d for d in graph.deps + graph.order if d.distance == 0 and d.per == "iter"]
    for _ in range(len(graph.nodes)):
        moved = False
        for d in edges:
            if start[d.src] + d.delay > start[d.dst] + 1e-9:
                start[d.dst], moved = start[d.src] + d.delay, True
        if not moved:
            break
    return start


def draw(graph: LoopGraph, path: str, res: Bound, rec: Bound, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

    start = earliest(graph)
    lanes = [r for r in graph.roles if any(n.role == r for n in graph.nodes)]
    lane = {r: i for i, r in enumerate(lanes)}
    span = max([start[n.name] + max(n.uses.values(), default=0.0) for n in graph.nodes] + [1.0])
    fig, ax = plt.subplots(figsize=(16, 1.3 * len(lanes) + 1.6))
    box, where = {}, {}
    rows: dict = {}
    for n in sorted(graph.nodes, key=lambda n: start[n.name]):
        width = max(max(n.uses.values(), default=0.0), span * 0.012)
        # stack boxes of one role that would overlap (two ops issued together, tile ops)
        level = 0
        while any(x0 < start[n.name] + width and start[n.name] < x1 for x0, x1 in rows.get((n.role, level), [])):
            level += 1
        rows.setdefault((n.role, level), []).append((start[n.name], start[n.name] + width))
        y = lane[n.role] + 0.28 * level - 0.2
        main = max(n.uses, key=lambda u: n.uses[u]) if n.uses else ""
        color = UNIT_COLORS.get(main.split(":")[0], "#bbbbbb")
        ax.add_patch(Rectangle((start[n.name], y), width, 0.4, facecolor=color, alpha=0.85 if n.in_loop else 0.3,
                               edgecolor="black", linestyle="-" if n.in_loop else "--", linewidth=0.8))
        ax.text(start[n.name] + width / 2, y + 0.2, n.name, ha="center", va="center", fontsize=7)
        box[n.name] = (start[n.name], y, width)
        where[n.name] = main
    critical = {(d.src, d.dst, d.kind, d.distance) for d in rec.cycle}
    for d in graph.deps + graph.order:
        if d.src not in box or d.dst not in box:
            continue
        x0, y0, w0 = box[d.src]
        x1, y1, _ = box[d.dst]
        hot = (d.src, d.dst, d.kind, d.distance) in critical
        color = "red" if hot else "grey" if d.kind == "order" else "tab:blue" if d.kind == "anti" else "black"
        if d.kind == "order" and not hot:
            continue  # order edges only where they close the critical cycle (else too busy)
        loop = d.distance != 0 or d.per == "tile"
        bend = 0.35 if loop else 0.0
        arrow = FancyArrowPatch((x0 + w0, y0 + 0.2), (x1, y1 + 0.2), arrowstyle="-|>", mutation_scale=8,
                                color=color, linewidth=1.6 if hot else 0.7, alpha=0.9 if hot else 0.5,
                                linestyle="--" if loop else "-", connectionstyle=f"arc3,rad={bend}")
        ax.add_patch(arrow)
        if loop:
            ax.text((x0 + w0 + x1) / 2, (y0 + y1) / 2 + 0.45, f"d={d.distance}" + ("t" if d.per == "tile" else ""),
                    fontsize=6, color=color)
    ax.set_xlim(-span * 0.02, span * 1.05)
    ax.set_ylim(-0.6, len(lanes) - 0.2 + 0.3)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes)
    ax.invert_yaxis()
    ax.set_xlabel("earliest start within one iteration (cycles; same-iteration edges only)")
    used = sorted({where[k].split(":")[0] for k in where if where[k]})
    handles = [Patch(facecolor=UNIT_COLORS.get(u, "#bbbbbb"), label=u) for u in used]
    handles += [Patch(facecolor="white", edgecolor="red", label=f"critical recurrence: {rec.value:.0f} cycles")]
    ax.legend(handles=handles, loc="lower right", fontsize=7, ncol=len(handles))
    ax.set_title(title or f"{graph.schedule}: ResMII {res.value:.0f} ({res.critical}), RecMII {rec.value:.0f}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
