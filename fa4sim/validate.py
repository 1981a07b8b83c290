"""Predicted vs measured: replay every point of a recorded GPU benchmark through the simulator.

    fa4sim validate benchmarks/results/sm90_fwd_<device>_<date>.json [--hw h100-measured.json]

The benchmark JSON (benchmarks/bench_fwd_sm90.py) holds, per point, the problem, our kernel's
knobs and the measured TFLOP/s of each implementation. Our kernel is simulated with its knobs;
flash-attn-4's SM90 forward with the fa3 schedule's defaults (its own tile choices per head dim),
one CTA per tile (PEER_KNOBS).
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
CTA-log build for launches of one CTA per tile; in older files only persistent launches, whose
probe CTA 0 lives as long as the launch).
`at_profile_clock=True` forces the profile's clock everywhere.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from . import hardware
from .errors import InputError
from .launch_replay import is_cta_log_file
from .engine import simulate as engine_simulate
from .model import simulate
from .schedules.pv_wait_sm90 import fractions as pv_wait_fractions
from .params import Problem, resolve
from .schedules import fa3_sm90

SIMULATED = {"fa4kernel": "our SM90 kernel", "flash-attn-4": "flash-attn-4 SM90"}
# flash-attn-4 4.0.0b36's SM90 forward launches one CTA per tile, causal or not
# (flash_fwd_sm90.py: SingleTileScheduler / SingleTileLPTScheduler, is_persistent=False)
# and its KV loop has fewer bookkeeping instructions (fa3_sm90.BOOKKEEPING: counted in its SASS)
PEER_KNOBS = {"persistent": False, "loop_overhead_fixed": 60.0, "loop_overhead_per_kstep": 2.5,
              "tile_order": "flash-attn-4"}
KNOB_NAMES = {"tile_m", "tile_n", "kv_stages", "pingpong", "intra_wg_overlap", "p_in_registers",
              "exp_emulation", "rescale_threshold", "rescale_before_pv", "early_q_release",
              "defer_o_store_wait"}


PV_WAIT = ("model", "sass")


def compiled_pv_wait(kernel: str, problem: Problem, knobs: dict) -> dict:
    """The knobs max/fma/mufu_before_pv for where `kernel`'s compiled loop waits for the previous
    block's PV GEMM (fa4sim/schedules/pv_wait_sm90.py; its default build where the variant is not
    in the table)."""
    frac = pv_wait_fractions(kernel, problem.hdim, problem.causal, knobs)
    return {f"{pipe}_before_pv": v for pipe, v in frac.items()}


def profile_for(device: str) -> str:
    """Built-in profile for a device name, preferring a measured one if it exists."""
    d = device.lower()
    base = "h200" if "h200" in d else "h100" if "h100" in d else "b200" if "b200" in d else None
    if base is None:
        raise InputError("hw", f"cannot tell the profile for device {device!r}; pass --hw")
    measured = f"{base}-measured"
    return measured if measured in hardware.available() else base


# variants bench_fwd_sm90.py records beside a point's default run, and what they change
VARIANT_KNOBS = {"1 tile/CTA": {"persistent": False}, "persistent=True": {"persistent": True}}
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
            config = {**config, **VARIANT_KNOBS.get(name, {})}
            base = "default" if p.get("label") == "knobs" else p.get("label", "main")
            # its own clock where its probe and the baseline's each span their launch: files that
            # say so probe a launch of one CTA per tile with the CTA log (every CTA); before that
            # the probe read CTA 0, which there lives for the first tile only
            spans = p.get("clock_probes_span_launch") or (
                config.get("persistent") and (p.get("fa4kernel_config") or {}).get("persistent", True))
            own = {"clock_ghz_in_kernel": clocks[name]} if name in clocks and spans else {}
            out.append({**keep, **own, "label": name, "baseline": base if name != "default" else None,
                        "results": {"fa4kernel": res}, "fa4kernel_config": config})
    return out


def kernel_knobs(point: dict) -> dict:
    """Our kernel's configuration as it ran (its resolved config when recorded, else the knobs given)."""
    cfg = dict(point.get("knobs") or {})
    cfg.update(point.get("fa4kernel_config") or {})
    knobs = {k: v for k, v in cfg.items() if k in KNOB_NAMES | {"persistent"}}
    if knobs.get("rescale_threshold") in (0, 0.0):  # the kernel's 0 means "always rescale"
        knobs["rescale_threshold"] = None
    # the kernel idles warpgroups without rows since the change that also brought the
    # rescale_before_pv knob: configs recorded since then carry that field; before it, the
    # kernel always rescaled O after the PV wait
    knobs["skip_idle_wgs"] = "rescale_before_pv" in cfg
    knobs.setdefault("rescale_before_pv", False)
    # before the early_q_release field the kernel handed Q back after a tile's whole KV loop
    knobs.setdefault("early_q_release", False)
    # ... and, before defer_o_store_wait, waited for each O store right after issuing it
    knobs.setdefault("defer_o_store_wait", False)
    # older files without the resolved config: fa4kernel runs persistent CTAs when O gets its
    # own smem buffer (fa4kernel/README.md), otherwise one CTA per tile. (Files of 2026-11-22
    # before the host tile schedule record it: causal was then one CTA per tile by default.)
    if "tile_m" in knobs and "hdim" in point and "persistent" not in knobs:
        prob = Problem(1, 1, 128, 128, int(point["hdim"]), bool(point["causal"]))
        k = resolve(fa3_sm90.KNOBS, prob, knobs)
        knobs["persistent"] = fa3_sm90._o_fits(prob, k)
    return knobs


def load(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError("results", f"no such file: {path}") from None
    except json.JSONDecodeError as e:
        raise InputError("results", f"{path} is not JSON ({e.msg})") from None
    if is_cta_log_file(doc):
        return doc
    if "meta" not in doc or not ("points" in doc or is_idle_wg_file(doc) or is_tile_cost_file(doc)):
        raise InputError("results", f"{path} is not a benchmark results file (needs 'meta' and 'points', "
                                    "'cases' of benchmarks/idle_wg_sm90.py, 'tile_costs' of ctas_sm90.py --only-tiles "
                                    "or the 'ctas' of cta_log_sm90.py)")
    return doc


def compare(doc: dict, hw: str | None = None, at_profile_clock: bool = False, pv_wait: str = "model") -> dict:
    """pv_wait='sass': every build with the PV wait where ptxas put it (a what-if: the model's
    default is the order it was validated with, the whole row max before the wait, the rest after)."""
    if pv_wait not in PV_WAIT:
        raise InputError("pv_wait", f"must be one of {', '.join(PV_WAIT)}, got {pv_wait!r}")
    hw = hw or profile_for(doc["meta"].get("device", ""))
    rows = []
    for p in expand(doc["points"]):
        clock = None if at_profile_clock else p.get("clock_ghz_in_kernel")
        problem = Problem(int(p["batch"]), int(p["heads"]), int(p["seqlen"]), int(p.get("seqlen_k", p["seqlen"])),
                          int(p["hdim"]), bool(p["causal"]))
        for impl, res in p.get("results", {}).items():
            if impl not in SIMULATED or "tflops" not in res:
                continue
            knobs = kernel_knobs(p) if impl == "fa4kernel" else dict(PEER_KNOBS)
            if pv_wait == "sass":
                knobs.update(compiled_pv_wait(impl, problem, knobs))
            try:
                r = simulate(hw, "fa3", problem, {**knobs, **({"clock_ghz": clock} if clock else {})})
                sim, err = r.tflops, (r.tflops - res["tflops"]) / res["tflops"]
                why = r.bottleneck
            except InputError as e:
                sim, err, why = None, None, str(e)
            rows.append({"impl": impl, "label": p.get("label", "main"), "baseline": p.get("baseline"),
                         "batch": problem.batch, "heads": problem.heads,
                         "seqlen": problem.seqlen_q, "hdim": problem.hdim, "causal": problem.causal,
                         "knobs": knobs, "measured_tflops": res["tflops"], "predicted_tflops": sim,
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
    return {"summary": summary, "points": rows, "knob_deltas": knob_deltas(rows)}


# fa4kernel's ablation builds (KernelConfig.ablate) and the fa3 schedule's matching what-ifs
ABLATION_KNOBS = {"max": {"free_row_max": True}, "exp": {"free_exp2": True}, "sum": {"free_row_sum": True},
                  "rescale": {"rescale_rate": 0.0}}


def is_interval_file(doc: dict) -> bool:
    """benchmarks/ctas_sm90.py output: exact steady-state cycles per KV block, not TFLOP/s."""
    return bool(doc.get("points")) and "cycles_per_kv_block" in doc["points"][0]


def compare_intervals(doc: dict, hw: str | None = None) -> dict:
    """Steady-state cycles per KV block, measured (clock-probe build, two K lengths: prologue and
    epilogue cancel, and no clock conversion at all) vs simulated, for every configuration and
    CTA count of a ctas_sm90.py file; plus each knob variant's change against 'default' at the
    same CTA count (the per-SM knob effect, free of clock and power changes)."""
    hw = hw or profile_for(doc["meta"].get("device", ""))
    rows, cache, no_twin = [], {}, []
    known = {k.name for k in fa3_sm90.KNOBS}
    for p in doc["points"]:
        ablate = [a for a in (p.get("ablate") or "").split(",") if a]
        knobs = dict(p.get("knobs") or {})
        # builds the simulator has no twin of: the wgmma skeleton, ablations without a what-if
        # knob (the vote ablations), kernel knobs it does not model (a prototype since removed)
        if (p.get("variant") == "skip_softmax" or any(a not in ABLATION_KNOBS for a in ablate)
                or any(k not in known for k in knobs)):
            no_twin.append(p.get("variant", "?"))
            continue
        hd, n, pattern = int(p["hdim"]), int(p["n_ctas"]), p.get("pattern", "shared")
        for a in ablate:  # the kernel's ablation = a what-if knob
            knobs.update(ABLATION_KNOBS[a])
        if p.get("exp_before_pv_wait"):  # the diagnostic build that keeps the exp2s ahead of the PV wait
            knobs["exp_overlaps_pv"] = True
        # the tiles the kernel ran, and where it rescaled O (files before that field: after the PV wait)
        knobs.setdefault("tile_m", int(p["tile_m"]))
        knobs.setdefault("tile_n", int(p["tile_n"]))
        knobs.setdefault("rescale_before_pv", bool(p.get("rescale_before_pv", False)))
        knobs.setdefault("early_q_release", bool(p.get("early_q_release", False)))
        knobs.setdefault("defer_o_store_wait", bool(p.get("defer_o_store_wait", False)))
        key = (hd, bool(p.get("causal", False)), json.dumps(knobs, sort_keys=True))
        if key not in cache:
            sk = int(doc["meta"]["seqlens_k"][-1])
            r = simulate(hw, "fa3", Problem(1, 1, int(p["tile_m"]), sk, hd, bool(p.get("causal", False))), knobs)
            cache[key] = r.interval
        sim = cache[key]
        meas = p["cycles_per_kv_block"]
        rows.append({"hdim": hd, "causal": bool(p.get("causal", False)), "n_ctas": n, "pattern": pattern,
                     "variant": p.get("variant", "default"), "knobs": knobs, "measured_cycles": meas, "predicted_cycles": sim,
                     "error": (sim - meas) / meas if sim else None})
    deltas = []
    for r in rows:
        if r["variant"] == "default" or r["pattern"] != "shared":
            continue
        b = next((x for x in rows if x["variant"] == "default" and x["hdim"] == r["hdim"] and x["causal"] == r["causal"]
                  and x["n_ctas"] == r["n_ctas"] and x["pattern"] == "shared"), None)
        if b is None or not b["predicted_cycles"] or not r["predicted_cycles"]:
            continue  # no periodic regime found in the simulated blocks: no interval to compare
        # as a change of throughput (cycles per key down = faster), like the TFLOP/s deltas; per
        # key, not per block, so a variant with another tile_n compares fairly
        keys = r["knobs"]["tile_n"] / b["knobs"]["tile_n"]
        meas = keys * b["measured_cycles"] / r["measured_cycles"] - 1
        pred = keys * b["predicted_cycles"] / r["predicted_cycles"] - 1
        deltas.append({"knob": r["variant"], "hdim": r["hdim"], "causal": r["causal"], "n_ctas": r["n_ctas"],
                       "measured_delta": meas,
                       "predicted_delta": pred, "same_sign": (meas >= 0) == (pred >= 0) or abs(meas) < 0.005,
                       "difference_pp": 100 * (pred - meas)})
    shared = [abs(r["error"]) for r in rows if r["error"] is not None and r["pattern"] == "shared"]
    summary = {"hw_profile": hw, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
               "median_abs_error": statistics.median(shared) if shared else None,
               "max_abs_error": max(shared) if shared else None, "points": len(shared),
               "not_simulated": [v for v in no_twin if v != "skip_softmax"]}
    return {"summary": summary, "intervals": rows, "knob_deltas": deltas}


def is_idle_wg_file(doc: dict) -> bool:
    """benchmarks/idle_wg_sm90.py output: cost of a tile whose warpgroups are not all live."""
    return bool(doc.get("cases")) and "ratio_to_full" in doc["cases"][0]


def compare_idle_wg(doc: dict, hw: str | None = None) -> dict:
    """A tile with `live` of its consumer warpgroups holding rows, relative to a full tile:
    measured (one persistent CTA walking the file's heads x one tile each, event time) vs the
    fa3 schedule with skip_idle_wgs on the same walk (one SM, cycles)."""
    hw_name = hw or profile_for(doc["meta"].get("device", ""))
    one_sm = hardware.load(hw_name).with_values(num_sms=1)
    heads, sk = int(doc["meta"]["heads"]), int(doc["meta"]["seqlen_k"])
    rows = []
    for c in doc["cases"]:
        hd, tm = int(c["head_dim"]), int(c["tile_m"])
        knobs = {"tile_m": tm, "tile_n": 128, "skip_idle_wgs": True, "persistent": True}
        cyc = {live: simulate(one_sm, "fa3", Problem(1, heads, 64 * live, sk, hd, False), knobs).cycles
               for live in range(1, tm // 64 + 1)}
        for live in range(1, tm // 64):
            meas = float(c["ratio_to_full"][str(live)] if str(live) in c["ratio_to_full"] else c["ratio_to_full"][live])
            pred = cyc[live] / cyc[tm // 64]
            rows.append({"hdim": hd, "tile_m": tm, "live": live, "warpgroups": tm // 64,
                         "measured_ratio": meas, "predicted_ratio": pred, "difference": pred - meas})
    worst = max((abs(r["difference"]) for r in rows), default=None)
    return {"summary": {"hw_profile": hw_name, "device": doc["meta"].get("device"), "date": doc["meta"].get("date"),
                        "max_abs_difference": worst, "cases": len(rows)}, "cases": rows}


def report_idle_wg(result: dict) -> str:
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


def is_tile_cost_file(doc: dict) -> bool:
    """benchmarks/ctas_sm90.py --only-tiles output: what a whole tile costs a persistent CTA."""
    return bool(doc.get("tile_costs")) and "cycles_per_tile" in doc["tile_costs"][0]


def compare_tile_costs(doc: dict, hw: str | None = None) -> dict:
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
    rows = []
    for t in doc["tile_costs"]:
        hd, blocks = int(t["hdim"]), int(t["kv_blocks"])
        knobs = {"tile_m": int(t["tile_m"]), "tile_n": int(t["tile_n"]), **(t.get("knobs") or {})}
        walks = sorted(int(n) for n in t["cycles_by_tiles"])
        t1, t2 = walks[0], walks[-1]
        problem = Problem(1, 1, knobs["tile_m"] * t2, blocks * knobs["tile_n"], hd, False)
        resolved = resolve(fa3_sm90.KNOBS, problem, knobs)
        fa3_sm90.check(profile, problem, resolved)
        schedule = fa3_sm90.build(profile, problem, resolved, blocks, 0)
        ends = {n: engine_simulate(schedule, [blocks] * n).end for n in (t1, t2)}
        pred = (ends[t2] - ends[t1]) / (t2 - t1)
        meas = float(t["cycles_per_tile"])
        rows.append({"hdim": hd, "kv_blocks": blocks, "variant": _variant_name(t.get("knobs") or {}),
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
    return {"summary": summary, "tiles": rows, "lines": lines}


def _variant_name(knobs: dict) -> str:
    return "+".join(f"{k}={v}" for k, v in knobs.items()) or "default"


def report_tile_costs(result: dict) -> str:
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


def _verdict(d: dict) -> str:
    return f"{'same sign' if d['same_sign'] else 'WRONG SIGN'}, off by {d['difference_pp']:+.1f} pp"


def report_intervals(result: dict) -> str:
    s = result["summary"]
    lines = [f"device {s['device']} ({s['date']}), profile {s['hw_profile']}: steady-state cycles per KV block "
             "(clock-probe build; 'own' = every CTA its own K/V, from HBM: a chip-level limit)"]
    lines.append(f"{'hd':>4s} {'CTAs':>5s} {'K/V':>6s} {'variant':24s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for r in result["intervals"]:
        pred = (f"{r['predicted_cycles']:9.0f} {r['error']:+7.1%}" if r["predicted_cycles"]
                else f"{'no period':>9s} {'':>7s}")  # the simulated blocks never settled
        lines.append(f"{r['hdim']:4d} {r['n_ctas']:5d} {r['pattern']:>6s} {r['variant']:24s} {r['measured_cycles']:9.0f} "
                     + pred)
    if s["median_abs_error"] is not None:
        lines.append(f"shared K/V: median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%} over {s['points']} points")
    if s.get("not_simulated"):
        lines.append("not simulated (builds without a model twin): " + ", ".join(s["not_simulated"]))
    if result["knob_deltas"]:
        lines.append("per-SM knob deltas (throughput change vs default at the same CTA count, measured / predicted):")
        for d in result["knob_deltas"]:
            lines.append(f"  {d['knob']:24s} hd{d['hdim']:<3d}{' causal' if d.get('causal') else '       '} "
                         f"{d['n_ctas']:3d} CTAs {d['measured_delta']:+7.1%} / {d['predicted_delta']:+7.1%}  {_verdict(d)}")
    return "\n".join(lines)


def knob_scoreboard(results: list[dict]) -> dict:
    """The per-SM knob deltas of several ctas_sm90.py files together: how many have the right sign
    and lie within 3 percentage points, per head dim and causal or not, and overall."""
    groups: dict = {}
    for res in results:
        for d in res["knob_deltas"]:
            for key in ("all", f"hd{d['hdim']}{' causal' if d.get('causal') else ''}"):
                g = groups.setdefault(key, {"deltas": 0, "same_sign": 0, "within_3pp": 0})
                g["deltas"] += 1
                g["same_sign"] += bool(d["same_sign"])
                g["within_3pp"] += abs(d["difference_pp"]) <= 3.0
    return groups


def report_scoreboard(groups: dict, files: int) -> str:
    lines = [f"per-SM knob deltas over {files} files: right sign / within 3 pp"]
    for key in sorted(groups, key=lambda k: (k == "all", k)):
        g = groups[key]
        lines.append(f"  {key:12s} {g['same_sign']:3d} / {g['within_3pp']:3d} of {g['deltas']}")
    return "\n".join(lines)


def plot_knob_deltas(results: list[dict], path: str) -> str:
    """Measured vs predicted per-SM knob deltas (ctas_sm90.py files), the +-3 pp band around y = x."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    ds = [d for res in results for d in res["knob_deltas"]]
    lim = max([abs(100 * d[k]) for d in ds for k in ("measured_delta", "predicted_delta")] + [5.0]) * 1.1
    ax.fill_between([-lim, lim], [-lim - 3, lim - 3], [-lim + 3, lim + 3], color="0.9", label="within 3 pp")
    ax.plot([-lim, lim], [-lim, lim], "k--", linewidth=0.8, label="y = x")
    colors = {64: "#4C72B0", 128: "#55A868", 256: "#C44E52"}
    for hd in sorted({d["hdim"] for d in ds}):
        for causal, marker in ((False, "o"), (True, "^")):
            sel = [d for d in ds if d["hdim"] == hd and bool(d.get("causal")) == causal]
            if sel:
                ax.scatter([100 * d["measured_delta"] for d in sel], [100 * d["predicted_delta"] for d in sel],
                           color=colors.get(hd, "0.4"), marker=marker, alpha=0.8,
                           label=f"hd{hd}{', causal' if causal else ''}")
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    devices = sorted({str(res["summary"]["device"]) for res in results})
    g = knob_scoreboard(results).get("all", {"deltas": 0, "same_sign": 0, "within_3pp": 0})
    ax.set_title(f"per-SM knob deltas, one CTA ({', '.join(devices)})\n"
                 f"right sign {g['same_sign']} / {g['deltas']}, within 3 pp {g['within_3pp']} / {g['deltas']}",
                 fontsize=8)
    ax.set_xlabel("measured throughput change vs default (%)")
    ax.set_ylabel("predicted throughput change vs default (%)")
    return _save(fig, ax, path)


def plot_tile_costs(result: dict, path: str) -> str:
    """Error of the predicted cycles per tile against the tile's KV blocks, one line per head dim
    and knob variant (ctas_sm90.py --only-tiles files), with a +-5 % band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    return _save(fig, ax, path, loc="upper left", bbox_to_anchor=(1.01, 1.0))


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


def _save(fig, ax, path: str, **legend) -> str:
    """The validation plots' common finish: legend (extra keywords place it), grid, PNG at 120 dpi."""
    import matplotlib.pyplot as plt

    ax.legend(fontsize=7, **legend)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot(result: dict, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax.set_title(f"predicted vs measured on {s['device']} ({(s['date'] or '')[:10]})\n"
                 f"profile {s['hw_profile']}, clock {s.get('clock', '')}; median |err| {med:.1%}"
                 if med is not None else "no points", fontsize=8)
    ax.set_xlabel("measured TFLOP/s")
    ax.set_ylabel("predicted TFLOP/s")
    return _save(fig, ax, path)


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
                         f"{d['measured_delta']:+7.1%} / {d['predicted_delta']:+7.1%}  {_verdict(d)}")
    return "\n".join(lines)
