"""Decode over a KV cache on an H100 or H200: a few new tokens per sequence against a long cache,
where the time is reading the cache (kind "decode").

Candidates, each on the same bf16 inputs at every row:
  fa4kernel.kvcache[auto]   fa4kernel.attention_with_kvcache, num_splits=None (its heuristic)
  fa4kernel.kvcache[N]      the same with num_splits=N (--splits, default 1,2,4,8,16,32)
  fa4kernel.attention       the plain forward (no pack-GQA, no split: one CTA per q head)
  flash-attn-3              flash_attn_interface.flash_attn_with_kvcache (tokenspeed-fa3), num_splits=0 (auto)
  flash-attn-4              flash_attn.cute.interface.flash_attn_func (its SM90 forward; no KV-cache entry)
  sdpa                      torch SDPA with enable_gqa (bottom-right causal through causal_lower_right)
  flash-attn-3[page=P]      with --pages: the same cache in pages of P tokens (their order shuffled),
                            flash_attn_with_kvcache(page_table=...)
  flash-attn-4[page=P]      flash_attn_varlen_func(seqused_k=..., page_table=...) on those pages
A candidate that cannot be imported or that raises is recorded with its error, and the run goes on.

Each candidate is checked once against an fp32 reference (relative error < 1e-2, no NaN), then
timed: --warmup calls, then --reps batches of back-to-back calls between two CUDA events (each
batch about --batch-ms of GPU time); us per call = the median batch. The calls are eager, so a
candidate whose host path is slower than its kernels is timed at its host rate (host_us_per_call
says how long the host took to enqueue one call). KV-read GB/s = batch x seqlen_cache x heads_kv
x head_dim x 2 (K and V) x 2 bytes / time. With --graph each candidate is also timed as a serving
engine runs a decode step: GRAPH_CALLS calls captured in one CUDA graph, replayed back to back
(graph_us, graph_kv_gbps: the GPU's time, the host's enqueue out of it).

Rows (--rows, default all five; name b x sq x sk hq/hkv [causal]):
  b1-q1-k131072-h32-kv8     b8-q1-k32768-h32-kv8     b64-q1-k4096-h64-kv8
  b4-q1-k65536-h8-kv1       b8-q4-k32768-h32-kv8-causal
--grid adds ten rows: batch 1-128 x cache 2k-256k, one new token, 32 / 8 heads, hd128 (GRID).
--problem b=B,sq=SQ,sk=SK,h=H,kv=KV[,d=D][,causal] adds your own (repeatable).

Usage (device, from the repository root):
    python3 lab/tools/bench_decode_sm90.py --out $OUT/decode_h200.json
    python3 lab/tools/bench_decode_sm90.py --rows b8-q1-k32768-h32-kv8 --splits 2,4 --out ...
    python3 lab/tools/bench_decode_sm90.py --dry-run        # the rows and candidates, no GPU
    python3 lab/tools/bench_decode_sm90.py --predict FILE   # fa4sim's predictions, no GPU

--predict FILE writes fa4sim's predictions (profile h200, or --profile h100; the power model's clock) for every
selected row, kind "predictions": flash-attn-3 (its implementation data: its num_splits heuristic
and pack-GQA rule; with --pages its paged rows, fa4sim's page_size), flash-attn-4 (its SM90
forward: no split-KV; paged too) and fa4kernel.kvcache[auto] (the
plan attention_with_kvcache picks at DEFAULT_SMS SMs: kvcache.decode_plan; pack-GQA, its splits
as fa4sim's num_splits; a row's "note" says what fa4sim cannot express of it). Each prediction
row's "point" and "kernel" are the measured file's row "point" and candidate
name, so the two files join on (point, kernel).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, replace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

REL_ERROR_LIMIT = 1e-2


@dataclass(frozen=True)
class Row:
    batch: int
    seqlen_q: int
    seqlen_cache: int
    heads: int
    heads_kv: int
    hdim: int = 128
    causal: bool = False

    @property
    def name(self) -> str:
        return (f"b{self.batch}-q{self.seqlen_q}-k{self.seqlen_cache}-h{self.heads}-kv{self.heads_kv}"
                + (f"-d{self.hdim}" if self.hdim != 128 else "") + ("-causal" if self.causal else ""))

    @property
    def kv_bytes(self) -> int:
        return self.batch * self.seqlen_cache * self.heads_kv * self.hdim * 2 * 2


ROWS = (Row(1, 1, 131072, 32, 8), Row(8, 1, 32768, 32, 8), Row(64, 1, 4096, 64, 8), Row(4, 1, 65536, 8, 1),
        Row(8, 4, 32768, 32, 8, causal=True))
# --grid: batch 1-128 x cache 2k-256k, one new token, Llama-style 32 / 8 heads, hd128; the largest
# cells hold 2M cached tokens (8.6 GB of K and V)
GRID = tuple(Row(b, 1, sk, 32, 8) for b, sk in ((1, 2048), (1, 32768), (1, 262144), (8, 2048), (8, 32768),
                                                 (8, 262144), (32, 8192), (32, 65536), (128, 2048), (128, 16384)))


def parse_problem(spec: str) -> Row:
    vals, causal = {}, False
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "causal":
            causal = True
            continue
        key, eq, val = part.partition("=")
        if not eq or key not in ("b", "sq", "sk", "h", "kv", "d") or not val.isdigit() or int(val) < 1:
            raise ValueError(f"--problem {spec!r}: {part!r}; allowed: b=, sq=, sk=, h=, kv=, d= (ints >= 1), causal")
        vals[key] = int(val)
    missing = [k for k in ("b", "sq", "sk", "h", "kv") if k not in vals]
    if missing:
        raise ValueError(f"--problem {spec!r}: give {', '.join(k + '=' for k in missing)}")
    if vals["h"] % vals["kv"]:
        raise ValueError(f"--problem {spec!r}: kv={vals['kv']} must divide h={vals['h']}")
    return Row(vals["b"], vals["sq"], vals["sk"], vals["h"], vals["kv"], vals.get("d", 128), causal)


def kvcache_plan(row: Row, sms: int) -> dict:
    """attention_with_kvcache's plan for `row` (bf16, full caches): kvcache.decode_plan (num_splits,
    packed rows, whether the combine runs)."""
    from fa4kernel import kvcache

    return kvcache.decode_plan(row.batch, row.seqlen_q, row.seqlen_cache, row.heads, row.heads_kv, row.hdim,
                               "bfloat16", row.causal, None, sms)


def auto_splits(row: Row, sms: int) -> int:
    """The num_splits attention_with_kvcache picks for `row` (bf16, full caches) on `sms` SMs."""
    return kvcache_plan(row, sms)["num_splits"]


def predict_rows(rows, sms: int = None, pages=(), *, profile: str) -> list:
    """fa4sim's predictions (on `profile`) for each row: flash-attn-3, flash-attn-4 (and their paged
    candidates, one per page size), fa4kernel.kvcache[auto]."""
    from fa4kernel import kvcache
    from fa4sim import Problem, simulate

    sms = sms or kvcache.DEFAULT_SMS
    out = []
    for row in rows:
        def rec(kernel, res, note=None):
            r = {"point": row.name, "kernel": kernel, "us": res.time_us, "kv_read_gbps": res.kv_read_gbps,
                 "num_splits": res.knobs.get("num_splits", 1), "pack_gqa": bool(res.knobs.get("pack_gqa")),
                 "clock_ghz": res.clock_ghz, "bottleneck": res.bottleneck}
            if note:
                r["note"] = note
            return r

        full = Problem(batch=row.batch, heads=row.heads, seqlen_q=row.seqlen_q, seqlen_k=row.seqlen_cache,
                       hdim=row.hdim, causal=row.causal, heads_kv=row.heads_kv)
        out.append(rec("flash-attn-3", simulate(profile, problem=full, impl="flash-attn-3")))
        out.append(rec("flash-attn-4", simulate(profile, problem=full, impl="flash-attn-4")))
        for page in pages:
            paged = replace(full, page_size=page)
            for impl in ("flash-attn-3", "flash-attn-4"):
                out.append(rec(f"{impl}[page={page}]", simulate(profile, problem=paged, impl=impl)))
        plan = kvcache_plan(row, sms)
        notes = []
        if plan["combine"]:
            notes.append("the combine launch (sm90/combine.py) is modelled as fa4sim's combine"
                         + ("; the packing copy of q is not modelled" if not plan["packed_view"] else ""))
        if row.causal and row.seqlen_q > 1:
            notes.append("causal packed rows (each row masked by its own token) modelled as fa4sim's causal")
        full = Problem(batch=row.batch, heads=row.heads, seqlen_q=row.seqlen_q, seqlen_k=row.seqlen_cache,
                       hdim=row.hdim, causal=row.causal, heads_kv=row.heads_kv)
        res = simulate(profile, problem=full, impl="fa4kernel",
                       overrides={"num_splits": plan["num_splits"], "pack_gqa": True})
        r = rec("fa4kernel.kvcache[auto]", res, "; ".join(notes) or None)
        r["num_splits"] = plan["num_splits"]
        out.append(r)
    return out


def write_predictions(path: str, rows, argv, pages, profile: str) -> dict:
    import subprocess

    from lab.tools.hopper import PROFILES

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    meta = {"kind": "predictions", "device": PROFILES[profile], "profile": profile,
            "model_commit": head.stdout.strip() or "unknown",
            "what": "fa4sim's decode predictions per row: flash-attn-3 (its num_splits heuristic and pack-GQA "
                    "rule), flash-attn-4 (SM90: no split-KV), fa4kernel.kvcache[auto] (attention_with_kvcache's "
                    "plan at 132 SMs: pack-GQA, its splits as num_splits); us at the power model's clock; "
                    "kv_read_gbps = K/V bytes over the whole time",
            "command": "python3 lab/tools/bench_decode_sm90.py " + " ".join(argv)}
    doc = {"meta": meta, "rows": predict_rows(rows, pages=pages, profile=profile)}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    return doc


def paged(torch, k, v, page: int, gen):
    """k, v (batch, seqlen_cache, heads_kv, d) as pages of `page` tokens in a shuffled order:
    (k_pages, v_pages (batch x pages, page, heads_kv, d), page_table (batch, pages) int32)."""
    b, sk = k.shape[:2]
    n = sk // page
    perm = torch.randperm(b * n, device=k.device, generator=gen)
    kp, vp = torch.empty((b * n, page, *k.shape[2:]), device=k.device, dtype=k.dtype), torch.empty(
        (b * n, page, *v.shape[2:]), device=v.device, dtype=v.dtype)
    kp[perm] = k.reshape(b * n, page, *k.shape[2:])
    vp[perm] = v.reshape(b * n, page, *v.shape[2:])
    return kp, vp, perm.view(b, n).to(torch.int32)


def paged_candidates(torch, row: Row, q, k, v, pages, errors: dict) -> dict:
    """With --pages: FlashAttention-3 and flash-attn-4 on the same cache in pages of each size."""
    out = {}
    gen = torch.Generator(device="cuda").manual_seed(1)
    lens = torch.full((row.batch,), row.seqlen_cache, device=q.device, dtype=torch.int32)
    cu_q = torch.arange(0, (row.batch + 1) * row.seqlen_q, row.seqlen_q, device=q.device, dtype=torch.int32)
    for page in pages:
        kp, vp, table = paged(torch, k, v, page, gen)
        try:
            from flash_attn_interface import flash_attn_with_kvcache as fa3

            def run_fa3(kp=kp, vp=vp, table=table):
                o = fa3(q, kp, vp, cache_seqlens=lens, page_table=table, causal=row.causal, num_splits=0)
                return o[0] if isinstance(o, tuple) else o

            out[f"flash-attn-3[page={page}]"] = run_fa3
        except Exception as e:
            errors[f"flash-attn-3[page={page}]"] = repr(e)
        try:
            from flash_attn.cute.interface import flash_attn_varlen_func as fa4

            def run_fa4(kp=kp, vp=vp, table=table):
                o = fa4(q.reshape(-1, *q.shape[2:]), kp, vp, cu_seqlens_q=cu_q, max_seqlen_q=row.seqlen_q,
                        seqused_k=lens, page_table=table, causal=row.causal)
                o = o[0] if isinstance(o, tuple) else o
                return o.view(q.shape)

            out[f"flash-attn-4[page={page}]"] = run_fa4
        except Exception as e:
            errors[f"flash-attn-4[page={page}]"] = repr(e)
    return out


def candidates(torch, row: Row, q, k, v, splits, errors: dict) -> dict:
    """name -> a no-argument call returning out (batch, seqlen_q, heads, d)."""
    import fa4kernel

    out = {"fa4kernel.kvcache[auto]": lambda: fa4kernel.attention_with_kvcache(q, k, v, causal=row.causal)}
    for n in splits:
        out[f"fa4kernel.kvcache[{n}]"] = (lambda n=n: fa4kernel.attention_with_kvcache(q, k, v, causal=row.causal,
                                                                                     num_splits=n))
    out["fa4kernel.attention"] = lambda: fa4kernel.attention(q, k, v, causal=row.causal)
    try:
        from flash_attn_interface import flash_attn_with_kvcache as fa3

        def run_fa3():
            o = fa3(q, k, v, causal=row.causal, num_splits=0)
            return o[0] if isinstance(o, tuple) else o

        out["flash-attn-3"] = run_fa3
    except Exception as e:  # keep the run going without it
        errors["flash-attn-3"] = repr(e)
    try:
        from flash_attn.cute.interface import flash_attn_func as fa4

        def run_fa4():
            o = fa4(q, k, v, causal=row.causal)
            return o[0] if isinstance(o, tuple) else o

        out["flash-attn-4"] = run_fa4
    except Exception as e:
        errors["flash-attn-4"] = repr(e)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    mask = None
    if row.causal and row.seqlen_q > 1:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(row.seqlen_q, row.seqlen_cache)

    def run_sdpa():
        o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
        return o.transpose(1, 2)

    out["sdpa"] = run_sdpa
    return out


def reference(torch, q, k, v, causal):
    b, sq, h, d = q.shape
    sk, g = k.shape[1], h // k.shape[2]
    out = torch.empty(b, sq, h, d, device=q.device, dtype=torch.float32)
    for r in range(b):  # row by row: the fp32 scores of one row at a time
        kk = k[r].float().repeat_interleave(g, dim=1)
        vv = v[r].float().repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[r].float(), kk) / math.sqrt(d)
        if causal:
            t = torch.arange(sq, device=q.device)[:, None]
            j = torch.arange(sk, device=q.device)[None, :]
            s = s.masked_fill(j > sk - sq + t, float("-inf"))
        out[r] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv)
    return out


def check_output(torch, out, ref) -> dict:
    """rel_error of out against the fp32 reference, and ok: finite, below REL_ERROR_LIMIT, no NaN."""
    err = ((out.float() - ref).norm() / ref.norm()).item()
    return {"rel_error": err,
            "ok": bool(math.isfinite(err) and err < REL_ERROR_LIMIT and not torch.isnan(out).any().item())}


def time_call(torch, fn, warmup: int, reps: int, batch_ms: float) -> dict:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    calls = max(1, min(2000, int(batch_ms / max((time.perf_counter() - t0) * 1e3, 1e-3))))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call, host = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        h0 = time.perf_counter()
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        host.append((time.perf_counter() - h0) / calls)
        torch.cuda.synchronize()
        per_call.append(s.elapsed_time(e) * 1e3 / calls)
    return {"us": statistics.median(per_call), "us_min": min(per_call), "calls_per_batch": calls,
            "host_us_per_call": statistics.median(host) * 1e6}


GRAPH_CALLS = 20  # calls captured in one CUDA graph (its replay's launch spread over them)


def time_graph(torch, fn, reps: int, batch_ms: float) -> dict:
    """The call as a serving engine runs a decode step: GRAPH_CALLS calls captured in one CUDA graph
    (after the eager warm-up has compiled and allocated), then replays back to back between two
    CUDA events: graph_us per call = the median batch. The host's enqueue is out of the time."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # a warm call on the capture stream (its workspace allocations)
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    replays = max(1, min(500, int(batch_ms / max((time.perf_counter() - t0) * 1e3, 1e-3))))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(reps):
        torch.cuda.synchronize()
        s.record()
        for _ in range(replays):
            graph.replay()
        e.record()
        torch.cuda.synchronize()
        per_call.append(s.elapsed_time(e) * 1e3 / (replays * GRAPH_CALLS))
    return {"graph_us": statistics.median(per_call), "graph_us_min": min(per_call), "graph_replays": replays}


def row_inputs(torch, row: Row):
    """A row's q (batch, seqlen_q, heads, hdim) and full K / V caches, bf16 on the GPU, seed 0."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q = torch.randn(row.batch, row.seqlen_q, row.heads, row.hdim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(row.batch, row.seqlen_cache, row.heads_kv, row.hdim, device="cuda", dtype=torch.bfloat16,
                    generator=gen)
    return q, k, torch.randn_like(k)


def run_row(torch, row: Row, args, errors: dict) -> dict:
    q, k, v = row_inputs(torch, row)
    ref = reference(torch, q, k, v, row.causal)
    rec = {"name": row.name, "point": row.name, "batch": row.batch, "seqlen_q": row.seqlen_q, "seqlen_cache": row.seqlen_cache,
           "heads": row.heads, "heads_kv": row.heads_kv, "hdim": row.hdim, "causal": row.causal,
           "kv_bytes": row.kv_bytes, "results": {}}
    from fa4kernel.inputs import device_props

    rec["auto_splits"] = auto_splits(row, device_props(q.device).multi_processor_count)
    cands = {**candidates(torch, row, q, k, v, args.splits, errors),
             **paged_candidates(torch, row, q, k, v, args.pages, errors)}
    for name, fn in cands.items():
        r = {}
        try:
            out = fn()
            torch.cuda.synchronize()
            r.update(check_output(torch, out, ref))
            r.update(time_call(torch, fn, args.warmup, args.reps, args.batch_ms))
            r["kv_gbps"] = row.kv_bytes / (r["us"] * 1e-6) / 1e9
            if args.graph:
                try:
                    r.update(time_graph(torch, fn, args.reps, args.batch_ms))
                    r["graph_kv_gbps"] = row.kv_bytes / (r["graph_us"] * 1e-6) / 1e9
                except Exception as e:  # a candidate that cannot be captured: its eager time stands
                    r["graph_error"] = repr(e)[:300]
        except Exception as e:
            r["error"] = repr(e)[:400]
        rec["results"][name] = r
        s = (f"{r['us']:8.1f} us {r['kv_gbps']:7.0f} GB/s" + ("" if r["ok"] else f" WRONG ({r['rel_error']:.1e})")
             + (f"   graph {r['graph_us']:8.1f} us {r['graph_kv_gbps']:7.0f} GB/s" if "graph_us" in r else "")
             if "us" in r else "error: " + r["error"][:80])
        print(f"  {name:26s} {s}", flush=True)
    del q, k, v, ref
    torch.cuda.empty_cache()
    return rec


def positive_ints(ap, flag: str, text: str) -> list:
    """'1,2,4' -> [1, 2, 4]; one line and exit 2 (ap.error) for anything but ints >= 1."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = [0]
    if any(n < 1 for n in out):
        ap.error(f"{flag} {text!r}: allowed comma-separated ints >= 1")
    return out


def parse_args(argv=None):
    from lab.tools.hopper import add_profile_arg

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=None, help="the JSON to write (default: print only)")
    ap.add_argument("--dry-run", action="store_true", help="list the rows and candidates; no GPU")
    ap.add_argument("--predict", default=None, metavar="FILE",
                    help="write fa4sim's predictions for the selected rows to FILE; no GPU")
    add_profile_arg(ap)
    ap.add_argument("--rows", default=None, help="comma-separated row names (default: all five)")
    ap.add_argument("--problem", action="append", default=[], metavar="b=B,sq=SQ,sk=SK,h=H,kv=KV[,d=D][,causal]",
                    help="your own row (repeatable), after the --rows ones")
    ap.add_argument("--grid", action="store_true", help="add the batch x cache grid (GRID: ten rows)")
    ap.add_argument("--splits", default="1,2,4,8,16,32",
                    help="fixed num_splits to time besides the heuristic's (comma-separated; '' for none)")
    ap.add_argument("--pages", default="",
                    help="page sizes (tokens, comma-separated) of paged-cache candidates of FlashAttention-3 and "
                         "flash-attn-4; each must divide every selected row's cache (default: none)")
    ap.add_argument("--graph", action="store_true",
                    help="also time each candidate replayed from a CUDA graph (as serving engines run decode: the "
                         "host's enqueue out of the time): graph_us, graph_kv_gbps")
    ap.add_argument("--warmup", type=int, default=20, help="calls before timing (compiles happen here)")
    ap.add_argument("--reps", type=int, default=15, help="timed batches per candidate; us = their median")
    ap.add_argument("--batch-ms", type=float, default=20.0, help="about this much time per timed batch")
    args = ap.parse_args(argv)
    args.splits = positive_ints(ap, "--splits", args.splits)
    by_name = {r.name: r for r in ROWS + GRID}
    names = [n.strip() for n in args.rows.split(",") if n.strip()] if args.rows else [r.name for r in ROWS]
    if args.grid:
        names += [r.name for r in GRID if r.name not in names]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"--rows: unknown {', '.join(unknown)}; allowed: {', '.join(by_name)}")
    try:
        args.selected = [by_name[n] for n in names] + [parse_problem(s) for s in args.problem]
    except ValueError as e:
        ap.error(str(e))
    args.pages = positive_ints(ap, "--pages", args.pages)
    for row in args.selected:
        bad = [n for n in args.pages if row.seqlen_cache % n]
        if bad:
            ap.error(f"--pages {','.join(map(str, bad))}: must divide the cache of row {row.name} ({row.seqlen_cache} "
                     f"tokens)")
    if args.warmup < 1 or args.reps < 1 or args.batch_ms <= 0:
        ap.error("--warmup and --reps must be >= 1, --batch-ms > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.predict:
        doc = write_predictions(args.predict, args.selected, sys.argv[1:] if argv is None else list(argv), args.pages,
                                args.profile)
        for r in doc["rows"]:
            print(f"{r['point']:32s} {r['kernel']:24s} {r['us']:8.1f} us {r['kv_read_gbps']:6.0f} GB/s "
                  f"splits {r['num_splits']}", flush=True)
        return 0
    for row in args.selected:
        print(f"{row.name}: {row.kv_bytes / 1e9:.3f} GB of K and V", flush=True)
    if args.dry_run:
        print("candidates: fa4kernel.kvcache[auto], " + "".join(f"fa4kernel.kvcache[{n}], " for n in args.splits)
              + "fa4kernel.attention, flash-attn-3, flash-attn-4, sdpa"
              + "".join(f", flash-attn-3[page={n}], flash-attn-4[page={n}]" for n in args.pages))
        return 0
    from lab.tools.hopper import require_hopper

    require_hopper("bench_decode_sm90.py", "--dry-run lists the rows without one")
    import torch

    from lab.tools.bench_fwd_sm90 import _version, nvidia_smi
    from lab.tools.provenance import stamp

    meta = stamp({"device": torch.cuda.get_device_name(0),
                  "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "clocks_before": nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu"),
                  "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                               "cutlass_dsl": _version("nvidia-cutlass-dsl"), "flash_attn_4": _version("flash-attn-4"),
                               "flash_attn_3": _version("tokenspeed-fa3"), "python": platform.python_version()},
                  "method": "eager back-to-back calls between CUDA events after warm-up; us = median batch; "
                            "kv_gbps = batch*seqlen_cache*heads_kv*hdim*2*2 bytes / time; bf16; checked against fp32",
                  "settings": {"warmup": args.warmup, "reps": args.reps, "batch_ms": args.batch_ms,
                               "splits": args.splits, "rel_error_limit": REL_ERROR_LIMIT}}, "decode")
    errors: dict = {}
    rows = []
    for row in args.selected:
        print(row.name, flush=True)
        rows.append(run_row(torch, row, args, errors))
        if args.out:
            with open(args.out, "w") as fh:
                json.dump({"meta": {**meta, "import_errors": errors}, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
