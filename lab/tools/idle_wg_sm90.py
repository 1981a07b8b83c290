"""What does a tile cost when some of its consumer warpgroups have no rows? (device script)

    python3 lab/tools/idle_wg_sm90.py --out $OUT/idle_wg.json

The last Q tile of a length that is not a multiple of tile_m has warpgroups whose 64 rows all lie
past seqlen_q; fa4kernel idles them (no GEMM, no softmax). The host's tile schedule
(fa4kernel/tile_schedule.py) needs what such a tile costs relative to a full one. Here ONE
persistent CTA (interface.MAX_CTAS = 1) walks 16 heads x one Q tile of 64 x `live` rows each
against 4096 keys (32 KV blocks of 128, non-causal), so the launch time is the sum of 16 equal
tiles; variants are timed round-robin (bench_fwd_sm90.time_interleaved). Ratio = time / time with
every warpgroup live.

Does NOT import fa4sim.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CASES = [(64, 192), (96, 192), (128, 128), (64, 128)]  # (head_dim, tile_m)
HEADS, SEQLEN_K = 16, 4096


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    from lab.tools.hopper import require_hopper

    require_hopper("idle_wg_sm90.py")

    import torch

    import fa4kernel
    from lab.tools.bench_fwd_sm90 import time_interleaved
    from lab.tools.provenance import stamp
    from fa4kernel import interface

    res = {"meta": {"device": torch.cuda.get_device_name(), "date": dt.datetime.now(dt.timezone.utc)
                    .isoformat(timespec="seconds"), "torch": torch.__version__, "reps": args.reps,
                    "heads": HEADS, "seqlen_k": SEQLEN_K, "method": __doc__.strip().split("\n\n")[2]},
           "cases": []}
    stamp(res["meta"], "idle_wgs")
    interface.MAX_CTAS = 1
    try:
        for hd, tile_m in CASES:
            wgs = tile_m // 64
            fns = {}
            for live in range(1, wgs + 1):
                q = torch.randn(1, 64 * live, HEADS, hd, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(1, SEQLEN_K, HEADS, hd, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                fns[live] = (lambda q=q, k=k, v=v: fa4kernel.attention(q, k, v, tile_m=tile_m, tile_n=128))
                fns[live]()
            torch.cuda.synchronize()
            t = time_interleaved(fns, reps=args.reps)
            full = t[wgs][0]
            row = {"head_dim": hd, "tile_m": tile_m, "warpgroups": wgs,
                   "ms": {live: x[0] for live, x in t.items()},
                   "ratio_to_full": {live: x[0] / full for live, x in t.items()},
                   # as it ran: one persistent CTA; the kernel idles warpgroups without rows
                   "fa4kernel_config": {"tile_m": tile_m, "tile_n": 128, "persistent": True, "skip_idle_wgs": True}}
            res["cases"].append(row)
            print(f"hd{hd} tile_m {tile_m}: " + " ".join(f"{live}/{wgs} live {r:.3f}"
                                                      for live, r in row["ratio_to_full"].items()), flush=True)
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
    finally:
        interface.MAX_CTAS = None


if __name__ == "__main__":
    main()
