"""torch.profiler's CUDA time per kernel of one varlen backward (fa4kernel.varlen, flash-attn-4),
on two of bench_varlen_sm90.py's batches: where the time between the launches goes.

Run on the device from the repository root: python3 lab/campaigns/varlen-sm90/profile_varlen_bwd.py [OUT.json]
"""
import json
import sys

import torch

sys.path.insert(0, ".")
from lab.tools import bench_varlen_sm90 as bench  # noqa: E402

rows = []
for name in ("ten-hd128-causal", "short-hd128-causal"):
    b = {x.name: x for x in bench.BATCHES}[name]
    q, k, v, cq, ck = bench.inputs(torch, b)
    dout = torch.randn_like(q)
    errors = {}
    for cand, fn in bench.bwd_candidates(torch, b, q, k, v, cq, ck, dout, errors).items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        kern = [(e.key, e.device_time_total / 5, e.count // 5) for e in prof.key_averages() if e.device_time_total > 0]
        kern.sort(key=lambda x: -x[1])
        total = sum(t for _, t, _ in kern)
        print(f"{name} {cand}: {total:.0f} us of kernels per call, {sum(c for *_, c in kern)} launches", flush=True)
        for key, t, c in kern:
            print(f"   {t:8.1f} us  x{c:<3d} {key[:90]}")
        rows.append({"point": name, "kernel": cand, "kernel_us": total,
                     "launches": [{"name": key[:200], "us": t, "count": c} for key, t, c in kern]})
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as fh:
        json.dump({"meta": {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                            "what": "torch.profiler CUDA time per kernel, mean of 5 calls after 3"}, "rows": rows}, fh,
                  indent=1)
