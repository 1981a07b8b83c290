"""fa4sim sweep: a grid over problem sizes, schedule knobs and hardware parameters.

Points run in parallel with a progress bar, on one of two backends (`map_points`): worker
processes on this machine (the default), or tasks on a Ray cluster (`--backend ray`). Results go
to PREFIX.csv and PREFIX.json, and PREFIX.png plots TFLOP/s against the first grid dimension (one
line per combination of the others). A point whose combination is invalid (say, a tile that does
not fit) is kept with its error message instead of stopping the sweep.
"""
from __future__ import annotations

import csv
import itertools
import json
import logging
import os
import socket
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from typing import Any, Callable, Sequence

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


# ---- backends: run a worker over items in parallel, results in the items' order ----------------
# The worker must be a module-level function (both backends pickle it by name) and each item and
# result picklable. Any sweep (the grid here, solver x hardware x shape later) maps through this.

BACKENDS = ("process", "ray")
RAY_INSTALL = "needs Ray: `pip install ray` (or `pip install -e \".[cluster]\"`)"


def _map_process(worker, items, jobs, done) -> list:
    results = [None] * len(items)
    if jobs == 1 or len(items) == 1:  # no pool to start: in this process, in order
        for n, item in enumerate(items):
            results[n] = worker(item)
            done(n + 1)
        return results
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(worker, item): i for i, item in enumerate(items)}
        for n, f in enumerate(as_completed(futures), 1):
            results[futures[f]] = f.result()
            done(n)
    return results


def _import_ray():
    try:
        import ray
    except ImportError:
        raise InputError("--backend ray", RAY_INSTALL) from None
    return ray


def _check_reachable(address: str, param: str) -> None:
    """Fail fast on HOST:PORT (or ray://HOST:PORT) that nothing answers: ray.init would retry for minutes."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local": ray.init resolves them and says itself when there is no cluster
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as e:
        raise InputError(param, f"no Ray cluster answers at {address} ({e.strerror or e}); start one with "
                                f"`ray start --head`, or leave out the address for a local cluster") from None


def _ray_init(ray, address: str | None, param: str, jobs: int) -> None:
    """Connect to the cluster at `address` (given by `param`) or start a local one with `jobs` CPUs (0: all)."""
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False)
    if not address:  # "local": always a new cluster, never one that `ray start` left running here
        ray.init(address="local", num_cpus=jobs or os.cpu_count() or 1, include_dashboard=False, **quiet)
        return
    _check_reachable(address, param)
    import fa4sim
    try:
        # ship this fa4sim to the workers, so every node simulates with the driver's code and profiles
        ray.init(address=address, runtime_env={"py_modules": [fa4sim]}, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        hint = "" if os.environ.get("RAY_AUTH_MODE") else " (a cluster with token authentication needs RAY_AUTH_MODE=token)"
        raise InputError(param, f"cannot connect to the Ray cluster at {address}: {str(e).splitlines()[0]}{hint}") from None


def _map_ray(worker, items, jobs, done, address=None) -> list:
    ray = _import_ray()
    param = "--ray-address" if address else "RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS") or None
    started = not ray.is_initialized()  # a caller's own ray.init is used as it is and left running
    if started:
        _ray_init(ray, address, param, jobs)
    try:
        done(0)
        task = ray.remote(num_cpus=1)(worker)
        index = {task.remote(item): i for i, item in enumerate(items)}
        results, pending, n = [None] * len(items), list(index), 0
        while pending:
            # whatever finished within 0.2 s: one call per progress step, not one per task
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
            for ref, value in zip(ready, ray.get(ready)):
                results[index[ref]] = value
                n += 1
                done(n)
        return results
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ImportError):  # a node without fa4lab's dependencies
            raise InputError("--backend ray", f"a Ray worker cannot import {getattr(e.cause, 'name', '') or e.cause}: "
                                              f"install simpy and numpy on every node") from None
        raise
    finally:
        if started:
            ray.shutdown()


def map_points(worker: Callable[[Any], Any], items: Sequence, backend: str = "process", jobs: int = 0,
               progress: bool = True, ray_address: str | None = None) -> list:
    """[worker(item) for item in items], run in parallel; the results keep the items' order.

    backend "process": a pool of `jobs` worker processes on this machine (0: one per core; 1: in
    this process). backend "ray": one Ray task per item, on the cluster at `ray_address` (or
    RAY_ADDRESS), else on a local cluster of `jobs` CPUs started here and shut down after.
    Both give the same results; `progress` draws a bar on stderr as items complete.
    """
    if backend not in BACKENDS:
        raise InputError("--backend", f"{backend!r}; allowed: {', '.join(BACKENDS)}")
    if ray_address and backend != "ray":
        raise InputError("--ray-address", "needs --backend ray")
    items, t0 = list(items), [time.time()]

    def done(n: int) -> None:
        """n items finished; done(0): the workers are up, the rate counts from now (a Ray start takes seconds)."""
        if n == 0:
            t0[0] = time.time()
        elif progress:
            _progress(n, len(items), t0[0])

    if not items:
        return []
    if backend == "ray":
        return _map_ray(worker, items, jobs, done, ray_address)
    return _map_process(worker, items, jobs or os.cpu_count() or 1, done)


def run_points(hw: str, schedule: str, problem: Problem, overrides: dict, grid, jobs: int = 0, progress: bool = True,
               impl: str | None = None, backend: str = "process", ray_address: str | None = None):
    names = [n for n, _ in grid]
    points = [dict(zip(names, combo)) for combo in itertools.product(*[v for _, v in grid])]
    tasks = [(hw, schedule, impl, problem, overrides, p) for p in points]
    return map_points(_point, tasks, backend, jobs, progress, ray_address)


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
    rows = run_points(a.hw, schedule, problem, overrides, grid, a.jobs, not a.no_progress, impl=a.impl,
                      backend=getattr(a, "backend", "process"), ray_address=getattr(a, "ray_address", None))
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
