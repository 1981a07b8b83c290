"""Run every calibration microbenchmark on the GPU and write the raw results as JSON.

    source .gpu/setup-device.sh; PYTHONUNBUFFERED=1 python3 lab/tools/calibrate/run_all.py --out R.json

Each benchmark runs in its own try block (an error is recorded, the rest still run) and the
JSON is rewritten after each one. Then: python3 -m lab.tools.calibrate.make_profile R.json ...
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback

if __package__ in (None, ""):  # run as a script path
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
    __package__ = "lab.tools.calibrate"

from . import bench_launch, bench_pipes, bench_smem, bench_sync, bench_tma, bench_wgmma  # noqa: E402
from .common import Device  # noqa: E402


def _smi(args):
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"error: {e}"


def meta(kind: str = "calibration"):
    """The run's device, clocks and versions, with the result kind and the kernel version
    (lab/tools/provenance.py)."""
    import importlib.metadata as md

    from lab.tools.provenance import stamp

    import torch

    p = torch.cuda.get_device_properties(0)
    q = ("name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.applications.graphics,"
         "clocks.default_applications.graphics,clocks.mem,power.draw,power.limit,temperature.gpu,memory.total")
    vals = _smi(["--query-gpu=" + q, "--format=csv,noheader"])
    smi = dict(zip(q.split(","), [v.strip() for v in vals.split(",")])) if "," in vals else {"raw": vals}

    def ver(name):
        try:
            return md.version(name)
        except Exception:  # noqa: BLE001
            return None

    return stamp({
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": p.name, "num_sms": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None), "total_memory": p.total_memory,
        "capability": f"{p.major}.{p.minor}",
        "nvidia_smi": smi, "driver": smi.get("driver_version"),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cutlass_dsl": ver("nvidia-cutlass-dsl"), "triton": ver("triton"), "python": sys.version.split()[0],
        "host": os.uname().nodename,
    }, kind)


BENCHES = [
    ("pipes", "bench_pipes.py", bench_pipes.run),
    ("smem", "bench_smem.py", bench_smem.run),
    ("sync", "bench_sync.py", bench_sync.run),
    ("wgmma", "bench_wgmma.py", bench_wgmma.run),
    ("launch", "bench_launch.py", bench_launch.run),
    ("clock", "bench_wgmma.py", bench_wgmma.clock_run),  # the long tensor load
    ("tma", "bench_tma.py", bench_tma.run),
]
# opt-in only (`--only contention`): never part of the default run
def _contention(dev):
    from . import bench_contention  # imported only when asked for

    return bench_contention.run(dev)


OPTIONAL = [
    ("contention", "bench_contention.py", _contention),
    ("wgmma_odd_n", "bench_wgmma.py", bench_wgmma.run_odd_n),  # wgmma at N = 80 ... 192
    ("wgmma_fences", "bench_wgmma.py", bench_wgmma.run_fences),  # a fence before every wgmma
]


def summary(res):
    lines = []
    b = res["benchmarks"]
    g = lambda *ks: _get(b, *ks)  # noqa: E731
    lines.append(f"device {res['meta']['device']}  driver {res['meta']['driver']}  {res['meta']['date_utc']}")
    for op in ("ffma", "ex2", "fmnmx", "f2fp"):
        lines.append(f"{op:6s} lanes/clk {g('pipes', op, 'lanes_per_clk')}  latency {g('pipes', op, 'latency_cycles')}")
    lines.append(f"smem B/clk {g('smem', 'bytes_per_clk')}  latency {g('smem', 'latency_cycles')}")
    for k in ("named_pingpong", "bar_sync_all", "mbarrier_pingpong_trywait", "mbarrier_pingpong_testwait"):
        lines.append(f"{k:28s} cycles/handoff {g('sync', k, 'cycles_per_handoff')}")
    for name, r in [*(b.get("wgmma") or {}).items(), *(b.get("wgmma_odd_n") or {}).items(),
                    *(b.get("wgmma_fences") or {}).items()]:
        if not isinstance(r, dict) or "throughput" not in r:
            continue
        thr = " ".join(f"{w}WG:{v['cycles_per_instr']:.1f}c/{v['flops_per_clk']:.0f}F"
                       + (f" (each WG {'/'.join(f'{c:.0f}' for c in v['per_wg_cycles_per_instr'])}c)"
                          if "per_wg_cycles_per_instr" in v else "") for w, v in r["throughput"].items())
        lat = " ".join(f"nk{k}:{v['issue_median']}/{v['complete_median']}" for k, v in (r.get("latency") or {}).items())
        lines.append(f"wgmma {name:8s} {thr} | issue/complete {lat}")
    t = b.get("tma") or {}
    for k, v in (t.get("latency") or {}).items():
        lines.append(f"tma {k:10s} hbm {v['hbm_median']} l2 {v['l2_median']}")
    lines.append(f"tma sm B/clk {g('tma', 'sm_l2', 'bytes_per_clk')}  chip L2 TB/s {g('tma', 'chip_l2', 'tbps')}  "
                 f"chip HBM TB/s {g('tma', 'chip_hbm', 'tbps')}  d2d {g('tma', 'd2d_copy_tbps')}")
    for r in t.get("latency_under_load") or []:
        lines.append(f"tma under load: {r['streamers']:3d} streaming, {r['bytes'] // 1024} KB probe median "
                     f"{r['probe_median']} cycles" + (f", HBM {r['streamer_tbps']:.2f} TB/s (busy {r['hbm_busy']:.2f})"
                                                     if r["streamers"] else ""))
    lines.append(f"launch {b.get('launch')}")
    if b.get("contention"):
        from . import bench_contention

        lines.append(bench_contention.summary(b["contention"]))
    c = b.get("clock") or {}
    lines.append(f"clock GHz median {c.get('clock_ghz_median')} (min {c.get('clock_ghz_min')}, max {c.get('clock_ghz_max')}) "
                 f"events {c.get('ghz_from_events')} TFLOP/s {c.get('tflops_events')}")
    return "\n".join(lines)


def _get(d, *ks):
    for k in ks:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return round(d, 3) if isinstance(d, float) else d


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(n for n, _, _ in BENCHES)
                    + " (default: all of these); opt-in, only when named: " + ",".join(n for n, _, _ in OPTIONAL))
    args = ap.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    dev = Device()
    res = {"meta": meta(), "scripts": {}, "benchmarks": {}, "seconds": {}, "errors": {}}
    print(json.dumps(res["meta"], indent=1), flush=True)
    for name, script, fn in BENCHES + OPTIONAL:
        if (only and name not in only) or (not only and name in {n for n, _, _ in OPTIONAL}):
            continue
        t0 = time.perf_counter()
        try:
            res["benchmarks"][name] = fn(dev)
        except Exception:  # noqa: BLE001
            res["errors"][name] = traceback.format_exc()
            print(f"[{name}] FAILED\n{res['errors'][name]}", flush=True)
        res["scripts"][name] = script
        res["seconds"][name] = round(time.perf_counter() - t0, 2)
        res["compile_seconds"] = {str(k): round(v, 2) for k, v in dev.compile_s.items()}
        print(f"[{name}] {res['seconds'][name]} s", flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    res["meta"]["nvidia_smi_after"] = _smi(["--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu",
                                            "--format=csv,noheader"])
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(summary(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
