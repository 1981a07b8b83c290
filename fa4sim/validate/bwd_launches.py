"""Whole backward launches, CTA by CTA (lab/tools/bwd_ctas_sm90.py, kind 'bwd_ctas'): fa4kernel's
SM90 backward in each launch order (grid_order), timed by its clock-probe build's per-CTA stamps,
against fa4sim's backward main kernel in the same order at the launch's own in-kernel clock.

Compared per point and order: the launch (the first CTA's start to the last CTA's end) against
the model's main kernel less its launch gap, and, per point, the gain of each order over the
first one recorded (heads_outer): the tail the order saves, measured and predicted. The clock
is the measured one, so the comparison is of cycles and of the launch's shape, not of the clock.
"""
from __future__ import annotations

from ..model import simulate
from ..params import Problem
from .common import error_line, error_stats, profile_for, progress


def compare(doc: dict, hw: str | None = None) -> dict:
    hw_name = hw or profile_for(doc["meta"].get("device", ""))
    rows = []
    pts = doc.get("points") or []
    for i, p in enumerate(pts, 1):
        progress(i, len(pts))
        problem = Problem(int(p["batch"]), int(p["heads"]), int(p["seqlen"]), int(p["seqlen"]), int(p["hdim"]),
                          bool(p["causal"]))
        base = None
        for order, m in (p.get("orders") or {}).items():
            r = simulate(hw_name, None, problem, {"grid_order": order, "clock_ghz": m["clock_ghz"]},
                         impl="fa4kernel", pass_="bwd")
            predicted = r.main_us - r.hw.launch_gap_us
            row = {"hdim": problem.hdim, "seqlen": problem.seqlen_q, "causal": problem.causal, "order": order,
                   "clock_ghz": m["clock_ghz"], "measured_us": m["launch_us"], "predicted_us": predicted,
                   "error": predicted / m["launch_us"] - 1.0, "busy": m.get("busy"), "tail_us": m.get("tail_us"),
                   "measured_gain": None, "predicted_gain": None}
            if base is None:
                base = row
            else:
                row["measured_gain"] = base["measured_us"] / m["launch_us"] - 1.0
                row["predicted_gain"] = base["predicted_us"] / predicted - 1.0
            rows.append(row)
    gains = [r for r in rows if r["measured_gain"] is not None]
    summary = {"hw_profile": hw_name, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
               "launch": error_stats([r["error"] for r in rows]),
               "gain_error_pp": error_stats([100 * (r["predicted_gain"] - r["measured_gain"]) for r in gains])}
    return {"kind": "bwd_ctas", "summary": summary, "points": rows}


def report(result: dict) -> str:
    s = result["summary"]
    out = [f"backward launches by order ({s['device']}, {s['date']}; profile {s['hw_profile']} at each launch's "
           f"in-kernel clock)",
           f"{'point':22s}{'order':13s}{'GHz':>6s}{'measured':>10s}{'predicted':>10s}{'error':>8s}"
           f"{'busy':>6s}{'tail':>7s}{'gain meas.':>11s}{'pred.':>7s}"]
    for r in result["points"]:
        point = f"hd{r['hdim']} {r['seqlen']} {'causal' if r['causal'] else 'full'}"
        gain = (f"{r['measured_gain']:+10.1%} {r['predicted_gain']:+6.1%}" if r["measured_gain"] is not None
                else f"{'':>11s}{'':>7s}")
        out.append(f"{point:22s}{r['order']:13s}{r['clock_ghz']:6.3f}{r['measured_us']:8.0f}us{r['predicted_us']:8.0f}us"
                   f"{r['error']:+8.1%}{r['busy']:6.3f}{r['tail_us']:5.0f}us{gain}")
    out.append(error_line("launch", s["launch"], "launches"))
    if s["gain_error_pp"]:
        out.append(f"the order's gain, predicted - measured: median {s['gain_error_pp']['median_abs_error']:.1f} pp, "
                   f"max {s['gain_error_pp']['max_abs_error']:.1f} pp over {s['gain_error_pp']['count']} points")
    return "\n".join(out)
