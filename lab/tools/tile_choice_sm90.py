"""Which tile shape for which sequence length? (device script)

    python3 lab/tools/tile_choice_sm90.py --out $OUT/tile_choice.json

fa4kernel's default tiles per head dim (the SM90 table of fa4-schedules.md) are tuned for long
sequences. At 1k tokens a 192-row tile (hd64) leaves the last tile of every head 2/3 empty
(1024 = 5 x 192 + 64) and, causal, that tile still walks all 8 KV blocks; hd256's 80-key blocks
leave a partial last block. This times tile variants of our kernel beside cuDNN (torch SDPA),
round-robin in one group per shape (the benchmark's protocol: bench_fwd_sm90.time_interleaved),
at the benchmark's shapes (batch x seqlen = 16k tokens, heads x hdim = 2048).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CASES = {  # hdim -> tile variants (knobs) to compare
    64: [{}, {"tile_m": 128, "tile_n": 128}, {"tile_m": 128, "tile_n": 176}],
    256: [{}, {"tile_n": 64}],
}
SEQLENS = {64: (1024, 2048, 4096, 16384), 256: (1024, 4096)}
# --pingpong: the default (ping-pong on for hd64 / hd128) against ping-pong off, over the grid
PINGPONG_CASES = {64: [{}, {"pingpong": False}], 128: [{}, {"pingpong": False}]}
PINGPONG_SEQLENS = {64: (1024, 4096, 16384), 128: (1024, 4096, 16384)}
# --set idle: after idle warpgroups (rows past seqlen_q skip their work) and the host schedule
# for every persistent launch: is hd64's 192-row tile now right for short causal too? And
# hd256's O rescale before the PV GEMM (FA4's RescaleOBeforeGemm) on vs off.
IDLE_CASES = {64: [{}, {"tile_m": 192, "tile_n": 128}, {"tile_m": 128, "tile_n": 128}],
              256: [{}, {"rescale_before_pv": False}, {"tile_n": 64}, {"tile_n": 64, "rescale_before_pv": False}]}
IDLE_SEQLENS = {64: (1024, 2048, 4096), 256: (1024, 4096, 16384)}
# --set short64: hd64 at 1k (causal is where cuDNN still leads): tile and schedule variants
SHORT64_CASES = {64: [{}, {"tile_m": 128, "tile_n": 64}, {"tile_m": 128, "tile_n": 176},
                      {"tile_m": 128, "tile_n": 128, "pingpong": False}, {"tile_m": 128, "tile_n": 128, "kv_stages": 3},
                      {"tile_m": 192, "tile_n": 96}]}
# --set short64b: the same point, softmax-side knobs on the short-causal tile
SHORT64B_CASES = {64: [{}, {"tile_m": 128, "tile_n": 128, "intra_wg_overlap": False},
                       {"tile_m": 128, "tile_n": 128, "rescale_threshold": 8.0},
                       {"tile_m": 128, "tile_n": 128, "exp_emulation": 0.125},
                       {"tile_m": 128, "tile_n": 128, "intra_wg_overlap": False, "pingpong": False}]}
SHORT64_SEQLENS = {64: (1024,)}
SETS = {"tiles": (CASES, SEQLENS), "pingpong": (PINGPONG_CASES, PINGPONG_SEQLENS), "idle": (IDLE_CASES, IDLE_SEQLENS),
        "short64": (SHORT64_CASES, SHORT64_SEQLENS), "short64b": (SHORT64B_CASES, SHORT64_SEQLENS)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", choices=sorted(SETS), default="tiles",
                    help="tiles: tile variants at short lengths (default); pingpong: ping-pong on vs off "
                         "at hd64 / hd128, 1k / 4k / 16k; idle: hd64 tiles and hd256 rescale_before_pv "
                         "after the idle-warpgroup change; short64, short64b: hd64 1k variants")
    ap.add_argument("--pingpong", action="store_true", help="same as --set pingpong")
    ap.add_argument("--peers", action="store_true", help="time flash-attn-4 too")
    ap.add_argument("--hdim", type=int, action="append", help="only these head dims (repeatable)")
    ap.add_argument("--seqlen", type=int, action="append", help="only these sequence lengths (repeatable)")
    args = ap.parse_args()
    from lab.tools.hopper import require_hopper

    require_hopper("tile_choice_sm90.py")
    cases, seqlens = SETS["pingpong" if args.pingpong else args.set]

    import torch

    import fa4kernel
    from lab.tools.bench_fwd_sm90 import Impls, flops, time_interleaved
    from lab.tools.provenance import stamp

    impls = Impls()
    res = {"meta": {"device": torch.cuda.get_device_name(), "date": dt.datetime.now(dt.timezone.utc)
                    .isoformat(timespec="seconds"), "torch": torch.__version__,
                    "method": __doc__.strip().split("\n\n")[1]}, "points": []}
    stamp(res["meta"], "tile_choice")
    for hd, variants in cases.items():
        if args.hdim and hd not in args.hdim:
            continue
        for s in seqlens[hd]:
            if args.seqlen and s not in args.seqlen:
                continue
            for causal in (False, True):
                b, h = 16384 // s, 2048 // hd
                q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                fns = {}
                for kn in variants:
                    name = "fa4kernel[" + (",".join(f"{a}={x}" for a, x in kn.items()) or "default") + "]"
                    try:
                        fns[name] = impls.ours(q, k, v, causal, **kn)
                        fns[name]()
                    except ValueError as e:
                        print(f"hd{hd} {name}: {e}", flush=True)
                        fns.pop(name, None)
                fns["sdpa-cudnn"] = impls.sdpa(q, k, v, causal, "cudnn")
                if args.peers and impls.fa4 is not None:
                    fns["flash-attn-4"] = impls.flash_attn_4(q, k, v, causal)
                torch.cuda.synchronize()
                timed = time_interleaved(fns, reps=9)
                f = flops(b, h, s, s, hd, causal)
                row = {"hdim": hd, "seqlen": s, "causal": causal, "batch": b, "heads": h,
                       "tflops": {n: f / (t[0] * 1e-3) / 1e12 for n, t in timed.items()}}
                res["points"].append(row)
                print(f"hd{hd} s{s} causal={int(causal)} " +
                      " ".join(f"{n}={x:.0f}" for n, x in row["tflops"].items()), flush=True)
                with open(args.out, "w") as fh:
                    json.dump(res, fh, indent=1)
                del q, k, v


if __name__ == "__main__":
    main()
