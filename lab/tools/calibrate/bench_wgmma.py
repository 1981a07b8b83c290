"""wgmma (HGMMA) m64nNk16 bf16 -> fp32: throughput, completion latency and issue time on one SM.

Kernel per (N, SS|RS); 2 warpgroups for N=256 (register file), 3 otherwise; runtime knobs:
 mode 0 (throughput): the first `nwg` warpgroups each run `iters` trips of
   fence; 8 x wgmma m64nNk16 (K = 128 from a 64x128 A tile of its own, B = N x 128 shared);
   commit; wait_group(1)   (the CUTLASS mainloop shape: one group in flight behind the issue)
   and stamp clock64 + globaltimer before/after (lane 0 of each WG). grid = `ctas` (1 for the
   per-SM rate; 132 with a long loop for the sustained clock under tensor load).
 mode 1 (latency): warpgroup 0 alone, `iters` samples of, for nk in 1, 2, 4, 8:
   t0; fence; nk chained wgmma; commit; t_issue; wait_group(0); t1   (nk = 1 .. 16)
   -> issue time (t_issue - t0) and completion latency (t1 - t0) per nk; where the issue time
   jumps from a few cycles per instruction to the execution interval, the queue is full.
Operands are pseudo-random bf16 in [-2, 2] written to smem by the threads (fence.proxy.async
before the wgmma reads them); every accumulator feeds `sink` so nothing is dead.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import warpgroup
from cutlass.utils import LayoutEnum

from .common import clk, fill_random_bf16, gtimer, smem_addr

KT = 128  # K of one smem tile (8 k16 steps)
KB = KT // 16
NKS = (1, 2, 3, 4, 5, 6, 8, 12, 16)  # chained instructions per latency sample (k step = nk mod 8)
NS = (64, 128, 256)  # the profile's shapes
# the N of attention tiles that are not a power of two (QK: tile_n; PV: hdim), with 128 as the
# same run's reference: hd96 (144 / 96), hd192 (112 / 192), hd256 with tile_n 80 (80 / 256)
ODD_NS = (80, 96, 112, 128, 144, 192)
FENCES = ("group", "each", "each_write", "mixed")
MAX_LAT_SAMPLES = 64


def max_wg(n):
    return 2 if n == 256 else 3


def _smem_layout(dtype, rows, cols, stages=None):
    atom = warpgroup.make_smem_layout_atom(
        sm90_helpers.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype)
    shape = (rows, cols) if stages is None else (rows, cols, stages)
    order = (0, 1) if stages is None else (0, 1, 2)
    return cute.tile_to_shape(atom, shape, order=order)


def make(N: int, rs: bool, fence: str = "group", drain: bool = False):
    """fence (throughput mode): "group", one wgmma fence per 8 instructions (the CUTLASS mainloop);
    "each", a fence before every instruction; "each_write" (RS), the instruction's A registers
    rewritten and then fenced before it, as ptxas compiles fa4kernel's hd192 P V GEMM (PRMTs and a
    WARPGROUP.ARRIVE before each of its HGMMAs); "mixed" (RS), warpgroup 0 as "each_write" and the
    others as "group": does a fenced instruction wait behind another warpgroup's queued ones?
    drain: wait for each trip's group before the next (wait_group 0), so no instruction in flight
    still reads the registers a trip rewrites."""
    if fence not in FENCES or (fence in ("each_write", "mixed") and not rs):
        raise ValueError(f"fence={fence!r}: one of {', '.join(FENCES)} (each_write and mixed need rs)")
    nwg_max = max_wg(N)
    threads = 128 * nwg_max

    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, mode: Int32, nwg: Int32, iters: Int32,
               tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout):
        tid = cute.arch.thread_idx()[0]
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx() // 4)
        wtid = tid % 128
        bid = cute.arch.block_idx()[0]

        @cute.struct
        class Storage:
            sA: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sB_layout)], 1024]

        alloc = cutlass.utils.SmemAllocator()
        storage = alloc.allocate(Storage)
        # pseudo-random bf16 pairs: sign random, exponent 2^-7 .. 2^0, mantissa random
        base = smem_addr(storage.sA.data_ptr())
        nwords = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) // 2
        base_b = smem_addr(storage.sB.data_ptr())
        a_words = cute.cosize(sA_layout) // 2
        fill_random_bf16(base, a_words, base_b, nwords, tid, threads, bid * 7919)
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        thr_mma = tiled_mma.get_slice(wtid)
        wg_mma = tiled_mma.get_slice(0)
        wg_sel = wg if wg < nwg_max else 0
        tCsA = wg_mma.partition_A(sA[None, None, wg_sel])
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

        if mode == 0:
            cute.arch.sync_threads()
            if wg < nwg:
                t0 = clk()
                g0 = gtimer()
                one = Float32(nwg) / Float32(nwg)  # 1.0, which the compiler cannot fold

                # "mixed": warpgroup 0 rewrites and fences before every instruction, the others do not
                fenced = wg == 0 if const_expr(fence == "mixed") else fence in ("each", "each_write")
                rewrite = wg == 0 if const_expr(fence == "mixed") else fence == "each_write"
                for _ in cutlass.range(iters, unroll=1):
                    warpgroup.fence()
                    for k in cutlass.range_constexpr(KB):
                        if const_expr(rs):  # (SS: A is a shared-memory descriptor)
                            if rewrite:
                                frag = tCrA[None, None, k]
                                for i in cutlass.range_constexpr(cute.size(frag)):
                                    frag[i] = BFloat16(Float32(frag[i]) * one)
                        if const_expr(k > 0):
                            if fenced:
                                warpgroup.fence()
                        cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
                    warpgroup.commit_group()
                    if const_expr(drain):
                        warpgroup.wait_group(0)
                    else:
                        warpgroup.wait_group(1)
                warpgroup.wait_group(0)
                t1 = clk()
                g1 = gtimer()
                if wtid == 0:
                    o = (bid * 4 + wg) * 4
                    stamps[o + 0] = t0
                    stamps[o + 1] = t1
                    stamps[o + 2] = g0
                    stamps[o + 3] = g1
        else:
            if wg == 0:
                for s in cutlass.range(iters, unroll=1):
                    for j in cutlass.range_constexpr(len(NKS)):
                        nk = NKS[j]
                        t0 = clk()
                        warpgroup.fence()
                        for k in cutlass.range_constexpr(nk):
                            cute.gemm(atom, acc, tCrA[None, None, k % KB], tCrB[None, None, k % KB], acc)
                        warpgroup.commit_group()
                        ti = clk()
                        warpgroup.wait_group(0)
                        t1 = clk()
                        if wtid == 0:
                            o = 4096 + (s * len(NKS) + j) * 2
                            stamps[o] = ti - t0
                            stamps[o + 1] = t1 - t0
        total = Float32(0.0)
        for i in cutlass.range_constexpr(cute.size(acc)):
            total = total + acc[i]
        sink[bid * threads + tid] = total

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, mode: Int32, nwg: Int32, iters: Int32,
             ctas: Int32, stream):
        tiled_mma = sm90_helpers.make_trivial_tiled_mma(
            BFloat16, BFloat16, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
            atom_layout_mnk=(1, 1, 1), tiler_mn=(64, N),
            a_source=warpgroup.OperandSource.RMEM if const_expr(rs) else warpgroup.OperandSource.SMEM)
        sA_layout = _smem_layout(BFloat16, 64, KT, nwg_max)
        sB_layout = _smem_layout(BFloat16, N, KT)
        smem = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) * 2 + 2048
        kernel(stamps, sink, mode, nwg, iters, tiled_mma, sA_layout, sB_layout).launch(
            grid=[ctas, 1, 1], block=[threads, 1, 1], smem=smem, stream=stream)

    return host


def fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (8192,)), fake_tensor(Float32, (132 * 384,)), Int32(0), Int32(1),
            Int32(10), Int32(1), fake_stream())


def flops_per_instr(N):
    return 2 * 64 * N * 16


def _throughput(dev, fn, key, N, nwg, iters, ctas=1):
    torch = dev.torch
    stamps = torch.zeros(8192, dtype=torch.int64, device="cuda")
    sink = torch.zeros(132 * 384, dtype=torch.float32, device="cuda")
    secs = dev.call(key, fn, stamps, sink, Int32(0), Int32(nwg), Int32(iters), Int32(ctas))
    st = stamps.cpu().tolist()
    rows = [[st[(b * 4 + w) * 4 + i] for i in range(4)] for b in range(ctas) for w in range(nwg)]
    finite = bool(torch.isfinite(sink[: ctas * 384]).all().item())
    return rows, secs, finite


def _best_throughput(dev, fn, key, N, nwg, iters):
    """The fastest of two timed launches (after a warm-up) of `nwg` warpgroups' chains: cycles
    per instruction over all of them and each warpgroup's own."""
    best, per_wg, finite = None, None, True
    for rep in range(3):
        rows, secs, finite = _throughput(dev, fn, key, N, nwg, iters)
        cyc = max(r[1] for r in rows) - min(r[0] for r in rows)
        if rep and (best is None or cyc < best):
            best, per_wg = cyc, [r[1] - r[0] for r in rows]
    n_instr = nwg * iters * KB
    return dict(cycles=best, instructions=n_instr, cycles_per_instr=best / n_instr,
                flops_per_clk=flops_per_instr(N) * n_instr / best, ideal_cycles_per_instr=N / 2,
                sink_finite=finite, per_wg_cycles_per_instr=[c / (iters * KB) for c in per_wg])


def run(dev, iters_thr=2000, iters_lat=32, ns=NS, sources=(False, True)):
    """Per N in ns and A source (False: SS, True: RS): throughput with 1..max_wg warpgroups
    issuing, and the issue / completion latency of chained instructions."""
    out = {}
    for N in ns:
        for rs in sources:
            name = f"{'rs' if rs else 'ss'}_n{N}"
            fn = make(N, rs)
            key = ("wgmma", N, rs)
            res = {"N": N, "a_source": "RS" if rs else "SS", "throughput": {}}
            for nwg in range(1, max_wg(N) + 1):
                res["throughput"][str(nwg)] = _best_throughput(dev, fn, key, N, nwg, iters_thr)
            # latency / issue
            torch = dev.torch
            stamps = torch.zeros(8192, dtype=torch.int64, device="cuda")
            sink = torch.zeros(132 * 384, dtype=torch.float32, device="cuda")
            for rep in range(2):
                dev.call(key, fn, stamps, sink, Int32(1), Int32(1), Int32(iters_lat), Int32(1))
            st = stamps.cpu().tolist()
            lat = {}
            for j, nk in enumerate(NKS):
                iss = [st[4096 + (s * len(NKS) + j) * 2] for s in range(1, iters_lat)]
                done = [st[4096 + (s * len(NKS) + j) * 2 + 1] for s in range(1, iters_lat)]
                from .common import median

                lat[str(nk)] = dict(issue_median=median(iss), issue_min=min(iss),
                                    complete_median=median(done), complete_min=min(done))
            res["latency"] = lat
            out[name] = res
    return out


def run_odd_n(dev):
    """SS wgmma at the N of attention tiles that are not a power of two (ODD_NS): does the tensor
    core keep its rate per FLOP there?"""
    return run(dev, ns=ODD_NS, sources=(False,))


def run_fences(dev, iters_thr=2000, ns=(128, 192)):
    """RS (and SS) wgmma chains with a fence before every instruction, with and without the A
    registers rewritten before it, against one fence per 8 (FENCES), each also drained (no group in
    flight across trips): the cycles per instruction with 1 and 2 warpgroups issuing."""
    out = {}
    for N in ns:
        for rs, fence, drain in ((False, "group", False), (False, "each", False), (True, "group", False),
                                 (True, "each", False), (True, "each_write", False), (True, "group", True),
                                 (True, "each_write", True), (True, "mixed", False)):
            fn = make(N, rs, fence, drain)
            key = ("wgmma", N, rs, fence, drain)
            res = {"N": N, "a_source": "RS" if rs else "SS", "fence": fence, "drain": drain, "throughput": {}}
            for nwg in ((2,) if fence == "mixed" else (1, 2)):
                res["throughput"][str(nwg)] = _best_throughput(dev, fn, key, N, nwg, iters_thr)
            out[f"{'rs' if rs else 'ss'}_n{N}_{fence}" + ("_drained" if drain else "")] = res
    return out


def clock_run(dev, seconds=2.0, N=256):
    """Sustained clock: all 132 SMs, 2 WGs each, SS N=256 for ~`seconds`; clock64 vs globaltimer,
    CUDA events and nvidia-smi samples taken meanwhile."""
    import subprocess
    import threading

    torch = dev.torch
    fn = make(N, False)
    key = ("wgmma", N, False)
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    # size the loop from a short run
    rows, secs, _ = _throughput(dev, fn, key, N, 2, 20000, ctas=nsm)
    per_iter_s = secs / 20000
    iters = int(seconds / per_iter_s)
    smi = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu,"
                                    "clocks_event_reasons.active", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=5)
                smi.append(r.stdout.strip())
            except Exception as e:  # noqa: BLE001
                smi.append(f"error {e}")
            stop.wait(0.2)

    th = threading.Thread(target=sample)
    th.start()
    stamps = torch.zeros(8192, dtype=torch.int64, device="cuda")
    sink = torch.zeros(132 * 384, dtype=torch.float32, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    from cutlass import Int32 as I32

    conv = [dev.ct(stamps), dev.ct(sink), I32(0), I32(2), I32(iters), I32(nsm)]
    e0.record()
    dev.cache[key](*conv, dev.stream())
    e1.record()
    torch.cuda.synchronize()
    stop.set()
    th.join()
    ev_ms = e0.elapsed_time(e1)
    st = stamps.cpu().tolist()
    ghz = []
    for b in range(nsm):
        for w in range(2):
            t0, t1, g0, g1 = st[(b * 4 + w) * 4: (b * 4 + w) * 4 + 4]
            if g1 > g0:
                ghz.append((t1 - t0) / (g1 - g0))
    cyc = [st[(b * 4) * 4 + 1] - st[(b * 4) * 4] for b in range(nsm)]
    from .common import median

    n_instr_total = nsm * 2 * iters * KB
    return dict(
        N=N, ctas=nsm, warpgroups_per_cta=2, iters=iters, event_ms=ev_ms,
        clock_ghz_median=median(ghz), clock_ghz_min=min(ghz), clock_ghz_max=max(ghz),
        cycles_median=median(cyc), ghz_from_events=median(cyc) / (ev_ms * 1e6),
        tflops_events=flops_per_instr(N) * n_instr_total / (ev_ms * 1e-3) / 1e12,
        nvidia_smi_samples=smi, sink_finite=bool(torch.isfinite(sink).all().item()))
