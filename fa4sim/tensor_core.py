"""The tensor-core model: cycles of one MMA from its shape and the unit rates.

SM90 wgmma: a warpgroup issues m64nNk16 instructions; each uses all 4 tensor cores of the SM for
N/2 cycles at full rate (4096 FLOP/clk). SM100 tcgen05.mma (UMMA): one thread issues M x N x 16
for the CTA (M = 64 or 128; a CTA pair: M = 128 or 256 across two SMs); interval = rows per SM
x N / 256 cycles, a 1-SM M=64 MMA runs at half rate. In both, operands read from shared memory
cost smem bandwidth: an MMA is also bound by (A + B bytes from smem) / smem_bytes_per_clk. An SM90
wgmma's A from registers (RS) takes no bandwidth but counts for the power model
(MmaCost.rf_operand_cycles).
Sources: docs/reference/hardware.md (wgmma, tcgen05 rows) and the PTX ISA.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError

K_STEP = 16  # bf16/fp16 MMA K per instruction
BYTES = 2    # bf16/fp16 element


@dataclass(frozen=True)
class MmaCost:
    """One MMA (a whole M x N x K product, i.e. K/16 instructions), per SM."""

    tensor_cycles: float  # tensor-core occupancy (issue interval at full rate)
    smem_cycles: float    # shared-memory bandwidth the operands take
    latency: float        # completion latency beyond the occupancy
    # the A operand's bytes read from the register file (an SM90 RS wgmma), in shared-memory
    # cycles: they take no shared-memory bandwidth, but draw about the power the same bytes from
    # shared memory draw (lab/findings/power-cards.md, "Operands from registers")
    rf_operand_cycles: float = 0.0

    @property
    def cycles(self) -> float:
        """Occupancy: the MMA cannot go faster than its slowest feed."""
        return max(self.tensor_cycles, self.smem_cycles)


def check_shape(arch: str, m: int, n: int, k: int, two_cta: bool = False) -> None:
    """Raise InputError unless the MMA instruction shape is legal for the architecture."""
    if k <= 0 or k % K_STEP:
        raise InputError("hdim/tile_n", f"MMA K={k} must be a positive multiple of {K_STEP}")
    if arch == "sm90":
        if m % 64:
            raise InputError("tile_m", f"wgmma M is 64 per warpgroup; {m} is not a multiple of 64")
        if not (8 <= n <= 256 and n % 8 == 0):
            raise InputError("tile_n/hdim", f"wgmma N={n} must be 8..256 in steps of 8")
    elif arch == "sm100":
        ms = (128, 256) if two_cta else (64, 128)
        step = 16 if (two_cta or m == 128) else 8
        if m not in ms:
            raise InputError("tile_m", f"tcgen05.mma M={m} must be one of {ms}{' (CTA pair)' if two_cta else ''}")
        if not (step <= n <= 256 and n % step == 0):
            raise InputError("tile_n/hdim", f"tcgen05.mma N={n} must be {step}..256 in steps of {step} for M={m}")
    else:
        raise InputError("arch", f"unknown architecture {arch!r}; allowed: sm90, sm100")


def mma_cost(hw, m: int, n: int, k: int, a_in_smem: bool, b_in_smem: bool = True,
             two_cta: bool = False) -> MmaCost:
    """Cycles for D[m x n] += A[m x k] B[k x n] on one SM.

    m is the rows computed on this SM (a CTA-pair MMA of M=256 computes 128 rows per SM, and
    each SM stages half of B, so B bytes per SM halve).
    """
    flops = 2.0 * m * n * k
    rate = hw.tensor_flops_per_clk
    if hw.arch == "sm100" and m == 64 and not two_cta:
        rate /= 2  # 1-SM M=64 UMMA runs at half rate (hardware.md)
    tensor = flops / rate
    a_bytes = m * k * BYTES if a_in_smem else 0
    b_bytes = (n * k * BYTES if b_in_smem else 0) / (2 if two_cta else 1)
    smem = (a_bytes + b_bytes) / hw.smem_bytes_per_clk
    if two_cta:
        latency = hw.mma_latency_pair
    else:
        latency = hw.mma_latency_ss if a_in_smem else hw.mma_latency_rs
    rf = m * k * BYTES / hw.smem_bytes_per_clk if hw.arch == "sm90" and not a_in_smem else 0.0
    return MmaCost(tensor, smem, latency, rf)
