"""The SM90 kernels' shared GEMM and warpgroup helpers (sm90/fwd.py and sm90/bwd.py): swizzled
smem layouts, views of smem tiles and wgmma accumulators, the wgmma descriptor fragment, and one
warpgroup's wgmma chain (gemm). Device-side code: needs the CuTe DSL.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Int32, const_expr
from cutlass.cute.nvgpu import tcgen05, warpgroup
from cutlass.tensor_utils import LayoutEnum


def select(t: cute.Tensor, modes) -> cute.Tensor:
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


def smem_layout(dtype, rows: int, cols: int, stages=None):
    """Row-major (cols contiguous) swizzled smem tile, optionally with a trailing stage mode."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_helpers.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype
    )
    shape = (rows, cols) if stages is None else (rows, cols, stages)
    order = (0, 1) if stages is None else (0, 1, 2)
    return cute.tile_to_shape(atom, shape, order=order)


def opaque_desc(frag: cute.Tensor) -> cute.Tensor:
    """The same wgmma smem-descriptor fragment (same layout, same 64-bit base descriptor), its
    base materialised here, once, before the tile and KV loops: each GEMM then only adds its
    stage and k-step offsets. Built straight from the smem pointer (make_fragment), the base
    (address >> 4, masked, OR'd with the layout bits) was rebuilt in every KV iteration.
    The low word goes through make_warp_uniform (a shfl from lane 0), which the compilers
    cannot re-derive from the pointer; it returns the value unchanged: the descriptor is the
    same in every lane of a warp (K, V: the whole CTA; Q: the warpgroup's rows)."""
    desc = tcgen05.smem_descriptor_to_int(frag.iterator)
    lo = cute.arch.make_warp_uniform(Int32(desc & 0xFFFFFFFF))
    desc = (desc & ~0xFFFFFFFF) | (cutlass.Int64(lo) & 0xFFFFFFFF)
    return cute.make_tensor(tcgen05.int_to_smem_descriptor(desc), frag.layout)


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """(rows, cols, stages) smem tensor seen as (cols, rows, stages): V as the B operand of PV."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))


def acc_mn_layout(acc_layout: cute.Layout) -> cute.Layout:
    """wgmma accumulator ((2, 2, N/8), MMA_M, MMA_N) viewed as (rows, cols) of this thread:
    ((2, MMA_M), (2, N/8, MMA_N)). Row r = one query row; a row's 4 owners form a quad."""
    lc = cute.make_layout(acc_layout.shape)
    shape = ((lc.shape[0][1], lc.shape[1]), (lc.shape[0][0], lc.shape[0][2], lc.shape[2]))
    stride = ((lc.stride[0][1], lc.stride[1]), (lc.stride[0][0], lc.stride[0][2], lc.stride[2]))
    return cute.composition(acc_layout, cute.make_layout(shape, stride=stride))


def mn_view(acc: cute.Tensor) -> cute.Tensor:
    return cute.make_tensor(acc.iterator, acc_mn_layout(acc.layout))


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """The S accumulator ((2, 2, N/8), M, N') regrouped as the A operand of the PV wgmma
    ((2, 2, 2), M, (N/16, N')): one k-step of 16 keys = two 8-column accumulator chunks."""
    layout = acc.layout
    div = 2 if const_expr(layout.shape[0][2] % 2 == 0) else 1
    l = cute.logical_divide(layout, ((None, None, div), None, None))
    a_layout = cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[0][2][0]), l.shape[1], (l.shape[0][2][1], l.shape[2])),
        stride=(
            (l.stride[0][0], l.stride[0][1], l.stride[0][2][0]),
            l.stride[1],
            (l.stride[0][2][1], l.stride[2]),
        ),
    )
    return cute.make_tensor(acc.iterator, a_layout)


def smem_layout_narrow(dtype, rows: int, cols: int, stages=None):
    """As smem_layout, with 32-column (64-byte swizzle) atoms for 16-bit types."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_helpers.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, 32), dtype)
    shape = (rows, cols) if stages is None else (rows, cols, stages)
    order = (0, 1) if stages is None else (0, 1, 2)
    return cute.tile_to_shape(atom, shape, order=order)


@cute.jit
def gemm(tiled_mma, acc, tA, tB, zero_init: cutlass.Constexpr, wait: cutlass.Constexpr):
    """One warpgroup's wgmma chain acc (+)= tA tB over the k-steps (mode 2 of tA and tB):
    fence, the MMAs (zero_init: the first overwrites acc), commit; wait >= 0: wait_group(wait)
    after the commit (-1: no wait)."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(cute.size(tA.shape[2])):
        cute.gemm(atom, acc, tA[None, None, k], tB[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if const_expr(wait >= 0):
        warpgroup.wait_group(wait)
