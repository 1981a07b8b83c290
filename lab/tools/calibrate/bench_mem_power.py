"""Power and clock under sustained memory-path loads: the energy per byte of the backward's dQ paths.

fa4kernel's SM90 backward leaves dQ by one of three paths: a TMA bulk reduce-add of an fp32 tile
from shared memory into L2 (the default `bulk` build), RED.ADD.F32x2 from registers
(`dq_reduce=red`), and, with the CTA pair (`dq_sum=pair`), half of it over the SM-to-SM network
into the peer's shared memory first. This benchmark measures each path alone, kept busy on every
SM for seconds, so that fit_mem_power.py can price a byte of each (fa4sim/power.py's l2_reduce,
red and dsmem) beside bench_power's unit loads; a reduce-added byte costs about 2.5 times a
loaded one (lab/findings/power-backward.md, "The backward's power"). No attention kernel runs
here.

The loads reuse the kernels that measured these paths' rates (bench_bwd_units.py, bench_dsmem.py):
  bulk_reduce  make_bulk, mode 1: thread 0 of each CTA (one per SM) adds its 32 KB fp32 smem buffer
               into global memory by cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32
               (SASS UBLKRED), again and again, 2 in flight, into 128 KB of its own (17 MB in all:
               L2-resident), as bench_bwd_units' all_sms_disjoint_32KB.
  red          make_red(2): 256 threads per CTA, one CTA per SM, red.global.add.v2.f32 (SASS
               REDG.E.ADD.F32x2) from registers into 128 KB of its own (L2-resident).
  dsmem        bench_dsmem.make: clusters of 2 CTAs on every SM (120 KB of shared memory each: one
               per SM), each of 128 threads st.asyncs 64 KB per round (SASS STAS) into its peer's
               shared memory; a cluster barrier between rounds.
  tma_l2       make_bulk, mode 3 (the control): warp 1 of each CTA streams 16 KB bulk copies
               (SASS UBLKCP) from a shared, L2-resident 1 MB into shared memory, 4 in flight: the
               same kernel as bulk_reduce, loading instead of adding.
Every kernel stamps clock64 and %globaltimer around its loop per CTA, so its bytes per SM clock
are counted, not assumed. Every byte moved is pseudo-random (sign and mantissa; the kernels'
random_data builds, torch.randn sources and targets): moving constants draws far less (the same
loads with constant data, mem_power_const_*.json: 7-48 % less board power above idle, the TMA
loads the most), and the backward moves random-looking data.

Each load runs as back-to-back ~25 ms launches: 2 s for the clock and power to settle, then a
~2.5 s measured window whose power is the slope of NVML's energy counter (bench_power._window: the
mean of NVML's power samples, its clock and clock-event reasons beside it), whose clock is the sum
of the CTAs' clock64 over the sum of their globaltimer, and whose activity is the bytes moved over
the launches' mean CTA window in cycles (chip-wide bytes per SM clock, as bench_power's loads).
The bytes go to fit_power's keys (smem_bytes, l2_bytes) and to the three fit_mem_power.py prices:
l2_reduce_bytes, red_bytes, dsmem_bytes.

    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_mem_power --check-sass   # CPU, ~5 s
    source .gpu/setup-device.sh; python3 lab/tools/calibrate/bench_mem_power.py --out M.json   # GPU, ~40 s
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Callable

if __package__ in (None, ""):  # run as a script path
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
    __package__ = "lab.tools.calibrate"

from cutlass import Int32  # noqa: E402

from . import bench_bwd_units as bu  # noqa: E402
from . import bench_dsmem as ds  # noqa: E402
from .bench_power import LAUNCH_MS, MEASURE_S, SMEM_FLOOR, WARM_S, _window, settle, supported_sm_clocks_mhz  # noqa: E402
from .common import only_loads, run_sass_checks  # noqa: E402

# chip-wide activity per SM clock: bench_power's keys, then the three paths fit_mem_power.py prices
ACTIVITY_KEYS = ("tensor_flops", "mufu_ops", "fma_lane_ops", "alu_lane_ops", "smem_bytes", "l2_bytes", "hbm_bytes",
                 "l2_reduce_bytes", "red_bytes", "dsmem_bytes")
# name -> (what, the activity keys its bytes count toward, why those)
LOADS = {
    "bulk_reduce": ("TMA bulk reduce-add (UBLKRED .add.f32) of 32 KB smem buffers into disjoint L2-resident "
                    "fp32 regions, every SM",
                    ("smem_bytes", "l2_reduce_bytes"), "its source read from shared memory; the add at the L2"),
    "red": ("RED.ADD.F32x2 from registers, 256 threads per SM, into disjoint L2-resident fp32 regions",
            ("red_bytes",), "from registers to the L2's adders: no shared memory"),
    "dsmem": ("st.async (STAS) of 64 KB rounds into the cluster peer's shared memory, pairs on every SM",
              ("smem_bytes", "dsmem_bytes"), "from registers over the SM-to-SM network into the peer's shared memory"),
    "tma_l2": ("bulk copies (UBLKCP) of 16 KB from a shared L2-resident 1 MB into shared memory, every SM "
               "(the control: bulk_reduce's kernel loading)",
               ("smem_bytes", "l2_bytes"), "read from the L2, written into shared memory"),
}
BULK_CHUNK = 32768           # bytes per reduce-add (flash-attn-4 hd256: 64 x 256 x 4 / 2)
REGION = 1 << 17             # bytes of its own per CTA, bulk_reduce and red (17 MB on 132 SMs)
DSMEM_CHUNK = ds.CHUNK_MAX   # bytes per round: the longest, so the round's barrier costs least
DSMEM_THREADS = 128          # the pair's sender is one warpgroup
INT32_MAX = (1 << 31) - 1    # the kernels' byte offsets are Int32: launches stay below it


# ----------------------------------------------------------------------------- activity
def mean_cta_cycles(cta_cycles) -> float:
    """Sum over launches of the mean CTA window in cycles (bench_power's mean_cta_cycles)."""
    return float(sum(sum(c) / len(c) for c in cta_cycles if c))


def activity_per_clk(totals: dict, cta_cycles) -> dict:
    """Chip-wide bytes (or ops) per SM clock of every ACTIVITY_KEYS key: totals (key -> the
    measured launches' bytes) over mean_cta_cycles(cta_cycles), cta_cycles[launch][cta]."""
    cyc = mean_cta_cycles(cta_cycles)
    return {k: (float(totals.get(k, 0.0)) / cyc if cyc > 0 else 0.0) for k in ACTIVITY_KEYS}


def clock_ghz(cta_cycles, cta_ns) -> float | None:
    """Sum of the CTAs' clock64 cycles over the sum of their globaltimer ns."""
    ns = sum(sum(n) for n in cta_ns)
    return sum(sum(c) for c in cta_cycles) / ns if ns > 0 else None


# ----------------------------------------------------------------------------- the loads' plans
@dataclass
class Plan:
    """How to launch one load and read its stamps: args(stamps, size) are the compiled call's
    arguments (torch tensors or Int32, no stream); parse(stamps of one launch, size) gives that
    launch's per-CTA cycles, per-CTA ns and bytes; size is the knob that sets a launch's length."""
    key: tuple
    build: Callable
    words: int
    size_name: str
    size0: int
    size_max: int
    args: Callable
    parse: Callable
    extra: dict = field(default_factory=dict)


def _cta_rows(rows):
    """(cycles, ns) of the CTAs that stamped a window."""
    rows = [r for r in rows if r[0] > 0 and r[1] > 0]
    return [r[0] for r in rows], [r[1] for r in rows]


def plans(torch, nsm: int, device: str = "cuda") -> dict:
    # random data everywhere: the energy of a byte depends on how its bits toggle
    dst = torch.randn(nsm * REGION // 4, dtype=torch.float32, device=device)
    src = torch.randn(1 << 21, dtype=torch.float32, device=device)  # the loads stay in its first 1 MB
    mask = REGION - 1

    def bulk_args(mode):
        def args(stamps, size):
            n, n_load = (size, 0) if mode == 1 else (1, size)
            return [dst, src, stamps, Int32(mode), Int32(n), Int32(BULK_CHUNK), Int32(REGION), Int32(0), Int32(mask),
                    Int32(n_load), Int32(nsm)]
        return args

    def bulk_parse(st, size):  # thread 0's t0, t1, g0, g1 per CTA
        cyc, ns = _cta_rows([(st[b * 4 + 1] - st[b * 4], st[b * 4 + 3] - st[b * 4 + 2]) for b in range(nsm)])
        return cyc, ns, len(cyc) * size * BULK_CHUNK

    def load_parse(st, size):  # warp 1's cycles, ns, bytes per CTA, after the reduce-adds' stamps
        o = 4 * bu.STAMP_CTAS
        cyc, ns = _cta_rows([(st[o + b * 4], st[o + b * 4 + 1]) for b in range(nsm)])
        return cyc, ns, sum(st[o + b * 4 + 2] for b in range(nsm) if st[o + b * 4] > 0)

    def red_parse(st, size):
        cyc, ns = _cta_rows([(st[b * 4 + 1] - st[b * 4], st[b * 4 + 3] - st[b * 4 + 2]) for b in range(nsm)])
        return cyc, ns, len(cyc) * size * bu.RED_UNROLL * bu.THREADS * 8

    ctas = 2 * (nsm // 2)

    def dsmem_parse(st, size):  # thread 0's cycles and ns of the timed rounds per CTA
        cyc, ns = _cta_rows([(st[4 * b], st[4 * b + 1]) for b in range(ctas)])
        return cyc, ns, len(cyc) * size * DSMEM_CHUNK

    return {
        # 2 in flight of 32 KB: ~2500 cycles per add at ~13 B/clk/SM; offsets i x chunk stay Int32
        "bulk_reduce": Plan(("mem_power", "bulk"), lambda: bu.make_bulk(True), bu.STAMPS, "adds_per_cta", 2000,
                            INT32_MAX // BULK_CHUNK - 2, bulk_args(1), bulk_parse,
                            {"chunk_bytes": BULK_CHUNK, "region_bytes_per_cta": REGION, "in_flight": bu.BULK_DEPTH,
                             "dst": dst}),
        # a trip: 8 x 256 threads x 8 bytes; offsets (trip x 8 + 7) x 256 x 8 stay Int32
        "red": Plan(("mem_power", "red"), lambda: bu.make_red(2, True), 4 * nsm, "trips_per_cta", 4000,
                    INT32_MAX // (bu.RED_UNROLL * bu.THREADS * 8) - 2,
                    lambda stamps, size: [dst, stamps, Int32(size), Int32(REGION), Int32(0), Int32(mask), Int32(nsm)],
                    red_parse, {"threads_per_cta": bu.THREADS, "region_bytes_per_cta": REGION, "dst": dst}),
        "dsmem": Plan(("mem_power", "dsmem"), lambda: ds.make(SMEM_FLOOR, True), 4 * ctas, "rounds", 1000, INT32_MAX,
                      lambda stamps, size: [stamps, Int32(DSMEM_CHUNK), Int32(size), Int32(ds.WARM), Int32(ctas),
                                            Int32(DSMEM_THREADS)],
                      dsmem_parse, {"chunk_bytes": DSMEM_CHUNK, "threads_per_cta": DSMEM_THREADS, "cluster": 2,
                                    "warm_rounds": ds.WARM}),
        # the same compiled kernel as bulk_reduce; offsets (bid x 7 + i + stages) x 16 KB stay Int32
        "tma_l2": Plan(("mem_power", "bulk"), lambda: bu.make_bulk(True), bu.STAMPS, "loads_per_cta", 16000,
                       INT32_MAX // bu.LOAD_BYTES - 7 * nsm - 2 * bu.LOAD_STAGES, bulk_args(3), load_parse,
                       {"load_bytes": bu.LOAD_BYTES, "in_flight": bu.LOAD_STAGES,
                        "region_bytes": bu.LOAD_MASK + 1}),
    }


# ----------------------------------------------------------------------------- CPU: SASS check
def sass_cases():
    """(name, build, {opcode: least count}) of every kernel a load runs, as it runs it."""
    yield ("bulk_reduce", lambda: (bu.make_bulk(True), bu.bulk_fake_args()), {"UBLKRED.G.S.ADD.F32": 1})
    yield ("red", lambda: (bu.make_red(2, True), bu.red_fake_args()), {"REDG.E.ADD.F32x2": bu.RED_UNROLL})
    yield ("dsmem", lambda: (ds.make(SMEM_FLOOR, True), ds.fake_args()), {"STAS": 1})
    yield ("tma_l2", lambda: (bu.make_bulk(True), bu.bulk_fake_args()), {"UBLKCP.S.G": bu.LOAD_STAGES})


def check_sass() -> int:
    return run_sass_checks(sass_cases(), width=12)


# ----------------------------------------------------------------------------- GPU
def sustain(dev, nvml, plan: Plan):
    """Size a launch to ~LAUNCH_MS, run WARM_S seconds of them, size again, then time ~MEASURE_S
    seconds of back-to-back launches (each its own stamps) under _window. Returns the size, the
    stamps of each measured launch, the window's GPU milliseconds and _window's readings."""
    import time

    torch = dev.torch
    probe = torch.zeros(plan.words, dtype=torch.int64, device="cuda")
    dev.call(plan.key, plan.build(), *plan.args(probe, plan.size0))  # compiles once per key
    fn = dev.cache[plan.key]

    def conv(args):
        return [dev.ct(a) if isinstance(a, torch.Tensor) else a for a in args]

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def sized(size):
        e0.record()
        fn(*conv(plan.args(probe, size)), dev.stream())
        e1.record()
        torch.cuda.synchronize()
        ms = max(e0.elapsed_time(e1), 1e-3)
        new = max(1, min(plan.size_max, int(size * LAUNCH_MS / ms)))
        return new, ms * new / size

    # the first size comes from a launch at the idle clock; the load sizes again once warm
    size, _ = sized(plan.size0)
    warm = conv(plan.args(probe, size))
    until = time.perf_counter() + WARM_S
    while time.perf_counter() < until:
        fn(*warm, dev.stream())
        torch.cuda.synchronize()
    size, launch_ms = sized(size)
    n_meas = max(2, int(MEASURE_S * 1e3 / launch_ms))
    stamps = torch.zeros(n_meas * plan.words, dtype=torch.int64, device="cuda")
    meas = [conv(plan.args(stamps[i * plan.words:(i + 1) * plan.words], size)) for i in range(n_meas)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for a in meas:
        fn(*a, dev.stream())
    end.record()
    w = _window(nvml, torch, start, end)
    return size, stamps.view(n_meas, plan.words).cpu().tolist(), start.elapsed_time(end), w


def measure(dev, nvml, name: str, plan: Plan) -> dict:
    what, keys, why = LOADS[name]
    if "dst" in plan.extra:  # the adds start from fresh random values each load (sums stay finite)
        plan.extra["dst"].normal_()
    size, st, gpu_ms, w = sustain(dev, nvml, plan)
    cycles, ns, total = [], [], 0
    for launch in st:
        c, n, b = plan.parse(launch, size)
        if not c:
            raise RuntimeError(f"{name}: a measured launch left no CTA stamps")
        cycles.append(c)
        ns.append(n)
        total += b
    act = activity_per_clk({k: total for k in keys}, cycles)
    # the CTAs' mean window against the launches' GPU time: ~1 when every CTA ran the whole launch
    busy = sum(sum(n) / len(n) for n in ns) / (gpu_ms * 1e6) if gpu_ms > 0 else None
    extra = {k: v for k, v in plan.extra.items() if k != "dst"}
    load = {"name": name, "what": what, "clock_ghz": clock_ghz(cycles, ns), **w, "activity_per_clk": act,
            "bytes_to": {k: why for k in keys}, "bytes_measured": total,
            "chip_bytes_per_ns": total / (gpu_ms * 1e6) if gpu_ms > 0 else None,
            "launches_measured": len(st), "launch_ms": gpu_ms / len(st), plan.size_name: size,
            "ctas_stamped_min": min(len(c) for c in cycles), "cta_busy_fraction": busy, **extra}
    return settle(load)


def run(only=(), out_path: str | None = None) -> dict:
    import json
    import time

    from lab.tools.nvml_clock import NvmlDevice

    from .common import Device
    from .run_all import meta

    dev = Device()
    torch = dev.torch
    nvml = NvmlDevice()
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    time.sleep(1.0)
    idle = {"power_w": nvml.power_w(), "sm_mhz": nvml.sm_mhz(), "temperature_c": nvml.temperature_c()}
    out = {"meta": {**meta("mem_power"), "kind": "mem_power", "data": "random"},
           "gpu": {"power_limit_w": nvml.power_limit_w(), "clock_max_mhz": nvml.max_sm_mhz(),
                   "supported_clocks_mhz": supported_sm_clocks_mhz(), "idle_power_w": idle["power_w"],
                   "idle": idle, "num_sms": nsm},
           "method": f"each load: back-to-back ~{LAUNCH_MS:.0f} ms launches on every SM, {WARM_S} s to settle, then "
                     f"~{MEASURE_S} s measured: power = slope of NVML's energy counter against host time over the "
                     f"window; clock = sum of clock64 / sum of globaltimer over every CTA's stamped loop of the "
                     f"measured launches; activity = bytes moved / the launches' mean CTA window in cycles (chip-wide "
                     f"per SM clock), counted toward each key in the load's bytes_to",
           "loads": []}
    todo = plans(torch, nsm)
    for name in LOADS:
        if only and name not in only:
            continue
        t = time.perf_counter()
        try:
            r = measure(dev, nvml, name, todo[name])
        except Exception as e:  # noqa: BLE001 - one failed load must not lose the others
            out["loads"].append({"name": name, "error": repr(e)[:500]})
            print(f"  {name}: FAILED {e!r}"[:300], flush=True)
        else:
            out["loads"].append(r)
            a = r["activity_per_clk"]
            moved = " ".join(f"{k.replace('_bytes', '')} {a[k] / nsm:5.2f}" for k in LOADS[name][1])
            print(f"  {name:12s} clock {r['clock_ghz'] or 0:.3f} GHz (NVML {r['clock_ghz_nvml'] or 0:.3f})  power "
                  f"{r['power_w'] or 0:6.1f} W (samples {r['power_w_samples'] or 0:6.1f})  {r['temperature_c']} C  "
                  f"B/clk/SM: {moved}  chip {r['chip_bytes_per_ns'] or 0:6.0f} GB/s  CTAs busy "
                  f"{r['cta_busy_fraction'] or 0:.3f}  ({time.perf_counter() - t:.1f} s)", flush=True)
        if out_path:  # after every load: a timeout keeps what ran
            with open(out_path, "w") as f:
                json.dump(out, f, indent=1)
    return out


def _epilog() -> str:
    import textwrap

    lines = ["loads (--only takes a comma-separated subset; each ~5 s on the GPU):"]
    for name, (what, keys, why) in LOADS.items():
        lines += textwrap.wrap(what, 96, initial_indent=f"  {name:12s} ", subsequent_indent=" " * 15)
        lines += textwrap.wrap(f"bytes -> {', '.join(keys)} ({why})", 96, initial_indent=" " * 15,
                               subsequent_indent=" " * 15)
    lines += ["",
              "What for: fa4sim's power model (fa4sim/power.py) charges a reduce-add, bulk or RED, as L2 bytes",
              "only and the SM-to-SM network nothing; these loads give each dQ path of the backward its own",
              "energy per byte (lab/findings/power-backward.md, \"The backward's power\"). tma_l2 is the control:",
              "the same kernel as bulk_reduce, loading, whose L2 energy fit_power already fits from bench_power.",
              "",
              "The file has bench_power's shape (meta.kind \"mem_power\"): per load power_w, clock_ghz and",
              "activity_per_clk in chip-wide bytes per SM clock, with l2_reduce_bytes, red_bytes and dsmem_bytes",
              "beside fit_power's keys. fit_power reads meta.kind \"power\" alone: these loads enter the fit",
              "once it has energies for those keys."]
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import json
    import time

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=_epilog(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="results JSON (GPU run), rewritten after every load")
    ap.add_argument("--check-sass", action="store_true", help="CPU: compile every load's kernel for sm_90a and check "
                    "its SASS holds the instruction it loads with")
    ap.add_argument("--only", default="", help=f"GPU: comma-separated subset of the loads ({', '.join(LOADS)})")
    args = ap.parse_args(argv)
    only = only_loads(ap, args.only, LOADS)
    if args.check_sass:
        return check_sass()
    if not args.out:
        ap.error("--out FILE.json (GPU) or --check-sass (CPU)")
    t0 = time.perf_counter()
    res = run(only, args.out)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"[mem_power] {res['seconds']} s -> {args.out}", flush=True)
    return 1 if any("error" in ld for ld in res["loads"]) else 0


if __name__ == "__main__":
    sys.exit(main())
