"""Power and clock under sustained unit loads: the data fa4sim's power model is calibrated on.

A Hopper SXM card holds the clock its power cap (700 W) allows. fa4sim predicts that clock from
the activity of each unit (fa4sim/power.py); this benchmark measures, for loads that keep one
unit or a mix of units busy on every SM at a known rate, the SM clock they run at and the power
the board draws. lab/tools/calibrate/fit_power.py fits the profile's power parameters to it.
No attention kernel runs here: the attention timings only test the model.

Kernel (384 threads = 3 warpgroups, one CTA per SM, grid = the SM count):
  warpgroup 0: `iters` bursts of `burst` trips of {fence; 8 x wgmma m64nNk16 SS (K = 128); commit;
     wait_group(1)} (the tensor core never idles), or with `mma_gap_ns` > 0: wait_group(0) and
     nanosleep(gap) after each burst (a duty cycle); with `mma_gap_ns` < 0: wait_group(0) and a
     spin on clock64 for -mma_gap_ns cycles (a duty cycle of exact length and burst, no warp
     asleep); or nothing (do_mma = 0).
  warpgroups 1 .. `nsf`: trips of one block of a code, until warpgroup 0 is done (do_mma = 1) or
     `max_trips`: ffma (128 FFMA), ex2 (128 MUFU.EX2), int (64 LOP3 + 64 IADD3/IMAD), fmnmx (128
     FMNMX), stsm (32 STSM.16.M88.4, 16 KB), mix (bench_contention's softmax-like block: 35 FMNMX,
     97 FFMA/FADD/FMUL, 32 MUFU.EX2, 16 F2FP), sleep (nanosleep only: a clocked, idle SM).
  Every warp's lane 0 stamps clock64 and %globaltimer around its loop and counts its trips, so a
  load's activity per clock is counted, not assumed.
Two loads move memory instead, with bench_tma's ring of TMA box loads on every SM (the path
attention's K/V loads take): L2 hits (every CTA reads the same 2 MB) and HBM (disjoint parts of
1 GiB, through L2); their SM clock is NVML's (no in-kernel stamp). A torch copy is no stand-in:
its loads and stores through the registers cost the SM about 4 times the energy per byte.
The ring loads (RING_GAPS) put that ring inside the wgmma load's own CTAs (warp RING_WARP, beside
at most one stream warpgroup), so every SM runs the tensor core with HBM (or L2) traffic beside
it at a set rate: how a byte's energy changes where the cap slows the clock.

Each load runs ~4.5 s as back-to-back ~25 ms launches: 2 s for the power cap to settle the
clock, then a 2.5 s measured window whose power is the slope of NVML's energy counter over the
window (the mean of nvmlDeviceGetPowerUsage samples and the clock-event reasons beside it), and
whose clock is clock64 / globaltimer of its launches. A full-rate wgmma load first brings the
card to its working temperature (leakage grows with it).

    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_power --check-sass   # CPU, ~30 s
    source .gpu/setup-device.sh; python3 -m lab.tools.calibrate.bench_power --out P.json   # GPU, ~2 min
    python3 -m lab.tools.calibrate.fit_power P.json --profile fa4sim/profiles/h100.json --write
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
from cutlass.cute.nvgpu import cpasync, warpgroup  # noqa: E402

from .bench_bursts import nanosleep, stsm_x4  # noqa: E402
from .bench_contention import KB, KT, LOG2E, _mix_block, _tiled_mma, ex2_neg, lds_volatile, red_add_shared  # noqa: E402
from .bench_wgmma import _smem_layout  # noqa: E402
from .common import clk, compile_for_sass, f2bf16x2, ffma, fill_random_bf16, fmax, gtimer, only_loads, smem_addr, sts32  # noqa: E402,F401

THREADS = 384
WARPS = THREADS // 32
E = 32                 # registers per stream thread
SLOTS = 8              # int64 per warp: t0, t1, g0, g1, trips
CODES = {"sleep": 0, "ffma": 1, "ex2": 2, "int": 3, "fmnmx": 4, "stsm": 5, "mix": 6}
STSM_BYTES = 512
PBUF_WORDS = 8 * 8 * STSM_BYTES // 4   # 8 stream warps x 8 STSM slots x 512 B
SMEM_FLOOR = 120 * 1024                # > half an SM's shared memory: one CTA per SM
# what one warp's block of each code does, by unit (per warp instruction: 32 lanes;
# smem in bytes). fa4sim's units: FMNMX, F2FP, LOP3, IADD3 on the ALU pipe, FFMA/FADD/FMUL on FMA.
BLOCK = {"sleep": {},
         "ffma": {"fma_lane_ops": 128 * 32},
         "ex2": {"mufu_ops": 128 * 32},
         "int": {"alu_lane_ops": 128 * 32},
         "fmnmx": {"alu_lane_ops": 128 * 32},
         "stsm": {"smem_bytes": 32 * STSM_BYTES},
         "mix": {"alu_lane_ops": (35 + 16) * 32, "fma_lane_ops": 97 * 32, "mufu_ops": 32 * 32}}
SASS_PLAN = {"ffma": {"FFMA": 128}, "ex2": {"MUFU.EX2": 128}, "fmnmx": {"FMNMX": 128},
             "int": {"LOP3": 64}, "stsm": {"STSM": 32}, "mix": {"MUFU.EX2": 32, "FMNMX": 35}}
RING = 8                               # stages of the HBM ring inside the kernel (8 KB boxes)
RING_WARP = 8                          # the warp that runs it
LAUNCH_MS = 25.0
WARM_S = 2.0
MEASURE_S = 2.5


def make(code: str, n: int, rs: bool = False, ring: bool = False):
    """The load kernel for one stream code and wgmma width N (each compiles alone, so a code's
    registers do not depend on the others); rs: the wgmma's A from registers (RS: loaded once
    from the random shared-memory tile), as the backward's dV and dK and the forward's P V.
    ring: warp RING_WARP (warpgroup 2's first; so at most one stream warpgroup) keeps a ring of
    RING TMA box loads from HBM going in the same CTA, at most one box per `box_gap` cycles, until
    warpgroup 0 is done (or `max_trips` boxes): HBM traffic beside the tensor core on every SM, as
    attention moves its K/V (a 13th warp would leave wgmma N=256 too few registers). The host
    then takes the 1 GiB bf16 tensor to load from, each CTA's tile stride and its region mask."""
    op = CODES[code]
    from . import bench_tma as tma

    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, do_mma: Int32, nsf: Int32, iters: Int32,
               max_trips: Int32, mma_gap_ns: Int32, burst: Int32, tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout,
               sB_layout: cute.ComposedLayout, tma_atom, mT, r_layout, stride: Int32, region: Int32, box_gap: Int32):
        tid = cute.arch.thread_idx()[0]
        bid = cute.arch.block_idx()[0]
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        wtid = tid % 128
        lane = tid % 32

        @cute.struct
        class Storage:
            flag: cute.struct.MemRange[Int32, 4]
            sA: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sB_layout)], 1024]
            pbuf: cute.struct.Align[cute.struct.MemRange[Int32, PBUF_WORDS], 128]
            mbar: cute.struct.MemRange[Int64, RING if ring else 1]
            sR: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(r_layout) if ring else 8], 1024]

        storage = cutlass.utils.SmemAllocator().allocate(Storage)
        flag_addr = smem_addr(storage.flag.data_ptr())
        base = smem_addr(storage.sA.data_ptr())
        base_b = smem_addr(storage.sB.data_ptr())
        bars = storage.mbar.data_ptr()
        fill_random_bf16(base, cute.cosize(sA_layout) // 2, base_b,
                         (cute.cosize(sA_layout) + cute.cosize(sB_layout)) // 2, tid, THREADS, bid * 7919)
        if tid == 0:
            sts32(flag_addr, 0)
        if const_expr(ring):
            if warp == RING_WARP:
                cpasync.prefetch_descriptor(tma_atom)
            if tid == 0:
                for s in cutlass.range_constexpr(RING):
                    cute.arch.mbarrier_init(bars + s, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        thr_mma = tiled_mma.get_slice(wtid)
        wg_mma = tiled_mma.get_slice(0)
        if const_expr(rs):
            tCsA = thr_mma.partition_A(sA[None, None, 0])
            tCrA = thr_mma.make_fragment_A(tCsA)
            cute.autovec_copy(tCsA, tCrA)
        else:
            tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA[None, None, 0]))
        tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((64, n)), Float32)
        acc.fill(0.0)
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        total = Float32(0.0)
        t0 = Int64(0)
        t1 = Int64(0)
        g0 = Int64(0)
        g1 = Int64(0)
        trips = Int32(0)
        if wg == 0:
            if do_mma != 0:
                t0 = clk()
                g0 = gtimer()
                for _ in cutlass.range(iters, unroll=1):
                    for _b in cutlass.range(burst, unroll=1):  # a burst: `burst` trips back to back
                        warpgroup.fence()
                        for k in cutlass.range_constexpr(KB):
                            cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
                        warpgroup.commit_group()
                        warpgroup.wait_group(1)
                    if mma_gap_ns > 0:  # a duty cycle: the tensor core idles between bursts
                        warpgroup.wait_group(0)
                        nanosleep(mma_gap_ns)
                    elif mma_gap_ns < 0:  # ... for -mma_gap_ns cycles, spinning on clock64 (no sleep)
                        warpgroup.wait_group(0)
                        ts = clk()
                        while clk() - ts < Int64(-mma_gap_ns):
                            pass
                warpgroup.wait_group(0)
                t1 = clk()
                g1 = gtimer()
                trips = iters * burst
                if wtid == 0:
                    red_add_shared(flag_addr, 1)
                for i in cutlass.range_constexpr(cute.size(acc)):
                    total = total + acc[i]
        elif wg - 1 < nsf:
            s = Float32(1.0) + Float32(wtid) * Float32(1e-12)
            a = Float32(0.999)
            b = Float32(0.001)
            x = [Float32(wtid) * Float32(1e-3) + Float32(0.01 * j + 0.05) for j in range(E)]
            m = [Float32(0.0) for _ in range(4)]
            lsum = [Float32(0.0) for _ in range(4)]
            sc = Float32(LOG2E)
            nsc = Float32(-LOG2E)
            c4 = Float32(4.0)
            u = warp * 7 + 1
            uv = warp * 13 + nsf
            uw = warp + max_trips + 3
            go = Int32(1)
            p_lane = (smem_addr(storage.pbuf.data_ptr()) + (warp - 4) * 8 * STSM_BYTES
                      + (lane // 8) * 128 + (lane % 8) * 16)
            t0 = clk()
            g0 = gtimer()
            while go != 0:
                f = lds_volatile(flag_addr)
                if const_expr(op == 0):
                    nanosleep(2000)
                elif const_expr(op == 5):
                    for _u in cutlass.range_constexpr(4):
                        for k in cutlass.range_constexpr(E // 4):
                            stsm_x4(p_lane + k * STSM_BYTES, x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3])
                elif const_expr(op == 6):
                    x, m, lsum = _mix_block(x, m, lsum, sc, nsc, c4)
                elif const_expr(op == 3):
                    for _u in cutlass.range_constexpr(64):
                        u = (u ^ uv) + uw
                else:
                    for _u in cutlass.range_constexpr(4):
                        for j in cutlass.range_constexpr(E):
                            if const_expr(op == 1):
                                x[j] = ffma(x[j], a, b)
                            elif const_expr(op == 2):
                                x[j] = ex2_neg(x[j])
                            else:
                                x[j] = fmax(x[j], s)
                trips = trips + 1
                if do_mma != 0:
                    if f >= 1:
                        go = Int32(0)
                if trips >= max_trips:
                    go = Int32(0)
            t1 = clk()
            g1 = gtimer()
            for j in cutlass.range_constexpr(E):
                total = total + x[j]
            for j in cutlass.range_constexpr(4):
                total = total + m[j] + lsum[j]
            total = total + Float32(u)
        if const_expr(ring):
            if warp == RING_WARP:
                if lane == 0:
                    t0, t1, g0, g1, trips = _hbm_ring(tma_atom, mT, r_layout, storage.sR, bars, flag_addr, bid * stride,
                                                      region, box_gap, do_mma, max_trips)
        if lane == 0:
            o = (bid * WARPS + warp) * SLOTS
            stamps[o + 0] = t0
            stamps[o + 1] = t1
            stamps[o + 2] = g0
            stamps[o + 3] = g1
            stamps[o + 4] = Int64(trips)
        sink[bid * THREADS + tid] = total

    def layouts():
        sA_layout = _smem_layout(BFloat16, 64, KT, 2)
        sB_layout = _smem_layout(BFloat16, n, KT)
        smem = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) * 2 + 3072 + PBUF_WORDS * 4
        return sA_layout, sB_layout, smem

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, do_mma: Int32, nsf: Int32, iters: Int32,
             max_trips: Int32, mma_gap_ns: Int32, burst: Int32, ctas: Int32, stream):
        sA_layout, sB_layout, smem = layouts()
        kernel(stamps, sink, do_mma, nsf, iters, max_trips, mma_gap_ns, burst, _tiled_mma(rs, n), sA_layout,
               sB_layout, None, None, None, Int32(0), Int32(0), Int32(0)).launch(
            grid=[ctas, 1, 1], block=[THREADS, 1, 1], smem=max(smem, SMEM_FLOOR), stream=stream)

    @cute.jit
    def host_ring(stamps: cute.Tensor, sink: cute.Tensor, do_mma: Int32, nsf: Int32, iters: Int32,
                  max_trips: Int32, mma_gap_ns: Int32, burst: Int32, ctas: Int32, mG: cute.Tensor, stride: Int32,
                  region: Int32, box_gap: Int32, stream):
        sA_layout, sB_layout, smem = layouts()
        r_layout = tma._smem_layout(RING)
        tma_atom, tma_T = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mG,
                                                      cute.select(r_layout, mode=[0, 1]), (tma.BOX, tma.BOX), 1)
        smem = smem + RING * tma.TILE_BYTES + 2048
        kernel(stamps, sink, do_mma, nsf, iters, max_trips, mma_gap_ns, burst, _tiled_mma(rs, n), sA_layout,
               sB_layout, tma_atom, tma_T, r_layout, stride, region, box_gap).launch(
            grid=[ctas, 1, 1], block=[THREADS, 1, 1], smem=max(smem, SMEM_FLOOR), stream=stream)

    return host_ring if ring else host


@cute.jit
def _hbm_ring(tma_atom, mT, r_layout, sR_mem, bars, flag_addr, base: Int32, region: Int32, box_gap: Int32,
              do_mma: Int32, max_trips: Int32):
    """One thread keeps RING box loads in flight (bench_tma's ring), one box per box_gap cycles at
    most, tile base + (k & region) for the k-th box, until warpgroup 0 raises the flag (do_mma) or
    max_trips boxes; then waits for the last. Returns (t0, t1, g0, g1, boxes)."""
    from . import bench_tma as tma

    sR = sR_mem.get_tensor(r_layout.outer, swizzle=r_layout.inner)
    gT = cute.local_tile(mT, (tma.BOX, tma.BOX), (None, 0))
    tTs, tTg = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sR, 0, 2),
                                     cute.group_modes(gT, 0, 2))
    gap = Int64(box_gap)
    t0 = clk()
    g0 = gtimer()
    last = clk()
    for s in cutlass.range_constexpr(RING):
        while clk() - last < gap:
            pass
        last = clk()
        cute.arch.mbarrier_arrive_and_expect_tx(bars + s, tma.TILE_BYTES)
        cute.copy(tma_atom, tTg[None, base + (s & region)], tTs[None, s], tma_bar_ptr=bars + s)
    rounds = Int32(1)
    par = Int32(0)
    go = Int32(1)
    while go != 0:
        for s in cutlass.range_constexpr(RING):
            cute.arch.mbarrier_wait(bars + s, par)
            while clk() - last < gap:
                pass
            last = clk()
            cute.arch.mbarrier_arrive_and_expect_tx(bars + s, tma.TILE_BYTES)
            cute.copy(tma_atom, tTg[None, base + ((rounds * RING + s) & region)], tTs[None, s], tma_bar_ptr=bars + s)
        par = par ^ 1
        rounds = rounds + 1
        if do_mma != 0:
            if lds_volatile(flag_addr) >= 1:
                go = Int32(0)
        if rounds * RING >= max_trips:
            go = Int32(0)
    for s in cutlass.range_constexpr(RING):
        cute.arch.mbarrier_wait(bars + s, par)
    t1 = clk()
    g1 = gtimer()
    return t0, t1, g0, g1, rounds * RING


def fake_args(ctas: int = 132, ring: bool = False):
    from . import bench_tma as tma
    from .common import fake_stream, fake_tensor

    knobs = (Int32(1), Int32(2), Int32(10), Int32(10), Int32(0), Int32(1), Int32(ctas))
    if not ring:
        return (fake_tensor(Int64, (ctas * WARPS * SLOTS,)), fake_tensor(Float32, (ctas * THREADS,)), *knobs,
                fake_stream())
    return (fake_tensor(Int64, (ctas * WARPS * SLOTS,)), fake_tensor(Float32, (ctas * THREADS,)), *knobs,
            fake_tensor(BFloat16, (tma.ROWS, tma.BOX)), Int32(992), Int32(511), Int32(0), fake_stream())


# ----------------------------------------------------------------------------- the loads
# name -> (stream code, wgmma on, N, wgmma gap (ns > 0, cycles < 0), stream warpgroups, what[, burst])
LOADS = {
    "sleep": ("sleep", 0, 256, 0, 2, "every SM clocked, its warps asleep (no unit busy)"),
    "tensor256": ("sleep", 1, 256, 0, 0, "wgmma m64n256k16 SS back to back (tensor core always busy)"),
    "tensor256_gap100": ("sleep", 1, 256, 100, 0, "the same with 100 ns asleep after each 8 wgmma"),
    "tensor256_gap300": ("sleep", 1, 256, 300, 0, "... 300 ns"),
    "tensor256_gap1000": ("sleep", 1, 256, 1000, 0, "... 1000 ns"),
    "tensor256_gap2000": ("sleep", 1, 256, 2000, 0, "... 2000 ns"),
    "tensor256_gap6000": ("sleep", 1, 256, 6000, 0, "... 6000 ns"),
    "tensor128": ("sleep", 1, 128, 0, 0, "wgmma m64n128k16 SS back to back (more smem bytes per FLOP)"),
    "tensor64": ("sleep", 1, 64, 0, 0, "wgmma m64n64k16 SS back to back (1.6x tensor256's smem bytes per FLOP: "
                                       "the backward's narrow GEMMs)"),
    "tensor64+mix2": ("mix", 1, 64, 0, 2, "wgmma N=64 back to back beside two softmax-like warpgroups"),
    # the N of attention tiles that are not a power of two (QK's tile_n, PV's hdim): hd96 144 / 96,
    # hd192 112 / 192 (checks of the fitted model, not fitted)
    "tensor96": ("sleep", 1, 96, 0, 0, "wgmma m64n96k16 SS back to back"),
    "tensor112": ("sleep", 1, 112, 0, 0, "wgmma m64n112k16 SS back to back"),
    "tensor144": ("sleep", 1, 144, 0, 0, "wgmma m64n144k16 SS back to back"),
    "tensor192": ("sleep", 1, 192, 0, 0, "wgmma m64n192k16 SS back to back"),
    "tensor128_rs": ("sleep", 1, 128, 0, 0, "wgmma m64n128k16 RS back to back (A from registers)", 1, True),
    "tensor64_rs": ("sleep", 1, 64, 0, 0, "wgmma m64n64k16 RS back to back (A from registers)", 1, True),
    "ffma": ("ffma", 0, 256, 0, 2, "FFMA from 8 warps per SM (2 per scheduler)"),
    "ex2": ("ex2", 0, 256, 0, 2, "MUFU.EX2 from 8 warps per SM"),
    "int": ("int", 0, 256, 0, 2, "LOP3 + IADD3/IMAD from 8 warps per SM"),
    "fmnmx": ("fmnmx", 0, 256, 0, 2, "FMNMX from 8 warps per SM"),
    "stsm": ("stsm", 0, 256, 0, 2, "STSM.16.M88.4 (shared-memory stores) from 8 warps per SM"),
    "mix": ("mix", 0, 256, 0, 2, "a softmax-like mix (MUFU, FMA, ALU) from 8 warps per SM"),
    "tensor256+mix1": ("mix", 1, 256, 0, 1, "wgmma N=256 back to back beside one softmax-like warpgroup"),
    "tensor256+mix2": ("mix", 1, 256, 0, 2, "wgmma N=256 back to back beside two softmax-like warpgroups"),
    "tensor128+mix2": ("mix", 1, 128, 0, 2, "wgmma N=128 back to back beside two softmax-like warpgroups"),
    "tensor256_gap1000+mix2": ("mix", 1, 256, 1000, 2, "wgmma N=256 at a duty cycle beside two softmax-like warpgroups"),
    # duty cycle x burst length: 1 trip = 8 wgmma N=256 = 1024 tensor-core cycles; the gap spins
    # on clock64 for burst x 1024 x (1 - duty) / duty cycles (attention's tensor core works in
    # bursts of a few hundred to a few thousand cycles beside its softmax)
    **{f"tensor256_d{d}_b{b}{'+mix2' if m else ''}":
       ("mix" if m else "sleep", 1, 256, -round(b * 1024 * (100 - d) / d), 2 if m else 0,
        f"wgmma N=256 in bursts of {b} x 1024 cycles at {d} % duty (clock64 spin between)"
        + (" beside two softmax-like warpgroups" if m else ""), b)
       for m in (False, True) for d in (90, 75, 50) for b in (1, 8, 64)},
    "tensor128+ffma": ("ffma", 1, 128, 0, 2, "wgmma N=128 beside two FFMA warpgroups"),
    "tma_l2": (None, 0, 0, 0, 0, "TMA box loads on every SM from the same 2 MB (L2 hits into shared memory)"),
    "tma_hbm": (None, 0, 0, 0, 0, "TMA box loads on every SM from disjoint parts of 1 GiB (HBM through L2)"),
    # memory at a share of the SMs (the rest idle, no CTA), and beside a tensor
    # load held by the cap on the other SMs: attention moves its bytes at a third of the HBM's
    # rate or less, beside a tensor core the cap slows ("A|B": kernel load | memory load, layout)
    "tma_hbm_half": (None, 0, 0, 0, 0, "tma_hbm on half the SMs"),
    "tma_hbm_quarter": (None, 0, 0, 0, 0, "tma_hbm on a quarter of the SMs"),
    "tma_l2_half": (None, 0, 0, 0, 0, "tma_l2 on half the SMs"),
    "tensor256+mix2_half": ("mix", 1, 256, 0, 2, "tensor256+mix2 on half the SMs, the others idle"),
    "tensor256+mix2|tma_hbm_half": ("mix", 1, 256, 0, 2, "tensor256+mix2 on half the SMs, tma_hbm on the other half"),
    "tensor256|tma_hbm_half": ("sleep", 1, 256, 0, 0, "tensor256 on half the SMs, tma_hbm on the other half"),
    "tensor256+mix2|tma_l2_half": ("mix", 1, 256, 0, 2, "tensor256+mix2 on half the SMs, tma_l2 on the other half"),
    "tensor256+mix2|tma_hbm_quarter": ("mix", 1, 256, 0, 2, "tensor256+mix2 on three quarters of the SMs, "
                                                            "tma_hbm on a quarter"),
    # HBM traffic inside the tensor load's own CTAs, every SM (RING_GAPS: one box per that many
    # cycles at most): a capped tensor core with attention's kind of K/V stream beside it
    "tensor256+mix1+hbm": ("mix", 1, 256, 0, 1, "wgmma N=256 beside one softmax-like warpgroup and a ring of TMA "
                                                 "loads from HBM in the same CTA, as fast as it goes"),
    **{f"tensor256+mix1+hbm_g{g}": ("mix", 1, 256, 0, 1, f"the same, one 8 KB box per {g} cycles at most")
       for g in (500, 1000, 2000)},
    "tensor256+hbm_g1000": ("sleep", 1, 256, 0, 0, "wgmma N=256 beside the ring, one box per 1000 cycles at most"),
    "hbm_ring": ("sleep", 0, 256, 0, 0, "the ring alone (no wgmma), as fast as it goes"),
    "hbm_ring_g1000": ("sleep", 0, 256, 0, 0, "the ring alone, one box per 1000 cycles at most"),
    "tensor256+mix1+l2": ("mix", 1, 256, 0, 1, "wgmma N=256 beside one softmax-like warpgroup and the ring, "
                                                "every CTA loading the same 2 MB (L2 hits)"),
    "l2_ring": ("sleep", 0, 256, 0, 0, "the L2 ring alone (no wgmma)"),
    "tensor256_again": ("sleep", 1, 256, 0, 0, "tensor256 once more at the end (drift, temperature)"),
}
# loads with the TMA ring inside the kernel -> its box gap (cycles; 0: as fast as it goes)
RING_GAPS = {"tensor256+mix1+hbm": 0, **{f"tensor256+mix1+hbm_g{g}": g for g in (500, 1000, 2000)},
             "tensor256+hbm_g1000": 1000, "hbm_ring": 0, "hbm_ring_g1000": 1000, "tensor256+mix1+l2": 0, "l2_ring": 0}


# share of the SMs a memory load runs on, by its name's suffix
SHARES = {"": 1.0, "_half": 0.5, "_quarter": 0.25}


def layout(name: str, nsm: int) -> tuple:
    """(CTAs of the kernel load or None, the memory load's name or None, its CTAs) for a load
    name: "A|B" runs kernel load A and memory load B side by side on disjoint SMs, B on its
    share of them (SHARES) and A on the rest; "A_half" runs A alone on half of them."""
    first, _, mem = name.partition("|")
    if first.startswith("tma_"):
        return None, first, round(nsm * share(first))
    if mem:
        m = round(nsm * share(mem))
        return nsm - m, mem, m
    return round(nsm * share(first)), None, 0


def share(name: str) -> float:
    """The share of the SMs a load's name asks for (tma_hbm_quarter: 0.25)."""
    return next(v for k, v in sorted(SHARES.items(), key=lambda kv: -len(kv[0])) if name.endswith(k))


def flops_per_wgmma(n):
    return 2 * 64 * n * 16


def smem_bytes_per_wgmma(n, rs=False):
    """A (64 x 16, none when RS) and B (N x 16) bf16 from shared memory, as fa4sim's
    tensor_core.mma_cost counts."""
    return (0 if rs else 64 * 16 * 2) + n * 16 * 2


# ----------------------------------------------------------------------------- CPU: SASS check
def check_build(code: str, n: int, rs: bool = False, ring: bool = False) -> tuple[bool, str]:
    """(ok, one line): a build's wgmma loop holds its 8 HGMMA, its stream loop the planned
    instructions, its ring (if any) one UTMALDG per stage, and its registers fit THREADS."""
    from fa4kernel.sass import loop_bodies

    sass, regs = compile_for_sass(make(code, n, rs, ring), *fake_args(ring=ring), with_registers=True)
    plan = SASS_PLAN.get(code, {})
    found_mma = found_code = found_ring = False
    for _, ops in loop_bodies(sass, operands=True):
        c = {}
        for o in ops:
            key = o.split()[0]
            key = "MUFU.EX2" if key.startswith("MUFU.EX2") else key.split(".")[0]
            c[key] = c.get(key, 0) + 1
        # an RS HGMMA names its A registers (R...) where SS has a descriptor (gdesc)
        if c.get("HGMMA", 0) == KB and any(f"HGMMA.64x{n}x16" in o and ("gdesc" in o.split(",")[1]) != rs
                                           for o in ops if o.startswith("HGMMA")):
            found_mma = True
        if plan and all(c.get(k, 0) == v for k, v in plan.items()):
            found_code = True
        if c.get("UTMALDG", 0) == RING:  # the ring's steady loop: one box load per stage
            found_ring = True
    good = (bool(regs) and ((regs + 7) // 8 * 8) * THREADS <= 65536 and found_mma and (found_code or not plan)
            and found_ring == ring)
    return good, (f"{'ok' if good else 'BAD'} {code:6s} N={n}{' RS' if rs else ''}{' +HBM ring' if ring else ''} "
                  f"regs={regs}: wgmma loop {found_mma}, {code} loop {found_code if plan else '(none planned)'}"
                  + (f", ring loop {found_ring}" if ring else ""))


def check_sass() -> int:
    """Every build: check_build."""
    builds = [(c, 256, False) for c in CODES] + [("sleep", 128, False), ("mix", 128, False), ("ffma", 128, False),
                                                 ("sleep", 64, False), ("mix", 64, False), ("sleep", 128, True),
                                                 ("sleep", 64, True)] + [("sleep", n, False) for n in (96, 112, 144, 192)]
    builds = [(*b, False) for b in builds] + [("mix", 256, False, True), ("sleep", 256, False, True)]
    ok = True
    for build in builds:
        good, line = check_build(*build)
        ok = ok and good
        print(line, flush=True)
    return 0 if ok else 1


# ----------------------------------------------------------------------------- GPU
def supported_sm_clocks_mhz() -> list[int]:
    """The SM clocks the driver lists for the highest memory clock (nvidia-smi -q -d SUPPORTED_CLOCKS)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-q", "-d", "SUPPORTED_CLOCKS"], capture_output=True, text=True,
                             timeout=30).stdout
    except Exception:  # noqa: BLE001
        return []
    clocks, first_mem = [], True
    for line in out.splitlines():
        s = line.strip()
        if s.startswith("Memory") and ":" in s:
            if clocks:
                break  # the first memory clock's list is the highest one's
            first_mem = False
        elif s.startswith("Graphics") and ":" in s and not first_mem:
            try:
                clocks.append(int(s.split(":")[1].split()[0]))
            except (ValueError, IndexError):
                pass
    return sorted(set(clocks))


def _window(nvml, torch, e_start, e_end):
    """Wait until e_start completes, then sample NVML every ~5 ms until e_end completes.
    Power is the least-squares slope of the energy counter against host time (the counter moves
    in coarse steps; a slope over hundreds of samples averages them out), with the plain
    difference and the mean of the power readings kept beside it."""
    import time

    while not e_start.query():
        time.sleep(0.0005)
    ts, js, pw, mhz, reasons = [], [], [], [], {}
    while not e_end.query():
        t, mj = time.perf_counter(), nvml.energy_mj()
        j = None if mj is None else mj / 1e3
        if j is not None:
            ts.append(t)
            js.append(j)
        pw.append(nvml.power_w())
        mhz.append(nvml.sm_mhz())
        r = nvml.event_reasons()
        if r is not None:
            reasons[r] = reasons.get(r, 0) + 1
        time.sleep(0.005)
    torch.cuda.synchronize()
    secs = (ts[-1] - ts[0]) if len(ts) > 1 else 0.0
    slope = diff = None
    if len(ts) > 10 and secs > 0:
        n = len(ts)
        mt, mj = sum(ts) / n, sum(js) / n
        slope = sum((t - mt) * (j - mj) for t, j in zip(ts, js)) / sum((t - mt) ** 2 for t in ts)
        diff = (js[-1] - js[0]) / secs
    return {"seconds": secs, "power_w": slope, "power_w_energy_diff": diff,
            "power_w_samples": (sum(p for p in pw if p) / max(1, len([p for p in pw if p]))) or None,
            "clock_ghz_nvml": (sum(m for m in mhz if m) / max(1, len([m for m in mhz if m])) / 1e3) or None,
            "temperature_c": nvml.temperature_c(),
            "clock_event_reasons": {hex(k): v for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])}}


def kernel_load(dev, nvml, name, spec, nsm, beside=None):
    """A bench_power kernel load on `nsm` CTAs (one per SM), sustained. beside: a TmaStream whose
    launches run on another stream, on other SMs, from before the warm-up to past the measured
    window (a split load); its bytes within the window join the activity."""
    import time

    from cutlass import Int32 as I32

    torch = dev.torch
    own = torch.cuda.current_stream()
    code, do_mma, n, gap, nsf, what, burst, rs = (*spec, *(1, False)[len(spec) - 6:])
    box_gap = RING_GAPS.get(name.partition("|")[0])
    if box_gap is not None and nsf > 1:
        raise ValueError(f"{name}: the HBM ring takes warpgroup 2's first warp; stream warpgroups must be 0 or 1")
    key = ("power", code, n, rs, box_gap is not None)
    fn = make(code, n, rs, box_gap is not None)
    words = nsm * WARPS * SLOTS
    sink = torch.zeros(nsm * THREADS, dtype=torch.float32, device="cuda")
    probe = torch.zeros(words, dtype=torch.int64, device="cuda")
    ring = []
    l2_ring = "l2" in name.partition("|")[0]
    if box_gap is not None:  # the tiles as TmaStream's
        from . import bench_tma as tma

        stride, region = tma_tiles(l2_ring, nsm)
        g = torch.randn(tma.ROWS, tma.BOX, device="cuda").to(torch.bfloat16)
        ring = [g, I32(stride), I32(region), I32(box_gap)]

    def args(stamps, iters, trips):
        return [dev.ct(stamps), dev.ct(sink), I32(do_mma), I32(nsf), I32(iters), I32(trips), I32(gap), I32(burst),
                I32(nsm), *([dev.ct(ring[0]), *ring[1:]] if ring else [])]

    # size one launch to ~LAUNCH_MS from a short one, then again once the load has run WARM_S
    # seconds (the short one runs while the clock still ramps up from idle, so it sizes short)
    iters0, trips0 = (max(1, 400 // burst), 1 << 30) if do_mma else (0, 4000)
    dev.call(key, fn, probe, sink, I32(do_mma), I32(nsf), I32(iters0), I32(trips0), I32(gap), I32(burst), I32(nsm),
             *ring)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    side = torch.cuda.Stream()
    if beside is not None:  # its launches outlast the warm-up and the window (they only slow down beside us)
        with torch.cuda.stream(side):
            side_events = beside.enqueue(WARM_S + MEASURE_S + 2.0)

    def sized(iters, trips):
        e0.record()
        dev.cache[key](*args(probe, iters, trips), dev.stream())
        e1.record()
        own.synchronize()
        scale = LAUNCH_MS / max(e0.elapsed_time(e1), 1e-3)
        return (max(1, int(iters * scale)), 1 << 30) if do_mma else (0, max(1, int(trips * scale)))

    iters, trips = sized(iters0, trips0)
    warm_until = time.perf_counter() + WARM_S
    while time.perf_counter() < warm_until:
        dev.cache[key](*args(probe, iters, trips), dev.stream())
        own.synchronize()
    iters, trips = sized(iters, trips)
    n_meas = max(2, int(MEASURE_S * 1e3 / LAUNCH_MS))
    stamps = torch.zeros(n_meas * words, dtype=torch.int64, device="cuda")
    meas_args = [args(stamps[i * words:(i + 1) * words], iters, trips) for i in range(n_meas)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for a in meas_args:
        dev.cache[key](*a, dev.stream())
    end.record()
    w = _window(nvml, torch, start, end)
    moved = beside.bytes_within(side_events, start, end) / (start.elapsed_time(end) / 1e3) if beside else 0.0
    st = stamps.view(n_meas, nsm, WARPS, SLOTS).cpu()
    # per launch and CTA: the window of its active warps (lane-0 stamps; t1 > t0)
    t0, t1, g0, g1, tr = (st[..., i] for i in range(5))
    active = t1 > t0
    cyc = torch.where(active, t1 - t0, torch.zeros_like(t0))
    ns = torch.where(active, g1 - g0, torch.zeros_like(g0))
    lo = torch.where(active, t0, torch.full_like(t0, 2 ** 62)).min(dim=2).values
    hi = torch.where(active, t1, torch.zeros_like(t1)).max(dim=2).values
    cta_cycles = (hi - lo).double()                    # [launch, cta]
    clock_ghz = float(cyc.sum()) / float(ns.sum())
    mean_cta_cycles = float(cta_cycles.mean(dim=1).sum())  # summed over launches
    trips_by_wg = tr.view(n_meas, nsm, 3, 4).double().sum(dim=3) / 4  # per warp -> per warpgroup mean x 1
    act = {"tensor_flops": 0.0, "smem_bytes": 0.0, "mufu_ops": 0.0, "fma_lane_ops": 0.0, "alu_lane_ops": 0.0,
           "l2_bytes": 0.0, "hbm_bytes": 0.0}
    if do_mma:
        wgmmas = float(trips_by_wg[:, :, 0].sum()) * KB  # warpgroup 0's trips x 8
        act["tensor_flops"] = wgmmas * flops_per_wgmma(n) / mean_cta_cycles
        act["smem_bytes"] += wgmmas * smem_bytes_per_wgmma(n, rs) / mean_cta_cycles
    stream_warp_blocks = float(tr.view(n_meas, nsm, WARPS)[:, :, 4:4 + 4 * nsf].sum())
    for k, v in BLOCK[code].items():
        act[k] += stream_warp_blocks * v / mean_cta_cycles
    extra = {}
    if ring:  # the ring warp's boxes, through L2 from HBM
        boxes = float(tr[:, :, RING_WARP].sum())
        act["l2_bytes"] = boxes * tma.TILE_BYTES / mean_cta_cycles
        act["hbm_bytes"] = 0.0 if l2_ring else act["l2_bytes"]
        span_s = start.elapsed_time(end) / 1e3
        extra = {"ring_box_gap_cycles": box_gap, "ring_bytes_per_s": boxes * tma.TILE_BYTES / span_s}
    if beside is not None:  # the memory load's bytes per SM clock, at the clock counted in our kernel
        mem = beside.activity(moved, clock_ghz)
        act["l2_bytes"], act["hbm_bytes"] = mem["l2_bytes"], mem["hbm_bytes"]
        extra = {"beside": beside.name, "beside_ctas": beside.ctas, "beside_bytes_per_s": moved}
    return settle({"name": name, "what": what, "clock_ghz": clock_ghz, **w, "ctas": nsm, **extra,
            "activity_per_clk": act, "launches_measured": n_meas, "launch_ms": LAUNCH_MS,
            "iters": iters, "max_trips": trips, "wgmma_n": n if do_mma else None, "wgmma_rs": bool(rs and do_mma),
            "mma_gap_ns": gap if gap > 0 else 0,
            "mma_gap_cycles": -gap if gap < 0 else 0, "burst_trips": burst, "stream_warpgroups": nsf, "code": code,
            "sink_finite": bool(torch.isfinite(sink).all().item())})


POWER_CAP_REASON = 0x4  # nvmlClocksEventReasonSwPowerCap


def settle(load: dict) -> dict:
    """Which clock a load ran at. Where NVML names the power cap as the reason the clock is
    below its maximum, clock64 / globaltimer and NVML agree within ~1 % (H100); where NVML names
    no reason and reads the maximum clock, clock64 of warps that spend most of their time in
    nanosleep counts 5-12 % fewer cycles than globaltimer's nanoseconds x that clock (clock64
    seems to stop while every warp of the SM sleeps). So the clock of a load is NVML's where warps
    sleep and the cap does not hold the clock, and the in-kernel one otherwise (a tensor load
    whose gaps spin on clock64 runs up to ~13 % below NVML's clock with no reason given); the
    activity per clock is rescaled to it, keeping the operations per nanosecond that were
    counted. Idempotent: a settled load settles again from its in-kernel counts."""
    reasons = load.get("clock_event_reasons") or {}
    capped = sum(v for k, v in reasons.items() if int(k, 16) & POWER_CAP_REASON)
    in_kernel = load.get("clock_ghz_in_kernel", load.get("clock_ghz"))
    load["clock_ghz_in_kernel"] = in_kernel
    load["power_capped"] = capped * 2 > sum(reasons.values())
    # only warps asleep stop clock64: a load with no warp in nanosleep keeps its in-kernel clock,
    # capped or not (on the H200 it runs ~10 % below NVML's under any tensor load)
    sleeps = (load.get("mma_gap_ns") or 0) > 0 or (load.get("code") == "sleep" and (load.get("stream_warpgroups") or 0) > 0)
    # the HBM ring alone: its one thread mostly waits on mbarriers, the SM's other warps are gone
    sleeps = sleeps or (load.get("ring_box_gap_cycles") is not None and not load.get("wgmma_n"))
    use = in_kernel if (load["power_capped"] or not load.get("clock_ghz_nvml") or not sleeps) else load["clock_ghz_nvml"]
    if "activity_per_clk_in_kernel" in load:  # settled before: start again from the kernel's counts
        load["activity_per_clk"] = dict(load["activity_per_clk_in_kernel"])
    if in_kernel and use:
        load["activity_per_clk_in_kernel"] = dict(load["activity_per_clk"])
        load["activity_per_clk"] = {k: v * in_kernel / use for k, v in load["activity_per_clk"].items()}
    load["clock_ghz"] = use
    return load


def tma_tiles(l2: bool, ctas: int) -> tuple[int, int]:
    """(stride, region mask) of bench_tma's ring, CTA b loading tiles b * stride + (k & region):
    every CTA over the same 2 MB (l2: L2 hits), or each over its own power-of-two region of the
    1 GiB tensor (every byte from HBM, through L2)."""
    from . import bench_tma as tma

    if l2:
        return 0, 255
    stride = (tma.ROWS // tma.BOX) // ctas
    return stride, (1 << (stride.bit_length() - 1)) - 1


class TmaStream:
    """bench_tma's ring of TMA box loads on `ctas` SMs, one CTA each, sized to ~LAUNCH_MS per
    launch: the L2 -> shared-memory path attention's K/V loads take (no register traffic, unlike
    a copy kernel). tma_l2*: every CTA cycles over the same 2 MB (L2 hits); tma_hbm*: each CTA
    cycles over its own power-of-two region of a 1 GiB tensor, 0.5 GiB in all (every byte from
    HBM, and through L2)."""

    def __init__(self, dev, name: str, ctas: int):
        from cutlass import Int32 as I32

        from . import bench_tma as tma

        torch = dev.torch
        self.dev, self.name, self.ctas, self.tma = dev, name, ctas, tma
        self.g = torch.randn(tma.ROWS, tma.BOX, device="cuda").to(torch.bfloat16)
        self.stamps = torch.zeros(8192, dtype=torch.int64, device="cuda")
        self.stride, self.region = tma_tiles(name.startswith("tma_l2"), ctas)
        n0 = tma.STAGES * 200
        dev.call(("tma", "power"), tma.make(), self.g, self.stamps, I32(1), I32(n0), I32(1), I32(self.stride),
                 I32(self.region), I32(ctas))
        ms = self.time_ms(n0)
        self.n = max(tma.STAGES, int(n0 * LAUNCH_MS / ms) // tma.STAGES * tma.STAGES)
        self.ms = self.time_ms(self.n)
        self.bytes_per_launch = ctas * self.n * tma.TILE_BYTES

    def args(self, n):
        from cutlass import Int32 as I32

        return [self.dev.ct(self.g), self.dev.ct(self.stamps), I32(1), I32(n), I32(1), I32(self.stride),
                I32(self.region), I32(self.ctas)]

    def time_ms(self, n) -> float:
        torch = self.dev.torch
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        self.dev.cache[("tma", "power")](*self.args(n), self.dev.stream())
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1)

    def enqueue(self, seconds: float) -> list:
        """Launches covering ~`seconds` on the current stream; (start, end) timing events of each."""
        torch = self.dev.torch
        args, out = self.args(self.n), []
        for _ in range(max(1, int(seconds * 1e3 / self.ms))):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            self.dev.cache[("tma", "power")](*args, self.dev.stream())
            e1.record()
            out.append((e0, e1))
        return out

    def bytes_within(self, events: list, start, end) -> float:
        """Bytes moved between timing events start and end (another stream's), each launch's
        bytes spread evenly over its span."""
        span = start.elapsed_time(end)
        moved = 0.0
        for e0, e1 in events:
            a, b = start.elapsed_time(e0), start.elapsed_time(e1)
            if b > a:
                moved += self.bytes_per_launch * max(0.0, min(b, span) - max(a, 0.0)) / (b - a)
        return moved

    def activity(self, bytes_per_s: float, f_ghz: float) -> dict:
        act = {"tensor_flops": 0.0, "smem_bytes": 0.0, "mufu_ops": 0.0, "fma_lane_ops": 0.0, "alu_lane_ops": 0.0,
               "l2_bytes": bytes_per_s / (f_ghz * 1e9) if f_ghz else 0.0, "hbm_bytes": 0.0}
        if self.name.startswith("tma_hbm"):
            act["hbm_bytes"] = act["l2_bytes"]
        return act


def tma_load(dev, nvml, name, what, ctas):
    """A TmaStream alone (the other SMs idle), sustained; its SM clock is NVML's (no in-kernel stamp)."""
    torch = dev.torch
    ts = TmaStream(dev, name, ctas)
    for _ in range(max(1, int(WARM_S * 1e3 / ts.ms))):
        dev.cache[("tma", "power")](*ts.args(ts.n), dev.stream())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    events = ts.enqueue(MEASURE_S)
    end.record()
    w = _window(nvml, torch, start, end)
    moved = ts.bytes_within(events, start, end) / (start.elapsed_time(end) / 1e3)
    return {"name": name, "what": what, "clock_ghz": w["clock_ghz_nvml"], "clock_ghz_in_kernel": None, **w,
            "power_capped": False, "activity_per_clk": ts.activity(moved, w["clock_ghz_nvml"]), "bytes_per_s": moved,
            "ctas": ctas}


def run(only=()) -> dict:
    import time

    from lab.tools.nvml_clock import NvmlDevice

    from .common import Device
    from .run_all import meta

    dev = Device()
    torch = dev.torch
    nvml = NvmlDevice()
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    time.sleep(1.0)
    idle = {"power_w": nvml.power_w(), "sm_mhz": nvml.sm_mhz(), "temperature_c": nvml.temperature_c()}
    out = {"meta": {**meta("power"), "kind": "power"},
           "gpu": {"power_limit_w": nvml.power_limit_w(), "clock_max_mhz": nvml.max_sm_mhz(),
                   "supported_clocks_mhz": supported_sm_clocks_mhz(), "idle_power_w": idle["power_w"],
                   "idle": idle, "num_sms": nsm},
           "method": f"each load: back-to-back ~{LAUNCH_MS:.0f} ms launches on every SM, {WARM_S} s to settle, then "
                     f"{MEASURE_S} s measured: power = slope of NVML's energy counter against host time over the window; "
                     f"clock = sum of clock64 / sum of globaltimer over every active warp of the measured launches; "
                     f"activity = counted operations / the mean CTA window in cycles (chip-wide per SM clock)",
           "loads": []}
    if not only:  # bring the card to its working temperature first (leakage grows with it)
        r = kernel_load(dev, nvml, "heat", LOADS["tensor256"], nsm)
        out["heat"] = {k: r[k] for k in ("clock_ghz", "power_w", "temperature_c")}
        print(f"  heat-up: {r['clock_ghz']:.3f} GHz, {r['power_w'] or 0:.0f} W, {r['temperature_c']} C", flush=True)
    for name, spec in LOADS.items():
        if only and name not in only:
            continue
        t = time.perf_counter()
        try:
            ctas, mem, mem_ctas = layout(name, nsm)
            if ctas is None:
                r = tma_load(dev, nvml, name, spec[-1], mem_ctas)
            else:
                r = kernel_load(dev, nvml, name, spec, ctas, TmaStream(dev, mem, mem_ctas) if mem else None)
        except Exception as e:  # noqa: BLE001 - one failed load must not lose the others
            out["loads"].append({"name": name, "error": repr(e)[:500]})
            print(f"  {name}: FAILED {e!r}"[:300], flush=True)
            continue
        out["loads"].append(r)
        a = r["activity_per_clk"]
        print(f"  {name:22s} clock {r['clock_ghz'] or r['clock_ghz_nvml'] or 0:.3f} GHz  power "
              f"{r['power_w'] or 0:6.1f} W (samples {r['power_w_samples'] or 0:6.1f})  {r['temperature_c']} C  "
              f"tensor {a['tensor_flops'] / nsm:7.1f} FLOP/clk/SM  mufu {a['mufu_ops'] / nsm:5.2f}  "
              f"fma {a['fma_lane_ops'] / nsm:6.1f}  alu {a['alu_lane_ops'] / nsm:5.1f}  smem {a['smem_bytes'] / nsm:5.1f} B  "
              f"l2 {a['l2_bytes']:7.0f} B  hbm {a['hbm_bytes']:6.0f} B/clk  ({time.perf_counter() - t:.1f} s)", flush=True)
    return out


def main(argv=None) -> int:
    import argparse
    import json
    import time

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results JSON (GPU run)")
    ap.add_argument("--check-sass", action="store_true", help="CPU: compile for sm_90a and check the SASS")
    ap.add_argument("--only", default="", help=f"GPU: comma-separated subset of the loads ({', '.join(LOADS)})")
    args = ap.parse_args(argv)
    only = only_loads(ap, args.only, LOADS)
    if args.check_sass:
        return check_sass()
    if not args.out:
        ap.error("--out FILE.json (GPU) or --check-sass (CPU)")
    t0 = time.perf_counter()
    res = run(only)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"[power] {res['seconds']} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
