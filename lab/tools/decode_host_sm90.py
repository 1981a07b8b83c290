"""Where the host time of one decode call goes: fa4kernel.attention_with_kvcache against torch SDPA
at a few decode problems, its wall time in a tight loop, the host's and the GPU's share of it, and
the host cost taken apart (kind "decode_host").

    python3 lab/tools/decode_host_sm90.py --out $OUT/decode_host_h200.json       # the two default rows
    python3 lab/tools/decode_host_sm90.py --problem b=1,sq=1,sk=131072,h=32,kv=8 --out ...
    python3 lab/tools/decode_host_sm90.py --dry-run                              # the rows, no GPU

Rows: by default b4-q1-k65536-h8-kv1 (the MQA row) and b1-q1-k2048-h32-kv8 (the grid's smallest),
the two rows of lab/campaigns/decode-sm90/ whose eager time was the host's; --rows names rows of
bench_decode_sm90.py (ROWS, GRID; '' for none), --problem b=B,sq=SQ,sk=SK,h=H,kv=KV[,d=D][,causal]
adds your own (repeatable; the decode bench's syntax). bf16, full caches (cache_seqlens=None), the
bench's own calls (bench_decode_sm90.candidates: fa4kernel.kvcache[auto], sdpa), so a row here
joins that campaign's files on "point".

Per row and candidate (fa4kernel.kvcache[auto], sdpa):
  wall_us    --calls calls back to back, no sync between them, one torch.cuda.synchronize at the
             end: the time per call a decode loop sees (median of --repeats loops);
  host_us    the host's time to enqueue one call while the GPU sleeps (torch.cuda._sleep first:
             the queue never fills, no call waits on the GPU), --part-calls calls;
  gpu_us     the GPU's time per call over those queued calls (CUDA events after the sleep): back to
             back, no host time in it (attn_host_sm90.measure);
  graph_us   GRAPH_CALLS calls captured in one CUDA graph, replayed (bench_decode_sm90.time_graph);
  kernels    every kernel one call launches and its GPU time (torch.profiler, attn_host_sm90.kernels).
  How to read them: wall_us ~ host_us > gpu_us: host-bound (the time per call is the host's, and
  says nothing of the kernels); wall_us ~ gpu_us > host_us: the GPU sets the pace.

For fa4kernel also its host cost taken apart:
  cprofile   cProfile of --profile-calls calls (GPU asleep): the top 25 functions by cumulative and
             by own (tottime) time, us per call of the entry point, and ncalls (cProfile's overhead
             inflates every Python frame; the ranking is what it is for, not the sum);
  parts      host_us of each piece attention_with_kvcache runs per call, called alone on the same
             inputs (perf_counter around --part-calls calls, GPU asleep, median of --repeats), in
             call order: the signature key and its lookup, the device's SM count, the plan (an
             lru_cache hit), the kept seqused_k, the q pack view, each allocation, the decode launch
             (with validate_device, interface.run_decode and the compiled TVM-FFI function alone
             inside it) and the combine launch (its compiled function alone). group "whole": the
             whole call, timed among its parts; "per_call": the call runs it (their sum is beside
             the whole call's host_us, "unaccounted" the rest);
             "within:X": a piece of X; "once_per_signature": _check, which a call runs only for a
             new signature (what that cache saves); "reference": one torch elementwise launch, a
             yardstick for a launch's host cost. A launching part's gpu_us: its kernel's GPU time
             alone, back to back (the decode build, the combine).

Needs a Hopper GPU (sm_90); exits 2 with one line where there is none (--dry-run runs anywhere).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from lab.tools.bench_decode_sm90 import GRID, ROWS, Row, parse_problem  # noqa: E402

DEFAULT_ROWS = ("b4-q1-k65536-h8-kv1", "b1-q1-k2048-h32-kv8")
CANDIDATES = ("fa4kernel.kvcache[auto]", "sdpa")
TOP = 25  # cProfile rows kept per ranking


def plan_of(row: Row, sms: int) -> dict:
    """attention_with_kvcache's plan for the row (kvcache.decode_plan), as plain data."""
    from fa4kernel import kvcache

    p = kvcache.decode_plan(row.batch, row.seqlen_q, row.seqlen_cache, row.heads, row.heads_kv, row.hdim,
                            "bfloat16", row.causal, None, sms)
    return {"num_splits": p["num_splits"], "combine": p["combine"], "packed_view": p["packed_view"],
            "rows": p["rows"], "group": p["group"], "tile_m": p["cfg"].tile_m, "tile_n": p["cfg"].tile_n}


def host_parts(q, k, v, causal: bool) -> list:
    """[(name, group, call)]: the pieces attention_with_kvcache(q, k, v, causal=causal) runs per
    call, each callable alone on the same inputs (module docstring, "parts"). The launches are
    looked up on kvcache when called (the CPU tests replace them); the pieces inside them
    (validate_device, interface.run_*, the compiled functions) only where q is on a CUDA device."""
    import torch

    from fa4kernel import interface, kvcache
    from fa4kernel.inputs import device_props, validate_device

    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    cuda = q.device.type == "cuda"
    args = (q, k, v, None, causal, None, None, False)
    key = kvcache._call_key(*args)
    sms = device_props(q.device).multi_processor_count if cuda else kvcache.DEFAULT_SMS
    dtype = "bfloat16" if q.dtype == torch.bfloat16 else "float16"
    plan = kvcache.decode_plan(b, sq, sk, h, hkv, d, dtype, causal, None, sms)
    cfg, g, ns, rows = plan["cfg"], plan["group"], plan["num_splits"], plan["rows"]
    seqused = kvcache._full_lengths(b, sk, q.device)
    qp = kvcache.pack(q, hkv)
    parts = [
        ("attention_with_kvcache (the whole call)", "whole",
         lambda: kvcache.attention_with_kvcache(q, k, v, causal=causal)),
        ("_call_key (the call signature's key)", "per_call", lambda: kvcache._call_key(*args)),
        ("_CHECKED.get (checked-signature lookup)", "per_call", lambda: kvcache._CHECKED.get(key)),
    ]
    if cuda:
        parts.append(("device_props(q.device).multi_processor_count", "per_call",
                      lambda: device_props(q.device).multi_processor_count))
    parts += [
        ("decode_plan (lru_cache hit)", "per_call",
         lambda: kvcache.decode_plan(b, sq, sk, h, hkv, d, dtype, causal, None, sms)),
        ("_full_lengths (the kept seqused_k)", "per_call", lambda: kvcache._full_lengths(b, sk, q.device)),
        ("pack(q) (packed rows)", "per_call", lambda: kvcache.pack(q, hkv)),
    ]
    empty_out = lambda: torch.empty_like(q, memory_format=torch.contiguous_format)  # noqa: E731
    empty_lse = lambda: torch.empty((b, h, sq), dtype=torch.float32, device=q.device)  # noqa: E731
    allocs = [("alloc: out (torch.empty_like q)", "per_call", empty_out),
              ("alloc: lse (torch.empty, fp32)", "per_call", empty_lse)]
    out, lse = empty_out(), empty_lse()
    if plan["combine"]:  # the call's order: partials, decode, out and lse, combine
        n_o = ns * b * rows * hkv * d
        n_all = n_o + ns * b * hkv * rows
        scratch = torch.empty(n_all, dtype=torch.float32, device=q.device)
        o_acc, lse_acc = scratch[:n_o].view(ns * b, rows, hkv, d), scratch[n_o:].view(ns * b, hkv, rows)
        dec_out, dec_lse, dec_ns = o_acc, lse_acc, ns
        parts += [
            ("alloc: partials (torch.empty, fp32)", "per_call",
             lambda: torch.empty(n_all, dtype=torch.float32, device=q.device)),
            ("views: out_accum, lse_accum of the partials", "per_call",
             lambda: (scratch[:n_o].view(ns * b, rows, hkv, d), scratch[n_o:].view(ns * b, hkv, rows))),
        ]
    else:  # out and lse first, the decode writes them through their packed views
        dec_out, dec_lse, dec_ns = kvcache.pack(out, hkv), lse.view(b, hkv, rows), 1
        parts += allocs + [("views: pack(out), lse.view", "per_call",
                            lambda: (kvcache.pack(out, hkv), lse.view(b, hkv, rows)))]
    decode = lambda: kvcache.launch_decode(cfg, qp, k, v, dec_out, dec_lse, seqused, g, dec_ns, None)  # noqa: E731
    parts.append(("launch_decode (validate_device + interface.run_decode)", "per_call", decode))
    if cuda:
        decode()  # compiled and cached before its pieces are taken
        parts += [("validate_device", "within:launch_decode", lambda: validate_device(qp, k, v)),
                  ("interface.run_decode", "within:launch_decode",
                   lambda: interface.run_decode(cfg, qp, k, v, dec_out, dec_lse, seqused, g, dec_ns, None))]
        fn, scale = interface._CACHE.get(cfg), interface._scale_log2(q, None)
        if interface._USE_TVM_FFI and fn is not None:
            parts.append(("compiled decode function (TVM-FFI call: arguments, TMA descriptors, launch)",
                          "within:interface.run_decode",
                          lambda: fn(qp, k, v, dec_out, dec_lse, seqused, g, dec_ns, scale)))
    if plan["combine"]:
        combine = lambda: kvcache.launch_combine(o_acc, lse_acc, out, lse, g, ns)  # noqa: E731
        parts += allocs + [("launch_combine (interface.run_combine)", "per_call", combine)]
        if cuda:
            combine()
            fc = interface._CACHE.get(("combine", dtype, d))
            if interface._USE_TVM_FFI and fc is not None:
                parts.append(("compiled combine function (TVM-FFI call: arguments, launch)", "within:launch_combine",
                              lambda: fc(o_acc, lse_acc, out, lse, g, ns)))
    parts.append(("_check (the full checks; run once per call signature)", "once_per_signature",
                  lambda: kvcache._check(*args)))
    one = torch.ones(1, device=q.device)
    parts.append(("reference: one torch elementwise launch (x.mul_(1.0), 1 element)", "reference",
                  lambda: one.mul_(1.0)))
    return parts


def _where(path: str) -> str:
    """A profiled function's file, short: relative to the repository or to site-packages."""
    if path.startswith(ROOT + os.sep):
        return os.path.relpath(path, ROOT)
    i = path.find("site-packages" + os.sep)
    return path[i + len("site-packages") + 1:] if i >= 0 else path


def profile_summary(stats, calls: int, top: int = TOP) -> dict:
    """A pstats.Stats of `calls` calls as data: us per call (of the entry point) in all, and the
    `top` functions by cumulative and by own time, each with its calls per entry-point call."""
    rows = []
    for (path, line, name), (cc, nc, tt, ct, _callers) in stats.stats.items():
        where = f"{_where(path)}:{line}({name})" if line else name  # line 0: a builtin
        rows.append({"function": where, "ncalls_per_call": nc / calls, "primitive_calls": cc,
                     "tottime_us": tt / calls * 1e6, "cumtime_us": ct / calls * 1e6})
    by = lambda k: sorted(rows, key=lambda r: -r[k])[:top]  # noqa: E731
    return {"calls": calls, "us_per_call": stats.total_tt / calls * 1e6,
            "top_cumulative": by("cumtime_us"), "top_tottime": by("tottime_us")}


def cprofile(torch, fn, calls: int) -> dict:
    """profile_summary of `calls` calls of fn, the GPU asleep so no call waits on it."""
    import cProfile
    import pstats

    from lab.tools.train_gpt_sm90 import SLEEP_CYCLES

    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    torch.cuda._sleep(SLEEP_CYCLES)
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    return profile_summary(pstats.Stats(prof), calls)


def wall(torch, fn, calls: int, repeats: int) -> dict:
    """wall_us: `calls` calls back to back, no sync between them, one synchronize at the end
    (perf_counter around loop + sync); the median of `repeats` loops."""
    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return {"wall_us": statistics.median(per), "wall_us_min": min(per), "wall_calls": calls}


def host_gpu(fn, calls: int, repeats: int) -> dict:
    """attn_host_sm90.measure (host_us with the GPU asleep, gpu_us of the queued calls), the
    median of `repeats`."""
    from lab.tools.attn_host_sm90 import measure

    ms = [measure(fn, calls) for _ in range(repeats)]
    med = lambda k: statistics.median(m[k] for m in ms)  # noqa: E731
    return {"host_us": med("host_us"), "host_us_min": min(m["host_us"] for m in ms), "gpu_us": med("gpu_us"),
            "host_calls": calls}


def time_parts(parts, calls: int, repeats: int) -> dict:
    """host_us of each part (host_gpu), and gpu_us (a launching part's kernel alone, back to
    back; about 0 for the others); the per-call parts' host_us summed."""
    out = []
    for name, group, call in parts:
        r = host_gpu(call, calls, repeats)
        out.append({"name": name, "group": group, "host_us": r["host_us"], "host_us_min": r["host_us_min"],
                    "gpu_us": r["gpu_us"]})
    return {"parts": out, "sum_per_call_us": sum(p["host_us"] for p in out if p["group"] == "per_call")}


def run_row(torch, row: Row, args, errors: dict) -> dict:
    from fa4kernel.inputs import device_props
    from lab.tools.attn_host_sm90 import kernels
    from lab.tools.bench_decode_sm90 import candidates, row_inputs, time_graph

    q, k, v = row_inputs(torch, row)
    rec = {"name": row.name, "point": row.name, "batch": row.batch, "seqlen_q": row.seqlen_q,
           "seqlen_cache": row.seqlen_cache, "heads": row.heads, "heads_kv": row.heads_kv, "hdim": row.hdim,
           "causal": row.causal, "kv_bytes": row.kv_bytes,
           "plan": plan_of(row, device_props(q.device).multi_processor_count), "results": {}}
    every = candidates(torch, row, q, k, v, [], errors)
    cands = {name: every[name] for name in CANDIDATES}
    outs = {name: fn() for name, fn in cands.items()}
    torch.cuda.synchronize()
    a, s = outs[CANDIDATES[0]].float(), outs["sdpa"].float()
    rec["rel_error_vs_sdpa"] = ((a - s).norm() / s.norm()).item()
    for name, fn in cands.items():
        r = {**wall(torch, fn, args.calls, args.repeats), **host_gpu(fn, args.part_calls, args.repeats)}
        try:
            r.update(time_graph(torch, fn, args.repeats, 20.0))
        except Exception as e:  # not capturable: the eager numbers stand
            r["graph_error"] = repr(e)[:300]
        r["kernels"] = kernels(fn)
        rec["results"][name] = r
        print(f"  {name:24s} wall {r['wall_us']:7.1f} us  host {r['host_us']:6.1f}  gpu {r['gpu_us']:7.1f}"
              + (f"  graph {r['graph_us']:7.1f}" if "graph_us" in r else "") + "  kernels: "
              + ", ".join(f"{n[:36]} {t}" for n, t in r["kernels"]), flush=True)
    ours = cands[CANDIDATES[0]]
    rec["cprofile"] = cprofile(torch, ours, args.profile_calls)
    br = time_parts(host_parts(q, k, v, row.causal), args.part_calls, args.repeats)
    br["whole_call_host_us"] = next(p["host_us"] for p in br["parts"] if p["group"] == "whole")
    br["unaccounted_us"] = br["whole_call_host_us"] - br["sum_per_call_us"]
    rec["host_breakdown"] = br
    print(f"  cProfile: {rec['cprofile']['us_per_call']:.1f} us per call under the profiler; top own time: "
          + ", ".join(f"{r['function'].rsplit('/', 1)[-1][:48]} {r['tottime_us']:.1f}"
                      for r in rec["cprofile"]["top_tottime"][:5]), flush=True)
    for p in br["parts"]:
        print(f"    {p['host_us']:6.2f} us  {p['group']:28s} {p['name']}", flush=True)
    print(f"    {br['sum_per_call_us']:6.2f} us  per-call parts' sum; whole call {br['whole_call_host_us']:.2f} us "
          f"(unaccounted {br['unaccounted_us']:.2f})", flush=True)
    del q, k, v, outs, a, s
    torch.cuda.empty_cache()
    return rec


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=None, help="the JSON to write (default: print only)")
    ap.add_argument("--dry-run", action="store_true", help="list the rows, their plans and what is measured; no GPU")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                    help="comma-separated row names of bench_decode_sm90.py (ROWS, GRID; default: "
                         f"{','.join(DEFAULT_ROWS)}; '' for none)")
    ap.add_argument("--problem", action="append", default=[], metavar="b=B,sq=SQ,sk=SK,h=H,kv=KV[,d=D][,causal]",
                    help="your own row (repeatable), after the --rows ones")
    ap.add_argument("--calls", type=int, default=1000, help="calls per wall-time loop (default 1000)")
    ap.add_argument("--part-calls", type=int, default=100,
                    help="calls queued per host_us / gpu_us measurement, of the whole call and of each part "
                         "(1-200: the GPU's sleep must outlast their host time; default 100)")
    ap.add_argument("--profile-calls", type=int, default=200, help="calls under cProfile (1-200; default 200)")
    ap.add_argument("--repeats", type=int, default=5, help="measurements per number; the median is kept (default 5)")
    args = ap.parse_args(argv)
    by_name = {r.name: r for r in ROWS + GRID}
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"--rows: unknown {', '.join(unknown)}; allowed: {', '.join(by_name)}")
    try:
        args.selected = [by_name[n] for n in names] + [parse_problem(s) for s in args.problem]
    except ValueError as e:
        ap.error(str(e))
    if not args.selected:
        ap.error("no rows: give --rows or --problem")
    if args.calls < 1 or args.repeats < 1:
        ap.error("--calls and --repeats must be >= 1")
    for flag in ("part_calls", "profile_calls"):
        if not 1 <= getattr(args, flag) <= 200:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: allowed 1-200")
    return args


def _host_cpu() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run:  # before any output: one line and exit 2 where there is no Hopper GPU
        from lab.tools.hopper import require_hopper

        require_hopper("decode_host_sm90.py", "--dry-run lists the rows without one")
    from fa4kernel import kvcache

    for row in args.selected:
        p = plan_of(row, kvcache.DEFAULT_SMS)
        print(f"{row.name}: {row.kv_bytes / 1e9:.3f} GB of K and V; plan at {kvcache.DEFAULT_SMS} SMs: "
              f"{p['num_splits']} splits, {p['rows']} packed rows per k/v head in a {p['tile_m']}-row tile, "
              f"combine {'yes' if p['combine'] else 'no'}", flush=True)
    if args.dry_run:
        print(f"candidates: {', '.join(CANDIDATES)} (wall_us over {args.calls} calls, host_us / gpu_us over "
              f"{args.part_calls}, graph_us, kernels); fa4kernel also: cProfile of {args.profile_calls} calls, "
              f"its per-call parts alone; medians of {args.repeats}")
        return 0
    import torch

    from fa4kernel import interface
    from lab.tools.bench_fwd_sm90 import _version, nvidia_smi
    from lab.tools.provenance import stamp

    meta = stamp({"device": torch.cuda.get_device_name(0),
                  "driver": nvidia_smi("driver_version").get("driver_version"), "host_cpu": _host_cpu(),
                  "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                               "cutlass_dsl": _version("nvidia-cutlass-dsl"),
                               "apache_tvm_ffi": _version("apache-tvm-ffi"),
                               "torch_c_dlpack_ext": _version("torch-c-dlpack-ext"),
                               "python": platform.python_version()},
                  "torch_dlpack_exchange_api": hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
                  "method": "bf16, full caches; wall_us: calls back to back, one synchronize at the end; host_us / "
                            "gpu_us: calls queued while the GPU sleeps (attn_host_sm90.measure); graph_us: "
                            "bench_decode_sm90.time_graph; parts: each piece of attention_with_kvcache alone, "
                            "host_us as above; medians of repeats",
                  "settings": {"calls": args.calls, "part_calls": args.part_calls,
                               "profile_calls": args.profile_calls, "repeats": args.repeats}}, "decode_host")
    errors: dict = {}
    rows = []
    for row in args.selected:
        print(row.name, flush=True)
        rows.append(run_row(torch, row, args, errors))
        meta["tvm_ffi_launches"] = bool(interface._USE_TVM_FFI)
        if args.out:
            with open(args.out, "w") as fh:
                json.dump({"meta": {**meta, "import_errors": errors}, "rows": rows}, fh, indent=1)
                fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
