"""A/B in one process: fa4kernel (working tree) vs fa4kernel_old (scratch_ab copy of HEAD) vs flash-attn-4,
round-robin, benchmark grid points + one-CTA loop."""
import json, os, sys, time, statistics
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
sys.path.insert(0, root); sys.path.insert(0, os.path.join(root, "scratch_ab"))
import torch
import fa4kernel, fa4kernel_old
from lab.tools.bench_fwd_sm90 import time_interleaved, flops, check_close
from flash_attn.cute.interface import flash_attn_func as fa4
quick = "--quick" in sys.argv
out = {"device": torch.cuda.get_device_name(), "points": {}}
grid = [(hd, s, c) for hd in (64, 128, 256) for s in (1024, 4096, 16384) for c in (False, True)]
if quick:
    grid = [(64, 1024, True), (64, 1024, False), (128, 1024, False), (128, 1024, True), (256, 1024, True), (128, 4096, False)]
for hd, s, causal in grid:
    b, h = 16384 // s, 2048 // hd
    torch.manual_seed(s + hd)
    q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fns = {"new": lambda: fa4kernel.attention(q, k, v, causal=causal),
           "old": lambda: fa4kernel_old.attention(q, k, v, causal=causal),
           "fa4": lambda: fa4(q, k, v, causal=causal)}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    fns["cudnn"] = cudnn
    fns["cudnn"]()
    ref = fns["old"]()
    d = check_close(fns["new"](), ref)
    assert d < 1e-2, d
    fns["fa4"]()
    torch.cuda.synchronize()
    t = time_interleaved(fns, reps=11)
    fl = flops(b, h, s, s, hd, causal)
    row = {n: fl / (x[0] * 1e-3) / 1e12 for n, x in t.items()}
    out["points"][f"hd{hd}_s{s}_c{int(causal)}"] = row
    print(hd, s, int(causal), {n: round(x, 1) for n, x in row.items()}, f"new/old {row['new']/row['old']:.3f}", flush=True)
if quick: grid_loop = []
else: grid_loop = (64, 128, 256)
# one CTA, steady loop: (t(16k) - t(4k)) per 12k keys
for hd in grid_loop:
    tm = 192 if hd == 64 else 128
    ts = {}
    for sk in (4096, 16384):
        torch.manual_seed(sk)
        q = torch.randn(1, tm, 1, hd, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, sk, 1, hd, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fns = {"new": lambda: fa4kernel.attention(q, k, v), "old": lambda: fa4kernel_old.attention(q, k, v),
               "fa4": lambda: fa4(q, k, v)}
        for f in fns.values(): f()
        ts[sk] = {n: x[0] for n, x in time_interleaved(fns, reps=11, target_ms=2.0).items()}
    row = {n: (ts[16384][n] - ts[4096][n]) * 1e6 / 12288 * 1e3 for n in ts[4096]}  # ns per 1k keys
    out["points"][f"loop1cta_hd{hd}_ns_per_1k_keys"] = row
    print("1 CTA loop hd", hd, {n: round(x, 1) for n, x in row.items()}, f"new/old time {row['new']/row['old']:.3f}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), f"ab2_{int(time.time())}.json"), "w"), indent=1)
