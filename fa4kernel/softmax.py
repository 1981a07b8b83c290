"""The online softmax's shared pieces, used by both forward kernels (sm90/fwd.py, sm100/fwd.py).

- The row max: four independent FMNMX chains over a thread's share of the row (max4).
- The rescale decision (FA4's conditional rescaling, update_row_max*): classic online softmax
  (FA2/FA3) rescales O and the row sum by exp2((m_old - m_new) * s) whenever the row max grows.
  FA4 keeps the stale max m_old unless the new max exceeds it by more than tau (log2 units;
  tau = 8 means a factor 256): then P = exp2(x*s - m_old*s) <= 2^tau still fits bf16/fp16, the
  rescale (and on SM100 the TMEM round trip) is skipped, and the final O / row_sum uses the
  statistics of the max actually kept, so the result is exact.
- exp2 on the MUFU or, for a fraction of the columns, emulated on the FMA pipe (exp2,
  exp2_emulated, exp2_emulated_x2): MUFU.EX2 runs at 16 ops/clk/SM on Hopper and Blackwell
  alike, while the FMA pipe does 128. The emulation (Cody-Waite range reduction + degree-3
  polynomial, FA4's softmax trick):

    x    = max(x, -127)                      # below that the result is 0 in bf16 anyway
    xr   = x + (2^23 + 2^22)   (round down)   # floor(x) lands in the low mantissa bits of xr
    frac = x - (xr - (2^23 + 2^22))           # in [0, 1)
    p    = ((c3*frac + c2)*frac + c1)*frac + c0     ~ 2^frac
    out  = bits(xr) << 23  +  bits(p)         # add floor(x) to p's exponent field

  At x = -127 the fraction is 0 and p = c0 = 1.0 exactly, so the result is +0.0: masked scores
  (-inf) come out as exact zeros, the same as MUFU.EX2.

The row sums differ per kernel (SM90: four scalar partial sums or one chain; SM100: packed
f32x2 adds) and stay in the kernels. Plain-Python models (*_reference) serve the CPU tests.
The device helpers need the CuTe DSL (imported here); the column choice (emulated_columns) and
the models do not use it.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .exp2_poly import COEFFS as POLY_EX2_DEG3  # 2^f on [0, 1), c0..c3 (exp2_poly.py)

ROUND_MAGIC = float(2**23 + 2**22)


def exp2_emulated_reference(x: float) -> float:
    """Bit-exact-ish Python model of the device routine (float64 arithmetic, for tests/docs)."""
    import math
    import struct

    x = max(float(x), -127.0)
    xr_int = math.floor(x)
    frac = x - xr_int
    c0, c1, c2, c3 = POLY_EX2_DEG3
    p = ((c3 * frac + c2) * frac + c1) * frac + c0
    p_bits = struct.unpack("<I", struct.pack("<f", p))[0]
    # the shift keeps the low 9 bits of floor(x) (two's complement); the add wraps mod 2^32
    out_bits = (((xr_int & 0x1FF) << 23) + p_bits) & 0xFFFFFFFF
    return struct.unpack("<f", struct.pack("<I", out_bits))[0]


def emulated_columns(n: int, fraction: float) -> tuple:
    """Which of a thread's n row elements use the polynomial: round(fraction*n) of them,
    spread evenly so MUFU and FMA work interleave in the instruction stream."""
    count = int(round(fraction * n))
    if count <= 0:
        return ()
    if count >= n:
        return tuple(range(n))
    return tuple(sorted({int((k + 0.5) * n / count) for k in range(count)}))


def exp2_emulated(x):
    """Device function: emulated exp2 of one Float32 (one inline-PTX block, 10 instructions)."""
    from cutlass import Float32
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    c0, c1, c2, c3 = POLY_EX2_DEG3

    def f32hex(v: float) -> str:
        import struct

        return "0f%08X" % struct.unpack("<I", struct.pack("<f", v))[0]

    asm = (
        "{\n\t"
        ".reg .f32 xc, xr, xb, fr, p;\n\t"
        ".reg .b32 xri, pi, e;\n\t"
        f"max.f32 xc, $1, {f32hex(-127.0)};\n\t"
        f"add.rm.f32 xr, xc, {f32hex(ROUND_MAGIC)};\n\t"
        f"sub.rn.f32 xb, xr, {f32hex(ROUND_MAGIC)};\n\t"
        "sub.rn.f32 fr, xc, xb;\n\t"
        f"fma.rn.f32 p, fr, {f32hex(c3)}, {f32hex(c2)};\n\t"
        f"fma.rn.f32 p, p, fr, {f32hex(c1)};\n\t"
        f"fma.rn.f32 p, p, fr, {f32hex(c0)};\n\t"
        "mov.b32 xri, xr;\n\t"
        "mov.b32 pi, p;\n\t"
        "shl.b32 e, xri, 23;\n\t"
        # add.s32 lowers to LEA/IADD on the ALU pipe rather than IMAD on the FMA pipe
        "add.s32 e, e, pi;\n\t"
        "mov.b32 $0, e;\n\t"
        "}\n"
    )
    return Float32(
        llvm.inline_asm(
            T.f32(),
            [Float32(x).ir_value()],
            asm,
            "=f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


def exp2_emulated_x2(x0, x1):
    """Device function, SM100 only: the same emulation on a pair with packed f32x2 math.

    FA4's cost model: per pair 6 packed FMA-pipe instructions (1 add, 2 sub, 3 fma as f32x2)
    plus the per-element clamps and exponent shifts on the ALU. Same rounding modes as
    exp2_emulated, so each lane gives the identical result. Hopper has no f32x2: the SM90 kernel
    uses the scalar routine.
    """
    import struct

    from cutlass import Float32
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    def f32hex(v: float) -> str:
        return "0f%08X" % struct.unpack("<I", struct.pack("<f", v))[0]

    c0, c1, c2, c3 = POLY_EX2_DEG3
    pair = lambda name, v: f"mov.f32 k, {f32hex(v)};\n\tmov.b64 {name}, {{k, k}};\n\t"
    asm = (
        "{\n\t"
        ".reg .f32 a, b, k;\n\t"
        ".reg .b64 x, magic, xr, xb, fr, p, c0v, c1v, c2v, c3v;\n\t"
        ".reg .b32 r0, r1, p0, p1, e0, e1;\n\t"
        f"max.f32 a, $2, {f32hex(-127.0)};\n\t"
        f"max.f32 b, $3, {f32hex(-127.0)};\n\t"
        "mov.b64 x, {a, b};\n\t"
        + pair("magic", ROUND_MAGIC) + pair("c3v", c3) + pair("c2v", c2) + pair("c1v", c1) + pair("c0v", c0) +
        "add.rm.f32x2 xr, x, magic;\n\t"      # floor(x) lands in the low mantissa bits
        "sub.rn.f32x2 xb, xr, magic;\n\t"
        "sub.rn.f32x2 fr, x, xb;\n\t"          # fraction in [0, 1)
        "fma.rn.f32x2 p, fr, c3v, c2v;\n\t"
        "fma.rn.f32x2 p, p, fr, c1v;\n\t"
        "fma.rn.f32x2 p, p, fr, c0v;\n\t"
        "mov.b64 {r0, r1}, xr;\n\t"
        "mov.b64 {p0, p1}, p;\n\t"
        "shl.b32 e0, r0, 23;\n\t"
        "shl.b32 e1, r1, 23;\n\t"
        "add.s32 $0, e0, p0;\n\t"              # add floor(x) to the exponent of 2^frac
        "add.s32 $1, e1, p1;\n\t"
        "}\n"
    )
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32(), T.i32()]),
        [Float32(x0).ir_value(), Float32(x1).ir_value()],
        asm, "=r,=r,f,f", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    lo = llvm.extractvalue(T.i32(), res, [0])
    hi = llvm.extractvalue(T.i32(), res, [1])
    return Float32(llvm.bitcast(T.f32(), lo)), Float32(llvm.bitcast(T.f32(), hi))


# ------------------------------------------------------------------ row max
def max4(get, ncol: int):
    """Device helper: the max of get(0) .. get(ncol - 1) (ncol a multiple of 4) as four
    independent FMNMX chains (column c goes to chain c % 4), joined at the end: ptxas fuses
    them into FMNMX3 on SM100 and keeps four chains in flight on SM90."""
    m = [get(0), get(1), get(2), get(3)]
    for c in range(4, ncol):
        m[c % 4] = cute.arch.fmax(m[c % 4], get(c))
    return cute.arch.fmax(cute.arch.fmax(m[0], m[1]), cute.arch.fmax(m[2], m[3]))


# ------------------------------------------------------------------ exp2
def exp2(x, emulated: bool):
    """Device helper: exp2(x) on the MUFU (emulated=False) or on the FMA pipe (exp2_emulated);
    `emulated` is a trace-time constant (a column of emulated_columns or not)."""
    if emulated:
        return exp2_emulated(x)
    return cute.math.exp2(x, fastmath=True)


# ------------------------------------------------------------------ rescale decision
def rescale_rule_reference(m_old: float, m_new: float, scale_log2: float, tau: float):
    """Python model: returns (max_to_keep, acc_scale)."""
    import math

    if m_new == -math.inf:  # nothing seen yet (m_new includes m_old)
        return m_old, 1.0
    if m_old == -math.inf:
        return m_new, 0.0
    if tau > 0 and (m_new - m_old) * scale_log2 <= tau:
        return m_old, 1.0
    return m_new, math.exp2((m_old - m_new) * scale_log2)


@cute.jit
def update_row_max_log2(row_max_old, row_max_new, scale_log2, rescale_threshold: float):
    """update_row_max without the final exp2: returns (row_max_kept, row_max_safe_scaled,
    log2 of acc_scale), so a caller can issue that exp2 where it schedules best (SM90: after
    the row's P exp2s, fa4kernel/sm90/fwd.py _row_exp)."""
    kept = row_max_new
    if cutlass.const_expr(rescale_threshold > 0.0):
        # NaN (both -inf) and +inf (old -inf) compare False: those rows take the new max.
        if (row_max_new - row_max_old) * scale_log2 <= Float32(rescale_threshold):
            kept = row_max_old
    safe = kept if kept != -Float32.inf else Float32(0.0)
    return kept, safe * scale_log2, (row_max_old - safe) * scale_log2


@cute.jit
def update_row_max(row_max_old, row_max_new, scale_log2, rescale_threshold: float):
    """Device helper (inside @cute.jit code), one row.

    row_max_new already includes row_max_old (max of both). Returns
    (row_max_kept, row_max_safe_scaled, acc_scale):
      row_max_kept        the max stored for the next block,
      row_max_safe_scaled kept max * scale_log2 with -inf replaced by 0 (fully masked rows),
      acc_scale           factor for O and row_sum (1.0 when the stale max is kept).
    rescale_threshold is a compile-time float; 0 = always rescale (FA3 behaviour).
    """
    kept, safe_scaled, log2_scale = update_row_max_log2(row_max_old, row_max_new, scale_log2,
                                                        rescale_threshold)
    return kept, safe_scaled, cute.math.exp2(log2_scale, fastmath=True)
