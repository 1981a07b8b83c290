"""Check the Blackwell model on your B200: flash-attn-4's SM100 forward and backward (and
fa4kernel's SM100 forward) timed as a user runs them, then `fa4sim validate FILE` compares.

    python3 lab/tools/sustained_sm100.py --out sustained_b200.json && fa4sim validate sustained_b200.json
    python3 lab/tools/sustained_sm100.py --dry-run        # the points and the plan, no GPU
    python3 lab/tools/sustained_sm100.py --quick --out ... # 5 points, about 2 minutes

Needs a GPU of compute capability 10.x (B200, GB200), torch, and flash-attn-4 (its CuTe-DSL
kernels, `pip install flash-attn-4`); fa4kernel's SM100 forward is timed beside it where it runs.
The method is lab/tools/sustained_sm90.py's, shared with it (Sustained): each candidate alone,
checked once against an fp32 reference (the forward: relative error of a few (batch, head)
slices < 1e-2 and no NaN or Inf; the backward: dq, dk and dv of the same kernel on a small
problem), then back to back for --warm-s so the 1000 W cap settles the clock, then timed in
windows between CUDA events, NVML's SM clock and board power over the same windows. A candidate
whose check fails is recorded with its error and left out of the comparison.

Points (group "paper"): the FA4 paper's B200 grid, 32k tokens per call (batch = 32768 / seqlen),
16 heads: the forward at hd128, causal and not, and hd192/128 causal, 1k-32k; the backward at
hd128, causal and not, 1k-32k (flash-attn-4's dq, dk, dv from a recorded forward:
torch.autograd.grad with retain_graph, called eagerly). The file is kind "sustained" on an SM100 device:
`fa4sim validate` simulates "flash-attn-4" as the b200 profile's forward and "flash-attn-4
backward" as its backward, at the model's own clock, and prints the error of each (with
--uncertainty, each one's band). TFLOP/s count the visible pairs exactly (fa4sim/flops.py), a
backward 2.5 forwards.
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from lab.tools.sustained_sm90 import FLOPS, REL_ERROR_LIMIT  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FWD, BWD, OURS = "flash-attn-4", "flash-attn-4 backward", "fa4kernel"
TOKENS = 32768  # per call, as the FA4 paper's figures
SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768)
QUICK = ("fwd-hd128-1k", "fwd-hd128-8k-causal", "fwd-hd128-8k", "bwd-hd128-8k", "bwd-hd128-8k-causal")
BWD_CHECK_SEQLEN = 2048  # the backward's fp32 check runs on a problem this long, 2 heads


@dataclass(frozen=True)
class Point:
    pass_: str
    hdim: int
    hdim_v: int
    seqlen: int
    causal: bool
    heads: int = 16

    @property
    def batch(self) -> int:
        return max(1, TOKENS // self.seqlen)

    @property
    def name(self) -> str:
        hd = f"hd{self.hdim}" + (f"-{self.hdim_v}" if self.hdim_v != self.hdim else "")
        return f"{self.pass_}-{hd}-{self.seqlen // 1024}k" + ("-causal" if self.causal else "")

    @property
    def flops(self) -> float:
        f = FLOPS.attention_flops(self.batch, self.heads, self.seqlen, self.seqlen, self.hdim, self.hdim_v, self.causal)
        return f * (2.5 if self.pass_ == "bwd" else 1.0)

    def candidates(self) -> tuple[str, ...]:
        if self.pass_ == "bwd":
            return (BWD,)
        return (FWD, OURS) if self.hdim == self.hdim_v else (FWD,)

    def record(self) -> dict:
        return {"name": self.name, "group": "paper", "pass": self.pass_, "batch": self.batch, "heads": self.heads,
                "seqlen": self.seqlen, "seqlen_k": self.seqlen, "hdim": self.hdim, "hdim_v": self.hdim_v,
                "causal": self.causal}


def all_points() -> list[Point]:
    fwd = [Point("fwd", 128, 128, s, c) for c in (False, True) for s in SEQLENS]
    fwd += [Point("fwd", 192, 128, s, True) for s in SEQLENS]
    bwd = [Point("bwd", 128, 128, s, c) for c in (False, True) for s in SEQLENS]
    return fwd + bwd


def select(spec: str | None, quick: bool) -> list[Point]:
    pts = all_points()
    if quick:
        return [p for p in pts if p.name in QUICK]
    if not spec:
        return pts
    names = [n.strip() for n in spec.split(",") if n.strip()]
    known = {p.name: p for p in pts}
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"--points: unknown {', '.join(bad)}; known: {', '.join(known)}")
    return [known[n] for n in names]


def plan_text(points: list[Point], warm_s: float, timed_s: float) -> str:
    runs = sum(len(p.candidates()) for p in points)
    est = runs * (warm_s + timed_s + 3.0)  # + a compile and a check per candidate, roughly
    lines = [f"{len(points)} points, {runs} timed candidates, about {est / 60:.0f} min "
             f"(warm {warm_s:g} s + timed {timed_s:g} s each, plus compiles):"]
    lines += [f"  {p.name:24s} b{p.batch} h{p.heads}: {', '.join(p.candidates())}" for p in points]
    return "\n".join(lines)


def forward_candidates(point: Point, q, k, v) -> dict:
    """name -> forward fn for the point's forward candidates that import (else name -> the error)."""
    out = {}
    try:
        from flash_attn.cute.interface import flash_attn_func

        out[FWD] = lambda: flash_attn_func(q, k, v, causal=point.causal)
    except Exception as e:  # noqa: BLE001  (flash-attn-4 not installed: recorded, the run goes on)
        out[FWD] = repr(e)[:300]
    if OURS in point.candidates():
        import fa4kernel

        out[OURS] = lambda: fa4kernel.attention(q, k, v, causal=point.causal)
    return out


def bench_forward(point: Point, index: int, sustained) -> dict:
    import torch
    from lab.tools.bench_fwd_sm90 import first_call_seconds
    from lab.tools.sustained_sm90 import check_output, reference_check

    torch.manual_seed(20261202 + index)
    q, k = (torch.randn(point.batch, point.seqlen, point.heads, point.hdim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    v = torch.randn(point.batch, point.seqlen, point.heads, point.hdim_v, device="cuda", dtype=torch.bfloat16)
    rec = {**point.record(), "results": {}}
    slices = sorted({(0, 0), (point.batch // 2, point.heads // 2), (point.batch - 1, point.heads - 1)})
    ref = reference_check(q, k, v, point.causal, slices)
    for name, fn in forward_candidates(point, q, k, v).items():
        r = rec["results"].setdefault(name, {})
        if isinstance(fn, str):
            r["error"] = fn
            continue
        try:
            r["first_call_s"] = first_call_seconds(fn)
            out = fn()
            torch.cuda.synchronize()
            r["check"] = check_output(out, ref)
            if not r["check"]["ok"]:
                r["error"] = "output off the fp32 reference; not timed"
                continue
            r.update(sustained.run(name, fn, out))
            r["tflops"] = point.flops / (r["ms"] * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001  (one candidate failing keeps the run going)
            r["error"] = repr(e)[:500]
            torch.cuda.synchronize()
    return rec


def bench_backward(point: Point, index: int, sustained) -> dict:
    import torch
    from lab.tools.bench_bwd_sm90 import check_grads
    from flash_attn.cute.interface import flash_attn_func

    def fwd(q, k, v, causal):
        out = flash_attn_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    rec = {**point.record(), "results": {}}
    r = rec["results"].setdefault(BWD, {})
    try:
        r["check"] = check_grads(fwd, point.hdim, BWD_CHECK_SEQLEN, point.causal)
        r["check"]["checked_on"] = f"b1 s{min(point.seqlen, BWD_CHECK_SEQLEN)} h2 d{point.hdim}"
        if not r["check"]["ok"]:
            r["error"] = "gradients off the fp32 reference; not timed"
            return rec
        torch.manual_seed(20261202 + index)
        q, k, v, dout = (torch.randn(point.batch, point.seqlen, point.heads, point.hdim, device="cuda",
                                     dtype=torch.bfloat16) for _ in range(4))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = fwd(q, k, v, point.causal)  # the forward stays outside the timed region

        def run():
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        grads = run()
        torch.cuda.synchronize()
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            r["error"] = "non-finite gradients at the timed shape; not timed"
            return rec
        # eagerly: a CUDA graph of autograd calls is refused at best, and a refused capture can leave
        # the RNG mid-capture for every later point ("offset increment outside graph capture")
        eager = copy.copy(sustained)
        eager.launch = "eager"
        r.update(eager.run(BWD, run, grads))
        r["tflops"] = point.flops / (r["ms"] * 1e-3) / 1e12
    except Exception as e:  # noqa: BLE001
        r["error"] = repr(e)[:500]
        torch.cuda.synchronize()
    return rec


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="results JSON (default lab/campaigns/sustained-settled/sustained_<device>_<date>.json)")
    ap.add_argument("--points", help="comma-separated point names (--dry-run lists them)")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--warm-s", type=float, default=2.5, help="back-to-back seconds before timing (>= 1.0)")
    ap.add_argument("--timed-s", type=float, default=1.0, help="timed seconds per candidate (>= 0.5)")
    ap.add_argument("--window-ms", type=float, default=100.0, help="one timed window, ms (10..1000)")
    ap.add_argument("--launch", choices=("graph", "eager"), default="graph",
                    help="back to back as a replayed CUDA graph (default) or eager calls")
    ap.add_argument("--dry-run", action="store_true", help="print the points and the plan; no GPU needed")
    a = ap.parse_args(argv)
    for name, v, lo, hi in (("--warm-s", a.warm_s, 1.0, 600.0), ("--timed-s", a.timed_s, 0.5, 600.0),
                            ("--window-ms", a.window_ms, 10.0, 1000.0)):
        if not lo <= v <= hi:
            ap.error(f"{name} must be in {lo:g}..{hi:g}, got {v:g}")
    try:
        a.selected = select(a.points, a.quick)
    except ValueError as e:
        ap.error(str(e))
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run:
        from lab.tools.hopper import require_blackwell

        require_blackwell("sustained_sm100.py", "--dry-run prints the plan without one")
    print(plan_text(args.selected, args.warm_s, args.timed_s), flush=True)
    if args.dry_run:
        return 0
    import torch
    from lab.tools.bench_fwd_sm90 import nvidia_smi
    from lab.tools.nvml_clock import ClockSampler
    from lab.tools.sustained_sm90 import Sustained, device_meta

    start = time.perf_counter()
    sampler = ClockSampler(torch.cuda.current_device())
    meta = device_meta(torch, sampler)
    meta.update(method="lab/tools/sustained_sm100.py: each candidate alone, checked against fp32, back to back "
                       "for warm_s, then timed windows (sustained_sm90.py's Sustained); the backward is "
                       "torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) after one forward",
                settings={"warm_s": args.warm_s, "timed_s": args.timed_s, "window_ms": args.window_ms,
                          "launch": args.launch, "rel_error_limit": REL_ERROR_LIMIT,
                          "points": [p.name for p in args.selected]})
    name = meta["device"].replace("NVIDIA ", "").replace(" ", "_").lower()
    out = args.out or os.path.join(ROOT, "lab", "campaigns", "sustained-settled", f"sustained_{name}_{dt.date.today()}.json")
    sustained = Sustained(sampler, args.warm_s, args.timed_s, args.window_ms, args.launch)
    results = []
    for i, p in enumerate(args.selected, 1):
        rec = (bench_backward if p.pass_ == "bwd" else bench_forward)(p, i, sustained)
        results.append(rec)
        got = ", ".join(f"{n} {x['tflops']:.0f}" if "tflops" in x else f"{n} failed" for n, x in rec["results"].items())
        print(f"[{i}/{len(args.selected)}] {p.name}: {got} TFLOP/s", flush=True)
        meta["elapsed_s"] = time.perf_counter() - start
        with open(out, "w") as fh:
            json.dump({"meta": meta, "points": results, "complete": False}, fh, indent=1)
    meta["clocks_after"] = nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu")
    with open(out, "w") as fh:
        json.dump({"meta": meta, "points": results, "complete": True}, fh, indent=1)
    sampler.close()
    print(f"wrote {out}; compare: fa4sim validate {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
