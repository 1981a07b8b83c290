"""Split-KV combine for the decode build of the SM90 forward (fwd.py, FlashFwdSm90Decode): one
launch adds up the splits' partial results of every packed row and writes the rows back to q's
layout. Per packed row (batch b, k/v head kh, row r = new token r // group of q head
kh * group + r % group):

    lse = logsumexp_s lse_s                 (natural log)
    out = sum_s exp(lse_s - lse) * out_s    (each out_s normalised by its own split's sum)

A row no split saw a key of (every lse_s = -inf) gets out 0, lse -inf, without NaN.

One CTA of WARPS_PER_ROW warps per packed row. Each warp takes the splits 32 at a time for the
max and the sum of the weights (two warp reductions; every warp computes them, no barrier), then
the warps share the row's splits in turn (split s to warp s % WARPS_PER_ROW), SPLIT_UNROLL a step,
every lane owning head_dim / 32 columns (lane + 32 i: a warp reads 128 contiguous bytes of a
partial per load), each split's weight from the lane that computed it. ptxas weaves a warp's
loads between its adds (one warp with 8 splits unrolled had 2.5 in flight at hd128; 4 a step
keep all 4: fa4kernel.sass.combine_in_flight), so the warps side by side are what puts more of
the row's splits in flight; their sums meet in shared memory.
The partials are small (splits x rows x head_dim fp32 per k/v head), so this kernel is a few
microseconds; what matters is that it is one launch, few round trips long, and that it starts
at once: it is a programmatic dependent launch (use_pdl) behind the decode kernel, whose CTAs
let it launch once their KV loops are done (griddepcontrol.launch_dependents in sm90/fwd.py's
epilogue); its CTAs wait in griddepcontrol.wait until the decode grid has finished and its
partials are visible, so no launch gap lies between the two.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.memory as cutlass_memory
from cutlass import Float32, Int32

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
WARPS_PER_ROW = 4  # a row's splits dealt to the CTA's warps in turn: split s to warp s % 4
SPLIT_UNROLL = 4  # splits whose partials a warp loads in one step before it adds the first


class CombineSm90:
    """One compiled variant per (dtype, head_dim)."""

    def __init__(self, dtype: str, head_dim: int):
        assert head_dim % 32 == 0, "combine: head_dim a multiple of 32 (one column per lane per step)"
        self.dtype = cutlass.BFloat16 if dtype == "bfloat16" else cutlass.Float16
        self.hd = head_dim
        self.cols = head_dim // 32  # columns per lane

    @cute.jit
    def __call__(
        self,
        mOacc: cute.Tensor,  # (num_splits * b, rows, h_kv, d) fp32, row split * b + batch
        mLSEacc: cute.Tensor,  # (num_splits * b, h_kv, rows) fp32, natural log
        mO: cute.Tensor,  # (b, seqlen_q, h, d) q's dtype
        mLSE: cute.Tensor,  # (b, h, seqlen_q) fp32, natural log
        group: Int32,  # q heads per k/v head
        num_splits: Int32,
        stream,
    ):
        grid = (cute.size(mOacc.shape[1]), cute.size(mOacc.shape[2]), cute.size(mO.shape[0]))
        self.kernel(mOacc, mLSEacc, mO, mLSE, group, num_splits).launch(
            grid=grid, block=[32 * WARPS_PER_ROW, 1, 1], smem=WARPS_PER_ROW * self.hd * 4 + 16, stream=stream,
            use_pdl=True)

    @cute.kernel
    def kernel(self, mOacc, mLSEacc, mO, mLSE, group: Int32, num_splits: Int32):
        tidx = cute.arch.thread_idx()[0]
        lane = tidx % 32
        warp = cute.arch.make_warp_uniform(tidx // 32)
        r, kh, batch = cute.arch.block_idx()
        nb = mO.shape[0]
        cute.arch.griddepcontrol_wait()  # launched early (PDL): the decode grid's partials are visible after it
        smem = cutlass_memory.SmemAllocator()
        sAcc = smem.allocate_tensor(Float32, cute.make_layout((WARPS_PER_ROW, self.hd), stride=(self.hd, 1)),
                                    byte_alignment=16)
        # the largest lse of the row's splits (-inf: no split saw a key)
        top = -Float32.inf
        for s in cutlass.range(lane, num_splits, 32, unroll=1):
            top = cute.arch.fmax(top, mLSEacc[s * nb + batch, kh, r])
        for off in cutlass.range_constexpr(5):
            top = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=1 << off))
        top_safe = top if top != -Float32.inf else Float32(0.0)
        total = Float32(0.0)
        for s in cutlass.range(lane, num_splits, 32, unroll=1):
            total = total + cute.math.exp2((mLSEacc[s * nb + batch, kh, r] - top_safe) * LOG2_E, fastmath=True)
        for off in cutlass.range_constexpr(5):
            total = total + cute.arch.shuffle_sync_bfly(total, offset=1 << off)
        empty = total == Float32(0.0)
        lse = top_safe + cute.math.log2(total if not empty else Float32(1.0), fastmath=True) * LN_2
        lse = lse if not empty else -Float32.inf
        # split s weighs exp(lse_s - lse); 0 everywhere for an empty row (out 0)
        inv = cute.arch.rcp_approx(total if not empty else Float32(1.0))
        inv = inv if not empty else Float32(0.0)

        acc = cute.make_rmem_tensor((self.cols,), Float32)
        acc.fill(0.0)
        # 32 splits at a time: lane j holds split c + j's weight (0 past the last split), shuffled
        # to the warp when its partial is added; this warp adds splits c + warp, c + warp + 4, ...
        # SPLIT_UNROLL a step, their partials loaded before any is added; a split past the chunk
        # reads its last split again, at weight 0
        for c in cutlass.range(0, num_splits, 32, unroll=1):
            n = cutlass.min(num_splits - c, 32)
            w_lane = Float32(0.0)
            if lane < n:
                w_lane = cute.math.exp2((mLSEacc[(c + lane) * nb + batch, kh, r] - top_safe) * LOG2_E,
                                        fastmath=True) * inv
            for t in cutlass.range(warp, n, WARPS_PER_ROW * SPLIT_UNROLL, unroll=1):
                part = cute.make_rmem_tensor((SPLIT_UNROLL, self.cols), Float32)
                for u in cutlass.range_constexpr(SPLIT_UNROLL):
                    s = c + cutlass.min(t + WARPS_PER_ROW * u, n - 1)
                    for i in cutlass.range_constexpr(self.cols):
                        part[u, i] = mOacc[s * nb + batch, r, kh, lane + 32 * i]
                for u in cutlass.range_constexpr(SPLIT_UNROLL):
                    k = t + WARPS_PER_ROW * u
                    w = cute.arch.shuffle_sync(w_lane, cutlass.min(k, 31))
                    w = w if k < n else Float32(0.0)
                    for i in cutlass.range_constexpr(self.cols):
                        acc[i] = acc[i] + w * part[u, i]
        for i in cutlass.range_constexpr(self.cols):
            sAcc[warp, lane + 32 * i] = acc[i]
        cute.arch.sync_threads()  # every warp's sum in shared memory
        if warp == 0:
            for w in cutlass.range_constexpr(1, WARPS_PER_ROW):
                for i in cutlass.range_constexpr(self.cols):
                    acc[i] = acc[i] + sAcc[w, lane + 32 * i]
            out = cute.make_rmem_tensor((self.cols,), self.dtype)
            out.store(acc.load().to(self.dtype))
            token = r // group
            head = kh * group + (r - token * group)
            for i in cutlass.range_constexpr(self.cols):
                mO[batch, token, head, lane + 32 * i] = out[i]
            if lane == 0:
                mLSE[batch, head, token] = lse
