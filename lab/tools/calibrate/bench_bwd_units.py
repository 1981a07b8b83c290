"""The unit facts of the SM90 backward's loop: wgmma at small N and with narrow swizzles, the L2
rate of TMA bulk reduce-adds and of RED.ADD.F32 from registers.

flash-attn-4's SM90 backward at head dim 256 (tile 64 x 48, two MMA warpgroups) issues, per Q
block and warpgroup (flash_bwd_sm90.py _get_tiled_mma and _setup_attributes):
  S, dP  16 x HGMMA.64x24x16 SS, A (Q, dO) and B (K, V) K-major, 128-byte swizzle
  dV, dK 2 x 4 x HGMMA.64x48x16 SS, A (dO^T, Q^T) MN-major 128-byte swizzle, B (P^T, dS^T)
         MN-major without swizzle (sPdS's major-mode size is gcd(48 / 2, 48) = 24 bf16 = 48
         bytes, not a multiple of the 32-byte swizzle's width: the INTER atom, 16-byte rows)
  dQ     3 x HGMMA.64x128x16 SS, A (dS) K-major without swizzle, B (K) MN-major 128-byte swizzle
and leaves dQ by one cp.reduce.async.bulk .add.f32 of 32 KB per warpgroup into a fp32 buffer
that every CTA of the head adds into. fa4kernel's "red" build adds dQ by RED.ADD.F32x2 from
registers instead. This script measures those units on the GPU it runs on:

  wgmma   one CTA, 1 or 2 warpgroups, each `iters` trips of {fence; 8 x wgmma m64nNk16 (K = 128)
          chained on one accumulator; commit; wait_group(1)} (bench_wgmma.py's throughput loop)
          for each operand form in FORMS (N, SS | RS, A and B major mode and swizzle): cycles per
          instruction, against the tensor core's N / 2 and the operand bytes each fetches.
  bulk    cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 from one thread per CTA, a
          `chunk`-byte fp32 smem buffer added again and again (commit; wait_group.read DEPTH - 1):
          latency of one add (its smem read, its completion), and the rate from one SM and from
          every SM, into disjoint L2-resident regions, one shared 1 MB region, or the very same
          chunk (the backward: every KV tile's CTA of a head adds into the same dQ block); and
          whether loads share the reduce-adds' L2 rate: warp 1 of each CTA streams 16 KB bulk
          loads (UBLKCP, L2 hits) alone, then beside the reduce-adds.
  red     256 threads per CTA, `iters` trips of 8 x red.global.add.f32 (REDG.E.ADD.F32) or
          .v2.f32 (REDG.E.ADD.F32x2), a warp's 32 lanes on consecutive words; one SM and every SM,
          disjoint regions or one shared chunk.
Cycles are clock64 (SM cycles) inside the kernels; every timed window also stamps %globaltimer
(ns), so each rate is given per SM clock and the clock it ran at is recorded beside it.

    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_bwd_units --check-sass  # CPU
    python3 lab/tools/calibrate/bench_bwd_units.py --out U.json [--quick]             # GPU, ~60 s
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script path
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
    __package__ = "lab.tools.calibrate"

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.utils.hopper_helpers as sm90_helpers  # noqa: E402
from cutlass import BFloat16, Float32, Int32, Int64, const_expr  # noqa: E402
from cutlass._mlir import ir  # noqa: E402
from cutlass._mlir.dialects import llvm, vector  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

from .common import _asm, clk, fill_random_bf16, gtimer, run_sass_checks, smem_addr, sts32  # noqa: E402

KT = 128          # K of one smem tile: 8 k16 steps per trip
KB = KT // 16
WGS = 2           # the backward's two MMA warpgroups
THREADS = 128 * WGS

# name: (N, A source, A atom, B atom, what). An atom is a warpgroup.SmemLayoutAtomKind: K_ or MN_
# (the major mode), SW128 / SW64 / SW32 (the swizzle) or INTER (none: 16-byte core-matrix rows).
FORMS = {
    "n24_ss_k128": (24, "SS", "K_SW128", "K_SW128", "flash-attn-4 hd256 S and dP: 64x24x16, Q/dO and K/V K-major 128B"),
    "n32_ss_k128": (32, "SS", "K_SW128", "K_SW128", "N sweep, K-major 128B"),
    "n48_ss_k128": (48, "SS", "K_SW128", "K_SW128", "N sweep, K-major 128B"),
    "n64_ss_k128": (64, "SS", "K_SW128", "K_SW128", "N sweep, K-major 128B (bench_wgmma's reference form)"),
    "n128_ss_k128": (128, "SS", "K_SW128", "K_SW128", "N sweep, K-major 128B"),
    "n24_rs_k128": (24, "RS", None, "K_SW128", "A from registers, N = 24"),
    "n48_rs_k128": (48, "RS", None, "K_SW128", "A from registers, N = 48"),
    "n64_ss_k64": (64, "SS", "K_SW64", "K_SW64", "swizzle: both operands K-major 64B"),
    "n64_ss_k32": (64, "SS", "K_SW32", "K_SW32", "swizzle: both operands K-major 32B"),
    "n64_ss_kinter": (64, "SS", "K_INTER", "K_INTER", "swizzle: both operands K-major, none"),
    "n64_ss_mn128": (64, "SS", "MN_SW128", "MN_SW128", "MN-major reference: both 128B"),
    "n48_ss_dkv": (48, "SS", "MN_SW128", "MN_INTER", "flash-attn-4 hd256 dV and dK: A (dO^T, Q^T) MN 128B, "
                   "B (P^T, dS^T) MN unswizzled"),
    "n48_ss_dkv_sw32": (48, "SS", "MN_SW128", "MN_SW32", "dV/dK with B MN 32B (sPdS 48 keys wide)"),
    "n128_ss_dq": (128, "SS", "K_INTER", "MN_SW128", "flash-attn-4 hd256 dQ: A (dS) K unswizzled, B (K) MN 128B"),
}
QUICK_FORMS = ("n24_ss_k128", "n48_ss_k128", "n64_ss_k128", "n128_ss_k128", "n24_rs_k128", "n64_ss_k32",
               "n64_ss_kinter", "n48_ss_dkv", "n128_ss_dq")

BULK_MAX = 32768          # bytes of the smem source buffer (flash-attn-4 hd256: 64 x 256 x 4 / 2)
BULK_DEPTH = 2            # bulk groups in flight per thread (wait_group.read DEPTH - 1)
LOAD_BYTES = 16384        # the concurrent loads (mode 2, 3): 16 KB bulk copies, 4 slots (64 KB in flight)
LOAD_STAGES = 4
LOAD_MASK = (1 << 20) - 1  # within 1 MB of the source: L2 hits
RED_UNROLL = 8
STAMPS = 16384
STAMP_CTAS = 1024          # stamps: 4 per CTA of the reduce-adds, then 4 per CTA of the loads


def _atom(kind: str):
    return warpgroup.make_smem_layout_atom(getattr(warpgroup.SmemLayoutAtomKind, kind), BFloat16)


def _layout(kind: str, rows: int, cols: int, stages=None):
    """rows = the operand's M or N, cols = K; MN-major atoms tile along K first (quack's
    sm90_utils.make_smem_layout for an M-major tensor)."""
    mn = kind.startswith("MN")
    shape = (rows, cols) if stages is None else (rows, cols, stages)
    order = ((1, 0) if mn else (0, 1)) + (() if stages is None else (2,))
    return cute.tile_to_shape(_atom(kind), shape, order=order)


def _major(kind):
    return cute.nvgpu.OperandMajorMode.MN if kind.startswith("MN") else cute.nvgpu.OperandMajorMode.K


def sass_opcode(form: str) -> str:
    n = FORMS[form][0]
    return f"HGMMA.64x{n}x16.F32.BF16"


def operand_bytes(form: str) -> dict:
    """Shared-memory bytes one m64nNk16 instruction reads: A (64 x 16 bf16) unless RS, B (N x 16)."""
    n, src = FORMS[form][0], FORMS[form][1]
    return {"a": 0 if src == "RS" else 64 * 16 * 2, "b": n * 16 * 2}


# ----------------------------------------------------------------------------- wgmma
def make_wgmma(form: str):
    N, src, a_kind, b_kind, _ = FORMS[form]
    rs = src == "RS"
    a_kind = a_kind or "K_SW128"  # RS: the A registers; an unused smem tile keeps the kernel alike

    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, nwg: Int32, iters: Int32,
               tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout):
        tid = cute.arch.thread_idx()[0]
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx() // 4)
        wtid = tid % 128
        bid = cute.arch.block_idx()[0]

        @cute.struct
        class Storage:
            sA: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sB_layout)], 1024]

        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        base = smem_addr(storage.sA.data_ptr())
        base_b = smem_addr(storage.sB.data_ptr())
        a_words = cute.cosize(sA_layout) // 2
        nwords = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) // 2
        fill_random_bf16(base, a_words, base_b, nwords, tid, THREADS, bid * 7919)
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        thr_mma = tiled_mma.get_slice(wtid)
        wg_mma = tiled_mma.get_slice(0)
        tCsA = wg_mma.partition_A(sA[None, None, wg])
        tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB))
        if const_expr(rs):
            tCrA = cute.make_rmem_tensor(wg_mma.partition_shape_A((64, KT)), BFloat16)
            for i in cutlass.range_constexpr(cute.size(tCrA)):
                tCrA[i] = BFloat16(Float32(((wtid * 37 + i * 11) % 17) - 8) * Float32(0.125))
        else:
            tCrA = wg_mma.make_fragment_A(tCsA)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((64, N)), Float32)
        acc.fill(0.0)
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        cute.arch.sync_threads()
        if wg < nwg:
            t0 = clk()
            g0 = gtimer()
            for _ in cutlass.range(iters, unroll=1):
                warpgroup.fence()
                for k in cutlass.range_constexpr(KB):
                    cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
            warpgroup.wait_group(0)
            t1 = clk()
            g1 = gtimer()
            if wtid == 0:
                o = wg * 4
                stamps[o + 0] = t0
                stamps[o + 1] = t1
                stamps[o + 2] = g0
                stamps[o + 3] = g1
        total = Float32(0.0)
        for i in cutlass.range_constexpr(cute.size(acc)):
            total = total + acc[i]
        sink[tid] = total

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, nwg: Int32, iters: Int32, stream):
        tiled_mma = sm90_helpers.make_trivial_tiled_mma(
            BFloat16, BFloat16, _major(a_kind), _major(b_kind), Float32,
            atom_layout_mnk=(1, 1, 1), tiler_mn=(64, N),
            a_source=warpgroup.OperandSource.RMEM if const_expr(rs) else warpgroup.OperandSource.SMEM)
        sA_layout = _layout(a_kind, 64, KT, WGS)
        sB_layout = _layout(b_kind, N, KT)
        smem = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) * 2 + 2048
        kernel(stamps, sink, nwg, iters, tiled_mma, sA_layout, sB_layout).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], smem=smem, stream=stream)

    return host


def wgmma_fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (STAMPS,)), fake_tensor(Float32, (THREADS,)), Int32(1), Int32(10), fake_stream())


# ----------------------------------------------------------------------------- bulk reduce-add
@dsl_user_op
def bulk_reduce_add_f32(gmem_ptr, saddr, nbytes, *, loc=None, ip=None):
    """gmem[0:nbytes] += smem[saddr:saddr+nbytes] (fp32): one asynchronous bulk reduction."""
    _asm(None, [gmem_ptr.llvm_ptr, Int32(saddr).ir_value(), Int32(nbytes).ir_value()],
         "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;", "l,r,r")


@dsl_user_op
def bulk_commit(*, loc=None, ip=None):
    _asm(None, [], "cp.async.bulk.commit_group;", "")


@dsl_user_op
def bulk_wait_read(n: int, *, loc=None, ip=None):
    """Until at most n bulk groups of this thread still read their shared-memory source."""
    _asm(None, [], f"cp.async.bulk.wait_group.read {n};", "")


@dsl_user_op
def bulk_wait(n: int, *, loc=None, ip=None):
    """Until at most n bulk groups of this thread are incomplete (their writes performed)."""
    _asm(None, [], f"cp.async.bulk.wait_group {n};", "")


@dsl_user_op
def bulk_load(gmem_ptr, saddr, mbar_addr, nbytes, *, loc=None, ip=None):
    """smem[saddr:saddr+nbytes] = gmem[0:nbytes]: one bulk copy (no tensor map), its bytes
    completing on the mbarrier at mbar_addr (the same L2 path as a TMA tile load)."""
    _asm(None, [gmem_ptr.llvm_ptr, Int32(saddr).ir_value(), Int32(mbar_addr).ir_value(), Int32(nbytes).ir_value()],
         "cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes [$1], [$0], $3, [$2];", "l,r,r,r")


@dsl_user_op
def lds_volatile(addr, *, loc=None, ip=None):
    return Int32(_asm(T.i32(), [Int32(addr).ir_value()], "ld.volatile.shared.u32 $0, [$1];", "=r,r"))


@dsl_user_op
def sts_volatile(addr, val, *, loc=None, ip=None):
    _asm(None, [Int32(addr).ir_value(), Int32(val).ir_value()], "st.volatile.shared.u32 [$0], $1;", "r,r")


def make_bulk(random_data: bool = False):
    """random_data: the fp32 source buffer holds pseudo-random words (random sign and mantissa,
    exponent 2^-20 .. 2^-13: sums stay finite) instead of a few repeated small values; a power
    measurement moves data that toggles as a backward's does (bench_mem_power.py)."""

    @cute.kernel
    def kernel(dst: cute.Tensor, src: cute.Tensor, stamps: cute.Tensor, mode: Int32, n: Int32, chunk: Int32,
               region: Int32, stagger: Int32, mask: Int32, n_load: Int32):
        tid = cute.arch.thread_idx()[0]
        bid = cute.arch.block_idx()[0]

        @cute.struct
        class Storage:
            mbar: cute.struct.MemRange[Int64, LOAD_STAGES]
            flag: cute.struct.MemRange[Int32, 4]
            buf: cute.struct.Align[cute.struct.MemRange[Float32, BULK_MAX // 4], 128]
            ring: cute.struct.Align[cute.struct.MemRange[Float32, LOAD_STAGES * LOAD_BYTES // 4], 128]

        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        sbuf = storage.buf.get_tensor(cute.make_layout(BULK_MAX // 4))
        for i in cutlass.range(BULK_MAX // 4 // 32, unroll=1):
            sbuf[i * 32 + tid] = Float32(1.0e-6) * Float32(((i * 32 + tid) % 13) + 1)
        if const_expr(random_data):
            base = smem_addr(storage.buf.data_ptr())
            for i in cutlass.range(BULK_MAX // 4 // 32, unroll=1):
                w = i * 32 + tid
                u = (w + bid * 7919) * 1103515245 + 12345
                sts32(base + w * 4, (u & Int32(-2139095041)) | ((107 + ((u >> 23) & 7)) << 23))  # 0x807FFFFF
        bars = storage.mbar.data_ptr()
        flag_addr = smem_addr(storage.flag.data_ptr())
        if tid == 0:
            for st in cutlass.range_constexpr(LOAD_STAGES):
                cute.arch.mbarrier_init(bars + st, 1)
            sts_volatile(flag_addr, 0)
        cute.arch.mbarrier_init_fence()
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()
        saddr = smem_addr(storage.buf.data_ptr())
        ring = smem_addr(storage.ring.data_ptr())
        if tid == 32:
            # warp 1 (modes 2, 3): bulk loads of LOAD_BYTES from an L2-resident 1 MB of `src`
            # through LOAD_STAGES slots, until warp 0's reduce-adds are done (mode 2) or n_load
            if mode >= 2:
                t0 = clk()
                g0 = gtimer()
                for st in cutlass.range_constexpr(LOAD_STAGES):
                    cute.arch.mbarrier_arrive_and_expect_tx(bars + st, LOAD_BYTES)
                    bulk_load(src.iterator + ((bid * LOAD_BYTES * 7 + st * LOAD_BYTES) & LOAD_MASK) // 4,
                              ring + st * LOAD_BYTES, smem_addr(bars + st), LOAD_BYTES)
                i = Int32(LOAD_STAGES)
                go = Int32(1)
                while go != 0:
                    for st in cutlass.range_constexpr(LOAD_STAGES):
                        cute.arch.mbarrier_wait(bars + st, ((i // LOAD_STAGES) - 1) & 1)
                        cute.arch.mbarrier_arrive_and_expect_tx(bars + st, LOAD_BYTES)
                        bulk_load(src.iterator + ((bid * LOAD_BYTES * 7 + (i + st) * LOAD_BYTES) & LOAD_MASK) // 4,
                                  ring + st * LOAD_BYTES, smem_addr(bars + st), LOAD_BYTES)
                    i = i + LOAD_STAGES
                    if mode == 2:
                        if lds_volatile(flag_addr) != 0:
                            go = Int32(0)
                    if i >= n_load:
                        go = Int32(0)
                for st in cutlass.range_constexpr(LOAD_STAGES):
                    cute.arch.mbarrier_wait(bars + st, ((i // LOAD_STAGES) - 1) & 1)
                t1 = clk()
                g1 = gtimer()
                o = 4 * STAMP_CTAS + bid * 4
                stamps[o + 0] = t1 - t0
                stamps[o + 1] = g1 - g0
                stamps[o + 2] = Int64(i) * LOAD_BYTES
        if tid == 0:
            if mode == 3:
                pass
            elif mode == 0:
                # latency: one add at a time; its smem read done, then its completion
                for i in cutlass.range(n, unroll=1):
                    off = (bid * region + ((bid * stagger + i * chunk) & mask)) >> 2
                    t0 = clk()
                    bulk_reduce_add_f32(dst.iterator + off, saddr, chunk)
                    bulk_commit()
                    bulk_wait_read(0)
                    tr = clk()
                    bulk_wait(0)
                    t1 = clk()
                    stamps[2 * i] = tr - t0
                    stamps[2 * i + 1] = t1 - t0
            else:
                t0 = clk()
                g0 = gtimer()
                for i in cutlass.range(n, unroll=1):
                    off = (bid * region + ((bid * stagger + i * chunk) & mask)) >> 2
                    bulk_reduce_add_f32(dst.iterator + off, saddr, chunk)
                    bulk_commit()
                    bulk_wait_read(BULK_DEPTH - 1)
                bulk_wait(0)
                t1 = clk()
                g1 = gtimer()
                sts_volatile(flag_addr, 1)
                stamps[bid * 4 + 0] = t0
                stamps[bid * 4 + 1] = t1
                stamps[bid * 4 + 2] = g0
                stamps[bid * 4 + 3] = g1

    @cute.jit
    def host(dst: cute.Tensor, src: cute.Tensor, stamps: cute.Tensor, mode: Int32, n: Int32, chunk: Int32,
             region: Int32, stagger: Int32, mask: Int32, n_load: Int32, ctas: Int32, stream):
        kernel(dst, src, stamps, mode, n, chunk, region, stagger, mask, n_load).launch(
            grid=[ctas, 1, 1], block=[64, 1, 1], smem=BULK_MAX + LOAD_STAGES * LOAD_BYTES + 2048, stream=stream)

    return host


def bulk_fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Float32, (1 << 24,)), fake_tensor(Float32, (1 << 21,)), fake_tensor(Int64, (STAMPS,)),
            Int32(1), Int32(16), Int32(16384), Int32(0), Int32(0), Int32((1 << 20) - 1), Int32(64), Int32(1),
            fake_stream())


# ----------------------------------------------------------------------------- RED from registers
@dsl_user_op
def red_add(ptr, a, b, width: int, *, loc=None, ip=None):
    """*ptr += a (width 1: red.global.add.f32) or (a, b) (width 2: .v2.f32, 8-byte aligned)."""
    if width == 1:
        val = Float32(a).ir_value(loc=loc, ip=ip)
    else:
        val = vector.from_elements(ir.VectorType.get([2], Float32.mlir_type),
                                   [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                                   loc=loc, ip=ip)
    cute.arch.red(ptr, val, op="add", dtype=Float32, sem="relaxed", scope="gpu", loc=loc, ip=ip)


@dsl_user_op
def fence_gpu(*, loc=None, ip=None):
    _asm(None, [], "fence.acq_rel.gpu;", "")


def make_red(width: int, random_data: bool = False):
    """random_data: each of the RED_UNROLL adds of a trip carries its own pseudo-random values
    (random sign and mantissa, |x| < 2^-9) instead of one small value per thread."""

    @cute.kernel
    def kernel(dst: cute.Tensor, stamps: cute.Tensor, n: Int32, region: Int32, stagger: Int32, mask: Int32):
        tid = cute.arch.thread_idx()[0]
        bid = cute.arch.block_idx()[0]
        a = Float32(1.0e-6) * Float32(tid % 7 + 1)
        b = a * Float32(0.5)
        va, vb = [], []
        for u in cutlass.range_constexpr(RED_UNROLL if random_data else 0):
            h = (tid * 40503 + bid * 7919 + u * 2654435) * 1103515245 + 12345
            va.append(Float32(h) * Float32(2.0 ** -40))
            vb.append(Float32(h * 69069 + 1) * Float32(2.0 ** -40))
        cute.arch.sync_threads()
        t0 = clk()
        g0 = gtimer()
        for i in cutlass.range(n, unroll=1):
            for u in cutlass.range_constexpr(RED_UNROLL):
                # words: a warp's lanes on consecutive words (width 2: consecutive pairs)
                off = (bid * region + ((bid * stagger + ((i * RED_UNROLL + u) * THREADS + tid) * (4 * width)) & mask)) >> 2
                if const_expr(random_data):
                    red_add((dst.iterator + off).llvm_ptr, va[u], vb[u], width)
                else:
                    red_add((dst.iterator + off).llvm_ptr, a, b, width)
        fence_gpu()
        cute.arch.sync_threads()
        t1 = clk()
        g1 = gtimer()
        if tid == 0:
            stamps[bid * 4 + 0] = t0
            stamps[bid * 4 + 1] = t1
            stamps[bid * 4 + 2] = g0
            stamps[bid * 4 + 3] = g1

    @cute.jit
    def host(dst: cute.Tensor, stamps: cute.Tensor, n: Int32, region: Int32, stagger: Int32, mask: Int32, ctas: Int32,
             stream):
        kernel(dst, stamps, n, region, stagger, mask).launch(grid=[ctas, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return host


def red_fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Float32, (1 << 24,)), fake_tensor(Int64, (STAMPS,)), Int32(16), Int32(0), Int32(0),
            Int32((1 << 20) - 1), Int32(1), fake_stream())


# ----------------------------------------------------------------------------- CPU check
def sass_cases(quick: bool = False):
    """(name, build, {opcode: least count}) for every kernel this script runs."""
    for form in (QUICK_FORMS if quick else FORMS):
        yield (f"wgmma_{form}", lambda f=form: (make_wgmma(f), wgmma_fake_args()), {sass_opcode(form): KB, "STL": 0})
    yield ("bulk_reduce", lambda: (make_bulk(), bulk_fake_args()), {"UBLKRED": 2, "UBLKCP.S.G": LOAD_STAGES})
    yield ("red_f32", lambda: (make_red(1), red_fake_args()), {"REDG.E.ADD.F32.FTZ.RN.STRONG.GPU": RED_UNROLL})
    yield ("red_f32x2", lambda: (make_red(2), red_fake_args()), {"REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU": RED_UNROLL})


def check_sass(quick: bool = False) -> int:
    return run_sass_checks(sass_cases(quick), width=24)


# ----------------------------------------------------------------------------- GPU runs
def _ghz(t0, t1, g0, g1):
    return (t1 - t0) / (g1 - g0) if g1 > g0 else None


def run_wgmma(dev, forms, iters):
    from .common import median

    torch = dev.torch
    out = {}
    for form in forms:
        N, src, a_kind, b_kind, what = FORMS[form]
        fn = make_wgmma(form)
        stamps = torch.zeros(STAMPS, dtype=torch.int64, device="cuda")
        sink = torch.zeros(THREADS, dtype=torch.float32, device="cuda")
        ob = operand_bytes(form)
        res = {"N": N, "shape": f"m64n{N}k16", "a_source": src, "a_smem": a_kind if src == "SS" else None,
               "b_smem": b_kind, "what": what, "smem_bytes_per_instr": ob["a"] + ob["b"],
               "tensor_cycles_per_instr_ideal": N / 2, "throughput": {}}
        for nwg in (1, WGS):
            samples = []
            for rep in range(3):
                dev.call(("bwdu_wgmma", form), fn, stamps, sink, Int32(nwg), Int32(iters))
                st = stamps.cpu().tolist()
                rows = [st[w * 4: w * 4 + 4] for w in range(nwg)]
                cyc = max(r[1] for r in rows) - min(r[0] for r in rows)
                ns = max(r[3] for r in rows) - min(r[2] for r in rows)
                if rep:
                    samples.append((cyc, ns))
            cyc, ns = min(samples)
            n_instr = nwg * iters * KB
            cpi = cyc / n_instr
            res["throughput"][str(nwg)] = dict(
                cycles=cyc, ns=ns, clock_ghz=cyc / ns if ns else None, instructions=n_instr,
                cycles_per_instr=cpi, flops_per_clk=2 * 64 * N * 16 / cpi,
                smem_bytes_per_clk=(ob["a"] + ob["b"]) / cpi,
                vs_ideal=cpi / (N / 2), samples_cycles=[s[0] for s in samples],
                sink_finite=bool(torch.isfinite(sink).all().item()))
        out[form] = res
        t2 = res["throughput"][str(WGS)]
        print(f"[wgmma] {form:18s} {t2['cycles_per_instr']:6.2f} cyc/instr (ideal {N / 2:5.1f}), "
              f"{t2['smem_bytes_per_clk']:6.1f} smem B/clk", flush=True)
    _ = median
    return out


def run_bulk(dev, quick):
    from .common import median

    torch = dev.torch
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    dst = torch.zeros(1 << 24, dtype=torch.float32, device="cuda")  # 64 MB
    src = torch.ones(1 << 21, dtype=torch.float32, device="cuda")   # 8 MB; the loads stay in its first 1 MB
    stamps = torch.zeros(STAMPS, dtype=torch.int64, device="cuda")
    fn = make_bulk()
    out = {"instruction": "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 (SASS UBLKRED)",
           "depth": BULK_DEPTH, "latency": {}, "rate": {}}

    def call(mode, n, chunk, region, stagger, mask, ctas, n_load=0):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dev.call("bwdu_bulk", fn, dst, src, stamps, Int32(mode), Int32(n), Int32(chunk), Int32(region),
                 Int32(stagger), Int32(mask), Int32(n_load), Int32(ctas))
        e1.record()
        torch.cuda.synchronize()
        return stamps.cpu().tolist(), e0.elapsed_time(e1)

    # latency of one add (L2-resident 1 MB region), by size
    for chunk in (4096, 16384, 32768):
        call(0, 32, chunk, 0, 0, (1 << 20) - 1, 1)
        st, _ = call(0, 32, chunk, 0, 0, (1 << 20) - 1, 1)
        rd = [st[2 * i] for i in range(2, 32)]
        done = [st[2 * i + 1] for i in range(2, 32)]
        out["latency"][str(chunk)] = dict(bytes=chunk, smem_read_median=median(rd), complete_median=median(done),
                                          complete_min=min(done))

    target = 64 << 20 if not quick else 24 << 20  # bytes added per SM-run
    # name, ctas, chunk, region (bytes: CTA b adds within b * region + [0, mask]), stagger (bytes:
    # CTA b starts b * stagger into it), mask (bytes - 1). disjoint: 128 KB of its own per CTA
    # (17 MB in all, L2-resident); shared: one 1 MB region, CTAs staggered by a chunk; same: every
    # CTA adds into the same chunk (flash-attn-4: the KV tiles of a head on one dQ block)
    configs = [
        ("one_sm_32KB", 1, 32768, 0, 0, (1 << 20) - 1),
        ("one_sm_16KB", 1, 16384, 0, 0, (1 << 20) - 1),
        ("one_sm_4KB", 1, 4096, 0, 0, (1 << 20) - 1),
        ("all_sms_disjoint_32KB", nsm, 32768, 1 << 17, 0, (1 << 17) - 1),
        ("all_sms_shared_1MB_32KB", nsm, 32768, 0, 32768, (1 << 20) - 1),
        ("all_sms_same_32KB", nsm, 32768, 0, 0, 32767),
        ("all_sms_same_16KB", nsm, 16384, 0, 0, 16383),
    ]
    if quick:
        configs = [c for c in configs if c[0] not in ("one_sm_16KB", "all_sms_same_16KB")]
    for name, ctas, chunk, region, stagger, mask in configs:
        n = max(64, (target if ctas == 1 else target // 8) // chunk)
        call(1, 16, chunk, region, stagger, mask, ctas)  # warm: L2 lines, the launch
        st, ev_ms = call(1, n, chunk, region, stagger, mask, ctas)
        rows = [st[b * 4: b * 4 + 4] for b in range(ctas)]
        per_sm = [n * chunk / max(1, r[1] - r[0]) for r in rows]
        ghz = [g for g in (_ghz(*r) for r in rows) if g]
        span_ns = max(r[3] for r in rows) - min(r[2] for r in rows)
        clock = median(ghz) if ghz else None
        chip_b_per_ns = ctas * n * chunk / span_ns if span_ns else None
        out["rate"][name] = dict(
            ctas=ctas, chunk_bytes=chunk, adds_per_cta=n, region_stride_bytes=region, stagger_bytes=stagger,
            region_bytes=mask + 1,
            per_sm_bytes_per_clk_median=median(per_sm), per_sm_bytes_per_clk_min=min(per_sm),
            chip_bytes_per_ns=chip_b_per_ns,
            chip_bytes_per_clk=chip_b_per_ns / clock if (chip_b_per_ns and clock) else None,
            clock_ghz=clock, event_ms=ev_ms)
        r = out["rate"][name]
        print(f"[bulk] {name:26s} {r['per_sm_bytes_per_clk_median']:7.2f} B/clk per SM, chip "
              f"{(r['chip_bytes_per_clk'] or 0):8.1f} B/clk at {clock or 0:.2f} GHz", flush=True)

    # Do reduce-adds and loads share the L2's rate? Warp 1 of each CTA streams 16 KB bulk loads
    # (L2 hits) alone (mode 3), then beside warp 0's reduce-adds (mode 2, the disjoint config):
    # each one's bytes per SM clock, alone and together.
    out["with_loads"] = {"load_bytes": LOAD_BYTES, "load_stages": LOAD_STAGES,
                         "what": "warp 1 of each CTA: cp.async.bulk global->shared (UBLKCP) of 16 KB, 4 in flight, "
                                 "L2 hits, beside (mode 2) or without (mode 3) warp 0's reduce-adds"}
    n_red = max(64, (target // 8) // 32768)
    for name, ctas in (("one_sm", 1), ("all_sms", nsm)):
        n_l = (n_red * 32768 * (4 if ctas == 1 else 5)) // LOAD_BYTES
        res = {}
        for mode, tag in ((3, "loads_alone"), (2, "together")):
            call(mode, 16, 32768, 1 << 17, 0, (1 << 17) - 1, ctas, 64)
            st, ev_ms = call(mode, n_red, 32768, 1 << 17, 0, (1 << 17) - 1, ctas, n_l)
            lrows = [st[4 * STAMP_CTAS + b * 4: 4 * STAMP_CTAS + b * 4 + 3] for b in range(ctas)]
            lrate = [r[2] / max(1, r[0]) for r in lrows]
            lghz = median([r[0] / r[1] for r in lrows if r[1] > 0])
            entry = {"load_per_sm_bytes_per_clk_median": median(lrate), "load_clock_ghz": lghz,
                     "load_chip_bytes_per_ns": sum(r[2] for r in lrows) / max(r[1] for r in lrows),
                     "event_ms": ev_ms}
            if mode == 2:
                rows = [st[b * 4: b * 4 + 4] for b in range(ctas)]
                entry["reduce_per_sm_bytes_per_clk_median"] = median([n_red * 32768 / max(1, r[1] - r[0]) for r in rows])
                span = max(r[3] for r in rows) - min(r[2] for r in rows)
                entry["reduce_chip_bytes_per_ns"] = ctas * n_red * 32768 / span if span else None
            res[tag] = entry
        out["with_loads"][name] = res
        t = res["together"]
        print(f"[bulk] {name} loads alone {res['loads_alone']['load_per_sm_bytes_per_clk_median']:6.1f} B/clk/SM; "
              f"together: loads {t['load_per_sm_bytes_per_clk_median']:6.1f}, reduce-adds "
              f"{t['reduce_per_sm_bytes_per_clk_median']:6.2f} B/clk/SM", flush=True)
    del dst, src
    return out


def run_red(dev, quick):
    from .common import median

    torch = dev.torch
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    dst = torch.zeros(1 << 24, dtype=torch.float32, device="cuda")
    stamps = torch.zeros(STAMPS, dtype=torch.int64, device="cuda")
    out = {}
    for width in (1, 2):
        fn = make_red(width)
        name_w = "f32" if width == 1 else "f32x2"
        res = {"instruction": f"red.relaxed.gpu.global.add{'' if width == 1 else '.v2'}.f32 "
                              f"(SASS REDG.E.ADD.F32{'' if width == 1 else 'x2'})",
               "threads_per_cta": THREADS, "bytes_per_warp_instr": 128 * width, "rate": {}}
        configs = [("one_sm", 1, 0, 0, (1 << 20) - 1), ("all_sms_disjoint", nsm, 1 << 17, 0, (1 << 17) - 1),
                   ("all_sms_shared_1MB", nsm, 0, 32768, (1 << 20) - 1), ("all_sms_same_32KB", nsm, 0, 0, 32767)]
        for cname, ctas, region, stagger, mask in configs:
            per_trip = RED_UNROLL * THREADS * 4 * width
            n = max(16, ((32 << 20) if ctas == 1 else (4 << 20)) // per_trip // (2 if quick else 1))
            key = ("bwdu_red", width)
            dev.call(key, fn, dst, stamps, Int32(16), Int32(region), Int32(stagger), Int32(mask), Int32(ctas))
            dev.call(key, fn, dst, stamps, Int32(n), Int32(region), Int32(stagger), Int32(mask), Int32(ctas))
            st = stamps.cpu().tolist()
            rows = [st[b * 4: b * 4 + 4] for b in range(ctas)]
            per_sm = [n * per_trip / max(1, r[1] - r[0]) for r in rows]
            ghz = [g for g in (_ghz(*r) for r in rows) if g]
            span_ns = max(r[3] for r in rows) - min(r[2] for r in rows)
            clock = median(ghz) if ghz else None
            chip = ctas * n * per_trip / span_ns if span_ns else None
            warp_instr = n * RED_UNROLL * THREADS / 32
            res["rate"][cname] = dict(
                ctas=ctas, bytes_per_cta=n * per_trip, region_bytes=mask + 1,
                per_sm_bytes_per_clk_median=median(per_sm),
                per_sm_warp_instr_per_clk=median([warp_instr / max(1, r[1] - r[0]) for r in rows]),
                chip_bytes_per_ns=chip, chip_bytes_per_clk=chip / clock if (chip and clock) else None,
                clock_ghz=clock)
            r = res["rate"][cname]
            print(f"[red] {name_w:6s} {cname:18s} {r['per_sm_bytes_per_clk_median']:7.2f} B/clk per SM "
                  f"({r['per_sm_warp_instr_per_clk']:.3f} warp instr/clk), chip {(r['chip_bytes_per_clk'] or 0):8.1f} "
                  f"B/clk", flush=True)
        out[name_w] = res
    del dst
    return out


def main(argv=None) -> int:
    import argparse
    import json
    import time

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results JSON (GPU run)")
    ap.add_argument("--quick", action="store_true", help="fewer operand forms and shorter loops")
    ap.add_argument("--check-sass", action="store_true", help="CPU: compile for sm_90a and check the SASS")
    ap.add_argument("--only", default="wgmma,bulk,red", help="comma-separated from wgmma, bulk, red")
    args = ap.parse_args(argv)
    only = [o for o in args.only.split(",") if o]
    if not only or set(only) - {"wgmma", "bulk", "red"}:
        ap.error(f"--only: {args.only!r}; allowed: comma-separated wgmma, bulk, red")
    if args.check_sass:
        return check_sass(args.quick)
    if not args.out:
        ap.error("--out FILE.json (GPU) or --check-sass (CPU)")
    from .common import Device

    from .run_all import meta

    t0 = time.perf_counter()
    dev = Device()
    res = {"meta": meta("bwd_units"), "scripts": {"bwd_units": "bench_bwd_units.py"}, "benchmarks": {},
           "errors": {}, "quick": args.quick}
    steps = {"wgmma": lambda: run_wgmma(dev, QUICK_FORMS if args.quick else tuple(FORMS), 500 if args.quick else 2000),
             "bulk": lambda: run_bulk(dev, args.quick), "red": lambda: run_red(dev, args.quick)}
    for name in only:
        t = time.perf_counter()
        try:
            res["benchmarks"][name] = steps[name]()
        except Exception as e:  # noqa: BLE001 - one failure keeps the others' numbers
            import traceback

            res["errors"][name] = traceback.format_exc()
            print(f"[{name}] FAILED: {e}", flush=True)
        res.setdefault("step_seconds", {})[name] = round(time.perf_counter() - t, 2)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    res["compile_seconds"] = {str(k): round(v, 2) for k, v in dev.compile_s.items()}
    res["seconds"] = round(time.perf_counter() - t0, 2)
    res["meta"]["nvidia_smi_end"] = _smi_clock()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"[bwd_units] {res['seconds']} s -> {args.out}", flush=True)
    return 1 if res["errors"] else 0


def _smi_clock():
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"error {e}"


if __name__ == "__main__":
    sys.exit(main())
