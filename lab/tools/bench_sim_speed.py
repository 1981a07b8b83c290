"""Simulator speed (CPU): the whole-process wall time of `fa4sim run` (the main job, a backward, and
a spread of usual runs: both passes, every card, short and long, causal or not), of importing
fa4sim, of a 200-point sweep, and the CP-SAT time of `fa4sim solve`.

    python lab/tools/bench_sim_speed.py [--repeat 5] [--out lab/campaigns/sim-speed/sim_speed_cpu2_<YYYY-MM-DD>.json]

Targets, on an unloaded 2-core machine: every `fa4sim run`, forward or backward, at most 0.5 s for
the whole process (the main job: FA4 forward hd128, seqlen 32k, batch 1, 16 heads on B200; the
backward: fa4kernel's hd128 16k causal on H200; runs_max_median_s: the slowest of RUNS); a
200-point sweep under 60 s. Each time is the median of --repeat processes (the sweep: one). The
processes may write bytecode (.pyc), as a user's Python does, whatever PYTHONDONTWRITEBYTECODE says
here. The solver's time is
the one `fa4sim solve --json` reports (solve_wall_s: list scheduling and CP-SAT, not loading
OR-Tools nor replaying its schedule). startup_median_s, the interpreter starting and doing nothing,
tells how fast the machine was; one whose speed drifts (a shared or throttled VM) is best compared
with another tree measured in the same minute.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from lab.tools.provenance import stamp  # noqa: E402

CLI = [sys.executable, "-m", "fa4sim.cli"]
RUN = [*CLI, "run", "--hw", "b200", "--schedule", "fa4", "--hdim", "128", "--seqlen", "32768", "--batch", "1",
       "--heads", "16"]
BWD = [*CLI, "run", "--pass", "bwd", "--impl", "fa4kernel", "--hw", "h200", "--hdim", "128", "--seqlen", "16384",
       "--batch", "1", "--heads", "16", "--causal"]
IMPORT = [sys.executable, "-c", "import fa4sim.cli, fa4sim.model"]
STARTUP = [sys.executable, "-c", "pass"]  # the interpreter alone: how fast the machine is right now
SOLVE = [*CLI, "solve", "--hw", "b200", "--schedule", "fa4", "--json"]
# the usual runs: (pass, hw, impl or None, hdim, seqlen, causal), batch 1 x 16 heads
RUNS = [("fwd", "b200", None, 128, 32768, True), ("fwd", "b200", None, 64, 1024, False),
        ("fwd", "h100", None, 128, 16384, True), ("fwd", "h200", None, 64, 1024, False),
        ("fwd", "h200", "flash-attn-4", 256, 32768, True), ("fwd", "h100", "flash-attn-4", 192, 1024, False),
        ("bwd", "h100", None, 128, 32768, False), ("bwd", "h200", "flash-attn-4", 64, 1024, True),
        ("bwd", "h200", None, 256, 16384, True), ("bwd", "h200", None, 192, 4096, False),
        ("bwd", "b200", None, 128, 32768, True), ("bwd", "b200", None, 64, 1024, False),
        ("bwd", "h100", "flash-attn-4", 128, 32768, True)]
SWEEP_GRID = ["--grid", "seqlen=1024,2048,4096,8192,16384", "--grid", "exp_emulation=0,0.0625,0.125,0.1875,0.25",
              "--grid", "kv_stages=2,3,4,6", "--grid", "hdim=64,128"]  # 5 x 5 x 4 x 2 = 200 points


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_cmd(pass_, hw, impl, hdim, seqlen, causal):
    """The `fa4sim run` command line of one of RUNS."""
    return [*CLI, "run", "--pass", pass_, "--hw", hw, *(["--impl", impl] if impl else []), "--hdim", str(hdim),
            "--seqlen", str(seqlen), "--batch", "1", "--heads", "16", *(["--causal"] if causal else [])]


def timed(cmd, repeat):
    """Whole-process wall times of `repeat` runs, s; and the last run's stdout."""
    times, out = [], ""
    for _ in range(repeat):
        t = time.perf_counter()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=ENV).stdout
        times.append(time.perf_counter() - t)
    return times, out


def solver_times(repeat):
    """solve_wall_s of `repeat` runs of `fa4sim solve --json`, s."""
    return [json.loads(timed(SOLVE, 1)[1])["solve_wall_s"] for _ in range(repeat)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write the record here (lab/campaigns/sim-speed/sim_speed_cpu2_<date>.json)")
    ap.add_argument("--repeat", type=int, default=5, help="processes per timing (median); the sweep runs once")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat must be >= 1")
    timed(IMPORT, 1)  # a first process reads the files once, so the timed ones find them cached
    startup_times = timed(STARTUP, a.repeat)[0]
    import_times = timed(IMPORT, a.repeat)[0]
    run_times = timed(RUN, a.repeat)[0]
    bwd_times = timed(BWD, a.repeat)[0]
    runs = {" ".join(c[2:]): statistics.median(timed(c, a.repeat)[0]) for c in map(lambda r: run_cmd(*r), RUNS)}
    solve_times = solver_times(a.repeat)
    with tempfile.TemporaryDirectory() as d:
        sweep = [*CLI, "sweep", "--hw", "b200", "--batch", "1", "--heads", "16", *SWEEP_GRID,
                 "--out", os.path.join(d, "s"), "--no-progress"]
        sweep_times = timed(sweep, 1)[0]
    meta = stamp({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
                 "sim_speed")
    res = {"meta": meta, "repeat": a.repeat, "startup_median_s": statistics.median(startup_times),
           "import_cmd": " ".join(IMPORT[1:]), "import_wall_s": import_times,
           "import_median_s": statistics.median(import_times),
           "run_cmd": " ".join(RUN[2:]), "run_wall_s": run_times, "run_median_s": statistics.median(run_times),
           "bwd_cmd": " ".join(BWD[2:]), "bwd_wall_s": bwd_times, "bwd_median_s": statistics.median(bwd_times),
           "solve_cmd": " ".join(SOLVE[2:]), "solve_wall_s": solve_times,
           "runs_median_s": runs, "runs_max_median_s": max(runs.values()),
           "solve_median_s": statistics.median(solve_times),
           "sweep_points": 200, "sweep_wall_s": sweep_times[0]}
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
