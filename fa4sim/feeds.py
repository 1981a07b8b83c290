"""Feeds and speeds: cycles one Q tile x KV block costs each unit, with no overlap and no latency.

This is the back-of-the-envelope table FA4 is designed from (the FA4 paper's roofline): on B200
a 128 x 128 tile at head dim 128 costs the tensor core 1024 cycles, the MUFU 1024 cycles of
exp2 and shared memory 768 cycles, so exp and MMA tie; on H100 the MMA takes 2048 and exp
still 1024. The schedules' ops are built from the same cost functions.
"""
from __future__ import annotations

from .exp2_emulation import exp2_costs
from .tensor_core import BYTES, mma_cost


def tile_costs(hw, hdim: int = 128, tile_m: int = 128, tile_n: int = 128, exp_emulation: float = 0.0,
               two_cta: bool = False) -> dict[str, float]:
    """Per-SM cycles for S = Q K^T, exp2(S) and O += P V of one tile_m x tile_n tile.

    SM100: the MMAs are 128-row UMMAs, QK from smem (SS), PV with P from TMEM (TS).
    SM90: tile_m/64 warpgroups each issue m64 wgmmas, QK SS and PV with P from registers (RS).
    """
    if hw.arch == "sm90":
        wgs = tile_m // 64
        qk = mma_cost(hw, 64, tile_n, hdim, a_in_smem=True)
        pv = mma_cost(hw, 64, hdim, tile_n, a_in_smem=False)
        mma = wgs * (qk.tensor_cycles + pv.tensor_cycles)
        smem = wgs * (qk.smem_cycles + pv.smem_cycles)
    else:
        qk = mma_cost(hw, tile_m, tile_n, hdim, a_in_smem=True, two_cta=two_cta)
        pv = mma_cost(hw, tile_m, hdim, tile_n, a_in_smem=False, two_cta=two_cta)
        mma = qk.tensor_cycles + pv.tensor_cycles
        smem = qk.smem_cycles + pv.smem_cycles
    exp = exp2_costs(tile_m * tile_n, exp_emulation, hw)
    return {"mma": mma, "exp_mufu": exp["mufu"], "exp_fma": exp["fma"], "exp_alu": exp["alu"], "smem": smem,
            "smem_bytes": smem * hw.smem_bytes_per_clk, "flops": 4.0 * tile_m * tile_n * hdim}


def operand_bytes(hdim: int, tile_m: int, tile_n: int) -> dict[str, int]:
    """Bytes of one tile's operands: Q tile, K block, V block (bf16)."""
    return {"q": tile_m * hdim * BYTES, "k": tile_n * hdim * BYTES, "v": tile_n * hdim * BYTES}
