"""Which SM ran which tile, when, and for how long: the whole launch, CTA by CTA
(diagnosis; device script).

    python3 lab/tools/cta_log_sm90.py --out $OUT/cta_log.json [--quick]

fa4kernel's CTA-log build (KernelConfig.cta_log: the clock-probe build plus, for every CTA, its
SM id, globaltimer and clock64 at its start and after its last O store; the KV loop's SASS is
the normal build's) runs the benchmark's short points (16k tokens, heads x head_dim = 2048).
Per launch it gives each tile's own duration in cycles (persistent launches: the tile log, each
tile's start stamp, for every launch), the gap between one CTA retiring and
the next starting on the same SM, and how the tiles of different lengths were spread over the
SMs: what fa4sim's kernel model (fa4sim/kernel_model.py) assumes about one-CTA-per-tile
launches, measured. The plain kernel is timed with CUDA events in the same run for scale.

Does NOT import fa4sim. On the CPU: `python3 -m lab.tools.calibrate.tile_jitter FILE.json --profile
fa4sim/profiles/h100.json` reads the persistent points' tile logs (the profile's
tile_jitter_q_loads); lesson 03, Exercises 3.6 and 3.10, read the first wave and the tile log.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

TOKENS, WIDTH = 16384, 2048
# (head_dim, seqlen, causal, knobs)
POINTS = [(256, 1024, True, {}), (256, 1024, False, {}), (256, 1024, True, {"persistent": True}),
          (128, 1024, True, {}), (128, 1024, False, {}), (64, 1024, True, {}), (64, 1024, False, {}),
          (256, 4096, True, {}), (128, 1024, True, {"persistent": False}),
          (128, 1024, False, {"persistent": False}), (64, 1024, False, {"persistent": False}),
          (256, 1024, False, {"persistent": True}), (64, 1024, True, {"persistent": False}),
          # 4k: tile-log points the tile jitter was not measured at (13-16)
          (256, 4096, True, {"persistent": True}), (128, 4096, True, {}), (128, 4096, False, {}),
          (64, 4096, False, {})]


def n_kv_of(m_block, tile_m, tile_n, sq, sk, causal):
    """KV blocks a Q tile visits (bottom-right aligned causal, as fa4kernel)."""
    if not causal:
        return math.ceil(sk / tile_n)
    keys = min(sk, (m_block + 1) * tile_m + sk - sq)
    return max(1, math.ceil(keys / tile_n))


def run_point(hd, s, causal, knobs, reps):
    import torch

    import fa4kernel
    from fa4kernel import interface
    from fa4kernel.interface import attention_probed, resolve_config
    from fa4kernel.trace import cta_log, tile_log
    from fa4kernel.trace_layout import TRACE_WORDS

    b, h = TOKENS // s, WIDTH // hd
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, s, h, hd), device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    cfg = resolve_config(q, k, v, causal, False, **knobs)
    num_m = -(-s // cfg.tile_m)
    tiles = b * h * num_m
    sched = interface._schedule(cfg, q, k) if interface._scheduled(cfg) else None
    table = sched.tolist() if sched is not None else None
    grid = len(table) if table is not None else tiles

    # the plain kernel, CUDA events, for scale
    for _ in range(20):
        fa4kernel.attention(q, k, v, causal=causal, **knobs)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ms = []
    for _ in range(reps):
        torch.cuda._sleep(2_000_000)  # the GPU waits for the host to queue the launch
        ev[0].record()
        fa4kernel.attention(q, k, v, causal=causal, **knobs)
        ev[1].record()
        torch.cuda.synchronize()
        ms.append(ev[0].elapsed_time(ev[1]))

    st = torch.zeros((TRACE_WORDS,), dtype=torch.int64, device="cuda")
    launches, tile_logs = [], []
    persistent = bool(cfg.persistent) and table is not None and len(table) < tiles
    for r in range(reps + 2):
        st.zero_()
        torch.cuda._sleep(2_000_000)
        out, _ = attention_probed(q, k, v, causal=causal, stamps=st, cta_log=True, **knobs)
        torch.cuda.synchronize()
        if r < 2:
            continue  # warm
        words = st.tolist()
        rows = cta_log(words, grid)
        launches.append(rows)
        if persistent:  # every tile of every launch: [cta, flat tile, position in its row, cycles]
            tile_logs.append([[x["cta"], x["tile"], x["k"], x["cycles"]] for x in tile_log(words, table)])
    # keep the launch with the median span
    spans = [max(x["end_ns"] for x in rows) for rows in launches]
    pick = launches[sorted(range(len(spans)), key=lambda i: spans[i])[len(spans) // 2]]
    ghz = statistics.median(x["cycles"] / (x["end_ns"] - x["start_ns"]) for x in pick
                            if x["end_ns"] > x["start_ns"])
    recs = []
    for x in pick:
        first = table[x["cta"]][0] if table is not None else x["cta"]
        ntiles = sum(1 for t in table[x["cta"]] if t >= 0) if table is not None else 1
        m_block = first % num_m
        recs.append([x["cta"], x["sm"], x["start_ns"], x["end_ns"], x["cycles"], m_block,
                     n_kv_of(m_block, cfg.tile_m, cfg.tile_n, s, s, causal), ntiles])
    # derived: per SM, the gap between one CTA's end and the next one's start
    by_sm = {}
    for r in recs:
        by_sm.setdefault(r[1], []).append(r)
    gaps = []
    for rs in by_sm.values():
        rs.sort(key=lambda r: r[2])
        gaps += [b_[2] - a_[3] for a_, b_ in zip(rs, rs[1:])]
    per_nkv = {}
    for r in recs:
        if r[7] == 1:
            per_nkv.setdefault(r[6], []).append(r[4])
    return {
        "head_dim": hd, "seqlen": s, "causal": causal, "knobs": knobs, "batch": b, "heads": h,
        "tile_m": cfg.tile_m, "tile_n": cfg.tile_n, "persistent": bool(cfg.persistent),
        "rescale_threshold": cfg.rescale_threshold,
        "grid": grid, "tiles": tiles, "ctas_logged": len(pick),
        "event_ms_median": statistics.median(ms), "span_ns_per_launch": spans,
        "span_ns": max(r[3] for r in recs), "clock_ghz_in_kernel": ghz,
        "sms_used": len(by_sm), "ctas_per_sm_max": max(len(v) for v in by_sm.values()),
        "gap_ns_median": statistics.median(gaps) if gaps else None,
        "gap_ns_p10_p90": ([sorted(gaps)[len(gaps) // 10], sorted(gaps)[9 * len(gaps) // 10]] if gaps else None),
        "tile_cycles_median_by_n_kv": {str(n): statistics.median(c) for n, c in sorted(per_nkv.items())},
        "first_start_ns_max": max(min(r[2] for r in rs) for rs in by_sm.values()),
        "sm_end_ns_min_max": [min(max(r[3] for r in rs) for rs in by_sm.values()), max(r[3] for r in recs)],
        "columns": ["cta", "sm", "start_ns", "end_ns", "cycles", "m_block", "n_kv", "tiles_in_cta"],
        "ctas": recs,
        # persistent launches: the host table, and each launch's tile log (fa4kernel.trace.tile_log)
        **({"table": [[t for t in row if t >= 0] for row in table], "num_m": num_m,
            "tile_log_columns": ["cta", "tile", "k", "cycles"], "tile_logs": tile_logs} if persistent else {}),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="results JSON")
    ap.add_argument("--quick", action="store_true", help="hd256 1k causal only, 3 launches")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", help="comma-separated indices into POINTS (e.g. 3,8: hd128 1k causal, persistent "
                                   "and one CTA per tile)")
    a = ap.parse_args()
    from lab.tools.hopper import require_hopper

    require_hopper("cta_log_sm90.py")
    import torch

    import cutlass

    from lab.tools.provenance import stamp

    res = {"meta": stamp({"device": torch.cuda.get_device_name(),
                          "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                          "torch": torch.__version__, "cutlass_dsl": getattr(cutlass, "__version__", "?"),
                          "sms": torch.cuda.get_device_properties(0).multi_processor_count}, "cta_log"),
           "points": []}
    pts = POINTS[:1] if a.quick else [POINTS[int(i)] for i in a.only.split(",")] if a.only else POINTS
    for i, (hd, s, causal, knobs) in enumerate(pts):
        p = run_point(hd, s, causal, knobs, 3 if a.quick else a.reps)
        res["points"].append(p)
        print(f"[{i + 1}/{len(pts)}] hd{hd} {s} causal={causal} {knobs}: grid {p['grid']}, event "
              f"{p['event_ms_median'] * 1e3:.1f} us, span {p['span_ns'] / 1e3:.1f} us, {p['clock_ghz_in_kernel']:.2f} GHz, "
              f"gap {p['gap_ns_median']} ns, first start max {p['first_start_ns_max']} ns, "
              f"SM end {p['sm_end_ns_min_max']}, by n_kv {p['tile_cycles_median_by_n_kv']}", flush=True)
        with open(a.out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
