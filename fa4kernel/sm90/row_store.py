"""Row-predicated stores of a tile from shared memory to global memory: the varlen builds'
epilogues (sm90/fwd.py O, sm90/bwd.py dK and dV), where a TMA store of the whole tile would write
the first rows of the next sequence, which another CTA owns. Device-side code: needs the CuTe DSL.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute


@cute.jit
def store_rows(sX: cute.Tensor, gX: cute.Tensor, tidx, threads: cutlass.Constexpr, rows):
    """The tile sX (smem, swizzled as the kernel laid it out) -> gX (its global tile of the same
    shape), its first `rows` rows only: smem -> registers in 16-byte pieces -> STG.128. A pass of
    the copy: `across` threads per row, 8 elements (16 bytes) each, over 64 columns (32 at hd96),
    one swizzle atom; `threads` threads (thread index tidx) take part."""
    dtype = sX.element_type
    vec = 128 // dtype.width
    across = math.gcd(cute.size(gX, mode=[1]), 64) // vec
    copy = cute.make_tiled_copy_tv(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128),
        cute.make_layout((threads // across, across), stride=(across, 1)), cute.make_layout((1, vec)))
    thr = copy.get_slice(tidx)
    tXsX = thr.partition_S(sX)
    tXgX = thr.partition_D(gX)
    tXcX = thr.partition_S(cute.make_identity_tensor(gX.shape))
    tXrX = cute.make_rmem_tensor_like(tXsX, dtype)
    cute.autovec_copy(tXsX, tXrX)
    for m in cutlass.range_constexpr(cute.size(tXrX, mode=[1])):
        if tXcX[0, m, 0][0] < rows:
            cute.copy(copy, tXrX[None, m, None], tXgX[None, m, None])
