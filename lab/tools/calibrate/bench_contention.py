"""Tensor core vs softmax-type instructions on the same SM: does wgmma slow down (and do FFMA /
MUFU.EX2 slow down) when both run at once on the same sub-partitions?

Hopper keeps the wgmma accumulator in the register file, so FA3's consumer warpgroups run their
softmax (FMNMX, FFMA, MUFU.EX2, FADD, FMUL, F2FP) on the same SM sub-partitions (SMSPs) that feed
the tensor core. This file measures that interaction at the unit level, nothing attention-specific.

Kernel "roles" (512 threads = 4 warpgroups, one CTA, 1 per SM; wgmma m64n128k16 bf16 -> fp32,
A from smem (SS) or from registers (RS), compile-time):
  warpgroups 0 .. W-1 (W = 0, 1, 2): `iters` trips of
        fence; 8 x wgmma chained into one accumulator (K = 128); commit; wait_group(1)
     (back to back, one group in flight behind the issue; `wait_depth` 0 -> wait_group(0), the
      FA3 shape where the result is needed at once), then wait_group(0); stamp; red.shared.add
      on a done flag.
  warpgroups 2 .. 1+F (F = 0, 1, 2; F = 3 takes warpgroups 1 .. 3, beside at most one wgmma
  warpgroup: three warps per scheduler): a loop of `kind`
     0 ffma: 32 independent chains x 4 steps of FFMA (128 FFMA per trip)
     1 ex2 : 32 independent chains x 2 steps of MUFU.EX2 of -x (64 MUFU per trip; x -> 2^-x)
     2 mix : FA3-softmax-like, per trip 32 elements x[j]:
             m_k = max(m_k, x_j) (4 partial maxima)            32 + 3 FMNMX
             nm = -log2e * max(m)                               1 FMUL
             y = x_j * log2e + nm                               32 FFMA
             p = ex2(y)                                         32 MUFU.EX2
             l_k = l_k + p (4 partial sums)                     32 FADD
             pk = cvt.rn.bf16x2(p_2i, p_2i+1)                   16 F2FP.BF16.F32.PACK_AB
             x_2i = pk(as f32) * c, x_2i+1 = p_2i+1 * c         32 FMUL
             (every result feeds the next trip, so nothing is dead; values stay in (0, 4])
     polling the done flag once per trip (ld.volatile.shared), so they run exactly as long as the
     wgmma warpgroups (until all W are done); with W = 0 they run `max_trips` trips alone.
  Every warp's lane 0 stamps clock64 (and %globaltimer) around its loop; softmax warps also
  write their trip count. grid = 1 (per-SM numbers) or all SMs for ~1 s (the clock under the
  combined load, clock64 vs %globaltimer).

Kernel "intra" (128 x the most warpgroups run: 256 threads for 1-2, 384 for 3, as FA3 at hd64
  with a 192-row tile; FA3's intra-warpgroup overlap): warpgroups 0 .. nwg-1
  each loop `iters` trips of
        [fence; 8 x wgmma; commit]   (if do_mma)
        nb blocks of the mix above (32 elements each, ~180 instructions)
        [wait_group(0)]              (if do_mma)
  -> cycles per trip with both, with the wgmma alone (nb = 0) and with the softmax alone
     (do_mma = 0): how much of the softmax hides behind its own wgmmas.
  --pingpong: warpgroup w waits on named barrier PP_BAR + w before its fence and arrives on the
     next warpgroup's after its commit (warpgroup 0 goes first), so the GEMMs issue in turn, as
     fa4kernel's consumer warpgroups with pingpong=True.

Results go to a sink (every accumulator and every softmax state summed), so nothing is eliminated.
CPU check:  CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_contention --check-sass
GPU:        python3 lab/tools/calibrate/bench_contention.py --out FILE.json   (or run_all --only contention)
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
from cutlass._mlir.dialects import llvm  # noqa: E402,F401
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

from fa4kernel.sass import loop_bodies  # noqa: E402

from .bench_wgmma import _smem_layout  # noqa: E402
from .common import _asm, clk, compile_for_sass, ex2, f2bf16x2, ffma, fill_random_bf16, fmax, gtimer, median, smem_addr, sts32  # noqa: E402

N = 128          # wgmma m64n128k16 (FA3 hdim 128: QK^T is 64 x 128 per warpgroup, PV 64 x 128)
KT = 128         # K of the smem tile: 8 k16 steps per group
KB = KT // 16
E = 32           # softmax elements per trip per thread
MAX_STAMP_WARPS = 16
PP_BAR = 2       # the intra kernel's ping-pong barriers: PP_BAR + w, "warpgroup w may issue its GEMM"
SLOTS = 8  # int64 stamps per warp: t0, t1, globaltimer0, globaltimer1, trips
LOG2E = 1.4426950408889634
KINDS = {"ffma": 0, "ex2": 1, "mix": 2}
# per-thread instructions per trip, by SASS opcode (loop overhead not counted: ~5 per trip)
PER_TRIP = {
    "ffma": {"FFMA": 4 * E},
    "ex2": {"MUFU.EX2": 2 * E},
    "mix": {"FMNMX": E + 3, "FFMA": E, "MUFU.EX2": E, "FADD": E, "FMUL": E + 1, "F2FP": E // 2},
}
# SASS loop-body length per trip (check_sass, cutlass-dsl 4.8.1): the counted instructions + 5 of
# loop overhead (LDS of the flag, IADD3, 2 ISETP, BRA); used for the issue rate
LOOP_BODY = {"ffma": 4 * E + 5, "ex2": 2 * E + 5, "mix": 6 * E - E // 2 + 4 + 5}
# minimum count of each opcode expected in the SASS of the roles kernel (= the loop bodies;
# the epilogue adds a few FADDs)
SASS_ROLES = {"HGMMA.64x128x16.F32.BF16": KB, "FFMA": 4 * E + E, "MUFU.EX2": 2 * E + E, "FMNMX": E + 3,
              "F2FP.BF16.F32.PACK_AB": E // 2, "FMUL": E + 1, "FADD": E, "STL": 0}
SASS_INTRA = {"HGMMA.64x128x16.F32.BF16": KB, "FFMA": E, "MUFU.EX2": E, "FMNMX": E + 3,
              "F2FP.BF16.F32.PACK_AB": E // 2, "STL": 0}


# ----------------------------------------------------------------------------- inline PTX
@dsl_user_op
def ex2_neg(x, *, loc=None, ip=None):
    """2^-x: MUFU.EX2 with a negated operand (keeps an iterated chain bounded in (0, 1])."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value()],
                        "{\n.reg .f32 t;\nneg.f32 t, $1;\nex2.approx.ftz.f32 $0, t;\n}", "=f,f"))


@dsl_user_op
def fadd(x, y, *, loc=None, ip=None):
    """add.rn.f32 (FADD; .rn forbids contraction into FFMA)."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(), Float32(y).ir_value()], "add.rn.f32 $0, $1, $2;", "=f,f,f"))


@dsl_user_op
def fmul(x, y, *, loc=None, ip=None):
    """mul.rn.f32 (FMUL; .rn forbids contraction into FFMA)."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(), Float32(y).ir_value()], "mul.rn.f32 $0, $1, $2;", "=f,f,f"))


@dsl_user_op
def lds_volatile(addr, *, loc=None, ip=None):
    return Int32(_asm(T.i32(), [Int32(addr).ir_value()], "ld.volatile.shared.u32 $0, [$1];", "=r,r"))


@dsl_user_op
def red_add_shared(addr, val, *, loc=None, ip=None):
    _asm(None, [Int32(addr).ir_value(), Int32(val).ir_value()], "red.shared.add.u32 [$0], $1;", "r,r")


# ----------------------------------------------------------------------------- shared pieces
def _tiled_mma(rs, n=N):
    return sm90_helpers.make_trivial_tiled_mma(
        BFloat16, BFloat16, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
        atom_layout_mnk=(1, 1, 1), tiler_mn=(64, n),
        a_source=warpgroup.OperandSource.RMEM if const_expr(rs) else warpgroup.OperandSource.SMEM)


def make_roles(rs: bool):
    threads = 512

    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, nwg: Int32, nsf: Int32, kind: Int32, iters: Int32,
               max_trips: Int32, wait_depth: Int32,
               tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout):
        tid = cute.arch.thread_idx()[0]
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        wtid = tid % 128
        lane = tid % 32
        bid = cute.arch.block_idx()[0]

        @cute.struct
        class Storage:
            flag: cute.struct.MemRange[Int32, 4]
            sA: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sB_layout)], 1024]

        alloc = cutlass.utils.SmemAllocator()
        storage = alloc.allocate(Storage)
        flag_addr = smem_addr(storage.flag.data_ptr())
        # pseudo-random bf16 operands, as in bench_wgmma
        base = smem_addr(storage.sA.data_ptr())
        base_b = smem_addr(storage.sB.data_ptr())
        nwords = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) // 2
        a_words = cute.cosize(sA_layout) // 2
        fill_random_bf16(base, a_words, base_b, nwords, tid, threads, bid * 7919)
        if tid == 0:
            sts32(flag_addr, 0)
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        thr_mma = tiled_mma.get_slice(wtid)
        wg_mma = tiled_mma.get_slice(0)
        tCsA = wg_mma.partition_A(sA[None, None, wg % 2])
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
        total = Float32(0.0)
        t0 = Int64(0)
        t1 = Int64(0)
        g0 = Int64(0)
        g1 = Int64(0)
        trips = Int32(0)
        # softmax warpgroups: 2 .. 1 + nsf; three of them take warpgroups 1 .. 3 (beside at most one
        # wgmma warpgroup), so that three warps of the mix share each scheduler
        sf_first = Int32(2)
        if nsf > 2:
            sf_first = 4 - nsf
        if wg < nwg:
            # tensor-core role
            t0 = clk()
            g0 = gtimer()
            for _ in cutlass.range(iters, unroll=1):
                warpgroup.fence()
                for k in cutlass.range_constexpr(KB):
                    cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
                warpgroup.commit_group()
                if wait_depth == 0:
                    warpgroup.wait_group(0)
                else:
                    warpgroup.wait_group(1)
            warpgroup.wait_group(0)
            t1 = clk()
            g1 = gtimer()
            if wtid == 0:
                red_add_shared(flag_addr, 1)
            for i in cutlass.range_constexpr(cute.size(acc)):
                total = total + acc[i]
        elif wg - sf_first < nsf:
            if wg >= sf_first:
                # -------------------------------------------------------- softmax-type role
                target = cutlass.max(nwg, 1)  # W = 0: the flag never moves, max_trips ends the loop
                a = Float32(0.999)
                b = Float32(0.001)
                sc = Float32(LOG2E)
                nsc = Float32(-LOG2E)
                c = Float32(4.0)
                x = [Float32(wtid) * Float32(1e-3) + Float32(0.01 * j + 0.05) for j in range(E)]
                m = [Float32(0.0) for _ in range(4)]
                lsum = [Float32(0.0) for _ in range(4)]
                go = Int32(1)
                t0 = clk()
                g0 = gtimer()
                if kind == 0:
                    while go != 0:
                        f = lds_volatile(flag_addr)
                        for _u in cutlass.range_constexpr(4):
                            for j in cutlass.range_constexpr(E):
                                x[j] = ffma(x[j], a, b)
                        trips = trips + 1
                        if f >= target:
                            go = Int32(0)
                        if trips >= max_trips:
                            go = Int32(0)
                elif kind == 1:
                    while go != 0:
                        f = lds_volatile(flag_addr)
                        for _u in cutlass.range_constexpr(2):
                            for j in cutlass.range_constexpr(E):
                                x[j] = ex2_neg(x[j])
                        trips = trips + 1
                        if f >= target:
                            go = Int32(0)
                        if trips >= max_trips:
                            go = Int32(0)
                else:
                    while go != 0:
                        f = lds_volatile(flag_addr)
                        x, m, lsum = _mix_block(x, m, lsum, sc, nsc, c)
                        trips = trips + 1
                        if f >= target:
                            go = Int32(0)
                        if trips >= max_trips:
                            go = Int32(0)
                t1 = clk()
                g1 = gtimer()
                for j in cutlass.range_constexpr(E):
                    total = total + x[j]
                for k in cutlass.range_constexpr(4):
                    total = total + m[k] + lsum[k]
        if lane == 0:
            o = (bid * MAX_STAMP_WARPS + warp) * SLOTS
            stamps[o + 0] = t0
            stamps[o + 1] = t1
            stamps[o + 2] = g0
            stamps[o + 3] = g1
            stamps[o + 4] = Int64(trips)
        sink[bid * threads + tid] = total

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, nwg: Int32, nsf: Int32, kind: Int32, iters: Int32,
             max_trips: Int32, wait_depth: Int32, ctas: Int32, stream):
        tiled_mma = _tiled_mma(rs)
        sA_layout = _smem_layout(BFloat16, 64, KT, 2)
        sB_layout = _smem_layout(BFloat16, N, KT)
        smem = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) * 2 + 3072
        kernel(stamps, sink, nwg, nsf, kind, iters, max_trips, wait_depth, tiled_mma, sA_layout, sB_layout).launch(
            grid=[ctas, 1, 1], block=[threads, 1, 1], smem=smem, stream=stream)

    return host


def _mix_block(x, m, lsum, sc, nsc, c, emulated=()):
    """One FA3-softmax-like pass over the E elements of x (Python-level: unrolled at trace time);
    returns the new (x, m, lsum). Per element 1 FMNMX + 1 FFMA + 1 MUFU.EX2 + 1 FADD + 1 FMUL +
    0.5 F2FP; per pass 3 FMNMX + 1 FMUL more (combine the partial maxima, scale). The elements
    in `emulated` take fa4kernel's polynomial exp2 (fa4kernel/softmax.py) instead of MUFU.EX2."""
    from fa4kernel.softmax import exp2_emulated

    m = list(m)
    lsum = list(lsum)
    xn = list(x)
    for j in range(E):
        m[j % 4] = fmax(m[j % 4], x[j])
    mm = fmax(fmax(m[0], m[1]), fmax(m[2], m[3]))
    nm = fmul(mm, nsc)
    e2 = lambda j, v: exp2_emulated(v) if j in emulated else ex2(v)
    for i in range(E // 2):
        p0 = e2(2 * i, ffma(x[2 * i], sc, nm))
        p1 = e2(2 * i + 1, ffma(x[2 * i + 1], sc, nm))
        lsum[(2 * i) % 4] = fadd(lsum[(2 * i) % 4], p0)
        lsum[(2 * i + 1) % 4] = fadd(lsum[(2 * i + 1) % 4], p1)
        pk = f2bf16x2(p0, p1)  # hi half = bf16(p0): as an f32 it is ~p0
        xn[2 * i] = fmul(pk, c)
        xn[2 * i + 1] = fmul(p1, c)
    return xn, m, lsum


def make_intra(rs: bool, warpgroups: int = 2):
    """The intra kernel built for up to `warpgroups` warpgroups (2: 256 threads, as recorded for
    one and two; 3: 384 threads, whose register budget is 170 per thread)."""
    threads = 128 * warpgroups
    warps = threads // 32

    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, nwg: Int32, nb: Int32, do_mma: Int32, pp: Int32,
               iters: Int32, tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout,
               sB_layout: cute.ComposedLayout):
        tid = cute.arch.thread_idx()[0]
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        wtid = tid % 128
        lane = tid % 32
        bid = cute.arch.block_idx()[0]

        @cute.struct
        class Storage:
            sA: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sB_layout)], 1024]

        alloc = cutlass.utils.SmemAllocator()
        storage = alloc.allocate(Storage)
        base = smem_addr(storage.sA.data_ptr())
        base_b = smem_addr(storage.sB.data_ptr())
        nwords = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) // 2
        a_words = cute.cosize(sA_layout) // 2
        fill_random_bf16(base, a_words, base_b, nwords, tid, threads, bid * 7919)
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        thr_mma = tiled_mma.get_slice(wtid)
        wg_mma = tiled_mma.get_slice(0)
        tCsA = wg_mma.partition_A(sA[None, None, wg % 2])
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
        sc = Float32(LOG2E)
        nsc = Float32(-LOG2E)
        c = Float32(4.0)
        x = [Float32(wtid) * Float32(1e-3) + Float32(0.01 * j + 0.05) for j in range(E)]
        m = [Float32(0.0) for _ in range(4)]
        lsum = [Float32(0.0) for _ in range(4)]
        t0 = Int64(0)
        t1 = Int64(0)
        in_mix = Int64(0)   # cycles from the trip's start to the mix's end, summed over trips
        in_wait = Int64(0)  # cycles from the mix's end to the wgmma wait's return, summed
        total = Float32(0.0)
        # ping-pong (pp, with do_mma and 2-3 warpgroups): warpgroup w issues its GEMM only after
        # w - 1 has issued its own (named barrier PP_BAR + w, 256 threads), as fa4kernel's consumers
        nxt = wg + 1
        if nxt >= nwg:
            nxt = 0
        ping = pp != 0 and do_mma != 0 and nwg > 1
        if wg < nwg:
            if ping and wg == 0:  # warpgroup 0 goes first
                cute.arch.barrier_arrive(barrier_id=PP_BAR, number_of_threads=256)
            t0 = clk()
            t_trip = t0
            trip = Int32(0)
            for _ in cutlass.range(iters, unroll=1):
                if do_mma != 0:
                    if ping:
                        for w in cutlass.range_constexpr(3):
                            if wg == w:
                                cute.arch.barrier(barrier_id=PP_BAR + w, number_of_threads=256)
                    warpgroup.fence()
                    for k in cutlass.range_constexpr(KB):
                        cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
                    warpgroup.commit_group()
                    if ping:
                        for w in cutlass.range_constexpr(3):
                            if nxt == w:
                                cute.arch.barrier_arrive(barrier_id=PP_BAR + w, number_of_threads=256)
                t_issued = clk()
                for _b in cutlass.range(nb, unroll=1):
                    x, m, lsum = _mix_block(x, m, lsum, sc, nsc, c)
                t_mix = clk()
                if do_mma != 0:
                    warpgroup.wait_group(0)
                t_end = clk()
                in_mix = in_mix + (t_mix - t_trip)
                in_wait = in_wait + (t_end - t_mix)
                # a few trips in full: start, HGMMAs issued, mix done, wait returned
                if lane == 0 and trip >= TRACE_FROM and trip < TRACE_FROM + TRACE_TRIPS:
                    o = TRACE_BASE + ((trip - TRACE_FROM) * warps + warp) * 4
                    stamps[o + 0] = t_trip
                    stamps[o + 1] = t_issued
                    stamps[o + 2] = t_mix
                    stamps[o + 3] = t_end
                t_trip = t_end
                trip = trip + 1
            t1 = clk()
            if ping and wg == 0:  # the last warpgroup's final hand-off
                cute.arch.barrier(barrier_id=PP_BAR, number_of_threads=256)
            for i in cutlass.range_constexpr(cute.size(acc)):
                total = total + acc[i]
            for j in cutlass.range_constexpr(E):
                total = total + x[j]
            for k in cutlass.range_constexpr(4):
                total = total + m[k] + lsum[k]
        if lane == 0:
            o = (bid * MAX_STAMP_WARPS + warp) * SLOTS
            stamps[o + 0] = t0
            stamps[o + 1] = t1
            stamps[o + 5] = in_mix
            stamps[o + 6] = in_wait
        sink[bid * threads + tid] = total

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, nwg: Int32, nb: Int32, do_mma: Int32, pp: Int32,
             iters: Int32, stream):
        tiled_mma = _tiled_mma(rs)
        sA_layout = _smem_layout(BFloat16, 64, KT, 2)
        sB_layout = _smem_layout(BFloat16, N, KT)
        smem = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) * 2 + 2048
        kernel(stamps, sink, nwg, nb, do_mma, pp, iters, tiled_mma, sA_layout, sB_layout).launch(
            grid=[1, 1, 1], block=[threads, 1, 1], smem=smem, stream=stream)

    return host


STAMPS = 132 * MAX_STAMP_WARPS * SLOTS
# the intra kernel's per-trip trace (one CTA: the stamps past its own warps' slots)
TRACE_FROM, TRACE_TRIPS, TRACE_BASE = 100, 16, 1024
SINK = 132 * 512


def fake_args_roles():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (STAMPS,)), fake_tensor(Float32, (SINK,)), Int32(1), Int32(1), Int32(2),
            Int32(10), Int32(10), Int32(1), Int32(1), fake_stream())


INTRA_WGS = (1, 2, 3)  # warpgroup counts the intra kernel runs (--intra-wgs)


def intra_threads(nwg: int) -> int:
    """The build a warpgroup count runs on: 256 threads up to two (the recorded files), else 128 each."""
    return 128 * max(2, nwg)


def fake_args_intra():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (STAMPS,)), fake_tensor(Float32, (SINK,)), Int32(1), Int32(1), Int32(1),
            Int32(1), Int32(10), fake_stream())


# ----------------------------------------------------------------------------- CPU: SASS check


def _count(opcodes, prefix):
    return sum(1 for o in opcodes if o.startswith(prefix))


def check_sass() -> int:
    """Compile the 4 kernels for sm_90a on the CPU; check opcodes, loop bodies and registers."""
    import time

    from .common import sass_count

    bad = 0
    builds = [("roles", lambda rs: make_roles(rs), fake_args_roles, SASS_ROLES, 512)]
    builds += [(f"intra{'' if t == 256 else f' {t} threads'}", lambda rs, t=t: make_intra(rs, t // 128),
                fake_args_intra, SASS_INTRA, t) for t in sorted({intra_threads(n) for n in INTRA_WGS})]
    for kname, make, fake, expect, threads in builds:
        for rs in (False, True):
            t0 = time.time()
            sass, regs = compile_for_sass(make(rs), *fake(), with_registers=True)
            counts = {op: sass_count(sass, op) for op in expect}
            ok = all((counts[op] >= n) if n else counts[op] == 0 for op, n in expect.items())
            ok = ok and bool(regs) and ((regs + 7) // 8 * 8) * threads <= 65536
            # loop bodies: the wgmma loop (8 HGMMA, no DEPBAR between them), the softmax loops
            bodies = []
            for label, ops in loop_bodies(sass):
                c = {k: _count(ops, k) for k in ("HGMMA", "FFMA", "MUFU.EX2", "FMNMX", "FADD", "FMUL", "F2FP",
                                                  "LDS", "WARPGROUP.DEPBAR", "BAR.SYNC")}
                c = {k: v for k, v in c.items() if v}
                if c:
                    bodies.append(f"{label}: {len(ops)} instr {c}")
                if _count(ops, "HGMMA"):
                    # 8 HGMMA per trip; the only wait(s) are the wait_group after the commit
                    ok = ok and _count(ops, "HGMMA") == KB
                elif kname == "roles" and _count(ops, "LDS") == 1:
                    # a softmax-role loop: exactly the planned instructions + LOOP_BODY's overhead
                    kind = "mix" if _count(ops, "FMNMX") else "ex2" if _count(ops, "MUFU") else "ffma"
                    planned = {("F2FP" if k.startswith("F2FP") else k): v for k, v in PER_TRIP[kind].items()}
                    seen = {k: _count(ops, k) for k in planned}
                    if seen != planned or len(ops) != LOOP_BODY[kind]:
                        ok = False
                        bodies.append(f"  ^ {kind}: expected {planned} in {LOOP_BODY[kind]} instructions")
            loops = "\n      ".join(bodies)
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} contention_{kname}_{'rs' if rs else 'ss'} regs={regs} x {threads} threads "
                  f"{counts} ({time.time() - t0:.1f}s)\n      {loops}", flush=True)
    print("all ok" if not bad else f"{bad} FAILED")
    return 1 if bad else 0


# ----------------------------------------------------------------------------- GPU: run
ITERS_MMA = 400                      # 8 wgmma per trip: 3200 wgmma per warpgroup (~205k cycles for one)
ALONE_TRIPS = {"ffma": 1600, "ex2": 400, "mix": 800}  # ~200k cycles with one warpgroup alone
ITERS_INTRA = 300
CAP_TRIPS = 1_000_000               # safety bound on the flag-stopped loops (~1.3e8 cycles at most)
REPS = 3                             # first launch is a warm-up, the best of the rest is kept


def _rows(st, bid, warps):
    return [st[(bid * MAX_STAMP_WARPS + w) * SLOTS:(bid * MAX_STAMP_WARPS + w) * SLOTS + 5] for w in warps]


def _mma_warps(nwg):
    return [w for g in range(nwg) for w in range(4 * g, 4 * g + 4)]


def _sf_warps(nsf):
    first = 2 if nsf <= 2 else 4 - nsf  # as the kernel's sf_first
    return [w for g in range(first, first + nsf) for w in range(4 * g, 4 * g + 4)]


def _analyse_roles(st, bid, nwg, nsf, kind, iters):
    r = {}
    if nwg:
        rows = _rows(st, bid, _mma_warps(nwg))
        win = max(x[1] for x in rows) - min(x[0] for x in rows)
        n = nwg * iters * KB
        r.update(mma_window=win, wgmma=n, wgmma_cycles_per_instr=win / n,
                 tensor_busy=(N / 2) * n / win,
                 clock_ghz=median([(x[1] - x[0]) / (x[3] - x[2]) for x in rows if x[3] > x[2]] or [0.0]))
    if nsf:
        rows = _rows(st, bid, _sf_warps(nsf))
        win = max(x[1] for x in rows) - min(x[0] for x in rows)
        trips = [x[4] for x in rows]
        warp_trips = sum(trips)
        per = PER_TRIP[kind]
        wi = {op: warp_trips * c for op, c in per.items()}  # warp instructions by opcode
        r.update(sf_window=win, sf_trips_per_warp=[min(trips), max(trips)], sf_warp_instr=wi,
                 sf_warp_instr_total=sum(wi.values()),
                 sf_lanes_per_clk={op: 32 * v / win for op, v in wi.items()},
                 sf_warp_instr_per_clk=sum(wi.values()) / win,
                 sf_issue_per_clk_per_smsp=warp_trips * LOOP_BODY[kind] / win / 4)
        if "MUFU.EX2" in wi:
            r["mufu_busy"] = 32 * wi["MUFU.EX2"] / win / 16.0
        fma_lanes = 32 * sum(wi.get(k, 0) for k in ("FFMA", "FADD", "FMUL")) / win
        r["fma_pipe_busy"] = fma_lanes / 128.0
    return r


def run(dev, clock_seconds=1.0, only=None, intra_wgs=(1, 2), pingpong=False):
    """On the GPU: {roles_ss: {...}, roles_rs: {...}, intra_ss: {...}, intra_rs: {...}, clock: {...}};
    only="mix3": the roles kernel's mix in two and three warpgroups, alone and beside one wgmma
    warpgroup ({mix3_ss: ..., mix3_rs: ...});
    only="intra": the intra kernel alone, at the warpgroup counts in intra_wgs; pingpong: its
    warpgroups hand the GEMM issue on in turn (constants.pingpong)."""
    torch = dev.torch
    stamps = torch.zeros(STAMPS, dtype=torch.int64, device="cuda")
    sink = torch.zeros(SINK, dtype=torch.float32, device="cuda")
    out = {"constants": dict(N=N, K_per_trip=KT, wgmma_per_trip=KB, elements_per_trip=E, per_trip=PER_TRIP,
                             loop_body_sass=LOOP_BODY, cap_trips=CAP_TRIPS,
                             iters_mma=ITERS_MMA, alone_trips=ALONE_TRIPS, iters_intra=ITERS_INTRA,
                             ideal_wgmma_cycles=N / 2, pingpong=bool(pingpong))}

    def roles(fn, key, nwg, nsf, kind, wait_depth, max_trips, iters=ITERS_MMA, ctas=1):
        best = None
        samples = []
        for rep in range(REPS):
            stamps.zero_()
            sink.zero_()
            secs = dev.call(key, fn, stamps, sink, Int32(nwg), Int32(nsf), Int32(KINDS[kind]), Int32(iters),
                            Int32(max_trips), Int32(wait_depth), Int32(ctas))
            st = stamps.cpu().tolist()
            r = _analyse_roles(st, 0, nwg, nsf, kind, iters)
            r["sink_finite"] = bool(torch.isfinite(sink).all().item())
            r["seconds"] = secs
            k = r.get("mma_window", r.get("sf_window"))
            if rep:
                samples.append(k)
                if best is None or k < best[0]:
                    best = (k, r, st)
        best[1]["samples"] = samples
        return best[1], best[2]

    def run_roles(name, rs):
        """The roles kernel: wgmma warpgroups beside softmax warpgroups, alone and together."""
        fn = make_roles(rs)
        key = ("contention_roles", rs)
        res = {"alone_mma": {}, "alone_sf": {}, "both": {}}
        for wd in (1, 0):
            for nwg in (1, 2):
                res["alone_mma"][f"W{nwg}_wait{wd}"] = roles(fn, key, nwg, 0, "ffma", wd, 0)[0]
        for kind in KINDS:
            for nsf in (1, 2):
                res["alone_sf"][f"F{nsf}_{kind}"] = roles(fn, key, 0, nsf, kind, 1, ALONE_TRIPS[kind])[0]
        for wd in (1, 0):
            for nwg in (1, 2):
                for nsf in (1, 2):
                    for kind in (KINDS if wd == 1 else ("mix",)):
                        r = roles(fn, key, nwg, nsf, kind, wd, CAP_TRIPS)[0]
                        a = res["alone_mma"][f"W{nwg}_wait{wd}"]
                        s = res["alone_sf"][f"F{nsf}_{kind}"]
                        r["wgmma_slowdown"] = r["wgmma_cycles_per_instr"] / a["wgmma_cycles_per_instr"]
                        r["sf_rate_vs_alone"] = r["sf_warp_instr_per_clk"] / s["sf_warp_instr_per_clk"]
                        # extra tensor cycles per softmax warp-instruction issued on the same SMSP
                        extra = r["mma_window"] - a["wgmma_cycles_per_instr"] * r["wgmma"]
                        r["tensor_cycles_lost_per_sf_instr_per_smsp"] = extra / (r["sf_warp_instr_total"] / 4)
                        r["window_match"] = r["sf_window"] / r["mma_window"]
                        res["both"][f"W{nwg}_F{nsf}_{kind}_wait{wd}"] = r
                        print(f"  {name} W{nwg} F{nsf} {kind:4s} wait{wd}: wgmma {r['wgmma_cycles_per_instr']:.1f} c/instr "
                              f"(x{r['wgmma_slowdown']:.3f} vs alone), softmax {r['sf_warp_instr_per_clk']:.3f} warp-instr/clk "
                              f"(x{r['sf_rate_vs_alone']:.3f}), lanes/clk "
                              + " ".join(f"{k}:{v:.1f}" for k, v in r["sf_lanes_per_clk"].items()), flush=True)
        res["unit_costs"] = unit_costs(res)
        return res

    def run_mix3(name, rs):
        """The roles kernel's mix in two and in three warpgroups (two and three warps per
        scheduler), alone and beside one warpgroup of back-to-back wgmma (wait_group 1)."""
        fn = make_roles(rs)
        key = ("contention_roles", rs)
        res = {"alone_mma": roles(fn, key, 1, 0, "ffma", 1, 0)[0]}
        for nsf in (2, 3):
            alone = roles(fn, key, 0, nsf, "mix", 1, ALONE_TRIPS["mix"])[0]
            both = roles(fn, key, 1, nsf, "mix", 1, CAP_TRIPS)[0]
            both["wgmma_slowdown"] = both["wgmma_cycles_per_instr"] / res["alone_mma"]["wgmma_cycles_per_instr"]
            both["sf_rate_vs_alone"] = both["sf_warp_instr_per_clk"] / alone["sf_warp_instr_per_clk"]
            res[f"F{nsf}_alone"], res[f"F{nsf}_beside_wgmma"] = alone, both
            print(f"  mix3 {name} F{nsf}: alone {alone['sf_warp_instr_per_clk']:.3f} warp-instr/clk, beside wgmma "
                  f"{both['sf_warp_instr_per_clk']:.3f} (x{both['sf_rate_vs_alone']:.3f}; of the SM's 4: "
                  f"{both['sf_warp_instr_per_clk'] / 4:.3f}), wgmma x{both['wgmma_slowdown']:.3f}", flush=True)
        return res

    for rs in (False, True):
        name = "rs" if rs else "ss"
        if only == "mix3":
            out[f"mix3_{name}"] = run_mix3(name, rs)
            continue
        if only != "intra":
            out[f"roles_{name}"] = run_roles(name, rs)
        # intra-warpgroup overlap
        ires = {}
        for nwg in intra_wgs:
            threads = intra_threads(nwg)
            fi = make_intra(rs, threads // 128)
            ikey = ("contention_intra", rs, threads)
            warps = threads // 32
            cfg = {}
            for do_mma, nb in ((1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (0, 1), (0, 2), (0, 3), (0, 4)):
                cyc, phases = [], []
                for rep in range(REPS):
                    stamps.zero_()
                    sink.zero_()
                    dev.call(ikey, fi, stamps, sink, Int32(nwg), Int32(nb), Int32(do_mma),
                             Int32(int(pingpong)), Int32(ITERS_INTRA))
                    st = stamps.cpu().tolist()
                    rows = _rows(st, 0, _mma_warps(nwg))
                    if rep:
                        cyc.append(max(x[1] for x in rows) - min(x[0] for x in rows))
                        # per warp and trip: start -> mix done, mix done -> wgmma wait returned
                        slots = [w * SLOTS for w in _mma_warps(nwg)]  # CTA 0's warps
                        phases.append((sum(st[o + 5] for o in slots) / len(slots) / ITERS_INTRA,
                                       sum(st[o + 6] for o in slots) / len(slots) / ITERS_INTRA))
                best = cyc.index(min(cyc))
                # the last repetition's trace: per trip, per warp [start, issued, mix done, wait done],
                # cycles from the first trip's earliest start
                raw = st[TRACE_BASE:TRACE_BASE + TRACE_TRIPS * warps * 4]
                t_ref = min(raw[(w * 4)] for w in _mma_warps(nwg))
                trace = [[[raw[(t * warps + w) * 4 + i] - t_ref for i in range(4)] for w in _mma_warps(nwg)]
                         for t in range(TRACE_TRIPS)]
                cfg[f"mma{do_mma}_nb{nb}"] = dict(cycles=min(cyc), cycles_per_trip=min(cyc) / ITERS_INTRA, samples=cyc,
                                                  mix_cycles_per_trip=phases[best][0],
                                                  wait_cycles_per_trip=phases[best][1],
                                                  trace_from_trip=TRACE_FROM, trace=trace,
                                                  sink_finite=bool(torch.isfinite(sink).all().item()))
            t_mma = cfg["mma1_nb0"]["cycles_per_trip"]
            for nb in (1, 2, 3, 4):
                both = cfg[f"mma1_nb{nb}"]["cycles_per_trip"]
                soft = cfg[f"mma0_nb{nb}"]["cycles_per_trip"]
                cfg[f"overlap_nb{nb}"] = dict(
                    mma=t_mma, softmax=soft, both=both, serial=t_mma + soft,
                    hidden_cycles=t_mma + soft - both,
                    hidden_fraction_of_softmax=(t_mma + soft - both) / soft,
                    hidden_fraction_of_min=(t_mma + soft - both) / min(t_mma, soft),
                    exposed_softmax=both - t_mma)
                print(f"  intra {name} WG{nwg} nb{nb}: mma {t_mma:.0f} softmax {soft:.0f} both {both:.0f} c/trip "
                      f"-> hidden {(t_mma + soft - both) / soft:.2f} of softmax", flush=True)
            ires[f"WG{nwg}"] = cfg
        out[f"intra_{name}"] = ires

    if only is None:
        out["clock"] = clock_run(dev, stamps, sink, out, clock_seconds)
    return out


def unit_costs(res):
    """Per-instruction tensor-cycle costs on one SMSP, from the `both` runs (wait1):
    k_fma  = extra tensor cycles / FFMA   (ffma-only runs)
    k_mufu = extra tensor cycles / MUFU   (ex2-only runs)
    k_alu  = what the mix run loses beyond k_fma x (FFMA + FADD + FMUL) + k_mufu x MUFU, per
             FMNMX / F2FP instruction (the ALU pipe); pred_mix = the mix loss predicted without ALU.
    Counts are per SMSP (warp instructions / 4); extra = window - alone cycles/instr x wgmma."""
    out = {}
    for nwg in (1, 2):
        for nsf in (1, 2):
            b = res["both"]
            lost = {}
            n = {}
            for kind in KINDS:
                r = b[f"W{nwg}_F{nsf}_{kind}_wait1"]
                a = res["alone_mma"][f"W{nwg}_wait1"]
                lost[kind] = r["mma_window"] - a["wgmma_cycles_per_instr"] * r["wgmma"]
                n[kind] = {k: v / 4 for k, v in r["sf_warp_instr"].items()}
            k_fma = lost["ffma"] / n["ffma"]["FFMA"]
            k_mufu = lost["ex2"] / n["ex2"]["MUFU.EX2"]
            nm = n["mix"]
            pred = k_fma * (nm["FFMA"] + nm["FADD"] + nm["FMUL"]) + k_mufu * nm["MUFU.EX2"]
            k_alu = (lost["mix"] - pred) / (nm["FMNMX"] + nm["F2FP"])
            out[f"W{nwg}_F{nsf}"] = dict(k_fma=k_fma, k_mufu=k_mufu, k_alu=k_alu, lost_mix=lost["mix"],
                                         pred_mix_without_alu=pred, lost=lost)
    return out


def clock_run(dev, stamps, sink, res, seconds):
    """All SMs, SS roles kernel, W=2 with F=0 and with F=2 (mix), each ~`seconds`: the clock
    (clock64 vs %globaltimer, CUDA events) and the per-SM rates under the chip-wide load."""
    torch = dev.torch
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    fn = make_roles(False)
    key = ("contention_roles", False)
    out = {"ctas": nsm}
    for label, nsf in (("W2_F0", 0), ("W2_F2_mix", 2)):
        one = (res["roles_ss"]["alone_mma"]["W2_wait1"] if nsf == 0 else res["roles_ss"]["both"]["W2_F2_mix_wait1"])
        cyc_per_iter = one["mma_window"] / ITERS_MMA
        iters = max(1000, int(seconds * 1.6e9 / cyc_per_iter))
        cap = int(4 * iters * cyc_per_iter / 100)  # a trip takes >= 100 cycles: a bound, never reached
        stamps.zero_()
        sink.zero_()
        conv = [dev.ct(stamps), dev.ct(sink), Int32(2), Int32(nsf), Int32(KINDS["mix"]), Int32(iters),
                Int32(min(cap, 2**31 - 1)), Int32(1), Int32(nsm)]
        if key not in dev.cache:
            dev.cache[key] = cute.compile(fn, *conv, dev.stream())
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        dev.cache[key](*conv, dev.stream())
        e1.record()
        torch.cuda.synchronize()
        ev_ms = e0.elapsed_time(e1)
        st = stamps.cpu().tolist()
        per = [_analyse_roles(st, b, 2, nsf, "mix", iters) for b in range(nsm)]
        cpi = [p["wgmma_cycles_per_instr"] for p in per]
        ghz = [p["clock_ghz"] for p in per]
        n_instr = nsm * 2 * iters * KB
        r = dict(iters=iters, event_ms=ev_ms, clock_ghz_median=median(ghz), clock_ghz_min=min(ghz),
                 clock_ghz_max=max(ghz), wgmma_cycles_per_instr_median=median(cpi),
                 wgmma_cycles_per_instr_max=max(cpi),
                 tflops_events=2 * 64 * N * 16 * n_instr / (ev_ms * 1e-3) / 1e12,
                 sink_finite=bool(torch.isfinite(sink).all().item()))
        if nsf:
            r["sf_warp_instr_per_clk_median"] = median([p["sf_warp_instr_per_clk"] for p in per])
            r["mufu_busy_median"] = median([p["mufu_busy"] for p in per])
            r["window_match_min"] = min(p["sf_window"] / p["mma_window"] for p in per)
        out[label] = r
        print(f"  clock {label}: {r['clock_ghz_median']:.3f} GHz (min {r['clock_ghz_min']:.3f}), "
              f"wgmma {r['wgmma_cycles_per_instr_median']:.1f} c/instr, {r['tflops_events']:.0f} TFLOP/s, "
              f"{ev_ms:.0f} ms", flush=True)
    return out


def summary(b):
    """Short text table of a run() result."""
    lines = []
    for name in ("ss", "rs"):
        res = b.get(f"roles_{name}")
        if not res:
            continue
        al = res["alone_mma"]
        lines.append(f"wgmma {name} alone c/instr: " + " ".join(f"{k}:{v['wgmma_cycles_per_instr']:.1f}" for k, v in al.items()))
        lines.append(f"softmax alone warp-instr/clk: " + " ".join(
            f"{k}:{v['sf_warp_instr_per_clk']:.3f}" for k, v in res["alone_sf"].items()))
        for k, v in res["both"].items():
            lines.append(f"  {name} {k:18s} wgmma x{v['wgmma_slowdown']:.3f} ({v['wgmma_cycles_per_instr']:.1f} c)  "
                         f"softmax x{v['sf_rate_vs_alone']:.3f}  tensor_busy {v['tensor_busy']:.3f}  "
                         f"lost c/sf-instr/SMSP {v['tensor_cycles_lost_per_sf_instr_per_smsp']:.3f}")
        for k, v in (res.get("unit_costs") or {}).items():
            lines.append(f"  {name} {k} tensor cycles lost per instr/SMSP: FFMA {v['k_fma']:.3f}  MUFU {v['k_mufu']:.3f}  "
                         f"ALU(FMNMX,F2FP) {v['k_alu']:.3f}")
        ir = b.get(f"intra_{name}") or {}
        for wgk, cfg in ir.items():
            lines.append(f"  intra {name} {wgk}: " + " ".join(
                f"nb{nb}:{cfg[f'overlap_nb{nb}']['both']:.0f}/{cfg[f'overlap_nb{nb}']['serial']:.0f}"
                f"(hid {cfg[f'overlap_nb{nb}']['hidden_fraction_of_softmax']:.2f})" for nb in (1, 2, 3, 4)))
    c = b.get("clock") or {}
    for k in ("W2_F0", "W2_F2_mix"):
        if k in c:
            lines.append(f"clock {k}: {c[k]['clock_ghz_median']:.3f} GHz, wgmma {c[k]['wgmma_cycles_per_instr_median']:.1f} "
                         f"c/instr, {c[k]['tflops_events']:.0f} TFLOP/s")
    return "\n".join(lines)


def main(argv=None):
    import argparse
    import json
    import time
    import traceback

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="results JSON (GPU run)")
    ap.add_argument("--check-sass", action="store_true", help="CPU: compile for sm_90a and check the SASS")
    ap.add_argument("--clock-seconds", type=float, default=1.0)
    ap.add_argument("--only", choices=["intra", "mix3"],
                    help="intra: only the intra kernel (warpgroups running the mix beside their own wgmma, with each "
                         "trip's mix and wait cycles); mix3: only the mix in two and three warpgroups, alone and "
                         "beside one wgmma warpgroup (two and three warps per scheduler)")
    ap.add_argument("--intra-wgs", default="1,2", metavar="N,N",
                    help="warpgroup counts of the intra kernel, from 1, 2, 3 (3: a 384-thread build, FA3's hd64 "
                         "tile of 192 rows); default 1,2")
    ap.add_argument("--pingpong", action="store_true",
                    help="intra kernel: warpgroups issue their GEMMs in turn, each after the previous one has "
                         "issued its own (named barriers, as fa4kernel's consumers with pingpong=True)")
    args = ap.parse_args(argv)
    try:
        intra_wgs = tuple(int(x) for x in args.intra_wgs.split(","))
    except ValueError:
        intra_wgs = ()
    if not intra_wgs or any(n not in INTRA_WGS for n in intra_wgs):
        ap.error(f"--intra-wgs: {args.intra_wgs!r}; allowed: comma-separated 1, 2, 3")
    if args.check_sass:
        return check_sass()
    if not args.out:
        ap.error("--out FILE.json (GPU) or --check-sass (CPU)")
    from .common import Device
    from .run_all import meta

    t0 = time.perf_counter()
    dev = Device()
    res = {"meta": meta("contention"), "scripts": {"contention": "bench_contention.py"}, "benchmarks": {}, "errors": {}}
    try:
        res["benchmarks"]["contention"] = run(dev, args.clock_seconds, args.only, intra_wgs, args.pingpong)
    except Exception:  # noqa: BLE001
        res["errors"]["contention"] = traceback.format_exc()
        print(res["errors"]["contention"], flush=True)
    res["seconds"] = {"contention": round(time.perf_counter() - t0, 2)}
    res["compile_seconds"] = {str(k): round(v, 2) for k, v in dev.compile_s.items()}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    if "contention" in res["benchmarks"]:
        print(summary(res["benchmarks"]["contention"]), flush=True)
    print(f"[contention] {res['seconds']['contention']} s -> {args.out}", flush=True)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
