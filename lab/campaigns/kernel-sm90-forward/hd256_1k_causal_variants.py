"""hd256 1k causal (the last H100 point below cuDNN): tile-order sections and a few knobs, round-robin."""
import json, os, sys
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
sys.path.insert(0, root)
import torch
import fa4kernel
from fa4kernel import interface as I
from lab.tools.bench_fwd_sm90 import time_interleaved, flops, check_close
from torch.nn.attention import SDPBackend, sdpa_kernel
out = {"device": torch.cuda.get_device_name(), "points": {}}
L2 = torch.cuda.get_device_properties(0).L2_cache_size
for hd, s in [(256, 1024), (256, 4096)]:
    b, h = 16384 // s, 2048 // hd
    torch.manual_seed(7)
    q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    def ours(section=None, **kn):
        def f():
            I.L2_SECTION_BYTES = section
            return fa4kernel.attention(q, k, v, causal=True, **kn)
        return f
    fns = {"default": ours(), "sec_L2/16": ours(L2 // 16), "sec_L2/32": ours(L2 // 32), "sec_L2/4": ours(L2 // 4),
           "sec_all": ours(0), "tile_n80": ours(tile_n=80), "pingpong": ours(pingpong=True),
           "rbpv_off": ours(rescale_before_pv=False), "p_smem": ours(p_in_registers=False)}
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    fns["cudnn"] = cudnn
    ref = fns["default"]()
    for n, f in fns.items():
        o = f()
        if n == "cudnn": o = o.transpose(1, 2)
        d = check_close(o, ref); assert d < 1e-2, (n, d)
    torch.cuda.synchronize()
    t = time_interleaved(fns, reps=15)
    fl = flops(b, h, s, s, hd, True)
    row = {n: fl / (x[0] * 1e-3) / 1e12 for n, x in t.items()}
    out["points"][f"hd{hd}_s{s}_causal"] = row
    print(hd, s, {n: round(x, 1) for n, x in row.items()}, flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "hd256c.json"), "w"), indent=1)
