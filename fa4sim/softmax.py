"""Softmax work per tile, as unit cycles: instruction counts per score element, by architecture.

Counts are lane-ops (one thread doing one operation) on each pipe, and thread-instructions for
issue (a warp instruction issues for 32 threads at once; 4 schedulers per SM). Packed f32x2 ops
(SM100's FFMA2/FADD2/FMUL2) do 2 lane-ops with one instruction.

SM100 (FA4): one thread owns a whole row (S lives in TMEM; no cross-thread reduction).
SM90 (FA3): a row is spread over 4 threads of a quad (the wgmma accumulator layout), so the max
and the final sum need 2 shuffles + 2 ops per thread per row. Hopper has no packed FP32 ops and
a 2-input FMNMX. Sources: docs/reference/fa4-schedules.md (softmax step), hardware.md.
"""
from __future__ import annotations

from dataclasses import replace

from .exp2_emulation import ISSUE_PER_ELEMENT as EMU_ISSUE, exp2_costs

# phase -> {pipe: lane-ops per element, "instr": thread-instructions per element}
PER_ELEMENT = {
    "sm100": {
        "max": {"alu": 0.5, "instr": 0.5},      # 3-input FMNMX tree: ~C/2 ops for a C-wide row
        "scale": {"fma": 1.0, "instr": 0.5},    # FFMA2: x*scale_log2 - max*scale_log2
        "convert": {"alu": 0.5, "instr": 0.5},  # F2FP.BF16.F32.PACK_AB: one per pair
        "sum": {"fma": 1.0, "instr": 0.5},      # FADD2 row sum
        # flash-attn-4's R2P mask (mask.py): per 32 columns a bit mask (about 3 integer ops), about 5
        # R2P and 32 FSEL: 1.25 per element, on the masked blocks only
        "mask": {"alu": 1.25, "instr": 1.25},
        "rescale": {"fma": 1.0, "instr": 0.5},  # FMUL2 of O by acc_scale (correction warpgroup)
        "normalize": {"fma": 1.0, "alu": 0.5, "instr": 1.0},  # O * 1/row_sum, convert
    },
    "sm90": {
        "max": {"alu": 1.0, "instr": 1.0},
        "scale": {"fma": 1.0, "instr": 1.0},
        "convert": {"alu": 0.5, "instr": 0.5},
        "sum": {"fma": 1.0, "instr": 1.0},
        "mask": {"alu": 2.0, "instr": 2.0},
        "rescale": {"fma": 1.0, "instr": 1.0},  # FMUL of the register-resident O
        "normalize": {"fma": 1.0, "alu": 0.5, "instr": 1.5},
    },
}
# per row: quad reduction of the max on SM90 (2 SHFL + 2 FMNMX on each of 4 threads)
PER_ROW = {"sm100": {"max": {}}, "sm90": {"max": {"alu": 8.0, "instr": 16.0}}}
PIPES = ("fma", "alu", "mufu")


def phase(hw, name: str, elements: float, rows: float = 0.0) -> dict[str, float]:
    """Unit cycles of one softmax phase over `elements` score elements spanning `rows` rows."""
    per_el = PER_ELEMENT[hw.arch][name]
    per_row = PER_ROW[hw.arch].get(name, {})
    lanes = {"fma": hw.fma_lanes_per_clk, "alu": hw.alu_lanes_per_clk, "mufu": hw.mufu_ex2_per_clk}
    out = {}
    for pipe in PIPES:
        ops = per_el.get(pipe, 0.0) * elements + per_row.get(pipe, 0.0) * rows
        if ops:
            out[pipe] = ops / lanes[pipe]
    instr = per_el.get("instr", 0.0) * elements + per_row.get("instr", 0.0) * rows
    out["issue"] = instr / 32.0 / hw.issue_per_clk
    return out


def exp2_phase(hw, elements: float, emulated_fraction: float) -> dict[str, float]:
    """Unit cycles of exp2 over `elements`, a fraction of them emulated on the FMA/ALU pipes.
    Issue: an emulated exp2 is one instruction in place of the MUFU.EX2 plus the polynomial's
    added ones, and those fill the mix's idle slots: each takes mix_fill_slots of a slot."""
    out = exp2_costs(elements, emulated_fraction, hw)
    emu = elements * emulated_fraction
    per_emulated = 1.0 + (EMU_ISSUE[hw.arch] - 1.0) * hw.mix_fill_slots
    out["issue"] = ((elements - emu) * 1.0 + emu * per_emulated) / 32.0 / hw.issue_per_clk
    return out


def mix_limits(hw, op, warps: int = 4):
    """The op as softmax code, with the limits bench_contention's mix measures beyond its pipes'
    rates: its role's `warps` warps (one per scheduler) each issue at most warp_issue_ipc
    instructions per clock, whatever the SM's other warps leave free (unit issue:<role>); k roles'
    warps on a scheduler fill at most 1 - (1 - warp_issue_ipc)^k of its slots (the op's
    concurrency on the SM's issue unit: each warp ready with the probability of its rate alone;
    bench_bursts' mix with emulated exp2s in 1, 2 and 3 warps per scheduler); and its
    dependences keep the MUFU working only mix_mufu_utilization of the time they hold it (its
    duty; with one warp per scheduler the issue limit binds first)."""
    uses = dict(op.uses)
    conc = ()
    if "issue" in uses:
        uses[f"issue:{op.role}"] = uses["issue"] * hw.issue_per_clk / (warps * hw.warp_issue_ipc)
        conc = (("issue", hw.warp_issue_ipc),)
    duty = (("mufu", hw.mix_mufu_utilization),) if uses.get("mufu", 0) > 0 and hw.mix_mufu_utilization < 1 else ()
    return replace(op, uses=tuple(uses.items()), duty=op.duty + duty, concurrency=op.concurrency + conc)


def beside_gemm(hw, roles) -> dict:
    """The engine's interference rules for softmax work beside a running GEMM (unit -> (cause,
    factor)): the MUFU at mufu_under_mma, the SM's issue slots at issue_under_mma, each role's own
    issue at warp_issue_under_mma (all measured by bench_contention)."""
    return {"mufu": ("tensor", hw.mufu_under_mma), "issue": ("tensor", hw.issue_under_mma),
            **{f"issue:{r}": ("tensor", hw.warp_issue_under_mma) for r in roles}}


def add(*parts: dict[str, float]) -> dict[str, float]:
    """Sum unit-cycle dicts (phases that pipeline within one op)."""
    out: dict[str, float] = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + v
    return out


def scaled(part: dict[str, float], factor: float) -> dict[str, float]:
    return {k: v * factor for k, v in part.items()}
