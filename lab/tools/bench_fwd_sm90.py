"""SM90 forward attention benchmark: fa4kernel vs FlashAttention-3 vs flash-attn-4 (SM90) vs torch SDPA (cuDNN, flash).

All implementations see the same bf16 inputs in one run. Time = median over repetitions of
CUDA-event time for a batch of back-to-back calls (so host launch overhead is amortised the
same way for everyone). TFLOP/s = 2*b*h*(d + dv)*visible (query, key) pairs / time
(fa4sim/flops.py: causal counts the bottom-right mask exactly).

Usage (device): python3 lab/tools/bench_fwd_sm90.py --out $OUT/sm90_fwd.json [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fa4kernel  # noqa: E402
from lab.tools.nvml_clock import ClockSampler  # noqa: E402
from lab.tools.provenance import stamp  # noqa: E402

# NVML's SM clock, sampled during every timed batch: the power cap moves it by 10-20 % between
# runs, so cycles (what fa4sim predicts) = time x the clock of that very batch.
SAMPLER = None
FA3 = "flash-attn-3"  # FlashAttention-3's forward: the tokenspeed-fa3 package's flash_attn_interface
FA3_HEAD_DIMS = (64, 128, 192, 256)  # the head dims its package is built for (hdim_v = hdim)


def _version(pkg):
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:
        return None


def nvidia_smi(fields):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return dict(zip(fields.split(","), [x.strip() for x in out.split("\n")[0].split(",")]))
    except Exception as e:  # pragma: no cover
        return {"error": str(e)}


# Host lead: before each timed batch the GPU spins (torch.cuda._sleep) long enough for the host
# to enqueue the whole batch, so the events time back-to-back kernels, not the Python launch
# path (measured on the H100 at 1k tokens: 75-165 us of host time per call, which a short batch
# otherwise partly exposes). Cycles per enqueued call to spin for; 0 turns it off.
HOST_LEAD_CYCLES_PER_CALL = 600_000  # ~330 us at 1.8 GHz, twice the slowest host path seen


def _batch_ms(fn, inner, ev, window=None):
    s, e = ev
    if window is not None and SAMPLER is not None and SAMPLER.ok:
        with SAMPLER.window(window):
            return _batch_ms(fn, inner, ev)
    if HOST_LEAD_CYCLES_PER_CALL:
        torch.cuda._sleep(int(HOST_LEAD_CYCLES_PER_CALL * inner))
    s.record()
    for _ in range(inner):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / inner


def time_interleaved(fns: dict, reps=15, target_ms=3.0, warm_ms=300.0, after_batch=None):
    """Median ms per call for each fn, and the mean NVML SM clock (MHz) during its timed batches
    (None without NVML). Candidates are timed round-robin (A B C D A B C D ...) after a common
    warm-up, so clock ramps and thermal drift hit everyone alike; each sample times `inner`
    back-to-back calls between two CUDA events (launch gaps amortised)."""
    global _WINDOW_ID
    _WINDOW_ID += 1
    ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
    inner = {}
    for name, fn in fns.items():
        one = max(_batch_ms(fn, 1, ev), 1e-3)
        inner[name] = max(1, min(100, int(target_ms / one)))
    t_end = time.perf_counter() + warm_ms / 1e3  # bring clocks up before sampling
    while time.perf_counter() < t_end:
        for name, fn in fns.items():
            _batch_ms(fn, inner[name], ev)
    for read in (after_batch or {}).values():
        getattr(read, "reset", lambda: None)()  # a clock probe's sums: the warm-up stays out
    samples = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name].append(_batch_ms(fn, inner[name], ev, f"{_WINDOW_ID}:{name}"))
            if after_batch and name in after_batch:
                after_batch[name]()  # outside the timed window (reads the clock probe)
    clocks = (SAMPLER.summary([f"{_WINDOW_ID}:{n}" for n in fns])
              if SAMPLER is not None and SAMPLER.ok else {})
    return {n: (statistics.median(v), min(v), max(v), clocks.get(f"{_WINDOW_ID}:{n}", {}).get("mhz_mean"))
            for n, v in samples.items()}


_WINDOW_ID = 0


def last_nvml(name: str) -> dict:
    """NVML's summary (clock, power samples, temperature, clock-event reasons) of `name`'s timed
    batches in the last time_interleaved call; {} without NVML."""
    if SAMPLER is None or not SAMPLER.ok:
        return {}
    return SAMPLER.summary([f"{_WINDOW_ID}:{name}"]).get(f"{_WINDOW_ID}:{name}", {})


def load_flops():
    """fa4sim/flops.py loaded by its path: the repository's one FLOP count, without importing the
    fa4sim package (its simulator needs simpy, which the device machine does not have)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fa4sim", "flops.py")
    spec = importlib.util.spec_from_file_location("fa4sim_flops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_FLOPS = load_flops()


def flops(b, h, sq, sk, d, causal, dv=None):
    """FLOPs of one forward (fa4sim/flops.py): 2*b*h*(d + dv)*visible (query, key) pairs; causal
    counts the bottom-right-aligned mask exactly (sq (sq + 1) / 2 pairs when sq == sk)."""
    return _FLOPS.attention_flops(b, h, sq, sk, d, dv, causal)


class Impls:
    def __init__(self):
        self.errors = {}
        try:
            from flash_attn.cute.interface import flash_attn_func as fa4

            self.fa4 = fa4
        except Exception as e:  # keep the run going without the peer
            self.fa4 = None
            self.errors["flash-attn-4"] = repr(e)
        try:  # FlashAttention-3, the C++/CUTLASS kernel (tokenspeed-fa3: hd 64, 128, 192, 256)
            from flash_attn_interface import flash_attn_func as fa3

            self.fa3 = fa3
        except Exception as e:
            self.fa3 = None
            self.errors[FA3] = repr(e)

    def ours(self, q, k, v, causal, **knobs):
        return lambda: fa4kernel.attention(q, k, v, causal=causal, **knobs)

    def ours_one_tile_per_cta(self, q, k, v, causal, **knobs):
        """Same compiled kernel, grid = one CTA per tile instead of one persistent CTA per SM."""
        from fa4kernel import interface

        def run():
            interface.PERSISTENT = False
            try:
                return fa4kernel.attention(q, k, v, causal=causal, **knobs)
            finally:
                interface.PERSISTENT = True

        return run

    def ours_clock_probe(self, q, k, v, causal, one_tile_per_cta=False, **knobs):
        """The clock-probe build (the same kernel plus clock64 / globaltimer stamps): returns
        (fn, read). read() appends to .ghz the mean in-kernel clock of every launch since the last
        read() or reset() (the header's running sums, fa4kernel.trace.mean_clock), and to .sums
        its (cycles, ns, spans); reset() zeroes the sums (call it before a timed stretch, so a
        warm-up's launches stay out). one_tile_per_cta: launched as ours_one_tile_per_cta
        launches. A persistent launch's CTA 0 spans the launch; in a launch of one CTA per tile it
        lives for the first tile only, so there the CTA-log build is the probe instead, and every
        CTA adds its span: all CTAs' cycles over all their ns."""
        from fa4kernel import interface
        from fa4kernel.interface import attention_probed, resolve_config
        from fa4kernel.trace import mean_clock
        from fa4kernel.trace_layout import SUM_CYCLES, SUM_SPANS, TRACE_HEADER, TRACE_WORDS

        box = {"st": torch.zeros((TRACE_WORDS,), dtype=torch.int64, device=q.device)}  # CTA 0 / all CTAs
        every_cta = one_tile_per_cta or not resolve_config(q, k, v, causal, **knobs).persistent

        def run():
            interface.PERSISTENT = not one_tile_per_cta
            try:
                out, _ = attention_probed(q, k, v, causal=causal, stamps=box["st"], cta_log=every_cta, **knobs)
            finally:
                interface.PERSISTENT = True
            return out

        def reset():
            box["st"][SUM_CYCLES:SUM_SPANS + 1].zero_()

        def read():
            m = mean_clock(box["st"][:TRACE_HEADER].tolist())
            reset()
            if m["ghz"]:
                read.ghz.append(m["ghz"])
                read.sums.append((m["cycles"], m["ns"], m["spans"]))

        read.ghz, read.sums = [], []
        read.reset = reset
        read.every_cta = every_cta
        return run, read

    def flash_attn_4(self, q, k, v, causal):
        f = self.fa4
        return lambda: f(q, k, v, causal=causal)

    def flash_attn_3(self, q, k, v, causal):
        f = self.fa3

        def run():
            out = f(q, k, v, causal=causal)
            return out[0] if isinstance(out, tuple) else out  # (out, lse) in some versions

        return run

    def sdpa(self, q, k, v, causal, backend, **gqa):
        """torch SDPA on one backend; gqa: {"enable_gqa": True} where k and v have fewer heads."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (b, h, s, d) views, same memory

        def run():
            with sdpa_kernel(be):  # noqa: SIM117
                o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **gqa)
            return o.transpose(1, 2)  # back to (b, s, h, d): a view, no copy

        return run


# Timed beside the others at every point: our kernel's clock-probe build. Its in-kernel clock
# (clock64 / globaltimer of CTA 0, one value per batch) is the SM clock the whole round-robin
# ran at, since the candidates alternate every few ms; fa4sim validate turns cycles into time
# with it. Its own ms also shows the probe costs nothing (compare with "fa4kernel").
PROBE = "fa4kernel[clock probe]"
# The same for each variant of our kernel timed at a point (a knob, one CTA per tile): its own
# clock, which need not be the default's (a launch with idle SMs between CTAs draws less power
# and may run faster); fa4sim validate predicts each variant at its own. Named
# "fa4kernel[clock probe:<variant>]", recorded as point["clock_ghz_in_kernel_by_variant"].


def variant_probe(label):
    return f"fa4kernel[clock probe:{label}]"


def _record_clock(point, ghz):
    if ghz:
        point["clock_ghz_in_kernel"] = statistics.median(ghz)
        point["clock_ghz_in_kernel_range"] = [min(ghz), max(ghz)]


def first_call_seconds(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def check_close(out, ref_out):
    out = out[0] if isinstance(out, tuple) else out
    return ((out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()


def _first_calls(cands, point) -> dict:
    """First (JIT-compiling) call of each (name, fn), its result checked against the first one's;
    records first_call_s / rel_diff_vs_fa4kernel (or the error) and returns the ones that ran."""
    ok, ref_out = {}, None
    for name, fn in cands:
        try:
            first = first_call_seconds(fn)  # includes the JIT compile on a cache miss
            out = fn()
            agree = 0.0 if ref_out is None else check_close(out, ref_out)
            if ref_out is None:
                ref_out = out[0] if isinstance(out, tuple) else out
            ok[name] = fn
            point["results"][name] = dict(first_call_s=first, rel_diff_vs_fa4kernel=agree)
        except Exception as e:
            point["results"][name] = dict(error=repr(e)[:500])
        torch.cuda.synchronize()
    return ok


def _time_into(point, ok, reps, flop, probe_read, variant_reads=None):
    """Time the candidates round-robin and record ms, TFLOP/s, NVML MHz and the in-kernel clock
    (the default's, and each variant's where it has a probe)."""
    reads = {PROBE: probe_read, **{variant_probe(v): r for v, r in (variant_reads or {}).items()}}
    timed = time_interleaved(ok, reps=reps, after_batch={n: r for n, r in reads.items() if n in ok})
    for name, (med, lo, hi, mhz) in timed.items():
        point["results"][name].update(ms=med, ms_min=lo, ms_max=hi, tflops=flop / (med * 1e-3) / 1e12,
                                      sm_mhz=mhz)
    _record_clock(point, probe_read.ghz)
    point["clock_probe_every_cta"] = probe_read.every_cta
    by_variant = {v: statistics.median(r.ghz) for v, r in (variant_reads or {}).items() if r.ghz}
    if by_variant:
        point["clock_ghz_in_kernel_by_variant"] = by_variant
        # every probe now spans its launch (CTA 0 of a persistent one, else the CTA log)
        point["clock_probes_span_launch"] = True


def bench_point(impls, b, s, h, d, causal, results, quick, knobs=None, label=None, peers=True):
    torch.manual_seed(1234 + s + d)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    f = flops(b, h, s, s, d, causal)
    point = dict(batch=b, seqlen=s, heads=h, hdim=d, causal=causal, label=label or "main",
                 knobs=knobs or {}, results={})
    reps = 5 if quick else 15
    cands = [("fa4kernel", impls.ours(q, k, v, causal, **(knobs or {})))]
    probe_fn, probe_read = impls.ours_clock_probe(q, k, v, causal, **(knobs or {}))
    cands.append((PROBE, probe_fn))
    cfg0 = fa4kernel.interface.resolve_config(q, k, v, causal, **(knobs or {}))  # as attention() runs it
    variant_reads = {}
    if peers and cfg0.persistent:  # persistent by default: also time 1 tile/CTA
        cands.append(("fa4kernel[1 tile/CTA]", impls.ours_one_tile_per_cta(q, k, v, causal, **(knobs or {}))))
        fn, variant_reads["1 tile/CTA"] = impls.ours_clock_probe(q, k, v, causal, one_tile_per_cta=True, **(knobs or {}))
        cands.append((variant_probe("1 tile/CTA"), fn))
    if peers and causal and not cfg0.persistent:  # one CTA per tile by default: also time persistent
        kn = {**(knobs or {}), "persistent": True}
        cands.append(("fa4kernel[persistent=True]", impls.ours(q, k, v, causal, **kn)))
        fn, variant_reads["persistent=True"] = impls.ours_clock_probe(q, k, v, causal, **kn)
        cands.append((variant_probe("persistent=True"), fn))
    if peers:
        if impls.fa3 is not None and d in FA3_HEAD_DIMS:
            cands.append((FA3, impls.flash_attn_3(q, k, v, causal)))
        if impls.fa4 is not None:
            cands.append(("flash-attn-4", impls.flash_attn_4(q, k, v, causal)))
        cands += [("sdpa-cudnn", impls.sdpa(q, k, v, causal, "cudnn")),
                  ("sdpa-flash", impls.sdpa(q, k, v, causal, "flash"))]
    ok = _first_calls(cands, point)
    if ok:
        _time_into(point, ok, reps, f, probe_read, variant_reads)
    if knobs is not None or label is None:
        point["fa4kernel_config"] = as_ran(cfg0)
        point["fa4kernel_compile_s"] = fa4kernel.COMPILE_TIMES.get(cfg0)
    results.append(point)
    r = point["results"]
    line = " ".join(f"{n}={r[n]['tflops']:.0f}" if "tflops" in r[n] else f"{n}=ERR" for n in r)
    line = line.replace("fa4kernel[1 tile/CTA]", "1tile/CTA")
    print(f"hd{d:<3} s{s:<6} b{b:<3} h{h:<3} causal={int(causal)} {label or '':<28} {line}", flush=True)
    del q, k, v
    return point


def as_ran(cfg) -> dict:
    """A resolved KernelConfig as recorded: its fields, and that the kernel idles warpgroups whose
    rows all lie past seqlen_q (skip_idle_wgs, which fa4sim validate needs)."""
    return {**cfg.as_dict(), "skip_idle_wgs": True}


def bench_knobs(impls, b, s, h, d, causal, variants, results, quick):
    """All knob variants of one shape timed round-robin in one group (plus the peers)."""
    torch.manual_seed(4321 + s + d)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    f = flops(b, h, s, s, d, causal)
    point = dict(batch=b, seqlen=s, heads=h, hdim=d, causal=causal, label="knobs", results={},
                 configs={}, compile_s={})
    fns = {}
    probe_fn, probe_read = impls.ours_clock_probe(q, k, v, causal)
    fns[PROBE] = probe_fn
    variant_reads = {}
    for label, kn in variants:
        fns[f"fa4kernel[{label}]"] = impls.ours(q, k, v, causal, **kn)
        point["configs"][label] = as_ran(fa4kernel.interface.resolve_config(q, k, v, causal, **kn))
        if kn:  # the default's clock is the plain probe's
            fns[variant_probe(label)], variant_reads[label] = impls.ours_clock_probe(q, k, v, causal, **kn)
    if impls.fa3 is not None and d in FA3_HEAD_DIMS:
        fns[FA3] = impls.flash_attn_3(q, k, v, causal)
    if impls.fa4 is not None:
        fns["flash-attn-4"] = impls.flash_attn_4(q, k, v, causal)
    fns["sdpa-cudnn"] = impls.sdpa(q, k, v, causal, "cudnn")
    ok = _first_calls(fns.items(), point)
    for label, kn in variants:
        cfg = fa4kernel.interface.resolve_config(q, k, v, causal, **kn)
        point["compile_s"][label] = fa4kernel.COMPILE_TIMES.get(cfg)
    _time_into(point, ok, 5 if quick else 11, f, probe_read, variant_reads)
    results.append(point)
    for name, r in point["results"].items():
        val = f"{r['tflops']:.0f}" if "tflops" in r else "ERR"
        print(f"hd{d} s{s} causal={int(causal)} {name:<42} {val} TFLOP/s", flush=True)
    del q, k, v
    return point


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="a few points only (smoke)")
    ap.add_argument("--no-knobs", action="store_true")
    ap.add_argument("--only-knobs", action="store_true",
                    help="the hd128 8k knob groups only (causal and not), without the main grid")
    args = ap.parse_args()
    from lab.tools.hopper import require_hopper

    require_hopper("bench_fwd_sm90.py")

    global SAMPLER
    SAMPLER = ClockSampler(torch.cuda.current_device())
    dev = torch.cuda.get_device_name(0)
    meta = dict(
        device=dev,
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        host_lead_cycles_per_call=HOST_LEAD_CYCLES_PER_CALL,
        clocks_before=nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu"),
        versions=dict(torch=torch.__version__, cuda=torch.version.cuda,
                      cutlass_dsl=_version("nvidia-cutlass-dsl"), flash_attn_4=_version("flash-attn-4"),
                      flash_attn_3=_version("tokenspeed-fa3"), cudnn=torch.backends.cudnn.version(), python=platform.python_version()),
        method="median over reps of CUDA-event time of back-to-back call batches, each enqueued behind "
               "a GPU spin long enough for the host to queue the whole batch (host launch time excluded); bf16; "
               "TFLOP/s = 2*b*h*(d+dv)*visible pairs/t (fa4sim/flops.py; causal: bottom-right mask, "
               "sq(sq+1)/2 pairs when square); tokens b*s = 16384, h*d = 2048; "
               "sm_mhz = mean NVML SM clock sampled every 0.5 ms during that candidate's timed batches",
        nvml=dict(ok=SAMPLER.ok, error=SAMPLER.error),
    )
    stamp(meta, "knob_points" if args.only_knobs else "points")
    impls = Impls()
    meta["peer_import_errors"] = impls.errors
    results = []
    out = args.out
    if out is None:
        name = "h200" if "H200" in dev else "h100" if "H100" in dev else dev.replace("NVIDIA ", "").replace(" ", "_").lower()
        # a knobs-only file is not a grid: its own name (and meta.kind), so the grid readers skip it
        stem = "fwd_knobs_sm90" if args.only_knobs else "sm90_fwd"
        out = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "lab", "campaigns", "unsorted",
                           f"{stem}_{name}_{dt.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)

    def write(final=False):
        """Rewritten after every point, so a cut-off run keeps what it measured."""
        if final:
            meta["clocks_after"] = nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu")
        doc = dict(meta=meta, summary=summarize(results), points=results, complete=final)
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)
        return doc

    hdims = [64, 128, 256]
    seqlens = [1024, 4096, 16384]
    if args.quick:
        hdims, seqlens = [128], [4096]
    for d in ([] if args.only_knobs else hdims):
        for s in seqlens:
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                bench_point(impls, b, s, h, d, causal, results, args.quick)
                write()

    if not args.no_knobs:
        d, s = 128, 8192
        b, h = 16384 // s, 2048 // d
        variants = [
            ("default", {}),
            ("pingpong=False", dict(pingpong=False)),
            ("intra_wg_overlap=False", dict(intra_wg_overlap=False)),
            ("p_in_registers=False", dict(p_in_registers=False)),
            ("kv_stages=3", dict(kv_stages=3)),
            ("exp_emulation=0.125", dict(exp_emulation=0.125)),
            ("exp_emulation=0.25", dict(exp_emulation=0.25)),
            ("rescale_threshold=8", dict(rescale_threshold=8.0)),
            ("fa4_tricks(emu0.125,tau8)", dict(exp_emulation=0.125, rescale_threshold=8.0)),
        ]
        if args.quick:
            variants = variants[:3]
        for causal in (False, True):
            bench_knobs(impls, b, s, h, d, causal, variants, results, args.quick)
            write()

    doc = write(final=True)
    print(json.dumps(doc["summary"], indent=1))
    print("wrote", out)


def summarize(results) -> dict:
    """Ours vs the peers on the main grid: geomean over FlashAttention-3 and flash-attn-4 (and
    the points at or above each), points at or above cuDNN."""
    ratios_fa4, ratios_fa3, vs_cudnn = [], [], []
    for p in (p for p in results if p["label"] == "main"):
        r = p["results"]
        if "tflops" in r.get("fa4kernel", {}):
            if "tflops" in r.get("flash-attn-4", {}):
                ratios_fa4.append(r["fa4kernel"]["tflops"] / r["flash-attn-4"]["tflops"])
            if "tflops" in r.get(FA3, {}):
                ratios_fa3.append(r["fa4kernel"]["tflops"] / r[FA3]["tflops"])
            if "tflops" in r.get("sdpa-cudnn", {}):
                vs_cudnn.append(r["fa4kernel"]["tflops"] / r["sdpa-cudnn"]["tflops"])
    summary = {}
    if ratios_fa4:
        summary["geomean_fa4kernel_over_flash_attn_4"] = math.exp(sum(map(math.log, ratios_fa4)) / len(ratios_fa4))
    if ratios_fa3:
        summary["geomean_fa4kernel_over_flash_attn_3"] = math.exp(sum(map(math.log, ratios_fa3)) / len(ratios_fa3))
        summary["min_fa4kernel_over_flash_attn_3"] = min(ratios_fa3)
        summary["points_fa4kernel_ge_flash_attn_3"] = f"{sum(x >= 1.0 for x in ratios_fa3)}/{len(ratios_fa3)}"
    if ratios_fa4:
        summary["min_fa4kernel_over_flash_attn_4"] = min(ratios_fa4)
        summary["points_fa4kernel_ge_flash_attn_4"] = f"{sum(x >= 1.0 for x in ratios_fa4)}/{len(ratios_fa4)}"
    if vs_cudnn:
        summary["min_fa4kernel_over_cudnn"] = min(vs_cudnn)
        summary["points_fa4kernel_ge_cudnn"] = f"{sum(x >= 1.0 for x in vs_cudnn)}/{len(vs_cudnn)}"
    return summary

if __name__ == "__main__":
    main()
