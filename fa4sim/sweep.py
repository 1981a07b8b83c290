"""fa4sim sweep: a grid over problem sizes, schedule knobs and hardware parameters.

Points run in parallel worker processes with a progress bar; results go to PREFIX.csv and
PREFIX.json, and PREFIX.png plots TFLOP/s against the first grid dimension (one line per
combination of the others). A point whose combination is invalid (say, a tile that does not fit)
is kept with its error message instead of stopping the sweep.
"""
from __future__ import annotations

import csv
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from . import hardware
from .errors import DeadlockError, InputError
from .params import Problem
from .schedules import SCHEDULES

PROBLEM_DIMS = {"seqlen": "seqlen_q", "seqlen_q": "seqlen_q", "seqlen_k": "seqlen_k", "hdim": "hdim", "hdim_v": "hdim_v",
                "batch": "batch", "heads": "heads", "causal": "causal"}


def parse_grid(items: list[str], schedule: str) -> list[tuple[str, list[str]]]:
    knobs = {k.name for k in SCHEDULES[schedule].KNOBS}
    grid = []
    for item in items:
        if "=" not in item:
            raise InputError("--grid", f"expected NAME=V1,V2,..., got {item!r}")
        name, values = item.split("=", 1)
        name = name.strip()
        if name not in PROBLEM_DIMS and name not in knobs and name not in hardware.PARAMS and name not in ("hw", "impl"):
            raise InputError(name, f"unknown grid dimension; allowed: {', '.join(PROBLEM_DIMS)}, hw, impl, "
                                   f"schedule knobs ({', '.join(sorted(knobs))}) or hardware parameters")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not vals:
            raise InputError(name, "needs at least one value")
        grid.append((name, vals))
    if not grid:
        raise InputError("--grid", "give at least one --grid NAME=V1,V2,...")
    return grid


def _point(args):
    hw, schedule, impl, problem, overrides, point = args
    from .model import simulate
    prob = problem
    over = dict(overrides)
    for name, value in point.items():
        if name == "hw":
            hw = value
        elif name == "impl":
            impl = value
        elif name in PROBLEM_DIMS:
            field = PROBLEM_DIMS[name]
            if field == "causal":
                v = value.lower() in ("1", "true", "yes", "on")
            else:
                try:
                    v = int(value)
                except ValueError:
                    return {**point, "error": f"{name}: must be an integer, got {value!r}"}
            try:
                prob = replace(prob, **{field: v})
                if name in ("seqlen", "seqlen_q") and "seqlen_k" not in point and problem.seqlen_k == problem.seqlen_q:
                    prob = replace(prob, seqlen_k=v)
                if name == "hdim" and "hdim_v" not in point and problem.hdim_v == problem.hdim:
                    prob = replace(prob, hdim_v=v)
            except InputError as e:
                return {**point, "error": str(e)}
        else:
            over[name] = value
    try:
        r = simulate(hw, schedule, prob, over, impl=impl)
    except (InputError, DeadlockError) as e:
        return {**point, "error": str(e)}
    j = r.to_json()
    return {**point, "tflops": j["tflops"], "time_us": j["time_us"], "mma_utilization": j["mma_utilization"],
            "clock_ghz": j["clock_ghz"], "power_w": j["power_w"], "cycles_per_kv_block": j["steady_state_cycles_per_kv_block"], "bottleneck": j["bottleneck"], "error": ""}


def _progress(done: int, total: int, t0: float) -> None:
    width = 30
    fill = int(width * done / total)
    rate = done / max(time.time() - t0, 1e-9)
    eta = (total - done) / rate if rate else 0
    sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} points, {rate:.1f}/s, eta {eta:.0f}s ")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def run_points(hw: str, schedule: str, problem: Problem, overrides: dict, grid, jobs: int = 0, progress: bool = True,
               impl: str | None = None):
    names = [n for n, _ in grid]
    points = [dict(zip(names, combo)) for combo in itertools.product(*[v for _, v in grid])]
    tasks = [(hw, schedule, impl, problem, overrides, p) for p in points]
    jobs = jobs or os.cpu_count() or 1
    rows, t0 = [None] * len(tasks), time.time()
    if jobs == 1 or len(tasks) == 1:
        for i, t in enumerate(tasks):
            rows[i] = _point(t)
            if progress:
                _progress(i + 1, len(tasks), t0)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_point, t): i for i, t in enumerate(tasks)}
            from concurrent.futures import as_completed
            for n, f in enumerate(as_completed(futures), 1):
                rows[futures[f]] = f.result()
                if progress:
                    _progress(n, len(tasks), t0)
    return rows


def plot(rows, grid, path: str, title: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_name = grid[0][0]
    others = [n for n, _ in grid[1:]]
    fig, ax = plt.subplots(figsize=(8, 5))
    groups: dict[tuple, list] = {}
    for r in rows:
        if r.get("error"):
            continue
        groups.setdefault(tuple(r[o] for o in others), []).append(r)
    for key, rs in groups.items():
        xs = [r[x_name] for r in rs]
        try:
            xs_num = [float(x) for x in xs]
        except ValueError:
            xs_num = list(range(len(xs)))
            ax.set_xticks(xs_num, xs)
        label = ", ".join(f"{o}={v}" for o, v in zip(others, key)) or None
        ax.plot(xs_num, [r["tflops"] for r in rs], marker="o", label=label)
    ax.set_xlabel(x_name)
    ax.set_ylabel("predicted TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if others:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_sweep(a, schedule: str, problem: Problem, overrides: dict) -> int:
    grid = parse_grid(a.grid, schedule)
    rows = run_points(a.hw, schedule, problem, overrides, grid, a.jobs, not a.no_progress, impl=a.impl)
    prefix = a.out
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    fields = [n for n, _ in grid] + ["tflops", "time_us", "mma_utilization", "clock_ghz", "power_w",
                                     "cycles_per_kv_block", "bottleneck", "error"]
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(prefix + ".json", "w") as f:
        json.dump({"hw": a.hw, "schedule": schedule, "impl": a.impl, "problem": vars(problem), "set": overrides,
                   "grid": dict(grid), "points": rows}, f, indent=1)
    plot(rows, grid, prefix + ".png", f"{schedule} on {a.hw}")
    bad = sum(1 for r in rows if r.get("error"))
    print(f"{len(rows)} points ({bad} invalid) -> {prefix}.csv, {prefix}.json, {prefix}.png")
    return 0
