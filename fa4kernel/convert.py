"""fp32 registers -> 16-bit pairs: P before the PV GEMM (and dS, dK, dV in the backward).

The DSL's `tensor.load().to(bf16)` packs two elements per instruction (F2FP.BF16.F32.PACK_AB) only
where the tile shape lets its vectorizer see pairs: at 128 keys per KV block it does, at 80, 112,
144, 160 or 176 it converts one element at a time (one F2FP each) and joins the halves with a PRMT
per pair, 1.5 instructions per element instead of 0.5, inside the softmax the loop waits on.
cvt.rn.bf16x2.f32 (cvt.rn.f16x2.f32) converts a pair in one instruction at every shape. Same
rounding (to nearest even), so the result is bit for bit the DSL's.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T


def pack2(lo, hi, dtype) -> Int32:
    """Device function: two fp32 values as one 32-bit word of two 16-bit ones, `lo` in the low
    half (the element with the lower index), rounded to nearest even. dtype: BFloat16 or Float16."""
    kind = "bf16x2" if const_expr(dtype is cutlass.BFloat16) else "f16x2"
    return Int32(llvm.inline_asm(
        T.i32(), [Float32(lo).ir_value(), Float32(hi).ir_value()],
        f"cvt.rn.{kind}.f32 $0, $2, $1;",  # cvt's first source goes to the upper half
        "=r,f,f", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def to_16bit(src: cute.Tensor, dst: cute.Tensor, scale=None):
    """Device function: dst[i] = src[i] (times `scale` if given) for fp32 register tensors src and
    16-bit dst of the same size, two elements per instruction. dst's elements 2j and 2j + 1 must
    share a 32-bit register: true of the wgmma fragments (their innermost mode is a pair)."""
    assert dst.element_type in (cutlass.BFloat16, cutlass.Float16), "dst must be BFloat16 or Float16"
    assert cute.size(src.shape) == cute.size(dst.shape) and cute.size(src.shape) % 2 == 0
    words = cute.recast_tensor(dst, Int32)
    for j in cutlass.range_constexpr(cute.size(words)):
        if const_expr(scale is None):
            words[j] = pack2(src[2 * j], src[2 * j + 1], dst.element_type)
        else:
            words[j] = pack2(src[2 * j] * scale, src[2 * j + 1] * scale, dst.element_type)
