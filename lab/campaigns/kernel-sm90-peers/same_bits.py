"""Does a kernel change keep every output bit? fa4kernel (this tree) against another checkout's
fa4kernel (DIR, loaded as fa4kernel_base) on fresh random inputs with odd lengths: forward
outputs and LSE, backward dQ, dK, dV (deterministic mode, so two runs of one build agree bit
for bit), each compared with torch.equal. A device script:

    python3 lab/campaigns/kernel-sm90-peers/same_bits.py DIR [--out FILE.json]
"""
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
import fa4kernel  # noqa: E402
from lab.tools.sustained_sm90 import load_tree  # noqa: E402

FWD = [(64, False, {}), (128, False, {}), (128, True, {}), (192, True, {}), (256, False, {}),
       (128, False, {"tile_n": 176}), (256, False, {"tile_n": 80})]
BWD = [(64, False), (128, True), (256, False)]


def main():
    base = load_tree("base", sys.argv[1])
    out = {"device": torch.cuda.get_device_name(), "fwd": [], "bwd": []}
    for hd, causal, knobs in FWD:
        torch.manual_seed(hd + len(knobs))
        q, k, v = (torch.randn(2, 1111 + i * 60, 4, hd, device="cuda", dtype=torch.bfloat16) for i in (0, 2, 2))
        a, la = fa4kernel.attention(q, k, v, causal=causal, return_lse=True, **knobs)
        b, lb = base.attention(q, k, v, causal=causal, return_lse=True, **knobs)
        row = {"hdim": hd, "causal": causal, "knobs": knobs, "out_equal": bool(torch.equal(a, b)),
               "lse_equal": bool(torch.equal(la, lb)), "finite": bool(torch.isfinite(a).all())}
        out["fwd"].append(row)
        print("fwd", row, flush=True)
    for hd, causal in BWD:
        torch.manual_seed(100 + hd)
        q, k, v, do = (torch.randn(2, 1111 + i * 60, 4, hd, device="cuda", dtype=torch.bfloat16) for i in (0, 2, 2, 0))
        grads = []
        for mod in (fa4kernel, base):
            x = [t.clone().requires_grad_() for t in (q, k, v)]
            o = mod.attention(*x, causal=causal, deterministic=True)
            grads.append(torch.autograd.grad(o, x, do))
        row = {"hdim": hd, "causal": causal, "equal": [bool(torch.equal(g, h)) for g, h in zip(*grads)],
               "finite": all(bool(torch.isfinite(g).all()) for g in grads[0])}
        out["bwd"].append(row)
        print("bwd", row, flush=True)
    if "--out" in sys.argv:
        json.dump(out, open(sys.argv[sys.argv.index("--out") + 1], "w"), indent=1)


if __name__ == "__main__":
    main()
