"""Tile costs (lab/tools/ctas_sm90.py --only-tiles, kind 'tile_costs'): what a whole tile costs
one persistent CTA, measured vs the fa3 schedule walking the same tiles, split into a per-block
and a per-tile part."""
from __future__ import annotations

import statistics

from .. import hardware
from ..errors import InputError
from ..engine import simulate as engine_simulate
from ..model import build_cta
from ..params import Problem
from .common import model_knobs, profile_for, progress, pyplot, recorded_tau, save


def compare(doc: dict, hw: str | None = None) -> dict:
    """Cycles per tile of one persistent CTA walking T1 and T2 tiles of B KV blocks each,
    (cycles(T2) - cycles(T1)) / (T2 - T1): measured (clock-probe build, so cycles exactly) vs the
    fa3 schedule walking the same tiles on one SM. Per knob variant with two or more tile lengths,
    the line through the two longest splits a tile into a per-block part (the loop) and a per-tile
    part (prologue, pipeline fill and drain, epilogue, the hand-over to the next tile).
    The benchmark repeats each launch on the same small tensors, so its Q tiles are L2 hits: the
    model's Q load takes the L2 latency here, not the HBM latency of a tile's first touch."""
    hw_name = hw or profile_for(doc["meta"].get("device", ""))
    base = hardware.load(hw_name)
    profile = base.with_values(hbm_latency=base.l2_latency)
    walks = [t for t in doc["tile_costs"] if t.get("persistent", True)]
    if not walks:
        raise InputError("results", "no walk of tiles on one persistent CTA in this file (its builds run one CTA "
                                    "per tile); measure head dims 64, 128 or 256")
    rows = []
    for i, t in enumerate(walks, 1):
        progress(i, len(walks), "tile")
        hd, blocks = int(t["hdim"]), int(t["kv_blocks"])
        knobs = model_knobs("fa4kernel", {"tile_m": int(t["tile_m"]), "tile_n": int(t["tile_n"]), **recorded_tau(t),
                                          **(t.get("knobs") or {})})
        counts = sorted(int(n) for n in t["cycles_by_tiles"])  # the tile counts the walk was timed at
        t1, t2 = counts[0], counts[-1]
        problem = Problem(1, 1, knobs["tile_m"] * t2, blocks * knobs["tile_n"], hd, False)
        schedule = build_cta(profile, problem, knobs, blocks, 0, schedule="fa3")
        ends = {n: engine_simulate(schedule, [blocks] * n).end for n in (t1, t2)}
        pred = (ends[t2] - ends[t1]) / (t2 - t1)
        meas = float(t["cycles_per_tile"])
        rows.append({"hdim": hd, "kv_blocks": blocks, "variant": variant_name(t.get("knobs") or {}),
                     "knobs": knobs, "measured_cycles": meas, "predicted_cycles": pred, "error": (pred - meas) / meas})
    lines = []  # per variant: the per-block and per-tile parts, from its two longest tiles
    for key in dict.fromkeys((r["hdim"], r["variant"]) for r in rows):
        pts = sorted((r for r in rows if (r["hdim"], r["variant"]) == key), key=lambda r: r["kv_blocks"])
        if len(pts) < 2:
            continue
        a, b = pts[-2], pts[-1]
        per_block = {w: (b[f"{w}_cycles"] - a[f"{w}_cycles"]) / (b["kv_blocks"] - a["kv_blocks"])
                     for w in ("measured", "predicted")}
        lines.append({"hdim": key[0], "variant": key[1], "blocks": (a["kv_blocks"], b["kv_blocks"]),
                      **{f"{w}_per_block": per_block[w] for w in per_block},
                      **{f"{w}_per_tile": b[f"{w}_cycles"] - b["kv_blocks"] * per_block[w] for w in per_block}})
    errs = [abs(r["error"]) for r in rows]
    summary = {"hw_profile": hw_name, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
               "median_abs_error": statistics.median(errs), "max_abs_error": max(errs), "tiles": len(rows)}
    return {"kind": "tile_costs", "summary": summary, "tiles": rows, "lines": lines}


def variant_name(knobs: dict) -> str:
    return "+".join(f"{k}={v}" for k, v in knobs.items()) or "default"


def report(result: dict) -> str:
    s = result["summary"]
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}: cycles per tile of one persistent "
             "CTA (clock-probe build)",
             f"{'hd':>4s} {'variant':24s} {'blocks':>6s} {'measured':>9s} {'predicted':>9s} {'error':>7s}"]
    for r in result["tiles"]:
        lines.append(f"{r['hdim']:4d} {r['variant']:24s} {r['kv_blocks']:6d} {r['measured_cycles']:9.0f} "
                     f"{r['predicted_cycles']:9.0f} {r['error']:+7.1%}")
    lines.append(f"median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%} over {s['tiles']} tiles")
    if result["lines"]:
        lines.append("a tile = per-tile part + blocks x per-block part (a line through its two longest tiles; "
                     "where the model's block cost differs along the tile, read the short tiles above instead), "
                     "measured / predicted cycles:")
        for ln in result["lines"]:
            lines.append(f"  hd{ln['hdim']:<3d} {ln['variant']:24s} per block {ln['measured_per_block']:6.0f} / "
                         f"{ln['predicted_per_block']:6.0f} ({ln['predicted_per_block'] / ln['measured_per_block'] - 1:+.1%}),"
                         f" per tile {ln['measured_per_tile']:6.0f} / {ln['predicted_per_tile']:6.0f}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str:
    """Error of the predicted cycles per tile against the tile's KV blocks, one line per head dim
    and knob variant, with a +-5 % band."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    blocks = sorted({r["kv_blocks"] for r in result["tiles"]})
    ax.fill_between([min(blocks), max(blocks)], -5, 5, color="0.9", label="within 5 %")
    ax.axhline(0, color="k", linewidth=0.8)
    for key in dict.fromkeys((r["hdim"], r["variant"]) for r in result["tiles"]):
        pts = sorted((r for r in result["tiles"] if (r["hdim"], r["variant"]) == key), key=lambda r: r["kv_blocks"])
        ax.plot([r["kv_blocks"] for r in pts], [100 * r["error"] for r in pts], marker="o",
                label=f"hd{key[0]} {key[1]}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(blocks, [str(b) for b in blocks])
    s = result["summary"]
    ax.set_title(f"cycles per tile, one persistent CTA: (predicted - measured) / measured\n"
                 f"{s['device']}, profile {s['hw_profile']}; median |error| {s['median_abs_error']:.1%} "
                 f"over {s['tiles']} tiles", fontsize=8)
    ax.set_xlabel("KV blocks per tile")
    ax.set_ylabel("error (%)")
    return save(fig, ax, path, loc="upper left", bbox_to_anchor=(1.01, 1.0))
