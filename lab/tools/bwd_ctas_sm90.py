"""Where a backward launch's SM time goes, CTA by CTA, from the clock-probe build's stamps
(kind "bwd_ctas"): each launch order (grid_order) of fa4kernel's SM90 backward at causal points.

Every CTA of the probe build (sm90/bwd.py, FlashBwdSm90Probe) stamps clock64 and globaltimer at
its start and end. bwd_config.launch_order says which key block of which (batch, k/v head) each
CTA ran, hence how many query blocks it walked. Per launch:

  cycles = overhead + per_block x query blocks      least squares over all CTAs (causal: many counts)
  busy   = sum of CTA ns / (SMs x launch ns)        the share of SM time inside a CTA
  tail   = launch ns after the first SM goes idle for good (its last CTA ended, none started after)

A launch order that ends on short CTAs has a short tail; what busy misses besides the tail is the
gap between one CTA's end and the next one's start on an SM (turnover), which the stamps see as
sum(SM-time) - sum(CTA-time) spread over the launch.

    python3 lab/tools/bwd_ctas_sm90.py --out FILE.json [--orders heads_outer,tail_lpt]   (H100 / H200)
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

POINTS = [(256, 1024, True), (256, 4096, True), (128, 1024, True), (128, 4096, True), (64, 4096, True),
          (256, 4096, False)]  # (head dim, length, causal)
TOKENS, WIDTH = 16384, 2048  # batch x seqlen and heads x head dim, as the 18-point grid


def fit_line(xs, ys):
    """(intercept, slope) of the least-squares line; slope 0 when xs are all equal."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def launch_summary(words, blocks, sms: int) -> dict:
    """words: the probe's 4 int64 per CTA in launch order; blocks: query blocks each CTA walked."""
    rows = [words[i:i + 4] for i in range(0, len(words), 4)]
    ctas = [(c0, g0, c1, g1, n) for (c0, g0, c1, g1), n in zip(rows, blocks) if min(c0, g0, c1, g1) > 0 and c1 > c0]
    t0 = min(r[1] for r in ctas)
    t1 = max(r[3] for r in ctas)
    span = t1 - t0
    busy = sum(r[3] - r[1] for r in ctas) / (sms * span)
    # the first SM idle for good: among the last `sms` CTAs to end, the earliest end (every SM's
    # last CTA is among them when the launch has at least sms CTAs)
    ends = sorted(r[3] for r in ctas)
    first_idle = ends[-sms] if len(ends) >= sms else ends[0]
    a, b = fit_line([r[4] for r in ctas], [r[2] - r[0] for r in ctas])
    ghz = sum(r[2] - r[0] for r in ctas) / max(1, sum(r[3] - r[1] for r in ctas))
    return {"ctas": len(ctas), "launch_us": span / 1e3, "busy": busy, "tail_us": (t1 - first_idle) / 1e3,
            "overhead_cycles": a, "cycles_per_q_block": b, "clock_ghz": ghz,
            "last_start_us": (max(r[1] for r in ctas) - t0) / 1e3}


def run_point(d: int, s: int, causal: bool, orders, reps: int = 5) -> dict:
    import torch

    import fa4kernel
    from fa4kernel.sm90.bwd_config import launch_order, make_bwd_config

    b, h = TOKENS // s, WIDTH // d
    torch.manual_seed(s + d)
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    with torch.no_grad():
        out, lse = fa4kernel.attention(q, k, v, causal=causal, return_lse=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"hdim": d, "seqlen": s, "batch": b, "heads": h, "causal": causal, "orders": {}}
    for order in orders:
        cfg = make_bwd_config("bfloat16", d, causal, grid_order=order)
        stamps = None
        for _ in range(reps):
            *grads, stamps = fa4kernel.attention_backward_probed(do, q, k, v, out, lse, causal=causal,
                                                                 stamps=stamps, grid_order=order)
        torch.cuda.synchronize()
        # query blocks per CTA: a pair's CTAs walk those of its first key block (kernel_bwd.kv_units)
        m_total = -(-s // cfg.tile_m)
        pair = cfg.dq_sum == "pair"
        blocks = []
        for n, _, _ in launch_order(cfg, s, h, b):
            lead = (n - n % 2) if pair else n
            blocks.append(m_total - (min(lead * cfg.tile_n, s) // cfg.tile_m if causal else 0))
        summ = launch_summary(stamps.cpu().tolist(), blocks, sms)
        res["orders"][order] = summ
        print(f"hd{d} {s} {'causal' if causal else 'full'} {order}: {summ['launch_us']:.0f} us, busy "
              f"{summ['busy']:.3f}, tail {summ['tail_us']:.0f} us, {summ['overhead_cycles']:.0f} + "
              f"{summ['cycles_per_q_block']:.0f} x blocks, {summ['clock_ghz']:.3f} GHz", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="result JSON")
    ap.add_argument("--orders", default="heads_outer,tail_lpt", help="grid_order values, comma-separated")
    args = ap.parse_args()
    from lab.tools.hopper import require_hopper

    require_hopper("bwd_ctas_sm90.py")
    from fa4kernel.sm90.bwd_config import GRID_ORDERS

    orders = args.orders.split(",")
    for o in orders:
        if o not in GRID_ORDERS:
            sys.exit(f"--orders: {o!r}; allowed: {', '.join(GRID_ORDERS)}")
    import torch

    from lab.tools.bench_fwd_sm90 import _version
    from lab.tools.provenance import stamp

    res = {"meta": stamp({"device": torch.cuda.get_device_name(0),
                          "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                          "versions": {"torch": torch.__version__, "cutlass_dsl": _version("nvidia-cutlass-dsl")},
                          "method": " ".join(__doc__.split("\n\n")[1:4]).replace("\n", " ")}, "bwd_ctas"),
           "points": []}
    for d, s, causal in POINTS:
        res["points"].append(run_point(d, s, causal, orders))
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
