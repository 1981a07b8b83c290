"""Backward timings (lab/tools/bench_bwd_sm90.py, kind 'sm90_bwd'): the backward alone (dQ, dK,
dV from a recorded forward), timed side by side for fa4kernel, flash-attn-4 and cuDNN, against
fa4sim's backward (`simulate(..., pass_="bwd")`) at the model's own clock.

Both fa4kernel's and flash-attn-4's SM90 backwards are the schedule fa4sim models
(fa4sim/schedules/fa3_sm90_bwd.py), each with its own choices (implementations/*.json, "bwd").
A kernel named with a bracket is a variant: "fa4kernel[deterministic]" sets the knob
deterministic, "fa4kernel[dq_reduce=bulk]" the knob dq_reduce (any "name" or "name=value"
inside the brackets, comma-separated). A file's meta.fa4kernel_bwd_knobs says which build the
plain "fa4kernel" row timed (the kernel's defaults when it ran); its brackets change those.
cuDNN is not modelled.

A sustained file (bench_bwd_sm90.py --sustained) also holds fa4kernel[clock probe]: fa4kernel's
default backward through its clock-probe build, modelled as fa4kernel, whose in-kernel clock is
the point's clock_ghz_in_kernel. The plain fa4kernel row (the same kernel without the stamps) is
then compared in clock too, and predicted again at that clock: the cycle model alone.

TFLOP/s count 2.5 x the forward's FLOPs on both sides (the benchmark's and the model's convention);
error = predicted / measured - 1.
"""
from __future__ import annotations

from ..errors import InputError
from ..params import Problem
from .common import error_stats, predict, profile_for, progress

MODELLED = ("fa4kernel", "flash-attn-4")
PROBE = "fa4kernel[clock probe]"  # fa4kernel's default build plus four stamps per CTA


def problem_of(p: dict) -> Problem:
    """A backward point's problem (seqlen_k and heads_kv default to seqlen and heads)."""
    sk = int(p.get("seqlen_k") or p["seqlen"])
    return Problem(int(p["batch"]), int(p["heads"]), int(p["seqlen"]), sk, int(p["hdim"]), bool(p["causal"]),
                   heads_kv=int(p.get("heads_kv") or p["heads"]))


def variant(kernel: str) -> tuple[str, dict]:
    """('fa4kernel', {'dq_reduce': 'bulk'}) from 'fa4kernel[dq_reduce=bulk]': the implementation and
    the knobs its bracket sets (a bare name sets a boolean knob true)."""
    name, _, rest = kernel.partition("[")
    knobs: dict = {}
    for item in filter(None, (x.strip() for x in rest.rstrip("]").split(","))):
        key, eq, value = item.partition("=")
        knobs[key.strip()] = value.strip() if eq else True
    return name, knobs


def compare(doc: dict, hw: str | None = None, kernels=None) -> dict:
    """Every timed row of the file against the model. kernels: only the rows of these kernels
    (names as the file has them, e.g. ("flash-attn-4",)); None: all of them. Each distinct
    simulation (profile, problem, knobs, implementation) runs once: a file's fa4kernel and
    fa4kernel[clock probe] rows are the same build (common.predict)."""
    hw_name = hw or profile_for(doc["meta"].get("device", ""))
    rows, pts = [], doc.get("points") or []
    for i, p in enumerate(pts, 1):
        progress(i, len(pts))
        problem = problem_of(p)
        for kernel, res in (p.get("results") or {}).items():
            if kernels is not None and kernel not in kernels:
                continue
            if not isinstance(res, dict) or not res.get("tflops") or not (res.get("check") or {}).get("ok"):
                continue
            impl, knobs = ("fa4kernel", {}) if kernel == PROBE else variant(kernel)
            if impl == "fa4kernel":  # the defaults of the kernel that ran, where the file says
                knobs = {**(doc["meta"].get("fa4kernel_bwd_knobs") or {}), **knobs}
            probe = p.get("clock_ghz_in_kernel") if kernel in ("fa4kernel", PROBE) else None
            row = {"kernel": kernel, "hdim": problem.hdim, "seqlen": problem.seqlen_q, "batch": problem.batch,
                   "heads": problem.heads, "heads_kv": problem.heads_kv, "causal": problem.causal,
                   "measured_tflops": res["tflops"],
                   "predicted_tflops": None, "error": None, "clock_ghz": None, "measured_clock_ghz": probe,
                   "clock_error": None, "error_at_measured_clock": None}
            if impl in MODELLED:
                try:
                    r = predict(hw_name, None, problem, knobs, impl, "bwd")
                    row.update(predicted_tflops=r.tflops, error=r.tflops / res["tflops"] - 1.0,
                               clock_ghz=r.clock_ghz, bottleneck=r.bottleneck)
                    if probe and kernel == "fa4kernel":  # the cycle model alone, at the probe's clock
                        at = predict(hw_name, None, problem, {**knobs, "clock_ghz": probe}, impl, "bwd")
                        row.update(clock_error=r.clock_ghz / probe - 1.0,
                                   error_at_measured_clock=at.tflops / res["tflops"] - 1.0)
                except InputError as e:
                    row["bottleneck"] = str(e)
            rows.append(row)
    by_kernel = {}
    for r in rows:
        if r["error"] is not None:
            by_kernel.setdefault(r["kernel"], []).append(r["error"])
    summary = {"hw_profile": hw_name, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
               "tflops": error_stats([r["error"] for r in rows if r["kernel"] != PROBE]),
               "by_kernel": {k: error_stats(v) for k, v in by_kernel.items()},
               "clock": error_stats([r["clock_error"] for r in rows]),
               "tflops_at_measured_clock": error_stats([r["error_at_measured_clock"] for r in rows])}
    return {"kind": "sm90_bwd", "summary": summary, "points": rows}


def report(result: dict) -> str:
    s = result["summary"]
    probed = bool(s.get("clock"))
    head = f"{'kernel':26s} {'point':24s} {'TFLOP/s meas':>12s} {'pred':>7s} {'error':>7s} {'GHz':>6s}"
    if probed:
        head += f"  {'GHz probe':>9s} {'error':>7s}  {'at probe clock':>14s}"
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}, backward, the model's own clock", head]
    pct = lambda x: "-" if x is None else f"{x:+.1%}"  # noqa: E731
    for r in result["points"]:
        name = f"hd{r['hdim']}-{r['seqlen']}-b{r['batch']}-h{r['heads']}{'-causal' if r['causal'] else ''}"
        pred = "-" if r["predicted_tflops"] is None else f"{r['predicted_tflops']:7.1f}"
        ghz = "-" if r["clock_ghz"] is None else f"{r['clock_ghz']:.3f}"
        line = f"{r['kernel']:26s} {name:24s} {r['measured_tflops']:12.1f} {pred:>7s} {pct(r['error']):>7s} {ghz:>6s}"
        if probed:
            probe = "-" if not r.get("measured_clock_ghz") else f"{r['measured_clock_ghz']:.3f}"
            line += f"  {probe:>9s} {pct(r.get('clock_error')):>7s}  {pct(r.get('error_at_measured_clock')):>14s}"
        lines.append(line)
    for kernel, t in (s.get("by_kernel") or {}).items():
        lines.append(f"TFLOP/s, {kernel}: median |error| {t['median_abs_error']:.1%}, max "
                     f"{t['max_abs_error']:.1%} over {t['count']} points")
    t = s["tflops"]
    lines.append(f"TFLOP/s, all modelled: median |error| {t['median_abs_error']:.1%}, max "
                 f"{t['max_abs_error']:.1%} over {t['count']} points" if t else "TFLOP/s: no modelled point")
    for key, what in (("clock", "clock vs the probe's in-kernel clock (fa4kernel)"),
                      ("tflops_at_measured_clock", "fa4kernel at the probe's clock (the cycle model alone)")):
        t = s.get(key)
        if t:
            lines.append(f"{what}: median |error| {t['median_abs_error']:.1%}, max {t['max_abs_error']:.1%} "
                         f"over {t['count']} points")
    lines.append("not modelled: cuDNN")
    return "\n".join(lines)
