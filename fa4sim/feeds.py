"""Feeds and speeds: cycles one Q tile x KV block costs each unit, with no overlap and no latency.

This is the back-of-the-envelope table FA4 is designed from (the FA4 paper's roofline): on B200
a 128 x 128 tile at head dim 128 costs the tensor core 1024 cycles, the MUFU 1024 cycles of
exp2 and shared memory 768 cycles, so exp and MMA tie; on H100 the MMA takes 2048 and exp
still 1024. The schedules' ops are built from the same cost functions.

The backward (`bwd_gemms`, `bwd_smem_parts`, `bwd_tile_costs`) is FA4's SM100 backward per KV
tile and Q block: five MMAs, one exp2 per score, and shared memory that on B200 is the wall at
M = N = d = 128 (MMA 2560, shared memory 3328, exp2 1024 cycles; with a CTA pair shared memory
falls to the MMA time).
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


# The five backward MMAs of SM100, as flash_bwd_sm100.py issues them for a CTA that owns tile_n
# keys and visits a Q block of tile_m rows (S and dP come out transposed, keys on M):
#   name: (M rows per SM, N, K, A from shared memory)
BWD_MMAS = ("S", "dP", "dV", "dK", "dQ")


def bwd_gemms(hw, hdim: int = 128, hdim_v: int | None = None, tile_m: int = 128, tile_n: int = 128,
              two_cta: bool = False) -> dict:
    """SM100 backward MMAs per SM for one (KV tile, Q block): name -> MmaCost (cycles per SM).

    S^T = K Q^T and dP^T = V dO^T are SS; dV += P^T dO and dK += dS^T Q take P and dS from TMEM
    (TS); dQ = dS K is SS (dS from shared memory). A CTA pair runs S, dP, dV and dK as M = 256
    MMAs (tile_n keys per SM, each SM staging half of the B operand) and dQ as an M = 128 MMA
    over the pair's 2 tile_n keys (64 query rows per SM, half of K's columns per SM).
    """
    dv = hdim if hdim_v is None else hdim_v
    out = {"S": mma_cost(hw, tile_n, tile_m, hdim, a_in_smem=True, two_cta=two_cta),
           "dP": mma_cost(hw, tile_n, tile_m, dv, a_in_smem=True, two_cta=two_cta),
           "dV": mma_cost(hw, tile_n, dv, tile_m, a_in_smem=False, two_cta=two_cta),
           "dK": mma_cost(hw, tile_n, hdim, tile_m, a_in_smem=False, two_cta=two_cta)}
    if two_cta:
        out["dQ"] = mma_cost(hw, tile_m // 2, hdim, 2 * tile_n, a_in_smem=True, two_cta=True)
    else:
        out["dQ"] = mma_cost(hw, tile_m, hdim, tile_n, a_in_smem=True)
    return out


def bwd_smem_parts(hw, hdim: int = 128, hdim_v: int | None = None, tile_m: int = 128, tile_n: int = 128,
                   two_cta: bool = False) -> dict[str, float]:
    """Shared-memory cycles per SM for one (KV tile, Q block) of the SM100 backward, by cause:

    mma_operands  the five MMAs' operand fetch (bwd_gemms)
    dS_store      the compute warps' st.shared of dS (bf16), the A operand of the dQ MMA
    dS_exchange   CTA pair only: the bulk copy of half of dS to the peer (its read here, and the
                  peer's copy arriving here): each SM's dQ MMA needs the dS of both SMs' keys
    dQ_store      the dQ reduce warps' st.shared of dQ (fp32) into the staging buffer
    dQ_reduce     the TMA bulk reduce-add reading that staging buffer (to global memory)

    TMA loads into shared memory (Q, dO, K, V) are not counted, as in the forward's table;
    neither are the LSE and dPsum reads (broadcast: about 1 % of the total).
    """
    dQ_cols = hdim // (2 if two_cta else 1)  # each SM of a pair holds half of dQ's columns
    parts = {"mma_operands": sum(c.smem_cycles for c in bwd_gemms(hw, hdim, hdim_v, tile_m, tile_n,
                                                                   two_cta).values()),
             "dS_store": tile_n * tile_m * BYTES / hw.smem_bytes_per_clk,
             "dS_exchange": (2 * tile_n * tile_m / 2 * BYTES / hw.smem_bytes_per_clk) if two_cta else 0.0,
             "dQ_store": tile_m * dQ_cols * 4 / hw.smem_bytes_per_clk,
             "dQ_reduce": tile_m * dQ_cols * 4 / hw.smem_bytes_per_clk}
    return parts


def bwd_tile_costs(hw, hdim: int = 128, hdim_v: int | None = None, tile_m: int = 128, tile_n: int = 128,
                   two_cta: bool = False) -> dict[str, float]:
    """Per-SM cycles of one (KV tile of tile_n keys, Q block of tile_m rows) of the SM100
    backward, no overlap: MMA (the five MMAs on the tensor core), exp (P = exp2(S - LSE) on
    the MUFU; the backward emulates none), smem (bwd_smem_parts summed), and the FLOPs the
    tile counts (2.5 x the forward's)."""
    dv = hdim if hdim_v is None else hdim_v
    mma = sum(c.tensor_cycles for c in bwd_gemms(hw, hdim, dv, tile_m, tile_n, two_cta).values())
    smem = sum(bwd_smem_parts(hw, hdim, dv, tile_m, tile_n, two_cta).values())
    exp = exp2_costs(tile_m * tile_n, 0.0, hw)
    return {"mma": mma, "exp_mufu": exp["mufu"], "smem": smem, "smem_bytes": smem * hw.smem_bytes_per_clk,
            "flops": 2.0 * tile_m * tile_n * (3 * hdim + 2 * dv)}
