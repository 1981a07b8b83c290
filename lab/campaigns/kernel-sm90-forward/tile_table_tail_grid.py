"""Host-table variants (last-section waves, L2 section size) over the benchmark grid, one process, round-robin."""
import json, os, sys
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
sys.path.insert(0, root)
import torch
import fa4kernel
from fa4kernel import interface, tile_schedule
from lab.tools.bench_fwd_sm90 import time_interleaved, flops, check_close
orig = interface._schedule
def sched_with(w, sec, cfg, q, k):
    tile_schedule.TAIL_WAVES, interface.L2_SECTION_BYTES = w, sec
    interface._SCHEDULES.clear()
    try:
        return orig(cfg, q, k)
    finally:
        tile_schedule.TAIL_WAVES, interface.L2_SECTION_BYTES = 3, None
        interface._SCHEDULES.clear()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
V = {"t3_l2/8": (3, l2 // 8), "t2_l2/16": (2, l2 // 16), "t1_l2/16": (1, l2 // 16), "t2_l2/32": (2, l2 // 32), "t3_l2/16": (3, l2 // 16)}
out = {"device": torch.cuda.get_device_name(), "variants": {k: [v[0], v[1]] for k, v in V.items()}, "points": {}}
for hd in (64, 128, 256):
    for s in (1024, 4096, 16384):
        for causal in (False, True):
            b, h = 16384 // s, 2048 // hd
            torch.manual_seed(hd + s)
            q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            cfg = interface.resolve_config(q, k, v, causal, False)
            if not interface._scheduled(cfg):
                continue
            tabs = {n: sched_with(w, sec, cfg, q, k) for n, (w, sec) in V.items()}
            def mk(n):
                def run():
                    interface._schedule = lambda cfg_, q_, k_: tabs[n]
                    try:
                        return fa4kernel.attention(q, k, v, causal=causal)
                    finally:
                        interface._schedule = orig
                return run
            fns = {n: mk(n) for n in V}
            ref = fns["t3_l2/8"]()
            for n, f in fns.items():
                assert check_close(f(), ref) < 1e-2, n
            torch.cuda.synchronize()
            t = time_interleaved(fns, reps=11)
            fl = flops(b, h, s, s, hd, causal)
            row = {n: fl / (x[0] * 1e-3) / 1e12 for n, x in t.items()}
            out["points"][f"hd{hd}_s{s}_c{int(causal)}"] = row
            base = row["t3_l2/8"]
            print(hd, s, int(causal), {n: round(x / base, 3) for n, x in row.items()}, round(base, 1), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "tail_grid.json"), "w"), indent=1)
