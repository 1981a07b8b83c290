"""FlashAttention backward for Hopper (SM90) in the CuTe DSL: fa4lab's own kernel.

From q, k, v, dO and the forward's row statistics it computes dQ, dK, dV (FA2/FA3's recompute
scheme: P is recomputed from S and the LSE, never stored).

One CTA = one block of tile_n keys of one (batch, k/v head) (grid: key blocks x k/v heads x
batch; grid_order="tail_lpt": one axis, heads outer but the last heads longest first,
bwd_config.launch_order). Its K and V stay in shared memory while it walks the query blocks
(tile_m rows) that see those keys, for every q head of its GQA group, so dK and dV of a group
are summed in registers. gqa_dkv="reduce": one CTA per key block of each q head instead (the
grid's head axis is the q heads, _walk_heads), its dK and dV added into fp32 accumulators by
RED.ADD from registers at its end (_reduce_dkv); the host zeroes them and casts them to 16 bit.

Warp roles (3 warpgroups):
  warpgroup 0        producer; warp 0 issues every load: K and V once, then Q and dO of each
                     query block into 2-stage mbarrier pipelines (with stats="tma", the default,
                     the block's LSE_log2 and D by bulk copy on the same mbarriers); with
                     dq_reduce="bulk" (default) warp 1 adds dQ into the accumulator; registers
                     dropped with setmaxnreg.
  warpgroups 1, 2    consumers (MMA warpgroups), 64 keys each (the wgmma M axis):
                       S^T  = K Q^T            (SS)      P^T  = exp2(S^T * scale_log2 - LSE_log2)
                       dP^T = V dO^T           (SS)      dS^T = P^T * (dP^T * scale - D)  (ds_scaled; else dP^T - D)
                       dV  += P^T dO           (RS: P^T from registers)
                       dK  += dS^T Q           (RS)
                       dS^T -> shared memory (stmatrix), then dQ = dS K (SS); dQ -> an fp32
                       smem buffer, which producer warp 1 adds into the accumulator with one
                       cp.reduce.async.bulk .add.f32 per dQ warpgroup (the accumulator's query
                       blocks are then in the wgmma fragment order, put back in row order by the
                       host's postprocess); with dq_reduce="red": RED.ADD.F32x2 from every dQ
                       thread into the accumulator instead. mma_order picks the GEMMs' order.
                     dQ's GEMM is split over both warpgroups along head_dim at head_dim 128, by
                     query rows with tile_m=128 (head_dim 64), done by warpgroup 1 alone at 64
                     and 96 otherwise (bwd_config.BwdConfig.dq_wgs). setmaxnreg: 240 per consumer
                     thread, 24 per producer thread.
  epilogue           dK (* softmax_scale unless ds_scaled) and dV -> 16 bit -> shared memory (K's and V's buffers)
                     -> one TMA store each, clipped at seqlen_k.
Head dims 192 and 256 (kv_split, bwd_config.py): tile_n = 64 keys shared by both consumer
warpgroups; S^T and dP^T are split by queries (64 keys x 32 queries each), P^T and dS^T go to
smem (2 buffers each), and dV, dK (SS, from those buffers) and dQ are split by head_dim.

Inputs prepared before the kernel (bwd_preprocess.py; preprocess="kernel": BwdPreprocess, "torch":
torch ops): LSE_log2 = LSE * log2(e) with rows that see no key (LSE = -inf) and the padding rows
set to +inf (so their P is 0), D = rowsum(dO * O) * softmax_scale in fp32 (padding 0) where dS^T
carries the softmax scale and dQ, dK leave their GEMMs scaled (BwdConfig.ds_scaled: one warpgroup
computes dQ, head dim 96); elsewhere D unscaled, dQ and dK multiplied after their GEMMs; both padded to a multiple of tile_m,
as is the dQ accumulator (bwd_postprocess.py turns it into dQ after the kernel).
Causal masking is bottom-right aligned (block_info.py's convention): key j is visible to query i
iff j <= i + seqlen_k - seqlen_q; the key blocks before a CTA's first visible query block are
skipped.
Deterministic builds add into the same accumulator, one key block (CTA pair) at a time per
query block, in a fixed order: a semaphore per (batch, q head, query block) counts the adds done,
and a CTA adds its dQ once the count has reached its turn (FlashBwdSm90._dq_turn), then releases
the next; with a causal mask the key blocks of a head launch last first, so every turn waits only
for CTAs launched before it. With dq_slices > 1 there are that many copies of the accumulator and
its semaphores (along the batch axis), a head's key blocks cut into as many runs, each run taking
its turns in its own copy (_dq_slice); the host sums the copies.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory as cutlass_memory
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, Int64, const_expr
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm, vector
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import dsl_user_op

from ..convert import to_16bit
from ..interop import compile_fake, to_cute, torch_stream, tvm_ffi_enabled
from ..trace_layout import PROBE_SUM_WORDS
from .bwd_config import TAIL_SLOTS, TAIL_WAVES, BwdConfig, grid_heads
from .bwd_postprocess import dq_postprocess, postprocess_kernel, postprocess_varlen
from .bwd_preprocess import preprocess_kernel, preprocess_torch, preprocess_varlen
from .bwd_varlen import padded_length, padded_start
from .gemm import acc_as_operand_a, gemm, mn_view, select, smem_layout, smem_layout_narrow, transpose_view
from .named_barrier import NamedBarrierBwd
from .row_store import store_rows

LOG2_E = math.log2(math.e)


@dsl_user_op
def red_add_f32x2(ptr, a: Float32, b: Float32, *, loc=None, ip=None):
    """*ptr += (a, b): one vector reduction of two adjacent fp32 in global memory (8-byte aligned)."""
    vec = vector.from_elements(ir.VectorType.get([2], Float32.mlir_type),
                               [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                               loc=loc, ip=ip)
    cute.arch.red(ptr, vec, op="add", dtype=Float32, sem="relaxed", scope="gpu", loc=loc, ip=ip)


@dsl_user_op
def bulk_reduce_add_f32(gmem_ptr, smem_ptr, num_bytes: int, *, loc=None, ip=None):
    """gmem[0:num_bytes] += smem[0:num_bytes] (fp32, both 16-byte aligned, num_bytes a multiple
    of 16): one asynchronous bulk reduction, tracked by the issuing thread's bulk groups."""
    llvm.inline_asm(
        None,
        [gmem_ptr.llvm_ptr, smem_ptr.toint(loc=loc, ip=ip).ir_value(), Int32(num_bytes).ir_value()],
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
        "l,r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def st_async_peer_f32x4(smem_ptr, a, b, c, d, mbar_ptr, peer, *, loc=None, ip=None):
    """The peer CTA's shared memory at smem_ptr's offset (16-byte aligned) = (a, b, c, d): one
    st.async that completes its 16 bytes on the peer's mbarrier at mbar_ptr's offset."""
    llvm.inline_asm(
        None,
        [smem_ptr.toint(loc=loc, ip=ip).ir_value(), mbar_ptr.toint(loc=loc, ip=ip).ir_value(),
         Int32(peer).ir_value(loc=loc, ip=ip)] + [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c, d)],
        "{\n.reg .b32 ra, rb;\nmapa.shared::cluster.u32 ra, $0, $2;\nmapa.shared::cluster.u32 rb, $1, $2;\n"
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [ra], {$3, $4, $5, $6}, [rb];\n}",
        "r,r,r,f,f,f,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def bulk_load_g2s(gmem_ptr, smem_ptr, mbar_ptr, num_bytes: int, *, loc=None, ip=None):
    """smem[0:num_bytes] = gmem[0:num_bytes] (both 16-byte aligned, num_bytes a multiple of 16):
    one bulk copy (no tensor map) that completes its bytes on the mbarrier at mbar_ptr."""
    llvm.inline_asm(
        None,
        [gmem_ptr.toint(loc=loc, ip=ip).ir_value(), smem_ptr.toint(loc=loc, ip=ip).ir_value(),
         mbar_ptr.toint(loc=loc, ip=ip).ir_value(), Int32(num_bytes).ir_value()],
        "cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes [$1], [$0], $3, [$2];",
        "l,r,r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def ld_acquire_s32(ptr, *, loc=None, ip=None) -> Int32:
    """*ptr (int32 in global memory), loaded with acquire semantics at gpu scope: the writes
    released before the value was stored are visible to this thread afterwards."""
    return Int32(llvm.inline_asm(
        ir.IntegerType.get_signless(32), [ptr.toint(loc=loc, ip=ip).ir_value()],
        "ld.global.acquire.gpu.b32 $0, [$1];", "=r,l",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def red_release_add_s32(ptr, val: int, *, loc=None, ip=None):
    """*ptr += val (int32 in global memory) with release semantics at gpu scope: the writes this
    thread has seen happen (its CTA's, through a barrier before it) are visible to a thread that
    acquires the new value."""
    llvm.inline_asm(
        None, [ptr.toint(loc=loc, ip=ip).ir_value(), Int32(val).ir_value(loc=loc, ip=ip)],
        "red.release.gpu.global.add.s32 [$0], $1;", "l,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def fence_proxy_async_global(*, loc=None, ip=None):
    """Orders this thread's generic-proxy accesses of global memory with its async-proxy ones
    (bulk reduce-adds) on either side of it."""
    llvm.inline_asm(None, [], "fence.proxy.async.global;", "",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def dq_bulk_offset(row: int, col: int, head_dim: int, dq_wgs: int, rows_split: bool = False) -> int:
    """dq_reduce="bulk": where dQ element (row, col) of a query block (64 x dq_wgs rows x head_dim
    when rows_split, else 64 x head_dim) sits in its fp32 block (smem buffer and accumulator
    alike). Warpgroup w owns the 64 x n floats from w * n * 64 of rows w * 64 .. w * 64 + 63
    (rows_split; n = head_dim) or of columns w * n .. w * n + n - 1 (n = head_dim / dq_wgs); its
    thread t (warp t // 32, lane t % 32) stores accumulator elements 4j .. 4j + 3 at 512 j + 4 t
    (128-bit stores). Element 4j + v of the wgmma accumulator is row 16 (t // 32) + (t % 32) // 4
    + 8 (v // 2), column 8 j + 2 (t % 4) + v % 2 of the warpgroup's 64 x n tile."""
    if rows_split:
        n = head_dim
        w, row = divmod(row, 64)
        c = col
    else:
        n = head_dim // dq_wgs
        w, c = divmod(col, n)
    j, rem = divmod(c, 8)
    lane4, vc = divmod(rem, 2)
    warp, r = divmod(row, 16)
    vr, lane8 = divmod(r, 8)
    t = 32 * warp + 4 * lane8 + lane4
    return w * n * 64 + 512 * j + 4 * t + 2 * vr + vc


def dq_bulk_to_rows(acc, head_dim: int, dq_wgs: int, rows_split: bool = False):
    """The accumulator (..., s_q_pad, head_dim) of dq_reduce="bulk" -> row order (torch view /
    permute; the inverse of dq_bulk_offset within each query block)."""
    *lead, sqp, d = acc.shape
    n = head_dim if rows_split else head_dim // dq_wgs
    rows = 64 * dq_wgs if rows_split else 64
    # block layout: (w, j, warp, lane8, lane4, vr, vc); rows (warp, vr, lane8) and cols
    # (w, j, lane4, vc), or rows (w, warp, vr, lane8) and cols (j, lane4, vc) when rows_split
    x = acc.reshape(*lead, sqp // rows, dq_wgs, n // 8, 4, 8, 4, 2, 2)
    k = len(lead) + 1
    if rows_split:
        x = x.permute(*range(k), k, k + 2, k + 5, k + 3, k + 1, k + 4, k + 6)
    else:
        x = x.permute(*range(k), k + 2, k + 5, k + 3, k, k + 1, k + 4, k + 6)
    return x.reshape(*lead, sqp, d)


class FlashBwdSm90:
    """One compiled variant per BwdConfig."""

    def __init__(self, cfg: BwdConfig):
        self.cfg = cfg
        self.dtype = cutlass.BFloat16 if cfg.dtype == "bfloat16" else cutlass.Float16
        self.hd = cfg.head_dim
        self.tile_m = cfg.tile_m
        self.tile_n = cfg.tile_n
        self.stages = cfg.q_stages
        self.num_wg = cfg.num_consumer_wgs
        self.num_consumer_threads = 128 * self.num_wg
        self.num_threads = cfg.num_threads
        self.dq_wgs = cfg.dq_wgs
        self.causal = cfg.causal
        self.tail_lpt = cfg.grid_order == "tail_lpt"
        self.deterministic = cfg.deterministic
        self.dq_slices = cfg.dq_slices  # > 1: deterministic, copies of the accumulator (_dq_slice)
        self.varlen = cfg.varlen
        assert not (self.varlen and self.tail_lpt), "varlen: heads_outer"
        self.dq_bulk = cfg.dq_reduce == "bulk"
        self.dq_qdo = cfg.dq_smem == "qdo"  # dQ staged in the consumed Q / dO stage (kv_split)
        self.dq_pair = cfg.dq_sum == "pair"  # a 2-CTA cluster sums dQ before the bulk reduce
        self.stats_tma = cfg.stats == "tma"
        self.mma_order = cfg.mma_order
        self.dq_rows_split = cfg.dq_rows_split
        self.kv_split = cfg.kv_split
        self.ds_scaled = cfg.ds_scaled  # dS carries the softmax scale (bwd_config.BwdConfig.ds_scaled)
        # grouped K/V heads: one CTA per key block of each q head; dK, dV added into fp32
        # accumulators (the host turns them into 16 bit)
        self.gqa_reduce = cfg.gqa_dkv == "reduce"
        self.consumer_regs, self.producer_regs = 240, 24  # 24 + 240 + 240 of 512 per lane
        if self.deterministic and self.dq_qdo:
            dq_full_wgs = 1 if self.dq_pair else self.dq_wgs
            assert NamedBarrierBwd.DQ_FULL_STAGE + dq_full_wgs * self.stages <= 16, "named barriers 8..15"

    def _dq_full_id(self, w, stage):
        """The named barrier on which dQ warpgroup w (0 with dq_sum="pair": the owner's) tells
        producer warp 1 that its dQ of a block is staged: DQ_FULL + w, or in the deterministic
        build with dq_smem="qdo" one per (w, Q / dO stage of the block). There warp 1 waits for
        the block's turn and keeps the stage until its adds are written, while the warpgroup can
        already arrive for the next block (its stage was freed a block earlier): on a shared
        barrier those arrivals would complete the phase warp 1 waits in without it (the phases
        slip, the CTA and every later turn hang). The block `stages` later, the next on the same
        barrier, needs this block's stage, freed only after warp 1 has passed this phase."""
        if const_expr(self.deterministic and self.dq_qdo):
            return NamedBarrierBwd.DQ_FULL_STAGE + w * self.stages + stage
        return NamedBarrierBwd.DQ_FULL + w

    def _grid_heads(self, mQ, mK):
        """The grid's head axis: the q heads with gqa_dkv="reduce", else the k/v heads."""
        return mQ.shape[2] if const_expr(self.gqa_reduce) else mK.shape[2]

    def tiled_mmas(self):
        """(S^T / dP^T, dK / dV, dQ) tiled MMAs (call inside @cute.jit code)."""
        dtype = self.dtype
        if const_expr(self.kv_split):
            # S^T and dP^T: the 64 keys on M in both warpgroups, the queries split over them
            tiled_mma_sdp = sm90_helpers.make_trivial_tiled_mma(
                dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
                atom_layout_mnk=(1, self.num_wg, 1), tiler_mn=(64, self.tile_m // self.num_wg),
            )
            # dV += P^T dO, dK += dS^T Q: P^T / dS^T from smem (K-major), head_dim split
            tiled_mma_dkv = sm90_helpers.make_trivial_tiled_mma(
                dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN, Float32,
                atom_layout_mnk=(1, self.num_wg, 1), tiler_mn=(64, self.hd // self.num_wg),
            )
        else:
            # S^T = K Q^T and dP^T = V dO^T: keys on M (64 per warpgroup), queries on N
            tiled_mma_sdp = sm90_helpers.make_trivial_tiled_mma(
                dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
                atom_layout_mnk=(self.num_wg, 1, 1), tiler_mn=(64, self.tile_m),
            )
            # dV += P^T dO, dK += dS^T Q: A from registers, B = dO^T / Q^T (head_dim contiguous: MN-major)
            tiled_mma_dkv = sm90_helpers.make_trivial_tiled_mma(
                dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN, Float32,
                atom_layout_mnk=(self.num_wg, 1, 1), tiler_mn=(64, self.hd),
                a_source=warpgroup.OperandSource.RMEM,
            )
        # dQ = dS K: A = dS (dS^T in smem, queries contiguous: MN-major), B = K^T (MN-major);
        # split over dq_wgs warpgroups by query rows (128-row blocks) or along head_dim
        if const_expr(self.dq_rows_split):
            atom_dq, tiler_dq = (self.dq_wgs, 1, 1), (64, self.hd)
        else:
            atom_dq, tiler_dq = (1, self.dq_wgs, 1), (64, self.hd // self.dq_wgs)
        tiled_mma_dq = sm90_helpers.make_trivial_tiled_mma(
            dtype, dtype, cute.nvgpu.OperandMajorMode.MN, cute.nvgpu.OperandMajorMode.MN, Float32,
            atom_layout_mnk=atom_dq, tiler_mn=tiler_dq,
        )
        return tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq

    # ------------------------------------------------------------------ host side (traced)
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (b, s_q, h, d)
        mK: cute.Tensor,  # (b, s_k, h_kv, d), h_kv divides h
        mV: cute.Tensor,  # (b, s_k, h_kv, d)
        mdO: cute.Tensor,  # (b, s_q, h, d)
        mLSE: cute.Tensor,  # (b, h, s_q_pad) fp32: LSE * log2(e), +inf where P must be 0
        mD: cute.Tensor,  # (b, h, s_q_pad) fp32: rowsum(dO * O)
        mdQaccum: cute.Tensor,  # (dq_slices x b, h, s_q_pad, d) fp32, zeroed
        mdQsem: Optional[cute.Tensor],  # deterministic: (dq_slices x b, h, s_q_pad / tile_m) int32, zeroed; else None
        mdK: cute.Tensor,  # (b, s_k, h_kv, d)
        mdV: cute.Tensor,  # (b, s_k, h_kv, d)
        softmax_scale_log2: Float32,
        softmax_scale: Float32,
        stream,
    ):
        self._host(mQ, mK, mV, mdO, mLSE, mD, mdQaccum, mdQsem, mdK, mdV, softmax_scale_log2, softmax_scale,
                   stream, None)

    @cute.jit
    def _host(self, mQ, mK, mV, mdO, mLSE, mD, mdQaccum, mdQsem, mdK, mdV, softmax_scale_log2, softmax_scale,
              stream, mStamps, var=None):
        """var (the varlen build): (cu_seqlens_q, cu_seqlens_k, max_seqlen_k)."""
        dtype = self.dtype
        # (s, d, h, b): the TMA box walks seqlen x head_dim of one (head, batch)
        mQ, mK, mV, mdO, mdK, mdV = [select(t, [1, 3, 2, 0]) for t in (mQ, mK, mV, mdO, mdK, mdV)]
        mLSE, mD = [select(t, [2, 1, 0]) for t in (mLSE, mD)]  # (s, h, b)
        mdQaccum = select(mdQaccum, [2, 3, 1, 0])  # (s, d, h, b)
        if const_expr(self.deterministic):
            mdQsem = select(mdQsem, [2, 1, 0])  # (query block, h, b)

        tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq = self.tiled_mmas()

        if const_expr(self.kv_split and (self.hd // self.num_wg) % 64 != 0):
            # head_dim 192: each warpgroup's 96 columns of Q^T, dO^T, K^T (MN-major B operands)
            # must be whole swizzle atoms: 32 columns (64-byte swizzle) instead of 64
            sQ_layout = smem_layout_narrow(dtype, self.tile_m, self.hd, self.stages)
            sK_layout = smem_layout_narrow(dtype, self.tile_n, self.hd)
        else:
            sQ_layout = smem_layout(dtype, self.tile_m, self.hd, self.stages)
            sK_layout = smem_layout(dtype, self.tile_n, self.hd)
        sdS_layout = smem_layout(dtype, self.tile_n, self.tile_m, 2)  # dS^T: keys x queries, 2 buffers
        if const_expr(self.dq_qdo):
            # a warpgroup's head_dim columns of a stage must be one contiguous half of it (the
            # swizzle atoms tile the rows first), stages one after the other
            half, stage = self.tile_m * self.hd // 2, self.tile_m * self.hd
            assert cute.crd2idx((0, self.hd // 2, 0), sQ_layout.outer) == half, "dq_smem='qdo': Q layout"
            assert cute.crd2idx((0, 0, 1), sQ_layout.outer) == stage, "dq_smem='qdo': Q layout"

        tma_load = cpasync.CopyBulkTensorTileG2SOp()
        tma_store = cpasync.CopyBulkTensorTileS2GOp()
        sQ_one = cute.select(sQ_layout, mode=[0, 1])
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(tma_load, mQ, sQ_one, (self.tile_m, self.hd), 1)
        tma_atom_dO, tma_dO = cpasync.make_tiled_tma_atom(tma_load, mdO, sQ_one, (self.tile_m, self.hd), 1)
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(tma_load, mK, sK_layout, (self.tile_n, self.hd))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(tma_load, mV, sK_layout, (self.tile_n, self.hd))
        if const_expr(self.gqa_reduce):
            # dK, dV: fp32 accumulators the epilogue adds into from registers (no TMA store; the
            # K and V atoms stand in for the unused ones)
            tma_atom_dK, tma_dK, tma_atom_dV, tma_dV = tma_atom_K, mdK, tma_atom_V, mdV
        else:
            tma_atom_dK, tma_dK = cpasync.make_tiled_tma_atom(tma_store, mdK, sK_layout, (self.tile_n, self.hd))
            tma_atom_dV, tma_dV = cpasync.make_tiled_tma_atom(tma_store, mdV, sK_layout, (self.tile_n, self.hd))

        self.q_bytes = cute.size_in_bytes(dtype, sQ_one)
        self.stat_bytes = self.tile_m * 4 if const_expr(self.stats_tma) else 0  # one query block's LSE / D
        self.kv_bytes = cute.size_in_bytes(dtype, sK_layout)
        stages = self.stages

        # optional buffers have 0 elements when their knob is off
        dq_floats = self.tile_m * self.hd if const_expr(self.dq_bulk and not self.dq_qdo) else 0
        stat_floats = self.tile_m * stages if const_expr(self.stats_tma) else 0

        self.shared_storage = self._shared_storage(dtype, stages, stat_floats, dq_floats, cute.cosize(sK_layout),
                                                   cute.cosize(sQ_layout), cute.cosize(sdS_layout))
        SharedStorage = self.shared_storage

        # varlen: the longest sequence's key blocks x k/v heads (q heads: gqa_dkv="reduce") x sequences
        keys = var[2] if const_expr(self.varlen) else mK.shape[0]
        nz = var[0].shape[0] - 1 if const_expr(self.varlen) else cute.size(mK.shape[3])
        grid_heads = self._grid_heads(mQ, mK)
        grid = (cute.ceil_div(keys, self.tile_n), cute.size(grid_heads), nz)
        cluster = (1, 1, 1)
        if const_expr(self.dq_pair):
            # key blocks in pairs (an odd count gets a CTA past seqlen_k: zero K and V, no output)
            grid = (cute.ceil_div(keys, 2 * self.tile_n) * 2, grid[1], grid[2])
            cluster = (2, 1, 1)
        order_divs = None
        if const_expr(self.tail_lpt):
            grid = (grid[0] * grid[1] * grid[2], 1, 1)  # one axis: _tail_lpt_block decodes it
            # its divisors, made on the host (multiplier and shift): the kernel divides by a
            # multiply-high in the uniform datapath, a few instructions per CTA
            c = 2 if const_expr(self.dq_pair) else 1
            units = cute.ceil_div(mK.shape[0], c * self.tile_n)  # clusters per (batch, grid head)
            g_all = grid_heads * mK.shape[3]
            # bwd_config.tail_heads: at least TAIL_WAVES waves of the clusters that run at once
            tail = cutlass.min(g_all, cutlass.max(1, (TAIL_WAVES * (TAIL_SLOTS // c) + units - 1) // units))
            order_divs = (cute.fast_divmod_create_divisor_v2(units), cute.fast_divmod_create_divisor_v2(tail),
                          cute.fast_divmod_create_divisor_v2(grid_heads))
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V, tma_V,
            # varlen: dK, dV go out by row-predicated stores into the packed tensors themselves
            tma_atom_dK, mdK if const_expr(self.varlen) else tma_dK, tma_atom_dV,
            mdV if const_expr(self.varlen) else tma_dV, mLSE, mD, mdQaccum, mdQsem,
            softmax_scale_log2, softmax_scale, tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq,
            sQ_layout, sK_layout, sdS_layout, mStamps, order_divs, var[:2] if const_expr(self.varlen) else None,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            cluster=cluster,
            stream=stream,
            min_blocks_per_mp=1,
        )

    def _shared_storage(self, dtype, stages, stat_floats, dq_floats, kv_elems, q_elems, ds_elems):
        """The CTA's shared memory struct, fields in this order; kv_split adds 2 P^T buffers
        (laid out as dS^T's) after dS^T."""
        S = cute.struct
        fields = {
            "mbar_kv": S.MemRange[cutlass.Int64, 2],
            "mbar_q": S.MemRange[cutlass.Int64, 2 * stages],
            "mbar_do": S.MemRange[cutlass.Int64, 2 * stages],
            "sLSE": S.Align[S.MemRange[Float32, stat_floats], 128],
            "sD": S.Align[S.MemRange[Float32, stat_floats], 128],
            "sK": S.Align[S.MemRange[dtype, kv_elems], 1024],
            "sV": S.Align[S.MemRange[dtype, kv_elems], 1024],
            "sQ": S.Align[S.MemRange[dtype, q_elems], 1024],
            "sdO": S.Align[S.MemRange[dtype, q_elems], 1024],
            "sdS": S.Align[S.MemRange[dtype, ds_elems], 1024],
        }
        if self.kv_split:
            fields["sP"] = S.Align[S.MemRange[dtype, ds_elems], 1024]
        fields["sdQ"] = S.Align[S.MemRange[Float32, dq_floats], 1024]
        if self.dq_pair:
            # per stage: the peer's dQ half has landed here (1 arrive + tx bytes); then per stage:
            # this CTA's half of the stage is dead at the peer (4 arrives: its other warpgroup)
            fields["mbar_pair"] = S.MemRange[cutlass.Int64, 2 * self.stages]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    # ------------------------------------------------------------------ device side
    @cute.jit
    def _m_block_range(self, n_block, seqlen_q, seqlen_k):
        """(m_block_min, m_block_max) of the query blocks that see some key of key block n_block
        (causal: bottom-right aligned, query i sees key j iff j <= i + seqlen_k - seqlen_q)."""
        m_block_max = cute.ceil_div(seqlen_q, self.tile_m)
        m_block_min = Int32(0)
        if const_expr(self.causal):
            first_row = n_block * self.tile_n - (seqlen_k - seqlen_q)
            m_block_min = cutlass.min(cutlass.max(first_row, 0) // self.tile_m, m_block_max)
        return m_block_min, m_block_max

    @cute.kernel
    def kernel(
        self,
        tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor,
        tma_atom_dO: cute.CopyAtom, mdO: cute.Tensor,
        tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
        tma_atom_V: cute.CopyAtom, mV: cute.Tensor,
        tma_atom_dK: cute.CopyAtom, mdK: cute.Tensor,
        tma_atom_dV: cute.CopyAtom, mdV: cute.Tensor,
        mLSE: cute.Tensor,
        mD: cute.Tensor,
        mdQaccum: cute.Tensor,
        mdQsem,
        softmax_scale_log2: Float32,
        softmax_scale: Float32,
        tiled_mma_sdp: cute.TiledMma,
        tiled_mma_dkv: cute.TiledMma,
        tiled_mma_dq: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sdS_layout: cute.ComposedLayout,
        mStamps,
        order_divs,
        var,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if const_expr(mStamps is not None):
            self._stamp(mStamps, 0)  # the clock probe: this CTA's start
        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_dO, tma_atom_K, tma_atom_V, tma_atom_dK, tma_atom_dV):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass_memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        # Pipelines: the producer warp's one elected thread arms each stage with the TMA byte
        # count; every consumer warp releases a stage with one arrive (lane 0). K and V land
        # once (one stage, never released: one key block per CTA).
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_consumer_threads // 32)
        # dq_smem="qdo": producer warp 1 releases a Q / dO stage (one arrive) once the bulk
        # reduces have read the dQ staged there
        qdo_releasers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1) if const_expr(self.dq_qdo) else consumers
        pipe_kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_kv.data_ptr(), num_stages=1, producer_group=producer,
            consumer_group=consumers, tx_count=2 * self.kv_bytes, defer_sync=True)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=qdo_releasers, tx_count=self.q_bytes + self.stat_bytes, defer_sync=True)
        pipe_do = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_do.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=qdo_releasers, tx_count=self.q_bytes + self.stat_bytes, defer_sync=True)
        mbar_pair = None
        if const_expr(self.dq_pair):
            mbar_pair = storage.mbar_pair.data_ptr()
            if warp_idx == 0:
                with cute.arch.elect_one():
                    for st in cutlass.range_constexpr(self.stages):
                        cute.arch.mbarrier_init(mbar_pair + st, 1)
                        cute.arch.mbarrier_init(mbar_pair + self.stages + st, 4)
        cute.arch.mbarrier_init_fence()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = storage.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        sP = None
        if const_expr(self.kv_split):
            sP = storage.sP.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)  # P^T: as dS^T
        sLSE = sD = None
        if const_expr(self.stats_tma):
            # (query of the block, stage): LSE_log2 / D of the Q / dO stage
            sLSE = storage.sLSE.get_tensor(cute.make_layout((self.tile_m, self.stages)))
            sD = storage.sD.get_tensor(cute.make_layout((self.tile_m, self.stages)))
        sdQ = None
        if const_expr(self.dq_qdo):
            # the stages' raw bytes as fp32: (floats of half a warpgroup's dQ, warpgroup, stage)
            # of dO (first halves) and of Q (second halves); see dq_store
            qdo_layout = cute.make_layout((self.tile_m * self.hd // 4, 2, self.stages))
            sdQ = (cute.make_tensor(cute.recast_ptr(storage.sdO.data_ptr(), dtype=Float32), qdo_layout),
                   cute.make_tensor(cute.recast_ptr(storage.sQ.data_ptr(), dtype=Float32), qdo_layout))
        elif const_expr(self.dq_bulk):
            # (floats of one dQ warpgroup, dQ warpgroups): see dq_bulk_offset
            sdQ = storage.sdQ.get_tensor(
                cute.make_layout((self.tile_m * self.hd // self.dq_wgs, self.dq_wgs)))

        if const_expr(self.dq_pair):
            cute.arch.cluster_arrive_relaxed()  # barrier init visible to both CTAs of the pair
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()  # barrier init visible to everyone

        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        if const_expr(self.varlen):
            # this CTA's sequence: every tensor offset to its first row, the lengths its own
            seqlen_q, seqlen_k, rows = self._varlen_views(var)
            mQ, mdO, mK, mV, mLSE, mD, mdQaccum = [
                cute.domain_offset(r, t) for r, t in zip(rows, (mQ, mdO, mK, mV, mLSE, mD, mdQaccum))]
            if const_expr(self.deterministic):  # (query block, h, b): the sequence's first block
                mdQsem = cute.domain_offset((rows[-1][0] // self.tile_m, 0, 0), mdQsem)
        group = mQ.shape[2] // mK.shape[2]  # q heads per k/v head (GQA / MQA; 1 = MHA)
        n_block, kv_head, batch, pair_rank, m_block_min, n_m, n_iter = self._cta_work(
            seqlen_q, seqlen_k, mQ, mK, group, order_divs)
        # deterministic: (this CTA's key block or pair, their count, mdQsem) for _dq_turn
        c = 2 if const_expr(self.dq_pair) else 1
        order = (n_block // c, cute.ceil_div(seqlen_k, c * self.tile_n), mdQsem, seqlen_q, seqlen_k) \
            if const_expr(self.deterministic) else None
        roles = (tma_atom_Q, mQ, tma_atom_dO, mdO, tma_atom_K, mK, tma_atom_V, mV, tma_atom_dK, mdK, tma_atom_dV, mdV,
                 mLSE, mD, mdQaccum, softmax_scale_log2, softmax_scale, tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq,
                 sQ, sdO, sK, sV, sdS, sdQ, sP, sLSE, sD, pipe_kv, pipe_q, pipe_do, mbar_pair, mStamps,
                 n_block, kv_head, batch, group, pair_rank, m_block_min, n_m, n_iter, seqlen_q, seqlen_k, order, var)
        if const_expr(self.varlen):
            # a key block (pair) past its sequence's keys is done (deterministic causal: the
            # reversed index of one past them is negative, and so may be its pair rank)
            if n_block >= 0 and (n_block - pair_rank) * self.tile_n < seqlen_k:
                self._roles(*roles)
            if const_expr(not self.gqa_reduce):  # "reduce": the host zeroed the accumulators
                self._zero_key_tail(mdK, mdV, var)
        else:
            self._roles(*roles)

    @cute.jit
    def _varlen_views(self, var):
        """Varlen build: (seqlen_q, seqlen_k, rows) of this CTA's sequence (blockIdx.z), rows the
        domain offsets of Q, dO, K, V (their packed rows), LSE, D and the dQ accumulator (the
        queries padded per sequence to whole query blocks: sm90/bwd_varlen.py); dK and dV are
        offset in the epilogue."""
        mCuQ, mCuK = var
        seq = cute.arch.block_idx()[2]
        # one value per CTA: in uniform registers, not in the consumers' (hd256 runs at their limit)
        uni = cute.arch.make_warp_uniform
        off_q, off_k = uni(mCuQ[seq]), uni(mCuK[seq])
        pad_q = padded_start(off_q, seq, self.tile_m)
        r4 = lambda r: (r, 0, 0, 0)  # noqa: E731  (s, d, h, b)
        rows = (r4(off_q), r4(off_q), r4(off_k), r4(off_k), (pad_q, 0, 0), (pad_q, 0, 0), r4(pad_q))
        return uni(mCuQ[seq + 1]) - off_q, uni(mCuK[seq + 1]) - off_k, rows

    @cute.jit
    def _zero_key_tail(self, mdK, mdV, var):
        """Varlen build: rows of dK and dV past the last sequence's keys (a tail the packed tensors
        may carry) are zero, written by the first CTA of each k/v head of the last sequence (no
        other CTA owns them; usually there are none)."""
        mCuK = var[1]
        bx, kv_head, seq = cute.arch.block_idx()
        if bx == 0 and seq == mCuK.shape[0] - 2:
            first = mCuK[seq + 1] * self.hd
            for i in cutlass.range(first + cute.arch.thread_idx()[0], mdK.shape[0] * self.hd, self.num_threads):
                r = i // self.hd
                mdK[r, i - r * self.hd, kv_head, 0] = self.dtype(0.0)
                mdV[r, i - r * self.hd, kv_head, 0] = self.dtype(0.0)

    @cute.jit
    def _roles(self, tma_atom_Q, mQ, tma_atom_dO, mdO, tma_atom_K, mK, tma_atom_V, mV, tma_atom_dK, mdK, tma_atom_dV,
               mdV, mLSE, mD, mdQaccum, softmax_scale_log2, softmax_scale, tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq,
               sQ, sdO, sK, sV, sdS, sdQ, sP, sLSE, sD, pipe_kv, pipe_q, pipe_do, mbar_pair, mStamps,
               n_block, kv_head, batch, group, pair_rank, m_block_min, n_m, n_iter, seqlen_q, seqlen_k, order, var):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx < 4:
            # ---------------------------------------------------------------- producer WG
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer(tma_atom_Q, mQ, tma_atom_dO, mdO, tma_atom_K, mK, tma_atom_V, mV,
                              mLSE, mD, sQ, sdO, sK, sV, sLSE, sD, pipe_kv, pipe_q, pipe_do,
                              n_block, kv_head, batch, group, m_block_min, n_m, n_iter)
            if const_expr(self.dq_bulk):
                if warp_idx == 1:
                    if const_expr(self.dq_slices > 1):
                        # worked out by the warp that adds (at head dim 256 the consumers have no
                        # register to spare): the copy it adds into, its turns within the run
                        mdQaccum, order = self._dq_slice(order, mdQaccum, mQ.shape[3])
                    self.dq_store(mdQaccum, sdQ, pipe_q, pipe_do, kv_head, batch, group, m_block_min, n_m,
                                  n_iter, order, pair_rank)
        else:
            # ---------------------------------------------------------------- consumer WGs
            if const_expr(self.dq_slices > 1 and not self.dq_bulk):
                mdQaccum, order = self._dq_slice(order, mdQaccum, mQ.shape[3])  # dq_reduce="red": they add
            args = (
                tma_atom_dK, mdK, tma_atom_dV, mdV, mLSE, mD, mdQaccum,
                softmax_scale_log2, softmax_scale, tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq,
                sQ, sdO, sK, sV, sdS, sdQ, sLSE, sD, pipe_kv, pipe_q, pipe_do,
                n_block, kv_head, batch, group, m_block_min, n_m, n_iter, seqlen_q, seqlen_k, sP,
                (pair_rank, mbar_pair), order, var,
            )
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consumer(*args)
            if const_expr(mStamps is not None):
                self._stamp(mStamps, 2)  # after the epilogue's dK / dV stores: this CTA's end

    @cute.jit
    def _cta_work(self, seqlen_q, seqlen_k, mQ, mK, group, order_divs):
        """This CTA's (key block, grid head, batch, pair rank, first query block, query blocks,
        (q head, query block) iterations), from its block index in the grid_order's grid (varlen:
        blockIdx.z is the sequence, the batch row 0). The grid's heads are the k/v heads, whose
        CTAs walk their group's q heads, or with gqa_dkv="reduce" the q heads (_walk_heads)."""
        if const_expr(self.tail_lpt):
            n_block, grid_head, batch = self._tail_lpt_block(mQ, mK, order_divs)
        else:
            n_block, grid_head, batch = cute.arch.block_idx()
            if const_expr(self.varlen):
                batch = Int32(0)
            if const_expr(self.deterministic and self.causal):
                # the key blocks (pairs) of a (batch, k/v head) launch last first: see _dq_turn
                c = 2 if const_expr(self.dq_pair) else 1
                units = cute.ceil_div(seqlen_k, c * self.tile_n)
                n_block = (units - 1 - n_block // c) * c + n_block % c
        pair_rank = Int32(0)
        n_first = n_block  # the first key block of the CTA (of the pair): where its query blocks start
        if const_expr(self.dq_pair):
            pair_rank = n_block % 2  # the cluster (2, 1, 1) runs along the key blocks
            n_first = n_block - pair_rank
        m_block_min, m_block_max = self._m_block_range(n_first, seqlen_q, seqlen_k)
        n_m = m_block_max - m_block_min
        # (q head, query block) pairs, query block fastest: the group's q heads, or one ("reduce")
        n_iter = n_m if const_expr(self.gqa_reduce) else group * n_m
        return n_block, grid_head, batch, pair_rank, m_block_min, n_m, n_iter

    @cute.jit
    def _walk_heads(self, grid_head, group):
        """(k/v head, first q head of the walk) of a CTA on the grid's head grid_head: the k/v head
        and its group's first q head, or with gqa_dkv="reduce" the q head's k/v head and the q
        head. Each role works it out where it starts (held from the CTA's start, a value more
        spills at head dim 256)."""
        if const_expr(self.gqa_reduce):
            return cute.arch.make_warp_uniform(grid_head // group), grid_head
        return grid_head, grid_head * group

    @cute.jit
    def _tail_lpt_block(self, mQ, mK, order_divs):
        """grid_order="tail_lpt": (key block, k/v head, batch) of this CTA from its index on the
        one-axis grid (bwd_config.launch_order in plain Python). Clusters of c CTAs (adjacent key
        blocks) are numbered p = x // c: heads_outer order (p // units, p % units) for all but
        the last `tail` (batch, k/v head)s, whose clusters go key block by key block across them
        (longest first with a causal mask). order_divs: the host's divisors by units, tail and
        k/v heads."""
        div_units, div_tail, div_heads = order_divs
        c = 2 if const_expr(self.dq_pair) else 1
        x = cute.arch.block_idx()[0]
        units, tail = div_units.divisor, div_tail.divisor
        g_all = self._grid_heads(mQ, mK) * mK.shape[3]
        p = x // c
        head_part = (g_all - tail) * units
        g_head, j_head = divmod(p, div_units)
        j_tail, g_tail = divmod(cutlass.max(p - head_part, 0), div_tail)
        in_tail = p >= head_part
        g = cutlass.select_(in_tail, g_all - tail + g_tail, g_head)
        j = cutlass.select_(in_tail, j_tail, j_head)
        batch, kv_head = divmod(g, div_heads)
        if const_expr(self.deterministic and self.causal):
            j = units - 1 - j  # the last key block (pair) first: see _dq_turn
        return j * c + x % c, kv_head, batch

    @cute.jit
    def _stamp(self, mStamps, at: cutlass.Constexpr):
        """The clock probe (FlashBwdSm90Probe): one thread writes clock64 and globaltimer (ns) into
        words at, at + 1 of this CTA's row of 4: at 0 thread 0 (kernel start), at 2 thread 128
        (the first consumer thread, whose warp issued the dK / dV stores). At its end the CTA also
        adds its span to three running sums in the buffer's last PROBE_SUM_WORDS words (cycles, ns,
        CTAs; relaxed atomic adds, several CTAs end at once), which add up over launches until the
        host zeroes them."""
        writer = 0 if const_expr(at == 0) else 128
        if cute.arch.thread_idx()[0] == Int32(writer):
            bx, by, bz = cute.arch.block_idx()
            gx, gy, _ = cute.arch.grid_dim()
            row = (bz * gy + by) * gx + bx
            c = cute.arch.clock64()
            g = cute.arch.globaltimer()
            mStamps[row * 4 + at] = c
            mStamps[row * 4 + at + 1] = g
            if const_expr(at == 2):  # the start words came from thread 0 before the CTA's first barrier
                sums = cute.size(mStamps) - PROBE_SUM_WORDS  # the buffer's last words
                for w, v in ((0, c - mStamps[row * 4]), (1, g - mStamps[row * 4 + 1]), (2, Int64(1))):
                    cute.arch.red(mStamps.iterator + sums + w, cutlass.Uint64(v), op="add", dtype=cutlass.Uint64,
                                  sem="relaxed", scope="gpu")

    @cute.jit
    def producer(self, tma_atom_Q, mQ, tma_atom_dO, mdO, tma_atom_K, mK, tma_atom_V, mV, mLSE, mD,
                 sQ, sdO, sK, sV, sLSE, sD, pipe_kv, pipe_q, pipe_do,
                 n_block, kv_head, batch, group, m_block_min, n_m, n_iter):
        kv_head, head = self._walk_heads(kv_head, group)
        gK = cute.local_tile(mK[None, None, kv_head, batch], (self.tile_n, self.hd), (n_block, 0))
        gV = cute.local_tile(mV[None, None, kv_head, batch], (self.tile_n, self.hd), (n_block, 0))
        tKsK, tKgK = cpasync.tma_partition(
            tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(
            tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_kv.producer_acquire(kv_state)
        cute.copy(tma_atom_K, tKgK, tKsK, tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
        cute.copy(tma_atom_V, tVgV, tVsV, tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        m_block = m_block_min
        for _it in cutlass.range(n_iter, unroll=1):
            gQ = cute.local_tile(mQ[None, None, head, batch], (self.tile_m, self.hd), (None, 0))
            gdO = cute.local_tile(mdO[None, None, head, batch], (self.tile_m, self.hd), (None, 0))
            tQsQ, tQgQ = cpasync.tma_partition(
                tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
            tdOsdO, tdOgdO = cpasync.tma_partition(
                tma_atom_dO, 0, cute.make_layout(1), cute.group_modes(sdO, 0, 2), cute.group_modes(gdO, 0, 2))
            pipe_q.producer_acquire(state)
            cute.copy(tma_atom_Q, tQgQ[None, m_block], tQsQ[None, state.index],
                      tma_bar_ptr=pipe_q.producer_get_barrier(state))
            if const_expr(self.stats_tma):
                gLSE = cute.local_tile(mLSE[None, head, batch], (self.tile_m,), (m_block,))
                with cute.arch.elect_one():
                    bulk_load_g2s(gLSE.iterator, sLSE[None, state.index].iterator,
                                  pipe_q.producer_get_barrier(state), self.stat_bytes)
            pipe_do.producer_acquire(state)
            cute.copy(tma_atom_dO, tdOgdO[None, m_block], tdOsdO[None, state.index],
                      tma_bar_ptr=pipe_do.producer_get_barrier(state))
            if const_expr(self.stats_tma):
                gD = cute.local_tile(mD[None, head, batch], (self.tile_m,), (m_block,))
                with cute.arch.elect_one():
                    bulk_load_g2s(gD.iterator, sD[None, state.index].iterator,
                                  pipe_do.producer_get_barrier(state), self.stat_bytes)
            state.advance()
            m_block, head = self._next_block(m_block, head, m_block_min, n_m)

    @cute.jit
    def _next_block(self, m_block, head, m_block_min, n_m):
        """The (query block, q head) after this one: query blocks fastest, then the q heads of the
        GQA group (carried across iterations: no integer division in the loop)."""
        m_block = m_block + 1
        if m_block == m_block_min + n_m:
            m_block = m_block_min
            head = head + 1
        return m_block, head

    @cute.jit
    def _dq_slice(self, order, mdQaccum, batches):
        """dq_slices > 1: a head's key blocks (pairs) are cut into dq_slices contiguous runs of
        ceil(units / dq_slices) (the last ones shorter or empty); run r adds into copy r of the
        accumulator and of its semaphores, at batch index r * batches + batch (the host sums the
        copies), each query block's adds in turns within the run. Returns the copy's accumulator
        and _dq_turn's order for a head whose keys are the run's alone: the unit's index in the run,
        the run's units, the copy's semaphores, and the keys counted from the run's first, so that
        the causal count of units that see a query block is the run's (bwd_config.dq_slice)."""
        unit, units, mdQsem, seqlen_q, seqlen_k = order
        c = 2 if const_expr(self.dq_pair) else 1
        run = cutlass.max((units + self.dq_slices - 1) // self.dq_slices, 1)  # a power of two: a shift
        copy = unit // run  # the one division of the CTA
        first = copy * run
        mdQaccum = cute.domain_offset((0, 0, 0, copy * batches), mdQaccum)
        mdQsem = cute.domain_offset((0, 0, copy * batches), mdQsem)
        order = (unit - first, cutlass.min(run, units - first), mdQsem, seqlen_q, seqlen_k - first * c * self.tile_n)
        return mdQaccum, order

    @cute.jit
    def _dq_turn(self, m_block, head, batch, order):
        """deterministic: (the semaphore of query block m_block of q head `head`, the count it must
        reach before this CTA adds its dQ there). The dQ of a query block is added by one key
        block (pair: both CTAs, each its half of head_dim) at a time, in launch order, so a CTA
        only waits for CTAs launched before it. Without a mask every key block sees every query
        block: key block (pair) u goes u-th, after c u adds (c = CTAs per pair). Causal: the key
        blocks launch last first (_cta_work) and query block m is seen by the first n_max(m) of
        them (those whose first query block is at most m, _m_block_range), so u goes after the
        c (n_max(m) - 1 - u) adds of those above it: the CTA on the diagonal adds its first query
        block at once, the next one's turn comes one block later, and so on."""
        unit, units, mdQsem, seqlen_q, seqlen_k = order
        c = 2 if const_expr(self.dq_pair) else 1
        turn = unit * c
        if const_expr(self.causal):
            # key block n sees query block m iff n tile_n < (m + 1) tile_m + seqlen_k - seqlen_q
            reach = cutlass.max((m_block + 1) * self.tile_m + seqlen_k - seqlen_q, 0)
            n_max = cutlass.min(units, (reach + c * self.tile_n - 1) // (c * self.tile_n))
            turn = (n_max - 1 - unit) * c
        sem = cute.local_tile(mdQsem[None, head, batch], (1,), (m_block,)).iterator
        return sem, turn

    @cute.jit
    def _dq_wait_turn(self, sem, turn):
        """One thread spins on the semaphore (acquire loads) until it has reached `turn`: the adds
        released before are visible to it (and, through a barrier, to its CTA)."""
        seen = ld_acquire_s32(sem)
        while seen < turn:
            seen = ld_acquire_s32(sem)

    @cute.jit
    def dq_store(self, mdQaccum, sdQ, pipe_q, pipe_do, kv_head, batch, group, m_block_min, n_m, n_iter, order,
                 pair_rank):
        """dq_reduce="bulk", producer warp 1: per query block and dQ warpgroup w, free w's smem
        buffer (its last bulk reduce has read it), wait until w has written dQ there, and add it
        into the accumulator with one bulk reduction of tile_m x head_dim / dq_wgs floats. The
        accumulator is contiguous (run_bwd allocates it), so a query block is tile_m x head_dim
        consecutive floats. dq_smem="qdo": w's dQ sits in the block's Q / dO stage (first half in
        w's columns of dO, second half in those of Q): two bulk reductions per warpgroup, then,
        once both warpgroups' have read the stage, its release to the loads. Deterministic: the
        block's adds wait for its turn (_dq_turn; spun by the elected lane, which issues them;
        with qdo after the block's barriers, one per stage: _dq_full_id), are waited for until
        written, and then the semaphore is released one further."""
        chunk = self.tile_m * self.hd // self.dq_wgs
        sync_threads = 128 + 32
        kv_head, head = self._walk_heads(kv_head, group)
        m_block = m_block_min
        if const_expr(self.dq_qdo):
            sdQ_dO, sdQ_Q = sdQ
            half = chunk // 2
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            for _it in cutlass.range(n_iter, unroll=1):
                gdQ = cute.local_tile(mdQaccum[None, None, head, batch], (self.tile_m, self.hd), (m_block, 0))
                # deterministic: the block's barriers (one per stage: _dq_full_id), then its turn
                if const_expr(self.dq_pair):
                    # the pair's sum of this CTA's columns (warpgroup pair_rank's), nothing else
                    cute.arch.barrier(barrier_id=self._dq_full_id(0, state.index), number_of_threads=sync_threads)
                    if const_expr(self.deterministic):
                        sem, turn = self._dq_turn(m_block, head, batch, order)
                        self._dq_acquire(sem, turn)
                    with cute.arch.elect_one():
                        bulk_reduce_add_f32(gdQ.iterator + pair_rank * chunk,
                                            sdQ_dO[None, pair_rank, state.index].iterator, half * 4)
                        bulk_reduce_add_f32(gdQ.iterator + pair_rank * chunk + half,
                                            sdQ_Q[None, pair_rank, state.index].iterator, half * 4)
                elif const_expr(self.deterministic):
                    for w in cutlass.range_constexpr(self.dq_wgs):  # every warpgroup's dQ staged first
                        cute.arch.barrier(barrier_id=self._dq_full_id(w, state.index), number_of_threads=sync_threads)
                    sem, turn = self._dq_turn(m_block, head, batch, order)
                    self._dq_acquire(sem, turn)
                    for w in cutlass.range_constexpr(self.dq_wgs):
                        with cute.arch.elect_one():
                            bulk_reduce_add_f32(gdQ.iterator + w * chunk, sdQ_dO[None, w, state.index].iterator,
                                                half * 4)
                            bulk_reduce_add_f32(gdQ.iterator + w * chunk + half,
                                                sdQ_Q[None, w, state.index].iterator, half * 4)
                else:
                    for w in cutlass.range_constexpr(self.dq_wgs):
                        cute.arch.barrier(barrier_id=NamedBarrierBwd.DQ_FULL + w, number_of_threads=sync_threads)
                        with cute.arch.elect_one():
                            bulk_reduce_add_f32(gdQ.iterator + w * chunk, sdQ_dO[None, w, state.index].iterator,
                                                half * 4)
                            bulk_reduce_add_f32(gdQ.iterator + w * chunk + half,
                                                sdQ_Q[None, w, state.index].iterator, half * 4)
                cute.arch.cp_async_bulk_commit_group()
                if const_expr(self.deterministic):
                    self._dq_release(sem)  # written: read too, the stage is free
                else:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)  # the stage is read: free for loads
                pipe_q.consumer_release(state)
                pipe_do.consumer_release(state)
                state.advance()
                m_block, head = self._next_block(m_block, head, m_block_min, n_m)
        else:
            for _it in cutlass.range(n_iter, unroll=1):
                gdQ = cute.local_tile(mdQaccum[None, None, head, batch], (self.tile_m, self.hd), (m_block, 0))
                for w in cutlass.range_constexpr(self.dq_wgs):
                    if const_expr(not self.deterministic):  # deterministic: all written at the last block's end
                        cute.arch.cp_async_bulk_wait_group(self.dq_wgs - 1 - w, read=True)
                    cute.arch.barrier_arrive(barrier_id=NamedBarrierBwd.DQ_EMPTY + w, number_of_threads=sync_threads)
                if const_expr(self.deterministic):
                    sem, turn = self._dq_turn(m_block, head, batch, order)
                    self._dq_acquire(sem, turn)
                for w in cutlass.range_constexpr(self.dq_wgs):
                    cute.arch.barrier(barrier_id=NamedBarrierBwd.DQ_FULL + w, number_of_threads=sync_threads)
                    with cute.arch.elect_one():
                        bulk_reduce_add_f32(gdQ.iterator + w * chunk, sdQ[None, w].iterator, chunk * 4)
                    cute.arch.cp_async_bulk_commit_group()
                if const_expr(self.deterministic):
                    self._dq_release(sem)
                m_block, head = self._next_block(m_block, head, m_block_min, n_m)
        cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _dq_acquire(self, sem, turn):
        """deterministic, producer warp 1: its elected lane (the one that issues the bulk reduces)
        waits for the query block's turn; the proxy fence puts its acquire before those (async
        proxy) adds."""
        with cute.arch.elect_one():
            self._dq_wait_turn(sem, turn)
            fence_proxy_async_global()
        cute.arch.sync_warp()

    @cute.jit
    def _dq_release(self, sem):
        """deterministic, producer warp 1: wait until the bulk reduces of the query block are
        written (not only read), then its elected lane, which issued them, releases the next turn."""
        cute.arch.cp_async_bulk_wait_group(0, read=False)
        with cute.arch.elect_one():
            fence_proxy_async_global()
            red_release_add_s32(sem, 1)
        cute.arch.sync_warp()

    @cute.jit
    def _dq_to_smem(self, acc_dQ, sdQ, dq_tidx):
        """dq_reduce="bulk", a dQ warpgroup: wait for its smem buffer to be free, store its dQ
        accumulator there (128-bit stores, fragment order: dq_bulk_offset) and signal warp 1."""
        w = dq_tidx // 128
        copy = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128),
            cute.make_layout((128, self.dq_wgs)), cute.make_layout(4))
        tdQsdQ = copy.get_slice(dq_tidx).partition_D(sdQ)
        src = cute.make_tensor(acc_dQ.iterator, cute.make_layout(tdQsdQ.shape))
        cute.arch.barrier(barrier_id=NamedBarrierBwd.DQ_EMPTY + w, number_of_threads=128 + 32)
        cute.copy(copy, src, tdQsdQ)
        cute.arch.fence_view_async_shared()  # generic-proxy writes -> the bulk copy (async proxy)
        cute.arch.barrier_arrive(barrier_id=NamedBarrierBwd.DQ_FULL + w, number_of_threads=128 + 32)

    @cute.jit
    def _pair_dq(self, acc_dQ, sdQ, dq_tidx, pair, state, dk_in_flight: cutlass.Constexpr):
        """dq_sum="pair": warpgroup `rank` owns its head_dim columns of dQ in this CTA, the other
        warpgroup's columns are owned by the peer CTA. Regions: a warpgroup's columns of the stage
        (dO's hold the first half of its floats, Q's the second); region w is dead here once
        warpgroup w's dV and dK are done. The other warpgroup (sender) says so to the peer, waits
        until the peer says the same of its region 1 - w, and st.asyncs its dQ there (the peer's
        owner's columns); the owner waits for the peer's partial in its own region 1 - w, adds it,
        and stages the sum in region w for producer warp 1's bulk reduces."""
        _, mbar = pair
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())  # read here: no register held across the loop
        w = dq_tidx // 128
        t = dq_tidx % 128
        stage, phase = state.index, state.phase
        full = mbar + stage  # the peer's partial has landed in region 1 - rank
        free = mbar + self.stages + stage  # the peer's region 1 - w is dead (its sender's 4 warps)
        if w == rank:
            if t == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(full, self.tile_m * self.hd * 2)  # half of 64 x hd fp32
            cute.arch.mbarrier_wait(full, phase)
            self._dq_half_add_smem(acc_dQ, sdQ[0][None, 1 - w, stage], t, 0)
            self._dq_half_add_smem(acc_dQ, sdQ[1][None, 1 - w, stage], t, 1)
            self._dq_half_to_smem(acc_dQ, sdQ[0][None, w, stage], t, 0)
            if const_expr(dk_in_flight):
                warpgroup.wait_group(0)
            self._dq_half_to_smem(acc_dQ, sdQ[1][None, w, stage], t, 1)
            cute.arch.fence_view_async_shared()  # generic-proxy writes -> the bulk copy (async proxy)
            cute.arch.barrier_arrive(barrier_id=self._dq_full_id(0, stage), number_of_threads=128 + 32)
        else:
            if const_expr(dk_in_flight):
                warpgroup.wait_group(0)  # dV and dK done: region w is dead here
            if t % 32 == 0:
                cute.arch.mbarrier_arrive(free, peer_cta_rank_in_cluster=1 - rank)
            cute.arch.mbarrier_wait(free, phase)
            self._dq_half_to_peer(acc_dQ, sdQ[0][None, 1 - w, stage], t, 0, full, 1 - rank)
            self._dq_half_to_peer(acc_dQ, sdQ[1][None, 1 - w, stage], t, 1, full, 1 - rank)

    def _dq_half_copy(self):
        """The 128-bit copy of a dQ half: thread t's 4 floats at 4 t + 512 k, k < 8 (at 256)."""
        return cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128),
            cute.make_layout(128), cute.make_layout(4))

    @cute.jit
    def _dq_half_add_smem(self, acc_dQ, src, wg_tidx, half: cutlass.Constexpr):
        """dq_sum="pair": half `half` of the accumulator += src (the peer's floats, same order)."""
        tS = self._dq_half_copy().get_slice(wg_tidx).partition_S(src)
        n = cute.size(acc_dQ) // 2
        flat = cute.make_tensor(acc_dQ.iterator, cute.make_layout(2 * n))
        for k in cutlass.range_constexpr(n // 4):  # 4 floats at a time: few live registers
            r = cute.make_tensor(tS.iterator + cute.crd2idx(4 * k, tS.layout), cute.make_layout(4)).load()
            for v in cutlass.range_constexpr(4):
                flat[half * n + 4 * k + v] = flat[half * n + 4 * k + v] + r[v]

    @cute.jit
    def _dq_half_to_peer(self, acc_dQ, dst, wg_tidx, half: cutlass.Constexpr, mbar, peer):
        """dq_sum="pair": half `half` of the accumulator -> dst's offsets in the peer CTA (st.async,
        completing on the peer's mbarrier at mbar's offset)."""
        tD = self._dq_half_copy().get_slice(wg_tidx).partition_D(dst)
        n = cute.size(acc_dQ) // 2
        flat = cute.make_tensor(acc_dQ.iterator, cute.make_layout(2 * n))
        for k in cutlass.range_constexpr(n // 4):
            i = half * n + 4 * k
            st_async_peer_f32x4(tD.iterator + cute.crd2idx(4 * k, tD.layout),
                                flat[i], flat[i + 1], flat[i + 2], flat[i + 3], mbar, peer)

    @cute.jit
    def _dq_half_to_smem(self, acc_dQ, dst, wg_tidx, half: cutlass.Constexpr):
        """dq_smem="qdo": half `half` of a dQ warpgroup's accumulator -> dst (its floats, in the
        fragment order of _dq_to_smem, whose first / second half they are)."""
        copy = self._dq_half_copy()
        tD = copy.get_slice(wg_tidx).partition_D(dst)
        both = cute.make_tensor(acc_dQ.iterator, cute.make_layout((cute.size(acc_dQ) // 2, 2)))
        src = cute.make_tensor(both[None, half].iterator, cute.make_layout(tD.shape))
        cute.copy(copy, src, tD)

    @cute.jit
    def consumer(
        self, tma_atom_dK, mdK, tma_atom_dV, mdV, mLSE, mD, mdQaccum,
        scale_log2, softmax_scale, tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq,
        sQ, sdO, sK, sV, sdS, sdQ, sLSE, sD, pipe_kv, pipe_q, pipe_do,
        n_block, kv_head, batch, group, m_block_min, n_m, n_iter, seqlen_q, seqlen_k, sP, pair, order, var=None,
    ):
        """Every consumer warpgroup runs this code; which of them runs dQ is decided at run time
        when only one does."""
        tidx = cute.arch.thread_idx()[0] - 128
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        wg_slice = wg_idx * 128
        thr_mma_sdp = tiled_mma_sdp.get_slice(tidx)
        wg_mma_sdp = tiled_mma_sdp.get_slice(wg_slice)
        wg_mma_dkv = tiled_mma_dkv.get_slice(wg_slice)
        # the dQ GEMM's warpgroups (all, or warpgroup 0 alone): their slice of head_dim
        dq_tidx = tidx if const_expr(self.dq_wgs == self.num_wg) else tidx % 128
        wg_mma_dq = tiled_mma_dq.get_slice(wg_slice if const_expr(self.dq_wgs == self.num_wg) else 0)
        thr_mma_dq = tiled_mma_dq.get_slice(dq_tidx)

        # smem operands (wgmma descriptors)
        tSrK = wg_mma_sdp.make_fragment_A(wg_mma_sdp.partition_A(sK))
        tSrQ = wg_mma_sdp.make_fragment_B(wg_mma_sdp.partition_B(sQ))
        tdPrV = wg_mma_sdp.make_fragment_A(wg_mma_sdp.partition_A(sV))
        tdPrdO = wg_mma_sdp.make_fragment_B(wg_mma_sdp.partition_B(sdO))
        tdVrdOt = wg_mma_dkv.make_fragment_B(wg_mma_dkv.partition_B(transpose_view(sdO)))
        tdKrQt = wg_mma_dkv.make_fragment_B(wg_mma_dkv.partition_B(transpose_view(sQ)))
        tdQrdS = wg_mma_dq.make_fragment_A(wg_mma_dq.partition_A(transpose_view(sdS)))  # (.., buffer)
        tdQrKt = wg_mma_dq.make_fragment_B(wg_mma_dq.partition_B(transpose_view(sK)))

        # registers
        s_shape = wg_mma_sdp.partition_shape_C((self.tile_n, self.tile_m))
        acc_dK = cute.make_rmem_tensor(wg_mma_dkv.partition_shape_C((self.tile_n, self.hd)), Float32)
        acc_dV = cute.make_rmem_tensor(wg_mma_dkv.partition_shape_C((self.tile_n, self.hd)), Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        acc_dQ = cute.make_rmem_tensor(wg_mma_dq.partition_shape_C((self.tile_m, self.hd)), Float32)
        if const_expr(self.kv_split):
            # P^T and dS^T as smem operands (.., buffer)
            tdVrP = wg_mma_dkv.make_fragment_A(wg_mma_dkv.partition_A(sP))
            tdKrdS = wg_mma_dkv.make_fragment_A(wg_mma_dkv.partition_A(sdS))
        else:
            tdVrP = cute.make_rmem_tensor(wg_mma_dkv.partition_shape_A((self.tile_n, self.tile_m)), self.dtype)
            tdKrdS = cute.make_rmem_tensor(wg_mma_dkv.partition_shape_A((self.tile_n, self.tile_m)), self.dtype)

        # dS^T registers -> smem (stmatrix), in the S^T accumulator's layout
        stmatrix = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        smem_thr_copy_dS = cute.make_tiled_copy_C(stmatrix, tiled_mma_sdp).get_slice(tidx)
        tdSsdS = smem_thr_copy_dS.partition_D(sdS)
        tPsP = smem_thr_copy_dS.partition_D(sP) if const_expr(self.kv_split) else None

        # (key, query) coordinates of this thread's S^T elements, in (rows, cols) order
        cS = cute.make_identity_tensor((self.tile_n, self.tile_m))
        tScS = mn_view(thr_mma_sdp.partition_C(cS))
        t0ScS = mn_view(tiled_mma_sdp.get_slice(0).partition_C(cS))  # thread 0's: constants
        n_rows = cute.size(tScS, mode=[0])
        n_cols = cute.size(tScS, mode=[1])
        lse_c = cute.make_rmem_tensor(n_cols, Float32)
        d_c = cute.make_rmem_tensor(n_cols, Float32)

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_kv.consumer_wait(kv_state)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        key0 = n_block * self.tile_n
        causal_offset = seqlen_k - seqlen_q
        at_use = const_expr(self.stats_tma and self.dq_rows_split)

        kv_head, head = self._walk_heads(kv_head, group)
        m_block = m_block_min
        for it in cutlass.range(n_iter, unroll=1):
            q0 = m_block * self.tile_m
            gLSE = mLSE[None, head, batch]
            gD = mD[None, head, batch]
            if const_expr(not self.stats_tma):
                # this thread's columns (queries): LSE_log2 and D (padded: always in bounds)
                for c in cutlass.range_constexpr(n_cols):
                    lse_c[c] = gLSE[q0 + tScS[0, c][1]]
                    d_c[c] = gD[q0 + tScS[0, c][1]]

            pipe_q.consumer_wait(state)
            acc_S = cute.make_rmem_tensor(s_shape, Float32)
            gemm(tiled_mma_sdp, acc_S, tSrK, tSrQ[None, None, None, state.index], True, -1)
            if const_expr(self.stats_tma and not at_use):
                for c in cutlass.range_constexpr(n_cols):  # landed with Q (same mbarrier)
                    lse_c[c] = sLSE[tScS[0, c][1], state.index]
            pipe_do.consumer_wait(state)
            acc_dP = cute.make_rmem_tensor(s_shape, Float32)
            gemm(tiled_mma_sdp, acc_dP, tdPrV, tdPrdO[None, None, None, state.index], True, 1)

            # P^T = exp2(S^T * scale_log2 - LSE_log2); then 0 past seqlen_k and above the
            # diagonal, in the blocks that have such keys
            s = mn_view(acc_S)
            if const_expr(at_use):
                # a column's LSE_log2 read where it is used: no register holds all of them
                for c in cutlass.range_constexpr(n_cols):
                    lse = sLSE[tScS[0, c][1], state.index]
                    for r in cutlass.range_constexpr(n_rows):
                        s[r, c] = cute.math.exp2(s[r, c] * scale_log2 - lse, fastmath=True)
            else:
                for r in cutlass.range_constexpr(n_rows):
                    for c in cutlass.range_constexpr(n_cols):
                        s[r, c] = cute.math.exp2(s[r, c] * scale_log2 - lse_c[c], fastmath=True)
            need_mask = key0 + self.tile_n > seqlen_k
            if const_expr(self.causal):
                need_mask = need_mask | (key0 + self.tile_n - 1 > q0 + causal_offset)
            if need_mask:
                self._mask(s, tScS, t0ScS, key0, q0, seqlen_k, causal_offset)
            if const_expr(self.stats_tma and not at_use):
                for c in cutlass.range_constexpr(n_cols):  # landed with dO
                    d_c[c] = sD[tScS[0, c][1], state.index]
            warpgroup.wait_group(0)
            # dS^T = P^T * (dP^T * scale - D), D scaled by the preprocess (ds_scaled): one FFMA and one
            # FMUL per element, and dQ, dK come out of their GEMMs scaled; else P^T * (dP^T - D)
            dp = mn_view(acc_dP)
            ds_scale = softmax_scale if const_expr(self.ds_scaled) else Float32(1.0)
            if const_expr(at_use):
                for c in cutlass.range_constexpr(n_cols):
                    d = sD[tScS[0, c][1], state.index]
                    for r in cutlass.range_constexpr(n_rows):
                        dp[r, c] = s[r, c] * (dp[r, c] * ds_scale - d)
            else:
                for r in cutlass.range_constexpr(n_rows):
                    for c in cutlass.range_constexpr(n_cols):
                        dp[r, c] = s[r, c] * (dp[r, c] * ds_scale - d_c[c])

            ds_buf = it % 2
            aP, adS = tdVrP, tdKrdS  # dV's and dK's A operands
            if const_expr(self.kv_split):
                # P^T and dS^T -> smem buffers it % 2 (their last readers, the GEMMs of block
                # it - 2, are done: as for dS^T below); then dV, after the barrier
                rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
                rdS = cute.make_rmem_tensor_like(acc_dP, self.dtype)
                to_16bit(acc_S, rP)
                to_16bit(acc_dP, rdS)
                cute.copy(smem_thr_copy_dS, smem_thr_copy_dS.retile(rP), tPsP[None, None, None, ds_buf])
                cute.copy(smem_thr_copy_dS, smem_thr_copy_dS.retile(rdS), tdSsdS[None, None, None, ds_buf])
                aP, adS = tdVrP[None, None, None, ds_buf], tdKrdS[None, None, None, ds_buf]
                cute.arch.fence_view_async_shared()  # generic-proxy writes -> wgmma (async proxy)
                cute.arch.barrier(barrier_id=NamedBarrierBwd.DS, number_of_threads=self.num_consumer_threads)
                gemm(tiled_mma_dkv, acc_dV, aP, tdVrdOt[None, None, None, state.index], False, -1)
            else:
                to_16bit(acc_as_operand_a(acc_S), tdVrP)
                to_16bit(acc_as_operand_a(acc_dP), tdKrdS)

                # dS^T -> smem buffer it % 2, before the RS GEMMs below, which read tdKrdS
                # asynchronously (no register access until their wait). The dQ GEMM that last read
                # this buffer (block it - 2) is done: its warpgroup finished it before writing its
                # part of block it - 1, which everyone waited for at the barrier of block it - 1.
                cute.copy(smem_thr_copy_dS, smem_thr_copy_dS.retile(tdKrdS), tdSsdS[None, None, None, ds_buf])
                if const_expr(self.mma_order == "dv_dq_dk"):
                    # dV += P^T dO (P^T from registers) runs under the fence and the barrier
                    gemm(tiled_mma_dkv, acc_dV, tdVrP, tdVrdOt[None, None, None, state.index], False, -1)
                cute.arch.fence_view_async_shared()  # generic-proxy writes -> wgmma (async proxy)
                cute.arch.barrier(barrier_id=NamedBarrierBwd.DS, number_of_threads=self.num_consumer_threads)

                if const_expr(self.mma_order == "dv_dk_dq"):
                    gemm(tiled_mma_dkv, acc_dV, tdVrP, tdVrdOt[None, None, None, state.index], False, -1)
            if const_expr(self.mma_order == "dv_dk_dq"):
                gemm(tiled_mma_dkv, acc_dK, adS, tdKrQt[None, None, None, state.index], False, -1)
            # the rest of the block's GEMMs; the dQ warpgroups (all at head_dim 128 and with
            # kv_split, warpgroup 0 alone at 64 and 96) also write dQ out
            tail = (tiled_mma_dkv, tiled_mma_dq, acc_dV, acc_dK, acc_dQ, aP, adS,
                    tdVrdOt[None, None, None, state.index], tdKrQt[None, None, None, state.index],
                    tdQrdS[None, None, None, ds_buf], tdQrKt, pipe_q, pipe_do, state)
            emit = (thr_mma_dq, mdQaccum, sdQ, dq_tidx, m_block, head, batch, order, softmax_scale, pair)
            if const_expr(self.dq_wgs == self.num_wg):
                self._block_gemms(*tail, emit)
            else:
                if wg_idx == 0:
                    self._block_gemms(*tail, emit)
                else:
                    self._block_gemms(*tail, None)
            state.advance()
            m_block, head = self._next_block(m_block, head, m_block_min, n_m)

        if const_expr(self.gqa_reduce and not self.tail_lpt):
            # the CTA's coordinates read again from the grid (k/v head = q head // group) and the
            # thread's index: held through the loop they spill at head_dim 256
            bx, by, bz = cute.arch.block_idx()
            n_block, kv_head = bx, cute.arch.make_warp_uniform(by // (mLSE.shape[1] // mdK.shape[2]))
            batch = Int32(0) if const_expr(self.varlen) else bz
            tidx = cute.arch.thread_idx()[0] - 128
        self._epilogue(acc_dK, acc_dV, softmax_scale, tiled_mma_dkv, sK, sV, tma_atom_dK, mdK,
                       tma_atom_dV, mdV, tidx, n_block, kv_head, batch, var)

    @cute.jit
    def _block_gemms(self, tiled_mma_dkv, tiled_mma_dq, acc_dV, acc_dK, acc_dQ, tdVrP, tdKrdS,
                     tdVrdOt, tdKrQt, tdQrdS, tdQrKt, pipe_q, pipe_do, state, emit):
        """The GEMMs of one query block after the dS^T barrier (after dV and dK in "dv_dk_dq"),
        in mma_order, and the release of its Q / dO stage; emit = the dQ write-out's arguments
        (None: not a dQ warpgroup)."""
        qdo = const_expr(self.dq_qdo)  # dQ goes into this stage: producer warp 1 releases it
        if const_expr(self.mma_order == "dv_dk_dq"):
            if const_expr(emit is not None):
                gemm(tiled_mma_dq, acc_dQ, tdQrdS, tdQrKt, True, 0)  # and dV, dK
            else:
                warpgroup.wait_group(0)
            if const_expr(not qdo):
                pipe_q.consumer_release(state)
                pipe_do.consumer_release(state)
            if const_expr(emit is not None):
                self._emit_dq(acc_dQ, *emit, state, False)
        else:
            # dV is in flight (issued before the barrier); dQ first, then dK: dQ leaves (smem
            # or RED) while dK runs on the tensor core
            if const_expr(emit is not None):
                gemm(tiled_mma_dq, acc_dQ, tdQrdS, tdQrKt, True, 1)  # dV done
                if const_expr(not qdo):
                    pipe_do.consumer_release(state)
                gemm(tiled_mma_dkv, acc_dK, tdKrdS, tdKrQt, False, 1)  # dQ done
                # qdo: the dO half of dQ now, the Q half once dK (its reader) is done
                self._emit_dq(acc_dQ, *emit, state, True)
            else:
                gemm(tiled_mma_dkv, acc_dK, tdKrdS, tdKrQt, False, 1)  # dV done
                pipe_do.consumer_release(state)
            warpgroup.wait_group(0)
            if const_expr(not qdo):
                pipe_q.consumer_release(state)

    @cute.jit
    def _mask(self, s, tScS, t0ScS, key0, q0, seqlen_k, causal_offset):
        """P^T = 0 for keys past seqlen_k and (causal) for (key, query) above the diagonal:
        query q sees key j iff j <= q + causal_offset. A row of S^T is one key; a column's query
        is compared as thread 0's constant column against a per-row limit."""
        col0 = tScS[0, 0][1]
        for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
            key = key0 + tScS[r, 0][0]
            row_ok = key < seqlen_k
            # visible iff q0 + col0 + t0col >= key - causal_offset
            first_col = key - causal_offset - q0 - col0
            for c in cutlass.range_constexpr(cute.size(s, mode=[1])):
                visible = row_ok
                if const_expr(self.causal):
                    visible = row_ok & (t0ScS[0, c][1] >= first_col)
                s[r, c] = s[r, c] if visible else Float32(0.0)

    @cute.jit
    def _emit_dq(self, acc_dQ, thr_mma_dq, mdQaccum, sdQ, dq_tidx, m_block, head, batch, order, softmax_scale,
                 pair, state, dk_in_flight: cutlass.Constexpr):
        """dk_in_flight: this warpgroup's dK GEMM still reads its columns of the stage's Q (qdo:
        the Q half waits for it). pair: (this CTA's rank in the cluster, its pair mbarriers).
        order: deterministic, _dq_turn's (None otherwise)."""
        # dQ leaves scaled, so the host's postprocess is one copy (fp32 -> 16 bit, row order); with
        # ds_scaled it is already (dS carries the scale)
        if const_expr(not self.ds_scaled):
            for i in cutlass.range_constexpr(cute.size(acc_dQ)):
                acc_dQ[i] = acc_dQ[i] * softmax_scale
        stage = state.index
        if const_expr(self.dq_pair):
            self._pair_dq(acc_dQ, sdQ, dq_tidx, pair, state, dk_in_flight)
        elif const_expr(self.dq_qdo):
            w = dq_tidx // 128
            self._dq_half_to_smem(acc_dQ, sdQ[0][None, w, stage], dq_tidx % 128, 0)
            if const_expr(dk_in_flight):
                warpgroup.wait_group(0)
            self._dq_half_to_smem(acc_dQ, sdQ[1][None, w, stage], dq_tidx % 128, 1)
            cute.arch.fence_view_async_shared()  # generic-proxy writes -> the bulk copy (async proxy)
            cute.arch.barrier_arrive(barrier_id=self._dq_full_id(w, stage), number_of_threads=128 + 32)
        elif const_expr(self.dq_bulk):
            self._dq_to_smem(acc_dQ, sdQ, dq_tidx)
        else:
            self._reduce_dq(acc_dQ, thr_mma_dq, mdQaccum, dq_tidx, m_block, head, batch, order)

    @cute.jit
    def _reduce_dq(self, acc_dQ, thr_mma_dq, mdQaccum, dq_tidx, m_block, head, batch, order):
        """dQ partial sum of this query block -> the fp32 accumulator: one two-wide RED.ADD per
        pair of adjacent columns (rows past seqlen_q land in the padding). Deterministic: dQ
        thread 0 waits for the block's turn (_dq_turn), a barrier of the dQ threads passes it on,
        they add, a second barrier, and thread 0 releases the next turn (its release covers the
        adds the barrier ordered before it)."""
        gdQ = cute.local_tile(mdQaccum[None, None, head, batch], (self.tile_m, self.hd), (m_block, 0))
        tdQgdQ = thr_mma_dq.partition_C(gdQ)
        dq_threads = 128 * self.dq_wgs
        if const_expr(self.deterministic):
            sem, turn = self._dq_turn(m_block, head, batch, order)
            if dq_tidx == 0:
                self._dq_wait_turn(sem, turn)
            cute.arch.barrier(barrier_id=NamedBarrierBwd.DQ_ORDER, number_of_threads=dq_threads)
        # accumulator elements 2i and 2i + 1 are adjacent columns of one row: one v2 reduction
        for i in cutlass.range_constexpr(cute.size(acc_dQ) // 2):
            ptr = tdQgdQ.iterator + cute.crd2idx(2 * i, tdQgdQ.layout)
            red_add_f32x2(ptr, acc_dQ[2 * i], acc_dQ[2 * i + 1])
        if const_expr(self.deterministic):
            cute.arch.barrier(barrier_id=NamedBarrierBwd.DQ_ORDER, number_of_threads=dq_threads)
            if dq_tidx == 0:
                red_release_add_s32(sem, 1)

    @cute.jit
    def _epilogue(self, acc_dK, acc_dV, softmax_scale, tiled_mma_dkv, sK, sV, tma_atom_dK, mdK,
                  tma_atom_dV, mdV, tidx, n_block, kv_head, batch, var=None):
        """dK (scaled already: dS carries the softmax scale), dV -> 16 bit -> K's and V's smem buffers (stmatrix) -> TMA stores
        (varlen: _store_rows, the block's rows inside its sequence only); gqa_dkv="reduce":
        added into the fp32 accumulators instead (_reduce_dkv)."""
        if const_expr(self.gqa_reduce):
            self._reduce_dkv(acc_dK, acc_dV, softmax_scale, tiled_mma_dkv, mdK, mdV, tidx, n_block, kv_head, batch,
                             var)
            return
        rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
        rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
        if const_expr(self.ds_scaled):
            rdK.store(acc_dK.load().to(self.dtype))
        else:
            rdK.store((acc_dK.load() * softmax_scale).to(self.dtype))
        rdV.store(acc_dV.load().to(self.dtype))
        # every consumer's GEMMs (which read sK, sV) are done
        cute.arch.barrier(barrier_id=NamedBarrierBwd.EPILOGUE, number_of_threads=self.num_consumer_threads)
        stmatrix = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        smem_thr_copy = cute.make_tiled_copy_C(stmatrix, tiled_mma_dkv).get_slice(tidx)
        cute.copy(smem_thr_copy, smem_thr_copy.retile(rdK), smem_thr_copy.partition_D(sK))
        cute.copy(smem_thr_copy, smem_thr_copy.retile(rdV), smem_thr_copy.partition_D(sV))
        if const_expr(self.varlen):
            cute.arch.barrier(barrier_id=NamedBarrierBwd.EPILOGUE, number_of_threads=self.num_consumer_threads)
            # the sequence's keys read again here: nothing holds them through the loop (hd256 spills)
            mCuK, seq = var[1], cute.arch.block_idx()[2]
            off_k = mCuK[seq]
            rows = mCuK[seq + 1] - off_k - n_block * self.tile_n
            for sX, mX in ((sK, mdK), (sV, mdV)):
                self._store_rows(sX, cute.domain_offset((off_k, 0, 0, 0), mX), n_block, kv_head, rows)
            return
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=NamedBarrierBwd.EPILOGUE, number_of_threads=self.num_consumer_threads)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 4:
            gdK = cute.local_tile(mdK[None, None, kv_head, batch], (self.tile_n, self.hd), (n_block, 0))
            gdV = cute.local_tile(mdV[None, None, kv_head, batch], (self.tile_n, self.hd), (n_block, 0))
            tdKsdK, tdKgdK = cpasync.tma_partition(
                tma_atom_dK, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gdK, 0, 2))
            tdVsdV, tdVgdV = cpasync.tma_partition(
                tma_atom_dV, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gdV, 0, 2))
            cute.copy(tma_atom_dK, tdKsdK, tdKgdK)
            cute.copy(tma_atom_dV, tdVsdV, tdVgdV)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # smem must outlive the stores


    @cute.jit
    def _reduce_dkv(self, acc_dK, acc_dV, softmax_scale, tiled_mma_dkv, mdK, mdV, tidx, n_block, kv_head, batch,
                    var=None):
        """gqa_dkv="reduce": this q head's dK and dV -> the k/v head's fp32
        accumulators, one two-wide RED.ADD per pair of adjacent columns of a row (the wgmma
        accumulator's elements 2i and 2i + 1), rows inside the keys only (varlen: inside the
        sequence's; the next sequence's rows belong to other CTAs). The q heads of a group add in
        no fixed order: not deterministic."""
        rows = mdK.shape[0] - n_block * self.tile_n
        if const_expr(self.varlen):
            mCuK, seq = var[1], cute.arch.block_idx()[2]
            off_k = mCuK[seq]
            rows = mCuK[seq + 1] - off_k - n_block * self.tile_n
            mdK = cute.domain_offset((off_k, 0, 0, 0), mdK)
            mdV = cute.domain_offset((off_k, 0, 0, 0), mdV)
        thr_mma = tiled_mma_dkv.get_slice(tidx)
        tXcX = thr_mma.partition_C(cute.make_identity_tensor((self.tile_n, self.hd)))  # (key, column)
        if const_expr(not self.ds_scaled):
            for i in cutlass.range_constexpr(cute.size(acc_dK)):
                acc_dK[i] = acc_dK[i] * softmax_scale
        for acc, mX in ((acc_dK, mdK), (acc_dV, mdV)):
            gX = cute.local_tile(mX[None, None, kv_head, batch], (self.tile_n, self.hd), (n_block, 0))
            tXgX = thr_mma.partition_C(gX)
            for i in cutlass.range_constexpr(cute.size(acc) // 2):
                if tXcX[2 * i][0] < rows:
                    red_add_f32x2(tXgX.iterator + cute.crd2idx(2 * i, tXgX.layout), acc[2 * i], acc[2 * i + 1])

    @cute.jit
    def _store_rows(self, sX, mX, n_block, kv_head, rows):
        """Varlen build: the key block's dK or dV from smem to the packed tensor in 16-byte pieces
        of rows, only its first `rows` rows (the others are the next sequence's keys, which another
        CTA owns; a TMA store would write them)."""
        tidx = cute.arch.thread_idx()[0] - 128  # read again: nothing holds it through the loop
        gX = cute.local_tile(mX[None, None, kv_head, 0], (self.tile_n, self.hd), (n_block, 0))
        store_rows(sX, gX, tidx, self.num_consumer_threads, rows)


class FlashBwdSm90Probe(FlashBwdSm90):
    """The clock probe: the same kernel plus four stamps per CTA into mStamps, an int64 tensor of
    4 words per CTA (row = the CTA's linear block index): clock64 and globaltimer at its start
    (thread 0) and after its dK / dV stores (thread 128); then PROBE_SUM_WORDS words of running
    sums every CTA adds its span to. The SM clock of a launch is the sum of its CTAs' clock64
    spans over the sum of their globaltimer spans (trace.ctas_clock_ghz); over many launches, the
    sums' (trace.probe_sums)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
                 mD: cute.Tensor, mdQaccum: cute.Tensor, mdQsem: Optional[cute.Tensor], mdK: cute.Tensor,
                 mdV: cute.Tensor, softmax_scale_log2: Float32, softmax_scale: Float32,
                 mStamps: cute.Tensor,  # (4 x CTAs,) int64
                 stream):
        self._host(mQ, mK, mV, mdO, mLSE, mD, mdQaccum, mdQsem, mdK, mdV, softmax_scale_log2, softmax_scale,
                   stream, mStamps)


class FlashBwdSm90Varlen(FlashBwdSm90):
    """The varlen build (BwdConfig.varlen): q, dO (1, total_q, h, d) and k, v (1, total_k, h_kv, d)
    hold the sequences one after the other (sequence i's rows [cu_seqlens_q[i], cu_seqlens_q[i + 1]),
    keys likewise), dK and dV like k and v; LSE_log2 and D (1, h, s_q_pad), the dQ accumulator
    (dq_slices, h, s_q_pad, d) and the deterministic build's semaphores (dq_slices, h, s_q_pad / tile_m) in the
    layout padded per sequence of sm90/bwd_varlen.py. The grid: the longest sequence's key blocks
    (max_seqlen_k) x k/v heads x sequences; a CTA whose key block (pair) starts past its
    sequence's keys exits at once."""

    def __init__(self, cfg: BwdConfig):
        assert cfg.varlen, "FlashBwdSm90Varlen needs a varlen config (bwd_config.make_varlen_bwd_config)"
        super().__init__(cfg)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
                 mD: cute.Tensor, mdQaccum: cute.Tensor,
                 mdQsem: Optional[cute.Tensor],  # deterministic: (dq_slices, h, s_q_pad / tile_m) int32, zeroed
                 mdK: cute.Tensor, mdV: cute.Tensor,
                 mCuSeqlensQ: cute.Tensor,  # (sequences + 1,) int32
                 mCuSeqlensK: cute.Tensor,
                 max_seqlen_k: Int32,
                 softmax_scale_log2: Float32, softmax_scale: Float32, stream):
        self._host(mQ, mK, mV, mdO, mLSE, mD, mdQaccum, mdQsem, mdK, mdV, softmax_scale_log2, softmax_scale,
                   stream, None, (mCuSeqlensQ, mCuSeqlensK, max_seqlen_k))


def make_bwd_kernel(cfg: BwdConfig, clock_probe: bool = False) -> FlashBwdSm90:
    """The kernel object of a build; the clock probe takes its stamps buffer as one more argument."""
    if cfg.varlen:
        assert not clock_probe, "the varlen build has no clock probe"
        return FlashBwdSm90Varlen(cfg)
    return FlashBwdSm90Probe(cfg) if clock_probe else FlashBwdSm90(cfg)


# ---------------------------------------------------------------------- host side (launch)


def fake_bwd_args(cfg: BwdConfig):
    """Fake tensors for compiling without data: dynamic batch, lengths, heads (q's and k/v's)
    and strides (16-byte aligned rows), fp32 statistics and dQ accumulator, the int32 dQ
    semaphores when deterministic (else None); with dq_slices > 1 both have a batch axis of their
    own (dq_slices x the batch)."""
    from cutlass.cute.runtime import make_fake_tensor

    dt = cutlass.BFloat16 if cfg.dtype == "bfloat16" else cutlass.Float16
    div = 128 // dt.width

    def fake(shape):
        stride = tuple(cute.sym_int64(divisibility=div) for _ in range(3)) + (1,)
        return make_fake_tensor(dt, shape, stride=stride, assumed_align=16)

    b, sq, sk, h, hkv, sqp, nm = (cute.sym_int() for _ in range(7))
    q, do = fake((b, sq, h, cfg.head_dim)), fake((b, sq, h, cfg.head_dim))
    k, v = fake((b, sk, hkv, cfg.head_dim)), fake((b, sk, hkv, cfg.head_dim))
    if cfg.gqa_dkv == "reduce":  # fp32 accumulators
        dk, dv = (make_fake_tensor(cutlass.Float32, (b, sk, hkv, cfg.head_dim),
                                   stride=tuple(cute.sym_int64(divisibility=4) for _ in range(3)) + (1,),
                                   assumed_align=16) for _ in range(2))
    else:
        dk, dv = fake((b, sk, hkv, cfg.head_dim)), fake((b, sk, hkv, cfg.head_dim))
    stats = [make_fake_tensor(cutlass.Float32, (b, h, sqp), stride=(cute.sym_int64(), cute.sym_int64(), 1),
                              assumed_align=4) for _ in range(2)]
    bq = cute.sym_int() if cfg.dq_slices > 1 else b
    dq = make_fake_tensor(cutlass.Float32, (bq, h, sqp, cfg.head_dim),
                          stride=tuple(cute.sym_int64(divisibility=4) for _ in range(3)) + (1,), assumed_align=16)
    sem = None
    if cfg.deterministic:
        sem = make_fake_tensor(cutlass.Int32, (bq, h, nm), stride=(cute.sym_int64(), cute.sym_int64(), 1),
                               assumed_align=4)
    return q, k, v, do, stats[0], stats[1], dq, sem, dk, dv


def fake_stamps():
    """The clock probe's stamps buffer (4 int64 words per CTA, then the running sums), dynamic length."""
    from cutlass.cute.runtime import make_fake_tensor

    return make_fake_tensor(cutlass.Int64, (cute.sym_int(),), stride=(1,), assumed_align=16)


def fake_varlen_bwd_args(cfg: BwdConfig):
    """The varlen build's fake arguments before the scales (FlashBwdSm90Varlen): fake_bwd_args,
    then cu_seqlens_q and _k and max_seqlen_k."""
    from cutlass.cute.runtime import make_fake_tensor

    n = cute.sym_int()
    cu = [make_fake_tensor(cutlass.Int32, (n,), stride=(1,), assumed_align=4) for _ in range(2)]
    return (*fake_bwd_args(cfg), cu[0], cu[1], Int32(1))


def compile_bwd(cfg: BwdConfig, options=None, tvm_ffi: bool = False, clock_probe: bool = False):
    """cute.compile of one backward build against fake tensors (no GPU needed); clock_probe:
    the FlashBwdSm90Probe build, which takes the stamps buffer after the scales."""
    if cfg.varlen:
        return compile_fake(make_bwd_kernel(cfg), (*fake_varlen_bwd_args(cfg), Float32(1.0), Float32(1.0)),
                            options, tvm_ffi)
    extra = (fake_stamps(),) if clock_probe else ()
    return compile_fake(make_bwd_kernel(cfg, clock_probe),
                         (*fake_bwd_args(cfg), Float32(1.0), Float32(1.0), *extra), options, tvm_ffi)


_CACHE: dict = {}  # kernel_config(BwdConfig), or (it, "clock_probe") -> compiled callable
COMPILE_TIMES: dict = {}  # the same keys -> seconds of its first (JIT) compile


def kernel_config(cfg: BwdConfig) -> BwdConfig:
    """cfg with the knobs that only change the host side or the other launches (postprocess,
    dq_zero) at their defaults: builds that differ only there share one compiled kernel."""
    return dataclasses.replace(cfg, postprocess=BwdConfig.postprocess, dq_zero=BwdConfig.dq_zero)


_USE_TVM_FFI = None


def probe_words(cfg: BwdConfig, batch: int, seqlen_k: int, heads_kv: int) -> int:
    """Words of the clock probe's stamps buffer for a launch: 4 per CTA of its grid, then 4 for
    the running sums (cycles, ns, CTAs, unused; trace.probe_sums). heads_kv: the grid's heads
    (bwd_config.grid_heads: the q heads with gqa_dkv="reduce")."""
    blocks = -(-seqlen_k // cfg.tile_n)
    if cfg.dq_sum == "pair":
        blocks += blocks % 2  # the pair's grid rounds the key blocks up to even
    return 4 * blocks * heads_kv * batch + PROBE_SUM_WORDS


def _dq_accumulators(cfg: BwdConfig, b: int, h: int, sqp: int, d: int, alloc, device):
    """The fp32 dQ accumulator (cfg.dq_slices x b, h, sqp, d) and, deterministic, its int32
    semaphores (cfg.dq_slices x b, h, sqp / tile_m) (else None): copy r's batch rows r b ..
    (r + 1) b (sm90/bwd.py _dq_slice)."""
    import torch

    rows = cfg.dq_slices * b
    acc = alloc((rows, h, sqp, d), dtype=torch.float32, device=device)
    sem = alloc((rows, h, sqp // cfg.tile_m), dtype=torch.int32, device=device) if cfg.deterministic else None
    return acc, sem


def _zero_copies(cfg: BwdConfig, dq_accum, dq_sem, b: int) -> None:
    """dq_slices > 1: the copies past the first, which the preprocess (it zeroes the first) does not see."""
    if cfg.dq_slices > 1:
        dq_accum[b:].zero_()
        dq_sem[b:].zero_()


def _sum_copies(cfg: BwdConfig, dq_accum, b: int):
    """The accumulator's copies summed (one torch reduction over the copy axis: the same order on
    every run, so the same bits), (b, h, sqp, d); the accumulator itself with one copy."""
    if cfg.dq_slices == 1:
        return dq_accum
    return dq_accum.view(cfg.dq_slices, b, *dq_accum.shape[1:]).sum(0)


def run_bwd(cfg: BwdConfig, dout, q, k, v, out, lse, softmax_scale: float, stamps=None):
    """Launch the backward of cfg; returns (dq, dk, dv) shaped and typed like q, k, v. The
    preprocess (D, LSE_log2) runs as cfg.preprocess says, the dQ postprocess (row order, -> 16
    bit) as cfg.postprocess says. stamps: an int64 tensor of
    probe_words() words on q's device: the clock-probe build runs and writes its stamps there."""
    main, finish = prepare_bwd(cfg, dout, q, k, v, out, lse, softmax_scale, stamps)
    main()
    return finish()


def run_bwd_varlen(cfg: BwdConfig, dout, q, k, v, out, lse, cu_q, cu_k, max_seqlen_q: int, max_seqlen_k: int,
                   softmax_scale: float):
    """The varlen build (FlashBwdSm90Varlen) on packed torch tensors: q, dout, out (total_q, h, d),
    k, v (total_k, h_kv, d), lse (h, total_q) natural log (-inf where a row saw no key),
    cu_seqlens int32 on q's device; returns (dq, dk, dv) packed like q, k, v. Three launches, as
    the dense backward: the varlen preprocess, the kernel, the varlen postprocess, none waiting
    for the host (the padded layout they share: sm90/bwd_varlen.py)."""
    global _USE_TVM_FFI
    import time

    import torch

    if _USE_TVM_FFI is None:
        _USE_TVM_FFI = tvm_ffi_enabled()
    fn = _CACHE.get(cfg)
    if fn is None:
        t0 = time.perf_counter()
        fn = compile_bwd(cfg, tvm_ffi=_USE_TVM_FFI)
        COMPILE_TIMES[cfg] = time.perf_counter() - t0
        _CACHE[cfg] = fn
    dout = dout.detach().contiguous()
    if dout.data_ptr() % 16:
        dout = dout.clone()  # TMA needs 16-byte aligned rows
    q, k, v, out, lse = (t.detach() for t in (q, k, v, out, lse))
    tq, h, d = q.shape
    sqp = padded_length(tq, cu_q.numel() - 1, cfg.tile_m)
    # written (the accumulator zeroed) by the preprocess over every sequence's query blocks;
    # deterministic: a semaphore per query block, its turns (_dq_turn) per sequence
    dpsum = torch.empty((1, h, sqp), dtype=torch.float32, device=q.device)
    lse_log2 = torch.empty((1, h, sqp), dtype=torch.float32, device=q.device)
    dq_accum, dq_sem = _dq_accumulators(cfg, 1, h, sqp, d, torch.empty, q.device)
    preprocess_varlen(cfg, dout, out, lse, softmax_scale if cfg.ds_scaled else 1.0, dpsum, lse_log2,
                      dq_accum[:1], None if dq_sem is None else dq_sem[:1], cu_q, max_seqlen_q, _USE_TVM_FFI)
    _zero_copies(cfg, dq_accum, dq_sem, 1)
    if cfg.gqa_dkv == "reduce":  # fp32 accumulators the q heads' CTAs add into: one memset for both
        dkv_accum = torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device)
        dk, dv = dkv_accum[0], dkv_accum[1]
    else:
        dk, dv = torch.empty_like(k), torch.empty_like(v)  # every row written by the kernel (a tail's: 0)
    q4, k4, v4, do4, dk4, dv4 = (t.unsqueeze(0) for t in (q, k, v, dout, dk, dv))  # one batch row
    scales = (float(softmax_scale * LOG2_E), float(softmax_scale))
    if _USE_TVM_FFI:
        fn(q4, k4, v4, do4, lse_log2, dpsum, dq_accum, dq_sem, dk4, dv4, cu_q, cu_k, max_seqlen_k, *scales)
    else:
        sem = to_cute(dq_sem, 2, align=4) if dq_sem is not None else None
        fn(*[to_cute(t, 3) for t in (q4, k4, v4, do4)], *[to_cute(t, 2, align=4) for t in (lse_log2, dpsum)],
           to_cute(dq_accum, 3), sem, *[to_cute(t, 3) for t in (dk4, dv4)], to_cute(cu_q, 0, align=4),
           to_cute(cu_k, 0, align=4), Int32(max_seqlen_k), *(Float32(x) for x in scales), torch_stream(q.device))
    dq = torch.empty_like(q)
    postprocess_varlen(cfg, _sum_copies(cfg, dq_accum, 1), dq, cu_q, max_seqlen_q, _USE_TVM_FFI)
    if cfg.gqa_dkv == "reduce":
        dkv = dkv_accum.to(k.dtype)  # one cast launch for both
        return dq, dkv[0], dkv[1]
    return dq, dk, dv


def prepare_bwd(cfg: BwdConfig, dout, q, k, v, out, lse, softmax_scale: float, stamps=None):
    """The backward of cfg in two steps: runs the preprocess (and the dQ accumulator's zeroing)
    now and returns (main, finish): main() launches the main kernel alone (again on each call: a
    measurement of that kernel on its own, whose dQ accumulator then holds the sum of the calls;
    deterministic, each call after the first zeroes the semaphores first, one memset),
    finish() runs the postprocess and returns (dq, dk, dv). run_bwd calls each once."""
    global _USE_TVM_FFI
    import time

    import torch

    q, k, v, out, lse = (t.detach() for t in (q, k, v, out, lse))  # DLPack refuses tensors needing grad
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    probe = stamps is not None
    words = probe_words(cfg, b, sk, grid_heads(cfg, h, hkv)) if probe else 0
    if probe and (stamps.dtype != torch.int64 or stamps.numel() < words):
        raise ValueError(f"stamps: {stamps.dtype} x {stamps.numel()}; allowed: int64 with at least "
                         f"{words} words (probe_words)")
    sqp = -(-sq // cfg.tile_m) * cfg.tile_m
    dout = dout.detach().contiguous()
    if dout.data_ptr() % 16:
        dout = dout.clone()  # TMA needs 16-byte aligned rows
    if _USE_TVM_FFI is None:
        _USE_TVM_FFI = tvm_ffi_enabled()
    # dq_zero="preprocess": the preprocess kernel zeroes it (no memset launch), and the
    # deterministic build's semaphores (one per query block of each (batch, q head))
    alloc = torch.empty if cfg.dq_zero == "preprocess" else torch.zeros
    dq_accum, dq_sem = _dq_accumulators(cfg, b, h, sqp, d, alloc, q.device)
    if cfg.preprocess == "kernel":
        dpsum, lse_log2 = preprocess_kernel(cfg, dout, out, lse, softmax_scale if cfg.ds_scaled else 1.0, sqp,
                                            _USE_TVM_FFI, dq_accum[:b],
                                            None if dq_sem is None else dq_sem[:b])
        if cfg.dq_zero == "preprocess":
            _zero_copies(cfg, dq_accum, dq_sem, b)
    else:
        dpsum, lse_log2 = preprocess_torch(cfg, dout, out, lse, softmax_scale if cfg.ds_scaled else 1.0, sqp)
    reduce_dkv = cfg.gqa_dkv == "reduce"
    if reduce_dkv:  # the kernel adds into fp32 accumulators: zeroed here, one memset for both
        dkv_accum = torch.zeros((2, b, sk, hkv, d), dtype=torch.float32, device=k.device)
        dk, dv = dkv_accum[0], dkv_accum[1]
    else:
        dk = torch.empty((b, sk, hkv, d), dtype=k.dtype, device=k.device)
        dv = torch.empty((b, sk, hkv, d), dtype=v.dtype, device=v.device)
    scale_log2 = float(softmax_scale * LOG2_E)
    kcfg = kernel_config(cfg)
    key = (kcfg, "clock_probe") if probe else kcfg
    fn = _CACHE.get(key)
    if _USE_TVM_FFI:
        if fn is None:
            t0 = time.perf_counter()
            fn = compile_bwd(kcfg, tvm_ffi=True, clock_probe=probe)
            COMPILE_TIMES[key] = time.perf_counter() - t0
            _CACHE[key] = fn

        def launch():
            fn(q, k, v, dout, lse_log2, dpsum, dq_accum, dq_sem, dk, dv, scale_log2, float(softmax_scale),
               *((stamps,) if probe else ()))
    else:
        args = [to_cute(t, 3) for t in (q, k, v, dout)]
        stats = [to_cute(t, 2, align=4) for t in (lse_log2, dpsum)]
        dq_c = to_cute(dq_accum, 3)
        sem_c = to_cute(dq_sem, 2, align=4) if cfg.deterministic else None
        dkv = [to_cute(t, 3) for t in (dk, dv)]
        extra = (to_cute(stamps, 0, align=16),) if probe else ()
        stream = torch_stream(q.device)
        if fn is None:
            t0 = time.perf_counter()
            fn = cute.compile(make_bwd_kernel(kcfg, probe), *args, *stats, dq_c, sem_c, *dkv, Float32(scale_log2),
                              Float32(softmax_scale), *extra, stream)
            COMPILE_TIMES[key] = time.perf_counter() - t0
            _CACHE[key] = fn

        def launch():
            fn(*args, *stats, dq_c, sem_c, *dkv, Float32(scale_log2), Float32(softmax_scale), *extra, stream)

    launches = [0]

    def main():
        if dq_sem is not None and launches[0]:
            dq_sem.zero_()  # a repeated launch: its turns start over (the preprocess zeroed the first's)
        launches[0] += 1
        launch()

    def finish():
        dk_out, dv_out = tuple(dkv_accum.to(k.dtype)) if reduce_dkv else (dk, dv)  # one cast launch
        acc = _sum_copies(cfg, dq_accum, b)
        if cfg.postprocess == "kernel":
            return postprocess_kernel(cfg, acc, sq, q.dtype, _USE_TVM_FFI), dk_out, dv_out
        return dq_postprocess(acc, cfg, sq, q.dtype), dk_out, dv_out

    return main, finish
