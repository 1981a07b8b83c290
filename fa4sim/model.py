"""Simulate one attention pass: hardware + schedule + problem -> time, TFLOP/s and why.

    from fa4sim import simulate, Problem
    r = simulate("b200", "fa4", Problem(batch=1, heads=16, seqlen_q=32768, seqlen_k=32768, hdim=128))
    print(r.tflops, r.bottleneck)

The hardware is a profile (hardware.py), the pipeline a schedule (schedules/), and the kernel's
own choices within it an implementation (implementation.py: fa4kernel, flash-attn-4).

Each distinct work shape (KV blocks, masked blocks) is simulated in detail for one CTA, with the
periodic steady state extrapolated (steady_state.py); the kernel model spreads the shapes over
the SMs. Causal problems have a shape per Q tile: shapes are simulated at a geometric ladder of
block counts and the others interpolated, which is exact past the loop's transient (T is affine
in the block count there) and close below it.

One path serves both passes: setup() resolves a Run, forward() or backward() gives the pass's
part (its launch, its power activity, its Result), and settle_clock() finds the clock the power
model holds that launch to (once, for both).
"""
from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

from . import hardware, implementation, power
from .engine import Trace, gc_paused
from .errors import InputError
from . import paged_kv, split_kv
from .kernel_model import (KernelTime, WorkUnit, cold_start_bytes, decoder_order, kernel_time,
                           kernel_time_tiles, launch_heads, sequence_order, varlen_units, work_units)
from .params import MAX_SEQLEN, MAX_TILES, Context, Problem, resolve
from .schedules import BWD_SCHEDULES, SCHEDULES, kernel_bwd
from .steady_state import CAP, Period, runs as new_runs, tile_times, window

LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, CAP)
PASSES = ("fwd", "bwd")
MASKED_SIM = 1  # backward: masked Q blocks simulated per shape (more add linearly)
BUILD_CLOCK_TOL = 0.005  # backward: a clock this close to a built one reuses its per-shape schedules


@dataclass
class Result:
    """One forward prediction (and what a backward's shares with it: BwdResult)."""
    hw: hardware.HardwareProfile
    schedule: str
    impl: implementation.Implementation
    problem: Problem
    knobs: dict
    tflops: float
    time_us: float
    cycles: float
    utilization: dict          # unit -> busy fraction in the steady state of the longest tile
    bottleneck: str
    interval: float | None     # steady-state cycles per KV block (one CTA)
    tensor_waits: dict         # cause -> fraction of the steady-state loop the tensor core idles
    kernel: KernelTime
    trace: Trace               # one CTA, one tile of the longest shape (simulated blocks)
    period: Period | None = None
    notes: list = field(default_factory=list)
    hbm_busy: float = 0.0      # HBM share the rest of the launch takes while a CTA loads its Q tile
    clock_ghz: float = 0.0     # the SM clock the time is computed at (= hw.clock_ghz)
    clock_source: str = "profile"  # "power model" | "--set" | "profile"
    power_w: float | None = None   # the power model's board power at that clock (None: no power model)
    power_by_part: dict = field(default_factory=dict)  # W by power.PARTS: static, clock, the units, the memory paths
    power_limited: bool = False    # the power cap sets the clock (below the maximum)
    clock_ceiling: bool = False    # the tensor core's clock ceiling sets it (clock_tensor_ghz), under the cap
    activity: object = None        # power.Activity: the launch's work per unit (a backward: the whole call's)
    combine_us: float = 0.0        # split-KV: the combine launch (partial O and LSE -> O), us; in time_us
    pass_: ClassVar[str] = "fwd"   # "fwd" | "bwd"

    @property
    def kv_read_gbps(self) -> float:
        """K and V of the whole problem (each byte once) over the time: GB/s of KV cache read."""
        return self.problem.kv_bytes / (self.time_us * 1e-6) / 1e9 if self.time_us else 0.0

    def to_json(self) -> dict:
        k = self.kernel
        return {
            "hw": self.hw.name, "arch": self.hw.arch, "schedule": self.schedule, "impl": self.impl.name,
            "problem": vars(self.problem), "knobs": self.knobs,
            "hw_params": {n: self.hw.values[n] for n in hardware.PARAMS},
            "tflops": round(self.tflops, 3), "time_us": round(self.time_us, 3),
            "cycles": round(self.cycles, 1), "clock_ghz": round(self.clock_ghz, 4),
            "clock_source": self.clock_source,
            "power_w": None if self.power_w is None else round(self.power_w, 1),
            "power_by_part": {k: round(v, 1) for k, v in self.power_by_part.items()},
            "power_limited": self.power_limited,
            "clock_ceiling": self.clock_ceiling,
            "peak_tflops": round(self.hw.peak_tflops, 1),
            "mma_utilization": round(self.tflops / self.hw.peak_tflops, 4),
            "utilization": {u: round(v, 4) for u, v in self.utilization.items()},
            "bottleneck": self.bottleneck,
            "steady_state_cycles_per_kv_block": None if self.interval is None else round(self.interval, 2),
            "tensor_idle": {c: round(v, 4) for c, v in self.tensor_waits.items()},
            "kernel": {"slots": k.slots, "work_units": k.units, "waves": round(k.waves, 3),
                       "tiles_on_slowest_slot": k.tiles_on_slowest, "jitter_cycles": round(k.jitter_cycles, 1),
                       "cold_start_us": round(k.cold_start_us, 3), "compute_us": round(k.compute_us, 3),
                       "l2_us": round(k.l2_us, 3), "hbm_us": round(k.hbm_us, 3),
                       "l2_gbytes": round(k.l2_bytes / 1e9, 4), "hbm_gbytes": round(k.hbm_bytes / 1e9, 4),
                       "limiter": k.limiter, "launch_gap_us": self.hw.launch_gap_us,
                       "hbm_busy": round(self.hbm_busy, 4)},
            **({"combine_us": round(self.combine_us, 3)} if self.combine_us else {}),
            "kv_read_gbps": round(self.kv_read_gbps, 1),
            "notes": self.notes,
        }


@dataclass
class BwdResult(Result):
    """One backward prediction: the preprocess, the main kernel and the postprocess launch
    (time_us = pre_us + main_us + post_us; its TFLOP/s count 2.5 x the forward's FLOPs)."""
    pre_us: float = 0.0            # the preprocess launch (dPsum, LSE, dQ accumulator zeroed), us
    post_us: float = 0.0           # the postprocess launch (dQ fp32 -> bf16), us
    main_us: float = 0.0           # the main kernel alone, us
    main_activity: object = None   # the main kernel alone (power.Activity; `activity` is the whole call's)
    pass_: ClassVar[str] = "bwd"

    def to_json(self) -> dict:
        return {**super().to_json(), "pass": "bwd", "pre_us": round(self.pre_us, 3),
                "main_us": round(self.main_us, 3), "post_us": round(self.post_us, 3)}


def split_overrides(module, impl, overrides: dict) -> tuple[dict, dict, dict]:
    """--set NAME=VALUE pairs -> (hardware parameters, schedule knobs, the implementation's
    measured constants). Values may be strings."""
    knob_names = {k.name for k in module.KNOBS}
    hw_over, knob_over, impl_over = {}, {}, {}
    for name, value in overrides.items():
        if name in knob_names:
            knob_over[name] = value
        elif name in hardware.PARAMS:
            hw_over[name] = hardware.check_value(name, value, "--set")
        elif name in impl.params and not isinstance(impl.params[name]["value"], list):
            impl_over[name] = impl.check_value(name, value, "--set")
        else:
            raise InputError(name, f"unknown parameter; schedule knobs: {', '.join(sorted(knob_names))}; "
                                   f"hardware: {', '.join(hardware.PARAMS)}; {impl.name}: "
                                   f"{', '.join(n for n, e in impl.params.items() if not isinstance(e['value'], list))}")
    return hw_over, knob_over, impl_over


@dataclass(frozen=True)
class Run:
    """What one prediction runs, as setup() resolves it."""
    profile: hardware.HardwareProfile   # with the what-ifs applied
    base: hardware.HardwareProfile      # as given, before them: its clock is the maximum a --set clock is taken from
    schedule: str
    module: object                      # the schedule module (schedules.SCHEDULES / BWD_SCHEDULES)
    impl: implementation.Implementation
    knobs: dict
    problem: Problem                    # what the kernel computes: the asked problem at its build's head dim
    pass_: str                          # "fwd" | "bwd"
    forced: bool                        # the clock is a what-if (--set clock_ghz), not the power model's
    asked: Problem | None = None        # the problem as asked, whose FLOPs count (None: the same as problem)

    @property
    def flops_problem(self) -> Problem:
        return self.asked or self.problem


@dataclass(frozen=True)
class Pass:
    """One pass's part of a prediction, as functions of the profile `at` (its clock); settle_clock
    finds the clock, the rest is the same for both passes."""
    start: hardware.HardwareProfile  # where the power model's clock search starts
    launch: Callable                 # (at, first) -> the launch's state on `at`; first: the search's first
    usage: Callable                  # (at, state) -> its power.Activity
    finish: Callable                 # (at, state) -> the Result without its clock fields


@gc_paused
def simulate(hw="b200", schedule: str | None = None, problem: Problem | None = None, overrides: dict | None = None,
             impl: str | implementation.Implementation | None = None, pass_: str = "fwd") -> Result | BwdResult:
    """Predict one forward pass (pass_ "fwd") or one backward pass ("bwd").
    `hw` is a profile name, a profile path or a HardwareProfile; `schedule` the pipeline
    (default: the one for the hardware's architecture); `impl` whose choices to simulate
    (fa4kernel, flash-attn-4; default: the schedule's DEFAULT_IMPL); `overrides` the what-ifs:
    schedule knobs and hardware parameters by name.

    The backward is the preprocess, the main kernel (one CTA, or CTA pair, per KV tile;
    schedules.BWD_SCHEDULES) and the postprocess; a varlen problem (Problem.varlen) runs where the
    implementation's backward has a varlen build (fa4kernel-sm90). Its TFLOP/s count 2.5 x the forward's FLOPs
    (flash-attn's convention) over the three launches; its clock is the power model's for the
    whole call's average power (result.activity; the main kernel's own: result.main_activity)."""
    run = resolve_run(hw, schedule, problem, overrides, impl, pass_)
    part = (forward if run.pass_ == "fwd" else backward)(run)
    at, state, act, clock, source = settle_clock(run, part)
    result = part.finish(at, state)
    result.clock_ghz, result.clock_source = at.clock_ghz, source
    result.power_w, result.power_by_part = clock.power_w, dict(clock.by_part)
    result.power_limited, result.clock_ceiling = bool(clock.limited), bool(clock.ceiling)
    result.activity = act
    result.bottleneck = _bottleneck(result)
    result.notes.append(_clock_note(result, run.profile, run.base.sources))
    if clock.note:
        result.notes.append(clock.note)
    return result


def settle_clock(run: Run, part: Pass):
    """(the profile at the clock the time is computed at, the launch's state there, its
    power.Activity, the power.ClockPrediction, the clock's source). With a power model the clock
    is its fixed point: the activity at `part.start` sets a first clock, then the launch at that
    clock, and once more if the clock still moved by more than 0.1 %. Else the profile's clock
    (or the --set one, with its power where the profile has a power model)."""
    profile = run.profile
    if power.has_model(profile) and not run.forced:
        if not 0 < profile.clock_min_ghz <= profile.clock_ghz:
            raise InputError("clock_min_ghz", f"{profile.clock_min_ghz} GHz; with a power model (power_cap_w > 0) "
                                              f"it must be > 0 and at most clock_ghz {profile.clock_ghz} GHz")
        state = part.launch(part.start, True)
        pred = power.predict_clock(profile, part.usage(part.start, state))
        for _ in range(2):
            at = _at(profile, pred.clock_ghz)
            state = part.launch(at, False)
            again = power.predict_clock(profile, part.usage(at, state))
            if abs(again.clock_ghz - pred.clock_ghz) <= 1e-3 * pred.clock_ghz:
                break
            pred = again
        act = part.usage(at, state)
        watts, parts = power.power_w(profile, act, at.clock_ghz)
        return at, state, act, power.ClockPrediction(at.clock_ghz, watts, parts, pred.limited, pred.note,
                                                     pred.ceiling), "power model"
    state = part.launch(profile, False)
    act = part.usage(profile, state)
    if power.has_model(profile):  # a forced clock on a profile with a power model: its power there
        watts, parts = power.power_w(profile, act, profile.clock_ghz, run.base.clock_ghz)
        clock = power.ClockPrediction(profile.clock_ghz, watts, parts, False)
    else:
        clock = power.ClockPrediction(profile.clock_ghz, None, {}, False)
    return profile, state, act, clock, "--set" if run.forced else "profile"


def forward(run: Run) -> Pass:
    """The forward's part: Q tiles (work units) over the SMs, each distinct shape simulated for
    one CTA; its state on a profile is (KernelTime, detailed, the Q loads' HBM share)."""
    profile, module, impl, knobs, problem = run.profile, run.module, run.impl, run.knobs, run.problem
    rows = module.rows_per_cta(knobs)
    two_cta = bool(knobs.get("two_cta", False))
    unit_rows = rows * (2 if two_cta else 1)
    tile_n = knobs["tile_n"]
    # packed GQA (knob pack_gqa): one tile holds the rows of every q head of a K/V head
    pack = problem.heads_per_kv if knobs.get("pack_gqa") else 1
    splits = int(knobs.get("num_splits", 1))
    # a varlen batch or split-KV: the launch's tiles differ by sequence or KV chunk; every unit
    # (each sequence's Q tiles and chunks) runs on every launch head of its sequence
    general = problem.is_varlen or splits > 1
    if general:
        units = varlen_units(problem, unit_rows, tile_n, pack, splits)
        n_hb = problem.heads // pack
    else:
        units = work_units(problem, unit_rows, tile_n, pack)
        n_hb = launch_heads(problem, pack)[0]
    if len(units) * n_hb > MAX_TILES:
        raise InputError("batch", f"{problem.batch} x {n_hb // problem.batch} heads x {len(units)} Q tiles = "
                                  f"{len(units) * n_hb} tiles; fa4sim simulates at most "
                                  f"{MAX_TILES} per launch (past a few waves TFLOP/s hardly change): lower --batch or --heads")

    # a CTA's own start-up (barrier init, descriptor prefetch, register reallocation, tile math)
    # before its first TMA: paid by every CTA, so once per SM when persistent, per tile if not
    ctx = Context(problem, profile, impl)
    prologue = float(impl.value("cta_prologue_cycles", ctx, knobs)) if "cta_prologue_cycles" in impl.params else 0.0
    combine_shape = split_kv.combine_shape(impl, ctx, knobs) if splits > 1 else None
    combine_pdl = split_kv.combine_pdl(impl, ctx, knobs) if splits > 1 else False
    # a tile's V rows past its sequence's keys, zeroed before its first S GEMM where the build
    # does so (fa4kernel's varlen and decode builds: the schedule's v_zero_cycles), cycles
    zero_cost = getattr(module, "v_zero_cycles", None)
    v_zero = functools.lru_cache(maxsize=None)(
        lambda rows: zero_cost(profile, problem, knobs, impl, rows) if zero_cost and rows else (0.0, 0.0))
    # a schedule may run a tile with fewer rows differently (fa3: idle warpgroups skip their work)
    unit_knobs = getattr(module, "unit_knobs", lambda k, rows: k)

    def variant(u: WorkUnit) -> int:
        """The rows that decide how a unit runs: all of them unless the schedule says otherwise."""
        return rows if not u.rows or unit_knobs(knobs, u.rows) is knobs else u.rows

    by_shape: dict[tuple[int, int], list[int]] = {}
    for u in units:
        by_shape.setdefault((u.masked, variant(u)), []).append(u.n_kv)

    # per-shape costs in cycles: the schedules do not depend on the clock, so one cache serves
    # every clock the power model tries (keyed by the Q loads' HBM share, which does)
    cache: dict[tuple, tuple] = {}
    persistent = bool(knobs.get("persistent", True))  # else one CTA per tile: no further-tile cost (T2)
    counted = general and knobs.get("tile_order") == "sequence"
    if counted:
        # the tiles as fa4kernel's varlen build counts them, sequence outermost:
        # fa4sim/kernel_model.sequence_order
        order = sequence_order(units, n_hb, problem.causal)
    elif general:  # the launch order of every (launch head, unit) tile: fa4sim/kernel_model.decoder_order
        lpt = problem.causal and knobs.get("tile_order", "lpt") != "index"
        order = decoder_order(units, n_hb, lpt, tile_n * (problem.hdim + problem.hdim_v) * 2, unit_rows, tile_n,
                              pack)
    runs = new_runs()
    per_trace: dict = {}  # _per_block's memo

    def launch(at, hbm_busy: float):
        """The launch on profile `at` (its clock) with the Q loads' HBM share hbm_busy."""

        def detailed(n: int, masked: int, unit_rows: int = rows):
            key = (hbm_busy, n, masked, unit_rows)
            if key not in cache:
                k = knobs if unit_rows == rows else unit_knobs(knobs, unit_rows)
                sched = module.build(profile, problem, k, n, masked, impl, hbm_busy)
                cache[key] = tile_times(sched, n, pair=persistent, run=runs)
            return cache[key]

        def cost_of(u: WorkUnit) -> tuple[float, float | None]:
            v = variant(u)
            ns = by_shape[(u.masked, v)]
            if len(set(ns)) <= 4:
                t1, extra = _further(*detailed(u.n_kv, u.masked, v)[:2])
            else:
                t1, extra = _interpolated(u, max(ns), lambda n, m: detailed(n, m, v))
            wait, work = v_zero(getattr(u, "zero_rows", 0))
            return t1 + prologue + wait + work, None if extra is None else extra + work

        if general:
            kt = kernel_time_tiles(problem, at, units, order, cost_of, tile_n, two_cta, persistent, unit_rows,
                                   problem.heads_per_kv // pack, split_kv.partial_bytes(problem, splits) if splits > 1 else 0.0)
        else:
            kt = kernel_time(problem, at, units, cost_of, tile_n, two_cta,
                             persistent=persistent, order=knobs.get("tile_order", "lpt"), rows=unit_rows, pack=pack)
        return kt, detailed

    def at_clock(at, first: bool):
        """(KernelTime, detailed, hbm_busy) on profile `at`; the clock search's first launch
        skips the HBM refinement."""
        kt, detailed = launch(at, 0.0)
        if not first and getattr(module, "Q_FROM_HBM", False):
            # Q loads share HBM with the rest of the launch: once more with the HBM share this
            # launch's bytes take of its time (one refinement; its own change is second order).
            # Skipped where even fully exposed the slower Q loads would add < 0.5 % (long
            # sequences: few tiles per SM), which keeps those predictions at one pass.
            busy = min(0.9, kt.hbm_us / max(kt.compute_us, 1e-9))
            q_load = rows * problem.hdim * 2 / profile.tma_bytes_per_clk
            if q_load * busy / (1.0 - busy) * kt.tiles_on_slowest > 0.005 * kt.cycles:
                kt, detailed = launch(at, busy)
                return kt, detailed, busy
        return kt, detailed, 0.0

    longest = max(units, key=lambda u: (u.n_kv, -u.masked))
    per_tile = n_hb * (2 if two_cta else 1)  # each unit runs on every (batch, head); a CTA pair on 2 SMs
    sm_blocks = sum(u.n_kv for u in units) * per_tile
    # a tile that runs with fewer rows (fa3: its idle warpgroups skip their work) does that much
    # less tensor and softmax work per block: each variant's work comes from its own trace
    by_variant: dict[int, list[WorkUnit]] = {}
    for u in units:
        by_variant.setdefault(variant(u), []).append(u)
    tensor_flops = sum(u.n_kv * variant(u) for u in units) * (unit_rows / rows) * n_hb \
        * 2.0 * tile_n * (problem.hdim + problem.hdim_v)

    def usage(at, state):
        """The launch's power.Activity on profile `at`: the work per block of each variant's longest
        unit, weighted by the blocks that variant runs."""
        kt, detailed, _ = state
        per_block: dict[str, float] = {}
        idle = 0.0
        for v, us in by_variant.items():
            top = max(us, key=lambda u: (u.n_kv, -u.masked))
            _, _, trace, period = detailed(top.n_kv, top.masked, v)
            work, idle_v = _per_block(at, trace, period, per_trace)
            share = sum(u.n_kv for u in us) * per_tile / sm_blocks
            for unit, c in work.items():
                per_block[unit] = per_block.get(unit, 0.0) + c * share
            idle += idle_v * share
        act = power.activity(at, kt, per_block, sm_blocks, tensor_flops, idle)
        if splits > 1:  # the combine launch: its bytes or its chain of L2 round trips, drawing little
            combine = split_kv.combine_us(problem, at, splits, combine_shape, combine_pdl)
            act = replace(act, totals={**act.totals, "hbm": act.totals["hbm"] + split_kv.combine_bytes(problem, splits)},
                          gap_us=act.gap_us + combine)
        return act

    def finish(at, state) -> Result:
        kt, detailed, hbm_busy = state
        _, _, trace, period = detailed(longest.n_kv, longest.masked)
        util, waits, interval = _steady_state(trace, period)
        combine = split_kv.combine_us(problem, at, splits, combine_shape, combine_pdl)
        total_us = kt.time_us + combine
        tflops = run.flops_problem.flops / (total_us * 1e-6) / 1e12
        result = Result(at, run.schedule, impl, run.flops_problem, knobs, tflops, total_us, kt.cycles, util, "",
                        interval, waits, kt, trace, period, combine_us=combine)
        result.hbm_busy = hbm_busy
        if run.asked is not None:
            result.notes.append(padded_note(run))
        result.notes.extend(trace.schedule.meta.get("notes", ()))
        if splits > 1:
            result.notes.append(f"split-KV: {splits} chunks per Q tile ({kt.units} work units), main kernel "
                                f"{kt.time_us:.1f} us + combine launch {combine:.1f} us "
                                f"({split_kv.combine_bytes(problem, splits) / 1e6:.2f} MB of partial O and LSE"
                                + (f", {split_kv.combine_round_trips(splits, combine_shape)} dependent L2 round "
                                   "trips per row" if combine_shape else ", its bytes alone: the implementation "
                                   "names no combine shape") + ")")
        if problem.is_varlen:
            result.notes.append(f"varlen: {problem.batch} sequences, {sum(q for q, _ in problem.sequences)} query "
                                f"and {sum(k for _, k in problem.sequences)} key tokens in all; seqlen_q / seqlen_k "
                                f"shown are the longest")
        if problem.is_paged:
            result.notes.append(paged_note(problem, knobs))
        if counted:
            ctas = min(len(order), run.profile.num_sms) if persistent else len(order)
            result.notes.append(f"sequence: {len(order)} tiles counted on the device from cu_seqlens, "
                                + (f"{ctas} persistent CTAs taking them as they free up" if persistent
                                   else "one CTA per tile"))
        if problem.causal and any(q > k for q, k in problem.sequences):
            result.notes.append("causal with fewer keys than queries (bottom-right aligned): the first "
                                "seqlen_q - seqlen_k rows of such a sequence see no key and are written as zeros")
        return result

    return Pass(profile, at_clock, usage, finish)


def padded_note(run: Run) -> str:
    """What a prediction says when the build has no kernel of the asked head dim."""
    a, k = run.asked, run.problem
    return (f"{run.impl.kernel} has no hd{a.hdim}{'' if a.hdim == a.hdim_v else f'/{a.hdim_v}'} kernel in its build: it "
            f"runs the hd{k.hdim}{'' if k.hdim == k.hdim_v else f'/{k.hdim_v}'} one (tiles, GEMMs and loop of that "
            f"head dim, the extra columns zero); TFLOP/s count the asked head dim's FLOPs")


def paged_note(problem: Problem, knobs: dict) -> str:
    """What a paged cache changes (fa4sim/paged_kv.py): the load path, and its count of work."""
    if knobs.get("kv_load") != "cp_async":
        return (f"paged KV: pages of {problem.page_size} tokens hold whole KV blocks of {knobs['tile_n']} keys: TMA "
                f"loads them as from a contiguous cache, a page looked up per block")
    c = paged_kv.cp_async_instructions(knobs["tile_n"], problem.hdim, problem.hdim_v)
    return (f"paged KV: pages of {problem.page_size} tokens: the producer warpgroup copies each KV block of "
            f"{knobs['tile_n']} keys by cp.async, {c['copies']} copies and {c['instructions']} instructions per thread, "
            f"K after its page-table load (an L2 round trip); the same bytes as a contiguous cache")


def backward(run: Run) -> Pass:
    """The backward's part: KV tiles (one CTA, or CTA pair, each) over the SMs, and the launches
    around the main kernel; its state on a profile is the main kernel's KernelTime. A varlen
    batch (an implementation whose backward runs one: fa4kernel) is one launch of its grid
    (kernel_bwd.varlen_grid), each CTA costed by the same per-shape schedules as a dense launch,
    with its varlen preprocess and postprocess around it (kernel_bwd.varlen_passes)."""
    profile, module, impl, knobs, problem = run.profile, run.module, run.impl, run.knobs, run.problem
    two_cta = bool(knobs.get("two_cta", False))
    tile_m = knobs["tile_m"]
    keys = module.rows_per_cta(knobs) * (2 if two_cta else 1)
    # a schedule may launch its KV tiles otherwise (fa3's dq_sum "pair": 2-CTA clusters)
    units_of = getattr(module, "units", lambda p, n, m, k: kernel_bwd.kv_units(p, n, m))
    order, cluster = getattr(module, "launch_order", lambda k: ("index", 1))(knobs)
    if problem.is_varlen:
        # one launch over the packed batch: each sequence's units are its dense backward's, the
        # grid the longest sequence's key blocks for every (sequence, launch head), in blockIdx
        # order (kernel_bwd.varlen_grid; its CTAs past their sequence's keys exit at once)
        units, parts = kernel_bwd.varlen_units(problem, keys, tile_m, knobs, units_of)
        n_hb = kernel_bwd.launch_heads(kernel_bwd.sequence(problem, 0), knobs)  # per sequence
        grid = kernel_bwd.varlen_grid(units, n_hb, cluster > 1, bool(knobs.get("deterministic")) and problem.causal)
        if len(grid) > MAX_TILES:
            raise InputError("seqlens", f"{problem.batch} sequences x {n_hb} heads x {len(grid) // n_hb // problem.batch} "
                                        f"key blocks = {len(grid)} CTAs; fa4sim simulates at most {MAX_TILES} per "
                                        f"launch: fewer sequences or heads")
    else:
        units = units_of(problem, keys, tile_m, knobs)
        # grouped K/V heads with gqa_dkv "loop": one CTA per KV tile of a K/V head walks its group's q heads
        units = kernel_bwd.grouped(units, kernel_bwd.loops_group(problem, knobs))
        n_hb = kernel_bwd.launch_heads(problem, knobs)
        parts, grid = [(problem, units)], None
        if len(units) * n_hb > MAX_TILES:
            raise InputError("batch", f"{problem.batch} x {n_hb // problem.batch} heads x {len(units)} KV tiles = "
                                      f"{len(units) * n_hb} CTAs; fa4sim simulates at most {MAX_TILES} per launch: "
                                      f"lower --batch or --heads")
    # a causal launch has many counts of masked Q blocks; their mask work is one op at the
    # start of a tile, linear in the count: shapes are simulated with at most MASKED_SIM masked
    # blocks and each further one adds what the last simulated one did
    by_shape: dict[int, list[int]] = {}
    for u in units:
        by_shape.setdefault(min(u.masked, MASKED_SIM), []).append(u.n_kv)
    cache: dict[tuple, tuple] = {}
    runs = new_runs()
    per_trace: dict = {}  # _per_block's memo
    rows_t = kernel_bwd.transposed(problem, knobs)

    # per-shape costs in cycles on profile `at`: they depend on its clock, since an SM's share of
    # the chip's L2 rates, in bytes per SM clock, falls as the clock rises (fa3_sm90_bwd.l2_shares);
    # a clock within BUILD_CLOCK_TOL of one already built reuses that build (the power model's
    # last small steps)
    builds: dict[float, hardware.HardwareProfile] = {}

    def detailed(at, n: int, masked: int, whole: bool = False):
        """tile_times of n blocks with `masked` masked Q blocks on `at`; whole: its own trace too
        (otherwise a shape whose tiles reach past CAP gives a shorter tile from its probe)."""
        near = [g for g in builds if abs(g - at.clock_ghz) <= BUILD_CLOCK_TOL * at.clock_ghz]
        ghz = min(near, key=lambda g: abs(g - at.clock_ghz)) if near else at.clock_ghz
        on = builds.setdefault(ghz, at)
        shorter = not whole and max(by_shape.get(masked, [0])) > CAP
        key = (ghz, n, masked, shorter)
        if key not in cache:
            # one CTA per KV tile (kernel_time's persistent=False): a further tile's cost is never used
            cache[key] = tile_times(module.build(on, problem, knobs, n, masked, impl), n, pair=False, run=runs,
                                    shorter=shorter)
        return cache[key]

    many = [u.n_kv for u in units if u.masked > MASKED_SIM]
    n_ref = min(max(many), 8) if many else 0

    def costs(at):
        """cost_of(unit) -> (cycles of its first Q block's pass, of each further one) on `at`."""
        per_masked = max(0.0, detailed(at, n_ref, MASKED_SIM)[0]
                         - detailed(at, n_ref, MASKED_SIM - 1)[0]) if many else 0.0

        epilogue = kernel_bwd.dkv_reduce_cycles(at, problem, knobs)  # dK, dV as fp32 reduce-adds (GQA)
        # each CTA's own start-up before its first TMA (barrier init, descriptor prefetch, register
        # reallocation, its coordinates): one CTA per KV tile, so every tile pays it
        prologue = float(impl.value("cta_prologue_cycles", Context(problem, at, impl), knobs)) \
            if "cta_prologue_cycles" in impl.params else 0.0

        def cost_of(u) -> tuple[float, None]:
            m = min(u.masked, MASKED_SIM)
            if len(set(by_shape[m])) <= 4:
                t1, extra = detailed(at, u.n_kv, m)[0], None
            else:
                t1, extra = _interpolated(replace(u, masked=m), max(by_shape[m]),
                                          lambda n, mk: detailed(at, n, mk))
            return t1 + (u.masked - m) * per_masked + prologue + epilogue, extra
        return cost_of

    def launch(at, first: bool = False):
        """The main kernel's KernelTime on `at` (each clock is a launch of its own: `first` changes nothing)."""
        cost_of = costs(at)
        if grid is not None:  # a varlen batch: its grid as launched, one CTA per (key block, head, sequence)
            # the first wave's cold start as the dense launch's (kernel_model.cold_start_bytes): the
            # keys of every CTA and the first Q block of each (sequence, head) it starts on
            kt = kernel_time_tiles(rows_t, at, units, grid, cost_of, tile_m, two_cta, False, keys, 1,
                                   cold_bytes=lambda wave: cold_start_bytes(rows_t, wave, keys, tile_m))
            cycles = None
            if knobs.get("deterministic"):  # each (sequence, head)'s CTAs take their dQ turns in grid order
                cycles, _ = kernel_bwd.deterministic_grid(grid, units, [cost_of(u) for u in units],
                                                          at.num_sms // (2 if two_cta else 1),
                                                          module.dq_hold(at, problem, knobs),
                                                          kt.cold_start_us * at.clock_ghz * 1e3, at.cta_launch_cycles,
                                                          knobs.get("dq_slices", 1), cluster)
            return kernel_bwd.with_traffic(kt, problem, at, units, tile_m, two_cta, cycles, knobs, parts)
        kt = kernel_time(rows_t, at, units, cost_of, tile_m, two_cta, persistent=False, order=order, rows=keys,
                         cluster=cluster)
        cycles = None
        if knobs.get("deterministic"):
            hold = module.dq_hold(at, problem, knobs)
            cold = kt.cold_start_us * at.clock_ghz * 1e3
            slots = at.num_sms // (2 if two_cta else 1)
            cycles, _ = kernel_bwd.deterministic_cycles(units, [cost_of(u) for u in units], n_hb, slots, hold,
                                                        cold, at.cta_launch_cycles, problem.causal,
                                                        knobs.get("dq_slices", 1), cluster)
        return kernel_bwd.with_traffic(kt, problem, at, units, tile_m, two_cta, cycles, knobs)

    longest = max(units, key=lambda u: (u.n_kv, -u.masked))
    longest = replace(longest, masked=min(longest.masked, MASKED_SIM))
    visits = sum(u.n_kv for u in units) * n_hb
    sm_blocks = visits * (2 if two_cta else 1)
    reduce_bytes = kernel_bwd.traffic_of(parts, profile, tile_m, two_cta, knobs)[2]  # dQ's fp32 adds into L2

    around = sum(b for ops in kernel_bwd.passes(problem, knobs) for _, b in ops)  # HBM bytes of pre + post

    def main_usage(at, kt):
        """The main kernel's power.Activity on profile `at`."""
        _, _, trace, period = detailed(at, longest.n_kv, longest.masked, whole=True)
        flops = visits * (2 if two_cta else 1) * trace.schedule.meta["flops_per_iter"]
        per_block, idle = _per_block(at, trace, period, per_trace)
        return power.activity(at, kt, per_block, sm_blocks, flops, idle, reduce_bytes,
                              "red" if knobs.get("dq_reduce") == "red" else "bulk")

    def usage(at, kt):
        """The whole call's: the power cap holds the average over the calls, and the memory-bound
        launches around the main kernel (HBM-bound: the same time at any clock) draw little, so
        they leave the main kernel room."""
        act = main_usage(at, kt)
        pre, post = kernel_bwd.pre_post_us(problem, at, knobs)
        return replace(act, totals={**act.totals, "hbm": act.totals["hbm"] + around}, gap_us=act.gap_us + pre + post)

    def finish(at, kt) -> BwdResult:
        pre_us, post_us = kernel_bwd.pre_post_us(problem, at, knobs)
        total_us = pre_us + kt.time_us + post_us
        _, _, trace, period = detailed(at, longest.n_kv, longest.masked, whole=True)
        util, waits, interval = _steady_state(trace, period)
        tflops = 2.5 * run.flops_problem.flops / (total_us * 1e-6) / 1e12
        result = BwdResult(at, run.schedule, impl, run.flops_problem, knobs, tflops, total_us, kt.cycles, util, "", interval,
                           waits, kt, trace, period, pre_us=pre_us, post_us=post_us, main_us=kt.time_us,
                           main_activity=main_usage(at, kt))
        result.notes.append(f"backward: preprocess {pre_us:.1f} us + main kernel {kt.time_us:.1f} us + postprocess "
                            f"{post_us:.1f} us; TFLOP/s count 2.5 x the forward's FLOPs over all three")
        if grid is not None:
            total_q, total_k = (sum(x) for x in zip(*problem.sequences))
            result.notes.append(f"varlen: {problem.batch} sequences, {total_q} query and {total_k} key tokens in "
                                f"all, one launch of {len(grid)} CTAs, one per (key block, "
                                f"{'k/v ' if kernel_bwd.loops_group(problem, knobs) > 1 else ''}head, sequence) "
                                f"up to the longest sequence's key blocks; {sum(m < 0 for _, m in grid)} lie past "
                                f"their sequence's keys and exit at once (each costs its CTA launch); "
                                f"seqlen_q / seqlen_k shown are the longest")
        if knobs.get("deterministic"):
            copies = knobs.get("dq_slices", 1)
            result.notes.append(f"deterministic: each CTA holds a Q block's dQ order for "
                                f"{module.dq_hold(at, problem, knobs):.0f} cycles; a CTA waits for those before it"
                                + (f"; {copies} copies of the dQ accumulator, a head's KV tiles in {copies} runs "
                                   f"with an order each, the copies summed before the postprocess" if copies > 1
                                   else ""))
        return result

    # the backward always has tensor work, so its clock starts at the tensor core's ceiling:
    # where that holds it, the first launch is the last (each clock is a launch of its own)
    top = float(profile.clock_tensor_ghz)
    start = _at(profile, top) if 0 < top < profile.clock_ghz else profile
    return Pass(start, launch, usage, finish)


def _at(profile: hardware.HardwareProfile, ghz: float) -> hardware.HardwareProfile:
    """The profile at the clock the power model predicts (the source says so)."""
    return replace(profile, values={**profile.values, "clock_ghz": ghz},
                   sources={**profile.sources, "clock_ghz": f"predicted by the power model (fa4sim/power.py) "
                                                            f"under the {profile.power_cap_w:g} W cap; "
                                                            f"maximum {profile.clock_ghz} GHz: "
                                                            f"{profile.sources['clock_ghz']}"},
                   confidence={**profile.confidence, "clock_ghz": "L"})


def _clock_note(r: "Result", profile, base_sources: dict) -> str:
    """What the clock the time is computed at rests on, for each clock_source."""
    if r.clock_source == "power model":
        guessed = [k for k in hardware.POWER_PARAMS if k != "clock_min_ghz" and profile.confidence.get(k) == "L"]
        what = (f"{len(guessed)} of its parameters are placeholders or literature values (confidence L; fa4sim "
                f"params)" if guessed else "its parameters are measured (fa4sim params)")
        return (f"clock {r.clock_ghz:.3f} GHz predicted by the power model from the units' activity; {what}; "
                f"time scales with the clock")
    if r.clock_source == "--set":
        return f"clock {r.clock_ghz} GHz set with --set; time scales with it"
    if base_sources.get("clock_ghz", "").startswith("measured"):
        return f"clock {r.clock_ghz} GHz is the profile's, measured on this chip under load; time scales with it"
    return f"clock {r.clock_ghz} GHz was not measured on this chip under load; time scales with it"


def setup(hw, schedule: str | None, problem: Problem | None, overrides: dict | None, impl, pass_: str = "fwd"):
    """Resolve what simulate() runs: (profile, schedule name, schedule module, implementation,
    knobs), with the overrides applied and the configuration checked; pass_ "bwd" resolves the
    schedule's backward and the implementation's backward choices."""
    r = resolve_run(hw, schedule, problem, overrides, impl, pass_)
    return r.profile, r.schedule, r.module, r.impl, r.knobs


def resolve_run(hw, schedule: str | None, problem: Problem | None, overrides: dict | None, impl,
                pass_: str = "fwd") -> Run:
    """setup()'s resolution as a Run, with the profile as given (before the what-ifs) beside it."""
    if not isinstance(pass_, str) or pass_ not in PASSES:
        raise InputError("pass", f"unknown pass {pass_!r}; allowed: {', '.join(PASSES)}")
    if not isinstance(problem, Problem):
        raise InputError("problem", f"a Problem(batch, heads, seqlen_q, seqlen_k, hdim, causal) is required, got "
                                    f"{type(problem).__name__}")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise InputError("overrides", f"a dict of NAME: value (the --set what-ifs), got {type(overrides).__name__}")
    overrides = dict(overrides or {})
    profile = base = hw if isinstance(hw, hardware.HardwareProfile) else hardware.load(hw)
    if schedule is None:
        schedule = impl.schedule if isinstance(impl, implementation.Implementation) else default_schedule(profile.arch)
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise InputError("schedule", f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    module = SCHEDULES[schedule]
    if pass_ == "bwd":
        if schedule not in BWD_SCHEDULES:
            raise InputError("pass", f"the {schedule} schedule has no backward in fa4sim; --pass bwd runs with "
                                     f"--schedule {', '.join(BWD_SCHEDULES)}")
        module = BWD_SCHEDULES[schedule]
    if profile.arch not in getattr(module, "RUNS_ON", (module.ARCH,)):
        family = BWD_SCHEDULES if pass_ == "bwd" else SCHEDULES
        other = [n for n, m in family.items() if profile.arch in getattr(m, "RUNS_ON", (m.ARCH,))]
        raise InputError("schedule", f"{schedule} is an {module.ARCH} schedule but hw {profile.name} is {profile.arch}; use {', '.join(other)}")
    if not isinstance(impl, implementation.Implementation):
        # the schedule's arch: a schedule run on another arch (fa3 on sm100, no TMEM) keeps its kernel's choices
        impl = implementation.load(module.DEFAULT_IMPL if impl is None else impl, module.ARCH)
    if impl.schedule != schedule:
        raise InputError("impl", f"{impl.name} is modelled by the {impl.schedule} schedule, not {schedule}")
    if problem.is_varlen and pass_ == "bwd" and not impl.varlen_bwd:
        ok = [n for n in implementation.available() if implementation.load(n).varlen_bwd]
        here = [n for n in ok if n.endswith(profile_arch_suffix(impl.arch))]
        allowed = ", ".join(here) if here else f"none on {impl.arch} ({', '.join(ok) or 'none'})"
        raise InputError("impl", f"{impl.kernel} has no varlen backward; allowed impls: {allowed}")
    if problem.is_varlen and pass_ == "fwd" and not impl.varlen:
        ok = [n for n in implementation.available() if n.endswith(profile_arch_suffix(impl.arch))
              and implementation.load(n).varlen]
        raise InputError("impl", f"{impl.kernel} has no varlen forward; allowed impls: {', '.join(ok) or 'none'}")
    if problem.is_paged:
        paged = [n for n in implementation.available() if implementation.load(n).paged_kv]
        if pass_ == "bwd":
            raise InputError("page_size", f"{problem.page_size}: a paged KV cache is read by the forward (decode, "
                                          f"prefill over a cache); allowed with --pass bwd: 0")
        if not impl.paged_kv:
            raise InputError("page_size", f"{problem.page_size}: {impl.name} reads a contiguous KV cache only; allowed "
                                          f"with it: 0, or an implementation with a paged one: {', '.join(paged)}")
        if problem.is_varlen and impl.kernel == "flash-attn-4":
            raise InputError("page_size", f"{problem.page_size}: flash-attn-4 takes a page table only without "
                                          f"cu_seqlens_k (one cache length per sequence); allowed with a varlen "
                                          f"batch: 0, or flash-attn-3")
    impl = impl.for_pass(pass_)
    hw_over, knob_over, impl_over = split_overrides(module, impl, overrides or {})
    if hw_over:
        profile = profile.with_values(**hw_over)
    if impl_over:
        impl = impl.with_values(**impl_over)
    impl.check(problem)
    asked, problem = problem, impl.kernel_problem(problem)  # a head dim its build has no kernel for runs padded
    knobs = resolve(module.KNOBS, Context(problem, profile, impl), knob_over)
    module.check(profile, problem, knobs, impl)
    if problem.is_varlen and pass_ == "bwd":
        kernel_bwd.check_varlen(knobs)
    return Run(profile, base, schedule, module, impl, knobs, problem, pass_, "clock_ghz" in overrides,
               asked if asked != problem else None)


def profile_arch_suffix(arch: str) -> str:
    """The suffix of the implementations of an architecture's names (fa4kernel-sm90: -sm90)."""
    return f"-{arch}"


def build_cta(hw, problem: Problem, overrides: dict | None = None, n_kv: int = 12, masked: int = 0,
              impl=None, schedule: str | None = None, pass_: str = "fwd"):
    """One CTA's schedule (an engine.Schedule) for tiles of n_kv KV blocks (backward: Q blocks),
    `masked` of them masked, resolved as simulate() resolves it: for timelines, tests and lessons."""
    for name, v, lo, hi in (("n_kv", n_kv, 1, MAX_SEQLEN), ("masked", masked, 0, n_kv)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= v <= hi:
            raise InputError(name, f"must be an integer in {lo}..{hi}{' (n_kv)' if name == 'masked' else ''}, got {v!r}")
    profile, _, module, impl, knobs = setup(hw, schedule, problem, overrides, impl, pass_)
    return module.build(profile, problem, knobs, int(n_kv), int(masked), impl)


def default_schedule(arch: str) -> str:
    """The schedule for an architecture (sm90: fa3, sm100: fa4)."""
    for name, m in SCHEDULES.items():
        if m.ARCH == arch:
            return name
    raise InputError("hw", f"no schedule for arch {arch!r}; allowed: {', '.join(m.ARCH for m in SCHEDULES.values())}")


def _further(t1: float, t2: float | None) -> tuple[float, float | None]:
    """(T1, the further-tile cost T2 - T1) in cycles; None where T2 was not simulated."""
    return t1, None if t2 is None else t2 - t1


def _interpolated(u: WorkUnit, n_max: int, detailed) -> tuple[float, float | None]:
    """T1 and the further-tile cost (None where T2 was not simulated) for n blocks from
    simulated neighbours (affine in n)."""
    ladder = sorted({n for n in LADDER if n < n_max} | {n_max})
    n = u.n_kv
    if n in ladder:
        return _further(*detailed(n, u.masked)[:2])
    lo = max(x for x in ladder if x < n)
    hi = min(x for x in ladder if x > n)
    a, b = detailed(lo, u.masked), detailed(hi, u.masked)
    w = (n - lo) / (hi - lo)
    t1 = a[0] + w * (b[0] - a[0])
    if a[1] is None:
        return t1, None
    extra = (a[1] - a[0]) + w * ((b[1] - b[0]) - (a[1] - a[0]))
    return t1, extra


def _per_block(hw, trace: Trace, period: Period | None, memo: dict | None = None) -> tuple[dict, float]:
    """(nominal unit cycles per KV block of the loop's steady part (power.work_per_block; a tile
    too short for one: the whole trace over all its blocks), the tensor core's weighted idle
    cycles per KV block from the tile's first MMA to its end: the loop and the epilogue; the
    start is the cold start, which a persistent CTA overlaps with the previous tile
    (power.tensor_gaps, power.idle_cycles)). memo: a dict kept over one prediction, where the
    same trace's work and gaps are asked for again at each clock the power model tries."""
    key = (id(trace), period)
    if memo is None or key not in memo:
        iters = window(trace, period)[3]
        got = (trace, power.work_per_block(trace, iters), power.tensor_gaps(trace, None, trace.end))
        if memo is None:
            memo = {}
        memo[key] = got  # the trace itself too: it keeps its id its own while the memo lives
    _, work, gaps = memo[key]
    return dict(work), power.idle_cycles(hw, gaps) / max(sum(trace.tiles), 1)


def _steady_state(trace: Trace, period: Period | None):
    """Unit utilisation and tensor-core idle causes over the periodic part of the loop."""
    t0, t1, interval, _ = window(trace, period)
    util = trace.utilization(t0, t1)
    waits: dict[str, float] = {}
    span = max(t1 - t0, 1e-9)
    # Busy's fields (unit, start, end, rec): engine.Trace.busy_rows
    pieces = sorted((b for b in trace.busy_rows if b[0] == "tensor" and b[2] > t0 and b[1] < t1), key=lambda b: b[1])
    prev_end = t0
    for _, start, end, rec_i in pieces:
        gap = min(start, t1) - max(prev_end, t0)
        if gap > 1e-9:
            rec = trace.ops[rec_i]
            cause = rec.waited_for or f"{rec.role} issue order"
            waits[cause] = waits.get(cause, 0.0) + gap / span
        prev_end = max(prev_end, end)
    waits = dict(sorted(waits.items(), key=lambda kv: -kv[1]))
    return util, waits, interval


UNIT_WORDS = {"tensor": "tensor core", "mufu": "MUFU (exp2)", "fma": "FMA pipe", "alu": "ALU pipe",
              "smem": "shared-memory bandwidth", "smem:lsu": "shared-memory stores (what the MMA fetch leaves)",
              "tmem": "TMEM bandwidth", "tma": "TMA", "issue": "instruction issue"}


LAUNCH_BOUND_SHARE = 0.5  # the launch's fixed costs above this share of the time: "launch-bound"


def _fixed_costs(r: Result) -> str:
    """The launch's fixed costs (gap, cold start, the combine launch) where they are a tenth of the
    time or more, and "launch-bound" where they are most of it."""
    k = r.kernel
    gap = r.hw.launch_gap_us if r.pass_ == "fwd" else 0.0
    fixed = gap + r.combine_us + (k.cold_start_us if k.limiter == "compute" else 0.0)
    share = fixed / r.time_us if r.time_us else 0.0
    if share < 0.1:
        return ""
    what = f"launch gap {gap:.1f} us" + (f", cold start {k.cold_start_us:.1f} us" if k.limiter == "compute" else "") \
        + (f", combine launch {r.combine_us:.1f} us" if r.combine_us else "")
    head = "launch-bound: " if share > LAUNCH_BOUND_SHARE else ""
    return f"{head}the launch's fixed costs ({what}) are {share:.0%} of the time"


def _bottleneck(r: Result) -> str:
    k = r.kernel
    fixed = _fixed_costs(r)
    if fixed.startswith("launch-bound"):
        return fixed
    if k.limiter != "compute":
        moved = k.hbm_bytes if k.limiter == "HBM" else k.l2_bytes
        what = "HBM bandwidth" if k.limiter == "HBM" else "L2 bandwidth"
        text = (f"{k.limiter}-bound: moving {moved / 1e9:.2f} GB takes {max(k.l2_us, k.hbm_us):.1f} us, "
                f"more than the {k.compute_us:.1f} us of compute")
        if r.pass_ == "fwd" and (r.combine_us or r.problem.seqlen_q * r.problem.heads_per_kv <= 128):
            text += (f" ({what}: K/V {r.problem.kv_bytes / 1e9:.3g} GB at {r.kv_read_gbps:.0f} GB/s over the whole "
                     f"time{', with the combine launch' if r.combine_us else ''})")
        return text + (f"; {fixed}" if fixed else "")
    top, frac = max(r.utilization.items(), key=lambda kv: kv[1])
    parts = []
    if frac >= 0.9:
        parts.append(f"{UNIT_WORDS.get(top, top)}-bound: {frac:.0%} busy in the steady state")
    else:
        idle = sum(r.tensor_waits.values())
        why = ", ".join(f"{c} {v:.0%}" for c, v in list(r.tensor_waits.items())[:3])
        parts.append(f"latency-bound: no unit saturated (busiest: {UNIT_WORDS.get(top, top)} {frac:.0%}); "
                     f"the tensor core idles {idle:.0%} of the loop waiting for {why or 'nothing'}")
    tail = k.units / (math.ceil(k.waves) * k.slots) if k.units else 1.0
    if not r.problem.causal and tail < 0.9:
        parts.append(f"wave quantisation: {k.units} tiles on {k.slots} slots ({k.waves:.2f} waves, last wave {tail:.0%} full)")
    if r.pass_ == "fwd" and (r.problem.is_varlen or r.knobs.get("num_splits", 1) > 1 or k.waves < 0.5) \
            and k.units < r.hw.num_sms // 2:
        parts.append(f"occupancy: {k.units} work units keep {k.units} of {r.hw.num_sms} SMs busy "
                     f"({k.tiles_on_slowest} tile{'s' if k.tiles_on_slowest > 1 else ''} on the slowest)")
    if fixed:
        parts.append(fixed)
    return "; ".join(parts)
