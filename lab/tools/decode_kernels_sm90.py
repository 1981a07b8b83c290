"""A decode call taken apart on an H100 or H200: how long each of its kernels runs on the GPU and
the gap between them (kind "decode_kernels").

fa4kernel.attention_with_kvcache with num_splits > 1 launches the split decode kernel, then the
combine (sm90/combine.py); bench_decode_sm90.py times the pair. Here the CUDA profiler (CUPTI
through torch.profiler) records every kernel of --calls eager calls per split count: per kernel
its median GPU duration, and the median gap from the decode kernel's end to the combine's start
(the launch gap a CUDA graph keeps). So a split count's time reads as decode + gap + combine,
the unit-level evidence for what the combine and a split cost (fa4sim's decode model:
docs/decode.md).

Usage (device, from the repository root):
    python3 lab/tools/decode_kernels_sm90.py --rows b4-q1-k65536-h8-kv1 --splits 8,16,29 --out $OUT/x.json
    python3 lab/tools/decode_kernels_sm90.py --dry-run      # the rows and split counts, no GPU
Rows are bench_decode_sm90.py's (ROWS and GRID names) or --problem b=B,sq=SQ,sk=SK,h=H,kv=KV[,d=D][,causal].
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from lab.tools.bench_decode_sm90 import GRID, ROWS, parse_problem, positive_ints, row_inputs  # noqa: E402

ALL_ROWS = {r.name: r for r in ROWS + GRID}


def kernel_role(name: str) -> str:
    """decode, combine or other (a copy, a memset, a pack) from a CUDA kernel's name."""
    low = name.lower()
    if "combine" in low:
        return "combine"
    if "decode" in low or "flashfwd" in low:
        return "decode"
    return "other"


def split_call(events) -> dict:
    """One call's kernels (name, start_us, end_us), in launch order -> durations by role and the
    gap from the last decode kernel's end to the combine's start."""
    out = {"decode_us": 0.0, "combine_us": 0.0, "other_us": 0.0, "gap_us": None,
           "span_us": events[-1][2] - events[0][1]}
    dec_end = None
    for name, t0, t1 in events:
        role = kernel_role(name)
        out[role + "_us"] += t1 - t0
        if role == "decode":
            dec_end = t1
        elif role == "combine" and dec_end is not None and out["gap_us"] is None:
            out["gap_us"] = t0 - dec_end
    return out


def profile_row(torch, row, splits, calls: int, warmup: int) -> dict:
    import fa4kernel
    from torch.profiler import ProfilerActivity, profile

    q, k, v = row_inputs(torch, row)
    rec = {"point": row.name, "batch": row.batch, "seqlen_q": row.seqlen_q, "seqlen_cache": row.seqlen_cache,
           "heads": row.heads, "heads_kv": row.heads_kv, "hdim": row.hdim, "causal": row.causal,
           "kv_bytes": row.kv_bytes, "splits": {}}
    for n in splits:
        def call():
            return fa4kernel.attention_with_kvcache(q, k, v, causal=row.causal, num_splits=n)
        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
        marks = []
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                torch.cuda.synchronize()  # calls apart: each one's kernels are its own
                call()
            torch.cuda.synchronize()
        kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
        # a call: its kernels up to the next call's first (the calls are apart by a host sync)
        per_call, cur = [], []
        for e in kernels:
            t0, t1 = e.time_range.start, e.time_range.end
            if cur and t0 - cur[-1][2] > 20.0 and kernel_role(e.name) != "combine":
                per_call.append(cur)
                cur = []
            cur.append((e.name, t0, t1))
        if cur:
            per_call.append(cur)
        parts = [split_call(c) for c in per_call]
        med = {key: statistics.median(p[key] for p in parts if p[key] is not None)
               for key in ("decode_us", "combine_us", "other_us", "span_us", "gap_us")
               if any(p[key] is not None for p in parts)}
        names = sorted({e[0] for c in per_call for e in c})
        rec["splits"][str(n)] = {**med, "calls": len(parts), "kernels": names,
                                 "decode_kv_gbps": row.kv_bytes / (med["decode_us"] * 1e-6) / 1e9}
        s = rec["splits"][str(n)]
        print(f"  {row.name} splits {n:3d}: decode {s['decode_us']:8.1f} us ({s['decode_kv_gbps']:5.0f} GB/s)  "
              f"gap {s.get('gap_us', 0) or 0:5.1f}  combine {s['combine_us']:6.1f}  other {s['other_us']:5.1f}  "
              f"span {s['span_us']:8.1f}  ({len(parts)} calls)", flush=True)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Rows: " + ", ".join(ALL_ROWS))
    ap.add_argument("--rows", default="b4-q1-k65536-h8-kv1", help="comma-separated row names (default: the MQA row)")
    ap.add_argument("--problem", action="append", default=[], metavar="b=B,sq=SQ,sk=SK,h=H,kv=KV[,d=D][,causal]",
                    help="a row of your own (repeatable)")
    ap.add_argument("--splits", default="1,8,16,32", help="num_splits values, comma-separated (default 1,8,16,32)")
    ap.add_argument("--calls", type=int, default=30, help="profiled calls per split count (default 30)")
    ap.add_argument("--warmup", type=int, default=10, help="calls before profiling (compiles happen here)")
    ap.add_argument("--out", default=None, help="the JSON to write (default: print only)")
    ap.add_argument("--dry-run", action="store_true", help="list the rows and split counts; no GPU")
    a = ap.parse_args(argv)
    splits = positive_ints(ap, "--splits", a.splits)
    for flag, val in (("--calls", a.calls), ("--warmup", a.warmup)):
        if val < 1:
            ap.exit(2, f"{flag}={val}; allowed: an integer >= 1\n")
    rows = []
    for name in (x.strip() for x in a.rows.split(",") if x.strip()):
        if name not in ALL_ROWS:
            ap.exit(2, f"--rows: {name!r} is not a row; allowed: {', '.join(ALL_ROWS)}\n")
        rows.append(ALL_ROWS[name])
    for spec in a.problem:
        try:
            rows.append(parse_problem(spec))
        except ValueError as e:
            ap.exit(2, f"{e}\n")
    if a.dry_run:
        for r in rows:
            print(r.name, "splits", ",".join(map(str, splits)))
        return 0
    from lab.tools.hopper import require_hopper

    require_hopper("decode_kernels_sm90.py", "--dry-run lists the rows without one")
    import torch

    from lab.tools.bench_fwd_sm90 import _version
    from lab.tools.provenance import stamp

    meta = stamp({"device": torch.cuda.get_device_name(0),
                  "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                               "cutlass_dsl": _version("nvidia-cutlass-dsl"), "python": platform.python_version()},
                  "command": " ".join(["decode_kernels_sm90.py"] + (argv if argv is not None else sys.argv[1:])),
                  "method": "torch.profiler (CUPTI) kernel records of eager calls, a host sync between calls; per "
                            "split count the median over calls of each role's GPU time and of the gap from the "
                            "decode kernel's end to the combine's start",
                  "settings": {"calls": a.calls, "warmup": a.warmup, "splits": splits}}, "decode_kernels")
    doc = {"meta": meta, "rows": []}
    for r in rows:
        doc["rows"].append(profile_row(torch, r, splits, a.calls, a.warmup))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
