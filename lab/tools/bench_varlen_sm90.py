"""Packed batches of unequal sequences (varlen) on an H100 or H200, forward or backward, bf16 (kind "varlen").

A batch is its query lengths (and key lengths, where they differ: chunked prefill), packed as
FlashAttention's varlen functions take them: q (total_q, heads, d), k and v (total_k, heads_kv,
d), cu_seqlens the offsets. Candidates, each on the same inputs:
  fa4kernel.varlen     fa4kernel.attention with cu_seqlens (its forward's varlen build)
  fa4kernel.varlen[no_pack]  the same with pack_gqa=False (forward, MQA batches, one k/v head and
                       more q heads, where fa4kernel.varlen runs its pack-GQA build by default)
  fa4kernel.loop       fa4kernel.attention per sequence on views of the packed tensors (one
                       launch per sequence; --loop, off by default)
  flash-attn-3         flash_attn_interface.flash_attn_varlen_func (tokenspeed-fa3)
  flash-attn-4         flash_attn.cute.interface.flash_attn_varlen_func (its SM90 forward)
A candidate that cannot be imported or that raises is recorded with its error; the run goes on.

--dense-twin: where every sequence of the batch has the same query length and the same key length
(short-hd128-causal, equal-hd128-causal, or --seqlens so), the packed tensors are also viewed as
dense ones, q (batch, seqlen_q, heads, d), k and v (batch, seqlen_k, heads_kv, d), and each
implementation's DENSE kernel runs on them, checked and timed as the others:
  fa4kernel.dense      fa4kernel.attention without cu_seqlens
  flash-attn-3.dense   flash_attn_interface.flash_attn_func
  flash-attn-4.dense   flash_attn.cute.interface.flash_attn_func
The same work on the same memory, one launch varlen and one dense: the ratio of the two times is
what the varlen build costs each implementation beyond the tiles (its varlen premium), with no
other difference between the two. A batch of unequal lengths has no dense shape: it ignores the
flag (the dry run and the row say so).

--pass bwd times the backward instead: each candidate's forward runs once with gradients, then
torch.autograd.grad of its output (a fixed random dO) is what is timed; fa4kernel.varlen is the
backward's varlen build (fa4kernel.varlen[deterministic]: with deterministic=True), fa4kernel.loop
(--loop) the dense backward once per sequence, the dense twin's (--dense-twin) each dense kernel's
backward through autograd the same way. dQ, dK and dV are checked against fp32 autograd per
sequence; TFLOP/s count 2.5 x the forward's FLOPs.

Each candidate is checked against an fp32 reference per sequence (relative error < 1e-2, no NaN),
then run back to back for --settle-s seconds (the power cap settles the clock, as in training),
then timed: --reps batches of back-to-back calls between CUDA events (about --batch-ms each); us =
the median batch. TFLOP/s = 4 x heads x d x (the visible query-key pairs, summed over sequences;
causal bottom-right) / time.

Batches (--batches, default all; --seqlens L1,L2,... [--seqlens-k ...] adds your own):
  ten-hd128-causal   ten lengths 1-8000, 16 heads, hd128, causal
  ten-hd64           the same lengths, 32 heads, hd64, not causal
  gqa-hd128-causal   six lengths 1-7001, 32 q / 8 k/v heads, hd128, causal
  short-hd128-causal 64 sequences of 332 tokens, 16 heads, hd128, causal
  hd256-causal       four lengths 20-6000, 8 heads, hd256, causal
  chunks-gqa-causal  chunked prefill: queries 512, 512, 1, 2000 on 4096, 9000, 3000, 2000 keys, 32 / 8 heads
  mqa-hd128-causal   six lengths 1-4097, 32 q heads on one k/v head (MQA), hd128, causal
  odd-hd96           seven odd lengths 7-4097, 16 heads, hd96, not causal (FlashAttention-3: its hd128 kernel)
  hd192-causal       five lengths 64-3001, 16 heads, hd192, causal
  chunks-hd64        queries 256, 1024, 77 on 8192, 3000, 4000 keys, 32 heads, hd64, not causal
  equal-hd128-causal 16 sequences of 1024 tokens, 16 heads, hd128, causal (a dense twin longer than 332)

Usage (device, from the repository root):
    python3 lab/tools/bench_varlen_sm90.py --out $OUT/varlen_h200.json
    python3 lab/tools/bench_varlen_sm90.py --dry-run          # the batches, no GPU
    python3 lab/tools/bench_varlen_sm90.py --predict FILE     # fa4sim's predictions, no GPU
    python3 lab/tools/bench_varlen_sm90.py --pass bwd --out $OUT/varlen_bwd_h200.json
    python3 lab/tools/bench_varlen_sm90.py --dense-twin --batches short-hd128-causal,equal-hd128-causal \
        [--pass bwd] --out $OUT/varlen_twin_h200.json      # varlen against dense, equal lengths

--predict FILE writes fa4sim's predictions (profile h200, or --profile h100; the power model's clock) for every
selected batch and every candidate fa4sim models (flash-attn-3 and flash-attn-4 as their varlen
schedules; fa4kernel.varlen where fa4sim has it), kind "predictions"; each row's "point" and
"kernel" are the measured file's batch name and candidate, so the two files join on them
(python -m lab.tools.accuracy --compare MEASURED PREDICTED). With --dense-twin, also the dense twin's
rows: fa4sim's dense prediction (Problem(batch, heads, seqlen_q, seqlen_k, ...), not varlen) for
each implementation under its .dense name; "dense" in the row is (batch, seqlen_q, seqlen_k).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
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

from lab.tools.bench_decode_sm90 import REL_ERROR_LIMIT, check_output  # noqa: E402  (the same fp32 check)

MODELLED = {"flash-attn-3": "flash-attn-3", "flash-attn-4": "flash-attn-4", "fa4kernel.varlen": "fa4kernel"}
# the dense twin (--dense-twin): candidate -> fa4sim's implementation, whose dense prediction it is
TWINS = {"fa4kernel.dense": "fa4kernel", "flash-attn-3.dense": "flash-attn-3", "flash-attn-4.dense": "flash-attn-4"}
NO_TWIN = "not run: the sequences' lengths differ (no dense shape to view the packed batch as)"


@dataclass(frozen=True)
class Batch:
    name: str
    seqlens: tuple
    heads: int
    hdim: int
    causal: bool
    heads_kv: int = 0          # 0: heads
    seqlens_k: tuple = ()      # (): the query lengths

    @property
    def kv_heads(self) -> int:
        return self.heads_kv or self.heads

    @property
    def keys(self) -> tuple:
        return self.seqlens_k or self.seqlens

    def pairs(self) -> int:
        """Visible query-key pairs, summed over sequences (causal: bottom-right)."""
        total = 0
        for sq, sk in zip(self.seqlens, self.keys):
            if not self.causal:
                total += sq * sk
            else:  # query i sees keys j <= i + sk - sq, at least none
                total += sum(max(0, min(sk, i + sk - sq + 1)) for i in range(sq))
        return total

    def flops(self) -> float:
        return 4.0 * self.heads * self.hdim * self.pairs()

    def dense_shape(self):
        """(batch, seqlen_q, seqlen_k) where every sequence has the same query length and the same
        key length (the packed tensors then are dense ones, viewed); None where they differ."""
        if len(set(self.seqlens)) == 1 and len(set(self.keys)) == 1:
            return len(self.seqlens), self.seqlens[0], self.keys[0]
        return None


TEN = (100, 8000, 777, 3000, 1, 2048, 5000, 333, 4096, 1500)
BATCHES = (
    Batch("ten-hd128-causal", TEN, 16, 128, True),
    Batch("ten-hd64", TEN, 32, 64, False),
    Batch("gqa-hd128-causal", (512, 3000, 7001, 250, 1, 4500), 32, 128, True, heads_kv=8),
    Batch("short-hd128-causal", (332,) * 64, 16, 128, True),
    Batch("hd256-causal", (1000, 6000, 3333, 20), 8, 256, True),
    Batch("chunks-gqa-causal", (512, 512, 1, 2000), 32, 128, True, heads_kv=8, seqlens_k=(4096, 9000, 3000, 2000)),
    Batch("mqa-hd128-causal", (700, 2300, 4097, 1, 150, 3333), 32, 128, True, heads_kv=1),
    Batch("odd-hd96", (33, 4097, 1025, 2999, 7, 513, 1800), 16, 96, False),
    Batch("hd192-causal", (100, 3001, 1500, 2222, 64), 16, 192, True),
    Batch("chunks-hd64", (256, 1024, 77), 32, 64, False, seqlens_k=(8192, 3000, 4000)),
    Batch("equal-hd128-causal", (1024,) * 16, 16, 128, True),
)


def lengths(flag: str, text: str) -> tuple:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        vals = ()
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{flag} {text!r}: allowed comma-separated lengths >= 1")
    return vals


BWD_FLOPS = 2.5  # the backward's FLOPs per forward FLOP (flash-attn's convention)
SAMPLER = None  # main's NVML clock sampler on the device (lab/tools/nvml_clock.py); None: no clocks


def dense_problem(b: Batch):
    """fa4sim's dense Problem of an equal-length batch's dense twin (None: the lengths differ)."""
    from fa4sim import Problem

    shape = b.dense_shape()
    if shape is None:
        return None
    n, sq, sk = shape
    return Problem(n, b.heads, sq, sk, b.hdim, b.causal, heads_kv=b.heads_kv or None)


def predict_rows(batches, pass_: str = "fwd", twin: bool = False, *, profile: str, variants=()) -> list:
    """fa4sim's predictions (on `profile`) for each batch and each modelled candidate; with twin, the dense
    twin's of each equal-length batch too (fa4sim's dense prediction of (batch, seqlen_q, seqlen_k));
    bwd: fa4kernel's deterministic build and each --variants set as well (their dq_slices recorded)."""
    from fa4sim import Problem, simulate

    out = []
    mult = BWD_FLOPS if pass_ == "bwd" else 1.0

    def predict(b, kernel, impl, p, extra, overrides=None):
        try:
            r = simulate(profile, problem=p, impl=impl, pass_=pass_, overrides=overrides)
        except Exception as e:  # fa4sim has no model of it: said so in the file
            return {"point": b.name, "kernel": kernel, **extra, "not_modelled": str(e).splitlines()[0][:200]}
        row = {"point": b.name, "kernel": kernel, **extra, "us": r.time_us,
               "tflops": mult * b.flops() / (r.time_us * 1e6), "clock_ghz": r.clock_ghz, "bottleneck": r.bottleneck}
        if pass_ == "bwd":
            row.update(pre_us=r.pre_us, main_us=r.main_us, post_us=r.post_us)
            if r.knobs.get("deterministic"):
                row["dq_slices"] = r.knobs["dq_slices"]
        return row

    for b in batches:
        p = Problem.varlen(b.heads, b.hdim, list(b.seqlens), list(b.keys) if b.seqlens_k else None,
                           causal=b.causal, heads_kv=b.heads_kv or None)
        out.extend(predict(b, kernel, impl, p, {}) for kernel, impl in MODELLED.items())
        if pass_ == "fwd" and packs(b):  # the plain build beside the default pack: fa4sim's fa4kernel unpacked
            out.append(predict(b, UNPACKED, MODELLED["fa4kernel.varlen"], p, {}, {"pack_gqa": False}))
        if pass_ == "bwd":
            builds = [("fa4kernel.varlen[deterministic]", {"deterministic": True})]
            out.extend(predict(b, kernel, MODELLED["fa4kernel.varlen"], p, {}, knobs)
                       for kernel, knobs in builds + [(variant_name(v), v) for v in variants])
        dense = dense_problem(b) if twin else None
        if dense is not None:
            out.extend(predict(b, kernel, impl, dense, {"dense": list(b.dense_shape())})
                       for kernel, impl in TWINS.items())
    return out


def write_predictions(path: str, batches, argv, pass_: str, twin: bool, profile: str, variants=()) -> dict:
    import subprocess

    from lab.tools.hopper import PROFILES

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    meta = {"kind": "predictions", "device": PROFILES[profile], "profile": profile, "model_commit": head.stdout.strip()
            or "unknown", "date": dt.date.today().isoformat(),
            "what": f"fa4sim's varlen {'backward' if pass_ == 'bwd' else 'forward'} predictions per packed batch: us "
                    "at the power model's clock, TFLOP/s over the visible pairs"
                    + (" (2.5 x the forward's FLOPs)" if pass_ == "bwd" else "")
                    + ("; the .dense rows: the dense twin, fa4sim's dense prediction of (batch, seqlen_q, seqlen_k)"
                       if twin else "") + "; written before the run",
            "pass": pass_, "dense_twin": twin,
            "command": "python3 lab/tools/bench_varlen_sm90.py " + " ".join(argv)}
    doc = {"meta": meta, "rows": predict_rows(batches, pass_, twin, profile=profile, variants=variants)}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    return doc


def inputs(torch, b: Batch):
    gen = torch.Generator(device="cuda").manual_seed(0)
    tq, tk = sum(b.seqlens), sum(b.keys)
    q = torch.randn(tq, b.heads, b.hdim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(tk, b.kv_heads, b.hdim, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(tk, b.kv_heads, b.hdim, device="cuda", dtype=torch.bfloat16, generator=gen)
    cq = torch.tensor([0, *itertools.accumulate(b.seqlens)], device="cuda", dtype=torch.int32)
    ck = torch.tensor([0, *itertools.accumulate(b.keys)], device="cuda", dtype=torch.int32)
    return q, k, v, cq, ck


def reference(torch, b: Batch, q, k, v, cq, ck):
    """fp32, sequence by sequence; bottom-right causal; a query with no key gives 0."""
    out = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    g = b.heads // b.kv_heads
    for i, (sq, sk) in enumerate(zip(b.seqlens, b.keys)):
        q0, k0 = int(cq[i]), int(ck[i])
        qs = q[q0:q0 + sq].float()
        ks = k[k0:k0 + sk].float().repeat_interleave(g, dim=1)
        vs = v[k0:k0 + sk].float().repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) / math.sqrt(b.hdim)
        if b.causal:
            t = torch.arange(sq, device=q.device)[:, None]
            j = torch.arange(sk, device=q.device)[None, :]
            s = s.masked_fill(j > t + sk - sq, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out[q0:q0 + sq] = torch.einsum("hqk,khd->qhd", p, vs)
    return out


def twin_forwards(b: Batch, errors: dict) -> dict:
    """The dense twin (an equal-length batch only): name -> forward(q, k, v) of packed tensors that
    runs an implementation's dense kernel on them viewed as (batch, seqlen, heads, d) and returns
    its output viewed back as packed (total_q, heads, d), as the reference has it."""
    import fa4kernel

    n, sq, sk = b.dense_shape()

    def dense(kernel):
        def forward(q, k, v):
            o = kernel(q.view(n, sq, *q.shape[1:]), k.view(n, sk, *k.shape[1:]), v.view(n, sk, *v.shape[1:]))
            return (o[0] if isinstance(o, tuple) else o).reshape(q.shape)

        return forward

    out = {"fa4kernel.dense": dense(lambda q, k, v: fa4kernel.attention(q, k, v, causal=b.causal))}
    try:
        from flash_attn_interface import flash_attn_func as fa3

        out["flash-attn-3.dense"] = dense(lambda q, k, v: fa3(q, k, v, causal=b.causal))
    except Exception as e:
        errors["flash-attn-3.dense"] = repr(e)[:300]
    try:
        from flash_attn.cute.interface import flash_attn_func as fa4

        out["flash-attn-4.dense"] = dense(lambda q, k, v: fa4(q, k, v, causal=b.causal))
    except Exception as e:
        errors["flash-attn-4.dense"] = repr(e)[:300]
    return out


UNPACKED = "fa4kernel.varlen[no_pack]"


def packs(b: Batch) -> bool:
    """MQA (one k/v head, more q heads): fa4kernel packs its rows by default (fa4kernel/varlen.py pack_plan)."""
    return b.kv_heads == 1 and b.heads > 1


def candidate_names(b: Batch, pass_: str = "fwd", loop: bool = False, twin: bool = False, variants=()) -> list:
    """The candidates a run times for b, in order (those that import: the dry run lists them)."""
    names = ["fa4kernel.varlen"] + (["fa4kernel.varlen[deterministic]"] if pass_ == "bwd" else [])
    names += [UNPACKED] if pass_ == "fwd" and packs(b) else []
    names += [variant_name(k) for k in variants] if pass_ == "bwd" else []
    names += (["fa4kernel.loop"] if loop else []) + ["flash-attn-3", "flash-attn-4"]
    return names + (list(TWINS) if twin and b.dense_shape() else [])


def candidates(torch, b: Batch, q, k, v, cq, ck, errors: dict, loop: bool = False, twin: bool = False) -> dict:
    """name -> a call returning the forward's packed output (twin: the dense twin's too, where b
    has equal lengths)."""
    import fa4kernel

    mq, mk = max(b.seqlens), max(b.keys)
    out = {"fa4kernel.varlen": lambda: fa4kernel.attention(q, k, v, causal=b.causal, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                                           max_seqlen_q=mq, max_seqlen_k=mk)}
    if packs(b):
        out[UNPACKED] = lambda: fa4kernel.attention(q, k, v, causal=b.causal, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                                    max_seqlen_q=mq, max_seqlen_k=mk, pack_gqa=False)
    offs = [(int(cq[i]), int(ck[i]), sq, sk) for i, (sq, sk) in enumerate(zip(b.seqlens, b.keys))]

    def per_sequence():
        o = torch.empty_like(q)
        for q0, k0, sq, sk in offs:
            o[q0:q0 + sq] = fa4kernel.attention(q[None, q0:q0 + sq], k[None, k0:k0 + sk], v[None, k0:k0 + sk],
                                                causal=b.causal)[0]
        return o

    if loop:
        out["fa4kernel.loop"] = per_sequence
    try:
        from flash_attn_interface import flash_attn_varlen_func as fa3

        def run_fa3():
            o = fa3(q, k, v, cq, ck, mq, mk, causal=b.causal)
            return o[0] if isinstance(o, tuple) else o

        out["flash-attn-3"] = run_fa3
    except Exception as e:
        errors["flash-attn-3"] = repr(e)[:300]
    try:
        from flash_attn.cute.interface import flash_attn_varlen_func as fa4

        def run_fa4():
            o = fa4(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk, causal=b.causal)
            return o[0] if isinstance(o, tuple) else o

        out["flash-attn-4"] = run_fa4
    except Exception as e:
        errors["flash-attn-4"] = repr(e)[:300]
    if twin and b.dense_shape():
        out.update({name: (lambda f=f: f(q, k, v)) for name, f in twin_forwards(b, errors).items()})
    return out


def bwd_candidates(torch, b: Batch, q, k, v, cq, ck, dout, errors: dict, loop: bool = False,
                   twin: bool = False, variants=()) -> dict:
    """name -> a call returning (dq, dk, dv) of one backward: autograd.grad of the candidate's
    output, its forward run once here (fa4kernel.loop: the dense backward per sequence; twin: each
    dense kernel's backward on the dense view, where b has equal lengths)."""
    import fa4kernel

    mq, mk = max(b.seqlens), max(b.keys)

    def through_autograd(forward):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o = forward(qq, kk, vv)
        o = o[0] if isinstance(o, tuple) else o
        return lambda: torch.autograd.grad(o, (qq, kk, vv), dout, retain_graph=True)

    out = {}
    # the default build, the deterministic one, and each --variants knob set
    builds = [("fa4kernel.varlen", {}), ("fa4kernel.varlen[deterministic]", {"deterministic": True})]
    builds += [(variant_name(knobs), {"bwd_knobs": bwd_knobs(knobs), "deterministic": knobs.get("deterministic", False)})
               for knobs in variants]
    for name, kw in builds:
        try:
            out[name] = through_autograd(lambda qq, kk, vv, kw=kw: fa4kernel.attention(
                qq, kk, vv, causal=b.causal, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk,
                **kw))
        except Exception as e:
            errors[name] = repr(e)[:300]
    if loop:
        from fa4kernel.sm90.bwd import run_bwd
        from fa4kernel.sm90.bwd_config import bwd_config_from_knobs

        o, lse = fa4kernel.attention(q, k, v, causal=b.causal, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True)
        dense = bwd_config_from_knobs("bfloat16", b.hdim, b.causal, False, {})
        offs = [(int(cq[i]), int(ck[i]), sq, sk) for i, (sq, sk) in enumerate(zip(b.seqlens, b.keys))]

        def per_sequence():  # the dense backward on each sequence's rows of the packed tensors
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            for q0, k0, sq, sk in offs:
                one = lambda t, x, n: t[x:x + n].unsqueeze(0)  # noqa: E731
                g = run_bwd(dense, one(dout, q0, sq), one(q, q0, sq), one(k, k0, sk), one(v, k0, sk), one(o, q0, sq),
                            lse[:, q0:q0 + sq].unsqueeze(0).contiguous(), 1.0 / math.sqrt(b.hdim))
                dq[q0:q0 + sq], dk[k0:k0 + sk], dv[k0:k0 + sk] = g[0][0], g[1][0], g[2][0]
            return dq, dk, dv

        out["fa4kernel.loop"] = per_sequence
    try:
        from flash_attn_interface import flash_attn_varlen_func as fa3

        out["flash-attn-3"] = through_autograd(lambda qq, kk, vv: fa3(qq, kk, vv, cq, ck, mq, mk, causal=b.causal))
    except Exception as e:
        errors["flash-attn-3"] = repr(e)[:300]
    try:
        from flash_attn.cute.interface import flash_attn_varlen_func as fa4

        out["flash-attn-4"] = through_autograd(lambda qq, kk, vv: fa4(
            qq, kk, vv, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk, causal=b.causal))
    except Exception as e:
        errors["flash-attn-4"] = repr(e)[:300]
    for name, forward in (twin_forwards(b, errors).items() if twin and b.dense_shape() else ()):
        try:
            out[name] = through_autograd(forward)
        except Exception as e:
            errors[name] = repr(e)[:300]
    return out


def reference_grads(torch, b: Batch, q, k, v, cq, ck, dout):
    """fp32 autograd of reference(), per sequence: (dq, dk, dv)."""
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    reference(torch, b, qf, kf, vf, cq, ck).backward(dout.float())
    return qf.grad, kf.grad, vf.grad


def time_call(torch, fn, settle_s: float, reps: int, batch_ms: float, sampler=None, window: str = "") -> dict:
    """Median us per call over `reps` timed batches after `settle_s` back to back; with an NVML
    `sampler` (lab/tools/nvml_clock.py), the SM clock and board power of the timed batches too
    ("nvml": mhz_mean, power, clock-event reasons), so a miss can be told apart into clock and cycles."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    end = time.perf_counter() + settle_s  # back to back until the cap has settled the clock
    while time.perf_counter() < end:
        for _ in range(max(1, int(0.05 / one))):
            fn()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    calls = max(1, min(2000, int(batch_ms / max((time.perf_counter() - t0) * 1e3, 1e-3))))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    on = sampler is not None and sampler.ok
    for _ in range(reps):
        with sampler.window(window) if on else contextlib.nullcontext():
            s.record()
            for _ in range(calls):
                fn()
            e.record()
            e.synchronize()
        per_call.append(s.elapsed_time(e) * 1e3 / calls)
    out = {"us": statistics.median(per_call), "us_min": min(per_call), "calls_per_batch": calls}
    if on:
        out["nvml"] = sampler.summary([window]).get(window, {})
    return out


def run_batch(torch, b: Batch, args, errors: dict) -> dict:
    q, k, v, cq, ck = inputs(torch, b)
    bwd = args.pass_ == "bwd"
    flops = b.flops() * (BWD_FLOPS if bwd else 1.0)
    if bwd:
        dout = torch.randn(q.shape, device=q.device, dtype=q.dtype, generator=torch.Generator(device="cuda").manual_seed(1))
        ref = reference_grads(torch, b, q, k, v, cq, ck, dout)
        cands = bwd_candidates(torch, b, q, k, v, cq, ck, dout, errors, args.loop, args.dense_twin, args.variants)
    else:
        ref = reference(torch, b, q, k, v, cq, ck)
        cands = candidates(torch, b, q, k, v, cq, ck, errors, args.loop, args.dense_twin)
    rec = {"name": b.name, "point": b.name, "pass": args.pass_, "seqlens": list(b.seqlens), "seqlens_k": list(b.keys),
           "heads": b.heads, "heads_kv": b.kv_heads, "hdim": b.hdim, "causal": b.causal, "flops": flops, "results": {}}
    if args.dense_twin:  # the view the .dense candidates ran on, or why there are none
        shape = b.dense_shape()
        rec["dense_twin"] = dict(zip(("batch", "seqlen_q", "seqlen_k"), shape)) if shape else {"not_run": NO_TWIN}
        if not shape:
            print(f"  dense twin: {NO_TWIN}", flush=True)
    for name, fn in cands.items():
        r = {}
        try:
            out = fn()
            torch.cuda.synchronize()
            if bwd:  # every gradient within the limit; the worst one recorded
                checks = [check_output(torch, g, want) for g, want in zip(out, ref)]
                r.update(rel_error=max(c["rel_error"] for c in checks), ok=all(c["ok"] for c in checks))
            else:
                r.update(check_output(torch, out, ref))
            r.update(time_call(torch, fn, args.settle_s, args.reps, args.batch_ms, SAMPLER, f"{b.name}:{name}"))
            r["tflops"] = flops / (r["us"] * 1e6)
        except Exception as e:
            r["error"] = repr(e)[:400]
        rec["results"][name] = r
        s = (f"{r['us']:9.1f} us {r['tflops']:6.1f} TFLOP/s" + ("" if r["ok"] else f" WRONG ({r['rel_error']:.1e})")
             if "us" in r else "error: " + r["error"][:100])
        print(f"  {name:18s} {s}", flush=True)
    del q, k, v, ref
    torch.cuda.empty_cache()
    return rec


def parse_args(argv=None):
    from lab.tools.hopper import add_profile_arg

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=None, help="the JSON to write (default: print only)")
    ap.add_argument("--dry-run", action="store_true", help="list the batches; no GPU")
    ap.add_argument("--predict", default=None, metavar="FILE", help="write fa4sim's predictions to FILE; no GPU")
    add_profile_arg(ap)
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="fwd",
                    help="time (and predict) the forward or the backward")
    ap.add_argument("--loop", action="store_true", help="also time fa4kernel.loop (one launch per sequence)")
    ap.add_argument("--dense-twin", action="store_true",
                    help="equal-length batches: also each implementation's dense kernel on the packed tensors "
                         "viewed as (batch, seqlen, heads, d) (the .dense candidates; --predict: their rows too)")
    ap.add_argument("--variants", nargs="*", default=[], metavar="KNOBS",
                    help="--pass bwd: backward knob sets, each a row fa4kernel.varlen[KNOBS] beside the default "
                         "one, e.g. gqa_dkv=reduce (sm90/bwd_config.py; checked by make_varlen_bwd_config)")
    ap.add_argument("--batches", default=None, help="comma-separated batch names (default: all)")
    ap.add_argument("--seqlens", default=None, metavar="L1,L2,...", help="your own batch's query lengths")
    ap.add_argument("--seqlens-k", default=None, metavar="K1,K2,...", help="with --seqlens: its key lengths")
    ap.add_argument("--heads", type=int, default=16, help="with --seqlens: q heads")
    ap.add_argument("--heads-kv", type=int, default=None, help="with --seqlens: k/v heads (a divisor of --heads)")
    ap.add_argument("--hdim", type=int, default=128, choices=(64, 96, 128, 192, 256), help="with --seqlens")
    ap.add_argument("--causal", action="store_true", help="with --seqlens")
    ap.add_argument("--settle-s", type=float, default=1.5, help="back-to-back seconds before timing (>= 0)")
    ap.add_argument("--reps", type=int, default=10, help="timed batches per candidate (>= 1); us = their median")
    ap.add_argument("--batch-ms", type=float, default=20.0, help="about this much time per timed batch (> 0)")
    a = ap.parse_args(argv)
    by_name = {b.name: b for b in BATCHES}
    names = [n.strip() for n in a.batches.split(",") if n.strip()] if a.batches else ([] if a.seqlens else list(by_name))
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"--batches: unknown {', '.join(unknown)}; allowed: {', '.join(by_name)}")
    a.selected = [by_name[n] for n in names]
    if a.seqlens_k is not None and a.seqlens is None:
        ap.error("--seqlens-k: only with --seqlens")
    if a.seqlens is not None:
        try:
            sq = lengths("--seqlens", a.seqlens)
            sk = lengths("--seqlens-k", a.seqlens_k) if a.seqlens_k is not None else ()
        except ValueError as e:
            ap.error(str(e))
        if sk and len(sk) != len(sq):
            ap.error(f"--seqlens-k: {len(sk)} lengths; allowed: one per --seqlens length ({len(sq)})")
        if a.heads < 1:
            ap.error(f"--heads {a.heads}: must be >= 1")
        kv = a.heads_kv or a.heads
        if kv < 1 or a.heads % kv:
            ap.error(f"--heads-kv {kv}: must divide --heads {a.heads}")
        a.selected.append(Batch("custom", sq, a.heads, a.hdim, a.causal, kv if kv != a.heads else 0, sk))
    if a.settle_s < 0 or a.reps < 1 or a.batch_ms <= 0:
        ap.error("--settle-s must be >= 0, --reps >= 1, --batch-ms > 0")
    if a.variants and a.pass_ != "bwd":
        ap.error("--variants: backward knob sets; allowed with --pass bwd")
    a.variants = [variant_knobs(ap, text) for text in a.variants]
    return a


def variant_knobs(ap, text: str) -> dict:
    """'gqa_dkv=reduce,stats=tma' -> its knobs, checked by the varlen backward's config (ap.error:
    one line, exit 2). deterministic=true|false picks the build (attention's `deterministic`), the
    rest are its bwd_knobs: deterministic=true,dq_slices=16."""
    from fa4kernel.sm90.bwd_config import make_varlen_bwd_config

    knobs = {}
    for item in filter(None, text.split(",")):
        name, _, val = item.partition("=")
        if not name or not val:
            ap.error(f"--variants {text!r}: {item!r}; allowed: NAME=VALUE,...")
        if name == "deterministic" and val.lower() not in ("true", "false"):
            ap.error(f"--variants {text!r}: deterministic={val!r}; allowed: true, false")
        knobs[name] = (val.lower() == "true") if name == "deterministic" else int(val) if val.isdigit() else val
    try:
        make_varlen_bwd_config("bfloat16", 128, False, bwd_knobs(knobs), deterministic=knobs.get("deterministic", False))
    except ValueError as e:
        ap.error(f"--variants {text!r}: {e}")
    return knobs


def bwd_knobs(variant: dict) -> dict:
    """A --variants set's backward knobs: all but deterministic, which is attention's own argument."""
    return {k: v for k, v in variant.items() if k != "deterministic"}


def variant_name(knobs: dict) -> str:
    return "fa4kernel.varlen[" + ",".join(f"{k}={v}" for k, v in knobs.items()) + "]"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.predict:
        doc = write_predictions(args.predict, args.selected, sys.argv[1:] if argv is None else list(argv), args.pass_,
                                args.dense_twin, args.profile, args.variants)
        for r in doc["rows"]:
            text = (f"{r['us']:9.1f} us {r['tflops']:6.1f} TFLOP/s  {r['bottleneck'][:60]}" if "us" in r
                    else f"not modelled: {r['not_modelled'][:80]}")
            print(f"{r['point']:20s} {r['kernel']:18s} {text}", flush=True)
        for b in args.selected if args.dense_twin else ():
            if not b.dense_shape():
                print(f"{b.name:20s} dense twin: {NO_TWIN}", flush=True)
        return 0
    for b in args.selected:
        print(f"{b.name}: {len(b.seqlens)} sequences, {sum(b.seqlens)} queries on {sum(b.keys)} keys, "
              f"{b.heads}/{b.kv_heads} heads, hd{b.hdim}{' causal' if b.causal else ''}, {b.flops() / 1e9:.1f} GFLOP",
              flush=True)
        if args.dry_run:
            names = candidate_names(b, args.pass_, args.loop, args.dense_twin, args.variants)
            print(f"  candidates: {', '.join(names)}", flush=True)
            if args.dense_twin:
                shape = b.dense_shape()
                view = (f"the .dense candidates on the packed tensors viewed as q ({shape[0]}, {shape[1]}, {b.heads}, "
                        f"{b.hdim}), k and v ({shape[0]}, {shape[2]}, {b.kv_heads}, {b.hdim})" if shape else NO_TWIN)
                print(f"  dense twin: {view}", flush=True)
    if args.dry_run:
        return 0
    from lab.tools.hopper import require_hopper

    require_hopper("bench_varlen_sm90.py", "--dry-run and --predict work without one")
    import torch

    from lab.tools.bench_fwd_sm90 import _version, nvidia_smi
    from lab.tools.provenance import stamp

    meta = stamp({"device": torch.cuda.get_device_name(0), "driver": nvidia_smi("driver_version").get("driver_version"),
                  "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                               "cutlass_dsl": _version("nvidia-cutlass-dsl"), "flash_attn_4": _version("flash-attn-4"),
                               "flash_attn_3": _version("tokenspeed-fa3"), "python": platform.python_version()},
                  "pass": args.pass_,
                  "method": "checked against fp32 per sequence; back to back for settle_s, then reps batches of "
                            "back-to-back calls between CUDA events; us = median batch; TFLOP/s over visible pairs"
                            + (" (2.5 x the forward's FLOPs; the backward alone: autograd.grad of one forward's output)"
                               if args.pass_ == "bwd" else ""),
                  "settings": {"settle_s": args.settle_s, "reps": args.reps, "batch_ms": args.batch_ms,
                               "rel_error_limit": REL_ERROR_LIMIT, "dense_twin": args.dense_twin}}, "varlen")
    global SAMPLER
    from lab.tools.nvml_clock import ClockSampler

    SAMPLER = ClockSampler(torch.cuda.current_device())  # ok False without NVML: no clocks recorded
    meta["nvml"] = {"ok": SAMPLER.ok, "error": SAMPLER.error}
    errors: dict = {}
    rows = []
    for b in args.selected:
        print(b.name, flush=True)
        rows.append(run_batch(torch, b, args, errors))
        if args.out:
            with open(args.out, "w") as fh:
                json.dump({"meta": {**meta, "import_errors": errors}, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
