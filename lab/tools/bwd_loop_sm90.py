"""Cycles per query block of fa4kernel's SM90 backward, from its clock-probe build's per-CTA
stamps, with every SM loaded (kind "bwd_loop").

A CTA of the backward walks the query blocks of its key block (sm90/bwd.py): its clock64 span
from start to end is a prologue (K, V), n query blocks, and an epilogue (dK, dV). At two lengths
s1 < s2 of one head, non-causal, every CTA walks n1 = s1 / tile_m and n2 = s2 / tile_m blocks, so

    cycles per query block = (median CTA cycles at s2 - at s1) / (n2 - n1)

drops the prologue and epilogue: the steady loop that fa4sim's backward model reports as
"cycles per Q block" (Result.interval), measured with the whole chip busy as in a real launch.

    python3 lab/tools/bwd_loop_sm90.py --out FILE.json      (an H100 / H200; ~30 s)
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

POINTS = {64: (4096, 16384), 128: (4096, 16384), 256: (4096, 16384)}  # head dim -> (s1, s2)
TOKENS, WIDTH = 16384, 2048  # batch x seqlen and heads x head dim, as the 18-point grid


def cta_cycles(d: int, s: int, reps: int = 5) -> dict:
    """Per-CTA clock64 spans of the last of `reps` probed backward launches at head dim d and
    length s (batch TOKENS / s, heads WIDTH / d, non-causal)."""
    import torch

    import fa4kernel
    from fa4kernel.trace import ctas_clock_ghz

    b, h = TOKENS // s, WIDTH // d
    torch.manual_seed(s + d)
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    with torch.no_grad():
        out, lse = fa4kernel.attention(q, k, v, return_lse=True)
    stamps = None
    for _ in range(reps):
        *_, stamps = fa4kernel.attention_backward_probed(do, q, k, v, out, lse, stamps=stamps)
    torch.cuda.synchronize()
    w = stamps.view(-1, 4).cpu().tolist()
    cyc = [c1 - c0 for c0, _, c1, _ in w if c0 > 0 and c1 > c0]
    cfg = fa4kernel.make_bwd_config("bfloat16", d, False)
    return {"batch": b, "heads": h, "seqlen": s, "hdim": d, "tile_m": cfg.tile_m, "tile_n": cfg.tile_n,
            "q_blocks": s // cfg.tile_m, "ctas": len(cyc), "cta_cycles_median": statistics.median(cyc),
            "cta_cycles_p10": sorted(cyc)[len(cyc) // 10], "cta_cycles_p90": sorted(cyc)[9 * len(cyc) // 10],
            "clock_ghz": ctas_clock_ghz(stamps.cpu().tolist())["ghz"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="result JSON")
    args = ap.parse_args()
    from lab.tools.hopper import require_hopper

    require_hopper("bwd_loop_sm90.py")
    import torch

    from lab.tools.bench_fwd_sm90 import _version
    from lab.tools.provenance import stamp

    res = {"meta": stamp({"device": torch.cuda.get_device_name(0),
                          "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                          "versions": {"torch": torch.__version__, "cutlass_dsl": _version("nvidia-cutlass-dsl")},
                          "method": __doc__.split("\n\n")[1].replace("\n", " ")}, "bwd_loop"),
           "points": []}
    for d, (s1, s2) in POINTS.items():
        a, b = cta_cycles(d, s1), cta_cycles(d, s2)
        per_block = (b["cta_cycles_median"] - a["cta_cycles_median"]) / (b["q_blocks"] - a["q_blocks"])
        res["points"].append({"hdim": d, "short": a, "long": b, "cycles_per_q_block": per_block})
        print(f"hd{d}: {per_block:.0f} cycles per Q block ({a['q_blocks']} -> {b['q_blocks']} blocks; "
              f"CTA median {a['cta_cycles_median']} -> {b['cta_cycles_median']}; {b['clock_ghz']:.3f} GHz)", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
