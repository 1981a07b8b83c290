"""Simulator speed (CPU): the whole-process wall time of the main job and of a 200-point sweep.

    python benchmarks/bench_sim_speed.py [--out benchmarks/results/sim_speed_<host>_<date>.json]

Targets: one `fa4sim run` of FA4 forward hd128, seqlen 32k, batch 1, 16 heads on B200
under 1 s for the whole process; a 200-point sweep under 60 s, on a 2-core machine.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.provenance import stamp  # noqa: E402

RUN = [sys.executable, "-m", "fa4sim.cli", "run", "--hw", "b200", "--schedule", "fa4", "--hdim", "128",
       "--seqlen", "32768", "--batch", "1", "--heads", "16"]
SWEEP_GRID = ["--grid", "seqlen=1024,2048,4096,8192,16384", "--grid", "exp_emulation=0,0.0625,0.125,0.1875,0.25",
              "--grid", "kv_stages=2,3,4,6", "--grid", "hdim=64,128"]  # 5 x 5 x 4 x 2 = 200 points


def timed(cmd, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    run_times = timed(RUN, a.repeat)
    with tempfile.TemporaryDirectory() as d:
        sweep = [sys.executable, "-m", "fa4sim.cli", "sweep", "--hw", "b200", "--batch", "1", "--heads", "16",
                 *SWEEP_GRID, "--out", os.path.join(d, "s"), "--no-progress"]
        sweep_times = timed(sweep, 1)
    meta = stamp({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}, "sim_speed")
    res = {"meta": meta, "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "run_cmd": " ".join(RUN[2:]), "run_wall_s": run_times, "run_median_s": statistics.median(run_times),
           "sweep_points": 200, "sweep_wall_s": sweep_times[0]}
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
