"""Measured timelines of fa4kernel's SM90 forward: device script.

    python3 lab/tools/timeline_sm90.py --out DIR [--cta N]

Runs the instrumented build (KernelConfig.trace: clock64 stamps of one CTA per warp role, per
KV iteration and phase) on bf16 random inputs, batch 2, heads 16, seqlen 8192, non-causal:
hd128 with default knobs, hd128 pingpong=False, hd128 intra_wg_overlap=False, hd64 default.
For each it writes DIR/timeline_<label>.json in fa4sim.timeline's stamp format (events of the
first TRACE_TILES tiles of the traced CTA; "tile" = the CTA's n-th tile) and checks that the
instrumented output matches the normal build's (relative error < 1e-2).

Needs a Hopper GPU, torch and cutlass-dsl; does NOT import fa4sim (simpy is not installed on
the device). Compare with the simulator on CPU: lab/tools/timeline_compare.py.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PROBLEM = dict(batch=2, heads=16, seqlen_q=8192, seqlen_k=8192, causal=False, dtype="bfloat16")
VARIANTS = [
    ("hd128", 128, {}),
    ("hd128_pingpong_off", 128, {"pingpong": False}),
    ("hd128_overlap_off", 128, {"intra_wg_overlap": False}),
    ("hd64", 64, {}),
]
# short tiles (only with --only): the benchmark's 1k point, whose time goes to tile turnover
SHORT = {"hd128_1k": (128, {}, dict(batch=16, seqlen_q=1024, seqlen_k=1024)),
         "hd128_1k_late_q": (128, {"early_q_release": False}, dict(batch=16, seqlen_q=1024, seqlen_k=1024)),
         # one CTA per tile, causal (the launch of lab/tools/cta_log_sm90.py): pick a CTA past the
         # first wave with --cta, e.g. 600 (its tile comes from the host's table); recorded as
         # lab/campaigns/timelines/tile_traces_h100_2026-11-22/ (tile ends, not a steady-state overlay)
         "hd256_1k_causal": (256, {}, dict(batch=16, heads=8, seqlen_q=1024, seqlen_k=1024, causal=True)),
         "hd128_1k_causal_1cta": (128, {"persistent": False},
                                  dict(batch=16, seqlen_q=1024, seqlen_k=1024, causal=True)),
         # a persistent hd256 CTA handing over between short tiles (O goes out through Q's buffer):
         # with --max-ctas 1 one CTA walks all 8 tiles of 4 blocks (the per-tile part that
         # ctas_sm90.py --only-tiles measures, stamped)
         "hd256_persistent_walk": (256, {"persistent": True}, dict(batch=1, heads=4, seqlen_q=256, seqlen_k=256)),
         # the same walk at hd128 over tiles of 2 blocks, with and without ping-pong (ping-pong costs
         # the kernel ~300 cycles per such tile that the model does not have)
         "hd128_walk_2blocks": (128, {}, dict(batch=1, heads=4, seqlen_q=256, seqlen_k=256)),
         "hd128_walk_2blocks_pingpong_off": (128, {"pingpong": False},
                                             dict(batch=1, heads=4, seqlen_q=256, seqlen_k=256)),
         # the varlen bench's 64 x 332 dense twin (tiles of 1-3 KV blocks, causal), which fa4sim
         # prices above its measured time: a persistent CTA's walk over those tiles
         "hd128_332_causal": (128, {}, dict(batch=64, heads=16, seqlen_q=332, seqlen_k=332, causal=True))}
REL_ERR_MAX = 1e-2


def _version(pkg):
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:
        return None


def _git_commit():
    try:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except Exception:
        return None


def hw_profile_for(device_name: str) -> str:
    """The fa4sim profile to compare with ('h200' on an H200, else 'h100')."""
    return "h200" if "H200" in device_name.upper() else "h100"


def rel_err(out, ref) -> float:
    d = (out.float() - ref.float()).norm().item()
    n = ref.float().norm().item()
    return d / max(n, 1e-30)


def build_doc(label, head_dim, knobs, cfg, dec, device_name, cta, extra_meta, problem=PROBLEM):
    """The stamps JSON (fa4sim.timeline format) of one variant from fa4kernel.trace.decode()."""
    from fa4kernel import trace_layout as tl

    resolved = {k: v for k, v in cfg.as_dict().items()
                if k not in ("dtype", "head_dim", "causal", "has_lse", "trace")}
    problem = dict(problem, hdim=head_dim)
    meta = {
        "label": label,
        "device": device_name,
        "hw_profile": hw_profile_for(device_name),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "problem": problem,
        "knobs": resolved,
        "knobs_given": knobs,
        "config": cfg.as_dict(),
        "schedule": "fa3",
        "cta": cta,
        "which_cta": f"blockIdx.x == {cta} (persistent: its tiles {cta}, {cta} + grid, ...; "
                     f"the first {tl.TRACE_TILES} are recorded, 'tile' = local index)",
        "clock_ghz_in_kernel": dec["clock_ghz_in_kernel"],
        "kernel_cycles_on_cta": dec["kernel_cycles"],
        "kernel_ns_on_cta": dec["kernel_ns"],
        "trace_header": dec["header"],
        "tiles_recorded": dec["tiles_recorded"],
        "partial_pairs_dropped": dec["partial_pairs_dropped"],
        "time_origin": "clock64 of thread 0 of the traced CTA at kernel start (fa4sim rebases to the first stamp)",
        "stamps": ("one thread per role (producer warp 0 lane 0; thread 0 of each consumer WG; "
                   "warp 4 lane 0 for the O store). load: LK/LV/LQ start = stage acquired (TMA "
                   "issue), end = TMA issued. wg{w}: QK start = wgmma issue, end = wait for S; "
                   "PV start = issue, end = its wait; MAX = row max; EXP = exp2 + row sum; "
                   "CVT = P -> bf16 (regs or smem); RESC = O rescale; FIN = normalize + O -> smem; "
                   "PP = ping-pong arrive. epilogue: ST = TMA store of O. 'waits': WAIT_K/WAIT_V "
                   "(consumer: full barrier; producer: empty stage), WAIT_PP (ping-pong barrier), "
                   "MASK (seqlen/causal mask; the simulator models it only for masked blocks)"),
        "trace_build_note": ("the instrumented build computes all rows' max before all rows' exp2 "
                             "(to stamp between them); the normal build interleaves per row"),
    }
    meta.update(extra_meta)
    from lab.tools.provenance import stamp
    return {"meta": stamp(meta, "timeline"), "events": dec["events"], "waits": dec["waits"]}


def run_variant(label, head_dim, knobs, q, k, v, cta, reps, device_name, problem=PROBLEM):
    import torch

    import fa4kernel
    from fa4kernel import trace as ftrace
    from fa4kernel import make_config
    from fa4kernel.interface import attention_traced

    cfg = make_config(problem["dtype"], head_dim, problem["causal"], False, knobs)
    t0 = time.perf_counter()
    ref = fa4kernel.attention(q, k, v, causal=problem["causal"], **knobs)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    out, stamps = attention_traced(q, k, v, causal=problem["causal"], trace_cta=cta, **knobs)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    # the recorded run: caches warm, kernels compiled
    out, stamps = attention_traced(q, k, v, causal=problem["causal"], trace_cta=cta, **knobs)
    torch.cuda.synchronize()
    err = rel_err(out, ref)
    identical = bool(torch.equal(out, ref))
    words = stamps.cpu().tolist()

    def timed(fn):
        fn()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps

    ms_plain = timed(lambda: fa4kernel.attention(q, k, v, causal=problem["causal"], **knobs))
    ms_trace = timed(lambda: attention_traced(q, k, v, causal=problem["causal"], trace_cta=cta, **knobs))

    dec = ftrace.decode(words, cfg.num_consumer_wgs, pingpong=cfg.pingpong, mask_as_event=False)
    if not dec["events"]:
        raise RuntimeError(f"{label}: no stamps recorded (is CTA {cta} in the grid? header {dec['header']})")
    b, s, h = problem["batch"], problem["seqlen_q"], problem["heads"]
    flops = 4.0 * b * h * s * problem["seqlen_k"] * head_dim
    extra = {
        "rel_err_vs_normal_build": err,
        "bitwise_equal_to_normal_build": identical,
        "ms_normal_build": ms_plain,
        "ms_trace_build": ms_trace,
        "tflops_normal_build": flops / (ms_plain * 1e-3) / 1e12,
        "tflops_trace_build": flops / (ms_trace * 1e-3) / 1e12,
        "first_call_s": {"normal": round(t1 - t0, 3), "trace": round(t2 - t1, 3)},
        "sm_count": torch.cuda.get_device_properties(q.device).multi_processor_count,
        "versions": dict(torch=torch.__version__, cuda=torch.version.cuda,
                         cutlass_dsl=_version("nvidia-cutlass-dsl"), python=platform.python_version(),
                         fa4lab_commit=_git_commit()),
    }
    doc = build_doc(label, head_dim, knobs, cfg, dec, device_name, cta, extra, problem)
    return doc, err


def summary_line(doc) -> str:
    from fa4kernel import trace as ftrace

    m = doc["meta"]
    it = ftrace.interval(doc["events"], "QK0", tile=0)
    ghz = m["clock_ghz_in_kernel"]
    ns = f"{it / ghz:.1f} ns" if (it and ghz) else "?"
    ghz_s = f"{ghz:.3f}" if ghz else "?"
    return (f"{m['label']:<20} QK0 interval {it} cycles ({ns}) | clock {ghz_s} GHz | "
            f"{m['tflops_normal_build']:.0f} TFLOP/s normal, {m['tflops_trace_build']:.0f} trace | "
            f"rel err {m['rel_err_vs_normal_build']:.2e}"
            f"{' (bitwise equal)' if m['bitwise_equal_to_normal_build'] else ''} | "
            f"{len(doc['events'])} events, tiles {m['tiles_recorded']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for timeline_<label>.json")
    ap.add_argument("--cta", type=int, default=0, help="blockIdx.x of the CTA to trace (default 0)")
    ap.add_argument("--reps", type=int, default=10, help="timed calls per build (overhead check)")
    ap.add_argument("--max-ctas", type=int, default=None,
                    help="cap the persistent grid (1: one CTA walks every tile; fa4kernel.interface.MAX_CTAS)")
    ap.add_argument("--only", default=None, help="comma-separated labels (default: all but the short-tile "
                    "ones: " + ", ".join(SHORT) + ")")
    args = ap.parse_args(argv)
    from lab.tools.hopper import require_hopper

    require_hopper("timeline_sm90.py")

    import torch

    os.makedirs(args.out, exist_ok=True)
    if args.max_ctas is not None:
        if args.max_ctas < 1:
            sys.exit(f"timeline_sm90: --max-ctas {args.max_ctas}; allowed: an integer >= 1")
        from fa4kernel import interface

        interface.MAX_CTAS = args.max_ctas
    device_name = torch.cuda.get_device_name(0)
    torch.manual_seed(0)
    failures = []
    t_start = time.perf_counter()
    inputs = {}
    todo = [(label, hd, knobs, PROBLEM) for label, hd, knobs in VARIANTS]
    todo += [(label, hd, knobs, dict(PROBLEM, **over)) for label, (hd, knobs, over) in SHORT.items()]
    for label, hd, knobs, problem in todo:
        if (args.only and label not in args.only.split(",")) or (not args.only and label in SHORT):
            continue
        b, s, h = problem["batch"], problem["seqlen_q"], problem["heads"]
        if (hd, b, s, h) not in inputs:
            inputs[hd, b, s, h] = [torch.randn(b, s, h, hd, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
        q, k, v = inputs[hd, b, s, h]
        try:
            doc, err = run_variant(label, hd, knobs, q, k, v, args.cta, args.reps, device_name, problem)
        except Exception as e:  # keep going: the other variants still get written
            import traceback

            traceback.print_exc()
            failures.append(f"{label}: {type(e).__name__}: {e}")
            continue
        path = os.path.join(args.out, f"timeline_{label}.json")
        with open(path, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        print(summary_line(doc), "->", path, flush=True)
        if not err < REL_ERR_MAX:
            failures.append(f"{label}: instrumented output differs from the normal build (rel err {err:.3e})")
    print(f"total {time.perf_counter() - t_start:.1f} s on {device_name}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
