"""HBM bytes per launch of fa4kernel's SM90 forward, counted by Nsight Compute: the check on the
traffic fa4sim's power model prices (kernel_model.traffic, `fa4sim run --json` kernel.hbm_gbytes).

Each problem's forward runs LAUNCHES times back to back under `ncu --cache-control none`, so L2
holds what the previous launch left, as in a timed loop; the first launch (compile, cold L2) is
dropped and the median of the others kept. Counters: dram__bytes_read.sum and
dram__bytes_write.sum (HBM), lts__t_bytes.sum (every byte through the L2 slices: SM loads and
stores, HBM fills and write-backs) and gpu__time_duration.sum (ncu serialises and replays, so
this time is not a timed loop's).

    python3 lab/tools/dram_bytes_sm90.py --out R.json     # GPU, ncu on PATH, ~30 s
    python3 lab/tools/dram_bytes_sm90.py --report R.json  # CPU: against fa4sim's HBM bytes
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# name -> (batch, heads, seqlen_q, seqlen_k, head_dim, causal)
PROBLEMS = {"hd128-1k-b16-h16": (16, 16, 1024, 1024, 128, False),
            "hd128-1k-b16-h16-causal": (16, 16, 1024, 1024, 128, True),
            "hd128-16k-b1-h16": (1, 16, 16384, 16384, 128, False),
            "hd128-q1k-k16k-b4-h16-causal": (4, 16, 1024, 16384, 128, True),
            "hd256-1k-b16-h8": (16, 8, 1024, 1024, 256, False),
            "hd64-1k-b16-h32": (16, 32, 1024, 1024, 64, False)}
LAUNCHES = 4
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum")
KERNEL = "FlashFwdSm90"  # in the CuTe DSL kernel's mangled name


def child(names: list[str]) -> None:
    """Under ncu: each problem's forward LAUNCHES times, fresh random inputs."""
    import torch

    import fa4kernel

    for name in names:
        b, h, sq, sk, d, causal = PROBLEMS[name]
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16)
        for _ in range(LAUNCHES):
            fa4kernel.attention(q, k, v, causal=causal)
        torch.cuda.synchronize()


def parse(text: str, names: list[str]) -> list[dict]:
    """ncu's --csv output -> one point per problem, its launches in order (LAUNCHES each)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("ncu output: no CSV header (\"ID\", ...) found")
    launches: dict[int, dict] = {}
    for row in csv.DictReader(lines[start:]):
        if KERNEL in row["Kernel Name"]:
            value = float(row["Metric Value"].replace(",", ""))
            launches.setdefault(int(row["ID"]), {})[row["Metric Name"]] = value
    ordered = [launches[i] for i in sorted(launches)]
    if len(ordered) != LAUNCHES * len(names):
        raise ValueError(f"ncu output: {len(ordered)} {KERNEL} launches, expected {LAUNCHES} x {len(names)}")
    points = []
    for j, name in enumerate(names):
        b, h, sq, sk, d, causal = PROBLEMS[name]
        runs = ordered[j * LAUNCHES:(j + 1) * LAUNCHES]
        kept = runs[1:]  # the first: compile and a cold L2
        points.append({"name": name, "batch": b, "heads": h, "seqlen_q": sq, "seqlen_k": sk, "hdim": d,
                       "causal": causal, "launches": runs,
                       "dram_bytes": statistics.median(r["dram__bytes_read.sum"] + r["dram__bytes_write.sum"]
                                                       for r in kept),
                       "dram_read_bytes": statistics.median(r["dram__bytes_read.sum"] for r in kept),
                       "dram_write_bytes": statistics.median(r["dram__bytes_write.sum"] for r in kept),
                       "l2_bytes": statistics.median(r["lts__t_bytes.sum"] for r in kept)})
    return points


def measure(names: list[str]) -> dict:
    from lab.tools.calibrate.run_all import meta

    ncu = shutil.which("ncu")
    if ncu is None:
        raise SystemExit("dram_bytes_sm90 --out: needs Nsight Compute's ncu on PATH")
    ver = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    cmd = [ncu, "--metrics", ",".join(METRICS), "--cache-control", "none", "--csv",
           sys.executable, os.path.abspath(__file__), "--child", ",".join(names)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        raise SystemExit(f"ncu failed (rc {run.returncode}): {run.stderr.strip().splitlines()[-1:]}")
    return {"meta": {**meta("dram_bytes"), "ncu": ver[-1] if ver else None},
            "method": f"ncu --cache-control none, {LAUNCHES} launches back to back per problem, the first dropped, "
                      f"median of the rest; HBM bytes = dram__bytes_read.sum + dram__bytes_write.sum",
            "points": parse(run.stdout, names)}


def compare(doc: dict) -> list[dict]:
    """Each point's measured HBM bytes against fa4sim's (fa4kernel on the device's profile)."""
    from fa4sim.model import simulate
    from fa4sim.params import Problem
    from fa4sim.validate.common import profile_for

    hw = profile_for(doc["meta"].get("device", ""))
    rows = []
    for p in doc["points"]:
        prob = Problem(p["batch"], p["heads"], p["seqlen_q"], p["seqlen_k"], p["hdim"], p["causal"], p["hdim"])
        r = simulate(hw, "fa3", prob, {}, impl="fa4kernel")
        rows.append({"name": p["name"], "measured_hbm_bytes": p["dram_bytes"], "model_hbm_bytes": r.kernel.hbm_bytes,
                     "error": r.kernel.hbm_bytes / p["dram_bytes"] - 1.0,
                     "inputs_and_output_bytes": 2 * (2 * p["batch"] * p["seqlen_q"] + 2 * p["batch"] * p["seqlen_k"])
                     * p["heads"] * p["hdim"]})
    return rows


def report(doc: dict) -> str:
    lines = [f"{doc['meta'].get('device')} ({doc['meta'].get('date_utc')}): HBM bytes per launch, ncu against fa4sim",
             f"{'problem':30s} {'q+k+v+o MB':>10s} {'ncu MB':>8s} {'model MB':>9s} {'error':>7s}"]
    for r in compare(doc):
        lines.append(f"{r['name']:30s} {r['inputs_and_output_bytes'] / 1e6:10.1f} {r['measured_hbm_bytes'] / 1e6:8.1f} "
                     f"{r['model_hbm_bytes'] / 1e6:9.1f} {r['error']:+7.1%}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="GPU: run under ncu and write the results JSON")
    ap.add_argument("--report", metavar="RESULTS.json", help="CPU: a results file against fa4sim's HBM bytes")
    ap.add_argument("--only", default="", help=f"comma-separated problems ({', '.join(PROBLEMS)})")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child.split(","))
        return 0
    names = [x for x in args.only.split(",") if x] or list(PROBLEMS)
    if set(names) - set(PROBLEMS):
        ap.error(f"--only: unknown problem(s) {', '.join(sorted(set(names) - set(PROBLEMS)))}; "
                 f"allowed: {', '.join(PROBLEMS)}")
    if args.report:
        with open(args.report) as f:
            print(report(json.load(f)))
        return 0
    if not args.out:
        ap.error("--out FILE.json (GPU) or --report FILE.json (CPU)")
    from lab.tools.hopper import require_hopper

    require_hopper("dram_bytes_sm90.py", "--report FILE compares a recorded file on the CPU")
    res = measure(names)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    try:
        print(report(res))
    except ImportError:  # the GPU machine may lack fa4sim's dependencies: the bytes alone
        for p in res["points"]:
            print(f"{p['name']:30s} HBM {p['dram_bytes'] / 1e6:8.1f} MB  L2 {p['l2_bytes'] / 1e6:9.1f} MB")
        print(f"against fa4sim: python3 lab/tools/dram_bytes_sm90.py --report {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
