"""The backward's power and clock, settled: its main kernel alone, launched back to back.

fa4sim's power model predicts the clock a kernel settles at when it runs on and on and the 700 W
cap holds it there. To measure that, each kernel here (fa4kernel's clock-probe build: the
backward's main kernel alone on one prepared input, fa4kernel.sm90.bwd.prepare_bwd, or the
forward as a control) is launched back to back with no host sync and no idle kernel between
launches, for LONG_WARM_S, then LONG_S more between two CUDA events. NVML is sampled every
SAMPLE_S in a thread; the power is the energy counter's least-squares slope over the timed
window (bench_power's method: over seconds it agrees with NVML's one-second averages). Recorded
per kernel: ms per launch, power, NVML's clock and clock-event reasons, and the in-kernel clock:
the mean over every timed launch from the probe's running sums (the backward: every CTA's
clock64 cycles over its globaltimer ns; the forward: CTA 0's).

One point runs with q = k = 0 (data "qk_zero"): S = 0, P one constant, and the S, dK and dQ GEMMs
multiply zeros. It shows how much the tensor core's power depends on its operands; fa4sim's
energies come from random operands (lab/tools/calibrate/bench_power.py).

Why the method matters: timed in short batches, each after an idle GPU-side sleep that lets the
host run ahead (bench_fwd_sm90.time_interleaved), a 1k-token backward idles a third of the time
and a long one still runs before the controller has settled, so NVML reads 570-670 W and the
kernel counts 1.70-1.80 GHz where, settled, it draws the cap at 1.45-1.67 GHz. Files recorded that
way (`rows` "call" and "main": bwd_power_h200_2026-11-27.json,
bwd_power_variants_h100_2026-11-27.json) still print with --report.

Usage (device): python3 lab/tools/bwd_power_sm90.py --out $OUT/bwd_power_long.json
Report (CPU):   python3 lab/tools/bwd_power_sm90.py --report lab/campaigns/backward-power/bwd_power_long_h200_2026-11-27.json
  prints, per kernel, fa4sim's power at the in-kernel clock beside the measured power, and the
  clock fa4sim predicts.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

KIND = "bwd_power"
# (pass, head dim, tokens per sequence, causal, backward knobs, data): batch x tokens = 16384,
# heads x head dim = 2048; knobs left out are the defaults. Two variants change one thing the power
# model counts: at hd256 the CTA pair's dQ through the SM-to-SM network (dq_sum "cta": none), at
# hd128 dQ's way out (dq_reduce "red": RED.ADD from registers, no fp32 dQ through shared memory)
LONG_POINTS = [("bwd", 64, 4096, False, {}, "randn"), ("bwd", 128, 1024, False, {}, "randn"),
               ("bwd", 128, 16384, False, {}, "randn"), ("bwd", 256, 16384, False, {}, "randn"),
               ("bwd", 128, 16384, False, {"dq_reduce": "red"}, "randn"),
               ("bwd", 256, 16384, False, {"dq_sum": "cta"}, "randn"),
               ("bwd", 128, 16384, False, {}, "qk_zero"),
               ("fwd", 128, 16384, False, {}, "randn"), ("fwd", 64, 4096, False, {}, "randn")]
LONG_WARM_S, LONG_S, SAMPLE_S = 2.0, 2.5, 0.005


class _Sampler:
    """NVML every SAMPLE_S in a thread: (host time, energy J, power W, SM MHz, clock-event reasons)."""

    def __init__(self, nvml):
        import threading

        self.nvml, self.rows, self._stop = nvml, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        import time

        while not self._stop.is_set():
            mj = self.nvml.energy_mj()
            self.rows.append((time.perf_counter(), None if mj is None else mj / 1e3, self.nvml.power_w(),
                              self.nvml.sm_mhz(), self.nvml.event_reasons()))
            time.sleep(SAMPLE_S)

    def stop(self):
        self._stop.set()
        self._thread.join()

    def window(self, t0, t1) -> dict:
        """Power over [t0, t1]: the least-squares slope of the energy counter on host time, the
        mean of the power readings, NVML's mean clock and how often each clock-event reason showed."""
        rows = [r for r in self.rows if t0 <= r[0] <= t1]
        e = [(t, j) for t, j, *_ in rows if j is not None]
        out = {"seconds": t1 - t0, "samples": len(rows)}
        if len(e) > 10:
            mt, mj = statistics.fmean(t for t, _ in e), statistics.fmean(j for _, j in e)
            out["power_w_energy_slope"] = (sum((t - mt) * (j - mj) for t, j in e)
                                           / sum((t - mt) ** 2 for t, _ in e))
        pw = [r[2] for r in rows if r[2]]
        mhz = [r[3] for r in rows if r[3]]
        if pw:
            out["power_w_samples"] = statistics.fmean(pw)
        if mhz:
            out["mhz_mean"], out["mhz_min"], out["mhz_max"] = statistics.fmean(mhz), min(mhz), max(mhz)
        reasons = {}
        for r in rows:
            if r[4] is not None:
                reasons[hex(r[4])] = reasons.get(hex(r[4]), 0) + 1
        out["clock_event_reasons"] = reasons
        out["temperature_c"] = self.nvml.temperature_c()
        return out


def long_point(sampler, pas, d, s, causal, knobs, data):
    """One kernel launched back to back for LONG_WARM_S + LONG_S without a host sync; its power
    over the last LONG_S (_Sampler.window) and its in-kernel clock over every timed launch (the
    probes' running sums)."""
    import time

    import torch

    import fa4kernel
    from lab.tools.bench_bwd_sm90 import bwd_flops, check_probe
    from lab.tools.bench_fwd_sm90 import Impls, flops
    from fa4kernel.sm90.bwd import prepare_bwd, probe_words
    from fa4kernel.trace import PROBE_SUM_WORDS, probe_sums

    b, h = 16384 // s, 2048 // d
    point = dict(pass_=pas, batch=b, seqlen=s, heads=h, hdim=d, causal=causal, knobs=dict(knobs), data=data)
    torch.manual_seed(777 + s + d)
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    if data == "qk_zero":
        q.zero_()
        k.zero_()
    if pas == "bwd":
        point["flops"] = bwd_flops(b, h, s, s, d, causal)
        point["check"] = check_probe(d, s, causal, **knobs)
        if not point["check"]["ok"]:
            point["error"] = "gradients off the fp32 reference; not timed"
            return point
        with torch.no_grad():
            out, lse = fa4kernel.attention(q, k, v, causal=causal, return_lse=True)
        cfg = fa4kernel.make_bwd_config("bfloat16", d, causal, **knobs)
        stamps = torch.zeros(probe_words(cfg, b, s, h), dtype=torch.int64, device="cuda")
        fn, _ = prepare_bwd(cfg, dout, q, k, v, out, lse, 1.0 / math.sqrt(d), stamps)

        def read():
            return probe_sums(stamps.tolist())["ghz"]  # every CTA of every launch since reset()
        read.reset = lambda: stamps[-PROBE_SUM_WORDS:].zero_()  # noqa: E731
    else:
        point["flops"] = flops(b, h, s, s, d, causal)
        fn, reader = Impls.ours_clock_probe(None, q, k, v, causal)

        def read():
            reader()  # the mean over every launch since reset()
            return reader.ghz[-1] if reader.ghz else None
        read.reset = reader.reset
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        fn()
    e1.record()
    torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / 10
    n_warm, n_meas = max(1, int(LONG_WARM_S * 1e3 / ms)), max(1, int(LONG_S * 1e3 / ms))
    for _ in range(n_warm):
        fn()  # the launch queue fills and then paces the host: the GPU never waits
    read.reset()  # queued: the probe's sums start here
    e0.record()
    for _ in range(n_meas):
        fn()
    e1.record()
    while not e1.query():  # the host returns from the launches with most of them still queued
        time.sleep(0.0005)
    t1 = time.perf_counter()
    elapsed_ms = e0.elapsed_time(e1)
    t0 = t1 - elapsed_ms / 1e3
    point["ms"] = elapsed_ms / n_meas
    point["launches"] = n_meas
    point["window"] = sampler.window(t0 + 0.05, t1)
    point["clock_ghz_in_kernel"] = read()
    w = point["window"]
    print(f"{pas} hd{d} s{s} {knobs or ''} {data}: {point['ms']:.3f} ms, "
          f"{point['flops'] / point['ms'] / 1e9:.0f} TFLOP/s, energy {w.get('power_w_energy_slope', 0):.0f} W, "
          f"samples {w.get('power_w_samples', 0):.0f} W, NVML {w.get('mhz_mean', 0):.0f} MHz, "
          f"kernel {point['clock_ghz_in_kernel'] or 0:.3f} GHz, reasons {w['clock_event_reasons']}", flush=True)
    del q, k, v, dout
    torch.cuda.empty_cache()
    return point


def measure_long(out_path):
    import torch

    from lab.tools.bench_fwd_sm90 import _version, nvidia_smi
    from lab.tools.nvml_clock import NvmlDevice
    from lab.tools.provenance import stamp

    sampler = _Sampler(NvmlDevice(torch.cuda.current_device()))
    meta = stamp(dict(
        kind=KIND, mode="long", device=torch.cuda.get_device_name(0),
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        clocks_before=nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu"),
        versions=dict(torch=torch.__version__, cuda=torch.version.cuda, cutlass_dsl=_version("nvidia-cutlass-dsl"),
                      python=platform.python_version()),
        method=(f"--long: each kernel (fa4kernel's clock-probe build: the backward's main kernel alone, or the "
                f"forward) launched back to back with no host sync for {LONG_WARM_S} s, then {LONG_S} s timed "
                f"between two CUDA events; NVML sampled every {SAMPLE_S * 1e3:.0f} ms in a thread; power = the "
                f"energy counter's least-squares slope over the timed window; in-kernel clock of the backward's last "
                f"launch, of every timed launch of the forward"),
    ), KIND)
    points = []
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    for pas, d, s, causal, knobs, data in LONG_POINTS:
        try:
            points.append(long_point(sampler, pas, d, s, causal, knobs, data))
        except Exception as e:  # keep the run going
            points.append(dict(pass_=pas, hdim=d, seqlen=s, causal=causal, knobs=knobs, data=data, error=repr(e)[:500]))
            print("error", points[-1], flush=True)
        with open(out_path, "w") as fh:
            json.dump(dict(meta=meta, points=points, complete=False), fh, indent=1)
    sampler.stop()
    meta["clocks_after"] = nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu")
    with open(out_path, "w") as fh:
        json.dump(dict(meta=meta, points=points, complete=True), fh, indent=1)
    print("wrote", out_path)


def report(path, hw=None):
    """Per point: the main kernel's NVML power and in-kernel clock against fa4sim's power at that
    clock (fa4kernel's default backward, `--pass bwd`) and the clock fa4sim predicts."""
    from fa4sim import Problem, simulate
    from fa4sim.validate.common import profile_for

    doc = json.load(open(path))
    hw = hw or profile_for(doc["meta"]["device"])
    if doc["meta"].get("mode") == "long":
        return report_long(doc, hw)
    print(f"{doc['meta']['device']} ({doc['meta']['date']}), profile {hw}: the main kernel alone against the whole call")
    print(f"{'point':24s} {'call W':>7s} {'main W':>7s} {'NVML MHz':>9s} {'GHz kern':>9s} {'model W':>8s} "
          f"{'error':>7s} {'GHz pred':>9s} {'error':>7s}")
    rows = []
    for p in doc["points"]:
        if "rows" not in p or "main" not in p["rows"]:
            continue
        main, call = p["rows"]["main"], p["rows"]["call"]
        f = main["clock_ghz_in_kernel"]
        problem = Problem(p["batch"], p["heads"], p["seqlen"], p["seqlen"], p["hdim"], p["causal"])
        knobs = p.get("knobs") or {}
        at = simulate(hw, None, problem, {**knobs, "clock_ghz": f}, "fa4kernel", "bwd")
        free = simulate(hw, None, problem, knobs or None, "fa4kernel", "bwd")
        w = main["nvml"].get("power_w_mean")
        name = f"hd{p['hdim']}-{p['seqlen']}" + ("-causal" if p["causal"] else "") + "".join(
            f" {k}={v}" for k, v in (p.get("knobs") or {}).items())
        rows.append((at.power_w / w - 1, free.clock_ghz / f - 1))
        print(f"{name:24s} {call['nvml'].get('power_w_mean', 0):7.0f} {w:7.0f} {main['nvml'].get('mhz_mean', 0):9.0f} "
              f"{f:9.3f} {at.power_w:8.0f} {100 * rows[-1][0]:+6.1f}% {free.clock_ghz:9.3f} {100 * rows[-1][1]:+6.1f}%")
    if rows:
        print(f"power at the in-kernel clock: median {100 * statistics.median(abs(r[0]) for r in rows):.1f} %; "
              f"predicted clock: median {100 * statistics.median(abs(r[1]) for r in rows):.1f} %, "
              f"max {100 * max(abs(r[1]) for r in rows):.1f} % over {len(rows)} points")


def report_long(doc, hw):
    """--long files: per kernel, the energy counter's power over its window against fa4sim's power
    at the in-kernel clock (the model assumes random operands: data "qk_zero" is listed, not scored)."""
    from fa4sim import Problem, hardware, power, simulate

    profile = hardware.load(hw)
    print(f"{doc['meta']['device']} ({doc['meta']['date']}), profile {hw}: {LONG_S} s windows, no host sync; the "
          f"model: the main kernel's own power at the in-kernel clock, and the clock it predicts for it")
    print(f"{'kernel':34s} {'TFLOP/s':>8s} {'energy W':>9s} {'samples W':>9s} {'NVML MHz':>9s} {'GHz kern':>9s} "
          f"{'model W':>8s} {'error':>7s} {'GHz pred':>9s} {'error':>7s}")
    rows = []
    for p in doc["points"]:
        if "window" not in p or not p.get("clock_ghz_in_kernel"):
            continue
        f, w = p["clock_ghz_in_kernel"], p["window"]
        problem = Problem(p["batch"], p["heads"], p["seqlen"], p["seqlen"], p["hdim"], p["causal"])
        knobs = p.get("knobs") or {}
        at = simulate(hw, None, problem, {**knobs, "clock_ghz": f}, "fa4kernel", p["pass_"])
        # launched alone, back to back: the main kernel's own power, and the clock it would hold
        main = at.main_activity if p["pass_"] == "bwd" else at.activity
        model_w = power.power_w(profile, main, f)[0]
        free = power.predict_clock(profile, main)
        watts = w.get("power_w_energy_slope") or w.get("power_w_samples")
        name = f"{p['pass_']} hd{p['hdim']}-{p['seqlen']}" + ("-causal" if p["causal"] else "") + "".join(
            f" {k}={v}" for k, v in knobs.items()) + ("" if p["data"] == "randn" else f" {p['data']}")
        err = (model_w / watts - 1, free.clock_ghz / f - 1)
        if p["data"] == "randn":
            rows.append(err)
        print(f"{name:34s} {p['flops'] / p['ms'] / 1e9:8.0f} {w.get('power_w_energy_slope', 0):9.0f} "
              f"{w.get('power_w_samples', 0):9.0f} {w.get('mhz_mean', 0):9.0f} {f:9.3f} {model_w:8.0f} "
              f"{100 * err[0]:+6.1f}% {free.clock_ghz:9.3f} {100 * err[1]:+6.1f}%")
    if rows:
        print(f"random inputs: power at the in-kernel clock median {100 * statistics.median(abs(r[0]) for r in rows):.1f} %; "
              f"predicted clock median {100 * statistics.median(abs(r[1]) for r in rows):.1f} %, "
              f"max {100 * max(abs(r[1]) for r in rows):.1f} % over {len(rows)} kernels")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="result JSON (device; written after every point)")
    ap.add_argument("--report", metavar="JSON", help="compare a recorded file with fa4sim (CPU)")
    ap.add_argument("--hw", default=None, help="fa4sim profile for --report (default: the file's device's)")
    args = ap.parse_args()
    if bool(args.out) == bool(args.report):
        ap.error("give exactly one of --out (measure on the GPU) or --report (compare a file with fa4sim)")
    if args.report:
        report(args.report, args.hw)
    else:
        from lab.tools.hopper import require_hopper

        require_hopper("bwd_power_sm90.py", "--report FILE compares a recorded file on the CPU")
        measure_long(args.out)


if __name__ == "__main__":
    main()
