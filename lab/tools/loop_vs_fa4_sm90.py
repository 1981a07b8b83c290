"""Is our KV loop as fast as flash-attn-4's? Steady-state time per key, one SM and a full chip.
(a diagnosis; device script)

    python3 lab/tools/loop_vs_fa4_sm90.py --out $OUT/loop_vs_fa4.json [--hdims 64,128,256]

The 16k-token benchmark has flash-attn-4 ahead of fa4kernel at hd128 (733 vs 693 TFLOP/s on the
H100) with the same tile (128 x 128), the same knobs and a model that predicts both alike. Is
that the KV loop, or the chip? Here both kernels run Q tiles of one tile_m rows each (batch 1,
one head of `ctas` Q tiles: one CTA per SM, all reading the same K/V from L2, no tail, no
per-tile turnover) against two key lengths; the time
difference over the key difference is the steady-state loop, launch, prologue and epilogue
cancel. 1 CTA: the SM alone; 132 CTAs: every SM at once (L2 / HBM shared). Both kernels are
timed round-robin in one process (bench_fwd_sm90.time_interleaved), so clock drift hits both;
ns per key converts to cycles per KV block with our clock-probe build's in-kernel clock.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fa4kernel  # noqa: E402
from lab.tools import bench_fwd_sm90 as bench  # noqa: E402

TILE_M = {64: 192, 128: 128, 256: 128}  # both kernels' default tile_m for these head dims


def run(hdims, lengths, ctas_list, reps):
    impls = bench.Impls()
    if impls.fa4 is None:
        raise SystemExit(f"flash-attn-4 not importable: {impls.errors}")
    rows = []
    for hd in hdims:
        for ctas in ctas_list:
            tm = TILE_M[hd]
            times, ghz, cfg = {}, [], None
            for sk in lengths:
                torch.manual_seed(hd + sk + ctas)
                # one head, `ctas` Q tiles: every CTA reads the same K/V (L2 hits), as the CTAs of
                # one head do in the benchmark (own heads would make 132 CTAs HBM-bound)
                q = torch.randn(1, tm * ctas, 1, hd, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(1, sk, 1, hd, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                probe, read = impls.ours_clock_probe(q, k, v, False)
                fns = {"fa4kernel": impls.ours(q, k, v, False), "flash-attn-4": impls.flash_attn_4(q, k, v, False),
                       "probe": probe}
                ref = fns["fa4kernel"]()
                diff = bench.check_close(fns["flash-attn-4"](), ref)
                assert diff < 1e-2, f"hd{hd} sk{sk}: outputs disagree ({diff})"
                t = bench.time_interleaved(fns, reps=reps, target_ms=2.0, warm_ms=200.0,
                                           after_batch={"probe": read})
                times[sk] = {n: t[n][0] for n in ("fa4kernel", "flash-attn-4")}
                ghz += read.ghz
                cfg = fa4kernel.interface.resolve_config(q, k, v, False)
                del q, k, v
            g = statistics.median(ghz)
            lo, hi = lengths[0], lengths[-1]
            row = dict(hdim=hd, ctas=ctas, tile_m=tm, lengths=lengths, ghz=g, ms=times,
                       fa4kernel_tile_n=cfg.tile_n, fa4kernel_config=cfg.as_dict())
            for name in ("fa4kernel", "flash-attn-4"):
                ns_per_key = (times[hi][name] - times[lo][name]) * 1e6 / (hi - lo)
                row[f"{name}_ns_per_1k_keys"] = ns_per_key * 1e3
            tn_fa4 = 128 if hd <= 128 else 80  # flash-attn-4 4.0.0b36's SM90 tile_n (interface.py)
            row["fa4kernel_cycles_per_block"] = row["fa4kernel_ns_per_1k_keys"] / 1e3 * cfg.tile_n * g
            row["flash-attn-4_cycles_per_block"] = row["flash-attn-4_ns_per_1k_keys"] / 1e3 * tn_fa4 * g
            row["ratio_ours_over_fa4_time"] = row["fa4kernel_ns_per_1k_keys"] / row["flash-attn-4_ns_per_1k_keys"]
            rows.append(row)
            print(f"hd{hd} ctas={ctas:<3} {g:.3f} GHz  ours {row['fa4kernel_cycles_per_block']:.0f} cyc/blk "
                  f"(tile_n {cfg.tile_n})  fa4 {row['flash-attn-4_cycles_per_block']:.0f} cyc/blk (tile_n {tn_fa4})  "
                  f"time per key ours/fa4 {row['ratio_ours_over_fa4_time']:.3f}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--lengths", default="4096,16384", help="two key lengths (their difference is timed)")
    ap.add_argument("--ctas", default="1,132", help="CTAs (Q tiles of one head, one tile each)")
    ap.add_argument("--reps", type=int, default=11)
    a = ap.parse_args()
    from lab.tools.hopper import require_hopper

    require_hopper("loop_vs_fa4_sm90.py")
    rows = run([int(x) for x in a.hdims.split(",")], [int(x) for x in a.lengths.split(",")],
               [int(x) for x in a.ctas.split(",")], a.reps)
    from lab.tools.provenance import stamp

    meta = dict(device=torch.cuda.get_device_name(), date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                torch=torch.__version__, cutlass_dsl=bench._version("nvidia-cutlass-dsl"),
                flash_attn_4=bench._version("flash-attn-4"),
                method="batch 1, one head, seqlen_q = CTAs x tile_m, non-causal bf16; time per key from two key "
                       "lengths; both kernels round-robin in one process; cycles at our clock-probe build's in-kernel clock")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(meta=stamp(meta, "loop_vs_fa4"), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
