"""Where the varlen forward's premium over the dense build goes (hd128, equal lengths): the dense
build, the dense build with its host table in the varlen build's tile order, the varlen build
(--nozero: with _zero_v_past_keys traced as nothing), each settled 1.5 s and timed in turn, with
the NVML clock beside the time.

Run on the device from the repository root:
    python3 lab/campaigns/varlen-sm90/premium_ab.py --shapes 16x1024c,64x332c --out OUT.json
"""
import argparse
import json
import os
import sys
sys.path.insert(0, os.getcwd())
import torch
import fa4kernel
from fa4kernel import interface, tile_schedule
from lab.tools.bench_varlen_sm90 import time_call
from lab.tools import nvml_clock

ap = argparse.ArgumentParser()
ap.add_argument("--nozero", action="store_true")
ap.add_argument("--out", required=True)
ap.add_argument("--shapes", default="16x1024c,64x332c", help="BATCHxSEQLEN then c (causal) or n, comma-separated")
a = ap.parse_args()
if a.nozero:
    from fa4kernel.sm90 import fwd
    def nop(self, *args):
        return None
    fwd.FlashFwdSm90._zero_v_past_keys = nop
SAMPLER = nvml_clock.ClockSampler(torch.cuda.current_device())
H, D = 16, 128
res = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "nozero": a.nozero,
                "command": "premium_ab.py " + " ".join(sys.argv[1:])}, "rows": []}
for shp in a.shapes.split(","):
    n, s = map(int, shp[:-1].split("x"))
    causal = shp[-1] == "c"
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(n * s, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(n * s, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(n * s, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.arange(0, n * s + 1, s, device="cuda", dtype=torch.int32)
    qd, kd, vd = (t.view(n, s, H, D) for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(
        qd.transpose(1, 2).float(), kd.transpose(1, 2).float(), vd.transpose(1, 2).float(), is_causal=causal
    ).transpose(1, 2).reshape(q.shape)
    orig_sched, orig_order = interface._schedule, tile_schedule.tile_order
    # the dense build's host table in the order the varlen build counted tiles when this ran:
    # sequence by sequence, head by head, each head's Q tiles from the last down (causal)
    def varlen_order(num_m_, num_hb, kvb, sec, tail_tiles=0, cost=None):
        ms = range(num_m_ - 1, -1, -1) if causal else range(num_m_)
        return [m + num_m_ * hb for hb in range(num_hb) for m in ms]
    tile_schedule.tile_order = varlen_order
    interface._SCHEDULES.clear()
    fa4kernel.attention(qd, kd, vd, causal=causal)
    vt = dict(interface._SCHEDULES)
    interface._SCHEDULES.clear()
    tile_schedule.tile_order = orig_order
    fa4kernel.attention(qd, kd, vd, causal=causal)
    table_v = next(iter(vt.values()))
    def with_table(t):
        def run():
            interface._schedule = lambda cfg_, q_, k_: t
            try:
                return fa4kernel.attention(qd, kd, vd, causal=causal)
            finally:
                interface._schedule = orig_sched
        return run
    cands = {
        "dense": lambda: fa4kernel.attention(qd, kd, vd, causal=causal),
        "dense.varlen_order": with_table(table_v),
        "varlen": lambda: fa4kernel.attention(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                              max_seqlen_q=s, max_seqlen_k=s),
    }
    if a.nozero:
        cands = {"varlen": cands["varlen"]}
    flops = 4 * n * H * D * (s * (s + 1) / 2 if causal else s * s)
    row = {"shape": shp, "batch": n, "seqlen": s, "causal": causal, "results": {}}
    for name, fn in cands.items():
        o = fn()
        o = o[0] if isinstance(o, tuple) else o
        err = ((o.reshape(q.shape).float() - ref).abs().max() / ref.abs().max()).item()
        row["results"][name] = {"rel_error": err, "runs": []}
    for name, fn in cands.items():
        r = time_call(torch, fn, 1.5, 8, 20.0, SAMPLER, f"{shp}:{name}")
        r["tflops"] = flops / r["us"] / 1e6
        mhz = r.get("nvml", {}).get("mhz_mean")
        if mhz:
            r["kcycles"] = r["us"] * mhz / 1e3  # time x the mean NVML clock of the timed batches
        row["results"][name]["runs"].append(r)
        print(shp, name, f"{r['us']:.1f} us", f"{mhz} MHz", f"{r.get('kcycles', 0):.1f} kcyc",
              f"err {row['results'][name]['rel_error']:.2e}", flush=True)
    res["rows"].append(row)
json.dump(res, open(a.out, "w"), indent=1)
