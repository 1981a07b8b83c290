"""Attention as a user sees it on an H100 or H200: each kernel runs back to back long enough for
the 700 W power cap to settle the clock, and only then is it timed (kind "sustained";
`fa4sim validate FILE` predicts every point without a measured clock and compares).

Short round-robin bursts (bench_fwd_sm90.py) catch the GPU before the power cap has pulled its
clock down, and let every candidate share one clock. A user's training or serving loop runs one
kernel for seconds, at the clock its own power allows: a kernel that keeps the tensor core busier
draws more power and runs at a lower clock. So here each candidate, at each point, in turn:

  1. compiles (its first call) and is checked once against an fp32 reference (relative error of
     a few (batch, head) slices < 1e-2, no NaN or Inf anywhere in its output);
  2. runs back to back for --warm-s (2.5 s; >= 1.0) so the clock settles under the power cap;
  3. is timed for >= --timed-s (1.0 s; >= 0.5): windows of about --window-ms (100 ms) of back-to-back
     calls between two CUDA events, ms per call = the median over the windows; NVML's SM clock
     and board power (sampled, and from the energy counter) over exactly those windows.

Back to back means a CUDA graph of calls replayed (no host launch path between kernels, which at
1k tokens is as long as the kernel itself), checked to recompute the eager output; where a graph
cannot be captured the calls go eagerly (recorded per candidate as "launch").

Candidates: fa4kernel (its default build), fa4kernel's clock-probe build (the same kernel plus
clock64 / globaltimer at CTA 0's start and end, summed over every launch: per window, the mean SM
clock of all its launches, not one launch's sample, since the cap's controller moves the clock by
several percent from one window to the next; a persistent launch's CTA 0 spans the launch, a
launch of one CTA per tile uses the CTA-log build, where every CTA adds its span), FlashAttention-3
(the C++/CUTLASS kernel, tokenspeed-fa3's flash_attn_interface), flash-attn-4's SM90 forward
(flash_attn.cute) and torch SDPA's cuDNN backend. Their order
rotates from point to point, so none always follows the same one.

Points: the 18-point grid of docs/accuracy.md (hd 64 / 128 / 256 x 1k / 4k / 16k tokens x causal
and not; b * s = 16384 tokens, heads * hdim = 2048) and points never measured before (group
"new"): 32k tokens of one sequence, hd64 8k, hd256 2k, chunked prefill (causal, seqlen_q <
seqlen_k), DeepSeek's hd192 / 128 (flash-attn-4 only: fa4kernel has hdim_v = hdim), and heads *
hdim = 4096. Named groups of problems measured once to test a prediction made before they ran
(holdout, unseen, fresh, blind, untried, novel, paired) run only when asked for, and --problem adds any
problem of your own (group "asked"). TFLOP/s count the visible (query, key) pairs exactly
(fa4sim/flops.py).

Usage (device, from the repository root):
    source .gpu/setup-device.sh && python3 lab/tools/sustained_sm90.py --out $OUT/sustained_h100.json
    python3 lab/tools/sustained_sm90.py --dry-run                 # the points and the plan, no GPU
    python3 lab/tools/sustained_sm90.py --quick --out ...         # 6 points
    python3 lab/tools/sustained_sm90.py --points new,hd128-4k-b4-h16 --out ...
    python3 lab/tools/sustained_sm90.py --problem b=5,h=16,sq=3000,d=128,causal --out ...   # your own
    python3 lab/tools/sustained_sm90.py --problem b=8,h=16,kv=1,sq=2048,d=64,causal --out ...  # MQA
The whole default run takes about 7 minutes on an H100 or H200 (compiles included); --budget-s stops
starting new points past that many seconds, and the file is rewritten after every point.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# names of the candidates in the result file (bench_fwd_sm90.py's, so readers share them)
OURS = "fa4kernel"
PROBE = "fa4kernel[clock probe]"
PEER = "flash-attn-4"
FA3 = "flash-attn-3"  # FlashAttention-3's forward (bench_fwd_sm90.FA3)
CUDNN = "sdpa-cudnn"  # torch SDPA's cuDNN backend
CANDIDATES = (OURS, PROBE, FA3, PEER, CUDNN)
SHORT = {OURS: "ours", PROBE: "probe", FA3: "fa3", PEER: "fa4", CUDNN: "cudnn"}  # --candidates' names
# (hdim, hdim_v) its package runs; hd96 and 192/128 in its hd128 / hd192 kernels (the build has
# none of their own: docs/reference/fa4-schedules.md, fa4sim's flash-attn-3 compiled_head_dims)
FA3_PAIRS = ((64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128))
# fa4kernel's SM90 head dims (fa4kernel/sm90/config.py), with hdim_v = hdim
OURS_HEAD_DIMS = (64, 96, 128, 192, 256)
REL_ERROR_LIMIT = 1e-2  # against the fp32 reference: bf16 output rounding alone is about 3e-3
MIN_WARM_S, MIN_TIMED_S = 1.0, 0.5
GRAPH_CHUNK_MS = 20.0  # calls per CUDA graph: about this much GPU time (at most GRAPH_MAX_CALLS)
GRAPH_MAX_CALLS = 256
# rough costs for the plan (--dry-run): a first call that compiles, and the host's work per
# candidate besides warm-up and timing (estimating the call time, capturing the graph, checking)
COMPILE_S, CANDIDATE_OVERHEAD_S, POINT_OVERHEAD_S = 2.5, 0.4, 0.5


def load_flops():
    """fa4sim/flops.py by its path: the repository's one FLOP count, without the fa4sim package
    (its simulator needs simpy, which the device machine lacks)."""
    spec = importlib.util.spec_from_file_location("fa4sim_flops", os.path.join(ROOT, "fa4sim", "flops.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FLOPS = load_flops()


@dataclass(frozen=True)
class Point:
    """One attention forward: q (batch, seqlen_q, heads, hdim), k (batch, seqlen_k, heads_kv, hdim),
    v (batch, seqlen_k, heads_kv, hdim_v); causal is bottom-right aligned; heads_kv (0: heads) divides
    heads: grouped K/V heads (GQA; 1: MQA), q head h reading K/V head h // (heads // heads_kv).
    group: "grid" (the 18 points of docs/accuracy.md) or "new"."""

    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    hdim: int
    hdim_v: int
    causal: bool
    group: str
    heads_kv: int = 0

    def __post_init__(self):
        if not self.heads_kv:
            object.__setattr__(self, "heads_kv", self.heads)
        if self.heads % self.heads_kv:
            raise ValueError(f"heads_kv={self.heads_kv} must divide heads={self.heads}")

    @property
    def name(self) -> str:
        def k(n):
            return f"{n // 1024}k" if n % 1024 == 0 else str(n)

        dims = f"hd{self.hdim}" + (f"v{self.hdim_v}" if self.hdim_v != self.hdim else "")
        lens = k(self.seqlen_q) if self.seqlen_q == self.seqlen_k else f"q{k(self.seqlen_q)}-k{k(self.seqlen_k)}"
        kv = f"-kv{self.heads_kv}" if self.heads_kv != self.heads else ""
        return f"{dims}-{lens}-b{self.batch}-h{self.heads}{kv}" + ("-causal" if self.causal else "")

    @property
    def flops(self) -> float:
        """The visible (query, key) pairs' FLOPs: the same for any heads_kv (every q head does its own)."""
        return FLOPS.attention_flops(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.hdim, self.hdim_v,
                                     self.causal)

    def candidates(self) -> tuple:
        """Who runs this problem: fa4kernel (and its probe) where it has the head dim and hdim_v =
        hdim; FlashAttention-3 at the head dims it is built for; flash-attn-4 everywhere (its SM90
        path takes head dims 8-256 in steps of 8); cuDNN where its causal mask (top-left) is ours
        (bottom-right): seqlen_q = seqlen_k or no mask. Grouped K/V heads: all of them take k and v with
        heads_kv heads (fa4kernel's SM90 forward, flash-attn-4, flash_attn_interface; cuDNN through SDPA's
        enable_gqa, which its cuDNN backend accepts with any heads_kv dividing heads)."""
        ours = self.hdim == self.hdim_v and self.hdim in OURS_HEAD_DIMS
        fa3 = (self.hdim, self.hdim_v) in FA3_PAIRS
        cudnn = self.seqlen_q == self.seqlen_k or not self.causal
        return tuple(c for c, on in ((OURS, ours), (PROBE, ours), (FA3, fa3), (PEER, True), (CUDNN, cudnn)) if on)

    def record(self) -> dict:
        """The problem as the result file holds it (seqlen = seqlen_q, as in bench_fwd_sm90.py)."""
        return {"name": self.name, "group": self.group, "batch": self.batch, "heads": self.heads,
                "heads_kv": self.heads_kv, "seqlen": self.seqlen_q, "seqlen_k": self.seqlen_k, "hdim": self.hdim, "hdim_v": self.hdim_v,
                "causal": self.causal, "flops": self.flops}


def grid_points() -> list[Point]:
    """docs/accuracy.md's 18 points: 16k tokens (batch x seqlen), heads x hdim = 2048."""
    return [Point(16384 // s, 2048 // d, s, s, d, d, causal, "grid")
            for d in (64, 128, 256) for s in (1024, 4096, 16384) for causal in (False, True)]


def new_points() -> list[Point]:
    """Problems never measured before, each causal and not (chunked prefill: causal only)."""
    shapes = [
        (1, 16, 32768, 32768, 128, 128),  # one long sequence
        (2, 32, 8192, 8192, 64, 64),      # hd64 at 8k
        (8, 8, 2048, 2048, 256, 256),     # hd256 at 2k
        (4, 16, 4096, 4096, 192, 128),    # DeepSeek's head dims (flash-attn-4 only)
        (4, 32, 4096, 4096, 128, 128),    # heads x hdim = 4096
    ]
    pts = [Point(b, h, sq, sk, d, dv, causal, "new") for b, h, sq, sk, d, dv in shapes for causal in (False, True)]
    # chunked prefill: a chunk of queries against a longer cache (bottom-right causal)
    pts += [Point(8, 16, 2048, 8192, 128, 128, True, "new"), Point(4, 16, 1024, 16384, 128, 128, True, "new")]
    return pts


def holdout_points() -> list[Point]:
    """Problems measured only after the power model's last change, each predicted before it ran
    (group "holdout"): 2k tokens at hd64 and hd128, hd256 at 8k, 1k tokens in a batch of 32, and
    a 4k chunk on a 16k cache."""
    shapes = [(8, 32, 2048, 2048, 64), (8, 16, 2048, 2048, 128), (2, 8, 8192, 8192, 256), (32, 16, 1024, 1024, 128)]
    pts = [Point(b, h, sq, sk, d, d, causal, "holdout") for b, h, sq, sk, d in shapes for causal in (False, True)]
    return pts + [Point(4, 16, 4096, 16384, 128, 128, True, "holdout")]


def unseen_points() -> list[Point]:
    """Problems no run had measured when the softmax's MUFU share entered the model, each predicted
    before it ran (group "unseen"): hd64 at 3k and 6k tokens, hd128 at 12k, hd256 at 3k causal, and
    an hd64 chunk of 2k queries on an 8k cache."""
    shapes = [(6, 32, 3072, 3072, 64), (3, 32, 6144, 6144, 64), (1, 16, 12288, 12288, 128)]
    pts = [Point(b, h, sq, sk, d, d, causal, "unseen") for b, h, sq, sk, d in shapes for causal in (False, True)]
    return pts + [Point(4, 8, 3072, 3072, 256, 256, True, "unseen"), Point(4, 32, 2048, 8192, 64, 64, True, "unseen")]


def fresh_points() -> list[Point]:
    """Problems no run had measured when warps sharing a scheduler entered the model, each predicted
    before it ran (group "fresh"): hd64 at 5k tokens, hd128 at 10k, hd256 at 5k, causal and not, a
    3k chunk of hd128 queries on a 12k cache and a 1k chunk of hd64 queries on 16k."""
    shapes = [(2, 32, 5120, 5120, 64), (1, 16, 10240, 10240, 128), (4, 8, 5120, 5120, 256)]
    pts = [Point(b, h, sq, sk, d, d, causal, "fresh") for b, h, sq, sk, d in shapes for causal in (False, True)]
    return pts + [Point(4, 16, 3072, 12288, 128, 128, True, "fresh"), Point(8, 32, 1024, 16384, 64, 64, True, "fresh")]


def blind_points() -> list[Point]:
    """Problems no run had measured when an RS wgmma's register operand entered the power model,
    each predicted before it ran (group "blind"): hd64 at 7k tokens, hd128 at 6k, hd256 at 12k,
    causal and not, a 2k chunk of hd128 queries on a 20k cache and a 1k chunk of hd256 queries on 8k."""
    shapes = [(2, 32, 7168, 7168, 64), (2, 16, 6144, 6144, 128), (1, 8, 12288, 12288, 256)]
    pts = [Point(b, h, sq, sk, d, d, causal, "blind") for b, h, sq, sk, d in shapes for causal in (False, True)]
    return pts + [Point(4, 16, 2048, 20480, 128, 128, True, "blind"), Point(8, 8, 1024, 8192, 256, 256, True, "blind")]


def untried_points() -> list[Point]:
    """Problems no run had measured when a tile's live rows entered the power model (a tile whose
    idle warpgroups skip their work counts only its live rows' work), each predicted before it ran
    (group "untried"): hd64 at 1280 and 2560 tokens (their last 192-row tile part full), hd128 at
    3k, hd256 at 6k, causal and not, a 1k chunk of hd64 queries on a 4k cache and a 4k chunk of
    hd128 queries on 24k."""
    shapes = [(12, 32, 1280, 1280, 64), (6, 32, 2560, 2560, 64), (5, 16, 3072, 3072, 128), (2, 8, 6144, 6144, 256)]
    pts = [Point(b, h, sq, sk, d, d, causal, "untried") for b, h, sq, sk, d in shapes for causal in (False, True)]
    return pts + [Point(8, 32, 1024, 4096, 64, 64, True, "untried"), Point(2, 16, 4096, 24576, 128, 128, True, "untried")]


def novel_points() -> list[Point]:
    """Problems no run had measured when P's conversion moved among the exp2s (the O rescale the
    last work before a warpgroup's next GEMMs), each predicted before it ran (group "novel"): hd64
    at 4608 tokens, hd128 at 7k, hd256 at 10k, causal and not, a 1k chunk of hd128 queries on a 32k
    cache, a 2k chunk of hd256 queries on 16k and a 3k chunk of hd64 queries on 12k."""
    shapes = [(3, 32, 4608, 4608, 64), (2, 16, 7168, 7168, 128), (1, 8, 10240, 10240, 256)]
    pts = [Point(b, h, sq, sk, d, d, causal, "novel") for b, h, sq, sk, d in shapes for causal in (False, True)]
    return pts + [Point(4, 16, 1024, 32768, 128, 128, True, "novel"), Point(4, 8, 2048, 16384, 256, 256, True, "novel"),
                  Point(4, 32, 3072, 12288, 64, 64, True, "novel")]


def paired_points() -> list[Point]:
    """Problems no run had measured when P's conversion to 16 bit became one cvt per pair, each
    predicted before it ran (group "paired"): odd lengths at hd64, hd96, hd128, hd192 and hd256,
    grouped K/V heads (32 / 8 and 64 / 8 q / k-v heads, MQA 16 / 1), a chunk of GQA queries on a
    longer cache and a short hd64 chunk."""
    P = Point
    return [P(3, 32, 3333, 3333, 64, 64, False, "paired"), P(2, 16, 5555, 5555, 128, 128, True, "paired"),
            P(2, 32, 6000, 6000, 128, 128, True, "paired", 8), P(2, 64, 2500, 2500, 128, 128, False, "paired", 8),
            P(4, 16, 4500, 4500, 64, 64, True, "paired", 1), P(3, 20, 4321, 4321, 96, 96, False, "paired"),
            P(2, 16, 5000, 5000, 192, 192, True, "paired"), P(3, 8, 3700, 3700, 256, 256, False, "paired"),
            P(2, 32, 1500, 9000, 128, 128, True, "paired", 8), P(4, 32, 777, 5000, 64, 64, True, "paired")]


PROBLEM_KEYS = {"b": "batch", "h": "heads", "kv": "heads_kv", "sq": "seqlen_q", "sk": "seqlen_k", "d": "hdim",
                "dv": "hdim_v"}


def parse_problem(spec: str) -> Point:
    """A user's own problem (group "asked"): 'b=5,h=16,sq=3000,d=128' with optional sk= (seqlen_k,
    default sq), dv= (hdim_v, default d), kv= (heads_kv, K/V heads, a divisor of h; default h) and
    the flag causal; ValueError in one line otherwise."""
    vals, causal = {}, False
    for tok in (t.strip() for t in spec.split(",") if t.strip()):
        if tok == "causal":
            causal = True
            continue
        key, eq, val = tok.partition("=")
        if not eq or key not in PROBLEM_KEYS:
            raise ValueError(f"--problem {spec!r}: {tok!r} is not one of {', '.join(k + '=N' for k in PROBLEM_KEYS)} "
                             "or causal")
        try:
            vals[key] = int(val)
        except ValueError:
            raise ValueError(f"--problem {spec!r}: {key}={val!r} is not a whole number") from None
        if vals[key] <= 0:
            raise ValueError(f"--problem {spec!r}: {key}={val} must be positive")
    missing = [k for k in ("b", "h", "sq", "d") if k not in vals]
    if missing:
        raise ValueError(f"--problem {spec!r}: give {', '.join(k + '=N' for k in missing)} "
                         "(b batch, h heads, sq seqlen_q, d head dim)")
    d = vals["d"]
    dv = vals.get("dv", d)
    if d % 8 or dv % 8 or not 8 <= d <= 256 or not 8 <= dv <= 256:
        raise ValueError(f"--problem {spec!r}: head dims d={d}, dv={dv}: allowed 8-256 in steps of 8 "
                         "(flash-attn-4's SM90 path; fa4kernel runs d = dv in 64, 96, 128, 192, 256)")
    kv = vals.get("kv", vals["h"])
    if vals["h"] % kv:
        raise ValueError(f"--problem {spec!r}: kv={kv} must divide h={vals['h']} (K/V heads shared by h / kv q heads)")
    return Point(vals["b"], vals["h"], vals["sq"], vals.get("sk", vals["sq"]), d, dv, causal, "asked", kv)


def parse_variant(spec: str) -> tuple[str, dict, int | None]:
    """A build of fa4kernel with other knobs, timed beside the candidates as 'fa4kernel[LABEL]':
    'tile_n=160' or 'tile_n=176,persistent=True' (values: whole numbers, decimals, True, False,
    None), optionally for one head dim only: 'hd256:tile_n=80'. Returns (label, knobs, head dim or
    None). Knob names are checked here (one-line ValueError), values when the build resolves at a
    point (a value a point cannot take is recorded as that candidate's error)."""
    from fa4kernel.sm90.config import KNOB_NAMES

    knobs, hdim, body = {}, None, spec
    head, colon, rest = spec.partition(":")
    if colon:
        if not (head.startswith("hd") and head[2:].isdigit()):
            raise ValueError(f"--variant {spec!r}: {head!r} before ':' must name a head dim, e.g. hd256")
        hdim, body = int(head[2:]), rest
    for tok in (t.strip() for t in body.split(",") if t.strip()):
        key, eq, val = tok.partition("=")
        if not eq or key not in KNOB_NAMES:
            raise ValueError(f"--variant {spec!r}: {tok!r} is not KNOB=VALUE with KNOB one of {', '.join(KNOB_NAMES)}")
        lit = {"True": True, "False": False, "None": None}
        if val in lit:
            knobs[key] = lit[val]
        else:
            try:
                knobs[key] = int(val)
            except ValueError:
                try:
                    knobs[key] = float(val)
                except ValueError:
                    raise ValueError(f"--variant {spec!r}: {key}={val!r} is not a number, True, False or None") from None
    if not knobs:
        raise ValueError(f"--variant {spec!r}: give at least one KNOB=VALUE (e.g. tile_n=160)")
    return ",".join(f"{k}={v}" for k, v in knobs.items()), knobs, hdim


def variants_at(point: Point, variants) -> list[tuple[str, dict]]:
    """The (label, knobs) of the --variant builds that run at this point: where fa4kernel runs it,
    and at their head dim if they name one."""
    if OURS not in point.candidates():
        return []
    return [(label, knobs) for label, knobs, hdim in variants if hdim in (None, point.hdim)]


def all_points() -> list[Point]:
    """The default run: the grid and the new points (holdout and unseen run when asked for)."""
    return grid_points() + new_points()


QUICK = ("hd128-4k-b4-h16", "hd128-4k-b4-h16-causal", "hd64-1k-b16-h32-causal", "hd256-16k-b1-h8",
         "hd128-q2k-k8k-b8-h16-causal", "hd192v128-4k-b4-h16")
GROUPS = ("grid", "new", "holdout", "unseen", "fresh", "blind", "untried", "novel", "paired", "all")
ASKED_FOR = ("holdout", "unseen", "fresh", "blind", "untried", "novel", "paired")  # groups that run only when named


def select(spec: str | None, quick: bool) -> list[Point]:
    """The points of --points (comma-separated: a group grid / new / all, a point name, or a part of
    names such as 'hd128' or 'causal'), or the QUICK ones; ValueError in one line otherwise."""
    pts = all_points() + holdout_points() + unseen_points() + fresh_points() + blind_points() + untried_points() + novel_points()
    pts += paired_points()
    if quick and not spec:
        return [p for p in pts if p.name in QUICK]
    if not spec:
        return all_points()
    chosen = []
    for tok in (t.strip() for t in spec.split(",") if t.strip()):
        if tok in GROUPS:
            hit = [p for p in pts if (tok == "all" and p.group not in ASKED_FOR) or p.group == tok]
        else:
            hit = [p for p in pts if p.name == tok] or [p for p in pts if tok in p.name]
        if not hit:
            raise ValueError(f"--points: {tok!r} names no point; allowed: {', '.join(GROUPS)}, a point name "
                             f"(see --dry-run) or a part of one (e.g. hd128, causal)")
        chosen += [p for p in hit if p not in chosen]
    return [p for p in pts if p in chosen]  # in the plan's order


def estimate_s(points: list[Point], warm_s: float, timed_s: float, only=CANDIDATES, variants=()) -> dict:
    """A rough plan of the run's seconds: warm-up and timing per candidate (those in `only`, and
    the --variant builds of fa4kernel where they run), compiles (one per build: fa4kernel's default and
    probe per head dim and causal, flash-attn-4's per head dims and causal; the 1k causal hd64 tile
    of fa4kernel is a build of its own), and the host's work. variants: parse_variant's triples."""
    builds, runs = set(), 0
    for p in points:
        cands = [c for c in p.candidates() if c in only]
        extra = len(variants_at(p, variants))
        runs += len(cands) + extra
        for c in cands:
            short = p.causal and p.seqlen_q <= 1024 and p.hdim == 64
            builds.add((c, p.hdim, p.hdim_v, p.causal, short if c in (OURS, PROBE) else False))
        builds.update(("variant", j, p.hdim, p.causal) for j in range(extra))
    run = runs * (warm_s + timed_s + CANDIDATE_OVERHEAD_S) + POINT_OVERHEAD_S * len(points)
    return {"points": len(points), "candidate_runs": runs,
            "builds": len(builds), "compile_s": COMPILE_S * len(builds), "run_s": run,
            "total_s": run + COMPILE_S * len(builds)}


def plan_text(points: list[Point], warm_s: float, timed_s: float, window_ms: float, launch: str,
              only=CANDIDATES, variants=()) -> str:
    e = estimate_s(points, warm_s, timed_s, only, variants)
    lines = [f"{'point':34s} {'group':5s} {'GFLOP':>9s}  candidates"]
    for p in points:
        names = [c for c in p.candidates() if c in only]
        names += [f"{OURS}[{label}]" for label, _ in variants_at(p, variants)]
        lines.append(f"{p.name:34s} {p.group:5s} {p.flops / 1e9:9.1f}  {', '.join(names)}")
    lines.append(f"per candidate: compile + check, {warm_s:.1f} s back to back, then >= {timed_s:.1f} s timed in "
                 f"~{window_ms:.0f} ms windows (launch: {launch})")
    lines.append(f"plan: {e['points']} points, {e['candidate_runs']} candidate runs, ~{e['builds']} builds; "
                 f"about {e['total_s'] / 60:.1f} min ({e['run_s']:.0f} s running, {e['compile_s']:.0f} s compiling)")
    return "\n".join(lines)


# fa4sim's implementation of each candidate it models (fa4kernel as it ships: its tile rule)
MODELLED = {OURS: "fa4kernel", FA3: "flash-attn-3", PEER: "flash-attn-4"}


def predictions(points: list[Point], only=CANDIDATES, hw: str = "h200", variants=()) -> list[dict]:
    """fa4sim's prediction of every (point, modelled candidate), each at its own clock (the power
    model's where the profile has one), and of each --variant build of fa4kernel where it runs
    ('fa4kernel[LABEL]': fa4kernel's implementation with those knobs set): the rows a --predict
    file holds, to commit before the run. A variant fa4sim cannot model at a point is a row with
    its error instead of a time."""
    from fa4sim.errors import InputError
    from fa4sim.params import Problem
    from fa4sim.validate.common import predict

    def row(p, name, r):
        return {"point": p.name, "kernel": name, "tile_n": (r.knobs or {}).get("tile_n"),
                "tflops": round(r.tflops, 1), "time_us": round(r.time_us, 2),
                "clock_ghz": round(r.clock_ghz, 3), "bottleneck": r.bottleneck}

    rows = []
    for p in points:
        problem = Problem(p.batch, p.heads, p.seqlen_q, p.seqlen_k, p.hdim, p.causal, p.hdim_v, p.heads_kv)
        for name in (c for c in p.candidates() if c in only and c in MODELLED):
            rows.append(row(p, name, predict(hw, "fa3", problem, {}, impl=MODELLED[name])))
        for label, knobs in variants_at(p, variants) if OURS in only else ():
            name = f"{OURS}[{label}]"
            try:
                rows.append(row(p, name, predict(hw, "fa3", problem, dict(knobs), impl=MODELLED[OURS])))
            except InputError as e:
                rows.append({"point": p.name, "kernel": name, "not_modelled": str(e)})
    return rows


def write_predictions(path: str, points: list[Point], only, argv, variants, profile: str) -> str:
    """--predict: the predictions file (kind "predictions"), stamped with the model's commit."""
    import subprocess

    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    from lab.tools.hopper import PROFILES

    doc = {"meta": {"kind": "predictions", "device": PROFILES[profile], "profile": profile, "model_commit": commit,
                    "date": dt.date.today().isoformat(),
                    "what": "fa4sim's TFLOP/s for each modelled candidate at each point, each at its own "
                            "predicted clock (power model), written before the run",
                    "command": "sustained_sm90.py " + " ".join(argv)},
           "rows": predictions(points, only, hw=profile, variants=variants)}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    return path


# ---------------------------------------------------------------------------------------------
# On the GPU (torch, fa4kernel's kernels, flash-attn-4): imported only when measuring


def _torch():
    import torch

    return torch


def reference_check(q, k, v, causal: bool, slices: list[tuple[int, int]]):
    """fp32 attention of a few (batch, head) slices, bottom-right causal (rows that see no key
    give 0, as the kernels write), in row chunks so a 32k sequence fits: {slice: (seqlen_q, dv)};
    q head h reads K/V head h // (heads // heads_kv)."""
    torch = _torch()
    sq, sk, d = q.shape[1], k.shape[1], q.shape[3]
    group = q.shape[2] // k.shape[2]
    scale = 1.0 / math.sqrt(d)
    out = {}
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 reference
    try:
        for b, h in slices:
            qs = q[b, :, h, :].float()
            ks, vs = (x[b, :, h // group, :].float() for x in (k, v))
            rows = []
            step = max(1, (1 << 27) // (4 * sk))  # about 128 MB of fp32 scores per chunk
            for r0 in range(0, sq, step):
                s = (qs[r0:r0 + step] @ ks.T) * scale
                if causal:
                    i = torch.arange(r0, min(sq, r0 + step), device=q.device)[:, None]
                    j = torch.arange(sk, device=q.device)[None, :]
                    s = s.masked_fill(j > i + (sk - sq), float("-inf"))
                p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row without keys: all -inf -> 0
                rows.append(p @ vs)
            out[(b, h)] = torch.cat(rows)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return out


def check_output(out, ref: dict) -> dict:
    """rel_error over the reference's slices (||o - ref|| / ||ref||), non-finite values anywhere."""
    torch = _torch()
    out = out[0] if isinstance(out, (tuple, list)) else out
    num = sum(float((out[b, :, h, :].float() - r).norm() ** 2) for (b, h), r in ref.items())
    den = sum(float(r.norm() ** 2) for r in ref.values())
    rel = math.sqrt(num / den) if den > 0 else float("nan")
    nonfinite = bool((~torch.isfinite(out)).any())
    return {"rel_error": rel, "nonfinite": nonfinite, "ok": (not nonfinite) and rel < REL_ERROR_LIMIT,
            "checked_slices": [list(s) for s in ref]}


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class Sustained:
    """Warm-up and timing of one candidate at a time (the method of the module docstring)."""

    def __init__(self, sampler, warm_s: float, timed_s: float, window_ms: float, launch: str, min_windows: int = 5):
        self.sampler, self.warm_s, self.timed_s = sampler, warm_s, timed_s
        self.window_ms, self.launch, self.min_windows = window_ms, launch, min_windows
        self._key = 0

    def _estimate_ms(self, fn, calls: int = 3) -> float:
        torch = _torch()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        e.synchronize()
        return max(s.elapsed_time(e) / calls, 1e-3)

    def _graph(self, fn, calls: int, eager_out):
        """A CUDA graph of `calls` back-to-back calls, or (None, why). Checked: after zeroing the
        last captured call's output, one replay must rewrite it to the eager output, bit for bit
        (deterministic forwards), so a graph whose kernels went to another stream is refused."""
        torch = _torch()
        held = []
        try:
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(calls):
                    o = fn()
                    if i == calls - 1:
                        held.append(_first(o))
            torch.cuda.synchronize()
            held[0].zero_()
            g.replay()
            torch.cuda.synchronize()
            if not torch.equal(held[0], _first(eager_out)):
                return None, "a replay did not recompute the eager output"
            return g, None
        except Exception as e:  # noqa: BLE001  (capture unsupported by this call path: go eagerly)
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
            return None, repr(e)[:300]

    def run(self, name: str, fn, eager_out, read=None) -> dict:
        """Warm up and time fn (already compiled); read(): after each timed window, records the
        mean in-kernel clock of that window's launches (the probe; read.reset() before the first).
        Returns the candidate's record."""
        torch = _torch()
        self._key += 1
        key = f"{self._key}:{name}"
        est = self._estimate_ms(fn)
        calls = max(1, min(GRAPH_MAX_CALLS, round(GRAPH_CHUNK_MS / est)))
        graph, why = (self._graph(fn, calls, eager_out) if self.launch == "graph" else (None, "--launch eager"))
        if graph is not None:
            chunk, launch = graph.replay, "cuda graph"
        else:
            def chunk():
                for _ in range(calls):
                    fn()
            launch = "eager"
        chunks = max(1, round(self.window_ms / (est * calls)))  # chunks per window
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.warm_s:
            for _ in range(chunks):
                chunk()
            torch.cuda.synchronize()
        warm = time.perf_counter() - t0
        if read is not None:
            read.reset()  # the probe's running sums: from here on, every timed launch
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        per_call, host_s, gpu_s = [], [], 0.0
        windows = 0
        t_timed = time.perf_counter()
        while (windows < self.min_windows or gpu_s < self.timed_s) and \
                time.perf_counter() - t_timed < max(5.0, 10 * self.timed_s):  # never hang on a wrong event
            sampled = self.sampler is not None and self.sampler.ok
            with self.sampler.window(key) if sampled else contextlib.nullcontext():
                h0 = time.perf_counter()
                s.record()
                for _ in range(chunks):
                    chunk()
                e.record()
                host_s.append(time.perf_counter() - h0)
                e.synchronize()
            ms = s.elapsed_time(e)
            gpu_s += ms / 1e3
            per_call.append(ms / (chunks * calls))
            windows += 1
            if read is not None:
                read()
        med = statistics.median(per_call)
        rec = {"ms": med, "ms_min": min(per_call), "ms_max": max(per_call), "ms_windows": per_call,
               "launch": launch, "calls_per_window": chunks * calls, "windows": windows,
               "warm_s": warm, "timed_s": gpu_s, "estimate_ms": est}
        if why and self.launch == "graph":
            rec["graph_refused"] = why
        if launch == "eager":  # the host kept up when it queued a window faster than the GPU ran it
            rec["host_bound"] = statistics.median(host_s) > 0.9 * statistics.median(per_call) * chunks * calls / 1e3
        if self.sampler is not None and self.sampler.ok:
            nv = self.sampler.summary([key]).get(key, {})
            rec["nvml"] = nv
            rec["sm_mhz"] = nv.get("mhz_mean")
            rec["power_w"] = nv.get("power_w_mean", nv.get("power_w_energy"))  # the energy counter steps coarsely
        del graph
        return rec


def make_candidates(point: Point, impls, q, k, v, only=CANDIDATES) -> dict:
    """name -> (fn, read or None) for the point's candidates among `only` (bench_fwd_sm90.Impls' calls)."""
    import fa4kernel

    out = {}
    for name in point.candidates():
        if name not in only:
            continue
        if name == OURS:
            out[name] = (lambda: fa4kernel.attention(q, k, v, causal=point.causal), None)
        elif name == PROBE:
            out[name] = impls.ours_clock_probe(q, k, v, point.causal)
        elif name == PEER and impls.fa4 is not None:
            out[name] = (impls.flash_attn_4(q, k, v, point.causal), None)
        elif name == FA3 and impls.fa3 is not None:
            out[name] = (impls.flash_attn_3(q, k, v, point.causal), None)
        elif name == CUDNN:
            gqa = {"enable_gqa": True} if point.heads_kv != point.heads else {}
            out[name] = (impls.sdpa(q, k, v, point.causal, "cudnn", **gqa), None)
    return out


def variant_candidates(point: Point, variants, q, k, v, rec: dict) -> dict:
    """'fa4kernel[LABEL]' -> (fn, None) for each --variant where fa4kernel runs the point; each
    build's resolved configuration goes to rec["configs"][LABEL] (fa4sim validate simulates it),
    a knob value the point cannot take to that candidate's error."""
    import fa4kernel
    from lab.tools.bench_fwd_sm90 import as_ran

    out = {}
    for label, knobs in variants_at(point, variants):
        name = f"{OURS}[{label}]"
        try:
            rec.setdefault("configs", {})[label] = as_ran(
                fa4kernel.interface.resolve_config(q, k, v, point.causal, **knobs))
        except ValueError as e:
            rec["results"][name] = {"error": str(e)}
            continue
        out[name] = ((lambda kn=knobs: fa4kernel.attention(q, k, v, causal=point.causal, **kn)), None)
    return out


def load_tree(label: str, path: str):
    """The fa4kernel package of another checkout (path/fa4kernel, e.g. `git archive HEAD~1 fa4kernel
    | tar -x -C path`) as module 'fa4kernel_<label>': its relative imports stay inside it, so an A/B
    of two kernel sources runs in one process. ValueError in one line if path has no package."""
    import importlib.util

    init = os.path.join(path, "fa4kernel", "__init__.py")
    if not os.path.isfile(init):
        raise ValueError(f"--tree {label}={path}: no fa4kernel package there (want {init})")
    name = f"fa4kernel_{label}"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tree_candidates(point: Point, trees, q, k, v) -> dict:
    """'fa4kernel@LABEL' -> (fn, None): another checkout's fa4kernel with its default knobs."""
    if OURS not in point.candidates():
        return {}
    return {f"{OURS}@{label}": ((lambda m=module: m.attention(q, k, v, causal=point.causal)), None)
            for label, module in trees}


def bench_point(point: Point, index: int, impls, sustained: Sustained, only=CANDIDATES, variants=(),
                trees=()) -> dict:
    """Every candidate of one point (those in `only`, and the --variant builds), compiled, checked
    and timed in turn (order rotated by index)."""
    torch = _torch()
    import fa4kernel
    from lab.tools.bench_fwd_sm90 import as_ran, first_call_seconds

    torch.manual_seed(20261122 + index)
    q = torch.randn(point.batch, point.seqlen_q, point.heads, point.hdim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(point.batch, point.seqlen_k, point.heads_kv, point.hdim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(point.batch, point.seqlen_k, point.heads_kv, point.hdim_v, device="cuda", dtype=torch.bfloat16)
    rec = {**point.record(), "results": {}}
    slices = sorted({(0, 0), (point.batch // 2, point.heads // 2), (point.batch - 1, point.heads - 1)})
    ref = reference_check(q, k, v, point.causal, slices)
    cands = make_candidates(point, impls, q, k, v, only)
    cands.update(variant_candidates(point, variants, q, k, v, rec))
    cands.update(tree_candidates(point, trees, q, k, v))
    for peer in (PEER, FA3):
        if peer in point.candidates() and peer in only and peer not in cands:
            rec["results"][peer] = {"error": impls.errors.get(peer, f"{peer} not importable")}
    if OURS in point.candidates():
        cfg = fa4kernel.interface.resolve_config(q, k, v, point.causal)
        rec["fa4kernel_config"] = as_ran(cfg)
    names = list(cands)
    order = names[index % len(names):] + names[:index % len(names)] if names else []
    rec["order"] = order
    for name in order:
        fn, read = cands[name]
        r = rec["results"].setdefault(name, {})
        try:
            r["first_call_s"] = first_call_seconds(fn)  # the JIT compile on a cache miss
            out = fn()
            torch.cuda.synchronize()
            r["check"] = check_output(out, ref)
            r.update(sustained.run(name, fn, out, read))
            r["tflops"] = point.flops / (r["ms"] * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001  (one candidate failing keeps the run going)
            r["error"] = repr(e)[:500]
            torch.cuda.synchronize()
        if read is not None and read.ghz:
            # per window, the mean over all its launches; the point's, their median (as its ms)
            r["clock_ghz_in_kernel"] = statistics.median(read.ghz)
            r["clock_ghz_in_kernel_windows"] = list(read.ghz)
            cycles, ns = sum(c for c, _, _ in read.sums), sum(n for _, n, _ in read.sums)
            r["clock_ghz_in_kernel_mean"] = cycles / ns
            r["clock_probe_spans"] = sum(n for _, _, n in read.sums)
            rec["clock_ghz_in_kernel"] = r["clock_ghz_in_kernel"]
            rec["clock_probe_every_cta"] = read.every_cta
    if OURS in cands:
        rec["fa4kernel_compile_s"] = fa4kernel.COMPILE_TIMES.get(cfg)
    del q, k, v, ref
    return rec


def progress_line(i: int, n: int, rec: dict, elapsed: float) -> str:
    parts = []
    names = [n for n in CANDIDATES if n in rec["results"]] + [n for n in rec["results"] if n not in CANDIDATES]
    for name in names:
        r = rec["results"][name]
        short = SHORT.get(name) or name[len(OURS):]
        if "tflops" not in r:
            parts.append(f"{short} ERR")
            continue
        s = f"{short} {r['tflops']:.0f}"
        if r.get("clock_ghz_in_kernel"):
            s += f" @{r['clock_ghz_in_kernel']:.3f}GHz"
        if r.get("sm_mhz"):
            s += f" nvml {r['sm_mhz']:.0f}MHz"
        if r.get("power_w"):
            s += f" {r['power_w']:.0f}W"
        if not r.get("check", {}).get("ok", False):
            s += " WRONG"
        parts.append(s)
    return f"[{i}/{n}] {rec['name']:30s} TFLOP/s: {' | '.join(parts)}  ({elapsed:.0f} s)"


def device_meta(torch, sampler) -> dict:
    from lab.tools.bench_fwd_sm90 import _version, nvidia_smi
    from lab.tools.provenance import stamp

    meta = {
        "device": torch.cuda.get_device_name(0),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "clocks_before": nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu"),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                     "cutlass_dsl": _version("nvidia-cutlass-dsl"), "flash_attn_4": _version("flash-attn-4"),
                     "flash_attn_3": _version("tokenspeed-fa3"), "cudnn": torch.backends.cudnn.version(),
                     "python": platform.python_version()},
        "nvml": {"ok": sampler.ok, "error": sampler.error},
    }
    return stamp(meta, "sustained")


def default_out(device: str) -> str:
    name = ("h200" if "H200" in device else "h100" if "H100" in device
            else device.replace("NVIDIA ", "").replace(" ", "_").lower())
    return os.path.join(ROOT, "lab", "campaigns", "sustained-settled", f"sustained_{name}_{dt.date.today().isoformat()}.json")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None,
                    help="the JSON to write (default lab/campaigns/sustained-settled/sustained_<gpu>_<date>.json)")
    ap.add_argument("--dry-run", action="store_true", help="list the points and the plan; no GPU, no torch")
    ap.add_argument("--predict", metavar="FILE.json", default=None,
                    help="no GPU: write fa4sim's predictions for the points (fa4kernel, FlashAttention-3, "
                         "flash-attn-4 at the --profile GPU's predicted clock), to commit before the run")
    from lab.tools.hopper import add_profile_arg

    add_profile_arg(ap)
    ap.add_argument("--points", default=None,
                    help="comma-separated: grid, new, all, point names, or parts of names (hd128, causal)")
    ap.add_argument("--problem", action="append", default=[],
                    metavar="b=B,h=H,sq=SQ,d=D[,kv=KV][,sk=SK][,dv=DV][,causal]",
                    help="your own problem (repeatable; group 'asked'), after the --points ones: batch, heads, "
                         "seqlen_q, head dim, optionally K/V heads (kv, a divisor of h: GQA / MQA), seqlen_k, "
                         "hdim_v and a bottom-right causal mask")
    ap.add_argument("--quick", action="store_true", help=f"{len(QUICK)} points (without --points)")
    ap.add_argument("--warm-s", type=float, default=2.5,
                    help="seconds back to back before timing (>= 1.0; the cap's controller settles in 1-2 s)")
    ap.add_argument("--timed-s", type=float, default=1.0,
                    help="seconds timed per candidate (>= 0.5; longer averages over the controller's swings)")
    ap.add_argument("--window-ms", type=float, default=100.0, help="one timed window (ms, 10-1000)")
    ap.add_argument("--launch", default="graph", choices=("graph", "eager"),
                    help="graph: replay a CUDA graph of calls (eagerly where one cannot be captured)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no new point after this many seconds (the file keeps what ran)")
    ap.add_argument("--candidates", default=None, metavar="LIST",
                    help=f"only these (comma-separated: {', '.join(SHORT.values())}); default all five")
    ap.add_argument("--variant", action="append", default=[], metavar="[hdN:]KNOB=VALUE[,KNOB=VALUE]",
                    help="also time fa4kernel built with these knobs, as 'fa4kernel[KNOB=VALUE]' (repeatable; "
                         "e.g. tile_n=160, or hd256:tile_n=80 for one head dim; fa4kernel/README.md lists the knobs)")
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                    help="also time the fa4kernel package in DIR (another checkout, e.g. HEAD~1's), as "
                         "'fa4kernel@LABEL': an A/B of kernel sources in one run (repeatable)")
    ap.add_argument("--short-ok", action="store_true",
                    help="allow --warm-s below 1.0 and --timed-s below 0.5 (smoke tests only)")
    args = ap.parse_args(argv)
    if not args.short_ok and args.warm_s < MIN_WARM_S:
        ap.error(f"--warm-s {args.warm_s}: at least {MIN_WARM_S} s (the clock needs it to settle; "
                 "--short-ok for smoke tests)")
    if not args.short_ok and args.timed_s < MIN_TIMED_S:
        ap.error(f"--timed-s {args.timed_s}: at least {MIN_TIMED_S} s (--short-ok for smoke tests)")
    if args.warm_s < 0 or args.timed_s <= 0:
        ap.error("--warm-s must be >= 0 and --timed-s > 0")
    if not 10 <= args.window_ms <= 1000:
        ap.error(f"--window-ms {args.window_ms}: allowed 10-1000")
    if args.budget_s <= 0:
        ap.error(f"--budget-s {args.budget_s}: must be > 0")
    names = [c.strip() for c in (args.candidates or ",".join(SHORT.values())).split(",") if c.strip()]
    unknown = [c for c in names if c not in SHORT.values()]
    if unknown or not names:
        ap.error(f"--candidates {args.candidates!r}: allowed a comma-separated subset of {', '.join(SHORT.values())}")
    args.only = tuple(c for c in CANDIDATES if SHORT[c] in names)
    try:
        args.variants = [parse_variant(spec) for spec in args.variant]
        args.trees = []
        for spec in args.tree:
            label, eq, path = spec.partition("=")
            if not eq or not label.isidentifier() or not os.path.isfile(os.path.join(path, "fa4kernel", "__init__.py")):
                raise ValueError(f"--tree {spec!r}: want LABEL=DIR, LABEL a name and DIR holding a fa4kernel package")
            args.trees.append((label, path))
        asked = [parse_problem(spec) for spec in args.problem]
        chosen = select(args.points, args.quick) if args.points or args.quick or not asked else []
        args.selected = chosen + [p for p in dict.fromkeys(asked) if p not in chosen]
    except ValueError as e:
        ap.error(str(e))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    points = args.selected
    if args.predict:
        argv = sys.argv[1:] if argv is None else list(argv)
        print(f"wrote {write_predictions(args.predict, points, args.only, argv, args.variants, args.profile)} ({len(points)} points)")
        return 0
    if not args.dry_run:
        from lab.tools.hopper import require_hopper

        require_hopper("sustained_sm90.py", "--dry-run prints the plan without one")
    print(plan_text(points, args.warm_s, args.timed_s, args.window_ms, args.launch, args.only, args.variants),
          flush=True)
    if args.dry_run:
        return 0
    torch = _torch()
    from lab.tools.bench_fwd_sm90 import Impls, nvidia_smi
    from lab.tools.nvml_clock import ClockSampler

    start = time.perf_counter()
    sampler = ClockSampler(torch.cuda.current_device())
    meta = device_meta(torch, sampler)
    meta.update(
        method=("each candidate alone: compile + fp32 check, back to back for warm_s, then timed windows of "
                "back-to-back calls between CUDA events (a replayed CUDA graph where it captures); ms = median "
                "over windows; TFLOP/s = 2*b*h*(d+dv)*visible pairs/ms (fa4sim/flops.py, bottom-right causal); "
                "sm_mhz / power_w: NVML over exactly the timed windows (power: the mean of its samples); "
                "clock_ghz_in_kernel: the clock-probe build's clock64/globaltimer summed over every launch of a window "
                "(CTA 0 of a persistent launch, every CTA of one CTA per tile), the median over windows"),
        settings={"warm_s": args.warm_s, "timed_s": args.timed_s, "window_ms": args.window_ms, "launch": args.launch,
                  "rel_error_limit": REL_ERROR_LIMIT, "points": [p.name for p in points],
                  "candidates": list(args.only),
                  "variants": {label: {"knobs": kn, "hdim": hd} for label, kn, hd in args.variants}})
    impls = Impls()
    meta["peer_import_errors"] = impls.errors
    out = args.out or default_out(meta["device"])
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    sustained = Sustained(sampler, args.warm_s, args.timed_s, args.window_ms, args.launch)
    trees = [(label, load_tree(label, path)) for label, path in args.trees]
    meta["settings"]["trees"] = {label: path for label, path in args.trees}
    results, skipped = [], []

    def write(final=False):
        meta["elapsed_s"] = time.perf_counter() - start
        if final:
            meta["clocks_after"] = nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu")
        doc = {"meta": meta, "points": results, "skipped": skipped, "complete": final}
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)

    for i, p in enumerate(points, 1):
        if time.perf_counter() - start > args.budget_s:
            skipped.append(p.name)
            print(f"[{i}/{len(points)}] {p.name}: skipped (past --budget-s {args.budget_s:.0f} s)", flush=True)
            continue
        rec = bench_point(p, i, impls, sustained, args.only, args.variants, trees)
        results.append(rec)
        print(progress_line(i, len(points), rec, time.perf_counter() - start), flush=True)
        write()
    write(final=True)
    sampler.close()
    bad = [f"{r['name']}:{n}" for r in results for n, x in r["results"].items()
           if "error" in x or not x.get("check", {}).get("ok", False)]
    print(f"wrote {out} ({len(results)} points, {len(skipped)} skipped, {time.perf_counter() - start:.0f} s)"
          + (f"; failed or wrong: {', '.join(bad)}" if bad else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
