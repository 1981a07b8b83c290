"""Where does a short causal launch lose its time? (device script)

    python3 lab/tools/causal_sm90.py --out $OUT/causal.json [--hdims 128,64]

The benchmark's causal 1k points (16 batches x 1024 tokens, heads x hdim = 2048) run far below
what their tiles cost one by one. This script separates the candidates, all with the clock-probe
build (exact SM cycles of one CTA per launch; no clock conversion):

1. tile cost: one persistent CTA (interface.MAX_CTAS = 1) walks the causal tiles of 2 heads
   (1..n KV blocks each, the diagonal block masked), K/V L2-resident; against the same CTA walking
   non-causal tiles of the same heads: is a causal tile dearer than its blocks?
2. the full launch, persistent, for several causal tile orders (fa4kernel.interface.L2_SECTION_BYTES:
   how many bytes of K/V one section of (batch, head) pairs may take; 0 = longest-first over all
   heads; default L2 / 4): cycles of several CTAs, each CTA's expected work from the host schedule
   (fa4kernel.tile_schedule), and the CUDA-event time of the launch. If the CTAs' cycles exceed
   their expected work, the launch waits on memory; if they differ from each other, on balance.
3. the same launch with one CTA per tile (the hardware's block scheduler balances).
4. persistent vs one CTA per tile, plain kernel, causal, seqlen 1k..16k (the default's choice).

Does NOT import fa4sim.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CTAS = (0, 33, 66, 99, 131)
SECTIONS_MB = (None, 48, 12, 0)  # None: the shipped default (L2 / 8)


def expected_work(cfg, b, h, s, section_bytes, grid):
    """Per CTA of the host schedule (fa4kernel.tile_schedule): number of tiles and KV blocks."""
    from fa4kernel.tile_schedule import kv_blocks, make_schedule

    rows = make_schedule(b, h, s, s, cfg.head_dim, cfg.tile_m, cfg.tile_n, grid, section_bytes, True, grid)
    num_m = math.ceil(s / cfg.tile_m)
    return ([len(r) for r in rows],
            [sum(kv_blocks(t % num_m, cfg.tile_m, cfg.tile_n, s, s) for t in r) for r in rows])


def _probe(q, k, v, causal, cta, reps, **kw):
    import torch

    from fa4kernel.interface import attention_probed
    from fa4kernel.trace import header_clock
    from fa4kernel.trace_layout import TRACE_WORDS

    st = torch.zeros((TRACE_WORDS,), dtype=torch.int64, device=q.device)
    st[0] = cta
    attention_probed(q, k, v, causal=causal, stamps=st, **kw)
    cyc, ghz = [], []
    for _ in range(reps):
        attention_probed(q, k, v, causal=causal, stamps=st, **kw)
        torch.cuda.synchronize()
        hc = header_clock(st[:5].tolist())
        cyc.append(hc["cycles"])
        ghz.append(hc["ghz"])
    return statistics.median(cyc), statistics.median(ghz)


def _event_us(fn, inner=20, reps=5):
    """Median us per call of `inner` back-to-back calls queued behind a GPU spin (host excluded)."""
    import torch

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    out = []
    for _ in range(reps):
        torch.cuda._sleep(600_000 * inner)
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) * 1e3 / inner)
    return statistics.median(out)


def tile_walk(hd, reps):
    import torch

    from fa4kernel import interface

    row = {"hdim": hd}
    q, k, v = (torch.randn(1, 1024, 2, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = interface.resolve_config(q, k, v, True)  # the tile the causal launch runs (short-causal hd64: 128 rows)
    interface.MAX_CTAS = 1
    try:
        for causal in (False, True):
            cyc, ghz = _probe(q, k, v, causal, 0, reps, persistent=True)
            num_m = math.ceil(1024 / cfg.tile_m)
            blocks = sum(max(1, math.ceil(min((m + 1) * cfg.tile_m, 1024) / cfg.tile_n)) if causal
                         else math.ceil(1024 / cfg.tile_n) for m in range(num_m)) * 2
            row["causal" if causal else "non_causal"] = {"tiles": 2 * num_m, "kv_blocks": blocks,
                                                         "cycles": cyc, "clock_ghz": ghz}
    finally:
        interface.MAX_CTAS = None
    print(f"hd{hd} one CTA, 2 heads x 1k: " + json.dumps(row), flush=True)
    return row


def full_launch(hd, reps):
    import torch

    from fa4kernel import attention
    from fa4kernel.interface import resolve_config

    b, s, h = 16, 1024, 2048 // hd
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = resolve_config(q, k, v, True)  # the tile the causal launch runs (short-causal hd64: 128 rows)
    flop = 4 * b * h * s * s * hd / 2
    rows = []
    from fa4kernel import interface
    from fa4kernel.interface import attention_probed
    from fa4kernel.trace_layout import TRACE_WORDS

    for sec in SECTIONS_MB:
        interface.L2_SECTION_BYTES = None if sec is None else sec << 20
        section_bytes = interface._section_bytes(q.device)
        tiles, blocks = expected_work(cfg, b, h, s, section_bytes, grid)
        ctas = {}
        for c in CTAS:
            cyc, ghz = _probe(q, k, v, True, c, reps, persistent=True)
            ctas[str(c)] = {"cycles": cyc, "clock_ghz": ghz, "tiles": tiles[c], "kv_blocks": blocks[c]}
        us = None
        if sec is None:  # the shipped order: also the plain kernel's event time
            us = _event_us(lambda: attention(q, k, v, causal=True, persistent=True))
        st = torch.zeros((TRACE_WORDS,), dtype=torch.int64, device="cuda")
        us_probe = _event_us(lambda: attention_probed(q, k, v, causal=True, persistent=True, stamps=st))
        row = {"hdim": hd, "persistent": True, "section_bytes": section_bytes, "ctas": ctas,
               "max_kv_blocks_per_cta": max(blocks), "mean_kv_blocks_per_cta": sum(blocks) / grid,
               "event_us_probe_build": us_probe, "event_us_plain": us,
               "tflops_probe_build": flop / us_probe / 1e6}
        rows.append(row)
        print(f"hd{hd} causal 1k persistent section {section_bytes / 2**20:5.1f} MiB: {us_probe:7.1f} us "
              f"({row['tflops_probe_build']:.0f} TFLOP/s), max blocks/CTA {max(blocks)}; CTAs " +
              ", ".join(f"{c}: {x['cycles']:.0f} cyc / {x['kv_blocks']} blk / {x['tiles']} t"
                        for c, x in ctas.items()), flush=True)
    interface.L2_SECTION_BYTES = None
    us = _event_us(lambda: attention(q, k, v, causal=True, persistent=False))
    ctas = {str(c): dict(zip(("cycles", "clock_ghz"), _probe(q, k, v, True, c, reps, persistent=False)))
            for c in (0, 1000, min(2047, b * h * math.ceil(s / cfg.tile_m) - 1))}
    rows.append({"hdim": hd, "persistent": False, "event_us_plain": us, "tflops": flop / us / 1e6,
                 "ctas": ctas})
    print(f"hd{hd} causal 1k, one CTA per tile: {us:.1f} us ({flop / us / 1e6:.0f} TFLOP/s); {ctas}", flush=True)
    return rows


def persistent_vs_not(hd, seqlens=(1024, 2048, 4096, 16384)):
    """The plain kernel, causal, persistent or one CTA per tile, at the benchmark's shapes."""
    import torch

    from fa4kernel import attention

    rows = []
    for s in seqlens:
        b, h = max(16384 // s, 1), 2048 // hd
        q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flop = 4 * b * h * s * s * hd / 2
        row = {"hdim": hd, "seqlen": s, "batch": b, "heads": h}
        for pers in (True, False):
            us = _event_us(lambda: attention(q, k, v, causal=True, persistent=pers))
            row["persistent" if pers else "one_cta_per_tile"] = {"us": us, "tflops": flop / us / 1e6}
        rows.append(row)
        print(f"hd{hd} causal {s:5d}: persistent {row['persistent']['tflops']:.0f}, one CTA per tile "
              f"{row['one_cta_per_tile']['tflops']:.0f} TFLOP/s", flush=True)
        del q, k, v
    return rows


HD64_KNOBS = [{}, {"exp_emulation": 0.125}, {"exp_emulation": 0.25}, {"rescale_threshold": 8.0},
              {"exp_emulation": 0.125, "rescale_threshold": 8.0}]


def hd64_knobs(seqlens=(1024, 4096)):
    """hd64 is co-bound by MUFU.EX2 and the tensor core (128 MACs and one exp2 per score: 0.0625
    cycles each per SM): does FA4's exp2 emulation or conditional rescaling pay off here?"""
    import torch

    from fa4kernel import attention

    rows = []
    for s in seqlens:
        b, h = 16384 // s, 32
        q, k, v = (torch.randn(b, s, h, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            flop = 4 * b * h * s * s * 64 / (2 if causal else 1)
            for kn in HD64_KNOBS:
                us = _event_us(lambda: attention(q, k, v, causal=causal, **kn))
                rows.append({"hdim": 64, "seqlen": s, "causal": causal, "knobs": kn, "us": us,
                             "tflops": flop / us / 1e6})
                print(f"hd64 {s} causal={causal} {kn}: {flop / us / 1e6:.0f} TFLOP/s", flush=True)
        del q, k, v
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hdims", default="128,64")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only-sweep", action="store_true",
                    help="only step 4 (persistent vs not, 1k..16k) and the hd64 knob check")
    args = ap.parse_args()
    from lab.tools.hopper import require_hopper

    require_hopper("causal_sm90.py")

    import torch

    from lab.tools.provenance import stamp

    torch.manual_seed(0)
    res = {"meta": {"device": torch.cuda.get_device_name(), "date": dt.datetime.now(dt.timezone.utc)
                    .isoformat(timespec="seconds"), "torch": torch.__version__, "reps": args.reps,
                    "method": __doc__.strip().split("\n\n")[1]}, "tile_walk": [], "full_launch": [],
           "persistent_vs_not": []}
    stamp(res["meta"], "causal_launches")
    for hd in ([] if args.only_sweep else (int(x) for x in args.hdims.split(","))):
        res["tile_walk"].append(tile_walk(hd, args.reps))
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        res["full_launch"] += full_launch(hd, args.reps)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    for hd in (int(x) for x in args.hdims.split(",")):
        res["persistent_vs_not"] += persistent_vs_not(hd)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    if args.only_sweep:
        res["hd64_knobs"] = hd64_knobs()
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
