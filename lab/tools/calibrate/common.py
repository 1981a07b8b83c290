"""Shared helpers for the calibration microbenchmarks (CuTe DSL, sm_90a).

Every benchmark module defines `@cute.jit` host functions whose arguments are cute tensors
(an Int64 stamp buffer, a Float32 sink) plus Int32 knobs. The same code is compiled
 - on the CPU (`CUTE_DSL_ARCH=sm_90a`, fake tensors) to check the SASS holds the instruction
   that is meant to be measured (check_sass.py), and
 - on the device (real torch tensors) and run (run_all.py).
Timing is done inside the kernels with clock64 (SM cycles) stamps written to global memory.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import time

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

ARCH = "sm_90a"


# ----------------------------------------------------------------------------- inline PTX
def _asm(ret, operands, ptx, cons):
    return llvm.inline_asm(ret, operands, ptx, cons, has_side_effects=True, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def ffma(x, a, b, *, loc=None, ip=None):
    """x * a + b as one fma.rn.f32 (FFMA)."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(), Float32(a).ir_value(), Float32(b).ir_value()],
                        "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f"))


@dsl_user_op
def ex2(x, *, loc=None, ip=None):
    """ex2.approx.ftz.f32 (MUFU.EX2)."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value()], "ex2.approx.ftz.f32 $0, $1;", "=f,f"))


@dsl_user_op
def fmax(x, y, *, loc=None, ip=None):
    """max.f32 (FMNMX)."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(), Float32(y).ir_value()],
                        "max.f32 $0, $1, $2;", "=f,f,f"))


@dsl_user_op
def f2bf16x2(x, y, *, loc=None, ip=None):
    """cvt.rn.bf16x2.f32 (F2FP.BF16.F32.PACK_AB); the packed pair comes back as the bits of an f32
    so that it can feed the next conversion (a dependent chain)."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(), Float32(y).ir_value()],
                        "{\n.reg .b32 t;\ncvt.rn.bf16x2.f32 t, $1, $2;\nmov.b32 $0, t;\n}", "=f,f,f"))


@dsl_user_op
def lop3_xor(a, b, c, *, loc=None, ip=None):
    """a ^ b ^ c as one lop3.b32 (LOP3)."""
    return Int32(_asm(T.i32(), [Int32(a).ir_value(), Int32(b).ir_value(), Int32(c).ir_value()],
                      "lop3.b32 $0, $1, $2, $3, 0x96;", "=r,r,r,r"))


@dsl_user_op
def smem_addr(ptr, *, loc=None, ip=None):
    """32-bit shared-window address of a smem cute pointer."""
    return Int32(llvm.ptrtoint(T.i32(), ptr.to_llvm_ptr()))


@dsl_user_op
def lds128(addr, offset: int, *, loc=None, ip=None):
    """ld.shared.v4.u32 at addr+offset (LDS.128); returns 4 Int32."""
    ty = llvm.StructType.get_literal([T.i32()] * 4)
    res = _asm(ty, [Int32(addr).ir_value()],
               f"ld.volatile.shared.v4.u32 {{$0, $1, $2, $3}}, [$4+{offset}];", "=r,=r,=r,=r,r")
    return tuple(Int32(llvm.extractvalue(T.i32(), res, [i])) for i in range(4))


@dsl_user_op
def lds32(addr, *, loc=None, ip=None):
    """ld.shared.u32 (LDS): a dependent pointer chase step."""
    return Int32(_asm(T.i32(), [Int32(addr).ir_value()], "ld.shared.u32 $0, [$1];", "=r,r"))


@dsl_user_op
def sts32(addr, val, *, loc=None, ip=None):
    _asm(None, [Int32(addr).ir_value(), Int32(val).ir_value()], "st.shared.u32 [$0], $1;", "r,r")


@dsl_user_op
def clk(*, loc=None, ip=None):
    """clock64 as a volatile asm (keeps its place among the other volatile asm)."""
    return Int64(_asm(T.i64(), [], "mov.u64 $0, %clock64;", "=l"))


@dsl_user_op
def gtimer(*, loc=None, ip=None):
    """%globaltimer (ns)."""
    return Int64(_asm(T.i64(), [], "mov.u64 $0, %globaltimer;", "=l"))


# ----------------------------------------------------------------------------- compile
@cute.jit
def fill_random_bf16(base_a, a_words, base_b, nwords, tid, threads, seed):
    """Fill two smem regions (A: a_words 32-bit words at base_a, then B up to nwords at base_b)
    with pseudo-random bf16 pairs: random sign and mantissa, exponent 2^-7 .. 2^0, so the wgmma
    sums stay finite. Every thread of the CTA takes part; `seed` varies the values per CTA."""
    for i in cutlass.range((nwords + threads - 1) // threads, unroll=1):
        w = cutlass.min(i * threads + tid, nwords - 1)
        u = (w + seed) * 1103515245 + 12345
        lo = ((u >> 16) & 0x807F) | ((120 + ((u >> 7) & 7)) << 7)
        hi = (((u >> 1) ^ (u << 3)) & 0x807F) | ((120 + ((u >> 11) & 7)) << 7)
        word = (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)
        if w < a_words:
            sts32(base_a + w * 4, word)
        else:
            sts32(base_b + (w - a_words) * 4, word)


def fake_tensor(dtype, shape):
    from cutlass.cute.runtime import make_fake_compact_tensor

    return make_fake_compact_tensor(dtype, shape, assumed_align=16)


def fake_stream():
    return cute.runtime.make_fake_stream()


def cubin_registers(data: bytes):
    """Registers per thread of the kernel in a cubin: EIATTR_REGCOUNT (0x2f) in its .nv.info
    sections, (symbol index u32, registers u32); None if absent."""
    import struct

    regs = None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    str_off = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        h = shoff + i * shentsize
        name_off, = struct.unpack_from("<I", data, h)
        name = data[str_off + name_off: data.index(b"\0", str_off + name_off)].decode()
        if not name.startswith(".nv.info"):
            continue
        off, size = struct.unpack_from("<QQ", data, h + 0x18)
        b = data[off:off + size]
        p = 0
        while p + 2 <= len(b):
            fmt, attr = b[p], b[p + 1]
            if fmt == 4:
                sz, = struct.unpack_from("<H", b, p + 2)
                if attr == 0x2F and sz == 8:
                    regs = max(regs or 0, struct.unpack_from("<I", b, p + 8)[0])
                p += 4 + sz
            elif fmt == 1:
                p += 2
            else:
                p += 4
    return regs


def compile_for_sass(fn, *args, with_registers: bool = False):
    """Compile `fn(*args)` (fake tensors) for sm_90a on the CPU; return the SASS text (and, with
    with_registers, the kernel's registers per thread, to check threads x regs <= 64K)."""
    dump_dir = tempfile.mkdtemp(prefix="calib_sass_")
    keys = ("CUTE_DSL_ARCH", "CUTE_DSL_KEEP", "CUTE_DSL_DUMP_DIR")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(CUTE_DSL_ARCH=ARCH, CUTE_DSL_KEEP="sass", CUTE_DSL_DUMP_DIR=dump_dir)
    try:
        cute.compile(fn, *args, options=f"--gpu-arch {ARCH} --keep-cubin --dump-dir {dump_dir}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    cubins = sorted(glob.glob(os.path.join(dump_dir, "**", "*.cubin"), recursive=True), key=os.path.getmtime)
    if not cubins:
        raise RuntimeError(f"no cubin under {dump_dir}")
    from cutlass.base_dsl.env_manager import _find_nvdisasm_binary

    res = subprocess.run([_find_nvdisasm_binary(), "-c", cubins[-1]], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(res.stderr)
    import shutil

    regs = cubin_registers(open(cubins[-1], "rb").read()) if with_registers else None
    shutil.rmtree(dump_dir, ignore_errors=True)
    return (res.stdout, regs) if with_registers else res.stdout


def sass_count(sass: str, opcode: str) -> int:
    """Instructions whose opcode starts with `opcode` (e.g. 'HGMMA', 'MUFU.EX2')."""
    n = 0
    for line in sass.splitlines():
        s = line.split("*/", 1)[-1].strip() if "*/" in line else line.strip()
        s = s.lstrip("{ ").strip()
        if s.startswith("@"):
            s = s.split(None, 1)[1] if " " in s else s
        if s.startswith(opcode):
            n += 1
    return n


def run_sass_checks(cases, width: int = 28) -> int:
    """Compile each (name, build, expect) case for sm_90a and count its opcodes: expect maps an
    opcode to the fewest instructions wanted (0: none may appear). Prints a line per case; 1 if any
    case fails, else 0."""
    import time

    bad = 0
    for name, build, expect in cases:
        t0 = time.time()
        fn, args = build()
        sass = compile_for_sass(fn, *args)
        counts = {op: sass_count(sass, op) for op in expect}
        ok = all((counts[op] >= n) if n else counts[op] == 0 for op, n in expect.items())
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name:{width}s} {counts}  ({time.time() - t0:.1f}s)", flush=True)
    print("all ok" if not bad else f"{bad} FAILED")
    return 1 if bad else 0


# ----------------------------------------------------------------------------- device side
class Device:
    """Compile-and-run helper on the GPU (torch tensors -> cute tensors)."""

    def __init__(self):
        import torch

        from lab.tools.hopper import require_hopper

        require_hopper(os.path.basename(sys.argv[0]) or "calibrate",
                       "on the CPU, python -m lab.tools.calibrate.check_sass checks the benchmarks' SASS")

        self.torch = torch
        self.cache = {}
        self.compile_s = {}

    def stream(self):
        import cuda.bindings.driver as cuda

        return cuda.CUstream(self.torch.cuda.current_stream().cuda_stream)

    @staticmethod
    def ct(t, align=16):
        from cutlass.cute.runtime import from_dlpack

        return from_dlpack(t, assumed_align=align)

    def call(self, key, fn, *args):
        """Compile once per key (with these args), then launch; synchronizes; returns seconds."""
        torch = self.torch
        conv = [self.ct(a) if isinstance(a, torch.Tensor) else a for a in args]
        if key not in self.cache:
            t0 = time.perf_counter()
            self.cache[key] = cute.compile(fn, *conv, self.stream())
            self.compile_s[key] = time.perf_counter() - t0
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.cache[key](*conv, self.stream())
        torch.cuda.synchronize()
        return time.perf_counter() - t0


def write_result(key: str, result, out=None) -> int:
    """{"meta": run_all.meta(), key: result}, written to `out` as JSON if given; 0 (a benchmark's
    main() returns it)."""
    import json

    from lab.tools.calibrate.run_all import meta

    doc = {"meta": meta(), key: result}
    if out:
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def only_loads(ap, text: str, loads) -> tuple:
    """The names of a benchmark's --only (comma-separated), each one of `loads`; an unknown name
    ends the run through ap.error (one line, the allowed names)."""
    only = tuple(x for x in text.split(",") if x)
    if set(only) - set(loads):
        ap.error(f"--only: unknown load(s) {', '.join(sorted(set(only) - set(loads)))}; allowed: {', '.join(loads)}")
    return only

