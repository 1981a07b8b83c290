"""The backward's power and clock with its main kernel alone, against the whole backward call.

NVML's board power under `bench_bwd_sm90.py --sustained` averages the whole backward call: the
preprocess, the dQ accumulator's zeroing, the main kernel, the postprocess and any gaps between
calls. fa4sim's power model predicts the main kernel's own power. Here fa4kernel's clock-probe
build runs two ways at each point, each alone after 1 s back to back (the clock the 700 W cap
settles), then 15 timed batches of about 25 ms:

- `call`: the whole backward call (fa4kernel.attention_backward_probed on a recorded forward);
- `main`: the main kernel alone, launched again and again on one prepared input
  (fa4kernel.sm90.bwd.prepare_bwd), so NVML samples nothing else.

Each row records NVML's power, SM clock (mean, min, max) and clock-event reasons over its timed
batches, and the in-kernel clock of every batch's last launch (all CTAs' clock64 cycles over
their globaltimer ns).

Usage (device): python3 benchmarks/bwd_power_sm90.py --out $OUT/bwd_power.json
Report (CPU):   python3 benchmarks/bwd_power_sm90.py --report benchmarks/results/bwd_power_h100_DATE.json
  prints, per point, fa4sim's power for the main kernel at the in-kernel clock measured beside
  NVML's, and the clock fa4sim predicts.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KIND = "bwd_power"
# (head dim, tokens per sequence, causal[, backward knobs]): batch x tokens = 16384, heads x head
# dim = 2048; knobs left out are the defaults. The variants change one thing the power model
# counts: at hd256 the CTA pair's dQ through the SM-to-SM network (dq_sum "cta": none), at hd128
# dQ's way out (dq_reduce "red": RED.ADD from registers, no fp32 dQ through shared memory)
POINTS = [(64, 1024, False), (64, 4096, False), (64, 16384, False),
          (128, 1024, False), (128, 4096, False), (128, 16384, False), (128, 4096, True),
          (256, 1024, False), (256, 4096, False), (256, 16384, False)]
VARIANTS = [(256, 16384, False, {"dq_sum": "cta"}), (128, 16384, False, {"dq_reduce": "red"})]
WARM_MS, BATCH_MS, REPS = 1000.0, 25.0, 15


def measure_point(d, s, causal, knobs=None):
    import torch

    import fa4kernel
    import benchmarks.bench_fwd_sm90 as fwd_bench
    from benchmarks.bench_bwd_sm90 import bwd_flops, check_probe
    from fa4kernel.sm90.bwd import prepare_bwd, probe_words
    from fa4kernel.trace import ctas_clock_ghz

    b, h = 16384 // s, 2048 // d
    knobs = dict(knobs or {})
    point = dict(batch=b, seqlen=s, heads=h, hdim=d, causal=causal, knobs=knobs,
                 flops=bwd_flops(b, h, s, s, d, causal), check=check_probe(d, s, causal, **knobs), rows={})
    if not point["check"]["ok"]:
        point["error"] = "gradients off the fp32 reference; not timed"
        return point
    torch.manual_seed(4321 + s + d)
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    with torch.no_grad():
        out, lse = fa4kernel.attention(q, k, v, causal=causal, return_lse=True)
    cfg = fa4kernel.make_bwd_config("bfloat16", d, causal, **knobs)
    stamps = {n: torch.zeros(probe_words(cfg, b, s, h), dtype=torch.int64, device="cuda") for n in ("call", "main")}

    def call():
        fa4kernel.attention_backward_probed(dout, q, k, v, out, lse, causal=causal, stamps=stamps["call"], **knobs)

    main, _ = prepare_bwd(cfg, dout, q, k, v, out, lse, 1.0 / math.sqrt(d), stamps["main"])
    runs = {"call": call, "main": main}
    for fn in runs.values():
        fn()  # first call: JIT compiles
    torch.cuda.synchronize()
    for name, fn in runs.items():
        clocks = []
        med, lo, hi, _ = fwd_bench.time_interleaved(
            {name: fn}, reps=REPS, target_ms=BATCH_MS, warm_ms=WARM_MS,
            after_batch={name: lambda n=name: clocks.append(ctas_clock_ghz(stamps[n].tolist())["ghz"])})[name]
        ghz = [c for c in clocks if c]
        point["rows"][name] = dict(ms=med, ms_min=lo, ms_max=hi, nvml=fwd_bench.last_nvml(name),
                                   clock_ghz_in_kernel_batches=ghz,
                                   clock_ghz_in_kernel=statistics.median(ghz) if ghz else None)
    m = point["rows"]
    print(f"bwd hd{d} s{s} causal={int(causal)} {knobs or ''}: " + "  ".join(
        f"{n} {r['ms']:.3f} ms {r['nvml'].get('power_w_mean', 0):.0f} W nvml {r['nvml'].get('mhz_mean', 0):.0f} MHz "
        f"kernel {r['clock_ghz_in_kernel'] or 0:.3f} GHz" for n, r in m.items()), flush=True)
    del q, k, v, dout, out, lse
    torch.cuda.empty_cache()
    return point


def measure(out_path, variants_only=False):
    import torch

    import benchmarks.bench_fwd_sm90 as fwd_bench
    from benchmarks.bench_fwd_sm90 import _version, nvidia_smi
    from benchmarks.nvml_clock import ClockSampler
    from benchmarks.provenance import stamp

    fwd_bench.SAMPLER = ClockSampler(torch.cuda.current_device())
    meta = stamp(dict(
        kind=KIND, device=torch.cuda.get_device_name(0),
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        clocks_before=nvidia_smi("clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu"),
        versions=dict(torch=torch.__version__, cuda=torch.version.cuda, cutlass_dsl=_version("nvidia-cutlass-dsl"),
                      python=platform.python_version()),
        nvml=dict(ok=fwd_bench.SAMPLER.ok, error=fwd_bench.SAMPLER.error),
        method=__doc__.split("\n\n")[1].replace("\n", " "),
    ), KIND)
    points = []
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    for d, s, causal, *knobs in (VARIANTS if variants_only else POINTS + VARIANTS):
        try:
            points.append(measure_point(d, s, causal, *knobs))
        except Exception as e:  # keep the run going
            points.append(dict(hdim=d, seqlen=s, causal=causal, knobs=(knobs or [{}])[0], error=repr(e)[:500]))
        with open(out_path, "w") as fh:
            json.dump(dict(meta=meta, points=points, complete=False), fh, indent=1)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="result JSON (device; written after every point)")
    ap.add_argument("--report", metavar="JSON", help="compare a recorded file with fa4sim (CPU)")
    ap.add_argument("--hw", default=None, help="fa4sim profile for --report (default: the file's device's)")
    ap.add_argument("--variants-only", action="store_true", help="measure only the knob variants (VARIANTS)")
    args = ap.parse_args()
    if bool(args.out) == bool(args.report):
        ap.error("give exactly one of --out (measure on the GPU) or --report (compare a file with fa4sim)")
    if args.report:
        report(args.report, args.hw)
    else:
        measure(args.out, args.variants_only)


if __name__ == "__main__":
    main()
