"""Row-predicated stores of a tile: from shared memory to global memory, the varlen builds'
epilogues (sm90/fwd.py O, sm90/bwd.py dK and dV), where a TMA store of the whole tile would write
the first rows of the next sequence, which another CTA owns; zeros into a shared-memory tile's
last rows, the forward's V rows past a block's keys (decode, varlen). Device-side code: needs the
CuTe DSL.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute


def _row_copy(dtype, cols: int, threads: int):
    """A tiled copy of 16-byte pieces along rows: `across` threads per row, 8 elements (16 bytes)
    each, over 64 columns (32 at hd96), one swizzle atom."""
    vec = 128 // dtype.width
    across = math.gcd(cols, 64) // vec
    return cute.make_tiled_copy_tv(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128),
        cute.make_layout((threads // across, across), stride=(across, 1)), cute.make_layout((1, vec)))


@cute.jit
def store_rows(sX: cute.Tensor, gX: cute.Tensor, tidx, threads: cutlass.Constexpr, rows):
    """The tile sX (smem, swizzled as the kernel laid it out) -> gX (its global tile of the same
    shape), its first `rows` rows only: smem -> registers in 16-byte pieces -> STG.128. A pass of
    the copy: `across` threads per row, 8 elements (16 bytes) each, over 64 columns (32 at hd96),
    one swizzle atom; `threads` threads (thread index tidx) take part."""
    dtype = sX.element_type
    copy = _row_copy(dtype, cute.size(gX, mode=[1]), threads)
    thr = copy.get_slice(tidx)
    tXsX = thr.partition_S(sX)
    tXgX = thr.partition_D(gX)
    tXcX = thr.partition_S(cute.make_identity_tensor(gX.shape))
    tXrX = cute.make_rmem_tensor_like(tXsX, dtype)
    cute.autovec_copy(tXsX, tXrX)
    for m in cutlass.range_constexpr(cute.size(tXrX, mode=[1])):
        if tXcX[0, m, 0][0] < rows:
            cute.copy(copy, tXrX[None, m, None], tXgX[None, m, None])


@cute.jit
def zero_rows(sX: cute.Tensor, tidx, threads: cutlass.Constexpr, first_row):
    """The rows >= first_row of the smem tile sX (swizzled as the kernel laid it out) set to 0 in
    16-byte stores (STS.128), the pieces of store_rows' copy; `threads` threads take part. A pass
    of the copy need not divide the tile's rows (hd64: 48 rows a pass over 128, hd96: 96 over 144
    or 112, hd192: 32 over 112): its last pass stops at the tile's last row, or it would write past
    the V stage into the next buffer."""
    rows = cute.size(sX, mode=[0])
    copy = _row_copy(sX.element_type, cute.size(sX, mode=[1]), threads)
    thr = copy.get_slice(tidx)
    tXsX = thr.partition_D(sX)
    tXcX = thr.partition_D(cute.make_identity_tensor((rows, cute.size(sX, mode=[1]))))
    tXrX = cute.make_rmem_tensor_like(tXsX, sX.element_type)
    tXrX.fill(0.0)
    for m in cutlass.range_constexpr(cute.size(tXrX, mode=[1])):
        row = tXcX[0, m, 0][0]
        if row >= first_row:
            if row < rows:
                cute.copy(copy, tXrX[None, m, None], tXsX[None, m, None])
