"""Shared-memory bandwidth (LDS.128 streams) and load latency (LDS pointer chase), one SM.

bandwidth: 1024 threads; each warp loads 512 contiguous bytes per LDS.128 (conflict-free),
  `unroll` loads per trip at compile-time offsets over a 64 KB buffer; the four loaded words
  are folded into two accumulators with LOP3 (3-input xor) so no load is dead.
  B/clk/SM = bytes loaded / (last warp end - first warp start).
latency: one warp chases a pointer chain in smem (next = smem[cur]) -> cycles per LDS.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils as cutlass_utils
from cutlass import Float32, Int32, Int64

from .common import clk, lds128, lds32, lop3_xor, smem_addr, sts32

BUF_BYTES = 64 * 1024
THREADS_BW = 1024
UNROLL = 16
CHASE_STEPS = 64  # unrolled per trip


def make_bw():
    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, iters: Int32):
        tid = cute.arch.thread_idx()[0]
        warp = tid // 32
        lane = tid % 32
        alloc = cutlass_utils.SmemAllocator()
        buf = alloc.allocate_array(Int32, BUF_BYTES // 4, byte_alignment=128)
        base = smem_addr(buf)
        for i in cutlass.range_constexpr(BUF_BYTES // 4 // THREADS_BW):
            sts32(base + (i * THREADS_BW + tid) * 4, tid * 7 + i)
        cute.arch.sync_threads()
        me = base + tid * 16
        acc0 = Int32(0)
        acc1 = Int32(tid)
        t0 = clk()
        for _ in cutlass.range(iters, unroll=1):
            for u in cutlass.range_constexpr(UNROLL):
                v = lds128(me, (u * THREADS_BW * 16) % BUF_BYTES)
                acc0 = lop3_xor(acc0, v[0], v[1])
                acc1 = lop3_xor(acc1, v[2], v[3])
        t1 = clk()
        if lane == 0:
            stamps[2 * warp] = t0
            stamps[2 * warp + 1] = t1
        sink[tid] = Float32(acc0 ^ acc1)

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, iters: Int32, stream):
        kernel(stamps, sink, iters).launch(grid=[1, 1, 1], block=[THREADS_BW, 1, 1],
                                           smem=BUF_BYTES + 1024, stream=stream)

    return host


def make_chase():
    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, iters: Int32):
        tid = cute.arch.thread_idx()[0]
        alloc = cutlass_utils.SmemAllocator()
        n = BUF_BYTES // 4
        buf = alloc.allocate_array(Int32, n, byte_alignment=128)
        base = smem_addr(buf)
        # next[i] = i + 33 words (mod n): a new bank and line each step
        for i in cutlass.range(n // 32, unroll=1):
            idx = i * 32 + tid
            sts32(base + idx * 4, base + ((idx + 33) % n) * 4)
        cute.arch.sync_threads()
        p = base + tid * 0  # all lanes chase the same chain (broadcast)
        t0 = clk()
        for _ in cutlass.range(iters, unroll=1):
            for u in cutlass.range_constexpr(CHASE_STEPS):
                p = lds32(p)
        t1 = clk()
        if tid == 0:
            stamps[0] = t0
            stamps[1] = t1
        sink[tid] = Float32(p)

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, iters: Int32, stream):
        kernel(stamps, sink, iters).launch(grid=[1, 1, 1], block=[32, 1, 1],
                                           smem=BUF_BYTES + 1024, stream=stream)

    return host


def fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (64,)), fake_tensor(Float32, (1024,)), Int32(10), fake_stream())


def run(dev, iters_bw=400, iters_chase=200):
    torch = dev.torch
    out = {}
    stamps = torch.zeros(64, dtype=torch.int64, device="cuda")
    sink = torch.zeros(1024, dtype=torch.float32, device="cuda")
    fn = make_bw()
    samples = []
    for rep in range(4):
        dev.call(("smem", "bw"), fn, stamps, sink, Int32(iters_bw))
        st = stamps.cpu().tolist()
        nw = THREADS_BW // 32
        if rep:
            samples.append(max(st[2 * w + 1] for w in range(nw)) - min(st[2 * w] for w in range(nw)))
    nbytes = THREADS_BW * 16 * UNROLL * iters_bw
    out["bytes_per_clk"] = nbytes / min(samples)
    out["bw_raw"] = dict(bytes=nbytes, cycles=min(samples), samples=samples, threads=THREADS_BW,
                         instr="LDS.128", sink_nonzero=bool((sink != 0).any().item()))
    fn = make_chase()
    samples = []
    for rep in range(4):
        dev.call(("smem", "chase"), fn, stamps, sink, Int32(iters_chase))
        st = stamps.cpu().tolist()
        if rep:
            samples.append(st[1] - st[0])
    steps = CHASE_STEPS * iters_chase
    out["latency_cycles"] = min(samples) / steps
    out["latency_raw"] = dict(cycles=min(samples), steps=steps, samples=samples)
    return out
