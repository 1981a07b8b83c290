"""A/B: time a few points with whichever fa4kernel is first on sys.path (old tree or new)."""
import json, os, sys, time
which = sys.argv[1]  # "old" or "new"
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
sys.path.insert(0, root)
if which == "old":
    sys.path.insert(0, os.path.join(root, "scratch_ab"))
import torch
import fa4kernel
from lab.tools.bench_fwd_sm90 import time_interleaved, flops
print(which, fa4kernel.__file__, flush=True)
out = {}
for hd, s, causal, extra in [(128, 1024, False, {}), (64, 1024, True, {}), (256, 1024, True, {})]:
    b, h = 16384 // s, 2048 // hd
    torch.manual_seed(1)
    q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    from fa4kernel import interface
    def mk(pers):
        def run():
            interface.PERSISTENT = pers
            try:
                fa4kernel.attention(q, k, v, causal=causal, **extra)
            finally:
                interface.PERSISTENT = True
        return run
    fns = {"persistent": mk(True), "1tile": mk(False)}
    if which == "new" and not causal:
        cfg = interface.resolve_config(q, k, v, causal, **extra)
        table = interface._schedule(cfg, q, k)
        n = b * h * -(-s // cfg.tile_m)
        rr = [list(range(c, n, 132)) for c in range(132)]
        w = max(map(len, rr)) + 1
        rr_t = torch.tensor([r + [-1] * (w - len(r)) for r in rr], dtype=torch.int32, device="cuda")
        def run_rr():
            key = next(kk for kk, vv in interface._SCHEDULES.items() if vv is table)
            interface._SCHEDULES[key] = rr_t
            try:
                fa4kernel.attention(q, k, v, causal=causal, **extra)
            finally:
                interface._SCHEDULES[key] = table
        fns["roundrobin"] = run_rr
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    t = time_interleaved(fns, reps=9)
    fl = flops(b, h, s, s, hd, causal)
    row = {n: fl / (x[0] * 1e-3) / 1e12 for n, x in t.items()}
    out[f"hd{hd}_s{s}_c{int(causal)}"] = row
    print(which, hd, s, causal, {n: round(x) for n, x in row.items()}, flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), f"ab_{which}_{time.time():.0f}.json"), "w"))
