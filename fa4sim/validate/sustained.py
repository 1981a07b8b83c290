"""Sustained timings (lab/tools/sustained_sm90.py, and on a B200 lab/tools/sustained_sm100.py;
kind 'sustained'): each kernel run alone, back to back until the power cap has settled its clock,
against the model predicting it with no measured clock at all. What each result is simulated as
depends on the profile's arch (KERNELS): on SM100, flash-attn-4's forward and its backward.

Every point is simulated for each kernel (fa4kernel as it ran, from its recorded configuration;
flash-attn-4 as its implementation) on the device's calibrated profile (h100, h200). The clock is
the model's own: the power model's prediction where the profile has one (clock_source "power
model"), else the profile's clock_ghz ("profile"). Reported:

- TFLOP/s, predicted against measured (from the recorded ms, counted as the model counts:
  Problem.flops), per point and kernel; median and max |error| per kernel and over all points;
- the clock, predicted against the clock-probe build's in-kernel clock (clock64 / globaltimer
  inside the timed windows; the probe build is fa4kernel's own SASS plus four stamps), over the
  points that have both;
- the cycle model alone: fa4kernel predicted again at its measured in-kernel clock, so the
  TFLOP/s error splits into the clock's part and the cycles' part; against the default build's
  time, and against the probe build's own (the same timed windows as its clock: the two builds'
  runs differ by about 2 % in time);
- the power model alone: the clock it predicts for fa4kernel's launch given the cycles the probe
  build measured (the launch's work spread over the probe build's time at its clock). Under the
  cap power follows the work per second, so a cycle model x % slow puts the clock about x % high
  (less power per second at a given clock); this clock leaves that out;
- board power, predicted (Result.power_w, with a power model) against NVML's.

A candidate whose output failed the benchmark's check (relative error, NaN) is left out and
named in the summary.
"""
from __future__ import annotations

from dataclasses import replace

from .. import hardware, power as power_model
from ..errors import InputError
from ..model import setup
from ..params import Problem
from .common import (SIMULATED, error_line, error_stats, kernel_knobs, model_knobs, predict, profile_for, progress,
                     pyplot, save)
from .points import measured_tflops


BWD_FLOPS = 2.5  # a backward's TFLOP/s count 2.5 forwards (as fa4sim's do)


def problem_of(p: dict) -> Problem:
    """A sustained point's problem (seqlen = seqlen_q; seqlen_k, hdim_v and heads_kv default to
    seqlen, hdim and heads)."""
    return Problem(int(p["batch"]), int(p["heads"]), int(p["seqlen"]), int(p.get("seqlen_k") or p["seqlen"]),
                   int(p["hdim"]), bool(p["causal"]), int(p.get("hdim_v") or p["hdim"]),
                   int(p.get("heads_kv") or p["heads"]))


def _board_power(res: dict):
    """NVML's board power over the timed windows, W: the mean of its power samples, which it
    averages over its own window; the energy counter's slope over ~0.5 s of short windows moves
    by +-20 % from run to run (it advances in coarse steps)."""
    nv = res.get("nvml") or {}
    return nv.get("power_w_mean") or res.get("power_w")


def model_clock(r) -> tuple[float, str, float | None]:
    """(the clock a Result's time is at in GHz, where it came from, the predicted board power in W
    or None): the power model's Result fields where they exist, else the profile's clock."""
    return (getattr(r, "clock_ghz", None) or r.hw.clock_ghz, getattr(r, "clock_source", None) or "profile",
            getattr(r, "power_w", None))


def _rel(pred, meas):
    return None if pred is None or not meas else (pred - meas) / meas


def clock_at_measured_cycles(profile, act, probe_ghz: float, measured_us: float) -> float | None:
    """The power model's clock (GHz) for a launch whose activity `act` (power.Activity at the probe's
    clock) took measured_us per call at probe_ghz: its loop cycles scaled to that time. None where
    the measured time leaves no loop time (the launch gap and cold start take it all)."""
    loop_us = act.loop_cycles / (probe_ghz * 1e3)
    left = measured_us - act.gap_us - act.cold_us
    if loop_us <= 0 or left <= 0:
        return None
    return power_model.predict_clock(profile, replace(act, loop_cycles=act.loop_cycles * left / loop_us)).clock_ghz


def _within_3pct(rows: list[dict], key: str) -> tuple[int, int]:
    """(how many of the rows' `key` errors lie within 3 %, how many rows have one)."""
    errs = [r[key] for r in rows if r.get(key) is not None]
    return sum(abs(e) <= 0.03 for e in errs), len(errs)


PROBE = "fa4kernel[clock probe]"  # the clock-probe build's result: its clock and its own time
# what a file's results are simulated as, by the profile's arch: result name -> (schedule, pass,
# implementation). SM100 (lab/tools/sustained_sm100.py): flash-attn-4's forward and its backward
# alone (fa4kernel's SM100 forward is timed beside them; no implementation file describes it).
BWD = "flash-attn-4 backward"
KERNELS = {"sm90": {k: ("fa3", "fwd", k) for k in SIMULATED},
           "sm100": {"flash-attn-4": (None, "fwd", "flash-attn-4"), BWD: (None, "bwd", "flash-attn-4")}}


def kernels_of(point: dict, arch: str) -> list[tuple[str, tuple]]:
    """(result name, (schedule, pass, implementation)) for a point: KERNELS[arch], and on SM90 each
    fa4kernel variant the file timed ('fa4kernel[tile_n=160]': sustained_sm90.py --variant)."""
    out = list(KERNELS[arch].items())
    if arch == "sm90":
        out += [(name, ("fa3", "fwd", "fa4kernel")) for name in (point.get("results") or {})
                if name.startswith("fa4kernel[") and name != PROBE]
    return out


def point_knobs(point: dict, kernel: str, impl: str) -> dict:
    """The model knobs of one result: fa4kernel as it ran (its recorded configuration), a variant
    from its own recorded configuration (configs[label]), flash-attn-4 its implementation's."""
    if kernel.startswith("fa4kernel["):
        return model_knobs("fa4kernel", (point.get("configs") or {}).get(kernel[len("fa4kernel["):-1]) or {})
    return kernel_knobs(point) if kernel == "fa4kernel" else model_knobs(impl)


def compare(doc: dict, hw: str | None = None, overrides: dict | None = None, uncertainty: bool = False,
            jobs: int | None = None) -> dict:
    """Predicted (no measured clock given) vs measured, for every point and simulated kernel;
    overrides: profile parameters (--set NAME=VALUE) for every prediction, e.g. a card's own
    card_power_w (lab/tools/calibrate/card_power.py); uncertainty: each prediction's band
    (fa4sim/uncertainty.py) and whether the measured TFLOP/s fall inside it."""
    overrides = dict(overrides or {})
    hw_name = hw or profile_for(doc["meta"].get("device", ""))
    arch = hardware.load(hw_name).arch
    rows, wrong = [], []
    pts = doc.get("points") or []
    for i, p in enumerate(pts, 1):
        progress(i, len(pts))
        problem = problem_of(p)
        for kernel, (schedule, pass_, impl) in kernels_of(p, arch):
            res = (p.get("results") or {}).get(kernel) or {}
            if "ms" not in res and "tflops" not in res:
                continue
            if not (res.get("check") or {}).get("ok", True):
                wrong.append(f"{p.get('name', '?')}:{kernel}")
                continue
            knobs = {**point_knobs(p, kernel, impl), **overrides}
            meas = measured_tflops(problem, res) * (BWD_FLOPS if pass_ == "bwd" and "ms" in res else 1.0)
            probe = p.get("clock_ghz_in_kernel") if kernel == "fa4kernel" else None
            row = {"kernel": kernel, "name": p.get("name"), "group": p.get("group"), "batch": problem.batch,
                   "heads": problem.heads, "heads_kv": problem.heads_kv, "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k,
                   "hdim": problem.hdim, "hdim_v": problem.hdim_v, "causal": problem.causal, "knobs": knobs,
                   "measured_tflops": meas, "measured_clock_ghz": probe,
                   "nvml_sm_mhz": res.get("sm_mhz"), "measured_power_w": _board_power(res)}
            try:
                r = predict(hw_name, schedule, problem, knobs, impl, pass_)
                clock, source, power = model_clock(r)
                row.update(predicted_tflops=r.tflops, error=_rel(r.tflops, meas), predicted_clock_ghz=clock,
                           clock_source=source, predicted_power_w=power, bottleneck=r.bottleneck,
                           clock_error=_rel(clock, probe), power_error=_rel(power, row["measured_power_w"]))
                if uncertainty:
                    from ..uncertainty import band
                    bd = band(hw_name, schedule, problem, knobs, impl, pass_, jobs=jobs, nominal=r)
                    row.update(tflops_low=bd.tflops_low, tflops_high=bd.tflops_high,
                               covered=bd.tflops_low <= meas <= bd.tflops_high,
                               dominant_params=[n for n, _ in bd.dominant[:3]])
                if probe:  # the cycle model alone: the same simulation at the measured clock
                    at = predict(hw_name, "fa3", problem, {**knobs, "clock_ghz": probe}, kernel)
                    row.update(tflops_at_measured_clock=at.tflops, error_at_measured_clock=_rel(at.tflops, meas))
                    # the probe build's own time: the same windows as its clock (else the default build's)
                    own = (p.get("results") or {}).get(PROBE) or {}
                    own_ms = float(own.get("ms") or res.get("ms") or 0.0)
                    if own.get("ms"):
                        row.update(probe_tflops=measured_tflops(problem, own),
                                   error_at_probe_run=_rel(at.tflops, measured_tflops(problem, own)))
                    if power_model.has_model(r.hw) and own_ms:  # the power model alone: the measured cycles
                        base = setup(hw_name, "fa3", problem, knobs, kernel)[0]
                        alone = clock_at_measured_cycles(base, at.activity, probe, own_ms * 1e3)
                        row.update(clock_at_measured_cycles=alone, clock_error_at_measured_cycles=_rel(alone, probe))
            except InputError as e:
                row.update(predicted_tflops=None, error=None, predicted_clock_ghz=None, clock_source=None,
                           predicted_power_w=None, bottleneck=str(e), clock_error=None, power_error=None)
            rows.append(row)
    summary = {"hw_profile": hw_name, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
               "clock_sources": sorted({r["clock_source"] for r in rows if r.get("clock_source")}),
               "overrides": overrides,
               "tflops": error_stats([r["error"] for r in rows]),
               "clock": error_stats([r["clock_error"] for r in rows]),
               "tflops_at_measured_clock": error_stats([r.get("error_at_measured_clock") for r in rows]),
               "tflops_at_probe_run": error_stats([r.get("error_at_probe_run") for r in rows]),
               "clock_at_measured_cycles": error_stats([r.get("clock_error_at_measured_cycles") for r in rows]),
               "power": error_stats([r["power_error"] for r in rows]),
               "wrong_output_left_out": wrong, "skipped_points": doc.get("skipped") or []}
    banded = [r for r in rows if "covered" in r]
    if banded:
        summary["band"] = {"covered": sum(r["covered"] for r in banded), "banded": len(banded)}
    for kernel in KERNELS[arch]:
        s = error_stats([r["error"] for r in rows if r["kernel"] == kernel])
        if s:
            summary[kernel] = s
    for group in sorted({r["group"] for r in rows if r.get("group")}):
        s = error_stats([r["error"] for r in rows if r["group"] == group])
        if s:
            summary[f"group {group}"] = s
    return {"kind": "sustained", "summary": summary, "points": rows}


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def report(result: dict) -> str:
    s = result["summary"]
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}, the model's own clock "
             f"({', '.join(s['clock_sources']) or 'none'}); each kernel run alone, sustained"
             + "".join(f"; --set {k}={v}" for k, v in (s.get("overrides") or {}).items()),
             f"{'kernel':13s} {'point':30s} {'TFLOP/s meas':>12s} {'pred':>7s} {'error':>7s}  "
             f"{'GHz probe':>9s} {'pred':>6s} {'error':>7s}  {'at probe clock':>14s}  {'W nvml':>6s} {'pred':>5s}"]
    for r in result["points"]:
        pred = "-" if r["predicted_tflops"] is None else f"{r['predicted_tflops']:7.1f}"
        probe = "-" if not r["measured_clock_ghz"] else f"{r['measured_clock_ghz']:9.3f}"
        pclock = "-" if r["predicted_clock_ghz"] is None else f"{r['predicted_clock_ghz']:6.3f}"
        at = _pct(r.get("error_at_measured_clock"))
        w = "-" if not r["measured_power_w"] else f"{r['measured_power_w']:6.0f}"
        pw = "-" if r["predicted_power_w"] is None else f"{r['predicted_power_w']:5.0f}"
        lines.append(f"{r['kernel']:13s} {r['name'] or '?':30s} {r['measured_tflops']:12.1f} {pred:>7s} "
                     f"{_pct(r['error']):>7s}  {probe:>9s} {pclock:>6s} {_pct(r['clock_error']):>7s}  {at:>14s}  "
                     f"{w:>6s} {pw:>5s}")
    lines.append(error_line("TFLOP/s, all kernels", s["tflops"]))
    if s.get("band"):
        lines.append(f"inside their bands (--uncertainty): {s['band']['covered']} of {s['band']['banded']} "
                     f"kernel-points")
    for kernel in dict.fromkeys(k for ks in KERNELS.values() for k in ks):
        if s.get(kernel):
            lines.append(error_line(f"TFLOP/s, {kernel}", s[kernel]))
    for key in sorted(k for k in s if k.startswith("group ")):
        lines.append(error_line(f"TFLOP/s, {key[len('group '):]} points", s[key]))
    lines.append(error_line("clock vs the probe's in-kernel clock", s["clock"], "configurations"))
    lines.append(error_line("TFLOP/s at the probe's clock (the cycle model alone)", s["tflops_at_measured_clock"]))
    if s.get("tflops_at_probe_run"):
        lines.append(error_line("the same against the probe build's own time", s["tflops_at_probe_run"]))
    if s.get("clock_at_measured_cycles"):
        alone, _ = _within_3pct(result["points"], "clock_error_at_measured_cycles")
        lines.append(error_line("clock at the measured cycles (the power model alone)", s["clock_at_measured_cycles"],
                           "configurations") + f", {alone} within 3 %")
    if s["clock"]:
        hits, n = _within_3pct(result["points"], "clock_error")
        lines.append(f"clock within 3 % of the probe's: {hits} of {n} configurations")
    if s["power"]:
        lines.append(error_line("board power vs NVML", s["power"]))
    if s["wrong_output_left_out"]:
        lines.append(f"left out (output failed the check): {', '.join(s['wrong_output_left_out'])}")
    if s["skipped_points"]:
        lines.append(f"not measured (past the run's budget): {', '.join(s['skipped_points'])}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str:
    """Left: predicted vs measured TFLOP/s around y = x (fa4kernel and flash-attn-4, causal and
    not). Right: predicted vs in-kernel clock (GHz) of each point with a probe."""
    plt = pyplot()
    fig, (ax, axc) = plt.subplots(1, 2, figsize=(11, 5.2))
    pts = [r for r in result["points"] if r["predicted_tflops"] is not None]
    hi = max([r["measured_tflops"] for r in pts] + [r["predicted_tflops"] for r in pts] + [1.0]) * 1.1
    for kernel, marker in (("fa4kernel", "o"), ("flash-attn-4", "s"), (BWD, "^")):
        for causal, color in ((False, "#4C72B0"), (True, "#DD8452")):
            sel = [r for r in pts if r["kernel"] == kernel and r["causal"] == causal]
            if sel:
                ax.scatter([r["measured_tflops"] for r in sel], [r["predicted_tflops"] for r in sel], marker=marker,
                           color=color, alpha=0.8, label=f"{SIMULATED.get(kernel, kernel)}{', causal' if causal else ''}")
    ax.plot([0, hi], [0, hi], "k--", linewidth=0.8, label="y = x")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    s = result["summary"]
    med = (s["tflops"] or {}).get("median_abs_error")
    ax.set_title(f"sustained, predicted at the model's clock vs measured\n{s['device']}, "
                 f"profile {s['hw_profile']}" + (f"; median |err| {med:.1%}" if med is not None else ""), fontsize=8)
    ax.set_xlabel("measured TFLOP/s")
    ax.set_ylabel("predicted TFLOP/s")
    clk = [r for r in pts if r["measured_clock_ghz"] and r["predicted_clock_ghz"]]
    if clk:
        vals = [r["measured_clock_ghz"] for r in clk] + [r["predicted_clock_ghz"] for r in clk]
        lo, top = min(vals) - 0.05, max(vals) + 0.05
        for causal, color in ((False, "#4C72B0"), (True, "#DD8452")):
            sel = [r for r in clk if r["causal"] == causal]
            if sel:
                axc.scatter([r["measured_clock_ghz"] for r in sel], [r["predicted_clock_ghz"] for r in sel],
                            color=color, alpha=0.8, label=f"{SIMULATED['fa4kernel']}{', causal' if causal else ''}")
        axc.plot([lo, top], [lo, top], "k--", linewidth=0.8, label="y = x")
        axc.set_xlim(lo, top)
        axc.set_ylim(lo, top)
        axc.legend(fontsize=7)
    else:
        axc.text(0.5, 0.5, "no in-kernel clock recorded", ha="center", va="center", transform=axc.transAxes)
    c = s["clock"]
    axc.set_title("clock: predicted vs the clock-probe build's in-kernel clock" +
                  (f"\nmedian |err| {c['median_abs_error']:.1%} over {c['count']} configurations" if c else ""),
                  fontsize=8)
    axc.set_xlabel("measured in-kernel clock (GHz)")
    axc.set_ylabel("predicted clock (GHz)")
    axc.grid(alpha=0.3)
    return save(fig, ax, path)
