"""FlashAttention-4 forward for Blackwell (SM100) in the CuTe DSL: fa4lab's own kernel.

One CTA = 256 query rows (two 128-row Q tiles, "stages" 0 and 1) of one (batch, head);
512 threads in 16 warps with fixed roles (docs/reference/fa4-schedules.md, SM100 forward):

  warps 0-3   softmax WG0: Q tile 0, one thread owns one full S row (TMEM lane = row)
  warps 4-7   softmax WG1: Q tile 1
  warps 8-11  correction WG: conditional O rescale in TMEM, final 1/row_sum, O -> smem
  warp 12     MMA: allocates all 512 TMEM columns; tcgen05.mma in the order
              PV0(j-1), QK0(j), PV1(j-1), QK1(j)
  warp 13     epilogue: TMA store of O
  warp 14     load: TMA of K(last), Q0, Q1, V(last), then (K, V) pairs into one K/V ring
  warp 15     idle

TMEM (fp32 columns): S0 = 0..127, S1 = 128..255, O0 = 256.., O1 = 256 + hd..; P_s (bf16,
two per column) overlays the second half of S_s (P0 at 64, P1 at 192).

Pipelines (producer -> consumer): q and kv (TMA -> MMA, PipelineTmaUmma), s_p_o (MMA commits
"S full"; softmax "P 3/4 written" + correction "O rescaled" gate PV), p_lastsplit (softmax ->
MMA, before the last 2 k-steps of PV), o_acc (MMA -> correction, O final), sm_stats (softmax ->
correction: acc_scale / row_sum in smem + a named barrier per warp pair, with an mbarrier back
so a slot is not overwritten before it was read), o_epi (correction -> epilogue).

Only compilation (sm_100a, CPU, fake tensors) is tested (tests/test_kernel_sm100_compile.py):
the kernel has not run on a Blackwell GPU. Configuration and knobs: sm100/config.py, README.md.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import cutlass.memory as cutlass_memory
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.tensor_utils import LayoutEnum

from .. import block_info
from ..softmax import exp2_emulated, exp2_emulated_x2, max4, update_row_max
from .config import (  # noqa: F401  (re-exported: the SM100 kernel's public names)
    DEFAULT_EXP_EMULATION, DEFAULT_KV_STAGES, DEFAULT_RESCALE_THRESHOLD, MAX_EXP_EMULATION, Q_STAGES,
    REGS, SMEM_LIMIT_BYTES, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, TILE_M, TILE_N, Sm100Config, emulated_mask,
    make_sm100_config, smem_bytes,
)
from .named_barrier import NamedBarrierFwdSm100

LN_2 = math.log(2.0)
L2_SECTION_BYTES = 48 * 1024 * 1024  # causal tile order: (batch, head) groups whose K/V fit L2


class Sm100Barriers(NamedTuple):
    """smem addresses of the raw mbarrier pairs (one per Q tile each)."""

    s_p_o_full: object
    s_p_o_empty: object
    p_lastsplit: object
    o_acc: object
    sm_stats_empty: object
    o_epi_full: object
    o_epi_empty: object


def _load_volatile_s32(ptr) -> Int32:
    """ld.volatile.shared.s32: a value neither LLVM nor ptxas can treat as loop-invariant."""
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    addr = ptr.toint().ir_value() if hasattr(ptr.toint(), "ir_value") else ptr.toint()
    return Int32(llvm.inline_asm(T.i32(), [Int32(addr).ir_value()],
                                 "ld.volatile.shared.s32 $0, [$1];", "=r,r",
                                 has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


def _select(t: cute.Tensor, modes) -> cute.Tensor:
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


class FlashFwdSm100:
    """One compiled variant per Sm100Config."""

    def __init__(self, cfg: Sm100Config):
        self.cfg = cfg
        self.dtype = cutlass.BFloat16 if cfg.dtype == "bfloat16" else cutlass.Float16
        self.hd = cfg.head_dim
        self.causal = cfg.causal
        self.has_lse = cfg.has_lse
        self.scale_slots = 2 if cfg.has_lse else 1
        self.kv_stages = cfg.kv_stages
        self.tau = cfg.rescale_threshold
        self.emu = emulated_mask(cfg.emu_res)
        # emulated exp2 of a pair of columns in packed f32x2 math (FFMA2); a lone emulated column
        # takes the scalar routine
        self.exp2_emulated_x2 = exp2_emulated_x2
        self.regs_softmax, self.regs_correction, self.regs_other = cfg.regs
        self.mma_tiler_qk = (TILE_M, TILE_N, self.hd)
        self.mma_tiler_pv = (TILE_M, self.hd, TILE_N)
        # TMEM column map (fp32 columns)
        self.tmem_s = (0, TILE_N)
        self.tmem_o = (2 * TILE_N, 2 * TILE_N + self.hd)
        self.tmem_p = (TILE_N // 2, TILE_N + TILE_N // 2)  # P_s over the 2nd half of S_s
        assert self.tmem_o[1] + self.hd <= 512
        # split P: "P 3/4" after 96 of 128 columns = 3 of the 4 tcgen05.st chunks
        self.p_chunks = 4
        self.p_split_chunk = 3
        self.pv_ksteps = TILE_N // 16
        self.pv_split_kstep = self.pv_ksteps * 3 // 4  # last 2 k-steps wait for the last quarter
        self.num_threads = 512
        # non-causal: static persistent CTAs (grid = min(#tiles, max_ctas)), so one tile's O
        # store and the next tile's Q/K loads overlap; causal: one CTA per tile, longest first
        # (tiles differ in length; the hardware block scheduler balances them)
        self.persistent = not cfg.causal

    # ------------------------------------------------------------------ host side (traced)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE, softmax_scale_log2: Float32, max_ctas: Int32, stream):
        dt = self.dtype
        # (b, s, h, d) -> (s, d, h, b); V as the PV B operand: (d, s, h, b), MN-major
        mQ, mK, mO = [_select(t, [1, 3, 2, 0]) for t in (mQ, mK, mO)]
        mV = _select(mV, [3, 1, 2, 0])
        if const_expr(mLSE is not None):
            mLSE = _select(mLSE, [2, 1, 0])  # (b, h, s) -> (s, h, b)

        mma_k = cute.nvgpu.OperandMajorMode.K
        mma_mn = cute.nvgpu.OperandMajorMode.MN
        tiled_mma_qk = sm100_utils.make_trivial_tiled_mma(
            dt, dt, mma_k, mma_k, Float32, tcgen05.CtaGroup.ONE, self.mma_tiler_qk[:2])
        tiled_mma_pv = sm100_utils.make_trivial_tiled_mma(
            dt, dt, mma_k, mma_mn, Float32, tcgen05.CtaGroup.ONE, self.mma_tiler_pv[:2],
            tcgen05.OperandSource.TMEM)  # P from TMEM (TS), V from smem

        sQ_layout = sm100_utils.make_smem_layout_a(tiled_mma_qk, self.mma_tiler_qk, dt, Q_STAGES)
        sK_layout = sm100_utils.make_smem_layout_b(tiled_mma_qk, self.mma_tiler_qk, dt, self.kv_stages)
        sV_layout = sm100_utils.make_smem_layout_b(tiled_mma_pv, self.mma_tiler_pv, dt, self.kv_stages)
        tP_layout = sm100_utils.make_smem_layout_a(tiled_mma_pv, self.mma_tiler_pv, dt, 1)
        sO_layout = sm100_utils.make_smem_layout_epi(
            dt, LayoutEnum.ROW_MAJOR, (TILE_M, self.hd), Q_STAGES)

        cluster = cute.tiled_divide(cute.make_layout((1, 1, 1)), (tiled_mma_qk.thr_id.shape,))
        tma_load = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        tma_atom_Q, tma_Q = cute.nvgpu.make_tiled_tma_atom_A(
            tma_load, mQ, cute.select(sQ_layout, mode=[0, 1, 2]), self.mma_tiler_qk,
            tiled_mma_qk, cluster.shape)
        tma_atom_K, tma_K = cute.nvgpu.make_tiled_tma_atom_B(
            tma_load, mK, cute.select(sK_layout, mode=[0, 1, 2]), self.mma_tiler_qk,
            tiled_mma_qk, cluster.shape)
        tma_atom_V, tma_V = cute.nvgpu.make_tiled_tma_atom_B(
            tma_load, mV, cute.select(sV_layout, mode=[0, 1, 2]), self.mma_tiler_pv,
            tiled_mma_pv, cluster.shape)
        # TMA store clips rows past seqlen_q: no predicates in the epilogue
        tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mO, cute.select(sO_layout, mode=[0, 1]),
            (TILE_M, self.hd))

        self.q_bytes = cute.size_in_bytes(dt, cute.select(sQ_layout, mode=[0, 1, 2]))
        self.kv_bytes = cute.size_in_bytes(dt, cute.select(sK_layout, mode=[0, 1, 2]))
        kv_elems = cute.cosize(sK_layout)
        # K and V tiles alternate in the same ring slots: same slot size and stage stride
        assert cute.cosize(sK_layout) == cute.cosize(sV_layout)
        assert sK_layout.outer.stride[-1] == sV_layout.outer.stride[-1], (
            sK_layout.outer, sV_layout.outer)
        kv_stages = self.kv_stages

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, Q_STAGES * 2]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, kv_stages * 2]
            # s_p_o: "full" = S_s ready (tcgen05.commit after QK_s); "empty" = P_s 3/4 written
            # (softmax) AND O_s rescaled / read out (correction): PV_s may start
            mbar_s_p_o_full: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            mbar_s_p_o_empty: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            mbar_p_lastsplit: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            mbar_o_acc: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            mbar_sm_stats_empty: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            mbar_o_epi_full: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            mbar_o_epi_empty: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            tmem_holding_buf: Int32
            zero: Int32  # always 0; read back to hide loop invariance from the compiler
            # per Q tile: [acc_scale or row_sum] x 128, then (LSE only) [row_max] x 128
            sScale: cute.struct.MemRange[Float32, Q_STAGES * self.scale_slots * TILE_M]
            sO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sO_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, kv_elems], 1024]

        self.shared_storage = SharedStorage
        self.smem_size = SharedStorage.size_in_bytes()
        assert self.smem_size <= SMEM_LIMIT_BYTES, self.smem_size
        num_tiles = (cute.ceil_div(mQ.shape[0], TILE_M * Q_STAGES) * cute.size(mQ.shape[2])
                     * cute.size(mQ.shape[3]))
        grid_x = num_tiles
        if const_expr(self.persistent):
            grid_x = cutlass.min(num_tiles, max_ctas)
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O, tma_O, mLSE,
            softmax_scale_log2, tiled_mma_qk, tiled_mma_pv,
            sQ_layout, sK_layout, sV_layout, tP_layout, sO_layout,
        ).launch(
            grid=(grid_x, 1, 1),
            block=[self.num_threads, 1, 1],
            smem=self.smem_size,
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ------------------------------------------------------------------ tile scheduling
    @cute.jit
    def _for_each_tile(self, body, state, num_tiles):
        """state = body(tile, state) for each tile of this CTA: a loop for persistent CTAs,
        one straight-line call otherwise (a one-trip loop would still make the compiler hoist
        per-thread addresses out of it and lengthen their live ranges)."""
        tile = cute.arch.block_idx()[0]
        if const_expr(self.persistent):
            while tile < num_tiles:
                state = body(tile, state)
                tile += cute.arch.grid_dim()[0]
        else:
            state = body(tile, state)
        return state

    @cute.jit
    def _num_tiles(self, seqlen_q, num_heads, num_batch):
        return cute.ceil_div(seqlen_q, TILE_M * Q_STAGES) * num_heads * num_batch

    @cute.jit
    def _tile_coords(self, tile, seqlen_q, seqlen_k, num_heads, num_batch):
        """Flat tile index -> (m_block, head, batch). Non-causal: m_block fastest (CTAs running
        together share one head's K/V in L2). Causal: longest-processing-time first (largest
        m_block first) within sections of (batch, head) pairs whose K/V fit in L2 together."""
        num_m = cute.ceil_div(seqlen_q, TILE_M * Q_STAGES)
        m_block = tile
        hb = tile
        if const_expr(not self.causal):
            hb = tile // num_m
            m_block = tile - hb * num_m
        else:
            num_hb = num_heads * num_batch
            kv_bytes_per_head = cutlass.max(seqlen_k, 1) * (self.hd * 4)  # K + V, 16-bit
            sec = cutlass.max(Int32(L2_SECTION_BYTES) // kv_bytes_per_head, 1)
            sec = cutlass.min(sec, num_hb)
            section = tile // (sec * num_m)
            rem = tile - section * (sec * num_m)
            full_sections = num_hb // sec
            sec_here = sec
            if section >= full_sections:
                sec_here = num_hb - full_sections * sec  # the last, smaller section
            m_rev = rem // sec_here
            hb = section * sec + (rem - m_rev * sec_here)
            m_block = num_m - 1 - m_rev
        batch = hb // num_heads
        return m_block, hb - batch * num_heads, batch

    @cute.jit
    def _block_range(self, m_block, seqlen_q, seqlen_k):
        """(n_block_max, n_mask_start) of the 256-row CTA tile (block_info.kv_block_range):
        KV blocks [0, n_block_max) are visited, last first; blocks >= n_mask_start need the
        causal mask for some row of the tile."""
        return block_info.kv_block_range(m_block, TILE_M * Q_STAGES, TILE_N, seqlen_q, seqlen_k,
                                         self.causal, block_info.dsl_ops())

    # ------------------------------------------------------------------ kernel
    @cute.kernel
    def kernel(
        self,
        tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor,
        tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
        tma_atom_V: cute.CopyAtom, mV: cute.Tensor,
        tma_atom_O: cute.CopyAtom, mO: cute.Tensor,
        mLSE,
        softmax_scale_log2: Float32,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        tP_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass_memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        cluster = cute.tiled_divide(cute.make_layout((1, 1, 1)), (tiled_mma_qk.thr_id.shape,))
        # q, kv: the load warp arms each stage with the TMA byte count; the MMA warp frees a
        # stage with tcgen05.commit once the MMAs reading it have completed.
        pipe_q = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=Q_STAGES,
            producer_group=one_thread, consumer_group=one_thread, tx_count=self.q_bytes,
            cta_layout_vmnk=cluster, defer_sync=True)
        pipe_kv = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.mbar_kv.data_ptr(), num_stages=self.kv_stages,
            producer_group=one_thread, consumer_group=one_thread, tx_count=self.kv_bytes,
            cta_layout_vmnk=cluster, defer_sync=True)
        bars = Sm100Barriers(
            s_p_o_full=storage.mbar_s_p_o_full.data_ptr(),
            s_p_o_empty=storage.mbar_s_p_o_empty.data_ptr(),
            p_lastsplit=storage.mbar_p_lastsplit.data_ptr(),
            o_acc=storage.mbar_o_acc.data_ptr(),
            sm_stats_empty=storage.mbar_sm_stats_empty.data_ptr(),
            o_epi_full=storage.mbar_o_epi_full.data_ptr(),
            o_epi_empty=storage.mbar_o_epi_empty.data_ptr(),
        )
        if warp_idx == 0:
            with cute.arch.elect_one():
                storage.zero = Int32(0)
                for s in cutlass.range_constexpr(Q_STAGES):
                    cute.arch.mbarrier_init(bars.s_p_o_full + s, 1)  # tcgen05.commit
                    # 128 softmax threads (P 3/4) + 128 correction threads (O rescaled)
                    cute.arch.mbarrier_init(bars.s_p_o_empty + s, 256)
                    cute.arch.mbarrier_init(bars.p_lastsplit + s, 128)
                    cute.arch.mbarrier_init(bars.o_acc + s, 1)
                    cute.arch.mbarrier_init(bars.sm_stats_empty + s, 128)
                    cute.arch.mbarrier_init(bars.o_epi_full + s, 128)
                    cute.arch.mbarrier_init(bars.o_epi_empty + s, 1)
        cute.arch.mbarrier_init_fence()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sKV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        # V uses the same ring slots as K (a slot holds a K or a V tile of 128 x hd)
        sV = cute.make_tensor(cute.recast_ptr(sK.iterator, sV_layout.inner), sV_layout.outer)
        sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        sScale = storage.sScale.get_tensor(cute.make_layout(Q_STAGES * self.scale_slots * TILE_M))

        tmem_barrier = pipeline.NamedBarrier(barrier_id=NamedBarrierFwdSm100.TMEM, num_threads=32 * 13)
        tmem = cutlass_memory.TmemAllocator(
            storage.tmem_holding_buf.ptr, barrier_for_retrieve=tmem_barrier,
            allocator_warp_id=12)

        cute.arch.sync_threads()  # barrier init visible to every warp

        # Tile coordinates are derived inside each role, after setmaxnreg: ptxas spills values
        # that live across setmaxnreg to local memory.
        if warp_idx >= 12:
            cute.arch.setmaxregister_decrease(self.regs_other)
        if warp_idx == 14:
            self.load_warp(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
                           tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_kv)
        if warp_idx == 12:
            tmem.allocate(cute.arch.get_max_tmem_alloc_cols("sm_100"))
            tmem_barrier.arrive_and_wait()
            tmem_ptr = tmem.retrieve_ptr(Float32)
            self.mma_warp(tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, tP_layout, tmem_ptr,
                          pipe_q, pipe_kv, bars, mQ, mK, storage.zero.ptr)
            tmem.relinquish_alloc_permit()
            tmem_barrier.arrive_and_wait()  # softmax and correction are done with TMEM
            tmem.free(tmem_ptr)
        if warp_idx == 13:
            self.epilogue_warp(tma_atom_O, mO, sO, bars, mK)
        if warp_idx < 8:
            cute.arch.setmaxregister_increase(self.regs_softmax)
            tmem_barrier.arrive_and_wait()
            tmem_ptr = tmem.retrieve_ptr(Float32)
            self.softmax_wg(warp_idx // 4, tiled_mma_qk, tmem_ptr, sScale, softmax_scale_log2,
                            bars, mQ, mK)
            tmem_barrier.arrive()
        if warp_idx >= 8 and warp_idx < 12:
            cute.arch.setmaxregister_decrease(self.regs_correction)
            tmem_barrier.arrive_and_wait()
            tmem_ptr = tmem.retrieve_ptr(Float32)
            self.correction_wg(tiled_mma_pv, tmem_ptr, sScale, sO, bars, mLSE,
                               softmax_scale_log2, mQ, mK)
            tmem_barrier.arrive()

    # ---------------------------------------------------------------- load warp
    @cute.jit
    def _load_tile(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, thr_qk, thr_pv,
                   pipe_q, pipe_kv, seqlen_q, seqlen_k, num_heads, num_batch, tile, state):
        q_state, kv_state = state
        m_block, head, batch = self._tile_coords(tile, seqlen_q, seqlen_k, num_heads, num_batch)
        n_block_max, _ = self._block_range(m_block, seqlen_q, seqlen_k)
        # Q: the CTA's 256 rows as two 128-row tiles (stage s = tile 2 m_block + s)
        gQ = cute.local_tile(mQ[None, None, head, batch], (TILE_M, self.hd), (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(
            tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 3),
            cute.group_modes(thr_qk.partition_A(gQ), 0, 3))
        gK = cute.local_tile(mK[None, None, head, batch], (TILE_N, self.hd), (None, 0))
        tKsK, tKgK = cpasync.tma_partition(
            tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 3),
            cute.group_modes(thr_qk.partition_B(gK), 0, 3))
        gV = cute.local_tile(mV[None, None, head, batch], (self.hd, TILE_N), (0, None))
        tVsV, tVgV = cpasync.tma_partition(
            tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 3),
            cute.group_modes(thr_pv.partition_B(gV), 0, 3))

        n_last = n_block_max - 1
        # K(last) first: QK0(last) needs it together with Q0
        pipe_kv.producer_acquire(kv_state)
        cute.copy(tma_atom_K, tKgK[None, n_last], tKsK[None, kv_state.index],
                  tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
        kv_state.advance()
        for s in cutlass.range_constexpr(Q_STAGES):
            # free once the previous tile's last QK_s completed (MMA's tcgen05.commit)
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_atom_Q, tQgQ[None, m_block * Q_STAGES + s], tQsQ[None, s],
                      tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
            q_state.advance()
        pipe_kv.producer_acquire(kv_state)
        cute.copy(tma_atom_V, tVgV[None, n_last], tVsV[None, kv_state.index],
                  tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
        kv_state.advance()
        for i in cutlass.range(n_block_max - 1, unroll=1):
            n = n_last - 1 - i
            pipe_kv.producer_acquire(kv_state)
            cute.copy(tma_atom_K, tKgK[None, n], tKsK[None, kv_state.index],
                      tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
            kv_state.advance()
            pipe_kv.producer_acquire(kv_state)
            cute.copy(tma_atom_V, tVgV[None, n], tVsV[None, kv_state.index],
                      tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
            kv_state.advance()
        return (q_state, kv_state)

    @cute.jit
    def load_warp(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
                  tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_kv):
        thr_qk = tiled_mma_qk.get_slice(0)
        thr_pv = tiled_mma_pv.get_slice(0)
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        num_heads, num_batch = mQ.shape[2], mQ.shape[3]
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, Q_STAGES)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        num_tiles = self._num_tiles(seqlen_q, num_heads, num_batch)
        q_state, kv_state = self._for_each_tile(
            partial(self._load_tile, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
                    thr_qk, thr_pv, pipe_q, pipe_kv, seqlen_q, seqlen_k, num_heads, num_batch),
            (q_state, kv_state), num_tiles)
        pipe_kv.producer_tail(kv_state)

    # ---------------------------------------------------------------- MMA warp
    @cute.jit
    def _gemm_qk(self, tiled_mma, tStS, tSrQ, tSrK):
        # a fresh atom per call: its ACCUMULATE field is then local to this GEMM
        tiled_mma = cute.make_tiled_mma(cute.make_mma_atom(tiled_mma.op))
        for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            tiled_mma.set(tcgen05.Field.ACCUMULATE, k != 0)  # zero-init S
            cute.gemm(tiled_mma, tStS, tSrQ[None, None, k], tSrK[None, None, k], tStS)

    @cute.jit
    def _gemm_pv(self, tiled_mma, tOtO, tOrP, tOrV, accumulate, mbar_lastsplit, phase):
        """O_s += P_s V (TS). Starts on "P 3/4"; the last 2 k-steps wait for the last quarter."""
        tiled_mma = cute.make_tiled_mma(cute.make_mma_atom(tiled_mma.op))
        for k in cutlass.range_constexpr(self.pv_ksteps):
            if const_expr(k == self.pv_split_kstep):
                cute.arch.mbarrier_wait(mbar_lastsplit, phase)
            if const_expr(k == 0):
                tiled_mma.set(tcgen05.Field.ACCUMULATE, accumulate)
            else:
                tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
            cute.gemm(tiled_mma, tOtO, tOrP[None, None, k], tOrV[None, None, k], tOtO)

    @cute.jit
    def _mma_fragments(self, thr_qk, thr_pv, sQ, sK, sV, zero_ptr):
        """UMMA operand views (smem descriptors) of Q, K, V, rebuilt at each use from a base the
        compiler cannot prove loop-invariant: hoisted out of the loops, the 2 x hd/16 + 2 x 8
        64-bit descriptors stay live across them and are spilled (the MMA warp has 48
        registers); rebuilding costs a few uniform-datapath ops per KV block."""
        z = cute.assume(_load_volatile_s32(zero_ptr), divby=1024)
        tSrQ = thr_qk.make_fragment_A(cute.make_tensor(sQ.iterator + z, sQ.layout))
        tSrK = thr_qk.make_fragment_B(cute.make_tensor(sK.iterator + z, sK.layout))
        tOrV = thr_pv.make_fragment_B(cute.make_tensor(sV.iterator + z, sV.layout))
        return tSrQ, tSrK, tOrV

    @cute.jit
    def _commit(self, mbar):
        with cute.arch.elect_one():
            tcgen05.commit(mbar)

    @cute.jit
    def _mma_tile(self, thr_qk, thr_pv, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, zero_ptr, tStS,
                  tOtO, tOrP, pipe_q, pipe_kv, bars, seqlen_q, seqlen_k, num_heads, num_batch, tile,
                  state):
        q_state, q_rel_state, kv_state, blk = state
        m_block, head, batch = self._tile_coords(tile, seqlen_q, seqlen_k, num_heads, num_batch)
        n_block_max, _ = self._block_range(m_block, seqlen_q, seqlen_k)
        tSrQ, tSrK, tOrV = self._mma_fragments(thr_qk, thr_pv, sQ, sK, sV, zero_ptr)

        # first block: QK0(last), QK1(last). QK_s overwrites S_s / P_s of the previous
        # tile only after that tile's PV_s was issued (tensor core runs in order).
        pipe_kv.consumer_wait(kv_state)
        k_idx = kv_state.index
        for s in cutlass.range_constexpr(Q_STAGES):
            pipe_q.consumer_wait(q_state)
            self._gemm_qk(tiled_mma_qk, tStS[s], tSrQ[None, None, None, s],
                          tSrK[None, None, None, k_idx])
            self._commit(bars.s_p_o_full + s)
            q_state.advance()
        pipe_kv.consumer_release(kv_state)
        kv_state.advance()

        # steady state for block j: PV0(j+1), QK0(j), PV1(j+1), QK1(j). QK_s overwrites S_s
        # (where P_s lives) only after PV_s was issued: the tensor core runs in order, and
        # PV_s waited for the full P_s, so no "S empty" barrier is needed.
        for i in cutlass.range(n_block_max - 1, unroll=1):
            phase = (blk + i) & 1
            v_state = kv_state.clone()
            pipe_kv.consumer_wait(v_state)
            kv_state.advance()
            pipe_kv.consumer_wait(kv_state)
            v_idx = v_state.index
            k_idx = kv_state.index
            tSrQ, tSrK, tOrV = self._mma_fragments(thr_qk, thr_pv, sQ, sK, sV, zero_ptr)
            for s in cutlass.range_constexpr(Q_STAGES):
                cute.arch.mbarrier_wait(bars.s_p_o_empty + s, phase)
                self._gemm_pv(tiled_mma_pv, tOtO[s], tOrP[s], tOrV[None, None, None, v_idx],
                              i > 0, bars.p_lastsplit + s, phase)
                if const_expr(s == Q_STAGES - 1):
                    pipe_kv.consumer_release(v_state)
                self._gemm_qk(tiled_mma_qk, tStS[s], tSrQ[None, None, None, s],
                              tSrK[None, None, None, k_idx])
                self._commit(bars.s_p_o_full + s)
            pipe_kv.consumer_release(kv_state)
            kv_state.advance()

        # Q's last reader (QK of block 0) is issued: free both Q stages (the commit fires
        # when it completes), so the next tile's Q loads overlap this tile's last PVs
        for s in cutlass.range_constexpr(Q_STAGES):
            pipe_q.consumer_release(q_rel_state)
            q_rel_state.advance()
        # last PV of both Q tiles, then hand O to the correction WG
        tSrQ, tSrK, tOrV = self._mma_fragments(thr_qk, thr_pv, sQ, sK, sV, zero_ptr)
        phase = (blk + n_block_max - 1) & 1
        pipe_kv.consumer_wait(kv_state)
        v_idx = kv_state.index
        for s in cutlass.range_constexpr(Q_STAGES):
            cute.arch.mbarrier_wait(bars.s_p_o_empty + s, phase)
            self._gemm_pv(tiled_mma_pv, tOtO[s], tOrP[s], tOrV[None, None, None, v_idx],
                          n_block_max > 1, bars.p_lastsplit + s, phase)
            self._commit(bars.o_acc + s)
        pipe_kv.consumer_release(kv_state)
        kv_state.advance()
        blk += n_block_max
        return (q_state, q_rel_state, kv_state, blk)

    @cute.jit
    def mma_warp(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, tP_layout, tmem_ptr,
                 pipe_q, pipe_kv, bars, mQ, mK, zero_ptr):
        thr_qk = tiled_mma_qk.get_slice(0)
        thr_pv = tiled_mma_pv.get_slice(0)
        tStS_fake = thr_qk.make_fragment_C(thr_qk.partition_shape_C(self.mma_tiler_qk[:2]))
        tOtO_fake = thr_pv.make_fragment_C(thr_pv.partition_shape_C(self.mma_tiler_pv[:2]))
        tStS = [cute.make_tensor(tmem_ptr + self.tmem_s[s], tStS_fake.layout) for s in range(Q_STAGES)]
        tOtO = [cute.make_tensor(tmem_ptr + self.tmem_o[s], tOtO_fake.layout) for s in range(Q_STAGES)]
        tP = cute.make_tensor(tStS_fake.iterator, tP_layout.outer)
        tOrP_layout = thr_pv.make_fragment_A(tP)[None, None, None, 0].layout
        tOrP = [cute.make_tensor(cute.recast_ptr(tmem_ptr + self.tmem_p[s], dtype=self.dtype),
                                 tOrP_layout) for s in range(Q_STAGES)]

        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        num_heads, num_batch = mQ.shape[2], mQ.shape[3]
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, Q_STAGES)
        q_rel_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, Q_STAGES)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        blk = Int32(0)  # KV blocks done in earlier tiles: phases of s_p_o and p_lastsplit
        num_tiles = self._num_tiles(seqlen_q, num_heads, num_batch)
        q_state, q_rel_state, kv_state, blk = self._for_each_tile(
            partial(self._mma_tile, thr_qk, thr_pv, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV,
                    zero_ptr, tStS, tOtO, tOrP, pipe_q, pipe_kv, bars, seqlen_q, seqlen_k,
                    num_heads, num_batch),
            (q_state, q_rel_state, kv_state, blk), num_tiles)

    # ---------------------------------------------------------------- softmax WGs
    @cute.jit
    def _softmax_tile(self, stage, tidx, thr_ld, tStS_t2r, tScS, thr_st, tStP_r2t, p_shape, sScale,
                      scale_log2, bars, stats_bar, slot, ncol, seqlen_q, seqlen_k, num_heads,
                      num_batch, tile, state):
        blk, n_writes = state
        m_block, head, batch = self._tile_coords(tile, seqlen_q, seqlen_k, num_heads, num_batch)
        n_block_max, n_mask_start = self._block_range(m_block, seqlen_q, seqlen_k)
        row = (m_block * Q_STAGES + stage) * TILE_M + tidx
        row_max = Float32(-math.inf)
        row_sum = Float32(0.0)
        for i in cutlass.range(n_block_max, unroll=1):
            n_block = n_block_max - 1 - i
            cute.arch.mbarrier_wait(bars.s_p_o_full + stage, (blk + i) & 1)
            tSrS = cute.make_rmem_tensor(tScS.shape, Float32)
            cute.copy(thr_ld, tStS_t2r, tSrS)
            cute.arch.fence_view_async_tmem_load()  # tcgen05.wait::ld
            s = cute.make_tensor(tSrS.iterator, cute.make_layout(ncol))
            # mask: the first block (seqlen_k edge) and, causal, the diagonal blocks
            if i == 0 or n_block >= n_mask_start:
                limit = block_info.seqlen_col_limit(n_block, TILE_N, seqlen_k)
                if const_expr(self.causal):
                    limit = cutlass.min(limit, block_info.causal_col_limit(row, n_block, TILE_N, seqlen_q,
                                                                           seqlen_k))
                for c in cutlass.range(ncol, unroll_full=True):
                    s[c] = -Float32.inf if c >= limit else s[c]
            # row max: 4 independent chains (ptxas: FMNMX3), then the online update
            cur = max4(lambda c: s[c], ncol)
            cur = cute.arch.fmax(cur, row_max)
            kept, max_scaled, acc_scale = update_row_max(row_max, cur, scale_log2, self.tau)
            if i == 0:
                # the first block never rescales (no O yet)
                kept = cur
                max_scaled = (cur if cur != -Float32.inf else Float32(0.0)) * scale_log2
                acc_scale = Float32(1.0)
            row_max = kept
            if i > 0:
                # acc_scale -> correction WG (its smem slot freed once the last one was read)
                if n_writes > 0:
                    cute.arch.mbarrier_wait(bars.sm_stats_empty + stage, (n_writes - 1) & 1)
                sScale[slot] = acc_scale
                cute.arch.barrier_arrive(barrier_id=stats_bar, number_of_threads=64)
                n_writes += 1
            # x * scale_log2 - max * scale_log2: one FFMA2 per pair
            neg = -max_scaled
            for c in cutlass.range(0, ncol, 2, unroll_full=True):
                s[c], s[c + 1] = cute.arch.fma_packed_f32x2(
                    (s[c], s[c + 1]), (scale_log2, scale_log2), (neg, neg))
            # exp2 (MUFU, or FA4's polynomial on the FMA pipe), bf16 pack, tcgen05.st in 4
            # chunks of 32 columns; "P 3/4" after chunk 3, "P full" after chunk 4
            tSrP = cute.make_rmem_tensor(p_shape, Float32)
            p16 = cute.make_tensor(cute.recast_ptr(tSrP.iterator, dtype=self.dtype),
                                   cute.make_layout(ncol))
            sum2 = [(Float32(0.0), Float32(0.0)), (Float32(0.0), Float32(0.0))]
            for k in cutlass.range_constexpr(self.p_chunks):
                for c in cutlass.range_constexpr(k * 32, k * 32 + 32, 2):
                    if const_expr(self.emu[c] and self.emu[c + 1]
                                  and self.exp2_emulated_x2 is not None):
                        s[c], s[c + 1] = self.exp2_emulated_x2(s[c], s[c + 1])
                    else:
                        for e in cutlass.range_constexpr(c, c + 2):
                            if const_expr(self.emu[e]):
                                s[e] = exp2_emulated(s[e])
                            else:
                                s[e] = cute.math.exp2(s[e], fastmath=True)
                for c in cutlass.range_constexpr(k * 32, k * 32 + 32, 2):
                    sum2[(c // 2) % 2] = cute.arch.add_packed_f32x2(sum2[(c // 2) % 2], (s[c], s[c + 1]))
                src = cute.make_tensor(s.iterator + k * 32, cute.make_layout(32))
                dst = cute.make_tensor(p16.iterator + k * 32, cute.make_layout(32))
                dst.store(src.load().to(self.dtype))
                cute.copy(thr_st, tSrP[None, None, k], tStP_r2t[None, None, k])
                if const_expr(k + 1 == self.p_split_chunk):
                    cute.arch.fence_view_async_tmem_store()
                    cute.arch.mbarrier_arrive(bars.s_p_o_empty + stage)
            cute.arch.fence_view_async_tmem_store()
            cute.arch.mbarrier_arrive(bars.p_lastsplit + stage)
            tot = cute.arch.add_packed_f32x2(sum2[0], sum2[1])
            row_sum = row_sum * acc_scale + (tot[0] + tot[1])

        # final row_sum (and row_max for the LSE) -> correction WG
        if n_writes > 0:
            cute.arch.mbarrier_wait(bars.sm_stats_empty + stage, (n_writes - 1) & 1)
        sScale[slot] = row_sum
        if const_expr(self.has_lse):
            sScale[slot + TILE_M] = row_max
        cute.arch.barrier_arrive(barrier_id=stats_bar, number_of_threads=64)
        n_writes += 1
        blk += n_block_max
        return (blk, n_writes)

    @cute.jit
    def softmax_wg(self, stage, tiled_mma_qk, tmem_ptr, sScale, scale_log2, bars, mQ, mK):
        tidx = cute.arch.thread_idx()[0] % 128  # = row of this Q tile = TMEM lane
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx()) % 4
        thr_qk = tiled_mma_qk.get_slice(0)
        tStS_fake = thr_qk.make_fragment_C(thr_qk.partition_shape_C(self.mma_tiler_qk[:2]))
        tSAcc = cute.make_tensor(tmem_ptr + self.tmem_s[0] + stage * TILE_N,
                                 tStS_fake.layout)[(None, None), 0, 0]  # (128, 128) fp32
        # S: 4 x tcgen05.ld 32x32b.x32 (32 columns of this thread's row each)
        ld_atom = cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), Float32)
        thr_ld = tcgen05.make_tmem_copy(ld_atom, tSAcc).get_slice(tidx)
        tStS_t2r = thr_ld.partition_S(tSAcc)
        cS = cute.make_identity_tensor((TILE_M, TILE_N))
        tScS = thr_ld.partition_D(thr_qk.partition_C(cS)[(None, None), 0, 0])
        # P: bf16 pairs as fp32 words over columns 64..127 of S_s, 4 x tcgen05.st 32x32b.x16
        tStP = cute.make_tensor(tSAcc.iterator + TILE_N // 2,
                                cute.composition(tSAcc.layout, cute.make_layout((TILE_M, TILE_N // 2))))
        st_atom = cute.make_copy_atom(tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(16)), Float32)
        thr_st = tcgen05.make_tmem_copy(st_atom, tStP).get_slice(tidx)
        tStP_r2t = thr_st.partition_D(tStP)
        p_shape = thr_st.partition_S(cute.make_identity_tensor((TILE_M, TILE_N // 2))).shape

        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        num_heads, num_batch = mQ.shape[2], mQ.shape[3]
        stats_bar = NamedBarrierFwdSm100.SM_STATS + stage * 4 + warp
        slot = stage * self.scale_slots * TILE_M + tidx
        ncol = TILE_N
        blk = Int32(0)  # KV blocks of earlier tiles (s_p_o_full phase)
        n_writes = Int32(0)  # sm_stats values handed over so far (sm_stats_empty phase)
        num_tiles = self._num_tiles(seqlen_q, num_heads, num_batch)
        blk, n_writes = self._for_each_tile(
            partial(self._softmax_tile, stage, tidx, thr_ld, tStS_t2r, tScS, thr_st, tStP_r2t,
                    p_shape, sScale, scale_log2, bars, stats_bar, slot, ncol, seqlen_q, seqlen_k,
                    num_heads, num_batch),
            (blk, n_writes), num_tiles)

    # ---------------------------------------------------------------- correction WG
    @cute.jit
    def _rescale_o(self, tOtO_s, tidx, scale):
        """O row *= scale in TMEM: tcgen05.ld 16 columns -> FMUL2 -> tcgen05.st."""
        chunk = 16
        tOtO_i = cute.composition(tOtO_s, cute.make_layout((TILE_M, chunk)))
        ld = tcgen05.make_tmem_copy(cute.make_copy_atom(
            tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(chunk)), Float32), tOtO_i).get_slice(tidx)
        st = tcgen05.make_tmem_copy(cute.make_copy_atom(
            tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(chunk)), Float32), tOtO_i).get_slice(tidx)
        t2r = ld.partition_S(tOtO_i)
        r2t = st.partition_D(tOtO_i)
        r_shape = ld.partition_D(cute.make_identity_tensor((TILE_M, chunk))).shape
        for k in cutlass.range_constexpr(self.hd // chunk):
            r = cute.make_rmem_tensor(r_shape, Float32)
            cute.copy(ld, cute.make_tensor(t2r.iterator + k * chunk, t2r.layout), r)
            for j in cutlass.range_constexpr(0, cute.size(r), 2):
                r[j], r[j + 1] = cute.arch.mul_packed_f32x2((r[j], r[j + 1]), (scale, scale))
            cute.copy(st, r, cute.make_tensor(r2t.iterator + k * chunk, r2t.layout))

    @cute.jit
    def _o_to_smem(self, thr_pv, tOtO_s, sO_s, tidx, scale):
        """Final O row * (1/row_sum) -> bf16 -> sO (the layout the TMA store reads)."""
        chunk = 32 * 8 // self.dtype.width
        tOsO = thr_pv.partition_C(sO_s)
        tOcO = thr_pv.partition_C(cute.make_identity_tensor(self.mma_tiler_pv[:2]))
        tOtO_i = cute.logical_divide(tOtO_s, cute.make_layout((TILE_M, chunk)))
        tOsO_i = cute.logical_divide(tOsO, cute.make_layout((TILE_M, chunk)))
        tOcO_i = cute.logical_divide(tOcO, cute.make_layout((TILE_M, chunk)))
        ld_op = sm100_utils.get_tmem_load_op(
            self.mma_tiler_pv, LayoutEnum.ROW_MAJOR, self.dtype, Float32,
            (TILE_M, chunk), use_2cta_instrs=False)
        tiled_ld = tcgen05.make_tmem_copy(ld_op, tOtO_i[(None, None), 0])
        thr_ld = tiled_ld.get_slice(tidx)
        st_op = sm100_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, self.dtype, Float32, tiled_ld)
        tiled_st = cute.make_tiled_copy_D(st_op, tiled_ld)
        t2r = thr_ld.partition_S(tOtO_i[(None, None), None])
        r2s = thr_ld.partition_D(tOsO_i[(None, None), None])
        cO = thr_ld.partition_D(tOcO_i[(None, None), None])
        for k in cutlass.range_constexpr(self.hd // chunk):
            r = cute.make_rmem_tensor(cO[None, 0, 0, k].shape, Float32)
            cute.copy(tiled_ld, t2r[None, 0, 0, k], r)
            for j in cutlass.range_constexpr(0, cute.size(r), 2):
                r[j], r[j + 1] = cute.arch.mul_packed_f32x2((r[j], r[j + 1]), (scale, scale))
            r16 = cute.make_rmem_tensor(r.shape, self.dtype)
            r16.store(r.load().to(self.dtype))
            cute.copy(tiled_st, r16, r2s[None, 0, 0, k])

    @cute.jit
    def _correction_tile(self, thr_pv, tOtO, sScale, sO, bars, mLSE, scale_log2, tidx, warp,
                         seqlen_q, seqlen_k, num_heads, num_batch, tile, state):
        n_tiles_done, = state
        m_block, head, batch = self._tile_coords(tile, seqlen_q, seqlen_k, num_heads, num_batch)
        n_block_max, _ = self._block_range(m_block, seqlen_q, seqlen_k)
        for i in cutlass.range(n_block_max - 1, unroll=1):
            for s in cutlass.range_constexpr(Q_STAGES):
                # acc_scale of the next block (S_s full there implies the previous PV_s done)
                cute.arch.barrier(barrier_id=NamedBarrierFwdSm100.SM_STATS + s * 4 + warp, number_of_threads=64)
                scale = sScale[s * self.scale_slots * TILE_M + tidx]
                cute.arch.mbarrier_arrive(bars.sm_stats_empty + s)
                # warp-uniform: touch O only if some row of this warp moved its max
                if cute.arch.vote_any_sync(scale < Float32(1.0)):
                    self._rescale_o(tOtO[s], tidx, scale)
                    cute.arch.fence_view_async_tmem_store()
                cute.arch.mbarrier_arrive(bars.s_p_o_empty + s)
        for s in cutlass.range_constexpr(Q_STAGES):
            cute.arch.barrier(barrier_id=NamedBarrierFwdSm100.SM_STATS + s * 4 + warp, number_of_threads=64)
            row_sum = sScale[s * self.scale_slots * TILE_M + tidx]
            row_max = Float32(0.0)
            if const_expr(self.has_lse):
                row_max = sScale[s * self.scale_slots * TILE_M + TILE_M + tidx]
            cute.arch.mbarrier_arrive(bars.sm_stats_empty + s)
            # fully masked rows (row_sum 0) give O = 0 instead of NaN
            inv = cute.arch.rcp_approx(row_sum if row_sum != Float32(0.0) else Float32(1.0))
            cute.arch.mbarrier_wait(bars.o_acc + s, n_tiles_done & 1)
            if n_tiles_done > 0:  # the previous tile's TMA store has read sO[s]
                cute.arch.mbarrier_wait(bars.o_epi_empty + s, (n_tiles_done - 1) & 1)
            self._o_to_smem(thr_pv, tOtO[s], sO[None, None, s], tidx, inv)
            cute.arch.fence_view_async_tmem_load()
            cute.arch.fence_view_async_shared()  # generic-proxy smem writes -> TMA store
            cute.arch.mbarrier_arrive(bars.o_epi_full + s)
            cute.arch.mbarrier_arrive(bars.s_p_o_empty + s)  # O_s free for the next tile
            if const_expr(self.has_lse):
                row = (m_block * Q_STAGES + s) * TILE_M + tidx
                if row < seqlen_q:
                    lse = Float32(-math.inf)
                    if row_sum != Float32(0.0):
                        lse = (row_max * scale_log2 + cute.math.log2(row_sum, fastmath=True)) * LN_2
                    mLSE[row, head, batch] = lse
        n_tiles_done += 1
        return (n_tiles_done,)

    @cute.jit
    def correction_wg(self, tiled_mma_pv, tmem_ptr, sScale, sO, bars, mLSE, scale_log2, mQ, mK):
        tidx = cute.arch.thread_idx()[0] % 128
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx()) % 4
        thr_pv = tiled_mma_pv.get_slice(0)
        tOtO_fake = thr_pv.make_fragment_C(thr_pv.partition_shape_C(self.mma_tiler_pv[:2]))
        tOtO = [cute.make_tensor(tmem_ptr + self.tmem_o[s], tOtO_fake.layout) for s in range(Q_STAGES)]

        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        num_heads, num_batch = mQ.shape[2], mQ.shape[3]
        # The first PV_s of a tile overwrites O_s (zero-init): it only needs O_s read out, which
        # for the first tile is trivially true and later is the arrive after O -> smem.
        for s in cutlass.range_constexpr(Q_STAGES):
            cute.arch.mbarrier_arrive(bars.s_p_o_empty + s)
        n_tiles_done = Int32(0)
        num_tiles = self._num_tiles(seqlen_q, num_heads, num_batch)
        n_tiles_done, = self._for_each_tile(
            partial(self._correction_tile, thr_pv, tOtO, sScale, sO, bars, mLSE, scale_log2, tidx,
                    warp, seqlen_q, seqlen_k, num_heads, num_batch),
            (n_tiles_done,), num_tiles)

    # ---------------------------------------------------------------- epilogue warp
    @cute.jit
    def _epilogue_tile(self, tma_atom_O, mO, sO, bars, seqlen_q, seqlen_k, num_heads, num_batch,
                       tile, state):
        n_tiles_done, = state
        m_block, head, batch = self._tile_coords(tile, seqlen_q, seqlen_k, num_heads, num_batch)
        gO = cute.local_tile(mO[None, None, head, batch], (TILE_M, self.hd), (None, 0))
        tOsO, tOgO = cpasync.tma_partition(
            tma_atom_O, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2),
            cute.group_modes(gO, 0, 2))
        for s in cutlass.range_constexpr(Q_STAGES):
            cute.arch.mbarrier_wait(bars.o_epi_full + s, n_tiles_done & 1)
            cute.copy(tma_atom_O, tOsO[None, s], tOgO[None, m_block * Q_STAGES + s])
            cute.arch.cp_async_bulk_commit_group()
        for s in cutlass.range_constexpr(Q_STAGES):
            # sO[s] may be rewritten once its store has read it
            cute.arch.cp_async_bulk_wait_group(Q_STAGES - 1 - s, read=True)
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive(bars.o_epi_empty + s)
        n_tiles_done += 1
        return (n_tiles_done,)

    @cute.jit
    def epilogue_warp(self, tma_atom_O, mO, sO, bars, mK):
        seqlen_q, seqlen_k = mO.shape[0], mK.shape[0]
        num_heads, num_batch = mO.shape[2], mO.shape[3]
        n_tiles_done = Int32(0)
        num_tiles = self._num_tiles(seqlen_q, num_heads, num_batch)
        n_tiles_done, = self._for_each_tile(
            partial(self._epilogue_tile, tma_atom_O, mO, sO, bars, seqlen_q, seqlen_k, num_heads,
                    num_batch),
            (n_tiles_done,), num_tiles)
        cute.arch.cp_async_bulk_wait_group(0, read=True)  # sO must outlive the reads


# -------------------------------------------------------------------------- CPU compile
def _fake_args(cfg: Sm100Config):
    """Fake tensors with dynamic batch / seqlen / heads / strides (16-byte aligned rows)."""
    from cutlass.cute.runtime import make_fake_tensor

    dt = cutlass.BFloat16 if cfg.dtype == "bfloat16" else cutlass.Float16
    div = 128 // dt.width

    def fake(shape):
        stride = tuple(cute.sym_int64(divisibility=div) for _ in range(3)) + (1,)
        return make_fake_tensor(dt, shape, stride=stride, assumed_align=16)

    b, sq, sk, h = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
    lse = None
    if cfg.has_lse:
        lse = make_fake_tensor(Float32, (b, h, sq), stride=(cute.sym_int64(), cute.sym_int64(), 1),
                               assumed_align=4)
    return (fake((b, sq, h, cfg.head_dim)), fake((b, sk, h, cfg.head_dim)),
            fake((b, sk, h, cfg.head_dim)), fake((b, sq, h, cfg.head_dim)), lse)


COMPILE_TIMES: dict = {}
B200_SMS = 148  # only a compile-time placeholder: max_ctas is a runtime argument


def compile_sm100_config(cfg: Sm100Config, dump_dir: Optional[str] = None) -> str:
    """Compile one configuration for sm_100a against fake tensors (no GPU); return its SASS.
    COMPILE_TIMES[cfg] holds the seconds spent in cute.compile. (fa4kernel.compile_sass with
    arch="sm_100a" is the public way.)"""
    import time

    from ..sass import sass_for

    def build(options):
        q, k, v, o, lse = _fake_args(cfg)
        stream = cute.runtime.make_fake_stream()
        t0 = time.perf_counter()
        cute.compile(FlashFwdSm100(cfg), q, k, v, o, lse, Float32(1.0), Int32(B200_SMS), stream,
                     options=options)
        COMPILE_TIMES[cfg] = time.perf_counter() - t0

    return sass_for(build, "sm_100a", dump_dir)


def compile_sm100_sass(head_dim=128, causal=False, exp_emulation=DEFAULT_EXP_EMULATION,
                       rescale_threshold=DEFAULT_RESCALE_THRESHOLD, kv_stages=None,
                       dtype="bfloat16", return_lse=False, dump_dir: Optional[str] = None) -> str:
    """compile_sm100_config of the knobs, validated first (one-line ValueError)."""
    cfg = make_sm100_config(head_dim, causal, exp_emulation, rescale_threshold, kv_stages, dtype,
                            return_lse)
    return compile_sm100_config(cfg, dump_dir)


# ---------------------------------------------------------------- runtime (not yet run on a B200)
_RUN_CACHE: dict = {}


def attention_sm100(q, k, v, causal: bool = False, softmax_scale: Optional[float] = None,
                    return_lse: bool = False, **knobs):
    """softmax(q k^T * scale) v on a Blackwell (sm_100) GPU; q, k, v (batch, seqlen, heads, hd).

    Not yet run on a GPU: it follows the compile path that compile_sm100_config checks on the
    CPU (tests/test_kernel_sm100_compile.py), but has not met an sm_100 device. Returns out (and lse (batch, heads, seqlen_q) fp32,
    natural log, if return_lse). Needs seqlen_k >= 1.
    """
    import torch

    from ..inputs import validate_tensors
    from ..interop import to_cute, torch_stream

    b, sq, sk, h, d, dtype = validate_tensors(q, k, v, causal, softmax_scale, return_lse,
                                              head_dims=SUPPORTED_HEAD_DIMS)
    cfg = make_sm100_config(d, causal, dtype=dtype, return_lse=return_lse, **knobs)
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 10:
        raise ValueError("attention_sm100 needs q, k, v on a Blackwell (sm_100) GPU")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device) if return_lse else None
    args = [to_cute(t, 3) for t in (q, k, v, out)]
    lse_c = to_cute(lse, 2, align=4) if lse is not None else None
    stream = torch_stream(q.device)
    scale_log2 = Float32(softmax_scale * math.log2(math.e))
    sms = Int32(torch.cuda.get_device_properties(q.device).multi_processor_count)
    fn = _RUN_CACHE.get(cfg)
    if fn is None:
        fn = cute.compile(FlashFwdSm100(cfg), *args, lse_c, scale_log2, sms, stream)
        _RUN_CACHE[cfg] = fn
    fn(*args, lse_c, scale_log2, sms, stream)
    return (out, lse) if return_lse else out
