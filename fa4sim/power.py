"""Power -> clock: the SM clock a GPU holds under a kernel's power, from the units' activity.

A Hopper or Blackwell GPU under sustained load runs at the highest clock its board power limit
allows. The model (docs/model.md, "Clock and power"): at SM clock f (GHz), with fmax the
profile's clock_ghz (the maximum boost), s = (V(f)/V(fmax))^2, V(f)/V(fmax) = 1 - voltage_slope
* (1 - f/fmax), r_u the chip-wide operations of unit u per SM clock and b the chip-wide bytes per
SM clock,

    P(f) = static + card + s (f/fmax) clock_power + 1e-3 f (s sum_u e_u r_u + e_l2 b_l2 + (f/fmax) e_hbm b_hbm)   [W]

(e in pJ, f in GHz: 1e-3 f e r is W; card = card_power_w, what the card draws above the one the
energies were fitted on: the median card of those measured, or a card's own), with two terms
measured on unit loads where the sum of the parts falls short (lab/findings/power-and-clock.md,
"Bursts and mixed code"):

- a tensor core that idles between bursts, in gaps short against L0 = tensor_idle_gap_cycles,
  still draws a share of its busy power: the idle part is 1e-3 f s e_tensor
  tensor_idle_power_fraction r_idle, r_idle its weighted idle cycles per SM clock x
  tensor_flops_per_clk (a gap of g cycles weighs L0/(L0 + g): long gaps let it gate). Only the
  cycles of a gap in which warps issue instructions count (the calibration loads' gaps spin, or
  run softmax-like warps beside; where every warp sleeps the SM stops its clock and they draw
  nothing);
- MUFU, FMA and ALU work issued as one mixed stream (a softmax) draws more than the same work
  in single-pipe streams: their energies x (1 + mixed_code_energy_fraction).
 Units u: tensor (FLOPs), mufu (ops), fma and alu
(lane-ops), smem (bytes through shared memory and, on SM100, TMEM, and an SM90 RS wgmma's A
operand from the register file: the ops' work "rf_operand", priced as the same bytes from shared
memory, as wgmma loads with A from registers draw what those with A from shared memory do;
lab/findings/power-cards.md, "Operands from registers"). The memory paths' energies
do not scale with the SM's voltage: l2 (bytes loaded from or stored to L2), l2_reduce (bytes of
TMA bulk reduce-adds, the L2 adding them: about 2.5 times a loaded byte), red (bytes of RED.ADD
from registers, their instructions included), dsmem (bytes into a peer CTA's shared memory over
the SM-to-SM network). An HBM byte's energy, measured at the maximum clock, scales with f/fmax:
HBM traffic beside a tensor core the cap slows costs less than alone at the maximum clock, in
proportion to the clock (bench_power's ring loads, lab/findings/power-and-clock.md, "Memory
beside the tensor core"); L2 traffic beside it costs what it does alone. The predicted clock is
the highest f in [clock_min_ghz, clock_ghz] with P(f) <= the held power, power_cap_w x
cap_held_fraction (the cap's controller holds a capped load a little below its limit); P grows
with f (the work per second and the voltage both do), so a bisection finds it. While the tensor
core works, the SM's own clock (clock64 over globaltimer) stays at or below clock_tensor_ghz
even where the cap leaves room and NVML reports clock_ghz (lab/findings/power-and-clock.md,
"The tensor core's clock ceiling"): a launch with tensor work is held there. A profile with
power_cap_w = 0 has no power model: the clock stays at clock_ghz.

The activity of a launch (`activity`): every unit's work for the whole launch, over the
launch's cycles at the clock f including the launch gap (a timed loop idles there):

- tensor: the FLOPs the tensor core executes: 2 x rows x tile_n x (hdim + hdim_v) per KV block
  of every tile, rows its live rows (masked blocks count whole: the MMA runs on them; a tile
  whose idle warpgroups skip their work, as fa3's part-full last tile at hd64, counts only its
  live warpgroups' rows);
- tensor_idle: the tensor core's weighted idle cycles per KV block, from its first MMA to the
  tile's end (tensor_gaps, idle_cycles), x the KV blocks, in the FLOPs it would have done in them;
- mufu, fma, alu, smem: the work per KV block per SM (the ops' uses and work), from the ops of
  the KV iterations in the steady state (their nominal unit cycles, so a pipe slowed beside the
  tensor core is not counted twice), x the KV blocks (a CTA pair counts both SMs); a tile too
  short for a steady state takes its whole simulated trace per block. Both per-block figures come
  from the longest tile of each way a tile runs (all its warpgroups, or fewer live ones), weighted
  by the KV blocks the tiles of that way run. The tile prologue and epilogue (Q load, O store)
  beyond that are left out;
- l2, hbm: the launch's bytes (kernel_model.traffic); a backward's fp32 dQ reduce-adds among
  them are l2_reduce or red instead (`activity`'s reduce_bytes), and its CTA pair's bytes over the
  SM-to-SM network are dsmem.

The launch's time at f: the slowest slot's loop cycles / f plus the cold start, or the L2 or
HBM time if longer, plus the launch gap; so the rates per SM clock follow f.
"""
from __future__ import annotations

import bisect
import math
import operator
from dataclasses import dataclass
from typing import Mapping, NamedTuple

# parts of the power, W; "static" and "clock" are the chip's own, the others its units'
PARTS = ("static", "clock", "tensor", "tensor_idle", "mufu", "fma", "alu", "smem", "l2", "l2_reduce", "red", "dsmem",
         "hbm")
SM_UNITS = ("tensor", "mufu", "fma", "alu", "smem")     # energies scale with V^2
MEMORY = ("l2", "l2_reduce", "red", "dsmem", "hbm")     # energies that do not (hbm's scales with f/fmax)
ENERGY = {"tensor": "energy_tensor_pj_per_flop", "mufu": "energy_mufu_pj_per_op",
          "fma": "energy_fma_pj_per_lane_op", "alu": "energy_alu_pj_per_lane_op",
          "smem": "energy_smem_pj_per_byte", "l2": "energy_l2_pj_per_byte",
          "l2_reduce": "energy_l2_reduce_pj_per_byte", "red": "energy_red_pj_per_byte",
          "dsmem": "energy_dsmem_pj_per_byte", "hbm": "energy_hbm_pj_per_byte"}
# activity keys of the calibration files (lab/tools/calibrate/bench_power.py, bench_mem_power.py) -> our units
CALIBRATION_KEYS = {"tensor_flops": "tensor", "mufu_ops": "mufu", "fma_lane_ops": "fma", "alu_lane_ops": "alu",
                    "smem_bytes": "smem", "l2_bytes": "l2", "l2_reduce_bytes": "l2_reduce", "red_bytes": "red",
                    "dsmem_bytes": "dsmem", "hbm_bytes": "hbm"}
PART_WORDS = {"tensor": "the tensor core", "tensor_idle": "the tensor core idling between bursts",
              "mufu": "the MUFU (exp2)", "fma": "the FMA pipe", "alu": "the ALU pipe",
              "smem": "shared memory", "l2": "L2 traffic", "l2_reduce": "bulk reduce-adds into L2",
              "red": "RED.ADD from registers", "dsmem": "the SM-to-SM network", "hbm": "HBM traffic"}
BISECT_GHZ = 1e-5  # bisection stops within this of the answer


@dataclass(frozen=True)
class Activity:
    """One launch's work and time. totals: unit -> FLOPs / ops / lane-ops / bytes of the whole
    launch (tensor_idle: the tensor core's weighted idle cycles x tensor_flops_per_clk);
    loop_cycles: the slowest slot's SM cycles without the cold start; cold_us, l2_us,
    hbm_us, gap_us: the launch's cold start, L2 and HBM times and the gap to the next launch."""

    totals: dict
    loop_cycles: float
    cold_us: float = 0.0
    l2_us: float = 0.0
    hbm_us: float = 0.0
    gap_us: float = 0.0
    mixed: float = 1.0          # 1: the softmax pipes run one mixed instruction stream

    def time_us(self, f: float) -> float:
        """The launch's time at SM clock f (GHz), the gap included (as kernel_model.kernel_time)."""
        return max(self.loop_cycles / (f * 1e3) + self.cold_us, self.l2_us, self.hbm_us) + self.gap_us

    def per_clk(self, f: float) -> dict:
        """Chip-wide work per SM clock at clock f: unit -> ops (or bytes) per clock."""
        cycles = self.time_us(f) * f * 1e3
        return {u: v / cycles for u, v in self.totals.items()}


def work_per_block(trace, iters: range | None = None) -> dict:
    """Nominal unit cycles per KV block on one SM, from a one-tile trace: the `uses` and `work`
    of every op of the KV iterations `iters` (the loop's steady part) over their number; iters
    None: every op of the trace over all its blocks (a tile too short for a steady state)."""
    sched = trace.schedule
    blocks = len(iters) if iters is not None else sum(trace.tiles)
    out: dict[str, float] = {}
    for rec in trace.ops:
        if iters is None or rec.iter in iters:
            op = sched.op(rec.name)
            for unit, cycles in (*op.uses, *op.work):
                out[unit] = out.get(unit, 0.0) + cycles
    return {u: c / max(blocks, 1) for u, c in out.items()}


# units whose busy time means warps issue instructions (the SM stays clocked)
ISSUING = ("issue", "mufu", "fma", "alu", "lsu", "smem:lsu")


def _union(spans: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The union of (start, end) spans as disjoint spans in order: (their starts, their ends);
    spans that touch or overlap merge. Sorted by start alone: spans of one start merge into one
    whatever their order. (A trace has tens of thousands: the loop keeps the open span in locals.)"""
    if not spans:
        return [], []
    spans.sort(key=_FIRST)
    starts, ends = [], []
    it = iter(spans)
    s0, e0 = next(it)
    for a, b in it:
        if a <= e0:
            if b > e0:
                e0 = b
        else:
            starts.append(s0)
            ends.append(e0)
            s0, e0 = a, b
    starts.append(s0)
    ends.append(e0)
    return starts, ends


_FIRST = operator.itemgetter(0)


def tensor_gaps(trace, t0: float | None = None, t1: float | None = None,
                unit: str = "tensor") -> list[tuple[float, float]]:
    """The unit's idle gaps in a trace, each as (its length, the cycles of it some warp issues
    instructions: a unit of ISSUING, or one named issue:*, is busy), in cycles: within the
    window [t0, t1] (its edges count), or from the unit's first busy moment to t1 (t0 None; t1
    None: to its last busy moment). Intervals that touch or overlap merge."""
    lo = float("-inf") if t0 is None else t0
    up = float("inf") if t1 is None else t1
    rows = getattr(trace, "busy_rows", None)  # engine.Trace's: (unit, start, end, rec) tuples
    if rows is None:
        rows = [(x.unit, x.start, x.end) for x in trace.busy]
    busy_s, busy_e = _union([(a, b) for a, b in ((max(x[1], lo), min(x[2], up)) for x in rows if x[0] == unit)
                             if b > a])
    if not busy_s:
        return []
    first = busy_s[0] if t0 is None else t0
    last = busy_e[-1] if t1 is None else t1
    holes = [(a, b) for a, b in zip([first, *busy_e], [*busy_s, last]) if b > a]
    names = {u for u in set(map(_FIRST, rows)) if u in ISSUING or u.startswith("issue:")}
    starts, ends = _union([(x[1], x[2]) for x in rows if x[0] in names and x[2] > x[1]])
    # the merged spans are disjoint and sorted: those that overlap a hole are consecutive
    out = []
    for a, b in holes:
        i, j = bisect.bisect_right(ends, a), bisect.bisect_left(starts, b)
        out.append((b - a, sum(max(0.0, min(b, y) - max(a, x)) for x, y in zip(starts[i:j], ends[i:j]))))
    return out


def idle_cycles(hw, gaps: list[tuple[float, float]]) -> float:
    """The weighted idle cycles of gaps (length g, issuing cycles c): sum c L0/(L0 + g), L0 =
    tensor_idle_gap_cycles (a gap of L0 cycles counts half: long gaps let the tensor core gate;
    only its cycles with warps issuing count: where every warp waits or sleeps the SM's clock can
    stop, as it does in the calibration loads' nanosleep gaps); 0 when L0 is 0: not modelled."""
    L0 = float(hw.tensor_idle_gap_cycles)
    return 0.0 if L0 <= 0 else sum(c * L0 / (L0 + g) for g, c in gaps)


def activity(hw, kernel, per_block: dict, sm_blocks: float, tensor_flops: float, idle_per_block: float = 0.0,
             reduce_bytes: float = 0.0, reduce_by: str = "bulk") -> Activity:
    """A launch's Activity. hw: the profile (unit rates per clock); kernel: its KernelTime at
    hw.clock_ghz; per_block: nominal unit cycles per KV block on one SM (work_per_block);
    sm_blocks: KV blocks run on all SMs together (a CTA pair's block counts on both SMs);
    tensor_flops: FLOPs the tensor core executes in the launch; idle_per_block: the tensor core's
    weighted idle cycles per KV block on one SM (idle_cycles of tensor_gaps); reduce_bytes: the
    fp32 reduce-adds among kernel.l2_bytes, added by TMA bulk reduce-adds (reduce_by "bulk": unit l2_reduce) or
    RED.ADD from registers ("red": unit red) and priced as such, not as loads. Bytes a CTA sends
    into its peer's shared memory (the ops' dsmem cycles) go to unit dsmem."""
    if reduce_by not in ("bulk", "red"):
        raise ValueError(f"reduce_by={reduce_by!r}; allowed: bulk, red")
    busy = {u: c * sm_blocks for u, c in per_block.items()}
    reduce_bytes = min(float(reduce_bytes), float(kernel.l2_bytes))
    totals = {
        "tensor": float(tensor_flops),
        "tensor_idle": float(idle_per_block) * sm_blocks * hw.tensor_flops_per_clk,
        "mufu": busy.get("mufu", 0.0) * hw.mufu_ex2_per_clk,
        "fma": busy.get("fma", 0.0) * hw.fma_lanes_per_clk,
        "alu": busy.get("alu", 0.0) * hw.alu_lanes_per_clk,
        "smem": sum(busy.get(u, 0.0) for u in ("smem", "smem:lsu", "rf_operand")) * hw.smem_bytes_per_clk
                + busy.get("tmem", 0.0) * hw.tmem_bytes_per_clk,
        "l2": float(kernel.l2_bytes) - reduce_bytes,
        "l2_reduce": reduce_bytes if reduce_by == "bulk" else 0.0,
        "red": reduce_bytes if reduce_by == "red" else 0.0,
        "dsmem": busy.get("dsmem", 0.0) * hw.dsmem_bytes_per_clk,
        "hbm": float(kernel.hbm_bytes),
    }
    loop = kernel.cycles - kernel.cold_start_us * hw.clock_ghz * 1e3
    return Activity(totals, loop, kernel.cold_start_us, kernel.l2_us, kernel.hbm_us, hw.launch_gap_us)


def has_model(hw) -> bool:
    """Whether the profile has a power model (power_cap_w > 0)."""
    return float(hw.power_cap_w) > 0


def voltage(hw, f: float, fmax: float | None = None) -> float:
    """V(f) / V(fmax), 1 at the maximum clock."""
    fmax = hw.clock_ghz if fmax is None else fmax
    return 1.0 - hw.voltage_slope * (1.0 - f / fmax)


def energy_scale(unit: str, f: float, fmax: float, s: float) -> float:
    """Unit's energy per operation at clock f over its value at fmax: s = (V(f)/V(fmax))^2 for
    the SM's units, f/fmax for an HBM byte, 1 for the other memory paths."""
    return s if unit in SM_UNITS else f / fmax if unit == "hbm" else 1.0


def power_w(hw, act, f: float, fmax: float | None = None) -> tuple[float, dict]:
    """(total W, W by part) at SM clock f (GHz). act: an Activity (rates follow f) or a mapping
    unit -> chip-wide ops per SM clock (a calibration load's, fixed; its optional key "mixed"
    (0 or 1) as an Activity's field; "tensor_idle" its weighted idle FLOPs per clock). fmax: the
    maximum clock (default hw.clock_ghz)."""
    fmax = hw.clock_ghz if fmax is None else fmax
    if isinstance(act, Activity):
        rates: Mapping = act.per_clk(f)
        mixed = act.mixed
    else:
        rates, mixed = act, act.get("mixed", 0.0)
    scale = {}
    for u in ("mufu", "fma", "alu"):
        scale[u] = 1.0 + hw.mixed_code_energy_fraction * mixed
    s = voltage(hw, f, fmax) ** 2
    parts = {"static": float(hw.static_power_w) + float(hw.card_power_w),
             "clock": s * (f / fmax) * hw.clock_power_w}
    for u in (*SM_UNITS, *MEMORY):
        parts[u] = (1e-3 * f * energy_scale(u, f, fmax, s) * hw.values[ENERGY[u]] * scale.get(u, 1.0)
                    * rates.get(u, 0.0))
    parts["tensor_idle"] = (1e-3 * f * s * hw.values[ENERGY["tensor"]]
                            * hw.tensor_idle_power_fraction * rates.get("tensor_idle", 0.0))
    return sum(parts.values()), parts


class ClockPrediction(NamedTuple):
    clock_ghz: float
    power_w: float
    by_part: dict
    limited: bool      # the cap sets the clock (below the maximum)
    note: str = ""     # set when even clock_min_ghz exceeds the cap
    ceiling: bool = False  # the tensor core's clock ceiling (clock_tensor_ghz) sets it, under the cap


def held_power(hw) -> float:
    """The board power a load the cap holds draws, W: power_cap_w x cap_held_fraction."""
    return float(hw.power_cap_w) * float(hw.cap_held_fraction)


def tensor_ceiling(hw, act) -> float:
    """clock_tensor_ghz where the load has tensor work and the profile gives one, else 0 (none)."""
    c = float(hw.clock_tensor_ghz)
    rates = act.totals if isinstance(act, Activity) else act
    return c if c > 0 and rates.get("tensor", 0.0) > 0 else 0.0


def predict_clock(hw, act, fmax: float | None = None) -> ClockPrediction:
    """The highest f in [clock_min_ghz, fmax] with P(f) <= held_power(hw) (fmax: default
    hw.clock_ghz), and no higher than the tensor core's clock ceiling where the load has tensor
    work (tensor_ceiling). At the top when the load stays under the cap there; at clock_min_ghz,
    with a note, when even that exceeds it."""
    fmax = hw.clock_ghz if fmax is None else fmax
    cap = held_power(hw)
    top = tensor_ceiling(hw, act)
    if top and top < fmax:
        p, parts = power_w(hw, act, top, fmax)
        if p <= cap:
            return ClockPrediction(top, p, parts, False, ceiling=True)
    p, parts = power_w(hw, act, fmax, fmax)
    if p <= cap:
        return ClockPrediction(fmax, p, parts, False)
    lo = min(float(hw.clock_min_ghz), fmax)
    p_lo, parts_lo = power_w(hw, act, lo, fmax)
    if p_lo > cap:
        return ClockPrediction(lo, p_lo, parts_lo, True,
                               f"even at clock_min_ghz {lo} GHz the model's power {p_lo:.0f} W exceeds the "
                               f"{cap:.0f} W cap; the clock is held at clock_min_ghz")
    hi = fmax  # invariant: P(lo) <= cap < P(hi)
    while hi - lo > BISECT_GHZ:
        mid = 0.5 * (lo + hi)
        if power_w(hw, act, mid, fmax)[0] <= cap:
            lo = mid
        else:
            hi = mid
    f = max(math.floor(lo * 1e4) / 1e4, float(hw.clock_min_ghz))  # to 0.1 MHz, still under the cap
    p, parts = power_w(hw, act, f, fmax)
    return ClockPrediction(f, p, parts, True)


def dominant(by_part: dict) -> tuple[str, float]:
    """The unit part (not static, not clock) that draws the most power: (part, W)."""
    units = {k: v for k, v in by_part.items() if k not in ("static", "clock")}
    if not units:
        return "", 0.0
    name = max(units, key=units.get)
    return name, units[name]


def describe(clock_ghz: float, source: str, power: float | None, by_part: dict, limited: bool,
             cap: float = 0.0, ceiling: bool = False) -> str:
    """One line: the clock, where it comes from and, when the cap sets it, which unit's power."""
    if ceiling and source == "power model":
        return (f"clock {clock_ghz:.3f} GHz: the tensor core's clock ceiling (clock_tensor_ghz); the model's power "
                f"{power:.0f} W stays under the {cap:.0f} W cap")
    if source == "--set":
        extra = f" (the model's power there: {power:.0f} W, cap {cap:.0f} W)" if power is not None else ""
        return f"clock {clock_ghz:.3f} GHz: set with --set{extra}"
    if source == "profile":
        return f"clock {clock_ghz:.3f} GHz: the profile's fixed clock (no power model)"
    part, watts = dominant(by_part)
    if limited:
        held = f" (held at {power:.0f} W)" if power is not None and power < cap - 0.5 else ""
        return (f"clock {clock_ghz:.3f} GHz: the {cap:.0f} W cap{held}, set mostly by {PART_WORDS.get(part, part)} "
                f"({watts:.0f} W)")
    return f"clock {clock_ghz:.3f} GHz: the maximum; the model's power {power:.0f} W stays under the {cap:.0f} W cap"
