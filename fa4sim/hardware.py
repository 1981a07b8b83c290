"""Hardware profiles: per-SM unit facts as data, every value with its source.

Profiles live in fa4sim/profiles/<name>.json: {"name", "arch", "description", "params": {param:
{"value", "source", "confidence"[, "range"]}}}. Confidence: H = vendor doc or several agreeing
measurements, M = one good measurement, L = inference or guess (docs/reference/hardware.md).
"range": [lo, hi], the span the value plausibly lies in, where the profile states one (an assumed
value, sources that disagree); without it the confidence sets it (fa4sim/uncertainty.py).
`PARAMS` below says what each parameter means, in which unit, and the span of values it may take;
a profile must give them all (TMEM ones are 0 on SM90), and a value outside its span is refused
wherever it comes from (a profile file, --set, with_values). A measured profile
(lab/tools/calibrate/make_profile.py) is the same format.
"""
from __future__ import annotations

import difflib
import json
import math
import numbers
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from .errors import InputError

PROFILE_DIR = Path(__file__).parent / "profiles"
ARCHS = ("sm90", "sm100")
# the compute capabilities of each arch a profile may name ("compute_capability"; default the first):
# SM100's family holds B200 (10.0) and B300 (10.3), which share the schedule but not every choice
# a kernel makes (flash-attn-4 emulates no exp2 on 10.3)
CAPABILITIES = {"sm90": ("9.0",), "sm100": ("10.0", "10.3")}


class Param(NamedTuple):
    """A hardware parameter: its unit, what it means, and the span lo..hi its value may take."""

    unit: str
    meaning: str
    lo: float
    hi: float
    integer: bool = False

    def allowed(self) -> str:
        unit = "" if self.unit in ("1", "fraction") else f" {self.unit}"
        return f"{'an integer in ' if self.integer else ''}{_num(self.lo)}..{_num(self.hi)}{unit}"


# The spans: what an SM90 or SM100 GPU, or a what-if about one, can have. Wide enough for the
# what-ifs (one SM, a MUFU twice as fast, a 3.7 GHz clock, HBM that never limits), narrow enough
# to refuse what no GPU is (a 1 THz clock, a card drawing -1 GW). Spans several parameters share:
CLOCK = (0.1, 5.0)              # GHz: no GPU clocks outside (H100, B200: about 2)
LANES = (1, 1024)               # lanes or bytes per SM per clock: 16 to 200 on SM90 and SM100
SHARE = (0.01, 1)               # a share of a rate: 0 would stall the warps that need it for ever
CYCLES = (0, 10_000)            # on-chip latencies and costs: tens to hundreds of cycles; 10 000 is 5 us
MEMORY_CYCLES = (0, 100_000)    # L2, HBM, a CTA's launch: hundreds of cycles; 100 000 is 50 us
CHIP_TBPS = (0.1, 500)          # whole-chip TB/s: 3 to 20 on H100 and B200; 100 = memory that never limits
WATTS = (0, 3000)               # the largest boards are capped at 1 to 1.4 kW (B200, GB300)
ENERGY = (0, 1000)              # pJ: HBM's ~100 pJ per byte is the costliest path there is

# The LSU pipe takes one warp instruction per clock per SM: shuffles, shared-memory and global
# loads and stores, reductions, cp.async (docs/model.md, "The backward pass": NVIDIA's description
# of the MIO -> LSU issue, and the CUDA C++ Programming Guide's 32 warp-shuffle results per clock
# per SM on compute capability 9.0 and 10.0). Not a profile parameter: not measured yet
# (lab/tools/calibrate/bench_lsu.py measures it), the same on every profile.
LSU_WARP_INSTR_PER_CLK = 1.0

# name -> Param(unit, meaning, span). Rates are per SM per clock unless said otherwise.
PARAMS: dict[str, Param] = {
    "clock_ghz": Param("GHz", "SM clock (cycles -> time): with a power model (power_cap_w > 0) the maximum boost clock, "
                       "which the power model lowers to what the cap allows; without one the clock the kernel runs at", *CLOCK),
    # 1: one SM (a persistent CTA's exact cycles); the largest chips have 160
    "num_sms": Param("SMs", "streaming multiprocessors on the chip", 1, 1024, integer=True),
    # 4096 on SM90, 8192 on SM100: 8 x that for what-ifs
    "tensor_flops_per_clk": Param("FLOP/clk/SM", "dense BF16/FP16 tensor-core FLOPs", 1, 65536),
    "mufu_ex2_per_clk": Param("ops/clk/SM", "MUFU.EX2 throughput (all 4 sub-partitions)", *LANES),
    "fma_lanes_per_clk": Param("lane-ops/clk/SM", "FP32 FMA-pipe lanes (FFMA, FADD, FMUL; packed x2 ops count 2)", *LANES),
    "alu_lanes_per_clk": Param("lane-ops/clk/SM", "integer/ALU-pipe lanes (FMNMX, LOP3, SHF, LEA, F2FP)", *LANES),
    # 4 schedulers issue one warp-instruction each per clock on every SM since Maxwell
    "issue_per_clk": Param("warp-instr/clk/SM", "instruction issue: 4 warp schedulers, 1 each per clock", 1, 16),
    # a warp issues at most one instruction per clock; 0 would never issue
    "warp_issue_ipc": Param("instr/clk/warp", "what one warp issues per clock on a softmax-like mix, one warp of its role per scheduler", 0.01, 1),
    "issue_under_mma": Param("fraction", "share of the SM's issue rate left to other warps while the tensor core executes", *SHARE),
    "warp_issue_under_mma": Param("fraction", "a warp's own issue rate while the tensor core executes, relative to idle", *SHARE),
    "dense_issue_under_mma": Param("fraction", "share of the SM's issue rate a burst of independent FP32 instructions "
                                   "(the O rescale's FMULs) gets while the tensor core executes", *SHARE),
    "inline_issue_under_mma": Param("fraction", "share of the SM's issue rate the same FMUL burst gets while the tensor "
                                    "core executes when the warps that issue the wgmmas issue it between their own HGMMAs "
                                    "(the O rescale before the PV GEMM, as compiled)", *SHARE),
    "mufu_under_mma": Param("fraction", "MUFU throughput while the tensor core executes, relative to idle", *SHARE),
    "mix_mufu_utilization": Param("fraction", "share of the MUFU's rate a softmax-like mix keeps busy with two or more "
                                  "warps of it per scheduler: its dependences leave the MUFU idle at times (one warp "
                                  "alone is held by warp_issue_ipc first)", *SHARE),
    # 0 = free, 1 = a mix instruction's own slot: a few slots is no longer filling idle ones
    "mix_fill_slots": Param("mix slots", "issue slots one instruction added to a softmax-like mix takes beside a running "
                            "MMA, in units of a mix instruction's own slot: the mix waits on MUFU latency, and added "
                            "independent FMA/ALU instructions (an emulated exp2's polynomial, tau's test) fill its "
                            "idle slots; 1 = charged like a mix instruction", 0, 4),
    "smem_bytes_per_clk": Param("B/clk/SM", "shared-memory bandwidth (MMA operands, STS/LDS)", *LANES),
    # 227 KiB on SM90 and SM100; 16 KiB to 1 MiB
    "smem_capacity_bytes": Param("B", "max dynamic shared memory per CTA", 1 << 14, 1 << 20, integer=True),
    # 64 Ki on every SM since Kepler
    "registers_per_sm": Param("32-bit regs", "register file per SM", 1 << 13, 1 << 20, integer=True),
    # 0 = no TMEM (SM90); 512 on SM100
    "tmem_columns": Param("columns", "tensor memory columns (128 lanes x 32 bit each); 0 = no TMEM", 0, 4096, integer=True),
    # 0 without TMEM (SM90), else > 0 (check_profile); 200 on SM100
    "tmem_bytes_per_clk": Param("B/clk/SM", "tcgen05.ld/st bandwidth between TMEM and registers", 0, 4096),
    "tmem_latency": Param("cycles", "tcgen05.ld/st latency until the data is usable (wait::ld)", *CYCLES),
    "mma_latency_ss": Param("cycles", "MMA completion latency beyond its issue interval, A and B in smem", *CYCLES),
    "mma_latency_rs": Param("cycles", "MMA completion latency beyond its issue interval, A in registers/TMEM", *CYCLES),
    "mma_latency_pair": Param("cycles", "extra completion latency of a CTA-pair (2-CTA) MMA", *CYCLES),
    "mma_issue_cycles": Param("cycles", "time the issuing warp spends per MMA instruction (wgmma / tcgen05.mma)", *CYCLES),
    # 2 to 7 measured; 0 would never issue
    "mma_queue_depth": Param("instructions", "MMA instructions queued or running before a further issue stalls", 1, 64, integer=True),
    # a dependent instruction issues a clock later at the soonest
    "mufu_latency": Param("cycles", "MUFU.EX2 dependent-issue latency", 1, 10_000),
    # as mufu_latency
    "fma_latency": Param("cycles", "FFMA dependent-issue latency", 1, 10_000),
    "smem_latency": Param("cycles", "shared-memory load latency", *CYCLES),
    "named_barrier_latency": Param("cycles", "bar.sync/arrive signalling between warpgroups", *CYCLES),
    "mbarrier_latency": Param("cycles", "mbarrier arrive (or tcgen05.commit) -> waiting warp resumes", *CYCLES),
    "tma_bytes_per_clk": Param("B/clk/SM", "TMA load bandwidth into one SM's shared memory (L2 hits)", *LANES),
    "l2_latency": Param("cycles", "TMA tile load latency on an L2 hit", *MEMORY_CYCLES),
    "hbm_latency": Param("cycles", "TMA tile load latency from HBM (a cold tile)", *MEMORY_CYCLES),
    "l2_bandwidth_tbps": Param("TB/s", "whole-chip L2 -> SM bandwidth", *CHIP_TBPS),
    "hbm_bandwidth_tbps": Param("TB/s", "achievable HBM bandwidth", *CHIP_TBPS),
    # 50 MiB (H100) to 126 MiB (B200); 1 MiB to 4 GiB
    "l2_bytes": Param("B", "L2 capacity", 1 << 20, 1 << 32, integer=True),
    # 1 to 2 us measured: a millisecond between kernels is no launch gap
    "launch_gap_us": Param("us", "gap between back-to-back kernels of a timed loop (launch, ramp, drain)", 0, 1000),
    # a kernel launched as a programmatic dependent launch (PDL) behind another: its CTAs launch
    # while that one runs and wait in griddepcontrol.wait; what is left is the grid's end, the
    # memory flush and the release
    "pdl_launch_gap_us": Param("us", "gap a programmatic dependent launch adds behind the kernel before it", 0, 1000),
    "cta_launch_cycles": Param("cycles", "from a CTA retiring to the grid's next CTA starting on that SM", *MEMORY_CYCLES),
    # about 1 measured
    "tile_jitter_q_loads": Param("Q-tile loads", "how much one tile's cycles vary from tile to tile in a full-chip "
                                 "launch (standard deviation, independent per tile), in units of the tile's Q load at "
                                 "tma_bytes_per_clk: the spread comes with the memory traffic at the tile's boundary; "
                                 "only a tile table fixed before the launch pays for it; 0 = not modelled", 0, 100),
    # the power model (fa4sim/power.py): P(f) = static + s (f/fmax) clock_power
    #   + 1e-3 f (s sum_u e_u r_u + e_l2 b_l2 + (f/fmax) e_hbm b_hbm), s = (V(f)/V(fmax))^2
    # 0 = no power model
    "power_cap_w": Param("W", "board power limit the clock is held to; 0 = no power model (the clock stays at clock_ghz)", *WATTS),
    # 0.98 to 1 measured: the cap's controller holds a load a few percent under it
    "cap_held_fraction": Param("fraction", "the board power a load the cap holds draws on average (NVML), over power_cap_w: "
                               "the cap's controller keeps it a little below the limit; 1 = at the limit", 0.5, 1),
    # 0 only without a power model (simulate checks it against clock_ghz)
    "clock_min_ghz": Param("GHz", "lowest SM clock the power model may choose", 0, CLOCK[1]),
    # 0 = none
    "clock_tensor_ghz": Param("GHz", "highest SM clock (clock64 over globaltimer) the chip holds while its tensor core "
                              "works, where the power cap leaves room and NVML still reports clock_ghz; 0 = none", 0, CLOCK[1]),
    "static_power_w": Param("W", "power that does not scale with the SM clock (leakage, board, idle memory)", *WATTS),
    # a card may draw less than the calibration card: -4 to +41 W measured, and no card of the same model is 500 W off
    "card_power_w": Param("W", "power the card draws above the calibration card at the same activity and clock (its "
                          "leakage, voltage bin, cooling): the median card of those measured, or one card's own "
                          "(lab/tools/calibrate/card_power.py)", -500, 500),
    "clock_power_w": Param("W", "power of the clocked but idle chip at clock_ghz (scales with f V^2)", *WATTS),
    # V(f) / V(fmax) stays within 0..1 for every f in 0..fmax
    "voltage_slope": Param("1", "V(f)/V(fmax) = 1 - voltage_slope (1 - f/fmax): how the voltage falls with the clock", 0, 1),
    "energy_tensor_pj_per_flop": Param("pJ/FLOP", "tensor-core energy per dense BF16 FLOP at the maximum clock's voltage", *ENERGY),
    "energy_mufu_pj_per_op": Param("pJ/op", "MUFU energy per ex2 at the maximum clock's voltage", *ENERGY),
    "energy_fma_pj_per_lane_op": Param("pJ/lane-op", "FMA-pipe energy per lane-op at the maximum clock's voltage", *ENERGY),
    "energy_alu_pj_per_lane_op": Param("pJ/lane-op", "ALU-pipe energy per lane-op at the maximum clock's voltage", *ENERGY),
    "energy_smem_pj_per_byte": Param("pJ/B", "energy per byte through shared memory (and TMEM on SM100) at the maximum "
                                     "clock's voltage", *ENERGY),
    "energy_l2_pj_per_byte": Param("pJ/B", "energy per byte from L2 into the SMs (not scaled by the SM voltage)", *ENERGY),
    "energy_l2_reduce_pj_per_byte": Param("pJ/B", "energy per byte of TMA bulk fp32 reduce-adds into L2 (the L2's "
                                          "read-modify-write; not scaled by the SM voltage)", *ENERGY),
    "energy_red_pj_per_byte": Param("pJ/B", "energy per byte of RED.ADD.F32 from registers into L2, their instructions "
                                    "included (not scaled by the SM voltage)", *ENERGY),
    "energy_dsmem_pj_per_byte": Param("pJ/B", "energy per byte sent into a peer CTA's shared memory over the SM-to-SM "
                                      "network, beyond the shared-memory write (not scaled by the SM voltage)", *ENERGY),
    "energy_hbm_pj_per_byte": Param("pJ/B", "energy per byte moved to or from HBM at the maximum clock; at SM clock f "
                                    "it is this x f/fmax (HBM traffic beside a tensor core the cap slows)", *ENERGY),
    "tensor_idle_power_fraction": Param("1", "share of its busy power the tensor core draws while it idles between "
                                        "bursts with the SM clocked (a gap much shorter than tensor_idle_gap_cycles); "
                                        "0 = not modelled", 0, 1),
    # 32768 fitted; a million cycles is half a millisecond
    "tensor_idle_gap_cycles": Param("cycles", "L0: an idle gap of g cycles counts g L0 / (L0 + g) (a gap of L0 cycles "
                                    "half: long gaps let the tensor core gate)", 0, 1_000_000),
    # 0.45 fitted
    "mixed_code_energy_fraction": Param("1", "extra energy of MUFU, FMA and ALU work issued as one mixed stream (a "
                                        "softmax) over the same work in single-pipe streams", 0, 10),
    # the backward's units (lab/tools/calibrate/bench_bwd_units.py)
    "mma_min_cycles": Param("cycles", "fewest cycles one m64 wgmma k-step (m64nNk16) holds the tensor core whatever its "
                            "N: narrow instructions take at least this; 0 = none (N / 2 x 4096 / tensor_flops_per_clk "
                            "only)", *CYCLES),
    "reduce_bytes_per_clk": Param("B/clk/SM", "fp32 reduce-adds one SM sends into L2, TMA bulk reduce-adds "
                                  "(cp.reduce.async.bulk .add.f32, issued by the TMA unit) and RED.ADD.F32 alike", *LANES),
    "l2_reduce_bandwidth_tbps": Param("TB/s", "whole-chip rate of fp32 reduce-adds into L2-resident lines; the L2 "
                                      "serves loads and reduce-adds from the same time, each at its own rate", *CHIP_TBPS),
    # 0.5: loads and reduce-adds of equal times fully overlapped; 1: not at all
    "l2_mixed_time_fraction": Param("1", "the L2's time for loads and fp32 reduce-adds together, as a fraction of "
                                    "the sum of their times alone (about as many bytes of each, as the backward "
                                    "moves); 1 = no overlap", 0.5, 1),
    "dsmem_bytes_per_clk": Param("B/clk/SM", "distributed shared memory: bytes one SM moves to or from a peer CTA's "
                                 "shared memory in its cluster over the SM-to-SM network (st.async, ld.shared::cluster), "
                                 "each direction", *LANES),
    # about 10 KB measured; no more than an SM's shared memory is in flight
    "dsmem_queue_bytes": Param("B", "st.async bytes an SM keeps in flight to its peer: the sending warps are held "
                               "until all but these have left, and these land after they go on; 0 = the senders are "
                               "held until every byte has left", 0, 1 << 20),
}

POWER_PARAMS = ("power_cap_w", "cap_held_fraction", "clock_min_ghz", "clock_tensor_ghz", "static_power_w",
                "card_power_w", "clock_power_w", "voltage_slope",
                "energy_tensor_pj_per_flop", "energy_mufu_pj_per_op", "energy_fma_pj_per_lane_op",
                "energy_alu_pj_per_lane_op", "energy_smem_pj_per_byte", "energy_l2_pj_per_byte",
                "energy_l2_reduce_pj_per_byte", "energy_red_pj_per_byte", "energy_dsmem_pj_per_byte",
                "energy_hbm_pj_per_byte", "tensor_idle_power_fraction", "tensor_idle_gap_cycles",
                "mixed_code_energy_fraction")


def _num(x) -> str:
    """A number as a person writes it: 1000000 rather than 1e+06, 1.5 rather than 1.500000."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _shown(value) -> str:
    """A value as it was given: JSON's words for true, false and null, a number as a number."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return _num(value)
    return repr(value)


def check_value(name: str, value, origin: str, text: bool = True):
    """Parameter `name`'s value as the model takes it (a number; an int where the parameter counts
    whole things), from a number or, with `text`, a --set or --grid string (a profile's JSON holds
    numbers); a one-line InputError naming the parameter, the value, where it came from (`origin`:
    a profile file, --set) and its span."""
    p = PARAMS[name]
    v = value
    if isinstance(v, str) and text:
        try:
            v = float(v)
        except ValueError:
            pass  # not a number: refused below
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
    if ok and p.integer:
        ok = v == int(v)
        v = int(v)
    if not ok or not p.lo <= v <= p.hi:
        sign = ", not > 0" if ok and v <= 0 < p.lo else ""  # a rate, a count: the model divides by it
        raise InputError(name, f"got {_shown(value)} from {origin}{sign}; allowed: {p.allowed()}")
    return v


def check_profile(values: dict, origin: str) -> None:
    """What no single span can say: parameters that must agree."""
    if values["tmem_columns"] > 0 and values["tmem_bytes_per_clk"] <= 0:
        raise InputError("tmem_bytes_per_clk", f"got {_shown(values['tmem_bytes_per_clk'])} from {origin}; with "
                                               f"TMEM (tmem_columns > 0) allowed: > 0 B/clk/SM")


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    arch: str  # "sm90" or "sm100"
    description: str
    values: dict
    sources: dict
    confidence: dict
    ranges: dict = field(default_factory=dict)  # param -> (lo, hi): the spans the profile states
    compute_capability: str = ""  # "10.3" on B300; "" = the arch's first (CAPABILITIES)

    def __getattr__(self, key):
        values = self.__dict__.get("values", {})
        if key in values:
            return values[key]
        raise AttributeError(key)

    @property
    def capability(self) -> str:
        """The compute capability, "9.0", "10.0" or "10.3": what a kernel's choices may test."""
        return self.compute_capability or CAPABILITIES[self.arch][0]

    @property
    def peak_tflops(self) -> float:
        """Dense BF16 peak of the whole chip at clock_ghz, in TFLOP/s."""
        return self.tensor_flops_per_clk * self.num_sms * self.clock_ghz * 1e-3

    def with_values(self, **overrides) -> "HardwareProfile":
        """A copy with some parameters changed (a what-if); their source becomes 'user override'."""
        for k in overrides:
            if k not in PARAMS:
                raise InputError(k, f"unknown hardware parameter; known: {', '.join(PARAMS)}")
        values = {**self.values, **{k: check_value(k, v, "--set") for k, v in overrides.items()}}
        check_profile(values, "--set")
        sources = {**self.sources, **{k: "user override (--set)" for k in overrides}}
        conf = {**self.confidence, **{k: "-" for k in overrides}}
        ranges = {k: r for k, r in self.ranges.items() if k not in overrides}
        return replace(self, values=values, sources=sources, confidence=conf, ranges=ranges)

    def to_json(self) -> dict:
        return {"name": self.name, "arch": self.arch, "description": self.description,
                **({"compute_capability": self.compute_capability} if self.compute_capability else {}),
                "params": {k: {"value": self.values[k], "source": self.sources[k],
                               "confidence": self.confidence[k],
                               **({"range": list(self.ranges[k])} if k in self.ranges else {})} for k in PARAMS}}


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def from_json(data: dict, origin: str = "profile") -> HardwareProfile:
    """A profile from its JSON form (a built-in one, a file, make_profile.py's output), every part
    checked: a one-line InputError naming `origin` and what is wrong."""
    if not isinstance(data, dict) or not all(k in data for k in ("name", "arch", "params")):
        raise InputError("hw", f"{origin} is not a hardware profile: it needs name, arch and params "
                               f"(see fa4sim/profiles/*.json)")
    for key in ("name", "arch", "description"):
        if key in data and not (isinstance(data[key], str) and (data[key] or key == "description")):
            raise InputError("hw", f"{origin}: {key} must be a string, got {_shown(data[key])}")
    if data["arch"] not in ARCHS or not isinstance(data["params"], dict):
        raise InputError("hw", f"{origin}: arch must be {' or '.join(ARCHS)} and params an object")
    cc = data.get("compute_capability", "")
    if "compute_capability" in data and cc not in CAPABILITIES[data["arch"]]:
        raise InputError("hw", f"{origin}: compute_capability {_shown(cc)} for arch {data['arch']}; allowed: "
                               f"{', '.join(CAPABILITIES[data['arch']])}")
    params = data["params"]
    unknown = [str(k) for k in params if k not in PARAMS]
    if unknown:
        near = sorted({m for k in unknown for m in difflib.get_close_matches(k, PARAMS, n=1)})
        raise InputError("hw", f"{origin}: unknown parameters {', '.join(unknown)}"
                               f"{' (did you mean ' + ', '.join(near) + '?)' if near else ''}; "
                               f"`fa4sim params` lists the known ones")
    bad = [k for k, v in params.items() if not isinstance(v, dict) or "value" not in v
           or not isinstance(v.get("source"), str) or not isinstance(v.get("confidence", ""), str)]
    if bad:
        raise InputError("hw", f"{origin}: params {bad[:3]} need a value and a source (source and confidence are strings)")
    missing = [k for k in PARAMS if k not in params]
    if missing:
        raise InputError("hw", f"{origin} lacks parameters {missing}")
    values = {k: check_value(k, params[k]["value"], origin, text=False) for k in PARAMS}
    check_profile(values, origin)
    ranges = {k: _range(k, params[k]["range"], values[k], origin) for k in PARAMS if "range" in params[k]}
    return HardwareProfile(
        name=data["name"], arch=data["arch"], description=data.get("description", ""), values=values,
        sources={k: params[k]["source"] for k in PARAMS},
        confidence={k: params[k].get("confidence", "?") for k in PARAMS}, ranges=ranges, compute_capability=cc)


def _range(name: str, given, value, origin: str) -> tuple:
    """A stated range [lo, hi]: both in the parameter's span, lo <= value <= hi."""
    if not (isinstance(given, list) and len(given) == 2):
        raise InputError(name, f"range {_shown(given) if not isinstance(given, list) else given} from {origin}; "
                               f"allowed: [lo, hi], two numbers in {PARAMS[name].allowed()}")
    lo, hi = (check_value(name, v, f"{origin} (range)", text=False) for v in given)
    if not lo <= value <= hi:
        raise InputError(name, f"range [{_num(lo)}, {_num(hi)}] from {origin} does not hold its value "
                               f"{_num(value)}; allowed: lo <= value <= hi")
    return lo, hi


def load(name: str | os.PathLike) -> HardwareProfile:
    """A built-in profile by name (h100, h200, b200, ...) or a profile JSON file by path."""
    if not isinstance(name, (str, os.PathLike)):
        raise InputError("hw", f"a profile name ({', '.join(available())}), a profile .json path or a "
                               f"HardwareProfile, got {name!r} ({type(name).__name__})")
    path = Path(name)
    name = str(name)
    if path.suffix == ".json":
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise InputError("hw", f"no such profile file {name!r}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise InputError("hw", f"cannot read {name} ({getattr(e, 'strerror', None) or e})") from None
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            why = e if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            raise InputError("hw", f"{path} is not valid JSON ({why})") from None
        return from_json(data, origin=str(path))
    if name not in available():
        raise InputError("hw", f"unknown hardware {name!r}; allowed: {', '.join(available())} or a profile .json path")
    return from_json(json.loads((PROFILE_DIR / f"{name}.json").read_text()), origin=f"profile {name}")
