"""Measured vs simulated timeline of fa4kernel's SM90 forward: CPU script.

    python3 lab/tools/timeline_compare.py DIR/timeline_hd128.json [more.json ...]
        [--hw h200] [--tile 0] [--figdir figures] [--no-figure]

For each stamps file written by lab/tools/timeline_sm90.py (fa4sim.timeline's format): prints
the measured steady-state interval per KV iteration (fa4sim.timeline.interval of QK0) and the
simulated one for the same configuration (fa4sim.simulate with schedule fa3 and hw
'h200' or 'h100' by the meta's device; the model's interval is
Result.interval), per-op median durations side by side, and draws the overlay
(fa4sim.timeline.overlay) into FIGDIR/timeline_overlay_<label>.png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fa4sim import timeline  # noqa: E402
from fa4sim.model import simulate  # noqa: E402
from fa4sim.params import Problem  # noqa: E402

SIM_KNOBS = ("tile_m", "tile_n", "kv_stages", "pingpong", "intra_wg_overlap", "p_in_registers",
             "exp_emulation", "rescale_threshold")


def hw_for(meta: dict, override: str | None = None) -> str:
    if override:
        return override
    if meta.get("hw_profile"):  # recorded before the measured profiles took the plain names
        return meta["hw_profile"].removesuffix("-measured")
    return "h200" if "H200" in str(meta.get("device", "")).upper() else "h100"


def sim_overrides(meta: dict) -> dict:
    knobs = meta.get("knobs") or meta.get("config") or {}
    out = {k: knobs[k] for k in SIM_KNOBS if k in knobs}
    if out.get("rescale_threshold") in (0, 0.0):
        out["rescale_threshold"] = None  # the kernel's 0.0 = always rescale = the model's None
    # the stamps' clock reads pin the source order: in the traced builds (full and light) the
    # exp2s stay ahead of the PV wait, unlike the normal build (SASS: tests/test_kernel_sm90_trace.py)
    out["pv_wait"] = "after_softmax"
    # the kernel's tile turnover as recorded (files from before these knobs: Q handed back after
    # the KV loop, the O store waited for right after issuing it)
    cfg = meta.get("config") or {}
    out["early_q_release"] = bool(cfg.get("early_q_release", False))
    out["defer_o_store_wait"] = bool(cfg.get("defer_o_store_wait", False))
    return out


def problem_of(meta: dict) -> Problem:
    p = meta["problem"]
    return Problem(int(p["batch"]), int(p["heads"]), int(p["seqlen_q"]), int(p["seqlen_k"]),
                   int(p["hdim"]), bool(p.get("causal", False)))


def select_tile(doc: dict, schedule, tile: int) -> tuple[dict, list[str]]:
    """Events of one recorded tile, relabelled tile 0, limited to the schedule's ops/roles."""
    names = {o.name for o in schedule.ops}
    evs, dropped = [], set()
    for e in doc["events"]:
        if int(e.get("tile", 0)) != tile:
            continue
        if e["op"] not in names or e["role"] not in schedule.roles:
            dropped.add(e["op"])
            continue
        evs.append(dict(e, tile=0))
    if not evs:
        raise SystemExit(f"no events of tile {tile} (tiles recorded: {doc['meta'].get('tiles_recorded')})")
    return dict(doc, events=evs), sorted(dropped)


def _median_durations(ops, skip: int = 2) -> dict:
    d: dict[str, list[float]] = {}
    for r in ops:
        if r.iter >= skip:
            d.setdefault(r.name, []).append(r.end - r.start)
    return {k: statistics.median(v) for k, v in d.items()}


def compare(path: str, hw: str | None = None, tile: int = 0, figdir: str | None = "figures",
            label: str | None = None, marker: str = "QK0", out=print) -> dict:
    """Print measured vs simulated interval (+ per-op durations); draw the overlay. Returns numbers."""
    doc = timeline.load_stamps(path)
    meta = doc.get("meta", {})
    label = label or meta.get("label") or Path(path).name.split(".")[0].replace("timeline_", "")
    hw_name = hw_for(meta, hw)
    prob = problem_of(meta)
    over = sim_overrides(meta)
    res = simulate(hw_name, "fa3", prob, over)
    sched = res.trace.schedule
    sel, dropped = select_tile(doc, sched, tile)
    measured = timeline.to_trace(sel, sched)
    m_int = timeline.interval(measured, marker)
    s_int = res.interval
    s_int_trace = timeline.interval(res.trace, marker)
    ghz = meta.get("clock_ghz_in_kernel")
    out(f"== {label}: {meta.get('device', '?')}, problem {vars(prob)}, knobs {over}")
    out(f"   simulator: fa3 on {hw_name} ({res.hw.clock_ghz} GHz); measured clock in kernel: "
        f"{ghz if ghz is None else round(ghz, 3)} GHz; tile {tile} of CTA {meta.get('cta', '?')}")
    fmt = (lambda x: "n/a" if x is None else f"{x:.1f}")
    out(f"   steady-state interval per KV iteration ({marker} starts): measured {fmt(m_int)} cycles, "
        f"simulated {fmt(s_int)} cycles (Result.interval; sim trace {fmt(s_int_trace)})"
        + (f", ratio measured/simulated {m_int / s_int:.3f}" if m_int and s_int else ""))
    if m_int and ghz:
        flops_iter = 4.0 * over.get("tile_m", 128) * over.get("tile_n", 128) * prob.hdim
        per_sm = flops_iter / (m_int / ghz) / 1e3
        out(f"   measured: {m_int / ghz:.1f} ns per KV iteration at {ghz:.3f} GHz = {per_sm:.2f} TFLOP/s per "
            f"SM (x {res.hw.num_sms} SMs = {per_sm * res.hw.num_sms:.0f}; {flops_iter / m_int:.0f} FLOP/cycle)")
    md, sd = _median_durations(measured.ops), _median_durations(res.trace.ops)
    names = [o.name for o in sched.ops if o.name in md or o.name in sd]
    out("   median duration per op (cycles, iterations >= 2):  op  measured  simulated")
    for n in names:
        out(f"      {n:<6} {fmt(md.get(n)):>9} {fmt(sd.get(n)):>10}")
    if dropped:
        out(f"   not simulator ops here (kept in the JSON, not compared): {', '.join(dropped)}")
    fig = None
    if figdir:
        os.makedirs(figdir, exist_ok=True)
        fig = os.path.join(figdir, f"timeline_overlay_{label}.png")
        title = (f"{label}: simulated (fa3, {hw_name}) vs measured ({meta.get('device', '?')}, "
                 f"CTA {meta.get('cta', '?')} tile {tile}); interval {fmt(s_int)} vs {fmt(m_int)} cycles")
        timeline.overlay(res.trace, measured, fig, title=title)
        out(f"   overlay -> {fig}")
    return {"label": label, "hw": hw_name, "measured_interval": m_int, "simulated_interval": s_int,
            "simulated_trace_interval": s_int_trace, "clock_ghz_in_kernel": ghz, "figure": fig,
            "measured_durations": md, "simulated_durations": sd}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stamps", nargs="+", help="timeline_<label>.json files (lab/tools/timeline_sm90.py)")
    ap.add_argument("--hw", default=None, help="fa4sim profile (default: by the meta's device)")
    ap.add_argument("--tile", type=int, default=0, help="which recorded tile of the CTA (default 0)")
    ap.add_argument("--figdir", default="figures")
    ap.add_argument("--no-figure", action="store_true")
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    results = [compare(p, args.hw, args.tile, None if args.no_figure else args.figdir) for p in args.stamps]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
