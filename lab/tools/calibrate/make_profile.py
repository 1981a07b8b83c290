"""Turn run_all.py's raw results into a fa4sim hardware profile (fa4sim/hardware.py format).

    python3 -m lab.tools.calibrate.make_profile RESULTS.json --base h100 --out fa4sim/profiles/h100.json

Measured parameters get the value, source "measured on <device> by lab/tools/calibrate/<script>
(<details>; lab/campaigns/<campaign>/)" (no date: the campaign's README keeps it) and confidence
"M"; every other parameter keeps the base profile's value, source and confidence. CPU only:
imports nothing GPU-related.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from lab.tools.index import campaign_of

PROFILE_DIR = Path(__file__).resolve().parents[3] / "fa4sim" / "profiles"

# wgmma shape whose latency / issue numbers go into the profile (FA's hdim-128 GEMMs)
PROFILE_N = 128


def _num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _fit(xs, ys):
    """Least-squares line y = a + b x -> (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def _r(x, nd=1):
    return int(round(float(x))) if nd == 0 else round(float(x), nd)


def derive(results: dict) -> dict:
    """{param: (value, script, details)} for every parameter the results support."""
    b = results.get("benchmarks", {})
    scripts = results.get("scripts", {})
    meta = results.get("meta", {})
    out = {}

    def put(param, value, bench, details, nd=1):
        if _num(value) and value >= 0:
            out[param] = (_r(value, nd), scripts.get(bench, f"bench_{bench}.py"), details)

    # ---- clock under tensor load
    c = b.get("clock") or {}
    if _num(c.get("clock_ghz_median")):
        put("clock_ghz", c["clock_ghz_median"], "clock",
            f"clock64 / globaltimer over a {c.get('event_ms', 0) / 1e3:.1f} s wgmma SS m64n{c.get('N')}k16 loop on all "
            f"{c.get('ctas')} SMs x {c.get('warpgroups_per_cta')} warpgroups, median over warpgroups; "
            f"min {_r(c.get('clock_ghz_min', 0), 3)}, max {_r(c.get('clock_ghz_max', 0), 3)}; "
            f"from CUDA events {_r(c.get('ghz_from_events', 0), 3)} GHz; {_r(c.get('tflops_events', 0), 0)} dense "
            f"BF16 TFLOP/s meanwhile", nd=3)

    # ---- chip facts reported by the driver
    if _num(meta.get("num_sms")):
        out["num_sms"] = (int(meta["num_sms"]), "run_all.py", "multiprocessor count reported by torch")
    if _num(meta.get("l2_bytes")) and meta["l2_bytes"] > 0:
        out["l2_bytes"] = (int(meta["l2_bytes"]), "run_all.py", "L2_cache_size reported by torch")

    # ---- pipes
    p = b.get("pipes") or {}
    def pipe(op, key):
        return _get(p, op, key)
    if _num(pipe("ffma", "lanes_per_clk")):
        put("fma_lanes_per_clk", pipe("ffma", "lanes_per_clk"), "pipes",
            "FFMA, 1024 threads x 8 independent chains, one CTA")
    if _num(pipe("ffma", "latency_cycles")):
        put("fma_latency", pipe("ffma", "latency_cycles"), "pipes", "dependent FFMA chain, one warp", nd=2)
    if _num(pipe("ex2", "lanes_per_clk")):
        put("mufu_ex2_per_clk", pipe("ex2", "lanes_per_clk"), "pipes",
            "MUFU.EX2 (ex2.approx.ftz.f32), 1024 threads x 8 independent chains, one CTA", nd=2)
    if _num(pipe("ex2", "latency_cycles")):
        put("mufu_latency", pipe("ex2", "latency_cycles"), "pipes", "dependent MUFU.EX2 chain, one warp", nd=2)
    if _num(pipe("fmnmx", "lanes_per_clk")):
        f2 = pipe("f2fp", "lanes_per_clk")
        extra = f"; F2FP.BF16.F32.PACK_AB measured {_r(f2, 1)} lane-ops/clk" if _num(f2) else ""
        lat = pipe("fmnmx", "latency_cycles")
        extra += f"; FMNMX dependent latency {_r(lat, 2)} cycles" if _num(lat) else ""
        lat2 = pipe("f2fp", "latency_cycles")
        extra += f", F2FP {_r(lat2, 2)}" if _num(lat2) else ""
        put("alu_lanes_per_clk", pipe("fmnmx", "lanes_per_clk"), "pipes",
            "FMNMX (max.f32), 1024 threads x 8 independent chains" + extra)

    # ---- shared memory
    s = b.get("smem") or {}
    if _num(s.get("bytes_per_clk")):
        put("smem_bytes_per_clk", s["bytes_per_clk"], "smem", "LDS.128 streams, 1024 threads, conflict-free, one CTA")
    if _num(s.get("latency_cycles")):
        put("smem_latency", s["latency_cycles"], "smem", "LDS.32 pointer chase, one warp")

    # ---- barriers
    y = b.get("sync") or {}
    v = _get(y, "named_pingpong", "cycles_per_handoff")
    if _num(v):
        full = _get(y, "bar_sync_all", "cycles_per_handoff")
        put("named_barrier_latency", v, "sync",
            "bar.arrive -> bar.sync hand-off between 2 warpgroups (ping-pong, half a round trip)"
            + (f"; a full 256-thread bar.sync back to back costs {_r(full)} cycles" if _num(full) else ""))
    v = _get(y, "mbarrier_pingpong_trywait", "cycles_per_handoff")
    if _num(v):
        spin = _get(y, "mbarrier_pingpong_testwait", "cycles_per_handoff")
        put("mbarrier_latency", v, "sync",
            "mbarrier.arrive -> try_wait (cute.arch.mbarrier_wait) resumes, warp 0 <-> warp 4 ping-pong, half a round trip"
            + (f"; with a test_wait spin {_r(spin)} cycles" if _num(spin) else ""))

    # ---- wgmma
    w = b.get("wgmma") or {}
    best = None
    rows = []
    for name, r in w.items():
        for nwg, t in (_get(r, "throughput") or {}).items():
            if _num(t.get("flops_per_clk")):
                rows.append(f"{name} {nwg}WG {t['cycles_per_instr']:.1f} c/instr")
                if best is None or t["flops_per_clk"] > best[0]:
                    best = (t["flops_per_clk"], name, nwg, t["cycles_per_instr"])
    if best:
        put("tensor_flops_per_clk", best[0], "wgmma",
            f"best sustained wgmma rate, {best[1]} with {best[2]} warpgroup(s) issuing: {best[3]:.1f} cycles per "
            f"m64nNk16; all: " + ", ".join(rows), nd=0)
    for src, param in (("ss", "mma_latency_ss"), ("rs", "mma_latency_rs")):
        lat = _get(w, f"{src}_n{PROFILE_N}", "latency")
        if not lat:
            continue
        nks = sorted(int(k) for k in lat)
        ys = [lat[str(k)]["complete_median"] for k in nks]
        if len(nks) >= 2 and all(_num(v) for v in ys):
            a, slope = _fit(nks, ys)
            others = []
            for n in (64, 128, 256):
                l2 = _get(w, f"{src}_n{n}", "latency")
                if l2:
                    ks = sorted(int(k) for k in l2)
                    a2, b2 = _fit(ks, [l2[str(k)]["complete_median"] for k in ks])
                    others.append(f"N={n}: {a2:.0f} + {b2:.1f}/instr")
            put(param, a, "wgmma",
                f"issue -> wait_group(0) done for nk = {nks} chained m64n{PROFILE_N}k16 {src.upper()} from one warpgroup "
                f"(medians {ys} cycles), fit {a:.0f} + {slope:.1f} x nk: the intercept; " + "; ".join(others))
    lat = _get(w, f"ss_n{PROFILE_N}", "latency")
    if lat:
        ks = sorted(int(k) for k in lat if int(k) <= 4)
        if len(ks) >= 2:
            _, slope = _fit(ks, [lat[str(k)]["issue_median"] for k in ks])
            iss = {int(k): v["issue_median"] for k, v in lat.items()}
            put("mma_issue_cycles", slope, "wgmma",
                f"clock64 before the first and after the commit of nk chained m64n{PROFILE_N}k16 SS wgmma from one "
                f"warpgroup, median cycles by nk: {dict(sorted(iss.items()))}; slope of a line fit over nk <= 4",
                nd=1)
    # queue depth: once the issuing warpgroup runs D instructions ahead of the tensor core, the
    # issue of instruction k waits for the completion of instruction k - D. With completion
    # times a + b k (the fit above), issue(nk) ~ a + b (nk - D) in the stalled regime, so
    # D ~ nk - (issue(nk) - a) / b at the largest nk. Taken from the widest shape (clearest).
    for name in ("ss_n256", "rs_n256", f"ss_n{PROFILE_N}"):
        lat = _get(w, name, "latency")
        if not lat:
            continue
        n = int(name.split("_n")[1])
        ks = sorted(int(k) for k in lat)
        if len(ks) < 3:
            continue
        a, bb = _fit(ks, [lat[str(k)]["complete_median"] for k in ks])
        k1, k0 = ks[-1], ks[-2]
        step = (lat[str(k1)]["issue_median"] - lat[str(k0)]["issue_median"]) / (k1 - k0)
        curve = {k: lat[str(k)]["issue_median"] for k in ks}
        if step > n / 4 and bb > 0:  # issue is stalled at the largest nk
            d = k1 - (lat[str(k1)]["issue_median"] - a) / bb
            out["mma_queue_depth"] = (int(round(d)), scripts.get("wgmma", "bench_wgmma.py"),
                                      f"issue time (clock64 before the first wgmma to after the commit) of nk chained "
                                      f"m64n{n}k16 {name[:2].upper()} wgmma by nk: {curve} cycles; beyond a few "
                                      f"instructions each issue waits a full interval ({step:.0f} cycles at nk={k1}); "
                                      f"completion {a:.0f} + {bb:.1f} nk, so issue(nk) = completion(nk - D) gives "
                                      f"D = {d:.2f}")
        break

    # ---- TMA
    t = b.get("tma") or {}
    tl = t.get("latency") or {}
    for kind, param in (("l2", "l2_latency"), ("hbm", "hbm_latency")):
        pts = []
        for key, v in tl.items():
            if key.startswith("seq_") and _num(v.get(f"{kind}_median")):
                pts.append((int(key[4:-2]) * 1024, v[f"{kind}_median"]))
        if len(pts) >= 2:
            pts.sort()
            a, slope = _fit([x for x, _ in pts], [y for _, y in pts])
            far = {k[4:]: v.get(f"{kind}_median") for k, v in tl.items() if k.startswith("far_")}
            put(param, a, "tma",
                f"one TMA request at a time (64x64 bf16 boxes, mbarrier complete_tx) of "
                f"{', '.join(f'{x // 1024} KB: {y}' for x, y in pts)} cycles (median, "
                f"{'tiles just loaded' if kind == 'l2' else 'cold after a 512 MB flush, consecutive tiles'}); "
                f"fit intercept (fixed latency) {a:.0f}, then {1 / slope if slope > 0 else float('inf'):.0f} B/clk; "
                f"tiles 32 MB apart: {far}", nd=0)
    ring = [(v, k) for k in ("sm_l2", "sm_l2_spin") if _num(v := _get(t, k, "bytes_per_clk"))]
    if ring:
        v, k = max(ring)
        put("tma_bytes_per_clk", v, "tma",
            f"one CTA keeps {t[k].get('bytes_in_flight', 0) // 1024} KB of 8 KB TMA boxes in flight over a 1 MB "
            f"L2-resident region (ring waits: " + ", ".join(f"{'test_wait spin' if kk.endswith('spin') else 'try_wait'} "
                                                               f"{_r(vv)} B/clk" for vv, kk in ring) +
            f"); with all SMs loading L2 hits each SM gets {_r(_get(t, 'chip_l2', 'per_sm_bytes_per_clk_median') or 0)} B/clk")
    if _num(_get(t, "chip_l2", "tbps")):
        put("l2_bandwidth_tbps", t["chip_l2"]["tbps"], "tma",
            "every SM streams TMA boxes from the same 2 MB (L2 hits), CUDA-event timed", nd=2)
    d2d = t.get("d2d_copy_tbps")
    if _num(d2d):
        tma_hbm = _get(t, "chip_hbm", "tbps")
        put("hbm_bandwidth_tbps", d2d, "tma",
            "torch device-to-device copy of 1 GiB, bytes read + written over CUDA-event time (5 copies)"
            + (f"; TMA reads alone, every SM streaming its own share of {t['chip_hbm'].get('bytes', 0) / 1e9:.2f} GB "
               f"once after an L2 flush: {_r(tma_hbm, 2)} TB/s (a single short pass, launch and ramp included)"
               if _num(tma_hbm) else ""), nd=2)

    # ---- launch gap
    lg = b.get("launch") or {}
    if _num(_get(lg, "cute_empty", "gpu_side_us")):
        put("launch_gap_us", lg["cute_empty"]["gpu_side_us"], "launch",
            f"CUDA events around 200 back-to-back launches of an empty CuTe-DSL kernel queued behind a "
            f"sleep kernel (GPU-side gap); torch 1-element add: {_r(_get(lg, 'torch_add_1elem', 'gpu_side_us') or 0, 2)} us; "
            f"host-bound plain loop: cute {_r(_get(lg, 'cute_empty', 'host_loop_us') or 0, 2)} us, "
            f"torch {_r(_get(lg, 'torch_add_1elem', 'host_loop_us') or 0, 2)} us", nd=2)
    if _num(_get(lg, "cute_empty_pdl", "gpu_side_us")):
        graph = _get(lg, "cute_empty_pdl_graph_us")
        put("pdl_launch_gap_us", lg["cute_empty_pdl"]["gpu_side_us"], "launch",
            "CUDA events around 200 back-to-back programmatic dependent launches (use_pdl) of the empty "
            "kernel, each letting the next launch at its start (griddepcontrol.launch_dependents) and "
            "waiting for the one before (griddepcontrol.wait), queued behind a sleep kernel"
            + (f"; replayed from a CUDA graph: {_r(graph, 2)} us (plain launches "
               f"{_r(_get(lg, 'cute_empty_graph_us') or 0, 2)} us)" if _num(graph) else ""), nd=2)
    return out


def build_profile(results: dict, base: dict, name: str | None = None, skip=(),
                  campaign: str = "lab/campaigns/unit-calibration/") -> dict:
    """The profile: `base` with every parameter the results measure. Sources and description name
    the device, the tool and the campaign folder (lab.tools.index.campaign_of), no date or driver:
    fa4sim carries none (tests/test_layout.py); the campaign's README keeps them."""
    meta = results.get("meta", {})
    device = meta.get("device", "unknown device")
    params = {k: dict(v) for k, v in base["params"].items()}
    # a measured profile's own base (a re-measured parameter) says so once
    said = (f"unit parameters measured on {device} by lab/tools/calibrate ({campaign}: the dates, driver and "
            f"versions), the rest from the {base['name']} profile")
    # with a power model, clock_ghz is the maximum clock and the model predicts the one a kernel
    # holds: the clock measured under one load does not replace it
    powered = (params.get("power_cap_w") or {}).get("value", 0) > 0
    for param, (value, script, details) in derive(results).items():
        if param not in params or param in skip or (powered and param == "clock_ghz"):
            continue
        params[param] = {
            "value": value,
            "source": f"measured on {device} by lab/tools/calibrate/{script} ({details}; {campaign})",
            "confidence": "M",
        }
    return {
        "name": name or base["name"].removesuffix("-datasheet"),
        "arch": base["arch"],
        "description": base.get("description", "") if said in base.get("description", "")
        else f"{base.get('description', '')}; {said}",
        "params": params,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--base", default="h100-datasheet", help="base profile name (fa4sim/profiles/NAME.json) or a .json path")
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default=None)
    ap.add_argument("--skip", default="", help="comma-separated parameters to keep from the base profile "
                                               "even where the results have a value")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    unknown = skip - set(json.loads((PROFILE_DIR / "h100.json").read_text())["params"])
    if unknown:
        ap.error(f"unknown parameters in --skip: {sorted(unknown)}")
    base_path = Path(args.base) if args.base.endswith(".json") else PROFILE_DIR / f"{args.base}.json"
    base = json.loads(base_path.read_text())
    results = json.loads(Path(args.results).read_text())
    prof = build_profile(results, base, args.name, skip, campaign_of(args.results, "unit-calibration"))
    Path(args.out).write_text(json.dumps(prof, indent=1) + "\n")
    n = sum(1 for v in prof["params"].values() if v["source"].startswith("measured on"))
    print(f"wrote {args.out}: {n} of {len(prof['params'])} parameters measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
