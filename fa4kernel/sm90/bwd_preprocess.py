"""The SM90 backward's preprocess (sm90/bwd.py runs it before the main kernel): D = rowsum(dO * O)
* scale in fp32 and LSE_log2 = LSE * log2(e), both (b, h, s_q_pad), rows that see no key
(LSE = -inf) and the padding rows at LSE_log2 = +inf (their P is 0), D = 0 on the padding rows.
scale is the softmax scale where dS carries it (BwdConfig.ds_scaled: the main kernel's
dS = P * (dP * scale - D) comes out scaled, and dQ = dS K and dK = dS^T Q need no multiply of their
own, one FMUL per dQ element per query block less in the loop), else 1.

preprocess="kernel": BwdPreprocess, a CuTe DSL kernel (with dq_zero="preprocess" it also zeroes
the dQ accumulator and the deterministic build's dQ semaphores), launched by preprocess_kernel;
preprocess="torch": preprocess_torch.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from typing import Optional

from ..interop import compile_fake, to_cute, torch_stream
from .bwd_config import BwdConfig
from .bwd_varlen import padded_start

LOG2_E = math.log2(math.e)


class BwdPreprocess:
    """preprocess="kernel": D = rowsum(dO * O) * scale in fp32 and LSE_log2 = LSE * log2(e) (+inf where
    LSE = -inf: rows that see no key) for every query row, padding rows (s_q <= row < s_q_pad)
    D = 0 and LSE_log2 = +inf; reads dO and O once (the torch preprocess makes fp32 copies).

    4 threads per row (a quad reads 64 contiguous bytes per 128-bit load; d / 32 loads each),
    reduced with 2 butterfly shuffles; a CTA of 128 threads covers 32 rows of one (head, batch).
    With dq_zero="preprocess" it also zeroes those 32 rows of the dQ accumulator (hd / 16 STG.128
    per thread) and, deterministic, the semaphore of the query block that starts at its first
    row (thread 0), so no memset runs before the backward."""

    ROWS = 32

    def __init__(self, cfg: BwdConfig):
        self.dtype = cutlass.BFloat16 if cfg.dtype == "bfloat16" else cutlass.Float16
        self.hd = cfg.head_dim
        self.zero_dq = cfg.dq_zero == "preprocess"
        self.zero_sem = self.zero_dq and cfg.deterministic
        self.tile_m = cfg.tile_m

    @cute.jit
    def __call__(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mD: cute.Tensor,
                 mLSE2: cute.Tensor, mdQaccum: cute.Tensor, mdQsem: Optional[cute.Tensor], scale: Float32, stream):
        # mO, mdO (b, s_q, h, d); mLSE (b, h, s_q) natural log; mD, mLSE2 (b, h, s_q_pad);
        # mdQaccum (b, h, s_q_pad, d) fp32 (touched only with dq_zero="preprocess"); mdQsem
        # (b, h, s_q_pad / tile_m) int32 of the deterministic build, else None; scale: the softmax scale
        grid = (cute.ceil_div(mD.shape[2], self.ROWS), cute.size(mD.shape[1]), cute.size(mD.shape[0]))
        self.kernel(mO, mdO, mLSE, mD, mLSE2, mdQaccum, mdQsem, scale).launch(
            grid=grid, block=[4 * self.ROWS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mD: cute.Tensor, mLSE2: cute.Tensor,
               mdQaccum: cute.Tensor, mdQsem, scale: Float32):
        bx, head, batch = cute.arch.block_idx()
        self._rows(mO, mdO, mLSE, mD, mLSE2, mdQaccum, mdQsem, scale, bx, head, batch, mO.shape[1], mD.shape[2])

    @cute.jit
    def _rows(self, mO, mdO, mLSE, mD, mLSE2, mdQaccum, mdQsem, scale, bx, head, batch, seqlen_q, padded):
        """The CTA's 32 rows bx * 32 .. of (head, batch): rows below seqlen_q read, rows below
        `padded` written (past seqlen_q D = 0, LSE_log2 = +inf)."""
        tidx = cute.arch.thread_idx()[0]
        row = bx * self.ROWS + tidx // 4
        part = tidx % 4
        if const_expr(self.zero_dq):
            # the CTA's 32 rows (all below s_q_pad); a quad writes 64 contiguous bytes
            zero = cute.make_rmem_tensor((4,), Float32)
            zero.fill(0.0)
            gdQ = mdQaccum[batch, head, row, None]
            for k in cutlass.range_constexpr(self.hd // 16):
                cute.autovec_copy(zero, cute.local_tile(gdQ, (4,), (part + 4 * k,)))
        if const_expr(self.zero_sem):
            # tile_m is a multiple of ROWS: the CTA whose rows start a query block zeroes its semaphore
            if tidx == 0 and (bx * self.ROWS) % self.tile_m == 0:
                mdQsem[batch, head, bx * self.ROWS // self.tile_m] = cutlass.Int32(0)
        total = Float32(0.0)
        if row < seqlen_q:
            gO = mO[batch, row, head, None]
            gdO = mdO[batch, row, head, None]
            for k in cutlass.range_constexpr(self.hd // 32):
                # 8-element vector part + 4 k: the quad's 4 loads are 64 contiguous bytes
                rO = cute.make_rmem_tensor((8,), self.dtype)
                rdO = cute.make_rmem_tensor((8,), self.dtype)
                cute.autovec_copy(cute.local_tile(gO, (8,), (part + 4 * k,)), rO)
                cute.autovec_copy(cute.local_tile(gdO, (8,), (part + 4 * k,)), rdO)
                prod = rO.load().to(Float32) * rdO.load().to(Float32)
                total = total + prod.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        total = total + cute.arch.shuffle_sync_bfly(total, offset=1)
        total = total + cute.arch.shuffle_sync_bfly(total, offset=2)
        if part == 0 and row < padded:
            lse2 = Float32(math.inf)
            if row < seqlen_q:
                lse = mLSE[batch, head, row]
                if lse != -Float32(math.inf):
                    lse2 = lse * LOG2_E
            mD[batch, head, row] = total * scale
            mLSE2[batch, head, row] = lse2


class BwdPreprocessVarlen(BwdPreprocess):
    """The varlen backward's preprocess: O, dO (1, total_q, h, d) and LSE (1, h, total_q) packed;
    D, LSE_log2 (1, h, s_q_pad) and the dQ accumulator (1, h, s_q_pad, d) in the layout padded per
    sequence (bwd_varlen.padded_start). Grid: 32-row pieces of the longest sequence's query blocks
    x heads x sequences; a CTA writes its sequence's rows up to its last query block's end (and
    zeroes them in the accumulator), one past them exits."""

    @cute.jit
    def __call__(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mD: cute.Tensor, mLSE2: cute.Tensor,
                 mdQaccum: cute.Tensor, mdQsem: Optional[cute.Tensor], scale: Float32, mCuSeqlensQ: cute.Tensor,
                 num_pieces: Int32, stream):
        grid = (num_pieces, cute.size(mD.shape[1]), mCuSeqlensQ.shape[0] - 1)
        self.kernel(mO, mdO, mLSE, mD, mLSE2, mdQaccum, mdQsem, scale, mCuSeqlensQ).launch(
            grid=grid, block=[4 * self.ROWS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mD: cute.Tensor, mLSE2: cute.Tensor,
               mdQaccum: cute.Tensor, mdQsem, scale: Float32, mCuSeqlensQ: cute.Tensor):
        bx, head, seq = cute.arch.block_idx()
        off = mCuSeqlensQ[seq]
        rows = mCuSeqlensQ[seq + 1] - off
        blocks = cute.ceil_div(rows, self.tile_m) * self.tile_m  # the sequence's whole query blocks
        if bx * self.ROWS < blocks:
            pad = padded_start(off, seq, self.tile_m)
            sem = None
            if const_expr(self.zero_sem):  # (b, h, query block): the sequence's first block
                sem = cute.domain_offset((0, 0, pad // self.tile_m), mdQsem)
            self._rows(cute.domain_offset((0, off, 0, 0), mO), cute.domain_offset((0, off, 0, 0), mdO),
                       cute.domain_offset((0, 0, off), mLSE), cute.domain_offset((0, 0, pad), mD),
                       cute.domain_offset((0, 0, pad), mLSE2), cute.domain_offset((0, 0, pad, 0), mdQaccum), sem,
                       scale, bx, head, 0, rows, blocks)


def fake_preprocess_args(cfg: BwdConfig):
    """Fake tensors of the preprocess (dynamic batch, lengths, heads, strides)."""
    from cutlass.cute.runtime import make_fake_tensor

    dt = cutlass.BFloat16 if cfg.dtype == "bfloat16" else cutlass.Float16
    div = 128 // dt.width
    b, sq, h, sqp = (cute.sym_int() for _ in range(4))

    def fake(shape):
        stride = tuple(cute.sym_int64(divisibility=div) for _ in range(3)) + (1,)
        return make_fake_tensor(dt, shape, stride=stride, assumed_align=16)

    def stats(n):
        return make_fake_tensor(cutlass.Float32, (b, h, n), stride=(cute.sym_int64(), cute.sym_int64(), 1),
                                assumed_align=4)

    dq = make_fake_tensor(cutlass.Float32, (b, h, sqp, cfg.head_dim),
                          stride=tuple(cute.sym_int64(divisibility=4) for _ in range(3)) + (1,), assumed_align=16)
    sem = None
    if cfg.deterministic and cfg.dq_zero == "preprocess":
        sem = make_fake_tensor(cutlass.Int32, (b, h, cute.sym_int()), stride=(cute.sym_int64(), cute.sym_int64(), 1),
                               assumed_align=4)
    return (fake((b, sq, h, cfg.head_dim)), fake((b, sq, h, cfg.head_dim)), stats(sq), stats(sqp), stats(sqp), dq, sem,
            Float32(1.0))


def compile_preprocess(cfg: BwdConfig, options=None, tvm_ffi: bool = False):
    """cute.compile of the preprocess kernel against fake tensors (no GPU needed); cfg.varlen:
    BwdPreprocessVarlen's, with cu_seqlens_q and the grid's row pieces."""
    if cfg.varlen:
        from cutlass.cute.runtime import make_fake_tensor

        cu = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,), assumed_align=4)
        return compile_fake(BwdPreprocessVarlen(cfg), (*fake_preprocess_args(cfg), cu, Int32(1)), options, tvm_ffi)
    return compile_fake(BwdPreprocess(cfg), fake_preprocess_args(cfg), options, tvm_ffi)


_PRE_CACHE: dict = {}  # (dtype, head_dim, dq_zero, zeroes semaphores, tile_m, tvm_ffi) -> compiled preprocess


def preprocess_kernel(cfg: BwdConfig, dout, out, lse, softmax_scale: float, seqlen_q_pad: int, use_tvm_ffi: bool,
                      dq_accum, dq_sem=None):
    """preprocess="kernel": D and LSE_log2 as preprocess_torch, by BwdPreprocess (one launch; with
    dq_zero="preprocess" it also zeroes dq_accum and, deterministic, dq_sem)."""
    import torch

    b, sq, h, _ = dout.shape
    dpsum = torch.empty((b, h, seqlen_q_pad), dtype=torch.float32, device=dout.device)
    lse_log2 = torch.empty((b, h, seqlen_q_pad), dtype=torch.float32, device=dout.device)
    if not out.is_contiguous() or out.data_ptr() % 16:
        out = out.clone(memory_format=torch.contiguous_format)  # 16-byte aligned rows
    lse = lse.contiguous()
    zero_sem = cfg.deterministic and cfg.dq_zero == "preprocess"
    sem = dq_sem if zero_sem else None
    key = (cfg.dtype, cfg.head_dim, cfg.dq_zero, zero_sem, cfg.tile_m if zero_sem else None, use_tvm_ffi)
    fn = _PRE_CACHE.get(key)
    if use_tvm_ffi:
        if fn is None:
            fn = _PRE_CACHE[key] = compile_preprocess(cfg, tvm_ffi=True)
        fn(out, dout, lse, dpsum, lse_log2, dq_accum, sem, softmax_scale)
    else:
        args = [to_cute(out, 3), to_cute(dout, 3)] + [to_cute(t, 2, align=4) for t in (lse, dpsum, lse_log2)] \
            + [to_cute(dq_accum, 3), to_cute(sem, 2, align=4) if zero_sem else None, Float32(softmax_scale)]
        stream = torch_stream(dout.device)
        if fn is None:
            fn = _PRE_CACHE[key] = cute.compile(BwdPreprocess(cfg), *args, stream)
        fn(*args, stream)
    return dpsum, lse_log2


def preprocess_varlen(cfg: BwdConfig, dout, out, lse, softmax_scale: float, dpsum, lse_log2, dq_accum, dq_sem, cu_q,
                      max_seqlen_q: int, use_tvm_ffi: bool):
    """The varlen build's preprocess (BwdPreprocessVarlen, one launch): dout, out (total_q, h, d),
    lse (h, total_q) packed; dpsum, lse_log2 (1, h, s_q_pad) and dq_accum (1, h, s_q_pad, d)
    padded per sequence, written (and zeroed) over each sequence's query blocks, and with them
    (deterministic) dq_sem (1, h, s_q_pad / tile_m), else None."""
    if not out.is_contiguous() or out.data_ptr() % 16:
        out = out.contiguous() if not out.is_contiguous() else out.clone()  # 16-byte aligned rows
    o, do, ls = out.unsqueeze(0), dout.unsqueeze(0), lse.contiguous().unsqueeze(0)
    pieces = -(-max(max_seqlen_q, 1) // cfg.tile_m) * cfg.tile_m // BwdPreprocess.ROWS
    key = ("varlen", cfg.dtype, cfg.head_dim, cfg.tile_m, cfg.deterministic, use_tvm_ffi)
    fn = _PRE_CACHE.get(key)
    if use_tvm_ffi:
        if fn is None:
            fn = _PRE_CACHE[key] = compile_preprocess(cfg, tvm_ffi=True)
        fn(o, do, ls, dpsum, lse_log2, dq_accum, dq_sem, softmax_scale, cu_q, pieces)
        return
    args = [to_cute(o, 3), to_cute(do, 3)] + [to_cute(t, 2, align=4) for t in (ls, dpsum, lse_log2)] \
        + [to_cute(dq_accum, 3), to_cute(dq_sem, 2, align=4) if dq_sem is not None else None,
           Float32(softmax_scale), to_cute(cu_q, 0, align=4)]
    stream = torch_stream(dout.device)
    if fn is None:
        fn = _PRE_CACHE[key] = cute.compile(BwdPreprocessVarlen(cfg), *args, Int32(pieces), stream)
    fn(*args, Int32(pieces), stream)


def preprocess_torch(cfg: BwdConfig, dout, out, lse, softmax_scale: float, seqlen_q_pad: int):
    """The preprocess, in torch: D = rowsum(dO * O) * softmax_scale in fp32 and LSE_log2 = LSE *
    log2(e), rows that see no key (LSE = -inf) and the padding rows at +inf (P = 0 there), both
    (b, h, s_q_pad)."""
    import torch

    b, sq, h, _ = dout.shape
    dpsum = torch.zeros((b, h, seqlen_q_pad), dtype=torch.float32, device=dout.device)
    dpsum[:, :, :sq] = (dout.float() * out.float()).sum(-1).transpose(1, 2) * softmax_scale
    lse_log2 = torch.full((b, h, seqlen_q_pad), math.inf, dtype=torch.float32, device=dout.device)
    lse_log2[:, :, :sq] = torch.where(lse == -math.inf, math.inf, lse.float() * LOG2_E)
    return dpsum, lse_log2
