"""Where a backward call's time goes, launch by launch: torch.profiler's CUDA time of each kernel
of one `torch.autograd.grad` call (mean of 5), for fa4kernel's SM90 backward with and without its
host-side launches (postprocess, dq_zero) and for flash-attn-4's, at 16k tokens per point.

    python3 lab/tools/bwd_launches_sm90.py --out FILE.json     (an H100 / H200; about a minute)

The main kernel, the preprocess (dPsum, LSE in log2 units, and the zeroed dQ accumulator where it
does that), the postprocess (dQ fp32 -> 16 bit) and any torch launch in between each get a row.
"""
from __future__ import annotations

import argparse
import json

POINTS = [(64, 1024, False), (64, 1024, True), (128, 1024, False), (128, 1024, True), (256, 1024, False)]
OLD = {"tile_m": 64, "postprocess": "torch", "dq_zero": "torch"}  # at other head dims tile_m=64 is the default


def per_kernel_us(fn, q, k, v, do, reps: int = 5) -> list:
    import torch
    from torch.profiler import ProfilerActivity, profile

    out = fn()
    for _ in range(3):
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
    times: dict = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times.setdefault(e.name[:90], []).append(e.device_time)
    return sorted(((round(sum(t) / reps, 1), n, len(t) // reps) for n, t in times.items()), reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="result JSON")
    args = ap.parse_args()
    from lab.tools.hopper import require_hopper

    require_hopper("bwd_launches_sm90.py")
    import torch

    import fa4kernel
    from flash_attn.cute.interface import flash_attn_func

    res = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "method": "torch.profiler CUDA time per kernel, mean of 5 autograd.grad calls after 3 warm-ups; "
                              "bf16, batch x seqlen = 16384, heads x head_dim = 2048",
                    "old_build": OLD}, "points": {}}
    for hd, s, causal in POINTS:
        b, h = 16384 // s, 2048 // hd
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16)

        def fa4():
            o = flash_attn_func(q, k, v, causal=causal)
            return o[0] if isinstance(o, tuple) else o

        runs = {"fa4kernel": lambda: fa4kernel.attention(q, k, v, causal=causal),
                "fa4kernel[old]": lambda: fa4kernel.attention(q, k, v, causal=causal, bwd_knobs=OLD),
                "flash-attn-4": fa4}
        for name, fn in runs.items():
            rows = per_kernel_us(fn, q, k, v, do)
            key = f"hd{hd}-{s}{'-causal' if causal else ''} {name}"
            res["points"][key] = rows
            print(f"{key}: total {sum(r[0] for r in rows):.1f} us")
            for t, n, c in rows:
                print(f"   {t:9.1f} us x{c} {n}")
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
