"""SM90 attention backward benchmark: fa4kernel vs flash-attn-4 (SM90) vs cuDNN (torch SDPA) vs
FA2 (flash_attn.flash_attn_func, where installed), side by side in one run.

Backward only: each implementation's forward runs once outside the timed region; the timed call
is torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), which runs the implementation's
whole backward (for fa4kernel: the preprocess D = rowsum(dO * O), the kernel, and the dQ
conversion). Time = median over repetitions of CUDA-event time for a batch of back-to-back calls,
the implementations timed round-robin (bench_fwd_sm90.time_interleaved). TFLOP/s = 2.5 x the
forward's FLOPs (flash-attn's count: 5 GEMMs against the forward's 2) / time, forward FLOPs from
fa4sim/flops.py (causal: the bottom-right mask's visible pairs).

Before timing, every implementation's dq, dk, dv are checked once against an fp32 torch reference
on a small problem of the same head dim and mask (batch 1, 2 heads, min(seqlen, 2048) tokens).

Grid (bench_fwd_sm90.py's): head_dim 64 / 128 / 256 x seqlen 1k / 4k / 16k x causal, batch x
seqlen = 16384 tokens, heads x head_dim = 2048; bf16. fa4kernel's backward supports every head
dim of the grid (fa4kernel.BWD_HEAD_DIMS: 64, 96, 128, 192, 256); a head dim outside it would be
recorded as unsupported with the peers still timed. The row `fa4kernel` is the backward with its
default knobs; the deterministic backward (fa4kernel[deterministic]: one dQ accumulator, the adds
ordered by a semaphore per query block) is timed at every point.

Backward variants side by side: --variants takes knob sets of the backward (sm90/bwd_config.py:
dq_reduce, dq_smem, dq_sum, stats, mma_order, preprocess, postprocess, tile_m, grid_order, dq_zero, dq_slices), each
timed as its own row `fa4kernel[KNOBS]` in the same round-robin as the peers; a set that does not apply at a point
(tile_m=128 outside head dim 64) is recorded there as unsupported; --hdims, --seqlens, --causal narrow the
grid; --no-deterministic drops the deterministic row.

--sustained times each candidate alone after 2.5 s back to back with no idle kernel between
calls (the clock the power cap settles, which fa4sim's power model predicts; sustained_sm90.py's
method), and adds the row fa4kernel[clock probe]: fa4kernel's default backward through its
clock-probe build (four clock64 / globaltimer stamps per CTA), whose median in-kernel clock over
its timed windows is the point's clock_ghz_in_kernel. --skip leaves candidates out.

--predict FILE (no GPU) writes fa4sim's predictions for the same points and candidates (fa4kernel,
fa4kernel[deterministic], each variant, flash-attn-4; --profile h200 or h100), to commit before the
run; `python -m lab.tools.accuracy --compare RUN.json FILE` then joins the two on each point's problem.

Usage (device): python3 lab/tools/bench_bwd_sm90.py --out $OUT/sm90_bwd.json [--quick] [--sustained]
    python3 lab/tools/bench_bwd_sm90.py --hdims 64,128 --seqlens 1024,16384 --no-deterministic \
        --variants tile_m=128 grid_order=heads_outer dq_reduce=red,stats=thread,mma_order=dv_dk_dq,preprocess=torch \
        --out $OUT/v.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fa4kernel  # noqa: E402
import lab.tools.bench_fwd_sm90 as fwd_bench  # noqa: E402
from lab.tools.bench_fwd_sm90 import _version, load_flops, nvidia_smi, time_interleaved  # noqa: E402
from lab.tools.nvml_clock import ClockSampler  # noqa: E402
from lab.tools.provenance import stamp  # noqa: E402

_FLOPS = load_flops()
BWD_FLOPS_PER_FWD = 2.5


def bwd_flops(b, h, sq, sk, d, causal):
    return BWD_FLOPS_PER_FWD * _FLOPS.attention_flops(b, h, sq, sk, d, None, causal)


# ---- implementations: each maps (q, k, v, causal) with q, k, v (b, s, h, d) leaves requiring
# grad to its output (b, s, h, d)


def _ours(deterministic=False, **bwd_knobs):
    def fwd(q, k, v, causal):
        return fa4kernel.attention(q, k, v, causal=causal, deterministic=deterministic, bwd_knobs=bwd_knobs)

    return fwd


def _knobs_apply(knobs, d, causal):
    """None if the backward can be built with these knobs at head dim d, else why not (one line)."""
    from fa4kernel.sm90.bwd_config import make_bwd_config

    try:
        make_bwd_config("bfloat16", d, causal, **knobs)
    except ValueError as e:
        return str(e)
    return None


def _bad_input(msg):
    """One line on stderr, exit code 2."""
    print(msg, file=sys.stderr)
    raise SystemExit(2)


def parse_variant(text):
    """'dq_reduce=bulk,stats=tma' -> {'dq_reduce': 'bulk', 'stats': 'tma'} (values checked by
    make_bwd_config; 'deterministic' takes true / false)."""
    from fa4kernel.sm90.bwd_config import BWD_HEAD_DIMS, BWD_KNOB_NAMES, make_bwd_config

    knobs = {}
    for item in filter(None, text.split(",")):
        name, _, val = item.partition("=")
        if name not in BWD_KNOB_NAMES or not val:
            _bad_input(f"--variants {text!r}: {item!r}; allowed: NAME=VALUE with NAME in {', '.join(BWD_KNOB_NAMES)}")
        if name == "deterministic":
            knobs[name] = val.lower() == "true"
        elif name in ("tile_m", "dq_slices"):
            if not val.isdigit():
                _bad_input(f"--variants {text!r}: {item!r}; allowed: {name}=INTEGER")
            knobs[name] = int(val)
        else:
            knobs[name] = val
    # a knob set may hold for some head dims only (tile_m=128: head dim 64); it must hold for one
    errors = []
    for d in BWD_HEAD_DIMS:
        try:
            make_bwd_config("bfloat16", d, False, **knobs)
            return knobs
        except (ValueError, TypeError) as e:
            errors.append(f"head_dim {d}: {e}")
    _bad_input(f"--variants {text!r}: {'; '.join(errors)}")


def parse_problem(spec: str):
    """'b=8,h=16,kv=1,s=2048,d=64,causal' -> (d, s, causal, (b, h, kv, sk)); sk= the keys (default: s,
    fewer queries than keys is a chunk); one line and exit 2 otherwise."""
    vals, causal = {}, False
    for tok in filter(None, (t.strip() for t in spec.split(","))):
        if tok == "causal":
            causal = True
            continue
        key, eq, val = tok.partition("=")
        if not eq or key not in ("b", "h", "kv", "s", "sk", "d") or not val.isdigit() or int(val) <= 0:
            _bad_input(f"--problem {spec!r}: {tok!r}; allowed: b=, h=, kv=, s=, sk=, d= positive integers and causal")
        vals[key] = int(val)
    if any(k not in vals for k in ("b", "h", "s", "d")):
        _bad_input(f"--problem {spec!r}: give b=, h=, s= and d= (kv= defaults to h)")
    kv = vals.get("kv", vals["h"])
    if vals["h"] % kv:
        _bad_input(f"--problem {spec!r}: kv={kv} must divide h={vals['h']}")
    if vals["d"] not in fa4kernel.SUPPORTED_HEAD_DIMS:
        _bad_input(f"--problem {spec!r}: d={vals['d']}; allowed: {', '.join(map(str, fa4kernel.SUPPORTED_HEAD_DIMS))}")
    return vals["d"], vals["s"], causal, (vals["b"], vals["h"], kv, vals.get("sk", vals["s"]))


def _flash_attn_4():
    from flash_attn.cute.interface import flash_attn_func

    def fwd(q, k, v, causal):
        out = flash_attn_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    return fwd


def _cudnn():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fwd(q, k, v, causal):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        gqa = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **gqa)
        return o.transpose(1, 2)

    return fwd


def _fa2():
    from flash_attn import flash_attn_func  # FA2's CUDA extension (flash_attn_2_cuda)

    def fwd(q, k, v, causal):
        return flash_attn_func(q, k, v, causal=causal)

    return fwd


def implementations():
    """name -> forward fn, and name -> why it is absent."""
    impls, absent = {"fa4kernel": _ours()}, {}
    for name, make in (("flash-attn-4", _flash_attn_4), ("sdpa-cudnn", _cudnn), ("fa2", _fa2)):
        try:
            impls[name] = make()
        except Exception as e:  # not installed: recorded, the run goes on
            absent[name] = repr(e)[:300]
    return impls, absent


def reference_grads(q, k, v, dout, causal):
    """fp32 autograd; k, v may have fewer heads (GQA: q head i reads k/v head i // group)."""
    d = q.shape[-1]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    g = q.shape[2] // k.shape[2]
    ke, ve = (t.repeat_interleave(g, dim=2) for t in (kf, vf))
    s = torch.einsum("bqhd,bkhd->bhqk", qf, ke) / math.sqrt(d)
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), ve)
    return torch.autograd.grad(o, (qf, kf, vf), dout.float())


def check_grads(fwd, d, s, causal, heads=(2, 2), sk=None) -> dict:
    """rel errors of dq, dk, dv against the fp32 reference on a small problem (finite asserted):
    batch 1, min(s, 2048) queries on min(sk, 4096) keys (sk: s), heads = (q heads, k/v heads)."""
    torch.manual_seed(99 + d + s)
    sk = min(sk or s, 4096 if sk and sk != s else 2048)
    s = min(s, 2048)
    q, dout = (torch.randn(1, s, heads[0], d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, sk, heads[1], d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    got = torch.autograd.grad(fwd(q, k, v, causal), (q, k, v), dout)
    return grad_errors(got, reference_grads(q, k, v, dout, causal))


def grad_errors(got, ref) -> dict:
    """{dq, dk, dv: relative error (NaN if not finite), ok: all <= 1e-2}."""
    errs = {}
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        g = g.float()
        errs[name] = (g - r).norm().item() / r.norm().item() if torch.isfinite(g).all() else float("nan")
    errs["ok"] = all(e <= 1e-2 for e in errs.values())
    return errs


PROBE = "fa4kernel[clock probe]"


def probe_candidate(q, k, v, dout, causal, **bwd_knobs):
    """fa4kernel's backward (bwd_knobs; left out: its defaults) through its clock-probe build
    (fa4kernel.attention_backward_probed: four stamps per CTA and running sums), called directly
    on a recorded forward's out and LSE: returns (run, read). read() -> {"ghz", "ctas", ...}: the
    mean in-kernel clock over every CTA of every launch since the last read() or read.reset()
    (trace.probe_sums), with "last_launch_ghz", the last launch's alone (trace.ctas_clock_ghz)."""
    from fa4kernel.trace import PROBE_SUM_WORDS, ctas_clock_ghz, probe_sums

    with torch.no_grad():
        out, lse = fa4kernel.attention(q, k, v, causal=causal, return_lse=True)
    box = {}

    def run():
        *grads, box["stamps"] = fa4kernel.attention_backward_probed(dout, q, k, v, out, lse, causal=causal,
                                                                    stamps=box.get("stamps"), **bwd_knobs)
        return grads

    def reset():
        if "stamps" in box:
            box["stamps"][-PROBE_SUM_WORDS:].zero_()

    def read():
        words = box["stamps"].tolist()
        reset()
        return {**probe_sums(words), "last_launch_ghz": ctas_clock_ghz(words)["ghz"]}

    read.reset = reset
    return run, read


def check_probe(d, s, causal, heads=(2, 2), **bwd_knobs) -> dict:
    """check_grads for the clock-probe build (with bwd_knobs; left out: the defaults): dq, dk, dv
    on the small problem against the fp32 reference."""
    torch.manual_seed(99 + d + s)
    s = min(s, 2048)
    q, dout = (torch.randn(1, s, heads[0], d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, s, heads[1], d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    run, _ = probe_candidate(q, k, v, dout, causal, **bwd_knobs)
    return grad_errors(run(), reference_grads(q, k, v, dout, causal))


# --sustained: each candidate runs back to back, with no idle kernel between calls, for
# SUSTAINED_WARM_S (the power cap's controller takes more than a second to bring the clock down
# from its maximum: lab/findings/power-and-clock.md), then windows of about SUSTAINED_WINDOW_MS
# are timed until SUSTAINED_TIMED_S of GPU time (lab/tools/sustained_sm90.py's Sustained, eager
# launches: the forward's method)
SUSTAINED_WARM_S, SUSTAINED_TIMED_S, SUSTAINED_WINDOW_MS = 2.5, 1.0, 50.0


def bench_point(impls, d, s, causal, quick, points, variants=None, deterministic=True, sustained=False, shape=None):
    """One problem, every candidate: the grid's (batch x seqlen = 16k tokens, heads x hdim = 2048)
    or shape = (batch, heads, heads_kv, seqlen_k) of a --problem."""
    b, h, hkv, sk = shape or (16384 // s, 2048 // d, 2048 // d, s)
    point = dict(batch=b, seqlen=s, seqlen_k=sk, heads=h, heads_kv=hkv, hdim=d, causal=causal,
                 flops=bwd_flops(b, h, s, sk, d, causal), results={})
    small = (2, 2) if hkv == h else (h // hkv * min(hkv, 2), min(hkv, 2))  # the check's (q, k/v) heads
    cands = dict(impls)
    skip = {}
    for text in variants or []:
        knobs = parse_variant(text)
        cands[f"fa4kernel[{text}]"] = _ours(**knobs)
        why = _knobs_apply(knobs, d, causal) if d in fa4kernel.BWD_HEAD_DIMS else None
        if why:
            skip[f"fa4kernel[{text}]"] = why
    if deterministic and d in fa4kernel.BWD_HEAD_DIMS:
        cands["fa4kernel[deterministic]"] = _ours(deterministic=True)
    torch.manual_seed(1234 + s + d)
    q, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    timed, probe_read = {}, None
    if sustained and d in fa4kernel.BWD_HEAD_DIMS:  # the in-kernel clock of fa4kernel's default build
        try:
            check = check_probe(d, s, causal, heads=small)
            point["results"][PROBE] = dict(check=check)
            if check["ok"]:
                run, probe_read = probe_candidate(q, k, v, dout, causal)
                run()  # first call: JIT compiles
                torch.cuda.synchronize()
                timed[PROBE] = run
            else:
                point["results"][PROBE]["error"] = "gradients off the fp32 reference; not timed"
        except Exception as e:  # keep the run going
            point["results"][PROBE] = dict(error=repr(e)[:500])
    for name, fwd in cands.items():
        if name.startswith("fa4kernel") and d not in fa4kernel.BWD_HEAD_DIMS:
            point["results"][name] = dict(unsupported=f"head_dim={d}; the backward has {fa4kernel.BWD_HEAD_DIMS}")
            continue
        if name in skip:
            point["results"][name] = dict(unsupported=skip[name])
            continue
        try:
            check = check_grads(fwd, d, s, causal, small, sk)
            out = fwd(q, k, v, causal)  # forward outside the timed region

            def run(out=out):
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

            run()  # first call: JIT compiles
            torch.cuda.synchronize()
            point["results"][name] = dict(check=check)
            if check["ok"]:
                timed[name] = run
            else:
                point["results"][name]["error"] = "gradients off the fp32 reference; not timed"
        except Exception as e:  # keep the run going
            point["results"][name] = dict(error=repr(e)[:500])
        torch.cuda.synchronize()
    if timed:
        if sustained:  # each alone, after SUSTAINED_WARM_S back to back: the clock the power cap settles
            from lab.tools.sustained_sm90 import Sustained

            runner = Sustained(fwd_bench.SAMPLER, SUSTAINED_WARM_S, SUSTAINED_TIMED_S, SUSTAINED_WINDOW_MS, "eager")
            times = {}
            clocks = []  # the probe's in-kernel clock of each timed window: the mean over its launches

            def read_window():
                clocks.append(probe_read())
            read_window.reset = probe_read.reset if PROBE in timed else None
            for name, fn in timed.items():
                rec = runner.run(name, fn, None, read_window if name == PROBE else None)
                times[name] = (rec["ms"], rec["ms_min"], rec["ms_max"], rec.get("sm_mhz"))
                point["results"][name].update(windows=rec["windows"], warm_s=rec["warm_s"], timed_s=rec["timed_s"],
                                              host_bound=rec.get("host_bound"))
                if rec.get("nvml"):  # board power (NVML's samples), temperature and clock-event reasons
                    point["results"][name]["nvml"] = rec["nvml"]
                    point["results"][name]["power_w"] = rec["nvml"].get("power_w_mean")
            ghz = [c["ghz"] for c in clocks if c["ghz"]]
            if ghz:
                last = [c["last_launch_ghz"] for c in clocks if c.get("last_launch_ghz")]
                point["results"][PROBE].update(
                    clock_ghz_in_kernel_batches=ghz, probe_ctas=sum(c["ctas"] for c in clocks),
                    clock_ghz_in_kernel_mean=sum(c["cycles"] for c in clocks) / sum(c["ns"] for c in clocks),
                    clock_ghz_last_launch=statistics.median(last) if last else None)
                point["clock_ghz_in_kernel"] = statistics.median(ghz)
        else:
            times = time_interleaved(timed, reps=5 if quick else 15)
        for name, (med, lo, hi, mhz) in times.items():
            point["results"][name].update(ms=med, ms_min=lo, ms_max=hi, sm_mhz=mhz,
                                          tflops=point["flops"] / (med * 1e-3) / 1e12)
    points.append(point)
    r = point["results"]
    line = " ".join(f"{n}={r[n]['tflops']:.0f}" if "tflops" in r[n] else f"{n}=--" for n in r)
    print(f"bwd hd{d:<3} s{s:<6}{'' if sk == s else f' sk{sk}'} b{b:<3} h{h:<3}{'' if hkv == h else f' kv{hkv}'} "
          f"causal={int(causal)} {line}", flush=True)
    del q, k, v, dout
    torch.cuda.empty_cache()


def predict_rows(runs, variants, deterministic: bool, *, profile: str) -> list:
    """fa4sim's predictions (on `profile`, each at its power model's clock) for every point of the
    run: fa4kernel's default backward, its deterministic build, each --variants set and flash-attn-4.
    A row carries the point's problem, so accuracy --compare joins it to the measured point."""
    from fa4sim import Problem, simulate

    builds = [("fa4kernel", "fa4kernel", None), ("flash-attn-4", "flash-attn-4", None)]
    if deterministic:
        builds.append(("fa4kernel[deterministic]", "fa4kernel", {"deterministic": True}))
    builds += [(f"fa4kernel[{text}]", "fa4kernel", parse_variant(text)) for text in variants or []]
    rows = []
    for d, s, causal, shape in runs:
        b, h, hkv, sk = shape or (16384 // s, 2048 // d, 2048 // d, s)
        problem = dict(batch=b, heads=h, heads_kv=hkv, seqlen=s, seqlen_k=sk, hdim=d, causal=causal)
        for kernel, impl, knobs in builds:
            try:
                r = simulate(profile, problem=Problem(b, h, s, sk, d, causal, heads_kv=hkv), impl=impl, pass_="bwd",
                             overrides=knobs)
            except Exception as e:  # fa4sim has no model of it: said so in the file
                rows.append({"kernel": kernel, **problem, "not_modelled": str(e).splitlines()[0][:200]})
                continue
            rows.append({"kernel": kernel, **problem, "us": r.time_us,
                         "tflops": bwd_flops(b, h, s, sk, d, causal) / (r.time_us * 1e6), "clock_ghz": r.clock_ghz,
                         "pre_us": r.pre_us, "main_us": r.main_us, "post_us": r.post_us, "bottleneck": r.bottleneck,
                         **{k: r.knobs[k] for k in ("gqa_dkv", "dq_slices") if k in r.knobs}})
    return rows


def write_predictions(path: str, runs, variants, deterministic: bool, profile: str, argv) -> dict:
    import subprocess

    from lab.tools.hopper import PROFILES

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    meta = {"kind": "predictions", "device": PROFILES[profile], "profile": profile,
            "model_commit": head.stdout.strip() or "unknown", "date": dt.date.today().isoformat(),
            "what": "fa4sim's backward predictions per point: us at the power model's clock, TFLOP/s 2.5 x the "
                    "forward's FLOPs over the visible pairs; written before the run",
            "command": "python3 lab/tools/bench_bwd_sm90.py " + " ".join(argv)}
    doc = {"meta": meta, "rows": predict_rows(runs, variants, deterministic, profile=profile)}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    return doc


def summarize(points) -> dict:
    """geomean of every fa4kernel row (the default and each variant) over each peer, on the
    points where both were timed; and each row's lowest ratio over cuDNN."""
    ratios = {}
    for p in points:
        for name, res in p["results"].items():
            ours = res.get("tflops")
            if not name.startswith("fa4kernel") or not ours:
                continue
            for peer in ("flash-attn-4", "sdpa-cudnn", "fa2"):
                theirs = p["results"].get(peer, {}).get("tflops")
                if theirs:
                    ratios.setdefault((name, peer), []).append(ours / theirs)
    out = {}
    for (name, peer), r in ratios.items():
        out[f"geomean_{name}_over_{peer}"] = math.exp(sum(map(math.log, r)) / len(r))
        if peer == "sdpa-cudnn":
            out[f"min_{name}_over_{peer}"] = min(r)
    return out


def main():
    ap = argparse.ArgumentParser(description="SM90 attention backward benchmark: fa4kernel, flash-attn-4, cuDNN, FA2")
    ap.add_argument("--out", help="result JSON (written after every point); required unless --predict")
    ap.add_argument("--predict", default=None, metavar="FILE",
                    help="write fa4sim's predictions for the selected points to FILE (to commit before the run); no GPU")
    ap.add_argument("--profile", default="h200", choices=("h100", "h200"),
                    help="with --predict: the fa4sim profile to predict for (default h200; h100 for an H100 SXM)")
    ap.add_argument("--quick", action="store_true", help="2 points (hd128 1k, causal and not): a smoke run")
    ap.add_argument("--variants", nargs="*", default=None,
                    help="backward knob sets, each a row fa4kernel[KNOBS] beside the default fa4kernel row, "
                         "e.g. tile_m=128 mma_order=dv_dk_dq dq_reduce=red,stats=thread (default: none); a set "
                         "that does not apply at a point's head dim is recorded as unsupported there")
    ap.add_argument("--hdims", default="64,128,256", help="head dims, comma-separated (default 64,128,256)")
    ap.add_argument("--seqlens", default="1024,4096,16384", help="sequence lengths (default 1024,4096,16384)")
    ap.add_argument("--causal", default="both", choices=("both", "0", "1"), help="causal points (default both)")
    ap.add_argument("--no-deterministic", action="store_true", help="leave out the fa4kernel[deterministic] row")
    ap.add_argument("--sustained", action="store_true",
                    help=f"time each candidate alone after {SUSTAINED_WARM_S} s back to back, at the clock the 700 W "
                         "cap settles (what fa4sim's power model predicts); default: short round-robin batches")
    ap.add_argument("--skip", default="", help="candidates to leave out, comma-separated (e.g. sdpa-cudnn,fa2)")
    ap.add_argument("--problem", action="append", default=[], metavar="b=B,h=H,kv=KV,s=S[,sk=SK],d=D[,causal]",
                    help="a problem of your own (repeatable): batch, q heads, k/v heads (GQA / MQA: kv divides h), "
                         "sequence length (sk: the keys, default s), head dim; with any --problem the grid runs "
                         "only with --grid")
    ap.add_argument("--grid", action="store_true", help="with --problem: run the grid too")
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                    help="also time the fa4kernel package in DIR (another checkout, e.g. HEAD~1's) with its "
                         "defaults, as 'fa4kernel@LABEL': an A/B of kernel sources in one run (repeatable)")
    args = ap.parse_args()
    problems = [parse_problem(spec) for spec in args.problem]
    trees = []
    for spec in args.tree:
        label, eq, path = spec.partition("=")
        if not eq or not label.isidentifier() or not os.path.isfile(os.path.join(path, "fa4kernel", "__init__.py")):
            _bad_input(f"--tree {spec!r}: want LABEL=DIR, LABEL a name and DIR holding a fa4kernel package")
        trees.append((label, path))
    for text in args.variants or []:
        parse_variant(text)  # bad knob: one line, exit before the GPU work
    try:
        hdims = [int(x) for x in args.hdims.split(",")]
        seqlens = [int(x) for x in args.seqlens.split(",")]
    except ValueError:
        _bad_input("--hdims / --seqlens: comma-separated integers, e.g. 64,128")
    for d in hdims:
        if d not in fa4kernel.SUPPORTED_HEAD_DIMS:
            _bad_input(f"--hdims: {d}; allowed: {', '.join(map(str, fa4kernel.SUPPORTED_HEAD_DIMS))}")
    causals = {"both": (False, True), "0": (False,), "1": (True,)}[args.causal]
    grid = [(d, s, c) for d in hdims for s in seqlens for c in causals]
    if args.quick:
        grid = [(128, 1024, False), (128, 1024, True)]
    if problems and not args.grid:
        grid = []
    runs = [(d, s, c, None) for d, s, c in grid] + problems
    if args.predict:
        doc = write_predictions(args.predict, runs, args.variants, not args.no_deterministic, args.profile,
                                sys.argv[1:])
        print(f"wrote {len(doc['rows'])} predictions ({args.profile}) to {args.predict}")
        return
    if not args.out:
        _bad_input("--out: the result JSON is required (or --predict FILE for fa4sim's predictions, no GPU)")
    from lab.tools.hopper import require_hopper

    require_hopper("bench_bwd_sm90.py")

    dev = torch.cuda.get_device_name(0)
    # time_interleaved records each candidate's mean NVML SM clock while a sampler is set
    fwd_bench.SAMPLER = ClockSampler(torch.cuda.current_device())
    impls, absent = implementations()
    from lab.tools.sustained_sm90 import load_tree

    for label, path in trees:
        module = load_tree(label, path)
        impls[f"fa4kernel@{label}"] = (lambda m: lambda q, k, v, causal: m.attention(q, k, v, causal=causal))(module)
    for name in filter(None, args.skip.split(",")):
        if impls.pop(name, None) is not None:
            absent[name] = "left out (--skip)"
    meta = stamp(dict(
        device=dev,
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        clocks_before=nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu"),
        versions=dict(torch=torch.__version__, cuda=torch.version.cuda, cutlass_dsl=_version("nvidia-cutlass-dsl"),
                      flash_attn_4=_version("flash-attn-4"), flash_attn=_version("flash-attn"),
                      cudnn=torch.backends.cudnn.version(), python=platform.python_version()),
        method="backward only: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) after one forward "
               "outside the timed region; median over reps of CUDA-event time of back-to-back call batches, "
               "round-robin over implementations; bf16; TFLOP/s = 2.5 x forward FLOPs (fa4sim/flops.py, causal: "
               "bottom-right visible pairs) / t; tokens b*s = 16384, h*d = 2048; grads checked once against an "
               "fp32 reference (batch 1, 2 heads, min(s, 2048) tokens) before timing; sm_mhz = mean NVML SM "
               "clock sampled every 0.5 ms during that candidate's timed batches",
        nvml=dict(ok=fwd_bench.SAMPLER.ok, error=fwd_bench.SAMPLER.error),
        sustained=bool(args.sustained),
        sustained_method=(f"each candidate alone: {SUSTAINED_WARM_S} s back to back (eager launches, no idle kernel "
                          f"between calls), then windows of ~{SUSTAINED_WINDOW_MS:.0f} ms timed until "
                          f"{SUSTAINED_TIMED_S} s of GPU time (median per call; lab/tools/sustained_sm90.py's "
                          "Sustained); "
                          "the round-robin of `method` is not used; fa4kernel[clock probe] is fa4kernel's default "
                          "backward with four clock64 / globaltimer stamps per CTA and running sums, called on a "
                          "recorded forward, and clock_ghz_in_kernel the median over its batches of each batch's "
                          "mean clock (every CTA of every launch: cycles over ns; clock_ghz_last_launch: the "
                          "batches' last launches alone)") if args.sustained else None,
        absent=absent,
        variants=args.variants or [],
    ), "sm90_bwd")
    points = []
    out = args.out
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    def write(final=False):
        if final:
            meta["clocks_after"] = nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu")
        doc = dict(meta=meta, summary=summarize(points), points=points, complete=final)
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)
        return doc

    for d, s, causal, shape in runs:
        bench_point(impls, d, s, causal, args.quick, points, args.variants, not args.no_deterministic, args.sustained,
                    shape)
        write()
    doc = write(final=True)
    print(json.dumps(doc["summary"], indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
