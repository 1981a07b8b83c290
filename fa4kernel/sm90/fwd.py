"""FlashAttention forward for Hopper (SM90) in the CuTe DSL: fa4lab's own kernel.

Warp roles (one CTA = one tile_m x head_dim output tile of one (batch, head); with GQA / MQA
the k/v head is head // (heads // heads_kv)):
  warpgroup 0        producer; warp 0 issues every TMA load (Q once, then K/V blocks) into
                     mbarrier pipelines; registers dropped with setmaxnreg.
  warpgroups 1..n    consumers (n = tile_m / 64), each owns 64 query rows: wgmma S = Q K^T
                     (SS), online softmax in registers (a row lives in a quad of 4 threads),
                     wgmma O += P V with P from registers (RS) or staged in smem (SS).

Schedules (compile-time knobs, see config.py):
  pingpong          named barriers hand the tensor core from consumer WG i to WG i+1, so one
                    WG's softmax overlaps the other's GEMMs.
  intra_wg_overlap  per WG: issue S(j) = Q K(j)^T and O += P(j-1) V(j-1) back to back, do the
                    softmax of S(j) while the PV GEMM runs.
  exp_emulation     fraction of each row's exp2 computed on the FMA pipe (softmax.py).
  rescale_threshold FA4's conditional rescaling (softmax.update_row_max_log2); O is only touched
                    when some row of the warp actually changed its max.
KV blocks run from the last to the first, so the (partially) masked blocks come first
(block_info.py). Diagnostic builds (diagnostics.py) add clock64 stamps through self.ins
(instrument.py); in the normal build those calls emit nothing.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory as cutlass_memory
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from .. import block_info
from ..convert import to_16bit
from ..diagnostics import NONE, Diagnostics
from ..instrument import Instrument
from ..softmax import emulated_columns, exp2, max4, update_row_max_log2
from ..trace_layout import (
    T_CVT, T_EXP, T_FIN, T_LK, T_LQ, T_LV, T_MASK, T_MAX, T_PP, T_PV, T_QK, T_RESC, T_ST,
    T_WAIT_K, T_WAIT_PP, T_WAIT_V,
)
from .config import KernelConfig
from .gemm import acc_as_operand_a, gemm, mn_view, opaque_desc, select, smem_layout, transpose_view
from .named_barrier import NamedBarrierFwd
from .row_store import store_rows, zero_rows

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


class FlashFwdSm90:
    """One compiled variant per (KernelConfig, Diagnostics)."""

    def __init__(self, cfg: KernelConfig, diag: Diagnostics = NONE):
        self.cfg = cfg
        self.dtype = cutlass.BFloat16 if cfg.dtype == "bfloat16" else cutlass.Float16
        self.hd = cfg.head_dim
        self.tile_m = cfg.tile_m
        self.tile_n = cfg.tile_n
        self.stages = cfg.kv_stages
        self.num_wg = cfg.num_consumer_wgs
        self.num_consumer_threads = 128 * self.num_wg
        self.num_threads = cfg.num_threads
        self.consumer_regs, self.producer_regs = cfg.regs
        self.causal = cfg.causal
        self.pingpong = cfg.pingpong
        self.overlap = cfg.intra_wg_overlap
        self.p_rs = cfg.p_in_registers
        self.tau = float(cfg.rescale_threshold)
        # elements of one row held by one thread (a row is spread over a quad)
        self.cols_per_thread = self.tile_n // 4
        # Persistent CTAs: O gets its own smem buffer when it fits, so the next tile's Q can
        # land while this tile's O is stored; otherwise O reuses Q's buffer and Q is released
        # only after the O store has read it.
        self.separate_o = cfg.separate_o
        # The `persistent` knob (config.resolve_knobs; auto: where O has its own buffer, so one
        # tile's O store overlaps the next tile's Q/K loads).
        self.persistent = bool(cfg.persistent)
        # Which tiles a CTA runs comes from the host's table (tile_schedule.py) for persistent
        # and causal launches; a non-persistent non-causal CTA runs tile blockIdx.x.
        # The decode build (KernelConfig.decode, FlashFwdSm90Decode): one CTA per (Q tile of
        # packed rows, split, k/v head, batch row), its KV range from the row's key count.
        self.decode = bool(cfg.decode)
        self.split_kv = bool(cfg.split_kv)
        assert not self.decode or (self.overlap and not self.persistent), "decode: overlap, one CTA per tile"
        # The varlen build (KernelConfig.varlen, FlashFwdSm90Varlen): the batch's Q tiles counted
        # on the device from cu_seqlens (_varlen_seek); a persistent CTA takes the next tile from
        # a tile counter when it frees up (_produce_varlen), otherwise one CTA per tile. O leaves by
        # TMA where the tile lies inside its sequence, else through row-predicated stores.
        self.varlen = bool(cfg.varlen)
        assert not (self.varlen and self.decode), "varlen: not decode"
        # pack-GQA in the varlen build (KernelConfig.pack_gqa): q holds total_q x group rows of
        # one head (row r = token r // group); group comes at run time, as in decode
        self.pack_gqa = bool(cfg.pack_gqa)
        assert self.varlen or not self.pack_gqa, "pack_gqa: the varlen build's"
        self.scheduled = (self.persistent or self.causal) and not self.decode and not self.varlen
        # O *= scale of the previous block while this block's S GEMM runs, before the PV GEMM
        # (FA4's RescaleOBeforeGemm for head dims > 128) instead of after the PV wait
        self.rescale_before_pv = bool(cfg.rescale_before_pv) and self.overlap
        self.chained_row_sum = bool(cfg.chained_row_sum)
        self.early_q_release = bool(cfg.early_q_release) and self.overlap and self.separate_o
        self.defer_store_wait = bool(cfg.defer_o_store_wait) and self.separate_o
        self.emu_cols = emulated_columns(self.cols_per_thread, cfg.exp_emulation)
        # diagnostic builds: the stamps (instrument.py) and the timing-only variants
        self.ins = Instrument(diag)
        self.skip_softmax = diag.skip_softmax
        self.ablate = diag.ablated

    # ------------------------------------------------------------------ host side (traced)
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (b, s_q, h, d)
        mK: cute.Tensor,  # (b, s_k, h_kv, d), h_kv divides h
        mV: cute.Tensor,  # (b, s_k, h_kv, d)
        mO: cute.Tensor,  # (b, s_q, h, d)
        mLSE,  # (b, h, s_q) fp32 or None
        mSched,  # persistent or causal: (CTAs, width) int32 tile ids per CTA, -1 ended (tile_schedule.py)
        softmax_scale_log2: Float32,
        stream,
    ):
        self._host(mQ, mK, mV, mO, mLSE, mSched, softmax_scale_log2, stream, None)

    @cute.jit
    def _host(self, mQ, mK, mV, mO, mLSE, mSched, softmax_scale_log2, stream, mTrace, dec=None, var=None):
        dtype = self.dtype
        # (s, d, h, b): the TMA box walks seqlen x head_dim of one (head, batch)
        mQ, mK, mV, mO = [select(t, [1, 3, 2, 0]) for t in (mQ, mK, mV, mO)]
        if const_expr(mLSE is not None):
            mLSE = select(mLSE, [2, 1, 0])  # (s, h, b)

        tiled_mma_qk = sm90_helpers.make_trivial_tiled_mma(
            dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
            atom_layout_mnk=(self.num_wg, 1, 1), tiler_mn=(64, self.tile_n),
        )
        tiled_mma_pv = sm90_helpers.make_trivial_tiled_mma(
            dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN, Float32,
            atom_layout_mnk=(self.num_wg, 1, 1), tiler_mn=(64, self.hd),
            a_source=warpgroup.OperandSource.RMEM if const_expr(self.p_rs) else warpgroup.OperandSource.SMEM,
        )

        sQ_layout = smem_layout(dtype, self.tile_m, self.hd)
        sK_layout = smem_layout(dtype, self.tile_n, self.hd, self.stages)
        sV_layout = smem_layout(dtype, self.tile_n, self.hd, self.stages)
        sP_layout = None
        if const_expr(not self.p_rs):
            sP_layout = smem_layout(dtype, self.tile_m, self.tile_n)

        tma_load = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(tma_load, mQ, sQ_layout, (self.tile_m, self.hd))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(
            tma_load, mK, cute.select(sK_layout, mode=[0, 1]), (self.tile_n, self.hd), 1)
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(
            tma_load, mV, cute.select(sV_layout, mode=[0, 1]), (self.tile_n, self.hd), 1)
        # O goes out through smem (reusing Q's buffer) with a TMA store: clipped at seqlen_q.
        if const_expr(self.split_kv):
            tma_atom_O, tma_O = None, mO  # fp32 partials: stored from registers (_store_partial)
        else:  # varlen: a tile whose rows all lie in its sequence (_epilogue; the others: _store_o_rows)
            tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mO, sQ_layout, (self.tile_m, self.hd))

        self.q_bytes = cute.size_in_bytes(dtype, sQ_layout)
        self.kv_bytes = cute.size_in_bytes(dtype, cute.select(sK_layout, mode=[0, 1]))

        stages = self.stages
        p_elems = cute.cosize(sP_layout) if const_expr(sP_layout is not None) else 0
        o_elems = cute.cosize(sQ_layout) if const_expr(self.separate_o) else 0

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * stages]
            tile_slot: cute.struct.MemRange[Int32, 2 if self.varlen else 0]  # varlen: the producer's tiles to the consumers
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sV_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[dtype, p_elems], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[dtype, o_elems], 1024]

        self.shared_storage = SharedStorage

        # scheduled: CTA c runs the tiles of row c of the host's table (tile_schedule.py);
        # otherwise one CTA per tile
        grid = (cute.ceil_div(mQ.shape[0], self.tile_m) * cute.size(mQ.shape[2]) * cute.size(mQ.shape[3]), 1, 1)
        if const_expr(self.scheduled):
            grid = (cute.size(mSched.shape[0]), 1, 1)
        mSeqUsedK, group, num_splits = None, None, None
        if const_expr(self.decode):
            mSeqUsedK, group, num_splits = dec
            grid = (grid[0] * num_splits, 1, 1)
        mCuSeqlensQ, mCuSeqlensK, mTileCounter = None, None, None
        if const_expr(self.varlen):
            # num_ctas from the host (varlen.py grid_ctas): the SMs' worth when persistent, else
            # a bound on the batch's Q tiles; a CTA without a tile exits at once
            mCuSeqlensQ, mCuSeqlensK, num_ctas, mTileCounter = var[:4]
            grid = (num_ctas, 1, 1)
            if const_expr(self.pack_gqa):
                group = var[4]  # to the roles with the decode build's arguments (dec)
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O, tma_O,
            mLSE, mSched, softmax_scale_log2, tiled_mma_qk, tiled_mma_pv,
            sQ_layout, sK_layout, sV_layout, sP_layout, mTrace, mSeqUsedK, group, num_splits,
            mCuSeqlensQ, mCuSeqlensK, mTileCounter, mO if const_expr(self.varlen) else None,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ------------------------------------------------------------------ device side
    @cute.jit
    def _kv_block_range(self, m_block, seqlen_q, seqlen_k):
        """(n_block_max, n_block_unmasked_end) of Q tile m_block (block_info.kv_block_range):
        blocks [0, n_block_max) are visited; for causal, blocks >= n_block_unmasked_end need
        the diagonal mask."""
        return block_info.kv_block_range(m_block, self.tile_m, self.tile_n, seqlen_q, seqlen_k,
                                         self.causal, block_info.dsl_ops())

    @cute.kernel
    def kernel(
        self,
        tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor,
        tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
        tma_atom_V: cute.CopyAtom, mV: cute.Tensor,
        tma_atom_O: cute.CopyAtom, mO: cute.Tensor,
        mLSE,
        mSched,
        softmax_scale_log2: Float32,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sP_layout,
        mTrace,
        mSeqUsedK=None,
        group=None,
        num_splits=None,
        mCuSeqlensQ=None,
        mCuSeqlensK=None,
        mTileCounter=None,
        mORows=None,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tr_cta = self.ins.kernel_start(mTrace)
        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O):
                if const_expr(atom is not None):
                    cpasync.prefetch_descriptor(atom)

        smem = cutlass_memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        # Pipelines: the producer warp's one elected thread arms each stage with the TMA byte
        # count; every consumer warp releases a stage with one arrive (lane 0).
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_consumer_threads // 32)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=1, producer_group=producer,
            consumer_group=consumers, tx_count=self.q_bytes, defer_sync=True)
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=self.kv_bytes, defer_sync=True)
        pipe_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=self.kv_bytes, defer_sync=True)
        cute.arch.mbarrier_init_fence()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sP = None
        if const_expr(sP_layout is not None):
            sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)

        sO = sQ
        if const_expr(self.separate_o):
            sO = storage.sO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)

        cute.arch.sync_threads()  # barrier init visible to everyone

        roles = (tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, tma_atom_O, mO, mLSE, softmax_scale_log2,
                 tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sP, sO, pipe_q, pipe_k, pipe_v, mSched, mTrace, tr_cta,
                 (mSeqUsedK, group, num_splits))
        var = None
        if const_expr(self.varlen):
            # O twice: the TMA view (full tiles) and the tensor itself (a partial tile's row stores)
            roles = (*roles[:7], (mO, mORows), *roles[8:])
            var = (mCuSeqlensQ, mCuSeqlensK, mTileCounter, storage.tile_slot.get_tensor(cute.make_layout(2)))
        self._roles(*roles, var)

    @cute.jit
    def _roles(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, tma_atom_O, mO, mLSE, softmax_scale_log2,
               tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sP, sO, pipe_q, pipe_k, pipe_v, mSched, mTrace, tr_cta,
               dec, var=None):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx < 4:
            # ---------------------------------------------------------------- producer WG
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
                              pipe_q, pipe_k, pipe_v, mSched, mTrace, tr_cta, dec, var)
        else:
            # ---------------------------------------------------------------- consumer WGs
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consumer(
                tma_atom_O, mO, mLSE, softmax_scale_log2, tiled_mma_qk, tiled_mma_pv,
                sQ, sK, sV, sP, sO, pipe_q, pipe_k, pipe_v, mQ.shape[0], mK.shape[0],
                mQ.shape[2], mQ.shape[3], mSched, mTrace, tr_cta, (*dec, sV), var,
            )

    @cute.jit
    def _varlen_chunk(self, base, mCuSeqlensQ, mCuSeqlensK, group=None):
        """Varlen build, one warp: lane i holds sequence base + i's offsets (q start, q end, k
        start, k end); a lane past the last sequence holds an empty one. pack_gqa: q's offsets in
        packed rows (x group)."""
        s = base + cute.arch.lane_idx()
        q0, q1, k0, k1 = Int32(0), Int32(0), Int32(0), Int32(0)
        if s < mCuSeqlensQ.shape[0] - 1:
            q0, q1 = mCuSeqlensQ[s], mCuSeqlensQ[s + 1]
            if const_expr(self.pack_gqa):
                q0, q1 = q0 * group, q1 * group
            k0, k1 = mCuSeqlensK[s], mCuSeqlensK[s + 1]
        return q0, q1, k0, k1

    @cute.jit
    def _varlen_counts(self, q0, q1, num_heads):
        """Varlen build, one warp: (this lane's sequence's tiles, Q tiles x heads; their inclusive
        prefix sum over the warp's lanes, five shuffles up)."""
        lane = cute.arch.lane_idx()
        cnt = (q1 - q0 + (self.tile_m - 1)) // self.tile_m * num_heads
        incl = cnt
        for i in cutlass.range_constexpr(5):
            y = cute.arch.shuffle_sync_up(incl, 1 << i)
            if lane >= (1 << i):
                incl = incl + y
        return cnt, incl

    @cute.jit
    def _varlen_seek(self, t, num_heads, mCuSeqlensQ, mCuSeqlensK, base, acc, q0, q1, k0, k1, group=None):
        """Varlen build, one warp (warp-uniform result): tile t of the batch, counted sequence by
        sequence (each sequence's Q tiles x heads), found by a prefix sum over the 32 sequences of
        the chunk the cursor (base, acc: its first sequence and the tiles before it; q0..k1: its
        offsets, _varlen_chunk) holds, moving on chunk by chunk. t only grows from call to call,
        so the next call starts where this one stopped and, within a chunk, reads no memory.
        Returns (sequence, tiles before it, its first row, rows, first key, keys, tiles up to the
        chunk's end) and the cursor; sequence >= the batch's sequences: no tile t, and the last
        value is the batch's tile count. group: pack_gqa's (_varlen_chunk)."""
        nseq = mCuSeqlensQ.shape[0] - 1
        cnt, incl = self._varlen_counts(q0, q1, num_heads)
        # lanes whose inclusive count ends at or before t: a prefix of the warp (counts >= 0)
        n_le = cute.arch.popc(cute.arch.vote_ballot_sync(acc + incl <= t))
        while n_le == 32 and base + 32 < nseq:
            acc = acc + cute.arch.shuffle_sync(incl, 31)
            base = base + 32
            q0, q1, k0, k1 = self._varlen_chunk(base, mCuSeqlensQ, mCuSeqlensK, group)
            cnt, incl = self._varlen_counts(q0, q1, num_heads)
            n_le = cute.arch.popc(cute.arch.vote_ballot_sync(acc + incl <= t))
        before = acc + cute.arch.shuffle_sync(incl - cnt, n_le)
        off_q, end_q = cute.arch.shuffle_sync(q0, n_le), cute.arch.shuffle_sync(q1, n_le)
        off_k, end_k = cute.arch.shuffle_sync(k0, n_le), cute.arch.shuffle_sync(k1, n_le)
        total = acc + cute.arch.shuffle_sync(incl, 31)  # the batch's tile count once past its last sequence
        return (base + n_le, before, off_q, end_q - off_q, off_k, end_k - off_k, total), (base, acc, q0, q1, k0, k1)

    @cute.jit
    def _varlen_coords(self, t, found, num_heads):
        """Varlen build: tile t inside its sequence (found: _varlen_seek's) -> (m_block, head,
        sequence, its first row, rows, its first key, keys). Without a mask heads in turn, each
        head's Q tiles fastest (the CTAs running together share one head's K/V in L2); with a
        causal mask the Q tiles from the last (the longest) down, the sequence's heads inner, so
        the cheap tiles come last and even out the tail (a head's tiles in turn left its longest
        tile to start among the launch's last ones)."""
        seq, before, off_q, len_q, off_k, len_k = found[:6]
        num_m = (len_q + (self.tile_m - 1)) // self.tile_m
        r = t - before
        if const_expr(self.causal):
            m_rev = r // num_heads
            head = r - m_rev * num_heads
            m_block = num_m - 1 - m_rev
        else:
            head = r // num_m
            m_block = r - head * num_m
        return (m_block, head, seq, off_q, len_q, off_k, len_k)

    @cute.jit
    def _varlen_blocks(self, var, group=None):
        """Varlen build: (n_block_max, n_unmasked) of the tile's sequence; a sequence without keys
        still runs one block, fully masked (O 0, lse -inf). pack_gqa: by the rows' tokens
        (block_info.packed_kv_block_range)."""
        n_block_max, n_unmasked = None, None
        if const_expr(self.pack_gqa):
            n_block_max, n_unmasked, _ = block_info.packed_kv_block_range(
                var[0], self.tile_m, self.tile_n, var[4], group, var[6], self.causal, block_info.dsl_ops())
        else:
            n_block_max, n_unmasked = self._kv_block_range(var[0], var[4], var[6])
        return cutlass.max(n_block_max, 1), n_unmasked

    @cute.jit
    def _tile_coords(self, tile, seqlen_q, seqlen_k, num_heads, num_batch):
        """Flat tile index -> (m_block, head, batch), m_block fastest (non-causal: the CTAs
        running together share one head's K/V in L2; causal: the host's schedule orders tiles)."""
        num_m = cute.ceil_div(seqlen_q, self.tile_m)
        hb = tile // num_m
        m_block = tile - hb * num_m
        batch = hb // num_heads
        return m_block, hb - batch * num_heads, batch

    @cute.jit
    def _decode_tile(self, tile, rows, seqlen_cache, num_heads, dec):
        """Decode build: flat tile index (m_block fastest, then split, k/v head, batch) ->
        (m_block, split, head, batch) and the split's KV range (block_info.decode_block_range)."""
        mSeqUsedK, group, num_splits = dec[0], dec[1], dec[2]
        num_m = cute.ceil_div(rows, self.tile_m)
        rest = tile // num_m
        m_block = tile - rest * num_m
        hb = rest // num_splits
        split = rest - hb * num_splits
        batch = hb // num_heads
        head = hb - batch * num_heads
        rng = block_info.decode_block_range(m_block, split, num_splits, self.tile_m, self.tile_n, rows, group,
                                            mSeqUsedK[batch], seqlen_cache, self.causal, block_info.dsl_ops())
        return m_block, split, head, batch, rng

    @cute.jit
    def producer(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
                 pipe_q, pipe_k, pipe_v, mSched=None, mTrace=None, tr_cta=None, dec=None, var=None):
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        tr_on = self.ins.leader(tr_cta, lambda: cute.arch.thread_idx()[0] == 0)
        if const_expr(self.scheduled):
            cta = cute.arch.block_idx()[0]
            i = Int32(0)
            tile = mSched[cta, 0]
            while tile >= 0:
                nxt = mSched[cta, i + 1]  # loaded ahead: its latency hides behind this tile
                kv_state, q_state = self._produce_tile(
                    tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
                    pipe_q, pipe_k, pipe_v, tile, kv_state, q_state,
                    self.ins.tile(mTrace, tr_on, Int32(0), i))
                i += 1
                tile = nxt
        elif const_expr(self.varlen):
            self._produce_varlen(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
                                 pipe_q, pipe_k, pipe_v, kv_state, q_state, dec, var)
        else:
            tile = cute.arch.block_idx()[0]
            self._produce_tile(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
                               pipe_q, pipe_k, pipe_v, tile, kv_state, q_state,
                               self.ins.tile(mTrace, tr_on, Int32(0)), dec)

    @cute.jit
    def _produce_varlen(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
                        pipe_q, pipe_k, pipe_v, kv_state, q_state, dec, var):
        """Varlen build, the producer warp: its first tile is blockIdx.x, each further one
        gridDim.x + the tile counter's next value (persistent: an atomic add once the tile's last
        load is issued, so CTAs take tiles as they free up); each tile's index goes to the consumers through
        tile_slot (two slots, alternating: the slot a tile writes was last read two tiles ago, before
        the Q release this producer has waited for), then -1 for the end, with an arrival on Q's
        barrier that loads nothing. The CTA whose fetch is the launch's last (value tiles - 1)
        zeroes the counter for the next launch."""
        mCuQ, mCuK, mCounter, sSlot = var
        nseq = mCuQ.shape[0] - 1
        lane = cute.arch.lane_idx()
        grid = cute.arch.grid_dim()[0]
        t = cute.arch.block_idx()[0]
        group = dec[1]  # pack_gqa's, else None
        found, cur = self._varlen_seek(t, mQ.shape[2], mCuQ, mCuK, Int32(0), Int32(0),
                                       *self._varlen_chunk(Int32(0), mCuQ, mCuK, group), group)
        raw = Int32(-2)  # the counter's value this CTA last fetched (-2: none)
        i = Int32(0)
        while found[0] < nseq:
            sSlot[i % 2] = t
            kv_state, q_state = self._produce_tile(
                tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, pipe_q, pipe_k, pipe_v,
                t, kv_state, q_state, None, dec, self._varlen_coords(t, found, mQ.shape[2]))
            i += 1
            if const_expr(self.persistent):
                # the tile's last load is issued, `stages` KV blocks before its consumers are done:
                # the fetch's latency hides behind them, and the next tile goes to a CTA about to
                # be free
                got = Int32(0)
                if lane == 0:
                    got = cute.arch.atomic_add(mCounter.iterator, Int32(1), sem="relaxed", scope="gpu")
                raw = cute.arch.shuffle_sync(got, 0)
                t = raw + grid
            else:
                t = t + grid
            found, cur = self._varlen_seek(t, mQ.shape[2], mCuQ, mCuK, *cur, group)
        if const_expr(self.persistent):
            if lane == 0 and raw == found[6] - 1:
                mCounter[0] = Int32(0)  # every other CTA has made its last fetch
        sSlot[i % 2] = Int32(-1)
        pipe_q.sync_object_empty.wait(q_state.index, q_state.phase)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(pipe_q.producer_get_barrier(q_state))

    @cute.jit
    def _produce_tile(
        self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV,
        pipe_q, pipe_k, pipe_v, tile, kv_state, q_state, tr=None, dec=None, var=None,
    ):
        n_min = None
        if const_expr(self.decode):
            # packed rows: the CTA's head is the k/v head
            m_block, _, head, batch, rng = self._decode_tile(tile, mQ.shape[0], mK.shape[0], mQ.shape[2], dec)
            n_min, n_block_max = rng[0], rng[1]
        elif const_expr(self.varlen):
            m_block, head, batch = var[0], var[1], 0  # the packed tensors' one batch row
            n_block_max, _ = self._varlen_blocks(var, dec[1])
        else:
            m_block, head, batch = self._tile_coords(tile, mQ.shape[0], mK.shape[0], mQ.shape[2], mQ.shape[3])
            n_block_max, _ = self._kv_block_range(m_block, mQ.shape[0], mK.shape[0])
        mQ_row = mQ[None, None, head, batch]
        if const_expr(self.varlen):
            mQ_row = cute.domain_offset((var[3], 0), mQ_row)  # the sequence's first row
        gQ = cute.local_tile(mQ_row, (self.tile_m, self.hd), (m_block, 0))
        kv_head = head
        if const_expr(not self.decode):
            # GQA / MQA: q head h reads k/v head h // (heads // heads_kv) (only this warp's addresses)
            kv_head = head // (mQ.shape[2] // mK.shape[2])
        mK_row, mV_row = mK[None, None, kv_head, batch], mV[None, None, kv_head, batch]
        if const_expr(self.varlen):
            # the sequence's keys (rows past them, the next sequence's, are masked)
            mK_row = cute.domain_offset((var[5], 0), mK_row)
            mV_row = cute.domain_offset((var[5], 0), mV_row)
        if const_expr(self.decode):
            # the split's keys: local block n is block n_min + n of the row
            mK_row = cute.domain_offset((n_min * self.tile_n, 0), mK_row)
            mV_row = cute.domain_offset((n_min * self.tile_n, 0), mV_row)
        gK = cute.local_tile(mK_row, (self.tile_n, self.hd), (None, 0))
        gV = cute.local_tile(mV_row, (self.tile_n, self.hd), (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(
            tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(
            tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(
            tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))

        # K of the first block goes before Q's so both land together (QK needs both).
        # trace build: iteration it = n_block_max - 1 - n (the consumers' KV iteration);
        # T_WAIT_K/V = the wait for an empty stage, T_LK/LV = issue of the TMA.
        n_block = n_block_max - 1
        self.ins.stamp(tr, T_WAIT_K, Int32(0), 0)
        pipe_k.producer_acquire(kv_state)
        self.ins.stamp(tr, T_WAIT_K, Int32(0), 1)
        self.ins.stamp(tr, T_LK, Int32(0), 0)
        cute.copy(tma_atom_K, tKgK[None, n_block], tKsK[None, kv_state.index],
                  tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
        self.ins.stamp(tr, T_LK, Int32(0), 1)
        pipe_q.producer_acquire(q_state)  # the consumers released the previous tile's Q
        self.ins.stamp(tr, T_LQ, Int32(0), 0)
        cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
        self.ins.stamp(tr, T_LQ, Int32(0), 1)
        q_state.advance()
        if const_expr(not self.overlap):
            # consumer order: K(j), V(j), K(j-1), V(j-1), ...
            self.ins.stamp(tr, T_WAIT_V, Int32(0), 0)
            pipe_v.producer_acquire(kv_state)
            self.ins.stamp(tr, T_WAIT_V, Int32(0), 1)
            self.ins.stamp(tr, T_LV, Int32(0), 0)
            cute.copy(tma_atom_V, tVgV[None, n_block], tVsV[None, kv_state.index],
                      tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
            self.ins.stamp(tr, T_LV, Int32(0), 1)
            kv_state.advance()
            for i in cutlass.range(n_block_max - 1, unroll=1):
                n = n_block_max - 2 - i
                self.ins.stamp(tr, T_WAIT_K, i + 1, 0)
                pipe_k.producer_acquire(kv_state)
                self.ins.stamp(tr, T_WAIT_K, i + 1, 1)
                self.ins.stamp(tr, T_LK, i + 1, 0)
                cute.copy(tma_atom_K, tKgK[None, n], tKsK[None, kv_state.index],
                          tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                self.ins.stamp(tr, T_LK, i + 1, 1)
                self.ins.stamp(tr, T_WAIT_V, i + 1, 0)
                pipe_v.producer_acquire(kv_state)
                self.ins.stamp(tr, T_WAIT_V, i + 1, 1)
                self.ins.stamp(tr, T_LV, i + 1, 0)
                cute.copy(tma_atom_V, tVgV[None, n], tVsV[None, kv_state.index],
                          tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                self.ins.stamp(tr, T_LV, i + 1, 1)
                kv_state.advance()
        else:
            # intra-WG overlap consumes K(j) before V(j+1): load K(j-1) then V(j).
            for i in cutlass.range(n_block_max - 1, unroll=1):
                n_prev = n_block_max - 1 - i
                v_state = kv_state.clone()
                kv_state.advance()
                self.ins.stamp(tr, T_WAIT_K, i + 1, 0)
                pipe_k.producer_acquire(kv_state)
                self.ins.stamp(tr, T_WAIT_K, i + 1, 1)
                self.ins.stamp(tr, T_LK, i + 1, 0)
                cute.copy(tma_atom_K, tKgK[None, n_prev - 1], tKsK[None, kv_state.index],
                          tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                self.ins.stamp(tr, T_LK, i + 1, 1)
                self.ins.stamp(tr, T_WAIT_V, i, 0)
                pipe_v.producer_acquire(v_state)
                self.ins.stamp(tr, T_WAIT_V, i, 1)
                self.ins.stamp(tr, T_LV, i, 0)
                cute.copy(tma_atom_V, tVgV[None, n_prev], tVsV[None, v_state.index],
                          tma_bar_ptr=pipe_v.producer_get_barrier(v_state))
                self.ins.stamp(tr, T_LV, i, 1)
            self.ins.stamp(tr, T_WAIT_V, n_block_max - 1, 0)
            pipe_v.producer_acquire(kv_state)
            self.ins.stamp(tr, T_WAIT_V, n_block_max - 1, 1)
            self.ins.stamp(tr, T_LV, n_block_max - 1, 0)
            cute.copy(tma_atom_V, tVgV[None, 0], tVsV[None, kv_state.index],
                      tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
            self.ins.stamp(tr, T_LV, n_block_max - 1, 1)
            kv_state.advance()
        return kv_state, q_state

    # ---- ping-pong between consumer warpgroups (named barriers, 2 WGs per barrier)
    @cute.jit
    def _pp_sync(self, wg_idx):
        if const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=NamedBarrierFwd.PINGPONG + wg_idx, number_of_threads=256)

    @cute.jit
    def _pp_arrive(self, wg_idx):
        if const_expr(self.pingpong):
            nxt = wg_idx + 1
            if const_expr(self.num_wg == 2):
                nxt = 1 - wg_idx
            else:
                nxt = nxt if nxt < self.num_wg else 0
            cute.arch.barrier_arrive(barrier_id=NamedBarrierFwd.PINGPONG + nxt, number_of_threads=256)

    @cute.jit
    def _apply_mask(self, acc_S, tScS, t0ScS, m_block, n_block, seqlen_q, seqlen_k,
                    mask_seqlen: cutlass.Constexpr, mask_causal: cutlass.Constexpr):
        if const_expr(self.decode or self.pack_gqa):
            self._apply_mask_packed(acc_S, tScS, t0ScS, m_block, n_block, seqlen_q, seqlen_k, mask_seqlen,
                                    mask_causal)
        else:
            self._apply_mask_rows(acc_S, tScS, t0ScS, m_block, n_block, seqlen_q, seqlen_k, mask_seqlen,
                                  mask_causal)

    @cute.jit
    def _apply_mask_rows(self, acc_S, tScS, t0ScS, m_block, n_block, seqlen_q, seqlen_k,
                         mask_seqlen: cutlass.Constexpr, mask_causal: cutlass.Constexpr):
        """-inf outside [0, seqlen_k) and above the causal diagonal. Coordinates are compared as
        thread-0 constants against per-thread limits, so the inner loop is compare + select."""
        s = mn_view(acc_S)
        row0 = tScS[0][0]
        col0 = tScS[0][1]
        col_limit = block_info.seqlen_col_limit(n_block, self.tile_n, seqlen_k, col0)
        diag = block_info.causal_col_limit(m_block * self.tile_m + row0, n_block, self.tile_n, seqlen_q,
                                           seqlen_k, col0)
        for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
            limit = col_limit
            if const_expr(mask_causal):
                if const_expr(mask_seqlen):
                    limit = cutlass.min(col_limit, t0ScS[r, 0][0] + diag)
                else:
                    limit = t0ScS[r, 0][0] + diag
            for c in cutlass.range_constexpr(cute.size(s, mode=[1])):
                # a select, not a branch: an `if` here makes the DSL re-yield the whole fragment
                s[r, c] = -Float32.inf if t0ScS[0, c][1] >= limit else s[r, c]

    @cute.jit
    def _apply_mask_packed(self, acc_S, tScS, t0ScS, m_block, n_block, group_offset, key_limit,
                           mask_seqlen: cutlass.Constexpr, mask_causal: cutlass.Constexpr):
        """The mask of packed rows (decode, varlen pack_gqa): -inf at local keys >= key_limit and,
        with causal, past each packed row's own token: row r (token r // group) sees local key j iff
        j <= offset + token."""
        group, offset = group_offset
        s = mn_view(acc_S)
        row0 = m_block * self.tile_m + tScS[0][0]
        col0 = tScS[0][1]
        col_limit = block_info.seqlen_col_limit(n_block, self.tile_n, key_limit, col0)
        diag = offset + 1 - n_block * self.tile_n - col0
        for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
            limit = col_limit
            if const_expr(mask_causal):
                token = (row0 + t0ScS[r, 0][0]) // group
                if const_expr(mask_seqlen):
                    limit = cutlass.min(col_limit, token + diag)
                else:
                    limit = token + diag
            for c in cutlass.range_constexpr(cute.size(s, mode=[1])):
                s[r, c] = -Float32.inf if t0ScS[0, c][1] >= limit else s[r, c]

    @cute.jit
    def _zero_v_past_keys(self, sV, pipe_v, kv_state, keys, tidx):
        """Decode build: V rows >= keys of the tile's first KV block (its stage at kv_state) are
        set to 0 once they land. They hold whatever the cache has past the row's length (NaN, in
        the tests); their P is 0, but 0 x NaN in the PV GEMM would be NaN. Every consumer thread
        takes part (the idle warpgroup too); the rows are the same for the whole CTA."""
        if keys < self.tile_n:
            pipe_v.consumer_wait(kv_state)
            # 16-byte stores of zeros (a scalar store per element cost 64 x 332 tokens 11 %, H100)
            zero_rows(sV[None, None, kv_state.index], tidx, self.num_consumer_threads, keys)
            # generic-proxy smem writes, read by the wgmma (async proxy) of both warpgroups
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=NamedBarrierFwd.CONSUMERS, number_of_threads=self.num_consumer_threads)

    @cute.jit
    def _softmax(self, acc_S, row_max, row_sum, scale_log2, is_first: cutlass.Constexpr,
                 tr=None, it=None):
        """Online softmax of one S block in place (S -> P, unnormalised); returns per-row scale
        for O. Per row: the max (4-way FMNMX chains + 2 quad shuffles), the P exp2s and the row
        sum (a per-thread partial sum, quad-reduced once at the end). Where the row's O-scale
        exp2 goes and how the sum is added up is a scheduling choice (knob chained_row_sum):
        False: the O-scale exp2 right after the max, four partial sums; True: the O-scale exp2
        after the P exp2s and one FADD chain in exp2 order, from which ptxas issues one exp2 per
        FADD and fills the MUFU's gaps with the O rescale (lab/findings/kernel-design-sm90.md, "Softmax order").
        Trace build: all rows' max first, a stamp (MAX end / EXP start), then all rows' exp2."""
        s = mn_view(acc_S)
        row_scale = cute.make_rmem_tensor_like(row_max, Float32)
        max_scaled = cute.make_rmem_tensor_like(row_max, Float32)
        log2_scale = cute.make_rmem_tensor_like(row_max, Float32)
        if const_expr(self.ins.split_softmax):
            for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
                self._row_max(s, r, row_max, max_scaled, log2_scale, row_scale, scale_log2, is_first)
            self.ins.stamp(tr, T_MAX, it, 1)
            self.ins.stamp(tr, T_EXP, it, 0)
            for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
                self._row_exp(s, r, max_scaled[r], log2_scale[r], row_sum, row_scale, scale_log2,
                              is_first)
        else:
            for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
                self._row_max(s, r, row_max, max_scaled, log2_scale, row_scale, scale_log2, is_first)
                self._row_exp(s, r, max_scaled[r], log2_scale[r], row_sum, row_scale, scale_log2,
                              is_first)
        return row_scale

    @cute.jit
    def _row_max(self, s, r: cutlass.Constexpr, row_max, max_scaled, log2_scale, row_scale,
                 scale_log2, is_first: cutlass.Constexpr):
        """Row r's new max (kept in row_max); max_scaled[r] = max * scale_log2 (0 for a row
        with no key yet); O's scale: log2 in log2_scale[r], and (not chained_row_sum) its
        exp2 in row_scale[r]. On the first block there is no O to scale."""
        ncol = cute.size(s, mode=[1])
        cur = s[r, 0]
        if const_expr("max" not in self.ablate):
            cur = max4(lambda c: s[r, c], ncol)
            if const_expr(not is_first):
                cur = cute.arch.fmax(cur, row_max[r])
            cur = cute.arch.fmax(cur, cute.arch.shuffle_sync_bfly(cur, offset=1))
            cur = cute.arch.fmax(cur, cute.arch.shuffle_sync_bfly(cur, offset=2))
        if const_expr(is_first):
            row_max[r] = cur
            max_scaled[r] = (cur if cur != -Float32.inf else Float32(0.0)) * scale_log2
            row_scale[r] = Float32(1.0)
        else:
            kept, ms, l2 = update_row_max_log2(row_max[r], cur, scale_log2, self.tau)
            max_scaled[r] = ms
            log2_scale[r] = l2
            row_max[r] = kept
            if const_expr(not self.chained_row_sum):
                row_scale[r] = cute.math.exp2(l2, fastmath=True)

    @cute.jit
    def _row_exp(self, s, r: cutlass.Constexpr, max_scaled, log2_scale, row_sum, row_scale,
                 scale_log2, is_first: cutlass.Constexpr):
        """Row r: P = exp2(S * scale_log2 - max_scaled) in place, then
        row_sum[r] = row_sum[r] * row_scale[r] + sum(P) (chained_row_sum: row_scale[r] =
        exp2(log2_scale) first, and the sum added up in column order)."""
        ncol = cute.size(s, mode=[1])
        acc = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
        for c in cutlass.range_constexpr(ncol):
            x = s[r, c] * scale_log2 - max_scaled
            p = x
            if const_expr("exp" not in self.ablate):
                p = exp2(x, c in self.emu_cols)
            s[r, c] = p
            if const_expr("sum" not in self.ablate and not self.chained_row_sum):
                acc[c % 4] = acc[c % 4] + p
        if const_expr(self.chained_row_sum):
            total = Float32(0.0)
            if const_expr(not is_first):
                row_scale[r] = cute.math.exp2(log2_scale, fastmath=True)
                total = row_sum[r] * row_scale[r]
            if const_expr("sum" not in self.ablate):
                for c in cutlass.range_constexpr(ncol):
                    total = total + s[r, c]
            row_sum[r] = total
        else:
            total = (acc[0] + acc[1]) + (acc[2] + acc[3])
            if const_expr(is_first):
                row_sum[r] = total
            else:
                row_sum[r] = row_sum[r] * row_scale[r] + total

    @cute.jit
    def _rescale_o(self, acc_O, row_scale):
        o = mn_view(acc_O)
        if const_expr("rescale" in self.ablate):
            pass
        elif const_expr(self.tau > 0.0):
            # conditional rescaling: skip the multiply unless a row of this warp moved its max
            need = row_scale[0] != Float32(1.0)
            for r in cutlass.range_constexpr(1, cute.size(row_scale)):
                need = need | (row_scale[r] != Float32(1.0))
            if cute.arch.vote_any_sync(need):
                for r in cutlass.range_constexpr(cute.size(row_scale)):
                    for c in cutlass.range(cute.size(o, mode=[1]), unroll_full=True):
                        o[r, c] = o[r, c] * row_scale[r]
        else:
            for r in cutlass.range_constexpr(cute.size(row_scale)):
                for c in cutlass.range(cute.size(o, mode=[1]), unroll_full=True):
                    o[r, c] = o[r, c] * row_scale[r]

    @cute.jit
    def _store_p(self, acc_S, tOrP, smem_thr_copy_P, tPsP, wg_idx):
        """P (fp32, S's registers) -> 16-bit A operand: registers (RS) or smem (SS)."""
        p_view = acc_as_operand_a(acc_S)
        if const_expr(self.p_rs):
            to_16bit(p_view, tOrP)
        else:
            rP = cute.make_rmem_tensor_like(p_view, self.dtype)
            to_16bit(p_view, rP)
            cute.copy(smem_thr_copy_P, smem_thr_copy_P.retile(rP), tPsP)
            # generic-proxy smem writes must be visible to the wgmma (async proxy); a warp's own
            # P rows are all its share of the PV GEMM reads (the accumulator rows it holds), so the
            # warp, not the warpgroup, is what must have written them (flash-attn-4 does the same)
            cute.arch.fence_view_async_shared()
            cute.arch.sync_warp()

    @cute.jit
    def consumer(
        self, tma_atom_O, mO, mLSE, scale_log2, tiled_mma_qk, tiled_mma_pv,
        sQ, sK, sV, sP, sO, pipe_q, pipe_k, pipe_v, seqlen_q, seqlen_k, num_heads, num_batch,
        mSched=None, mTrace=None, tr_cta=None, dec=None, var=None,
    ):
        tidx = cute.arch.thread_idx()[0] - 128
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        tr_on = self.ins.leader(tr_cta, lambda: tidx % 128 == 0)
        wg_slice = wg_idx * 128
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        wg_mma_qk = tiled_mma_qk.get_slice(wg_slice)
        wg_mma_pv = tiled_mma_pv.get_slice(wg_slice)

        tSrQ = wg_mma_qk.make_fragment_A(wg_mma_qk.partition_A(sQ))
        tSrK = wg_mma_qk.make_fragment_B(wg_mma_qk.partition_B(sK))
        sVt = transpose_view(sV)
        tOrVt = wg_mma_pv.make_fragment_B(wg_mma_pv.partition_B(sVt))
        tSrQ, tSrK, tOrVt = [opaque_desc(t) for t in (tSrQ, tSrK, tOrVt)]
        s_shape = wg_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        acc_O = cute.make_rmem_tensor(wg_mma_pv.partition_shape_C((self.tile_m, self.hd)), Float32)

        smem_thr_copy_P = None
        tPsP = None
        if const_expr(self.p_rs):
            tOrP = cute.make_rmem_tensor(
                wg_mma_pv.partition_shape_A((self.tile_m, self.tile_n)), self.dtype)
        else:
            tOrP = wg_mma_pv.make_fragment_A(wg_mma_pv.partition_A(sP))
            stmatrix = cute.make_copy_atom(
                cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
            smem_thr_copy_P = cute.make_tiled_copy_C(stmatrix, tiled_mma_qk).get_slice(tidx)
            tPsP = smem_thr_copy_P.partition_D(sP)

        cS = cute.make_identity_tensor((self.tile_m, self.tile_n))
        tScS = mn_view(thr_mma_qk.partition_C(cS))
        t0ScS = mn_view(tiled_mma_qk.get_slice(0).partition_C(cS))

        rows = cute.size(mn_view(cute.make_rmem_tensor(s_shape, Float32)), mode=[0])
        row_max = cute.make_rmem_tensor(rows, Float32)
        row_sum = cute.make_rmem_tensor(rows, Float32)

        if const_expr(self.pingpong):
            # WG 0 goes first: pre-arrive on its own barrier.
            if wg_idx == 0:
                cute.arch.barrier_arrive(barrier_id=NamedBarrierFwd.PINGPONG, number_of_threads=256)

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        o_scale = cute.make_rmem_tensor(rows, Float32)  # rescale_before_pv: the pending O scale
        args = (tma_atom_O, mO, mLSE, scale_log2, tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt,
                tOrP, s_shape, acc_O, row_max, row_sum, o_scale, smem_thr_copy_P, tPsP, tScS, t0ScS,
                sO, pipe_q, pipe_k, pipe_v)
        if const_expr(self.scheduled):
            cta = cute.arch.block_idx()[0]
            i = Int32(0)
            tile = mSched[cta, 0]
            while tile >= 0:
                if const_expr(self.persistent):
                    self.ins.tile_start(mTrace, tidx, tile)
                # the next tile id is read inside, before the epilogue: its load latency hides
                # behind the epilogue, and the KV loop keeps its registers (read ahead of the
                # loop, ptxas scheduled hd64's loop worse: 2525 vs 2484 cycles per block)
                kv_state, q_state, tile = self._consume_tile(
                    *args, tile, num_heads, num_batch, seqlen_q, seqlen_k, tidx, wg_idx, rows,
                    kv_state, q_state, self.ins.tile(mTrace, tr_on, 1 + wg_idx, i), (mSched, cta, i + 1))
                i += 1
        elif const_expr(self.varlen):
            # the producer's tiles, through tile_slot (_produce_varlen), each found by every warp
            mCuQ, mCuK, _, sSlot = var
            cur = (Int32(0), Int32(0), *self._varlen_chunk(Int32(0), mCuQ, mCuK, dec[1]))
            i = Int32(0)
            pipe_q.consumer_wait(q_state)
            t = sSlot[0]
            while t >= 0:
                found, cur = self._varlen_seek(t, num_heads, mCuQ, mCuK, *cur, dec[1])
                kv_state, q_state = self._consume_tile(
                    *args, t, num_heads, num_batch, seqlen_q, seqlen_k, tidx, wg_idx, rows,
                    kv_state, q_state, None, dec=dec, var=self._varlen_coords(t, found, num_heads))
                i += 1
                pipe_q.consumer_wait(q_state)
                t = sSlot[i % 2]
        else:
            tile = cute.arch.block_idx()[0]
            self._consume_tile(
                *args, tile, num_heads, num_batch, seqlen_q, seqlen_k, tidx, wg_idx, rows,
                kv_state, q_state, self.ins.tile(mTrace, tr_on, 1 + wg_idx), dec=dec)
        if const_expr(self.defer_store_wait):
            # the last O store reads sO: the CTA (and its smem) must outlive it
            if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 4:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
        # kernel end: warp 4 lane 0 has waited for this CTA's last O store
        self.ins.kernel_end(mTrace, tr_cta, tidx)

    @cute.jit
    def _consume_tile(
        self, tma_atom_O, mO, mLSE, scale_log2, tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt,
        tOrP, s_shape, acc_O, row_max, row_sum, o_scale, smem_thr_copy_P, tPsP, tScS, t0ScS,
        sO, pipe_q, pipe_k, pipe_v, tile, num_heads, num_batch,
        seqlen_q, seqlen_k, tidx, wg_idx, rows, kv_state, q_state, tr=None, next_tile=None, dec=None,
        var=None,
    ):
        """One Q tile. next_tile = (mSched, cta, index): also return the tile id there.
        dec (decode build): (mSeqUsedK, group, num_splits, sV); var (varlen build): _varlen_coords'."""
        # what the masks compare against: (seqlen_q, seqlen_k), in decode ((group, causal
        # offset), the split's key limit), local to the split (block_info.decode_block_range)
        mask_q, mask_k = seqlen_q, seqlen_k
        out_batch = None
        if const_expr(self.decode):
            m_block, split, head, batch, rng = self._decode_tile(tile, seqlen_q, seqlen_k, num_heads, dec)
            n_block_max = rng[1]
            mask_q, mask_k = (dec[1], rng[3]), rng[2]
            n_unmasked = n_block_max
            if const_expr(self.causal):
                n_unmasked = block_info.decode_unmasked(m_block, self.tile_m, self.tile_n, dec[1], rng[3],
                                                        block_info.dsl_ops())
            out_batch = batch
            if const_expr(self.split_kv):
                out_batch = split * num_batch + batch  # the partials' (split, batch) row
        elif const_expr(self.varlen):
            m_block, head = var[0], var[1]
            n_block_max, n_unmasked = self._varlen_blocks(var, dec[1])
            seqlen_q, seqlen_k = var[4], var[6]  # the sequence's rows and keys
            mask_q, mask_k = seqlen_q, seqlen_k
            if const_expr(self.pack_gqa):
                # (group, causal offset), as decode's mask takes them (_apply_mask_packed)
                mask_q = (dec[1], seqlen_k - seqlen_q // dec[1])
            out_batch = var[3]  # the varlen epilogue's row offset
        else:
            m_block, head, batch = self._tile_coords(tile, seqlen_q, seqlen_k, num_heads, num_batch)
            n_block_max, n_unmasked = self._kv_block_range(m_block, seqlen_q, seqlen_k)
            out_batch = batch
        acc_O.fill(0.0)
        pipe_q.consumer_wait(q_state)
        if const_expr(self.decode or self.varlen):
            # (varlen: rows past the last sequence's keys may hold anything)
            self._zero_v_past_keys(dec[3], pipe_v, kv_state, mask_k - (n_block_max - 1) * self.tile_n, tidx)

        n_masked_extra = 0
        if const_expr(self.causal):
            n_masked_extra = cutlass.max(n_block_max - 1 - n_unmasked, 0)
        n_plain = n_block_max - 1 - n_masked_extra

        ctx = (tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, tOrP, s_shape, acc_O, row_max,
               row_sum, o_scale, scale_log2, smem_thr_copy_P, tPsP, tScS, t0ScS, pipe_k, pipe_v,
               m_block, mask_q, mask_k, wg_idx)

        if m_block * self.tile_m + wg_idx * 64 < seqlen_q:
            if const_expr(self.overlap):
                kv_state = self._tile_overlap(ctx, kv_state, pipe_q, q_state, n_block_max,
                                              n_masked_extra, n_plain, tr)
            else:
                kv_state = self._tile_serial(ctx, kv_state, pipe_q, q_state, n_block_max,
                                             n_masked_extra, n_plain, tr)
        else:
            # this warpgroup's 64 rows all lie past seqlen_q (the last tile of a length that is
            # not a multiple of tile_m): no GEMM, no softmax, O = 0 (the TMA store clips it)
            row_sum.fill(0.0)
            kv_state = self._tile_idle(pipe_k, pipe_v, pipe_q, q_state, kv_state, n_block_max, wg_idx)

        nxt = Int32(-1)
        if const_expr(next_tile is not None):
            nxt = next_tile[0][next_tile[1], next_tile[2]]
        # ---- finalize: O /= row_sum, LSE
        self.ins.stamp(tr, T_FIN, n_block_max - 1, 0)
        o = mn_view(acc_O)
        lse = cute.make_rmem_tensor(rows, Float32)
        for r in cutlass.range_constexpr(rows):
            total = row_sum[r]
            total = total + cute.arch.shuffle_sync_bfly(total, offset=1)
            total = total + cute.arch.shuffle_sync_bfly(total, offset=2)
            empty = total == Float32(0.0) or total != total
            inv = cute.arch.rcp_approx(total if not empty else Float32(1.0))
            lse[r] = (row_max[r] * scale_log2 + cute.math.log2(total, fastmath=True)) * LN_2 \
                if not empty else -Float32.inf
            for c in cutlass.range(cute.size(o, mode=[1]), unroll_full=True):
                o[r, c] = o[r, c] * inv

        tr_epi = self.ins.with_role(tr, 1 + self.num_wg)
        group = None
        if const_expr(self.pack_gqa):
            group = dec[1]
        self._epilogue(acc_O, lse, tma_atom_O, mO, mLSE, tiled_mma_pv, sO, tidx, m_block, head,
                       out_batch, seqlen_q, tr_epi, n_block_max - 1, group)
        self.ins.stamp(tr, T_FIN, n_block_max - 1, 1)
        if const_expr((self.persistent or self.varlen) and not self.separate_o):
            # O went out through Q's buffer: hand it back only once the O store has read it (the
            # varlen producer waits for it even without a next tile: its end marker, _produce_varlen)
            cute.arch.barrier(barrier_id=NamedBarrierFwd.CONSUMERS, number_of_threads=self.num_consumer_threads)
            pipe_q.consumer_release(q_state)
        q_state.advance()
        if const_expr(next_tile is not None):
            return kv_state, q_state, nxt
        return kv_state, q_state

    @cute.jit
    def _tile_overlap(self, ctx, kv_state, pipe_q, q_state, n_block_max, n_masked_extra, n_plain, tr=None):
        """One tile's KV blocks with intra-warpgroup overlap: S(j) and PV(j-1) in flight together."""
        (tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, tOrP, s_shape, acc_O, row_max, row_sum,
         o_scale, scale_log2, smem_thr_copy_P, tPsP, tScS, t0ScS, pipe_k, pipe_v, m_block, seqlen_q,
         seqlen_k, wg_idx) = ctx
        # first block: S only; its PV is issued together with the next block's S
        self.ins.stamp(tr, T_WAIT_K, Int32(0), 0)
        pipe_k.consumer_wait(kv_state)
        self.ins.stamp(tr, T_WAIT_K, Int32(0), 1)
        acc_S = cute.make_rmem_tensor(s_shape, Float32)
        self.ins.stamp(tr, T_QK, Int32(0), 0)
        gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True, 0)
        self.ins.stamp(tr, T_QK, Int32(0), 1)
        pipe_k.consumer_release(kv_state)
        if const_expr(self.early_q_release):
            if n_block_max == 1:
                pipe_q.consumer_release(q_state)  # this tile's last QK GEMM is done
        self.ins.stamp(tr, T_MASK, Int32(0), 0)
        if const_expr(self.causal):
            self._apply_mask(acc_S, tScS, t0ScS, m_block, n_block_max - 1, seqlen_q, seqlen_k,
                             True, True)
        elif const_expr(self.decode or self.varlen):  # the first block: the key limit may cut it
            self._apply_mask(acc_S, tScS, t0ScS, m_block, n_block_max - 1, seqlen_q, seqlen_k,
                             True, False)
        elif seqlen_k % self.tile_n != 0:  # only a partial last block needs the length mask
            self._apply_mask(acc_S, tScS, t0ScS, m_block, n_block_max - 1, seqlen_q, seqlen_k,
                             True, False)
        self.ins.stamp(tr, T_MASK, Int32(0), 1)
        self.ins.stamp(tr, T_MAX, Int32(0), 0)
        if const_expr(not self.skip_softmax):
            first_scale = self._softmax(acc_S, row_max, row_sum, scale_log2, True, tr, Int32(0))
            if const_expr(self.rescale_before_pv):
                o_scale.store(first_scale.load())
        self.ins.stamp(tr, T_EXP, Int32(0), 1)
        self.ins.stamp(tr, T_CVT, Int32(0), 0)
        self._store_p(acc_S, tOrP, smem_thr_copy_P, tPsP, wg_idx)
        self.ins.stamp(tr, T_CVT, Int32(0), 1)
        for i in cutlass.range(n_masked_extra, unroll=1):
            kv_state = self._block_overlap(ctx, kv_state, n_block_max - 2 - i, True, tr, 1 + i)
        if const_expr(self.early_q_release):
            # the last block is peeled: it hands Q back as soon as its QK GEMM is done, so the
            # next tile's Q loads behind this tile's last softmax, PV and epilogue
            # the unmasked blocks n_plain - 1 .. 1 (block 0 is peeled below). A countdown on
            # n_block tested against a constant: with cutlass.range the trip count
            # (max(n, 2) - 2) was recomputed in every iteration.
            n_block = n_plain - 1
            while n_block >= 0:
                kv_state = self._block_overlap(ctx, kv_state, n_block, False, tr, n_block_max - 1 - n_block,
                                               (pipe_q, q_state, n_block == 0))
                n_block -= 1
            if n_plain == 0 and n_block_max > 1:
                pipe_q.consumer_release(q_state)
        else:
            # the unmasked blocks n_plain - 1 .. 0, counted down (see above)
            n_block = n_plain
            while n_block > 0:
                n_block -= 1
                kv_state = self._block_overlap(ctx, kv_state, n_block, False, tr, n_block_max - 1 - n_block)
            if const_expr(self.separate_o):
                pipe_q.consumer_release(q_state)  # all QK GEMMs of this tile are done
        # last PV
        if const_expr(self.rescale_before_pv and not self.skip_softmax):
            self._rescale_o(acc_O, o_scale)
        self.ins.stamp(tr, T_WAIT_V, n_block_max - 1, 0)
        pipe_v.consumer_wait(kv_state)
        self.ins.stamp(tr, T_WAIT_V, n_block_max - 1, 1)
        self.ins.stamp(tr, T_PV, n_block_max - 1, 0)
        gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, kv_state.index], False, 0)
        self.ins.stamp(tr, T_PV, n_block_max - 1, 1)
        pipe_v.consumer_release(kv_state)
        kv_state.advance()
        return kv_state

    @cute.jit
    def _tile_serial(self, ctx, kv_state, pipe_q, q_state, n_block_max, n_masked_extra, n_plain, tr=None):
        """One tile's KV blocks without overlap: S, softmax, PV, one after the other."""
        wg_idx = ctx[-1]
        self._pp_sync(wg_idx)
        kv_state = self._block_serial(ctx, kv_state, n_block_max - 1, True, True, tr, Int32(0))
        for i in cutlass.range(n_masked_extra, unroll=1):
            kv_state = self._block_serial(ctx, kv_state, n_block_max - 2 - i, False, True, tr, 1 + i)
        for i in cutlass.range(n_plain, unroll=1):
            kv_state = self._block_serial(ctx, kv_state, n_block_max - 2 - n_masked_extra - i, False, False,
                                          tr, 1 + n_masked_extra + i)
        self._pp_arrive(wg_idx)
        if const_expr(self.separate_o):
            pipe_q.consumer_release(q_state)
        return kv_state

    @cute.jit
    def _tile_idle(self, pipe_k, pipe_v, pipe_q, q_state, kv_state, n_block_max, wg_idx):
        """A warpgroup with no rows in this tile keeps the protocol the others expect: it releases
        every K and V stage once it has landed (waiting for the load keeps its release in the
        stage's current phase) and takes its turns at the ping-pong barriers, in the same order
        as _tile_overlap / _tile_serial."""
        if const_expr(self.overlap):
            pipe_k.consumer_wait(kv_state)
            pipe_k.consumer_release(kv_state)
            for i in cutlass.range(n_block_max - 1, unroll=1):
                v_state = kv_state.clone()
                kv_state.advance()
                pipe_k.consumer_wait(kv_state)
                self._pp_sync(wg_idx)
                pipe_v.consumer_wait(v_state)
                self._pp_arrive(wg_idx)
                pipe_k.consumer_release(kv_state)
                pipe_v.consumer_release(v_state)
            if const_expr(self.separate_o):
                pipe_q.consumer_release(q_state)
            pipe_v.consumer_wait(kv_state)
            pipe_v.consumer_release(kv_state)
            kv_state.advance()
        else:
            self._pp_sync(wg_idx)
            for i in cutlass.range(n_block_max, unroll=1):
                pipe_k.consumer_wait(kv_state)
                self._pp_arrive(wg_idx)
                pipe_k.consumer_release(kv_state)
                pipe_v.consumer_wait(kv_state)
                self._pp_sync(wg_idx)
                pipe_v.consumer_release(kv_state)
                kv_state.advance()
            self._pp_arrive(wg_idx)
            if const_expr(self.separate_o):
                pipe_q.consumer_release(q_state)
        return kv_state

    @cute.jit
    def _block_overlap(self, ctx, kv_state, n_block, mask_causal: cutlass.Constexpr, tr=None, it=None,
                       q_rel=None):
        (tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, tOrP, s_shape, acc_O, row_max, row_sum,
         o_scale, scale_log2, smem_thr_copy_P, tPsP, tScS, t0ScS, pipe_k, pipe_v, m_block, seqlen_q,
         seqlen_k, wg_idx) = ctx
        v_state = kv_state.clone()
        kv_state.advance()
        # trace build: this body issues QK of iteration `it` and PV of iteration it - 1
        it_pv = self.ins.prev(it)
        self.ins.stamp(tr, T_WAIT_K, it, 0)
        pipe_k.consumer_wait(kv_state)
        self.ins.stamp(tr, T_WAIT_K, it, 1)
        self.ins.stamp(tr, T_WAIT_PP, it, 0)
        self._pp_sync(wg_idx)
        self.ins.stamp(tr, T_WAIT_PP, it, 1)
        acc_S = cute.make_rmem_tensor(s_shape, Float32)
        self.ins.stamp(tr, T_QK, it, 0)
        gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True, -1)
        if const_expr(self.rescale_before_pv and not self.skip_softmax):
            # the previous block's O scale, applied while S(j) runs and before PV(j-1) adds to O
            self.ins.stamp(tr, T_RESC, it_pv, 0)
            self._rescale_o(acc_O, o_scale)
            self.ins.stamp(tr, T_RESC, it_pv, 1)
        self.ins.stamp(tr, T_WAIT_V, it_pv, 0)
        pipe_v.consumer_wait(v_state)
        self.ins.stamp(tr, T_WAIT_V, it_pv, 1)
        self.ins.stamp(tr, T_PV, it_pv, 0)
        gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, v_state.index], False, -1)
        self.ins.stamp(tr, T_PP, it, 0)
        self._pp_arrive(wg_idx)
        self.ins.stamp(tr, T_PP, it, 1)
        warpgroup.wait_group(1)  # S ready; PV may still run
        self.ins.stamp(tr, T_QK, it, 1)
        pipe_k.consumer_release(kv_state)
        if const_expr(q_rel is not None):
            if q_rel[2]:
                q_rel[0].consumer_release(q_rel[1])  # the tile's last QK GEMM is done
        if const_expr(mask_causal):
            self.ins.stamp(tr, T_MASK, it, 0)
            self._apply_mask(acc_S, tScS, t0ScS, m_block, n_block, seqlen_q, seqlen_k, False, True)
            self.ins.stamp(tr, T_MASK, it, 1)
        self.ins.stamp(tr, T_MAX, it, 0)
        row_scale = None
        if const_expr(not self.skip_softmax):
            row_scale = self._softmax(acc_S, row_max, row_sum, scale_log2, False, tr, it)
        self.ins.stamp(tr, T_EXP, it, 1)
        # (ptxas hoists this wait above the exp2s: in SASS only the row max overlaps the PV GEMM;
        # forcing the exp2s ahead of it measured slower, lab/findings/kernel-design-sm90.md "Where the PV wait sits")
        warpgroup.wait_group(0)  # PV done: O and the P buffer are free
        self.ins.stamp(tr, T_PV, it_pv, 1)
        pipe_v.consumer_release(v_state)
        self.ins.stamp(tr, T_CVT, it, 0)
        self._store_p(acc_S, tOrP, smem_thr_copy_P, tPsP, wg_idx)
        self.ins.stamp(tr, T_CVT, it, 1)
        if const_expr(self.rescale_before_pv and not self.skip_softmax):
            o_scale.store(row_scale.load())  # applied before the next PV GEMM
        else:
            self.ins.stamp(tr, T_RESC, it, 0)
            if const_expr(not self.skip_softmax):
                self._rescale_o(acc_O, row_scale)
            self.ins.stamp(tr, T_RESC, it, 1)
        return kv_state

    @cute.jit
    def _block_serial(self, ctx, kv_state, n_block, is_first: cutlass.Constexpr,
                      mask: cutlass.Constexpr, tr=None, it=None):
        (tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, tOrP, s_shape, acc_O, row_max, row_sum,
         o_scale, scale_log2, smem_thr_copy_P, tPsP, tScS, t0ScS, pipe_k, pipe_v, m_block, seqlen_q,
         seqlen_k, wg_idx) = ctx
        self.ins.stamp(tr, T_WAIT_K, it, 0)
        pipe_k.consumer_wait(kv_state)
        self.ins.stamp(tr, T_WAIT_K, it, 1)
        acc_S = cute.make_rmem_tensor(s_shape, Float32)
        self.ins.stamp(tr, T_QK, it, 0)
        gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True, -1)
        self.ins.stamp(tr, T_PP, it, 0)
        self._pp_arrive(wg_idx)
        self.ins.stamp(tr, T_PP, it, 1)
        warpgroup.wait_group(0)
        self.ins.stamp(tr, T_QK, it, 1)
        pipe_k.consumer_release(kv_state)
        if const_expr(mask):
            self.ins.stamp(tr, T_MASK, it, 0)
            self._apply_mask(acc_S, tScS, t0ScS, m_block, n_block, seqlen_q, seqlen_k,
                             is_first, self.causal)
            self.ins.stamp(tr, T_MASK, it, 1)
        self.ins.stamp(tr, T_MAX, it, 0)
        row_scale = None
        if const_expr(not self.skip_softmax):
            row_scale = self._softmax(acc_S, row_max, row_sum, scale_log2, is_first, tr, it)
        self.ins.stamp(tr, T_EXP, it, 1)
        self.ins.stamp(tr, T_CVT, it, 0)
        self._store_p(acc_S, tOrP, smem_thr_copy_P, tPsP, wg_idx)
        self.ins.stamp(tr, T_CVT, it, 1)
        if const_expr(not is_first and not self.skip_softmax):
            self.ins.stamp(tr, T_RESC, it, 0)
            self._rescale_o(acc_O, row_scale)
            self.ins.stamp(tr, T_RESC, it, 1)
        self.ins.stamp(tr, T_WAIT_V, it, 0)
        pipe_v.consumer_wait(kv_state)
        self.ins.stamp(tr, T_WAIT_V, it, 1)
        self.ins.stamp(tr, T_WAIT_PP, it, 0)
        self._pp_sync(wg_idx)
        self.ins.stamp(tr, T_WAIT_PP, it, 1)
        self.ins.stamp(tr, T_PV, it, 0)
        gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, kv_state.index], False, 0)
        self.ins.stamp(tr, T_PV, it, 1)
        pipe_v.consumer_release(kv_state)
        kv_state.advance()
        return kv_state

    @cute.jit
    def _epilogue(self, acc_O, lse, tma_atom_O, mO, mLSE, tiled_mma_pv, sO, tidx, m_block, head,
                  batch, seqlen_q, tr=None, it=None, group=None):
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        if const_expr(self.cfg.decode):
            # the combine behind this launch (sm90/combine.py, a programmatic dependent launch) may
            # launch once every CTA's loop is done: its CTAs then wait through the stores, not
            # beside the loop; it waits for this grid's end before it reads
            cute.arch.griddepcontrol_launch_dependents()
        # LSE straight from registers: the thread holding column 0 of a row writes it.
        if const_expr(mLSE is not None and self.pack_gqa):
            self._store_lse_unpacked(lse, mLSE, thr_mma_pv, m_block, batch, seqlen_q, group)
        elif const_expr(mLSE is not None):
            mLSE_row = None
            if const_expr(self.varlen):
                mLSE_row = cute.domain_offset((batch,), mLSE[None, head, 0])  # batch: the sequence's first row
            else:
                mLSE_row = mLSE[None, head, batch]
            gLSE = cute.local_tile(mLSE_row, (self.tile_m,), (m_block,))
            gLSE_2d = cute.make_tensor(
                gLSE.iterator, cute.append(gLSE.layout, cute.make_layout((self.hd,), stride=(0,))))
            tOgLSE = mn_view(thr_mma_pv.partition_C(gLSE_2d))
            cO = cute.make_identity_tensor((self.tile_m, self.hd))
            tOcO = mn_view(thr_mma_pv.partition_C(cO))
            if tOcO[0][1] == 0:
                for r in cutlass.range_constexpr(cute.size(tOgLSE, mode=[0])):
                    if tOcO[r, 0][0] < seqlen_q - m_block * self.tile_m:
                        tOgLSE[r, 0] = lse[r]

        if const_expr(self.split_kv):
            self._store_partial(acc_O, mO, thr_mma_pv, m_block, head, batch, seqlen_q)
        elif const_expr(self.varlen):
            # batch: the sequence's first row, seqlen_q: its rows. A TMA store of a tile that
            # runs past the sequence would write the next sequence's first rows, which another
            # CTA owns: only a sequence's last, partial tile goes out row by row
            mO_tma, mO_rows = mO
            if seqlen_q - m_block * self.tile_m >= self.tile_m:
                self._store_o(acc_O, tma_atom_O, mO_tma, tiled_mma_pv, sO, tidx, m_block, head, batch, tr, it)
            else:
                self._store_o_rows(acc_O, mO_rows, tiled_mma_pv, sO, tidx, m_block, head, batch, seqlen_q)
        else:
            self._store_o(acc_O, tma_atom_O, mO, tiled_mma_pv, sO, tidx, m_block, head, batch, tr, it)

    @cute.jit
    def _store_lse_unpacked(self, lse, mLSE, thr_mma_pv, m_block, row0, rows, group):
        """pack_gqa: each row's LSE from registers (the thread holding column 0 of the row writes
        it) into mLSE (total_q, heads, 1) as the unpacked build lays it out: packed row p (row0:
        the sequence's first packed row) is token p // group of q head p % group."""
        cO = cute.make_identity_tensor((self.tile_m, self.hd))
        tOcO = mn_view(thr_mma_pv.partition_C(cO))
        if tOcO[0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(tOcO, mode=[0])):
                if tOcO[r, 0][0] < rows - m_block * self.tile_m:
                    p = row0 + m_block * self.tile_m + tOcO[r, 0][0]
                    token = p // group
                    mLSE[token, p - token * group, 0] = lse[r]

    @cute.jit
    def _store_o(self, acc_O, tma_atom_O, mO, tiled_mma_pv, sO, tidx, m_block, head, batch, tr=None, it=None):
        # O: registers -> smem (stmatrix; sO may be Q's buffer: this WG's rows of sQ are only
        # read by this WG's own, finished, QK GEMMs) -> one TMA store of the tile.
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if const_expr(self.defer_store_wait):
            # the previous tile's O store must have read sO before anyone overwrites it; waiting
            # here, not right after issuing it, keeps warp 4 (and with it warpgroup 0's next
            # GEMMs) off the store: +1.9 % at hd64 / hd128 1k causal (H100, same-run A/B)
            if warp_idx == 4:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
        # every consumer WG is in this tile's epilogue, and the previous tile's O store has
        # finished reading sO
        cute.arch.barrier(barrier_id=NamedBarrierFwd.CONSUMERS, number_of_threads=self.num_consumer_threads)
        stmatrix = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        smem_thr_copy_O = cute.make_tiled_copy_C(stmatrix, tiled_mma_pv).get_slice(tidx)
        cute.copy(smem_thr_copy_O, smem_thr_copy_O.retile(rO), smem_thr_copy_O.partition_D(sO))
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=NamedBarrierFwd.EPILOGUE, number_of_threads=self.num_consumer_threads + 32)
        if warp_idx == 4:
            cute.arch.barrier(barrier_id=NamedBarrierFwd.EPILOGUE, number_of_threads=self.num_consumer_threads + 32)
            self.ins.stamp(tr, T_ST, it, 0)
            mO_row = mO[None, None, head, batch]
            if const_expr(self.varlen):
                mO_row = cute.domain_offset((batch, 0), mO[None, None, head, 0])  # batch: the sequence's first row
            gO = cute.local_tile(mO_row, (self.tile_m, self.hd), (m_block, 0))
            tOsO, tOgO = cpasync.tma_partition(
                tma_atom_O, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2), cute.group_modes(gO, 0, 2))
            cute.copy(tma_atom_O, tOsO, tOgO)
            cute.arch.cp_async_bulk_commit_group()
            if const_expr(not self.defer_store_wait):
                # (sO may be Q's buffer: Q is handed back to the producer right after this tile)
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            self.ins.stamp(tr, T_ST, it, 1)

    @cute.jit
    def _store_o_rows(self, acc_O, mO, tiled_mma_pv, sO, tidx, m_block, head, row0, rows):
        """Varlen build, a sequence's last tile when it is partial: O -> smem (stmatrix) ->
        registers in 16-byte row pieces -> global, only the tile's rows inside its sequence (row0:
        the sequence's first row, rows: its rows). A persistent CTA's earlier tile: every consumer
        has stored its rows before any passes the first barrier, and an earlier tile's TMA store
        has read sO (warp 4 waits for it here where that wait is deferred)."""
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        if const_expr(self.defer_store_wait):
            if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 4:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
        stmatrix = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        smem_thr_copy_O = cute.make_tiled_copy_C(stmatrix, tiled_mma_pv).get_slice(tidx)
        # sO may be Q's buffer: every warpgroup's QK GEMMs are done before any overwrites a row
        cute.arch.barrier(barrier_id=NamedBarrierFwd.CONSUMERS, number_of_threads=self.num_consumer_threads)
        cute.copy(smem_thr_copy_O, smem_thr_copy_O.retile(rO), smem_thr_copy_O.partition_D(sO))
        cute.arch.barrier(barrier_id=NamedBarrierFwd.CONSUMERS, number_of_threads=self.num_consumer_threads)
        gO = cute.local_tile(cute.domain_offset((row0, 0), mO[None, None, head, 0]), (self.tile_m, self.hd),
                             (m_block, 0))
        store_rows(sO, gO, tidx, self.num_consumer_threads, rows - m_block * self.tile_m)

    @cute.jit
    def _store_partial(self, acc_O, mO, thr_mma_pv, m_block, head, batch, rows):
        """Split-KV: this split's O (normalised by its own row sum), fp32, straight from the
        accumulator registers to out_accum (rows past `rows` skipped)."""
        gO = cute.local_tile(mO[None, None, head, batch], (self.tile_m, self.hd), (m_block, 0))
        tOgO = mn_view(thr_mma_pv.partition_C(gO))
        tOcO = mn_view(thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.hd))))
        o = mn_view(acc_O)
        for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
            if tOcO[r, 0][0] < rows - m_block * self.tile_m:
                for c in cutlass.range(cute.size(o, mode=[1]), unroll_full=True):
                    tOgO[r, c] = o[r, c]


class FlashFwdSm90Decode(FlashFwdSm90):
    """The decode build (KernelConfig.decode): q (b, rows, heads_kv, d) holds each k/v head's
    packed rows (row r = new token r // group of q head kv_head * group + r % group); the grid
    runs every (Q tile, split, k/v head, batch row). split_kv False: out (b, rows, heads_kv, d)
    in q's dtype and lse (b, heads_kv, rows); True: out_accum (num_splits * b, rows, heads_kv, d)
    fp32 and lse_accum (num_splits * b, heads_kv, rows), row split * b + batch. lse: natural log,
    -inf (and O 0) where a row saw no key in the split."""

    def __init__(self, cfg: KernelConfig):
        assert cfg.decode, "FlashFwdSm90Decode needs a decode config (config.make_decode_config)"
        super().__init__(cfg)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (b, rows, h_kv, d) packed
        mK: cute.Tensor,  # (b, seqlen_cache, h_kv, d)
        mV: cute.Tensor,
        mO: cute.Tensor,  # (b, rows, h_kv, d) q's dtype, or (num_splits * b, rows, h_kv, d) fp32
        mLSE: cute.Tensor,  # (b or num_splits * b, h_kv, rows) fp32
        mSeqUsedK: cute.Tensor,  # (b,) int32: keys of each row
        group: Int32,  # q heads per k/v head
        num_splits: Int32,
        softmax_scale_log2: Float32,
        stream,
    ):
        self._host(mQ, mK, mV, mO, mLSE, None, softmax_scale_log2, stream, None, (mSeqUsedK, group, num_splits))


class FlashFwdSm90Varlen(FlashFwdSm90):
    """The varlen build (KernelConfig.varlen): q (1, total_q, h, d), k / v (1, total_k, h_kv, d)
    hold the sequences one after the other, sequence i's rows [cu_seqlens_q[i], cu_seqlens_q[i +
    1]) and keys likewise; out like q, lse (1, h, total_q) fp32 (natural log; -inf where a row
    saw no key). The grid: num_ctas CTAs (fa4kernel/varlen.py grid_ctas), each taking tile
    blockIdx.x of the batch's (sequence, head, Q tile) order (_varlen_seek) and, when persistent,
    gridDim.x + the next value of mTileCounter after each (_produce_varlen)."""

    def __init__(self, cfg: KernelConfig):
        assert cfg.varlen, "FlashFwdSm90Varlen needs a varlen config (config.make_varlen_config)"
        super().__init__(cfg)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (1, total_q, h, d)
        mK: cute.Tensor,  # (1, total_k, h_kv, d)
        mV: cute.Tensor,
        mO: cute.Tensor,  # (1, total_q, h, d)
        mLSE,  # (1, h, total_q) fp32 or None
        mCuSeqlensQ: cute.Tensor,  # (sequences + 1,) int32
        mCuSeqlensK: cute.Tensor,
        num_ctas: Int32,
        mTileCounter: cute.Tensor,  # (1,) int32, 0 at the launch and left 0 (_produce_varlen)
        softmax_scale_log2: Float32,
        stream,
    ):
        self._host(mQ, mK, mV, mO, mLSE, None, softmax_scale_log2, stream, None, None,
                   (mCuSeqlensQ, mCuSeqlensK, num_ctas, mTileCounter))


class FlashFwdSm90VarlenPacked(FlashFwdSm90):
    """The varlen build with pack-GQA (KernelConfig.pack_gqa), for MQA: q and out (1, total_q x
    group, 1, d), views of (total_q, group, d) (row token * group + j: q head j of the token), k /
    v (1, total_k, 1, d), cu_seqlens in tokens as FlashFwdSm90Varlen's; lse (1, group, total_q),
    the unpacked build's layout. Causal: row r of a sequence sees key j iff j <= seqlen_k -
    seqlen_q + r // group (bottom-right per token)."""

    def __init__(self, cfg: KernelConfig):
        assert cfg.varlen and cfg.pack_gqa, "FlashFwdSm90VarlenPacked needs make_varlen_config(pack_gqa=True)"
        super().__init__(cfg)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (1, total_q * group, 1, d)
        mK: cute.Tensor,  # (1, total_k, 1, d)
        mV: cute.Tensor,
        mO: cute.Tensor,  # (1, total_q * group, 1, d)
        mLSE,  # (1, group, total_q) fp32 or None
        mCuSeqlensQ: cute.Tensor,  # (sequences + 1,) int32, tokens
        mCuSeqlensK: cute.Tensor,
        num_ctas: Int32,
        mTileCounter: cute.Tensor,
        group: Int32,  # q heads of the one k/v head
        softmax_scale_log2: Float32,
        stream,
    ):
        self._host(mQ, mK, mV, mO, mLSE, None, softmax_scale_log2, stream, None, None,
                   (mCuSeqlensQ, mCuSeqlensK, num_ctas, mTileCounter, group))


class FlashFwdSm90Trace(FlashFwdSm90):
    """A diagnostic build (diagnostics.py): the same kernel plus clock64 stamps of one CTA into
    mTrace, an int64 tensor of TRACE_WORDS elements whose element 0 names the CTA (blockIdx.x)
    to trace. Layout: trace_layout.py."""

    def __init__(self, cfg: KernelConfig, diag: Diagnostics):
        assert diag.buffered, "FlashFwdSm90Trace needs a diagnostic build (diagnostics.Diagnostics)"
        super().__init__(cfg, diag)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE,
        mSched,
        softmax_scale_log2: Float32,
        mTrace: cute.Tensor,  # (TRACE_WORDS,) int64
        stream,
    ):
        self._host(mQ, mK, mV, mO, mLSE, mSched, softmax_scale_log2, stream, mTrace)


def make_kernel(cfg: KernelConfig, diag: Diagnostics = NONE):
    """The kernel object of a build; diagnostic builds take the stamps buffer as one more argument."""
    if cfg.decode:
        assert diag == NONE, "the decode build has no diagnostic variant"
        return FlashFwdSm90Decode(cfg)
    if cfg.varlen:
        assert diag == NONE, "the varlen build has no diagnostic variant"
        return FlashFwdSm90VarlenPacked(cfg) if cfg.pack_gqa else FlashFwdSm90Varlen(cfg)
    return FlashFwdSm90Trace(cfg, diag) if diag.buffered else FlashFwdSm90(cfg)
