"""hd64: two persistent CTAs per SM (128 x 64 tiles) vs the default, beside cuDNN; round-robin."""
import json, os, sys, time
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
sys.path.insert(0, root)
import torch
import fa4kernel
from lab.tools.bench_fwd_sm90 import time_interleaved, flops, check_close
from flash_attn.cute.interface import flash_attn_func as fa4
out = {"device": torch.cuda.get_device_name(), "points": {}}
V = {"default": {}, "2cta_128x64": dict(tile_m=128, tile_n=64, ctas_per_sm=2),
     "1cta_128x64": dict(tile_m=128, tile_n=64), "2cta_128x64_late_q": dict(tile_m=128, tile_n=64, ctas_per_sm=2, early_q_release=False)}
for hd, s, causal in [(64, 1024, True), (64, 1024, False), (64, 2048, True), (64, 4096, True), (64, 4096, False), (64, 16384, True)]:
    b, h = 16384 // s, 2048 // hd
    torch.manual_seed(s + hd)
    q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2).float() for x in (q, k, v)), is_causal=causal).transpose(1, 2)
    fns = {n: (lambda kn=kn: fa4kernel.attention(q, k, v, causal=causal, **kn)) for n, kn in V.items()}
    for n, f in fns.items():
        err = check_close(f(), ref)
        assert err < 1e-2 and err == err, (n, err)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    fns["cudnn"] = cudnn
    fns["fa4"] = lambda: fa4(q, k, v, causal=causal)
    for f in fns.values(): f()
    torch.cuda.synchronize()
    t = time_interleaved(fns, reps=11)
    fl = flops(b, h, s, s, hd, causal)
    row = {n: fl / (x[0] * 1e-3) / 1e12 for n, x in t.items()}
    out["points"][f"hd{hd}_s{s}_c{int(causal)}"] = row
    print(hd, s, int(causal), {n: round(x, 1) for n, x in row.items()}, flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), f"two_ctas_{int(time.time())}.json"), "w"), indent=1)
