"""Dense FP32 bursts beside a running wgmma: do they issue at full rate, and do they cost the tensor core?

bench_contention.py found two things that do not fit one rule: a softmax-like *mix* issues at
about a third of the SM's rate while a wgmma runs (fa4sim's issue_under_mma), yet an endless
dense FFMA stream issues at 0.7-0.9 instructions per clock per scheduler and instead takes about
one tensor cycle per FFMA. The attention kernels do neither: they issue *bursts* of independent
FP32 instructions (the O rescale: head_dim / 2 FMULs per thread by one reused scale) between
waits. This benchmark measures exactly that, at the unit level:

Kernel (384 threads = 3 warpgroups, one CTA on one SM):
  warpgroup 0: `iters` trips of {fence; 8 x wgmma m64n128k16 SS chained (K = 128); commit;
     wait_group(1)} (back to back, the tensor core never idles), or nothing (do_mma = 0);
     then a done flag in shared memory.
  warpgroups 1 .. nsf (nsf = 0, 1, 2): until the flag is set (or `max_trips`), trips of
     {clock64; a burst of `blocks` x 128 independent FP32 instructions on 32 registers
      (op 0: x = x * s, FMUL, s one register for all (the O rescale's shape);
       op 1: x = x * a + b, FFMA, as bench_contention; op 2: bench_contention's softmax-like mix,
       180 instructions per block; op 3: integer LOP3 / IADD3 / IMAD, 129 per block;
       op 4: x = max(x, s), FMNMX (the row max's pipe, half the FP32 rate); op 5: x = the bf16
       pair (x, s) as f32 bits, F2FP.BF16.F32.PACK_AB (P's conversion; the same pipe);
       ops 6, 7: the mix with 8 / 4 of its 32 exp2s by fa4kernel's polynomial (mix_emu25 / 12);
       op 8 (fmul+mix): warpgroup 1 the FMUL burst, warpgroup 2 the mix; op 9 (stsm): 32
       STSM.16.M88.4 into the warp's own 4 KB of smem, P's store in a P-via-smem build);
     clock64; nanosleep(gap_ns) if gap_ns > 0}.
  --wgmma-n picks the running wgmma's N (64, 128, 256: FA3's QK^T and PV widths).
  --stream-warps 1,2,3: stream warps per scheduler; 3 (hd64's three consumer warpgroups) needs a
     fourth warpgroup, a 512-thread build (the same 90 registers, but ptxas schedules the codes
     differently: the mix and its emulated forms time differently at 1 and 2 warps than in the
     384-thread build; compare within one build).
  --mma-gaps 0,100,...: a duty-cycle sweep instead: warpgroup 0 waits for each trip of 8 and
     sleeps `gap` ns, the codes run without gaps beside it; their rate against the tensor
     core's busy share, next to the line fa4sim assumes (slowed only while the tensor core works).
  --inline: the O rescale as compiled (fa4kernel hd256: 128 FMULs per warp between its QK^T GEMM's
     1st and 2nd HGMMA, issued by the warps that issue the wgmma): warpgroups 0 .. nmma-1 (1 or 2)
     each run `iters` trips of {fence; wgmma k = 0; [128 FMUL y = y * s on 16 registers, clock64
     around them]; wgmma k = 1 .. 7; commit; wait_group(1)}, all on the one tensor core; with nmix
     = 1 the next warpgroup runs the mix beside them (the other consumer's softmax). Each build
     with and without the burst (the same binary shape): the tensor cycles the inline burst costs
     and its in-burst issue rate, by the wgmma's N.
Per stream warp: the cycles spent inside bursts and the trips, so the *in-burst* issue rate is
measured beside the wgmma; per wgmma warp the window, so the tensor cycles lost per burst
instruction are (window - alone cycles per wgmma x wgmmas) / (burst instructions per scheduler).

    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_bursts --check-sass    # CPU, ~10 s
    source .gpu/setup-device.sh; python3 lab/tools/calibrate/bench_bursts.py --out B.json [--ops fmul,fmnmx]  # GPU, ~20 s
    ... bench_bursts.py --out D.json --ops mix,mix_emu25,fmul --mma-gaps 0,100,300,600,1000,2000,4000     # GPU, ~20 s
    ... bench_bursts.py --out I.json --inline 64,128,256     # GPU, ~40 s (6 builds)
    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_bursts --check-sass --inline 64,128,256  # CPU

Results (H100, H200) and what fa4sim takes from them (dense_issue_under_mma, inline_issue_under_mma; the smem:lsu share):
lab/tools/calibrate/README.md (one kernel for all codes; one kernel per code, with FMNMX and
F2FP; emulated exp2s, the pair, STSM, the wgmma's width).
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script path
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
    __package__ = "lab.tools.calibrate"

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import BFloat16, Float32, Int32, Int64, const_expr  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.cutlass_dsl import dsl_user_op  # noqa: E402

from fa4kernel.softmax import emulated_columns  # noqa: E402
from fa4kernel.sass import loop_bodies  # noqa: E402

from .bench_contention import KB, KT, LOG2E, N, PER_TRIP, _mix_block, _tiled_mma, fmul, lds_volatile, red_add_shared  # noqa: E402,E501
from .bench_wgmma import _smem_layout  # noqa: E402
from .common import _asm, clk, compile_for_sass, f2bf16x2, ffma, fill_random_bf16, fmax, smem_addr, sts32  # noqa: E402,E501

THREADS = 384         # 3 warpgroups: the wgmma one and up to 2 stream warpgroups
THREADS_3 = 512       # --stream-warps with 3: a third stream warpgroup (hd64's 3 consumer warpgroups)
E = 32                 # registers per stream thread; a block is 4 passes over them = 128 instructions
PER_BLOCK = 4 * E
SLOTS = 8              # int64 per warp: t0, t1, burst cycles, trips, bursts
OPS = {"fmul": 0, "ffma": 1, "mix": 2, "int": 3, "fmnmx": 4, "f2fp": 5, "mix_emu25": 6, "mix_emu12": 7,
       "fmul+mix": 8, "stsm": 9}
# two codes at once: warpgroup 1 runs the first, warpgroup 2 the second (one warp of each per
# scheduler): does an O-rescale-like FMUL burst take issue slots from a softmax warp beside it?
PAIRS = {"fmul+mix": ("fmul", "mix")}
# the mix with a fraction of its 32 exp2s done by fa4kernel's polynomial (the columns fa4kernel picks)
EMULATED = {"mix_emu25": emulated_columns(E, 0.25), "mix_emu12": emulated_columns(E, 0.125)}
DENSE = (0, 1, 4, 5)  # the one-instruction codes: FMUL, FFMA, FMNMX, F2FP
# warp instructions per block of each op (the mix: one pass of bench_contention's softmax-like mix
# over 32 elements; int: 64 steps of u = (u ^ v) + w, which ptxas compiles to 64 LOP3 and 64 adds
# (IADD3 / IMAD, 15 / 49 since each code compiles alone) on the regular integer pipe, not the
# uniform datapath; fa4kernel's loop with its last KV block peeled held 129: 64 LOP3, 48 IADD3, 17 IMAD)
BLOCK_INSTR = {"fmul": 4 * E, "ffma": 4 * E, "mix": sum(PER_TRIP["mix"].values()), "int": 128,
               "fmnmx": 4 * E, "f2fp": 4 * E, "stsm": 4 * E // 4}
# stsm: P's store to shared memory in a P-via-smem build (fa4kernel hd128: 8 STSM.16.M88.4 per warp
# and KV block, 512 B each): 4 passes of 8 over the 32 registers, each warp into its own 4 KB
STSM_BYTES = 512
PBUF_WORDS = 12 * 8 * STSM_BYTES // 4   # up to 12 stream warps x 8 STSM x 512 B
# an emulated exp2 replaces one MUFU.EX2 by 8 instructions in SASS: FMNMX (clamp), FADD.RM, 2 FADD,
# 3 FFMA, LEA (shift + add; CUDA 13.0 ptxas, checked by check_sass)
EMU_PLAN = {"MUFU": -1, "FMNMX": 1, "FADD": 3, "FFMA": 3, "LEA": 1}
for _code, _cols in EMULATED.items():
    BLOCK_INSTR[_code] = BLOCK_INSTR["mix"] + len(_cols) * sum(EMU_PLAN.values())
WGMMA_N = (64, 128, 256)  # --wgmma-n: FA3's GEMM widths (QK^T: tile_n; PV: head dim)
ITERS = 400            # wgmma trips: 3200 wgmma of 64 cycles, ~205k cycles
ALONE_TRIPS = 1500
CAP_TRIPS = 1_000_000
REPS = 3


@dsl_user_op
def nanosleep(ns, *, loc=None, ip=None):
    _asm(None, [Int32(ns).ir_value()], "nanosleep.u32 $0;", "r")


@dsl_user_op
def stsm_x4(addr, r0, r1, r2, r3, *, loc=None, ip=None):
    """stmatrix.sync.aligned.m8n8.x4.shared.b16 (STSM.16.M88.4): four 8x8 b16 matrices, 512 B."""
    _asm(None, [Int32(addr).ir_value()] + [Float32(r).ir_value() for r in (r0, r1, r2, r3)],
         "stmatrix.sync.aligned.m8n8.x4.shared.b16 [$0], {$1, $2, $3, $4};", "r,f,f,f,f")


def make(code: str, n: int = N, threads: int = THREADS):
    """The kernel for one burst code (OPS): each code compiles alone, so its loop's registers do
    not depend on the other codes (they did: with every code in one kernel, adding two codes turned
    the in-place FMUL x = x * s into a rotating one, which runs slower beside a wgmma and slows it).
    threads: 384 (up to 2 stream warpgroups) or 512 (up to 3; fewer registers per thread)."""
    op = OPS[code]
    pair = code in PAIRS

    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, do_mma: Int32, nsf: Int32, blocks: Int32,
               gap_ns: Int32, iters: Int32, max_trips: Int32, mma_gap_ns: Int32,
               tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout):
        tid = cute.arch.thread_idx()[0]
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        wtid = tid % 128
        lane = tid % 32

        @cute.struct
        class Storage:
            flag: cute.struct.MemRange[Int32, 4]
            sA: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sB_layout)], 1024]
            pbuf: cute.struct.Align[cute.struct.MemRange[Int32, PBUF_WORDS], 128]  # stsm's target

        storage = cutlass.utils.SmemAllocator().allocate(Storage)
        flag_addr = smem_addr(storage.flag.data_ptr())
        base = smem_addr(storage.sA.data_ptr())
        base_b = smem_addr(storage.sB.data_ptr())
        a_words = cute.cosize(sA_layout) // 2
        fill_random_bf16(base, a_words, base_b, (cute.cosize(sA_layout) + cute.cosize(sB_layout)) // 2,
                         tid, threads, 7919)
        if tid == 0:
            sts32(flag_addr, 0)
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        thr_mma = tiled_mma.get_slice(wtid)
        wg_mma = tiled_mma.get_slice(0)
        tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA[None, None, 0]))
        tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((64, n)), Float32)
        acc.fill(0.0)
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        total = Float32(0.0)
        t0 = Int64(0)
        t1 = Int64(0)
        in_burst = Int64(0)
        trips = Int32(0)
        if wg == 0:
            t0 = clk()
            if do_mma != 0:
                for _ in cutlass.range(iters, unroll=1):
                    warpgroup.fence()
                    for k in cutlass.range_constexpr(KB):
                        cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
                    warpgroup.commit_group()
                    if mma_gap_ns > 0:  # --mma-gaps: the tensor core idles between trips
                        warpgroup.wait_group(0)
                        nanosleep(mma_gap_ns)
                    else:
                        warpgroup.wait_group(1)
                warpgroup.wait_group(0)
            t1 = clk()
            if wtid == 0:
                red_add_shared(flag_addr, 1)
            for i in cutlass.range_constexpr(cute.size(acc)):
                total = total + acc[i]
        elif wg - 1 < nsf:
            # a scale no compiler can fold: 1 + a few ulps, so 10^6 products stay bounded
            s = Float32(1.0) + Float32(wtid) * Float32(1e-12)
            a = Float32(0.999)
            b = Float32(0.001)
            x = [Float32(wtid) * Float32(1e-3) + Float32(0.01 * j + 0.05) for j in range(E)]
            y = [v + Float32(0.5) for v in x]  # the pair's FMUL registers, apart from the mix's
            m = [Float32(0.0) for _ in range(4)]
            lsum = [Float32(0.0) for _ in range(4)]
            sc = Float32(LOG2E)
            nsc = Float32(-LOG2E)
            c4 = Float32(4.0)
            u = warp * 7 + 1
            uv = warp * 13 + blocks
            uw = warp + gap_ns + 3
            go = Int32(1)
            # stsm: lane i gives row i % 8 of matrix i // 8 of the warp's 512 B slot (16 B rows)
            p_lane = (smem_addr(storage.pbuf.data_ptr()) + (warp - 4) * 8 * STSM_BYTES
                      + (lane // 8) * 128 + (lane % 8) * 16)
            t0 = clk()
            while go != 0:
                f = lds_volatile(flag_addr)
                c0 = clk()
                if const_expr(pair):  # warpgroup 1: the FMUL burst, warpgroup 2: the mix
                    if wg == 1:
                        for _b in cutlass.range(blocks, unroll=1):
                            for _u in cutlass.range_constexpr(4):
                                for j in cutlass.range_constexpr(E):
                                    y[j] = fmul(y[j], s)
                    else:
                        for _b in cutlass.range(blocks, unroll=1):
                            x, m, lsum = _mix_block(x, m, lsum, sc, nsc, c4)
                elif const_expr(op == 9):  # 4 passes of 8 STSM (4 registers each) into the warp's 4 KB
                    for _b in cutlass.range(blocks, unroll=1):
                        for _u in cutlass.range_constexpr(4):
                            for k in cutlass.range_constexpr(E // 4):
                                stsm_x4(p_lane + k * STSM_BYTES, x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3])
                elif const_expr(op in DENSE):  # 4 passes of one instruction over the 32 registers
                    for _b in cutlass.range(blocks, unroll=1):
                        for _u in cutlass.range_constexpr(4):
                            for j in cutlass.range_constexpr(E):
                                if const_expr(op == 0):
                                    x[j] = fmul(x[j], s)
                                elif const_expr(op == 1):
                                    x[j] = ffma(x[j], a, b)
                                elif const_expr(op == 4):
                                    x[j] = fmax(x[j], s)
                                else:
                                    x[j] = f2bf16x2(x[j], s)  # x's bf16 in the high half: stays ~x
                elif const_expr(op in (2, 6, 7)):
                    for _b in cutlass.range(blocks, unroll=1):
                        x, m, lsum = _mix_block(x, m, lsum, sc, nsc, c4, EMULATED.get(code, ()))
                else:
                    for _b in cutlass.range(blocks, unroll=1):
                        for _u in cutlass.range_constexpr(64):
                            u = (u ^ uv) + uw
                in_burst = in_burst + (clk() - c0)
                trips = trips + 1
                if gap_ns > 0:
                    nanosleep(gap_ns)
                if f >= do_mma:
                    if do_mma != 0:
                        go = Int32(0)
                if trips >= max_trips:
                    go = Int32(0)
            t1 = clk()
            for j in cutlass.range_constexpr(E):
                total = total + x[j]
                if const_expr(pair):
                    total = total + y[j]
            for j in cutlass.range_constexpr(4):
                total = total + m[j] + lsum[j]
            total = total + Float32(u)
        if lane == 0:
            o = warp * SLOTS
            stamps[o + 0] = t0
            stamps[o + 1] = t1
            stamps[o + 2] = in_burst
            stamps[o + 3] = Int64(trips)
        sink[tid] = total

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, do_mma: Int32, nsf: Int32, blocks: Int32,
             gap_ns: Int32, iters: Int32, max_trips: Int32, mma_gap_ns: Int32, stream):
        tiled_mma = _tiled_mma(False, n)
        sA_layout = _smem_layout(BFloat16, 64, KT, 2)
        sB_layout = _smem_layout(BFloat16, n, KT)
        smem = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) * 2 + 3072 + PBUF_WORDS * 4
        kernel(stamps, sink, do_mma, nsf, blocks, gap_ns, iters, max_trips, mma_gap_ns, tiled_mma, sA_layout,
               sB_layout).launch(grid=[1, 1, 1], block=[threads, 1, 1], smem=smem, stream=stream)

    return host


INLINE_E = 16          # --inline: registers of the burst (the wgmma warpgroups also hold acc: N/2)
INLINE_PASSES = 8      # 8 passes of 16 = 128 FMULs per warp: the O rescale's count at hd256 (dv / 2)
INLINE_FMULS = INLINE_E * INLINE_PASSES
INLINE_CONFIGS = ((1, 0), (2, 0), (1, 1))  # (wgmma warpgroups, mix warpgroups beside them)


def make_inline(n: int, burst: bool):
    """--inline: wgmma warpgroups that issue an FMUL burst between their own 1st and 2nd wgmma of
    each trip (burst) or not, and up to one mix warpgroup beside them (module docstring)."""

    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, nmma: Int32, nmix: Int32, iters: Int32,
               tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout):
        tid = cute.arch.thread_idx()[0]
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        wtid = tid % 128
        lane = tid % 32

        @cute.struct
        class Storage:
            flag: cute.struct.MemRange[Int32, 4]
            sA: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sB_layout)], 1024]

        storage = cutlass.utils.SmemAllocator().allocate(Storage)
        flag_addr = smem_addr(storage.flag.data_ptr())
        base = smem_addr(storage.sA.data_ptr())
        base_b = smem_addr(storage.sB.data_ptr())
        a_words = cute.cosize(sA_layout) // 2
        fill_random_bf16(base, a_words, base_b, (cute.cosize(sA_layout) + cute.cosize(sB_layout)) // 2,
                         tid, THREADS, 7919)
        if tid == 0:
            sts32(flag_addr, 0)
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        thr_mma = tiled_mma.get_slice(wtid)
        wg_mma = tiled_mma.get_slice(0)
        tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA[None, None, 0]))
        tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((64, n)), Float32)
        acc.fill(0.0)
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        total = Float32(0.0)
        t0 = Int64(0)
        t1 = Int64(0)
        in_burst = Int64(0)
        trips = Int32(0)
        s = Float32(1.0) + Float32(wtid) * Float32(1e-12)
        if wg < nmma:
            y = [Float32(wtid) * Float32(1e-3) + Float32(0.01 * j + 0.05) for j in range(INLINE_E)]
            t0 = clk()
            for _ in cutlass.range(iters, unroll=1):
                warpgroup.fence()
                cute.gemm(atom, acc, tCrA[None, None, 0], tCrB[None, None, 0], acc)
                if const_expr(burst):  # the O rescale's place: after the first HGMMA of the GEMM
                    c0 = clk()
                    for _u in cutlass.range_constexpr(INLINE_PASSES):
                        for j in cutlass.range_constexpr(INLINE_E):
                            y[j] = fmul(y[j], s)
                    in_burst = in_burst + (clk() - c0)
                for k in cutlass.range_constexpr(1, KB):
                    cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
            warpgroup.wait_group(0)
            t1 = clk()
            trips = iters
            if wtid == 0:
                red_add_shared(flag_addr, 1)
            for i in cutlass.range_constexpr(cute.size(acc)):
                total = total + acc[i]
            for j in cutlass.range_constexpr(INLINE_E):
                total = total + y[j]
        elif wg - nmma < nmix:  # the mix, until every wgmma warpgroup is done
            x = [Float32(wtid) * Float32(1e-3) + Float32(0.01 * j + 0.05) for j in range(E)]
            m = [Float32(0.0) for _ in range(4)]
            lsum = [Float32(0.0) for _ in range(4)]
            sc = Float32(LOG2E)
            nsc = Float32(-LOG2E)
            c4 = Float32(4.0)
            go = Int32(1)
            t0 = clk()
            while go != 0:
                f = lds_volatile(flag_addr)
                c0 = clk()
                x, m, lsum = _mix_block(x, m, lsum, sc, nsc, c4)
                in_burst = in_burst + (clk() - c0)
                trips = trips + 1
                if f >= nmma:
                    go = Int32(0)
                if trips >= CAP_TRIPS:
                    go = Int32(0)
            t1 = clk()
            for j in cutlass.range_constexpr(E):
                total = total + x[j]
            for j in cutlass.range_constexpr(4):
                total = total + m[j] + lsum[j]
        if lane == 0:
            o = warp * SLOTS
            stamps[o + 0] = t0
            stamps[o + 1] = t1
            stamps[o + 2] = in_burst
            stamps[o + 3] = Int64(trips)
        sink[tid] = total

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, nmma: Int32, nmix: Int32, iters: Int32, stream):
        tiled_mma = _tiled_mma(False, n)
        sA_layout = _smem_layout(BFloat16, 64, KT, 2)
        sB_layout = _smem_layout(BFloat16, n, KT)
        smem = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) * 2 + 3072
        kernel(stamps, sink, nmma, nmix, iters, tiled_mma, sA_layout, sB_layout).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], smem=smem, stream=stream)

    return host


def fake_args_inline():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (THREADS // 32 * SLOTS,)), fake_tensor(Float32, (THREADS,)), Int32(1), Int32(0),
            Int32(10), fake_stream())


def fake_args(threads: int = THREADS):
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (threads // 32 * SLOTS,)), fake_tensor(Float32, (threads,)), Int32(1), Int32(1),
            Int32(1), Int32(0), Int32(10), Int32(10), Int32(0), fake_stream())


# ----------------------------------------------------------------------------- CPU: SASS check
def check_sass() -> int:
    """Each code's kernel holds exactly its planned instructions per burst block, and its wgmma
    loop 8 HGMMA; the FMUL burst is the O rescale's in-place form (FMUL Rx, Rx, Rs)."""
    plans = {"fmul": {"FMUL": PER_BLOCK}, "ffma": {"FFMA": PER_BLOCK},
             "mix": {k.split(".")[0]: v for k, v in PER_TRIP["mix"].items()},
             "int": {"LOP3": 64, "IADD3+IMAD": 64},
             "fmnmx": {"FMNMX": PER_BLOCK}, "f2fp": {"F2FP": PER_BLOCK}, "stsm": {"STSM": BLOCK_INSTR["stsm"]}}
    for code, cols in EMULATED.items():
        plans[code] = {k: v + len(cols) * EMU_PLAN.get(k, 0) for k, v in plans["mix"].items()}
        plans[code]["LEA"] = len(cols) * EMU_PLAN["LEA"]
    ok = True
    # every code with the default wgmma; the mix with the other shapes --wgmma-n offers
    builds = [(code, N, THREADS) for code in OPS] + [("mix", n, THREADS) for n in WGMMA_N if n != N]
    builds += [(code, N, THREADS_3) for code in ("mix", "mix_emu25", "mix_emu12")]  # --stream-warps 3
    for code, n, threads in builds:  # a pair's kernel must hold both codes' loops
        sass, regs = compile_for_sass(make(code, n, threads), *fake_args(threads), with_registers=True)
        parts = PAIRS.get(code, (code,))
        found = {"wgmma": False, **{part: False for part in parts}}
        in_place = True
        for _, ops in loop_bodies(sass, operands=True):
            c = {}
            for o in ops:
                c[o.split(".")[0].split()[0]] = c.get(o.split(".")[0].split()[0], 0) + 1
            c["IADD3+IMAD"] = c.get("IADD3", 0) + c.get("IMAD", 0)
            # the wgmma loop: 8 HGMMA of the asked shape, its descriptor math on the uniform
            # datapath (13 instructions at N = 128, 30 at N = 64, 45 at N = 256) and the
            # --mma-gaps branch (6 more, plus 6 NOPs of alignment at N = 256)
            if c.get("HGMMA", 0) == KB and len(ops) <= KB + 56 and any(f"HGMMA.64x{n}x16" in o for o in ops):
                found["wgmma"] = True
            for part in parts:
                if all(c.get(k, 0) == v for k, v in plans[part].items()) and len(ops) <= BLOCK_INSTR[part] + 5:
                    found[part] = True  # the tight loop: the plan plus at most 5 of loop control
                    if code == "fmul":  # (in the pair's kernel ptxas alternates every other register)
                        in_place = all(_in_place(o) for o in ops if o.startswith("FMUL"))
        good = bool(regs) and ((regs + 7) // 8 * 8) * threads <= 65536 and all(found.values()) and in_place
        ok = ok and good
        print(f"{'ok' if good else 'BAD'} {code:6s} wgmma N={n} regs={regs} x {threads} threads, loops found {found}"
              + ("" if in_place else ", FMUL not in place"))
    return 0 if ok else 1


def check_sass_inline(ns=WGMMA_N) -> int:
    """--inline: each build's wgmma loop holds its KB HGMMA of the asked shape and, with the burst,
    its 128 FMULs, every one after the trip's first HGMMA and before its second (where fa4kernel's
    O rescale sits), in place (FMUL Ry, Ry, Rs)."""
    ok = True
    for n in ns:
        for burst in (False, True):
            sass, regs = compile_for_sass(make_inline(n, burst), *fake_args_inline(), with_registers=True)
            where = None
            for _, ops in loop_bodies(sass, operands=True):
                h = [i for i, o in enumerate(ops) if o.startswith("HGMMA")]
                if len(h) != KB or not all(f"HGMMA.64x{n}x16" in ops[i] for i in h):
                    continue
                f = [i for i, o in enumerate(ops) if o.startswith("FMUL")]
                where = {"fmul": len(f), "between_1st_2nd": sum(h[0] < i < h[1] for i in f),
                         "in_place": all(_in_place(ops[i]) for i in f), "loop_len": len(ops)}
            want = INLINE_FMULS if burst else 0
            good = (bool(regs) and ((regs + 7) // 8 * 8) * THREADS <= 65536 and where is not None
                    and where["fmul"] == want and where["between_1st_2nd"] == want and where["in_place"])
            ok = ok and good
            print(f"{'ok' if good else 'BAD'} inline wgmma N={n} burst={int(burst)} regs={regs} x {THREADS} threads, "
                  f"wgmma loop {where}")
    return 0 if ok else 1


def run_inline(dev, n: int) -> dict:
    """--inline at one N: every INLINE_CONFIGS entry with and without the burst."""
    torch = dev.torch
    warps = THREADS // 32
    stamps = torch.zeros(warps * SLOTS, dtype=torch.int64, device="cuda")
    sink = torch.zeros(THREADS, dtype=torch.float32, device="cuda")
    out = {"constants": dict(N=n, wgmma_per_trip=KB, iters=ITERS, fmuls_per_trip=INLINE_FMULS, threads=THREADS,
                             ideal_wgmma_cycles=n / 2)}
    for burst in (False, True):
        fn = make_inline(n, burst)
        for nmma, nmix in INLINE_CONFIGS:
            best = None
            for rep in range(REPS):
                stamps.zero_()
                dev.call(f"inline_{n}_{int(burst)}", fn, stamps, sink, Int32(nmma), Int32(nmix), Int32(ITERS))
                st = stamps.cpu().tolist()
                rows = [st[w * SLOTS:(w + 1) * SLOTS] for w in range(warps)]
                mma = rows[:4 * nmma]
                mix = rows[4 * nmma:4 * (nmma + nmix)]
                win = max(x[1] for x in mma) - min(x[0] for x in mma)
                r = {"burst": burst, "nmma": nmma, "nmix": nmix, "sink_finite": bool(torch.isfinite(sink).all().item()),
                     "mma_window": win, "wgmma": ITERS * KB * nmma, "wgmma_cycles_per_instr": win / (ITERS * KB * nmma)}
                if burst:  # per wgmma warp: 128 FMULs per trip, clock64 around them
                    r["fmul_in_burst_rate_per_warp"] = ITERS * INLINE_FMULS * len(mma) / sum(x[2] for x in mma)
                    r["fmul_cycles_per_burst"] = sum(x[2] for x in mma) / (ITERS * len(mma))
                if mix:
                    instr = BLOCK_INSTR["mix"] * sum(x[3] for x in mix)
                    mwin = max(x[1] for x in mix) - min(x[0] for x in mix)
                    r.update(mix_trips=[min(x[3] for x in mix), max(x[3] for x in mix)],
                             mix_in_burst_rate_per_warp=instr / sum(x[2] for x in mix),
                             mix_rate_per_smsp=instr / mwin / 4)
                if rep and (best is None or win < best[0]):
                    best = (win, r)
            r = best[1]
            out[f"{'burst' if burst else 'plain'}_M{nmma}_X{nmix}"] = r
    for nmma, nmix in INLINE_CONFIGS:  # what the burst costs the tensor core, per FMUL per scheduler
        plain, b = out[f"plain_M{nmma}_X{nmix}"], out[f"burst_M{nmma}_X{nmix}"]
        lost = b["mma_window"] - plain["mma_window"]
        b["tensor_cycles_lost"] = lost
        b["tensor_cycles_lost_per_fmul_per_smsp"] = lost / (ITERS * INLINE_FMULS * nmma)
        b["wgmma_slowdown"] = b["mma_window"] / plain["mma_window"]
        print(f"  N={n} wgmma WGs {nmma}, mix WGs {nmix}: wgmma {plain['wgmma_cycles_per_instr']:.1f} -> "
              f"{b['wgmma_cycles_per_instr']:.1f} cycles (x{b['wgmma_slowdown']:.3f}), "
              f"{b['tensor_cycles_lost_per_fmul_per_smsp']:.3f} tensor cycles per FMUL per SMSP, FMUL burst "
              f"{b['fmul_cycles_per_burst']:.0f} cycles ({b['fmul_in_burst_rate_per_warp']:.3f} per warp)"
              + (f", mix {plain['mix_rate_per_smsp']:.3f} -> {b['mix_rate_per_smsp']:.3f} per SMSP" if nmix else ""),
              flush=True)
    return out


def _in_place(instr: str) -> bool:
    """FMUL Rd, Rd, Rs (either operand order): the destination is one of its sources."""
    regs = [r.split(".")[0] for r in instr.split(None, 1)[1].replace(" ", "").split(",")]
    return regs[0] in regs[1:]


# ----------------------------------------------------------------------------- GPU
def run(dev, ops=tuple(OPS), n: int = N, mma_gaps=(), stream_warps=(1, 2)) -> dict:
    """stream_warps: stream warps per scheduler (warpgroups) to time each code with; 3 takes the
    512-thread build."""
    torch = dev.torch
    threads = THREADS_3 if max(stream_warps) > 2 else THREADS
    warps = threads // 32
    stamps = torch.zeros(warps * SLOTS, dtype=torch.int64, device="cuda")
    sink = torch.zeros(threads, dtype=torch.float32, device="cuda")
    fns = {}

    def once(do_mma, nsf, op, blocks, gap_ns, max_trips, mma_gap_ns=0):
        fn = fns.setdefault(op, make(op, n, threads))
        best = None
        for rep in range(REPS):
            stamps.zero_()
            dev.call(f"bursts_{op}", fn, stamps, sink, Int32(do_mma), Int32(nsf), Int32(blocks),
                     Int32(gap_ns), Int32(ITERS), Int32(max_trips), Int32(mma_gap_ns))
            st = stamps.cpu().tolist()
            rows = [st[w * SLOTS:(w + 1) * SLOTS] for w in range(warps)]
            mma = rows[0:4]
            sf = [r for w, r in enumerate(rows) if 1 <= w // 4 <= nsf]
            r = {"do_mma": do_mma, "nsf": nsf, "op": op, "blocks": blocks, "gap_ns": gap_ns, "mma_gap_ns": mma_gap_ns,
                 "sink_finite": bool(torch.isfinite(sink).all().item())}
            if do_mma:
                win = max(x[1] for x in mma) - min(x[0] for x in mma)
                r.update(mma_window=win, wgmma=ITERS * KB, wgmma_cycles_per_instr=win / (ITERS * KB))
            if sf:
                codes = PAIRS.get(op, (op, op, op))  # stream warpgroup 1's code, 2's (and 3's)
                per_warp = [BLOCK_INSTR[codes[w // 4 - 1]] for w in range(warps) if 1 <= w // 4 <= nsf]
                instr = blocks * sum(x[3] * n for x, n in zip(sf, per_warp))  # warp instructions, all stream warps
                burst_cycles = sum(x[2] for x in sf)
                win = max(x[1] for x in sf) - min(x[0] for x in sf)
                r.update(stream_window=win, stream_warp_instr=instr, trips=[min(x[3] for x in sf), max(x[3] for x in sf)],
                         in_burst_rate_per_warp=instr / burst_cycles,          # warp-instr per clock inside a burst
                         cycles_per_block=burst_cycles / (sum(x[3] for x in sf) * blocks),  # per stream warp
                         stream_rate_per_smsp=instr / win / 4,                 # over the whole window
                         burst_duty=burst_cycles / (win * len(sf)))
                if op in PAIRS:  # each warpgroup's own numbers
                    r["per_warpgroup"] = {
                        c: {"cycles_per_block": sum(x[2] for x in g) / (sum(x[3] for x in g) * blocks),
                            "in_burst_rate_per_warp": sum(x[3] for x in g) * blocks * BLOCK_INSTR[c] / sum(x[2] for x in g)}
                        for c, g in zip(codes, (sf[:4], sf[4:])) if g}
            key = r.get("mma_window", r.get("stream_window"))
            if rep and (best is None or key < best[0]):
                best = (key, r)
        return best[1]

    out = {"constants": dict(N=n, wgmma_per_trip=KB, iters=ITERS, per_block=PER_BLOCK, threads=threads,
                             ideal_wgmma_cycles=n / 2)}
    alone = once(1, 0, "fmul", 1, 0, 0)
    out["mma_alone"] = alone
    a = alone["wgmma_cycles_per_instr"]
    print(f"  wgmma alone: {a:.1f} cycles per wgmma", flush=True)
    if mma_gaps:
        out["duty"] = duty_sweep(once, ops, a, mma_gaps, stream_warps)
        return out
    for op in ops:
        for nsf in stream_warps:  # a pair with one warpgroup: its first code alone, from the same binary
            out[f"{op}_alone_F{nsf}"] = r = once(0, nsf, op, 1, 0, ALONE_TRIPS)
            print(f"  {op} F{nsf} alone: {r['cycles_per_block']:.1f} cycles per block, in-burst "
                  f"{r['in_burst_rate_per_warp']:.3f} warp-instr/clk/warp, "
                  f"{r['stream_rate_per_smsp']:.3f} per SMSP" + _per_wg(r), flush=True)
        for nsf in stream_warps:
            for blocks, gap in ((1, 0), (1, 1000), (4, 1000)):
                r = once(1, nsf, op, blocks, gap, CAP_TRIPS)
                lost = r["mma_window"] - a * r["wgmma"]
                r["tensor_cycles_lost"] = lost
                r["tensor_cycles_lost_per_instr_per_smsp"] = lost / (r["stream_warp_instr"] / 4)
                r["wgmma_slowdown"] = r["wgmma_cycles_per_instr"] / a
                out[f"{op}_F{nsf}_b{blocks}_gap{gap}"] = r
                print(f"  {op} F{nsf} {blocks} block(s) gap {gap:4d} ns: {r['cycles_per_block']:.1f} cycles per block, "
                      f"wgmma x{r['wgmma_slowdown']:.3f}, "
                      f"in-burst {r['in_burst_rate_per_warp']:.3f} warp-instr/clk/warp, {r['stream_rate_per_smsp']:.3f} per SMSP, "
                      f"duty {r['burst_duty']:.2f}, "
                      f"lost {r['tensor_cycles_lost_per_instr_per_smsp']:.3f} tensor cycles per instr per SMSP"
                      + _per_wg(r), flush=True)
    return out


def duty_sweep(once, ops, a, mma_gaps, stream_warps=(1, 2)) -> dict:
    """--mma-gaps: the stream codes run without gaps while the wgmma warpgroup sleeps `gap` ns
    after each trip of 8 (wait_group 0 first, so the tensor core really idles): their rate
    against the tensor core's busy share (wgmma cycles alone x wgmmas / window). fa4sim slows a
    piece of softmax work only while the tensor unit is busy: linear in the busy share between
    the code's rate alone and beside a full-rate wgmma (`linear_rate_per_smsp`)."""
    res = {}
    for op in ops:
        for nsf in stream_warps:
            alone = once(0, nsf, op, 1, 0, ALONE_TRIPS)
            full = None
            for gap in mma_gaps:
                r = once(1, nsf, op, 1, 0, CAP_TRIPS, gap)
                r["tensor_busy"] = a * r["wgmma"] / r["mma_window"]
                if full is None:  # the first gap (0): the full-rate reference
                    full = r
                lin = (r["tensor_busy"] / full["tensor_busy"]) * full["stream_rate_per_smsp"] + \
                    (1 - r["tensor_busy"] / full["tensor_busy"]) * alone["stream_rate_per_smsp"]
                r["linear_rate_per_smsp"] = lin
                res[f"{op}_F{nsf}_mmagap{gap}"] = r
                print(f"  {op} F{nsf} wgmma gap {gap:5d} ns: tensor busy {r['tensor_busy']:.2f}, "
                      f"{r['stream_rate_per_smsp']:.3f} warp-instr/clk per SMSP (linear in the busy share: "
                      f"{lin:.3f}; alone {alone['stream_rate_per_smsp']:.3f})", flush=True)
            res[f"{op}_F{nsf}_alone"] = alone
    return res


def _per_wg(r: dict) -> str:
    """A pair's per-warpgroup cycles per block and in-burst rate, for the console."""
    return "".join(f"; {c}: {v['cycles_per_block']:.1f} cycles per block, {v['in_burst_rate_per_warp']:.3f} per warp"
                   for c, v in r.get("per_warpgroup", {}).items())


def main(argv=None) -> int:
    import argparse
    import json
    import time

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results JSON (GPU run)")
    ap.add_argument("--check-sass", action="store_true", help="CPU: compile for sm_90a and check the SASS")
    ap.add_argument("--ops", default=",".join(OPS),
                    help=f"GPU: the burst codes to time, comma-separated (default all: {', '.join(OPS)})")
    ap.add_argument("--mma-gaps", default="",
                    help="GPU: a duty-cycle sweep instead of the bursts: the wgmma warpgroup sleeps this many "
                         "ns after each trip of 8 (comma-separated, start with 0, e.g. 0,200,500,1000,3000); "
                         "the --ops codes run continuously beside it")
    ap.add_argument("--stream-warps", default="1,2",
                    help="GPU: stream warps per scheduler to time each code with (stream warpgroups), "
                         "comma-separated from 1 2 3 (default 1,2; 3 uses a 512-thread build)")
    ap.add_argument("--inline", default="",
                    help="the O rescale as compiled: FMUL bursts inside the wgmma warpgroups, between their "
                         "1st and 2nd wgmma, at these N (comma-separated from 64, 128, 256); GPU with --out, "
                         "CPU with --check-sass")
    ap.add_argument("--wgmma-n", type=int, default=N, choices=WGMMA_N,
                    help=f"GPU: N of the running wgmma m64nNk16 (default {N}; FA3's QK^T and PV at head dim N)")
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    if not ops or set(ops) - set(OPS):
        ap.error(f"--ops: unknown code(s) {', '.join(sorted(set(ops) - set(OPS))) or '(none given)'}; "
                 f"allowed: {', '.join(OPS)}")
    try:
        gaps = [int(g) for g in args.mma_gaps.split(",") if g]
    except ValueError:
        ap.error(f"--mma-gaps: {args.mma_gaps!r}; allowed: comma-separated integers (ns), the first 0")
    if gaps and (gaps[0] != 0 or min(gaps) < 0):
        ap.error(f"--mma-gaps: {args.mma_gaps!r}; allowed: non-negative ns, the first 0 (the full-rate reference)")
    try:
        stream_warps = tuple(int(w) for w in args.stream_warps.split(",") if w)
    except ValueError:
        stream_warps = ()
    if not stream_warps or not set(stream_warps) <= {1, 2, 3}:
        ap.error(f"--stream-warps: {args.stream_warps!r}; allowed: comma-separated 1, 2, 3")
    if 3 in stream_warps and (args.wgmma_n > N or set(ops) & set(PAIRS)):
        ap.error("--stream-warps 3: the 512-thread build holds the wgmma at N <= 128 and no pair")
    try:
        inline = tuple(int(x) for x in args.inline.split(",") if x)
    except ValueError:
        inline = (0,)
    if not set(inline) <= set(WGMMA_N):
        ap.error(f"--inline: {args.inline!r}; allowed: comma-separated from {', '.join(map(str, WGMMA_N))}")
    if args.check_sass:
        return check_sass_inline(inline) if inline else check_sass()
    if not args.out:
        ap.error("--out FILE.json (GPU) or --check-sass (CPU)")
    from .common import Device
    from .run_all import meta

    t0 = time.perf_counter()
    dev = Device()
    if inline:
        bench = {"inline": {str(n): run_inline(dev, n) for n in inline}}
    else:
        bench = {"bursts": run(dev, ops, args.wgmma_n, gaps, stream_warps)}
    res = {"meta": meta("bursts"), "scripts": {"bursts": "bench_bursts.py"}, "benchmarks": bench}
    res["seconds"] = round(time.perf_counter() - t0, 2)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"[bursts] {res['seconds']} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
