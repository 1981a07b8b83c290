"""The SM90 backward's dQ postprocess (sm90/bwd.py runs it after the main kernel): the fp32 dQ
accumulator (b, h, s_q_pad, d), already scaled by softmax_scale, -> dQ (b, s_q, h, d) in 16 bit,
in row order (dq_reduce="bulk" leaves each query block in the wgmma fragment order of
bwd.dq_bulk_offset).

postprocess="kernel": BwdPostprocess, a CuTe DSL kernel (dq_reduce="bulk" only), launched by
postprocess_kernel; postprocess="torch": dq_postprocess, one torch copy_.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ..interop import compile_fake, to_cute, torch_stream
from .bwd_config import BwdConfig
from .bwd_varlen import padded_start


def dq_post_coords(g, head_dim: int, dq_wgs: int, rows_split: bool = False):
    """postprocess="kernel": (row0, col0, chunk) of thread g of BwdPostprocess (Python ints on
    the CPU, DSL integers in the kernel). The thread reads floats 16 chunk .. 16 chunk + 15 of its
    block (64 contiguous bytes); float 4 lane4 + 2 vr + vc of them is element (row0 + 8 vr,
    col0 + 2 lane4 + vc) (dq_bulk_offset's order: chunk = (w, j, warp, lane8), the 4 threads
    lane4 = 0..3 of one row pair). Consecutive threads take consecutive 8-column pieces of one
    row, so a warp stores whole rows (coalesced); each of its 64-byte reads is two whole sectors."""
    n = head_dim if rows_split else head_dim // dq_wgs  # columns of one warpgroup's tile
    per_row = head_dim // 8  # 8-column pieces of one row
    piece = g % per_row
    row_key = g // per_row
    lane8 = row_key % 8
    if rows_split:
        w, j, warp = row_key // 32, piece, (row_key // 8) % 4
        row0, col0 = 64 * w + 16 * warp + lane8, 8 * j
    else:
        w, j, warp = piece // (n // 8), piece % (n // 8), row_key // 8
        row0, col0 = 16 * warp + lane8, n * w + 8 * j
    chunk = ((w * (n // 8) + j) * 4 + warp) * 8 + lane8
    return row0, col0, chunk


class BwdPostprocess:
    """postprocess="kernel": the dQ accumulator of dq_reduce="bulk" (b, h, s_q_pad * d) fp32, each
    query block in the order of dq_bulk_offset, -> dQ (b, s_q, h, d) in 16 bit, row order.

    One CTA per query block of one (head, batch), one thread per 16 floats of the block: a thread
    holds the 4 floats of each of the 4 wgmma threads (lane4 = 0..3) that share rows r and r + 8
    and columns 8 j .. 8 j + 7 (a chunk (w, j, warp, lane8) of the block), so it loads 64
    contiguous bytes (4 LDG.128: two whole 32-byte sectors), converts, and stores 8 columns of
    row r and of r + 8 (2 STG.128). The threads of a warp take the pieces of a row in order
    (dq_post_coords), so each store instruction writes whole rows; rows past s_q are not
    stored. No shared memory, no barrier."""

    def __init__(self, cfg: BwdConfig):
        self.dtype = cutlass.BFloat16 if cfg.dtype == "bfloat16" else cutlass.Float16
        self.hd = cfg.head_dim
        self.wgs = cfg.dq_wgs
        self.rows_split = cfg.dq_rows_split
        self.rows = 64 * cfg.dq_wgs if cfg.dq_rows_split else 64  # rows of one accumulator block
        self.threads = self.rows * self.hd // 16

    @cute.jit
    def __call__(self, mAcc: cute.Tensor, mdQ: cute.Tensor, stream):
        # mAcc (b, h, s_q_pad * d) fp32; mdQ (b, s_q, h, d)
        grid = (cute.ceil_div(mAcc.shape[2], self.rows * self.hd), cute.size(mAcc.shape[1]),
                cute.size(mAcc.shape[0]))
        self.kernel(mAcc, mdQ).launch(grid=grid, block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mAcc: cute.Tensor, mdQ: cute.Tensor):
        m_block, head, batch = cute.arch.block_idx()
        self._block(mAcc, mdQ, m_block, head, batch, mdQ.shape[1])

    @cute.jit
    def _block(self, mAcc, mdQ, m_block, head, batch, seqlen_q, acc_block=None):
        """Query block m_block of (head, batch): its rows below seqlen_q; acc_block: the block of
        the accumulator it lies in (varlen: the padded layout's; default m_block)."""
        if const_expr(acc_block is None):
            acc_block = m_block
        g = cute.arch.thread_idx()[0]
        row0, col0, chunk = dq_post_coords(g, self.hd, self.wgs, self.rows_split)
        rAcc = cute.make_rmem_tensor((16,), Float32)
        cute.autovec_copy(cute.local_tile(mAcc[batch, head, None], (16,), (acc_block * self.threads + chunk,)), rAcc)
        for vr in cutlass.range_constexpr(2):
            row = m_block * self.rows + row0 + 8 * vr
            if row < seqlen_q:
                rF = cute.make_rmem_tensor((8,), Float32)
                for k in cutlass.range_constexpr(8):
                    # column 2 lane4 + vc of the 8 = float 4 lane4 + 2 vr + vc of the 16
                    rF[k] = rAcc[4 * (k // 2) + 2 * vr + k % 2]
                rO = cute.make_rmem_tensor((8,), self.dtype)
                rO.store(rF.load().to(self.dtype))
                cute.autovec_copy(rO, cute.local_tile(mdQ[batch, row, head, None], (8,), (col0 // 8,)))


class BwdPostprocessVarlen(BwdPostprocess):
    """The varlen backward's postprocess: the accumulator (1, h, s_q_pad * d) padded per sequence
    (bwd_varlen.padded_start) -> dQ (1, total_q, h, d) packed. Grid: the longest sequence's query
    blocks x heads x sequences; a CTA past its sequence's blocks exits. The rows past the last
    sequence (a tail the packed tensors may carry) are zeroed by the first CTA of each head of
    the last sequence."""

    @cute.jit
    def __call__(self, mAcc: cute.Tensor, mdQ: cute.Tensor, mCuSeqlensQ: cute.Tensor, num_blocks: Int32, stream):
        grid = (num_blocks, cute.size(mAcc.shape[1]), mCuSeqlensQ.shape[0] - 1)
        self.kernel(mAcc, mdQ, mCuSeqlensQ).launch(grid=grid, block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mAcc: cute.Tensor, mdQ: cute.Tensor, mCuSeqlensQ: cute.Tensor):
        m_block, head, seq = cute.arch.block_idx()
        off = mCuSeqlensQ[seq]
        rows = mCuSeqlensQ[seq + 1] - off
        if m_block * self.rows < rows:
            # the padded start is a whole block: indexing by block keeps the 16-byte loads
            pad_block = padded_start(off, seq, self.rows) // self.rows
            self._block(mAcc, cute.domain_offset((0, off, 0, 0), mdQ), m_block, head, 0, rows, pad_block + m_block)
        if m_block == 0 and seq == mCuSeqlensQ.shape[0] - 2:
            first = mCuSeqlensQ[seq + 1] * self.hd
            for i in cutlass.range(first + cute.arch.thread_idx()[0], mdQ.shape[1] * self.hd, self.threads):
                r = i // self.hd
                mdQ[0, r, head, i - r * self.hd] = self.dtype(0.0)


def fake_postprocess_args(cfg: BwdConfig):
    """Fake tensors of the postprocess (dynamic batch, lengths, heads, strides)."""
    from cutlass.cute.runtime import make_fake_tensor

    dt = cutlass.BFloat16 if cfg.dtype == "bfloat16" else cutlass.Float16
    div = 128 // dt.width
    b, sq, h, n = (cute.sym_int() for _ in range(4))
    acc = make_fake_tensor(Float32, (b, h, n), assumed_align=16,
                           stride=(cute.sym_int64(divisibility=4), cute.sym_int64(divisibility=4), 1))
    dq = make_fake_tensor(dt, (b, sq, h, cfg.head_dim),
                          stride=tuple(cute.sym_int64(divisibility=div) for _ in range(3)) + (1,), assumed_align=16)
    return acc, dq


def compile_postprocess(cfg: BwdConfig, options=None, tvm_ffi: bool = False):
    """cute.compile of the postprocess kernel against fake tensors (no GPU needed); cfg.varlen:
    BwdPostprocessVarlen's, with cu_seqlens_q and the grid's query blocks."""
    if cfg.varlen:
        from cutlass.cute.runtime import make_fake_tensor

        cu = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,), assumed_align=4)
        return compile_fake(BwdPostprocessVarlen(cfg), (*fake_postprocess_args(cfg), cu, Int32(1)), options, tvm_ffi)
    return compile_fake(BwdPostprocess(cfg), fake_postprocess_args(cfg), options, tvm_ffi)


_POST_CACHE: dict = {}  # (dtype, head_dim, dq_wgs, rows_split, tvm_ffi) -> compiled postprocess


def postprocess_kernel(cfg: BwdConfig, acc, seqlen_q: int, dtype, use_tvm_ffi: bool):
    """postprocess="kernel": dQ (b, s_q, h, d) in 16 bit from the contiguous accumulator
    (b, h, s_q_pad, d) of dq_reduce="bulk", by BwdPostprocess (one launch)."""
    import torch

    b, h, sqp, d = acc.shape
    flat = acc.contiguous().view(b, h, sqp * d)
    dq = torch.empty((b, seqlen_q, h, d), dtype=dtype, device=acc.device)
    key = (cfg.dtype, cfg.head_dim, cfg.dq_wgs, cfg.dq_rows_split, use_tvm_ffi)
    fn = _POST_CACHE.get(key)
    if use_tvm_ffi:
        if fn is None:
            fn = _POST_CACHE[key] = compile_postprocess(cfg, tvm_ffi=True)
        fn(flat, dq)
    else:
        args = [to_cute(flat, 2), to_cute(dq, 3)]
        stream = torch_stream(acc.device)
        if fn is None:
            fn = _POST_CACHE[key] = cute.compile(BwdPostprocess(cfg), *args, stream)
        fn(*args, stream)
    return dq


def postprocess_varlen(cfg: BwdConfig, acc, dq, cu_q, max_seqlen_q: int, use_tvm_ffi: bool):
    """The varlen build's postprocess (BwdPostprocessVarlen, one launch): the padded accumulator
    acc (1, h, s_q_pad, d) -> dq (total_q, h, d) packed, a tail's rows 0."""
    b, h, sqp, d = acc.shape
    flat, dq4 = acc.view(b, h, sqp * d), dq.unsqueeze(0)
    post = BwdPostprocess(cfg)
    blocks = max(1, -(-max_seqlen_q // post.rows))
    key = ("varlen", cfg.dtype, cfg.head_dim, cfg.dq_wgs, cfg.dq_rows_split, use_tvm_ffi)
    fn = _POST_CACHE.get(key)
    if use_tvm_ffi:
        if fn is None:
            fn = _POST_CACHE[key] = compile_postprocess(cfg, tvm_ffi=True)
        fn(flat, dq4, cu_q, blocks)
        return
    args = [to_cute(flat, 2), to_cute(dq4, 3), to_cute(cu_q, 0, align=4)]
    stream = torch_stream(acc.device)
    if fn is None:
        fn = _POST_CACHE[key] = cute.compile(BwdPostprocessVarlen(cfg), *args, Int32(blocks), stream)
    fn(*args, Int32(blocks), stream)


def dq_postprocess(acc, cfg: BwdConfig, seqlen_q: int, dtype):
    """The dQ accumulator (b, h, s_q_pad, d) fp32, already scaled by softmax_scale in the
    kernel -> dq (b, s_q, h, d) in 16 bit: one torch copy_ (reorder and convert in one pass)."""
    import torch

    b, h, sqp, d = acc.shape
    if cfg.dq_reduce == "red":
        dq = torch.empty((b, seqlen_q, h, d), dtype=dtype, device=acc.device)
        dq.copy_(acc[:, :, :seqlen_q].permute(0, 2, 1, 3))
        return dq
    # bulk: within a query block, element (row, col) sits at dq_bulk_offset; the accumulator
    # block is (w, j, warp, lane8, lane4, vr, vc): rows (warp, vr, lane8), cols (w, j, lane4, vc),
    # or rows (w, warp, vr, lane8), cols (j, lane4, vc) when dQ is split by query rows
    w = cfg.dq_wgs
    if cfg.dq_rows_split:
        src = acc.view(b, h, sqp // (64 * w), w, d // 8, 4, 8, 4, 2, 2).permute(0, 2, 3, 5, 8, 6, 1, 4, 7, 9)
        out = torch.empty((b, sqp, h, d), dtype=dtype, device=acc.device)
        out.view(b, sqp // (64 * w), w, 4, 2, 8, h, d // 8, 4, 2).copy_(src)
    else:
        n = d // w
        src = acc.view(b, h, sqp // 64, w, n // 8, 4, 8, 4, 2, 2).permute(0, 2, 5, 8, 6, 1, 3, 4, 7, 9)
        out = torch.empty((b, sqp, h, d), dtype=dtype, device=acc.device)
        out.view(b, sqp // 64, 4, 2, 8, h, w, n // 8, 4, 2).copy_(src)
    return out if sqp == seqlen_q else out[:, :seqlen_q].contiguous()
