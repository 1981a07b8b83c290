"""The varlen forward where O shares Q's buffer (hd96 without a mask, hd192, hd256): one CTA per
tile (the default there, the dense forward's rule) against persistent CTAs (persistent=True),
side by side in one run, twice in turn (A B A B), each settled 1.5 s; outputs compared first.

Run on the device from the repository root:
    python3 lab/campaigns/varlen-sm90/persistent_ab.py [OUT.json]
"""
import json
import sys

import torch

sys.path.insert(0, ".")
import fa4kernel  # noqa: E402
from lab.tools import bench_varlen_sm90 as bench  # noqa: E402

rows = []
for name in ("hd256-causal", "odd-hd96", "hd192-causal"):
    b = {x.name: x for x in bench.BATCHES}[name]
    q, k, v, cq, ck = bench.inputs(torch, b)
    mq, mk = max(b.seqlens), max(b.keys)

    def call(**kn):
        return lambda: fa4kernel.attention(q, k, v, causal=b.causal, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                           max_seqlen_q=mq, max_seqlen_k=mk, **kn)

    variants = {"one CTA per tile": call(), "persistent": call(persistent=True)}
    outs = [f() for f in variants.values()]
    same = bool(torch.equal(outs[0], outs[1]))
    times = {n: [] for n in variants}
    for _ in range(2):
        for n, f in variants.items():
            times[n].append(bench.time_call(torch, f, 1.5, 10, 20.0)["us"])
    row = {"point": name, "bitwise_equal": same, "us": times,
           "tflops": {n: [b.flops() / (t * 1e-6) / 1e12 for t in ts] for n, ts in times.items()}}
    rows.append(row)
    print(name, "equal" if same else "DIFFERENT", {n: [round(t, 1) for t in ts] for n, ts in times.items()}, flush=True)
doc = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "what": "fa4kernel varlen forward, us per call (settled, median of 10 batches), two rounds in turn"},
       "rows": rows}
if len(sys.argv) > 1:
    json.dump(doc, open(sys.argv[1], "w"), indent=1)
