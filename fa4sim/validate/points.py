"""End-to-end points (lab/tools/bench_fwd_sm90.py, kinds 'points' and 'knob_points'): every point
replayed through the simulator, and each knob variant's change against its baseline.

The benchmark JSON holds, per point, the problem, our kernel's recorded configuration and the
measured TFLOP/s of each implementation. Our kernel is simulated as it ran
(common.model_knobs('fa4kernel', its config)); flash-attn-4's SM90 forward with the fa3 schedule's
choices as its implementation (fa4sim/implementations/flash-attn-4-sm90.json).
Reported: per-point error (sim - hw) / hw, median and max |error|, and for the knob points the
measured and predicted change against the default configuration, side by side. Nothing here
feeds back into the model: the hardware profile comes from datasheets and microbenchmarks only.

The clock: a Hopper card's SM clock under load is set by its power cap and moves by 10-20 %
between runs (1.80 GHz with one CTA busy, 1.6-1.7 GHz with all 132, measured in-kernel on an
H100). fa4sim predicts cycles; a time needs a clock. When the benchmark recorded the in-kernel
clock of a point (`clock_ghz_in_kernel`: clock64 / globaltimer of our kernel's clock-probe build,
timed round-robin with the others), every prediction for that point is made at that clock, so the
error measures the cycle model alone ("clock": "measured"); otherwise at the profile's clock_ghz.
A variant of our kernel with its own probe (clock_ghz_in_kernel_by_variant) is predicted at its
own clock where its probe and its baseline's span their launches (clock_probes_span_launch: the
CTA-log build probes a launch of one CTA per tile; a persistent launch's probe, CTA 0, always
spans it). `at_profile_clock=True` forces the profile's clock everywhere.
"""
from __future__ import annotations

import statistics

from ..errors import InputError
from ..params import Problem
from .common import (COMPILED_PV_WAIT, PV_WAIT, SIMULATED, kernel_knobs, model_knobs, predict, profile_for,
                     progress, pyplot, save, verdict)

# variants bench_fwd_sm90.py records beside a point's default run, and what they change
VARIANT_CONFIG = {"1 tile/CTA": {"persistent": False}, "persistent=True": {"persistent": True}}
# timed beside the others only to read the in-kernel clock (the default's, "clock probe", and a
# variant's own, "clock probe:<variant>"): not knobs, not points
PROBE_PREFIX = "clock probe"


def expand(points: list[dict]) -> list[dict]:
    """One point per (problem, configuration). bench_fwd_sm90.py stores variants of our kernel
    as results 'fa4kernel[<variant>]' (with configs[<variant>] in a 'knobs' point): each becomes
    its own point, labelled <variant>, whose baseline is the point's 'default' (knobs points) or
    its plain 'fa4kernel' run."""
    out = []
    for p in points:
        plain = {k: v for k, v in p.get("results", {}).items() if not k.startswith("fa4kernel[")}
        variants = {k[len("fa4kernel["):-1]: v for k, v in p.get("results", {}).items()
                    if k.startswith("fa4kernel[") and k.endswith("]")
                    and not k[len("fa4kernel["):].startswith(PROBE_PREFIX)}
        clocks = p.get("clock_ghz_in_kernel_by_variant") or {}
        keep = {k: v for k, v in p.items() if k not in ("results", "configs", "compile_s")}
        if plain and "fa4kernel" in plain or not variants:
            out.append({**keep, "results": plain})
        for name, res in variants.items():
            config = (p.get("configs") or {}).get(name) or dict(p.get("fa4kernel_config") or {})
            config = {**config, **VARIANT_CONFIG.get(name, {})}
            base = "default" if p.get("label") == "knobs" else p.get("label", "main")
            # its own clock where its probe and the baseline's each span their launch
            spans = p.get("clock_probes_span_launch") or (
                config.get("persistent") and (p.get("fa4kernel_config") or {}).get("persistent", True))
            own = {"clock_ghz_in_kernel": clocks[name]} if name in clocks and spans else {}
            out.append({**keep, **own, "label": name, "baseline": base if name != "default" else None,
                        "results": {"fa4kernel": res}, "fa4kernel_config": config})
    return out


def measured_tflops(problem: Problem, res: dict) -> float:
    """A recorded result's TFLOP/s, counted as the model counts (Problem.flops) from its time where
    it has one (ms per call): files recorded with the FA papers' half rectangle for causal then
    compare like for like."""
    ms = res.get("ms")
    return problem.flops / (ms * 1e-3) / 1e12 if ms else res["tflops"]


def compare(doc: dict, hw: str | None = None, at_profile_clock: bool = False, pv_wait: str = "model") -> dict:
    """pv_wait='sass': every build with the PV wait where ptxas put it (a what-if: the model's
    default is the order it was validated with, the whole row max before the wait, the rest after)."""
    if pv_wait not in PV_WAIT:
        raise InputError("pv_wait", f"must be one of {', '.join(PV_WAIT)}, got {pv_wait!r}")
    hw = hw or profile_for(doc["meta"].get("device", ""))
    rows = []
    points = expand(doc["points"])
    for i, p in enumerate(points, 1):
        progress(i, len(points))
        clock = None if at_profile_clock else p.get("clock_ghz_in_kernel")
        problem = Problem(int(p["batch"]), int(p["heads"]), int(p["seqlen"]), int(p.get("seqlen_k", p["seqlen"])),
                          int(p["hdim"]), bool(p["causal"]), heads_kv=int(p.get("heads_kv") or p["heads"]))
        for impl, res in p.get("results", {}).items():
            if impl not in SIMULATED or "tflops" not in res:
                continue
            knobs = kernel_knobs(p) if impl == "fa4kernel" else model_knobs(impl)
            if pv_wait == "sass":
                knobs.update(COMPILED_PV_WAIT)
            meas = measured_tflops(problem, res)
            try:
                r = predict(hw, "fa3", problem, {**knobs, **({"clock_ghz": clock} if clock else {})}, impl)
                sim, err = r.tflops, (r.tflops - meas) / meas
                why = r.bottleneck
            except InputError as e:
                sim, err, why = None, None, str(e)
            rows.append({"impl": impl, "label": p.get("label", "main"), "baseline": p.get("baseline"),
                         "batch": problem.batch, "heads": problem.heads,
                         "seqlen": problem.seqlen_q, "hdim": problem.hdim, "causal": problem.causal,
                         "knobs": knobs, "measured_tflops": meas, "predicted_tflops": sim,
                         "error": err, "bottleneck": why, "clock_ghz": clock})
    errs = [abs(r["error"]) for r in rows if r["error"] is not None and r["label"] == "main"]
    clocks = [r["clock_ghz"] for r in rows if r["clock_ghz"]]
    summary = {"hw_profile": hw, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
               "clock": (f"measured in-kernel per point ({min(clocks):.3f}-{max(clocks):.3f} GHz)" if clocks
                         else "the profile's clock_ghz"),
               "points": len(errs),
               "median_abs_error": statistics.median(errs) if errs else None,
               "max_abs_error": max(errs) if errs else None}
    for impl in SIMULATED:
        e = [abs(r["error"]) for r in rows if r["impl"] == impl and r["error"] is not None and r["label"] == "main"]
        if e:
            summary[impl] = {"median_abs_error": statistics.median(e), "max_abs_error": max(e), "points": len(e)}
    return {"kind": "points", "summary": summary, "points": rows, "knob_deltas": knob_deltas(rows)}


def knob_deltas(rows: list[dict]) -> list[dict]:
    """Measured vs predicted change of each variant of our kernel against its baseline run."""
    out = []
    ours = [r for r in rows if r["impl"] == "fa4kernel"]
    for r in ours:
        if not r.get("baseline"):
            continue
        key = (r["seqlen"], r["hdim"], r["causal"], r["batch"], r["heads"])
        b = next((x for x in ours if x["label"] == r["baseline"]
                  and (x["seqlen"], x["hdim"], x["causal"], x["batch"], x["heads"]) == key), None)
        if b is None or r["predicted_tflops"] is None or b["predicted_tflops"] is None:
            continue
        meas = r["measured_tflops"] / b["measured_tflops"] - 1
        pred = r["predicted_tflops"] / b["predicted_tflops"] - 1
        out.append({"knob": r["label"], "hdim": r["hdim"], "seqlen": r["seqlen"], "causal": r["causal"],
                    "measured_delta": meas, "predicted_delta": pred,
                    "same_sign": (meas >= 0) == (pred >= 0) or abs(meas) < 0.01,
                    "difference_pp": 100 * (pred - meas)})
    return out


def plot(result: dict, path: str) -> str:
    """Predicted vs measured TFLOP/s, ours and flash-attn-4, causal and not, around y = x."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 6))
    pts = [r for r in result["points"] if r["predicted_tflops"] is not None]
    hi = max([r["measured_tflops"] for r in pts] + [r["predicted_tflops"] for r in pts] + [1.0]) * 1.1
    for impl, marker in (("fa4kernel", "o"), ("flash-attn-4", "s")):
        for causal, color in ((False, "#4C72B0"), (True, "#DD8452")):
            sel = [r for r in pts if r["impl"] == impl and r["causal"] == causal]
            if sel:
                ax.scatter([r["measured_tflops"] for r in sel], [r["predicted_tflops"] for r in sel], marker=marker,
                           color=color, label=f"{SIMULATED[impl]}{', causal' if causal else ''}", alpha=0.8)
    ax.plot([0, hi], [0, hi], "k--", linewidth=0.8, label="y = x")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    s = result["summary"]
    med = s["median_abs_error"]
    ax.set_title(f"predicted vs measured on {s['device']}\n"
                 f"profile {s['hw_profile']}, clock {s.get('clock', '')}; median |err| {med:.1%}"
                 if med is not None else "no points", fontsize=8)
    ax.set_xlabel("measured TFLOP/s")
    ax.set_ylabel("predicted TFLOP/s")
    return save(fig, ax, path)


def report(result: dict) -> str:
    s = result["summary"]
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}, clock: {s['clock']}"]
    lines.append(f"{'impl':13s} {'hd':>4s} {'seqlen':>6s} {'causal':>6s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for r in result["points"]:
        if r["label"] != "main":
            continue
        pred = "-" if r["predicted_tflops"] is None else f"{r['predicted_tflops']:9.1f}"
        err = "-" if r["error"] is None else f"{r['error']:+7.1%}"
        lines.append(f"{r['impl']:13s} {r['hdim']:4d} {r['seqlen']:6d} {str(r['causal']):>6s} "
                     f"{r['measured_tflops']:9.1f} {pred:>9s} {err:>7s}")
    if s["median_abs_error"] is not None:
        lines.append(f"median |error| {s['median_abs_error']:.1%}, max |error| {s['max_abs_error']:.1%} over {s['points']} points")
    if result["knob_deltas"]:
        lines.append("knob deltas vs default (measured / predicted):")
        for d in result["knob_deltas"]:
            lines.append(f"  {d['knob']:26s} hd{d['hdim']:<3d} {d['seqlen']:>5d} causal={int(d['causal'])} "
                         f"{d['measured_delta']:+7.1%} / {d['predicted_delta']:+7.1%}  {verdict(d)}")
    return "\n".join(lines)
