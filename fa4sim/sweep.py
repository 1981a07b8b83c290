"""fa4sim sweep: a grid over problem sizes, schedule knobs and hardware parameters.

Points run in parallel with a progress bar, on one of two backends (`map_points`): worker
processes on this machine (the default), or tasks on a Ray cluster (`--backend ray`). Results go
to PREFIX.csv and PREFIX.json, and PREFIX.png plots TFLOP/s against the first grid dimension (one
line per combination of the others).

Everything is checked before the first simulation: every value of every dimension as --set or
--seqlen takes it (a whole number for a size, a known profile or implementation, a knob's or a
hardware parameter's allowed values), a dimension given twice, the output folder, --jobs and the
Ray cluster; then every point is set up as simulate() sets it up (cheap beside simulating it). A bad
value, or a grid whose every point is invalid, is one line and exit 2. A point whose combination
alone is invalid (a head dim the implementation does not run, a tile that does not fit) is kept
with its error message and not simulated, instead of stopping the sweep. Ctrl-C stops it and writes
the points that finished (exit 130).
"""
from __future__ import annotations

import csv
import itertools
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from typing import Any, Callable, Sequence

from . import hardware, implementation
from .errors import DeadlockError, InputError
from .params import Problem, parse_bool
from .schedules import SCHEDULES

PROBLEM_DIMS = {"seqlen": "seqlen_q", "seqlen_q": "seqlen_q", "seqlen_k": "seqlen_k", "hdim": "hdim", "hdim_v": "hdim_v",
                "batch": "batch", "heads": "heads", "heads_kv": "heads_kv", "causal": "causal"}


def parse_grid(items: list[str], schedule: str, problem: Problem) -> list[tuple[str, list[str]]]:
    """--grid NAME=V1,V2,... items -> [(name, values)], every value checked on its own (with the
    rest of the problem as given) as the option or --set it stands for takes it."""
    knobs = {k.name: k for k in SCHEDULES[schedule].KNOBS}
    grid, fields = [], {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError("--grid", f"expected NAME=V1,V2,..., got {item!r}")
        if name not in PROBLEM_DIMS and name not in knobs and name not in hardware.PARAMS and name not in ("hw", "impl"):
            raise InputError(name, f"unknown grid dimension; allowed: {', '.join(PROBLEM_DIMS)}, hw, impl, "
                                   f"schedule knobs ({', '.join(sorted(knobs))}) or hardware parameters")
        field = PROBLEM_DIMS.get(name, name)  # seqlen and seqlen_q are one dimension
        if field in fields:
            same = "" if fields[field] == name else f" (as {fields[field]})"
            raise InputError(name, f"given twice in --grid{same}; give each dimension once")
        fields[field] = name
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not vals:
            raise InputError(name, "needs at least one value")
        twice = next((v for i, v in enumerate(vals) if v in vals[:i]), None)
        if twice is not None:
            raise InputError(name, f"{twice} given twice in --grid; give each value once")
        for v in vals:
            _check_value(name, v, schedule, knobs, problem)
        grid.append((name, vals))
    if not grid:
        raise InputError("--grid", "give at least one --grid NAME=V1,V2,...")
    return grid


def _check_value(name: str, value: str, schedule: str, knobs: dict, problem: Problem) -> None:
    if name == "hw":
        hardware.load(value)
    elif name == "impl":
        implementation.load(value, SCHEDULES[schedule].ARCH)  # as simulate loads it for this schedule
    elif name in PROBLEM_DIMS:
        _problem_at(problem, {name: value})
    elif name in knobs:
        knobs[name].parse(value)
    else:
        hardware.check_value(name, value, "--grid")


def _problem_at(problem: Problem, point: dict) -> Problem:
    """The problem at a point of the grid: its problem dimensions over the problem given (a seqlen
    sets seqlen_k too, an hdim hdim_v too, heads heads_kv too, where the problem has them equal and
    the grid does not sweep them itself)."""
    fields: dict = {}
    for name, value in point.items():
        if name not in PROBLEM_DIMS:
            continue
        field = PROBLEM_DIMS[name]
        if field == "causal":
            v = parse_bool(name, value)
        else:
            try:
                v = int(value)
            except ValueError:
                raise InputError(name, f"must be an integer, got {value!r}") from None
        fields[field] = v
    for field, pair, named in (("seqlen_q", "seqlen_k", "seqlen_k"), ("hdim", "hdim_v", "hdim_v"),
                               ("heads", "heads_kv", "heads_kv")):
        if field in fields and named not in point and getattr(problem, pair) == getattr(problem, field):
            fields.setdefault(pair, fields[field])
    return replace(problem, **fields) if fields else problem


def _point_args(hw, schedule: str, impl, problem: Problem, overrides: dict, point: dict):
    """What simulate() takes at a point: (hw, schedule, problem, overrides, impl)."""
    over = {**overrides, **{n: v for n, v in point.items() if n not in PROBLEM_DIMS and n not in ("hw", "impl")}}
    return point.get("hw", hw), schedule, _problem_at(problem, point), over, point.get("impl", impl)


def _point(args):
    from .model import simulate
    point = args[-1]
    try:
        r = simulate(*_point_args(*args))
    except (InputError, DeadlockError) as e:
        return {**point, "error": str(e)}
    j = r.to_json()
    return {**point, "tflops": j["tflops"], "time_us": j["time_us"], "mma_utilization": j["mma_utilization"],
            "clock_ghz": j["clock_ghz"], "power_w": j["power_w"], "cycles_per_kv_block": j["steady_state_cycles_per_kv_block"], "bottleneck": j["bottleneck"], "error": ""}


def _setup_error(args, profiles: dict) -> str:
    """Why simulate() would refuse this point as it sets it up, or '' (the point is run)."""
    from .model import setup
    hw, schedule, problem, over, impl = _point_args(*args)
    try:
        if hw not in profiles:
            profiles[hw] = hardware.load(hw)
        setup(profiles[hw], schedule, problem, over, impl)
    except InputError as e:
        return str(e)
    return ""


def _progress(done: int, total: int, t0: float, what: str = "points") -> None:
    width = 30
    fill = int(width * done / total)
    rate = done / max(time.time() - t0, 1e-9)
    eta = (total - done) / rate if rate else 0
    sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {what}, {rate:.1f}/s, eta {eta:.0f}s ")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


# ---- backends: run a worker over items in parallel, results in the items' order ----------------
# The worker must be a module-level function (both backends pickle it by name) and each item and
# result picklable. Any sweep (the grid here, solver x hardware x shape later) maps through this.

BACKENDS = ("process", "ray")
RAY_INSTALL = "needs Ray: `pip install ray` (or `pip install -e \".[cluster]\"`)"
MAX_JOBS = 1024  # worker processes (or a local Ray cluster's CPUs): more than any machine has cores
CONNECT_S = 3.0  # how long a Ray cluster's address may take to answer (a TCP connect, then gRPC's first frame)
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0"  # and an empty SETTINGS frame


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while map_points ran: `results` has what finished, None for the items that did not."""

    def __init__(self, results: list):
        super().__init__()
        self.results = results


def _ignore_sigint() -> None:
    """A worker process leaves Ctrl-C to the driver, which stops the pool (no traceback per worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _map_process(worker, items, jobs, done) -> list:
    results = [None] * len(items)
    if jobs == 1 or len(items) == 1:  # no pool to start: in this process, in order
        try:
            for n, item in enumerate(items):
                results[n] = worker(item)
                done(n + 1)
        except KeyboardInterrupt:
            raise Interrupted(results) from None
        return results
    pool = None
    try:  # from the pool's start: a Ctrl-C while the workers start stops them too
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)), initializer=_ignore_sigint)
        futures = {pool.submit(worker, item): i for i, item in enumerate(items)}
        for n, f in enumerate(as_completed(futures), 1):
            results[futures[f]] = f.result()
            done(n)
    except KeyboardInterrupt:
        # the points running now are dropped: stop their workers (public only from Python 3.14 on),
        # taken before shutdown, which forgets them (it would leave them running to the end)
        if pool is not None:
            workers = list((pool._processes or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in workers:
                process.terminate()
        raise Interrupted(results) from None
    except BaseException:  # a point's error: the running ones end, the rest never start
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        raise
    pool.shutdown()
    return results


def _import_ray():
    try:
        import ray
    except ImportError:
        raise InputError("--backend ray", RAY_INSTALL) from None
    return ray


def _check_reachable(address: str, param: str) -> None:
    """Fail fast on an address that is malformed or that nothing answers (ray.init would retry
    for a minute, printing its connection errors): HOST:PORT, ray://HOST:PORT, or auto."""
    if address == "auto":
        return  # ray.init finds the cluster `ray start` left on this machine and says itself if there is none
    scheme, _, hostport = address.rpartition("://")
    host, sep, port = hostport.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 address: [::1]:6379
    if scheme not in ("", "ray") or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(param, f"expected HOST:PORT, ray://HOST:PORT or auto, got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_S) as s:
            if os.environ.get("RAY_USE_TLS") in (None, "", "0"):  # TLS answers nothing to a bare preface
                # Ray's GCS and client server speak gRPC: an HTTP/2 server answers the client preface with
                # its SETTINGS frame at once, what is not one (another service on the port) does not
                s.sendall(HTTP2_PREFACE)
                frame = s.recv(9)
                if len(frame) < 9 or frame[3] != 0x04:
                    raise InputError(param, f"what answers at {address} is not a Ray cluster (no gRPC); give the "
                                            f"head node's GCS address (`ray start --head` prints it)")
    except OSError as e:
        raise InputError(param, f"no Ray cluster answers at {address} ({e.strerror or e}); start one with "
                                f"`ray start --head`, or leave out the address for a local cluster") from None


def _ray_address(ray_address: str | None) -> tuple[str | None, str]:
    """(the cluster's address, None for a local cluster; the option or variable that gave it)."""
    if ray_address is not None:
        return ray_address, "--ray-address"
    return os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS"


def check_backend(backend: str, jobs: int | None, ray_address: str | None) -> None:
    """The backend, the worker count and the Ray cluster's address: checked before any work."""
    if backend not in BACKENDS:
        raise InputError("--backend", f"{backend!r}; allowed: {', '.join(BACKENDS)}")
    if ray_address is not None and backend != "ray":
        raise InputError("--ray-address", "needs --backend ray")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS):
        raise InputError("--jobs", f"must be in 1..{MAX_JOBS} (default: one per core), got {jobs!r}")
    address, param = _ray_address(ray_address)
    if backend == "ray" and address is not None:
        _check_reachable(address, param)


def _ray_init(ray, address: str | None, param: str, jobs: int | None) -> None:
    """Connect to the cluster at `address` (given by `param`) or start a local one with `jobs` CPUs (None: all)."""
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False)
    if not address:  # "local": always a new cluster, never one that `ray start` left running here
        ray.init(address="local", num_cpus=jobs or os.cpu_count() or 1, include_dashboard=False, **quiet)
        return
    import fa4sim
    # Ray's C++ client writes each failed attempt to fd 2 (some 20 lines before it gives up): kept
    # aside, and read for the reason when it does
    with tempfile.TemporaryFile("w+") as said:
        sys.stderr.flush()
        fd2 = os.dup(2)
        os.dup2(said.fileno(), 2)
        try:
            # ship this fa4sim to the workers, so every node simulates with the driver's code and profiles
            ray.init(address=address, runtime_env={"py_modules": [fa4sim]}, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as e:
            said.seek(0)
            if "InvalidAuthToken" in said.read():
                hint = " (the cluster uses token authentication: set RAY_AUTH_MODE=token and its token)"
            else:
                hint = "" if os.environ.get("RAY_AUTH_MODE") else " (a cluster with token authentication needs RAY_AUTH_MODE=token)"
            raise InputError(param, f"cannot connect to the Ray cluster at {address}: {str(e).splitlines()[0]}{hint}") from None
        finally:
            os.dup2(fd2, 2)
            os.close(fd2)


def _map_ray(worker, items, jobs, done, address=None) -> list:
    address, param = _ray_address(address)
    ray = _import_ray()
    started = not ray.is_initialized()  # a caller's own ray.init is used as it is and left running
    if started:
        _ray_init(ray, address, param, jobs)
    results = [None] * len(items)
    try:
        done(0)
        task = ray.remote(num_cpus=1)(worker)
        index = {task.remote(item): i for i, item in enumerate(items)}
        pending, n = list(index), 0
        while pending:
            # whatever finished within 0.2 s: one call per progress step, not one per task
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
            for ref, value in zip(ready, ray.get(ready)):
                results[index[ref]] = value
                n += 1
                done(n)
        return results
    except KeyboardInterrupt:
        raise Interrupted(results) from None
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ImportError):  # a node without fa4lab's dependencies
            raise InputError("--backend ray", f"a Ray worker cannot import {getattr(e.cause, 'name', '') or e.cause}: "
                                              f"install simpy and numpy on every node") from None
        raise
    finally:
        if started:
            ray.shutdown()


def map_points(worker: Callable[[Any], Any], items: Sequence, backend: str = "process", jobs: int | None = None,
               progress: bool = True, ray_address: str | None = None, what: str = "points") -> list:
    """[worker(item) for item in items], run in parallel; the results keep the items' order.

    backend "process": a pool of `jobs` worker processes on this machine (None: one per core; 1: in
    this process). backend "ray": one Ray task per item, on the cluster at `ray_address` (or
    RAY_ADDRESS), else on a local cluster of `jobs` CPUs started here and shut down after.
    Both give the same results; `progress` draws a bar on stderr as items complete (counting `what`). Ctrl-C
    raises Interrupted with the results that finished.
    """
    check_backend(backend, jobs, ray_address)
    items, t0 = list(items), [time.time()]

    def done(n: int) -> None:
        """n items finished; done(0): the workers are up, the rate counts from now (a Ray start takes seconds)."""
        if n == 0:
            t0[0] = time.time()
        elif progress:
            _progress(n, len(items), t0[0], what)

    if not items:
        return []
    try:
        if backend == "ray":
            return _map_ray(worker, items, jobs, done, ray_address)
        return _map_process(worker, items, jobs or os.cpu_count() or 1, done)
    except Interrupted:
        if progress:
            sys.stderr.write("\n")  # end the bar's line
        raise


def run_points(hw: str, schedule: str, problem: Problem, overrides: dict, grid, jobs: int | None = None,
               progress: bool = True, impl: str | None = None, backend: str = "process",
               ray_address: str | None = None) -> list[dict]:
    """A row per point of the grid, in its order: the simulation's results, or why the point is
    invalid. Every point is set up first: if none can run, one InputError says why the first cannot."""
    names = [n for n, _ in grid]
    points = [dict(zip(names, combo)) for combo in itertools.product(*[v for _, v in grid])]
    tasks = [(hw, schedule, impl, problem, overrides, p) for p in points]
    profiles: dict = {}
    rows = [{**p, "error": _setup_error(t, profiles)} for p, t in zip(points, tasks)]
    _all_invalid(rows, points)
    todo = [i for i, r in enumerate(rows) if not r["error"]]

    def fill(results: list) -> None:
        for i, r in zip(todo, results):
            rows[i] = r  # None: interrupted before it finished

    try:
        fill(map_points(_point, [tasks[i] for i in todo], backend, jobs, progress, ray_address))
    except Interrupted as e:
        fill(e.results)
        raise Interrupted(rows) from None
    _all_invalid(rows, points)  # refused only once simulating (too many tiles, a deadlock): no output either
    return rows


def _all_invalid(rows: list[dict], points: list[dict]) -> None:
    """A grid whose every point is invalid is an error: one line, why the first is."""
    if all(r["error"] for r in rows):
        first = ", ".join(f"{n}={v}" for n, v in points[0].items())
        raise InputError("--grid", f"every point is invalid; the first ({first}): {rows[0]['error']}")


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
    """The whole `fa4sim sweep` (its output prefix already checked): checks, points, CSV, JSON, plot."""
    backend, ray_address = getattr(a, "backend", "process"), getattr(a, "ray_address", None)
    check_backend(backend, a.jobs, ray_address)
    grid = parse_grid(a.grid, schedule, problem)
    try:
        rows = run_points(a.hw, schedule, problem, overrides, grid, a.jobs, not a.no_progress, impl=a.impl,
                          backend=backend, ray_address=ray_address)
    except Interrupted as e:
        done = [r for r in e.results if r is not None]
        _write(a.out, a, schedule, problem, overrides, grid, done)
        bad = sum(1 for r in done if r.get("error"))
        raise KeyboardInterrupt(f"{len(done)} of {len(e.results)} points finished ({bad} of them invalid), written "
                                f"to {a.out}.csv and {a.out}.json") from None
    _write(a.out, a, schedule, problem, overrides, grid, rows)
    plot(rows, grid, a.out + ".png", f"{schedule} on {a.hw}")
    bad = sum(1 for r in rows if r.get("error"))
    print(f"{len(rows)} points ({bad} invalid) -> {a.out}.csv, {a.out}.json, {a.out}.png")
    return 0


def _write(prefix: str, a, schedule: str, problem: Problem, overrides: dict, grid, rows: list[dict]) -> None:
    fields = [n for n, _ in grid] + ["tflops", "time_us", "mma_utilization", "clock_ghz", "power_w",
                                     "cycles_per_kv_block", "bottleneck", "error"]
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(prefix + ".json", "w") as f:
        json.dump({"hw": a.hw, "schedule": schedule, "impl": a.impl, "problem": vars(problem), "set": overrides,
                   "grid": dict(grid), "points": rows}, f, indent=1)
