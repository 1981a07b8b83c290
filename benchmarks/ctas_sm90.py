"""Where do the missing cycles of the SM90 forward live: inside one SM, or on the chip?
(issue 4, diagnosis; device script)

    python3 benchmarks/ctas_sm90.py --out $OUT/ctas.json [--quick]

Runs fa4kernel's forward with N = 1, 8, 33, 66, 132 CTAs, one Q tile each, on an otherwise idle
GPU, in its clock-probe build (the normal kernel plus clock64 / globaltimer at CTA 0's start and
end: cycles exactly, whatever the power cap does to the clock). "shared": all CTAs read the same
K/V (one head, like the CTAs of one head in a real run: L2 hits); "own": every CTA its own head
(its own K/V stream from HBM). Steady-state cycles per KV block come from two lengths,
(cycles(sk2) - cycles(sk1)) / (blocks2 - blocks1), so prologue and epilogue cancel.
If one CTA alone already needs the full-chip cycles per block, the missing cycles are inside
the SM; if they appear as N grows, they are a chip-level effect (L2 / HBM). skip_softmax times
the wgmma + TMA skeleton without the softmax; the knob variants at 1 and 132 CTAs separate each
knob's per-SM effect from the chip's.

Does NOT import fa4sim. Compare with `fa4sim run --schedule fa3 ...` on the CPU.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

N_CTAS = [1, 8, 33, 66, 132]
# knob variants timed at 1 CTA and at 132 CTAs (hd128): the per-SM part of each knob's effect
VARIANTS = [("default", {}, False), ("skip_softmax", {}, True),
            ("pingpong=False", {"pingpong": False}, False),
            ("intra_wg_overlap=False", {"intra_wg_overlap": False}, False),
            ("p_in_registers=False", {"p_in_registers": False}, False),
            ("kv_stages=3", {"kv_stages": 3}, False),
            ("exp_emulation=0.25", {"exp_emulation": 0.25}, False),
            ("rescale_threshold=8", {"rescale_threshold": 8.0}, False)]


def probe_cycles(q, k, v, knobs, skip, reps):
    """Median (cycles, ghz) of CTA 0 over `reps` launches of the clock-probe build."""
    import torch

    from fa4kernel.interface import attention_probed
    from fa4kernel.trace import header_clock
    from fa4kernel.trace_layout import TRACE_WORDS

    st = torch.zeros((TRACE_WORDS,), dtype=torch.int64, device=q.device)  # traces CTA 0
    attention_probed(q, k, v, skip_softmax=skip, stamps=st, **knobs)
    cyc, ghz = [], []
    for _ in range(reps):
        attention_probed(q, k, v, skip_softmax=skip, stamps=st, **knobs)
        torch.cuda.synchronize()
        h = header_clock(st[:5].tolist())
        cyc.append(h["cycles"])
        ghz.append(h["ghz"])
    return statistics.median(cyc), statistics.median(ghz)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hdims", default="128,64,256")
    ap.add_argument("--seqlens", default="16384,32768", help="two K lengths (difference method)")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()

    import torch

    from fa4kernel.config import make_config

    torch.manual_seed(0)
    dev = torch.device("cuda")
    sk1, sk2 = (int(x) for x in args.seqlens.split(","))
    res = {"meta": {"device": torch.cuda.get_device_name(), "date": dt.datetime.now(dt.timezone.utc)
                    .isoformat(timespec="seconds"), "torch": torch.__version__, "seqlens_k": [sk1, sk2],
                    "reps": args.reps, "method": __doc__.strip().split("\n\n")[1]}, "points": []}

    def point(hd, pattern, n, label, knobs, skip):
        cfg = make_config("bfloat16", hd, False, False, knobs)
        tm, tn = cfg.tile_m, cfg.tile_n
        row = {"hdim": hd, "pattern": pattern, "n_ctas": n, "variant": label, "knobs": knobs,
               "tile_m": tm, "tile_n": tn, "runs": {}}
        for sk in (sk1, sk2):
            heads = 1 if pattern == "shared" else n
            sq = tm * n if pattern == "shared" else tm
            q = torch.randn(1, sq, heads, hd, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, sk, heads, hd, device=dev, dtype=torch.bfloat16)
            v = torch.randn(1, sk, heads, hd, device=dev, dtype=torch.bfloat16)
            cyc, ghz = probe_cycles(q, k, v, knobs, skip, args.reps)
            row["runs"][str(sk)] = {"cycles_cta0": cyc, "clock_ghz_in_kernel": ghz,
                                    "kv_blocks": -(-sk // tn)}
            del q, k, v
        a, b = row["runs"][str(sk1)], row["runs"][str(sk2)]
        row["cycles_per_kv_block"] = (b["cycles_cta0"] - a["cycles_cta0"]) / (b["kv_blocks"] - a["kv_blocks"])
        row["fixed_cycles"] = a["cycles_cta0"] - a["kv_blocks"] * row["cycles_per_kv_block"]
        res["points"].append(row)
        print(f"hd{hd:3d} {pattern:6s} n={n:3d} {label:24s} cycles/KV block {row['cycles_per_kv_block']:7.0f}"
              f"  fixed {row['fixed_cycles']:7.0f}  clock {a['clock_ghz_in_kernel']:.3f}/"
              f"{b['clock_ghz_in_kernel']:.3f} GHz", flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    for hd in (int(x) for x in args.hdims.split(",")):
        for n in N_CTAS:
            for label, knobs, skip in VARIANTS[:2]:
                point(hd, "shared", n, label, knobs, skip)
        if hd == 128:
            for n in (1, 132):
                for label, knobs, skip in VARIANTS[2:]:
                    point(hd, "shared", n, label, knobs, skip)
            for n in (33, 66, 132):
                point(hd, "own", n, "default", {}, False)


if __name__ == "__main__":
    main()
