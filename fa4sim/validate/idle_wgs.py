"""Idle warpgroups (lab/tools/idle_wg_sm90.py, kind 'idle_wgs'): what a tile costs when only some
of its consumer warpgroups hold rows, relative to a full tile, measured vs the fa3 schedule."""
from __future__ import annotations

from .. import hardware
from ..model import simulate
from ..params import Problem
from .common import model_knobs, profile_for, progress


def compare(doc: dict, hw: str | None = None) -> dict:
    """A tile with `live` of its consumer warpgroups holding rows, relative to a full tile:
    measured (one persistent CTA walking the file's heads x one tile each, event time) vs the
    fa3 schedule on the same walk (one SM, cycles), with the kernel's recorded configuration."""
    hw_name = hw or profile_for(doc["meta"].get("device", ""))
    one_sm = hardware.load(hw_name).with_values(num_sms=1)
    heads, sk = int(doc["meta"]["heads"]), int(doc["meta"]["seqlen_k"])
    rows = []
    for i, c in enumerate(doc["cases"], 1):
        progress(i, len(doc["cases"]), "case")
        hd, tm = int(c["head_dim"]), int(c["tile_m"])
        knobs = model_knobs("fa4kernel", c["fa4kernel_config"])
        cyc = {live: simulate(one_sm, "fa3", Problem(1, heads, 64 * live, sk, hd, False), knobs).cycles
               for live in range(1, tm // 64 + 1)}
        for live in range(1, tm // 64):
            meas = float(c["ratio_to_full"][str(live)])
            pred = cyc[live] / cyc[tm // 64]
            rows.append({"hdim": hd, "tile_m": tm, "live": live, "warpgroups": tm // 64,
                         "measured_ratio": meas, "predicted_ratio": pred, "difference": pred - meas})
    worst = max((abs(r["difference"]) for r in rows), default=None)
    return {"kind": "idle_wgs",
            "summary": {"hw_profile": hw_name, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
                        "max_abs_difference": worst, "cases": len(rows)}, "cases": rows}


def report(result: dict) -> str:
    s = result["summary"]
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}: cost of a tile with idle "
             "warpgroups, relative to a full tile (one CTA walking such tiles)",
             f"{'hd':>4s} {'tile_m':>6s} {'live':>6s} {'measured':>9s} {'predicted':>9s}"]
    for r in result["cases"]:
        lines.append(f"{r['hdim']:4d} {r['tile_m']:6d} {r['live']:>3d} of {r['warpgroups']} {r['measured_ratio']:9.2f} "
                     f"{r['predicted_ratio']:9.2f}")
    if s["max_abs_difference"] is not None:
        lines.append(f"largest difference {s['max_abs_difference']:.2f} over {s['cases']} cases")
    return "\n".join(lines)
