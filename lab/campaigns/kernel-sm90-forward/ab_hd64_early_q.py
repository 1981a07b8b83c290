"""A/B (device, H100, 2026-11-22, the kernel with the unpeeled KV loop): hd64 with early_q_release off (the auto choice for
3 consumer warpgroups) and on, now that the loop no longer peels its last block. Run from the repo
root: source .gpu/setup-device.sh; python3 <this file> (writes $OUT/ab_hd64_early_q.json)."""
import sys, json, os, statistics, torch
sys.path.insert(0, '.')
from lab.tools.ctas_sm90 import probe_cycles
from lab.tools.causal_sm90 import _event_us
import fa4kernel
torch.manual_seed(0)
out = {"device": torch.cuda.get_device_name(), "loop": {}, "e2e": []}
# one CTA's loop (exact cycles, two K lengths), 192-row tile, early_q_release off (auto) vs on
for causal in (False, True):
    for eq in (False, True):
        cyc = {}
        for sk in (16384, 32768):
            q = torch.randn(1, 192, 1, 64, device='cuda', dtype=torch.bfloat16)
            k = torch.randn(1, sk, 1, 64, device='cuda', dtype=torch.bfloat16); v = torch.randn_like(k)
            cyc[sk] = probe_cycles(q, k, v, {"tile_m": 192, "tile_n": 128, "early_q_release": eq}, False, 7, causal=causal)[0]
        per = (cyc[32768] - cyc[16384]) / 128
        out["loop"][f"causal={causal},early_q_release={eq}"] = per
        print(f"loop hd64 causal={causal} early_q_release={eq}: {per:.0f} cycles per KV block", flush=True)
# end to end, the benchmark's shapes (16k tokens, 32 heads), round-robin, 3 rounds
for s in (1024, 4096, 16384):
    b, h = 16384 // s, 32
    q, k, v = (torch.randn(b, s, h, 64, device='cuda', dtype=torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        flop = 4 * b * h * s * s * 64 / (2 if causal else 1)
        res = {False: [], True: []}
        for _ in range(3):
            for eq in (False, True):
                res[eq].append(_event_us(lambda: fa4kernel.attention(q, k, v, causal=causal, early_q_release=eq)))
        row = {"seqlen": s, "causal": causal, "us_off": statistics.median(res[False]), "us_on": statistics.median(res[True])}
        row["on_over_off_speed"] = row["us_off"] / row["us_on"]
        out["e2e"].append(row)
        print(f"hd64 {s:5d} causal={causal}: off {flop/row['us_off']/1e6:.0f}, on {flop/row['us_on']/1e6:.0f} TFLOP/s, on/off {row['on_over_off_speed']:.3f}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "ab_hd64_early_q.json"), "w"), indent=1)
