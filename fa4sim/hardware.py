"""Hardware profiles: per-SM unit facts as data, every value with its source.

Profiles live in fa4sim/profiles/<name>.json: {"name", "arch", "description", "params": {param:
{"value", "source", "confidence"}}}. Confidence: H = vendor doc or several agreeing measurements,
M = one good measurement, L = inference or guess (docs/reference/hardware.md).
`PARAMS` below says what each parameter means and in which unit; a profile must give them all
(TMEM ones are 0 on SM90). A measured profile (benchmarks/calibrate/make_profile.py) is the same format.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import InputError

PROFILE_DIR = Path(__file__).parent / "profiles"

# name -> (unit, meaning). Rates are per SM per clock unless said otherwise.
PARAMS: dict[str, tuple[str, str]] = {
    "clock_ghz": ("GHz", "SM clock (cycles -> time): with a power model (power_cap_w > 0) the maximum boost clock, "
                  "which the power model lowers to what the cap allows; without one the clock the kernel runs at"),
    "num_sms": ("SMs", "streaming multiprocessors on the chip"),
    "tensor_flops_per_clk": ("FLOP/clk/SM", "dense BF16/FP16 tensor-core FLOPs"),
    "mufu_ex2_per_clk": ("ops/clk/SM", "MUFU.EX2 throughput (all 4 sub-partitions)"),
    "fma_lanes_per_clk": ("lane-ops/clk/SM", "FP32 FMA-pipe lanes (FFMA, FADD, FMUL; packed x2 ops count 2)"),
    "alu_lanes_per_clk": ("lane-ops/clk/SM", "integer/ALU-pipe lanes (FMNMX, LOP3, SHF, LEA, F2FP)"),
    "issue_per_clk": ("warp-instr/clk/SM", "instruction issue: 4 warp schedulers, 1 each per clock"),
    "warp_issue_ipc": ("instr/clk/warp", "what one warp issues per clock on a softmax-like mix, one warp of its role per scheduler"),
    "issue_under_mma": ("fraction", "share of the SM's issue rate left to other warps while the tensor core executes"),
    "warp_issue_under_mma": ("fraction", "a warp's own issue rate while the tensor core executes, relative to idle"),
    "dense_issue_under_mma": ("fraction", "share of the SM's issue rate a burst of independent FP32 instructions "
                              "(the O rescale's FMULs) gets while the tensor core executes"),
    "inline_issue_under_mma": ("fraction", "share of the SM's issue rate the same FMUL burst gets while the tensor "
                               "core executes when the warps that issue the wgmmas issue it between their own HGMMAs "
                               "(the O rescale before the PV GEMM, as compiled)"),
    "mufu_under_mma": ("fraction", "MUFU throughput while the tensor core executes, relative to idle"),
    "mix_mufu_utilization": ("fraction", "share of the MUFU's rate a softmax-like mix keeps busy with two or more "
                             "warps of it per scheduler: its dependences leave the MUFU idle at times (one warp "
                             "alone is held by warp_issue_ipc first)"),
    "mix_fill_slots": ("mix slots", "issue slots one instruction added to a softmax-like mix takes beside a running "
                       "MMA, in units of a mix instruction's own slot: the mix waits on MUFU latency, and added "
                       "independent FMA/ALU instructions (an emulated exp2's polynomial, tau's test) fill its "
                       "idle slots; 1 = charged like a mix instruction"),
    "smem_bytes_per_clk": ("B/clk/SM", "shared-memory bandwidth (MMA operands, STS/LDS)"),
    "smem_capacity_bytes": ("B", "max dynamic shared memory per CTA"),
    "registers_per_sm": ("32-bit regs", "register file per SM"),
    "tmem_columns": ("columns", "tensor memory columns (128 lanes x 32 bit each); 0 = no TMEM"),
    "tmem_bytes_per_clk": ("B/clk/SM", "tcgen05.ld/st bandwidth between TMEM and registers"),
    "tmem_latency": ("cycles", "tcgen05.ld/st latency until the data is usable (wait::ld)"),
    "mma_latency_ss": ("cycles", "MMA completion latency beyond its issue interval, A and B in smem"),
    "mma_latency_rs": ("cycles", "MMA completion latency beyond its issue interval, A in registers/TMEM"),
    "mma_latency_pair": ("cycles", "extra completion latency of a CTA-pair (2-CTA) MMA"),
    "mma_issue_cycles": ("cycles", "time the issuing warp spends per MMA instruction (wgmma / tcgen05.mma)"),
    "mma_queue_depth": ("instructions", "MMA instructions queued or running before a further issue stalls"),
    "mufu_latency": ("cycles", "MUFU.EX2 dependent-issue latency"),
    "fma_latency": ("cycles", "FFMA dependent-issue latency"),
    "smem_latency": ("cycles", "shared-memory load latency"),
    "named_barrier_latency": ("cycles", "bar.sync/arrive signalling between warpgroups"),
    "mbarrier_latency": ("cycles", "mbarrier arrive (or tcgen05.commit) -> waiting warp resumes"),
    "tma_bytes_per_clk": ("B/clk/SM", "TMA load bandwidth into one SM's shared memory (L2 hits)"),
    "l2_latency": ("cycles", "TMA tile load latency on an L2 hit"),
    "hbm_latency": ("cycles", "TMA tile load latency from HBM (a cold tile)"),
    "l2_bandwidth_tbps": ("TB/s", "whole-chip L2 -> SM bandwidth"),
    "hbm_bandwidth_tbps": ("TB/s", "achievable HBM bandwidth"),
    "l2_bytes": ("B", "L2 capacity"),
    "launch_gap_us": ("us", "gap between back-to-back kernels of a timed loop (launch, ramp, drain)"),
    "cta_launch_cycles": ("cycles", "from a CTA retiring to the grid's next CTA starting on that SM"),
    "tile_jitter_q_loads": ("Q-tile loads", "how much one tile's cycles vary from tile to tile in a full-chip "
                            "launch (standard deviation, independent per tile), in units of the tile's Q load at "
                            "tma_bytes_per_clk: the spread comes with the memory traffic at the tile's boundary; "
                            "only a tile table fixed before the launch pays for it; 0 = not modelled"),
    # the power model (fa4sim/power.py): P(f) = static + s (f/fmax) clock_power
    #   + 1e-3 f (s sum_u e_u r_u + e_l2 b_l2 + (f/fmax) e_hbm b_hbm), s = (V(f)/V(fmax))^2
    "power_cap_w": ("W", "board power limit the clock is held to; 0 = no power model (the clock stays at clock_ghz)"),
    "cap_held_fraction": ("fraction", "the board power a load the cap holds draws on average (NVML), over power_cap_w: "
                          "the cap's controller keeps it a little below the limit; 1 = at the limit"),
    "clock_min_ghz": ("GHz", "lowest SM clock the power model may choose"),
    "clock_tensor_ghz": ("GHz", "highest SM clock (clock64 over globaltimer) the chip holds while its tensor core "
                         "works, where the power cap leaves room and NVML still reports clock_ghz; 0 = none"),
    "static_power_w": ("W", "power that does not scale with the SM clock (leakage, board, idle memory)"),
    "card_power_w": ("W", "power the card draws above the calibration card at the same activity and clock (its "
                     "leakage, voltage bin, cooling): the median card of those measured, or one card's own "
                     "(benchmarks/calibrate/card_power.py)"),
    "clock_power_w": ("W", "power of the clocked but idle chip at clock_ghz (scales with f V^2)"),
    "voltage_slope": ("1", "V(f)/V(fmax) = 1 - voltage_slope (1 - f/fmax): how the voltage falls with the clock"),
    "energy_tensor_pj_per_flop": ("pJ/FLOP", "tensor-core energy per dense BF16 FLOP at the maximum clock's voltage"),
    "energy_mufu_pj_per_op": ("pJ/op", "MUFU energy per ex2 at the maximum clock's voltage"),
    "energy_fma_pj_per_lane_op": ("pJ/lane-op", "FMA-pipe energy per lane-op at the maximum clock's voltage"),
    "energy_alu_pj_per_lane_op": ("pJ/lane-op", "ALU-pipe energy per lane-op at the maximum clock's voltage"),
    "energy_smem_pj_per_byte": ("pJ/B", "energy per byte through shared memory (and TMEM on SM100) at the maximum "
                                "clock's voltage"),
    "energy_l2_pj_per_byte": ("pJ/B", "energy per byte from L2 into the SMs (not scaled by the SM voltage)"),
    "energy_l2_reduce_pj_per_byte": ("pJ/B", "energy per byte of TMA bulk fp32 reduce-adds into L2 (the L2's "
                                     "read-modify-write; not scaled by the SM voltage)"),
    "energy_red_pj_per_byte": ("pJ/B", "energy per byte of RED.ADD.F32 from registers into L2, their instructions "
                               "included (not scaled by the SM voltage)"),
    "energy_dsmem_pj_per_byte": ("pJ/B", "energy per byte sent into a peer CTA's shared memory over the SM-to-SM "
                                 "network, beyond the shared-memory write (not scaled by the SM voltage)"),
    "energy_hbm_pj_per_byte": ("pJ/B", "energy per byte moved to or from HBM at the maximum clock; at SM clock f "
                               "it is this x f/fmax (HBM traffic beside a tensor core the cap slows)"),
    "tensor_idle_power_fraction": ("1", "share of its busy power the tensor core draws while it idles between "
                                   "bursts with the SM clocked (a gap much shorter than tensor_idle_gap_cycles); "
                                   "0 = not modelled"),
    "tensor_idle_gap_cycles": ("cycles", "L0: an idle gap of g cycles counts g L0 / (L0 + g) (a gap of L0 cycles "
                               "half: long gaps let the tensor core gate)"),
    "mixed_code_energy_fraction": ("1", "extra energy of MUFU, FMA and ALU work issued as one mixed stream (a "
                                   "softmax) over the same work in single-pipe streams"),
    # the backward's units (benchmarks/calibrate/bench_bwd_units.py)
    "mma_min_cycles": ("cycles", "fewest cycles one m64 wgmma k-step (m64nNk16) holds the tensor core whatever its "
                       "N: narrow instructions take at least this; 0 = none (N / 2 x 4096 / tensor_flops_per_clk "
                       "only)"),
    "reduce_bytes_per_clk": ("B/clk/SM", "fp32 reduce-adds one SM sends into L2, TMA bulk reduce-adds "
                             "(cp.reduce.async.bulk .add.f32, issued by the TMA unit) and RED.ADD.F32 alike"),
    "l2_reduce_bandwidth_tbps": ("TB/s", "whole-chip rate of fp32 reduce-adds into L2-resident lines; the L2 "
                                 "serves loads and reduce-adds from the same time, each at its own rate"),
    "l2_mixed_time_fraction": ("1", "the L2's time for loads and fp32 reduce-adds together, as a fraction of "
                               "the sum of their times alone (about as many bytes of each, as the backward "
                               "moves); 1 = no overlap"),
    "dsmem_bytes_per_clk": ("B/clk/SM", "distributed shared memory: bytes one SM moves to or from a peer CTA's "
                            "shared memory in its cluster over the SM-to-SM network (st.async, ld.shared::cluster), "
                            "each direction"),
    "dsmem_queue_bytes": ("B", "st.async bytes an SM keeps in flight to its peer: the sending warps are held "
                          "until all but these have left, and these land after they go on; 0 = the senders are "
                          "held until every byte has left"),
}

POWER_PARAMS = ("power_cap_w", "cap_held_fraction", "clock_min_ghz", "clock_tensor_ghz", "static_power_w",
                "card_power_w", "clock_power_w", "voltage_slope",
                "energy_tensor_pj_per_flop", "energy_mufu_pj_per_op", "energy_fma_pj_per_lane_op",
                "energy_alu_pj_per_lane_op", "energy_smem_pj_per_byte", "energy_l2_pj_per_byte",
                "energy_l2_reduce_pj_per_byte", "energy_red_pj_per_byte", "energy_dsmem_pj_per_byte",
                "energy_hbm_pj_per_byte", "tensor_idle_power_fraction", "tensor_idle_gap_cycles",
                "mixed_code_energy_fraction")

# Parameters that must be whole numbers.
INTEGER = {"mma_queue_depth", "num_sms", "smem_capacity_bytes", "registers_per_sm", "tmem_columns", "l2_bytes"}


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    arch: str  # "sm90" or "sm100"
    description: str
    values: dict
    sources: dict
    confidence: dict

    def __getattr__(self, key):
        values = self.__dict__.get("values", {})
        if key in values:
            return values[key]
        raise AttributeError(key)

    @property
    def peak_tflops(self) -> float:
        """Dense BF16 peak of the whole chip at clock_ghz, in TFLOP/s."""
        return self.tensor_flops_per_clk * self.num_sms * self.clock_ghz * 1e-3

    def with_values(self, **overrides) -> "HardwareProfile":
        """A copy with some parameters changed (a what-if); their source becomes 'user override'."""
        for k in overrides:
            if k not in PARAMS:
                raise InputError(k, f"unknown hardware parameter; known: {', '.join(PARAMS)}")
        values = {**self.values, **overrides}
        sources = {**self.sources, **{k: "user override (--set)" for k in overrides}}
        conf = {**self.confidence, **{k: "-" for k in overrides}}
        return replace(self, values=values, sources=sources, confidence=conf)

    def to_json(self) -> dict:
        return {"name": self.name, "arch": self.arch, "description": self.description,
                "params": {k: {"value": self.values[k], "source": self.sources[k],
                               "confidence": self.confidence[k]} for k in PARAMS}}


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def from_json(data: dict, origin: str = "profile") -> HardwareProfile:
    params = data.get("params", {})
    missing = [k for k in PARAMS if k not in params]
    if missing:
        raise InputError("hw", f"{origin} lacks parameters {missing}")
    return HardwareProfile(
        name=data["name"], arch=data["arch"], description=data.get("description", ""),
        values={k: params[k]["value"] for k in PARAMS},
        sources={k: params[k]["source"] for k in PARAMS},
        confidence={k: params[k].get("confidence", "?") for k in PARAMS})


def load(name: str) -> HardwareProfile:
    """A built-in profile by name (h100, h200, b200) or a profile JSON file by path."""
    path = Path(name)
    if path.suffix == ".json" and path.exists():
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError("hw", f"{path} is not valid JSON ({e})") from None
        if not isinstance(data, dict) or not all(k in data for k in ("name", "arch", "params")):
            raise InputError("hw", f"{path} is not a hardware profile: it needs name, arch and params "
                                   f"(see fa4sim/profiles/*.json)")
        if data["arch"] not in ("sm90", "sm100") or not isinstance(data["params"], dict):
            raise InputError("hw", f"{path}: arch must be sm90 or sm100 and params an object")
        bad = [k for k, v in data["params"].items() if not isinstance(v, dict) or "value" not in v or "source" not in v]
        if bad:
            raise InputError("hw", f"{path}: params {bad[:3]} need a value and a source")
        return from_json(data, origin=str(path))
    if path.suffix == ".json":
        raise InputError("hw", f"no such profile file {name!r}")
    if name not in available():
        raise InputError("hw", f"unknown hardware {name!r}; allowed: {', '.join(available())} or a profile .json path")
    return from_json(json.loads((PROFILE_DIR / f"{name}.json").read_text()), origin=name)
