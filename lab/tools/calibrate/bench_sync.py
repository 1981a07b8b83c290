"""Named-barrier and mbarrier hand-off latency between two warpgroups of one CTA.

256 threads = 2 warpgroups. Lane 0 of warp 0 stamps clock64 around `iters` round trips.
 mode 0 named ping-pong:  WG0: bar.arrive(1); bar.sync(2)   WG1: bar.sync(1); bar.arrive(2)
                          (FA3's ping-pong hand-off), 2 hand-offs per round trip
 mode 1 bar.sync(1, 256) by all 256 threads, back to back (cost of one full barrier)
 mode 2 mbarrier ping-pong between warp 0 and warp 4: one lane arrives on A, the other warp
        waits on A with cute.arch.mbarrier_wait (try_wait + suspend hint, as CUTLASS/FA3 wait),
        then arrives on B; 2 hand-offs per round trip
 mode 3 the same with a test_wait spin loop (no suspend)
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .common import clk

THREADS = 256


def make():
    @cute.kernel
    def kernel(stamps: cute.Tensor, mode: Int32, iters: Int32):
        tid = cute.arch.thread_idx()[0]
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tid % 32
        wg = warp // 4

        @cute.struct
        class Storage:
            mbar: cute.struct.MemRange[cutlass.Int64, 2]

        alloc = cutlass.utils.SmemAllocator()
        storage = alloc.allocate(Storage)
        bar_a = storage.mbar.data_ptr()
        bar_b = bar_a + 1
        if tid == 0:
            cute.arch.mbarrier_init(bar_a, 1)
            cute.arch.mbarrier_init(bar_b, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        t0 = clk()
        if mode == 0:
            if wg == 0:
                for _ in cutlass.range(iters, unroll=1):
                    cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)
                    cute.arch.barrier(barrier_id=2, number_of_threads=256)
            else:
                for _ in cutlass.range(iters, unroll=1):
                    cute.arch.barrier(barrier_id=1, number_of_threads=256)
                    cute.arch.barrier_arrive(barrier_id=2, number_of_threads=256)
        elif mode == 1:
            for _ in cutlass.range(iters, unroll=1):
                cute.arch.barrier(barrier_id=1, number_of_threads=256)
        elif mode == 2:
            if warp == 0:
                for i in cutlass.range(iters, unroll=1):
                    if lane == 0:
                        cute.arch.mbarrier_arrive(bar_a)
                    cute.arch.mbarrier_wait(bar_b, i & 1)
            if warp == 4:
                for i in cutlass.range(iters, unroll=1):
                    cute.arch.mbarrier_wait(bar_a, i & 1)
                    if lane == 0:
                        cute.arch.mbarrier_arrive(bar_b)
        else:
            if warp == 0:
                for i in cutlass.range(iters, unroll=1):
                    if lane == 0:
                        cute.arch.mbarrier_arrive(bar_a)
                    done = cute.arch.mbarrier_test_wait(bar_b, i & 1)
                    while not done:
                        done = cute.arch.mbarrier_test_wait(bar_b, i & 1)
            if warp == 4:
                for i in cutlass.range(iters, unroll=1):
                    done = cute.arch.mbarrier_test_wait(bar_a, i & 1)
                    while not done:
                        done = cute.arch.mbarrier_test_wait(bar_a, i & 1)
                    if lane == 0:
                        cute.arch.mbarrier_arrive(bar_b)
        t1 = clk()
        if tid == 0:
            stamps[0] = t0
            stamps[1] = t1

    @cute.jit
    def host(stamps: cute.Tensor, mode: Int32, iters: Int32, stream):
        kernel(stamps, mode, iters).launch(grid=[1, 1, 1], block=[THREADS, 1, 1], smem=1024, stream=stream)

    return host


def fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (64,)), Int32(0), Int32(10), fake_stream())


MODES = {0: "named_pingpong", 1: "bar_sync_all", 2: "mbarrier_pingpong_trywait", 3: "mbarrier_pingpong_testwait"}


def run(dev, iters=2000):
    torch = dev.torch
    fn = make()
    stamps = torch.zeros(64, dtype=torch.int64, device="cuda")
    out = {}
    for mode, name in MODES.items():
        samples = []
        for rep in range(4):
            dev.call("sync", fn, stamps, Int32(mode), Int32(iters))
            st = stamps.cpu().tolist()
            if rep:
                samples.append(st[1] - st[0])
        per = min(samples) / iters
        handoffs = 1 if mode == 1 else 2
        out[name] = dict(cycles=min(samples), iters=iters, cycles_per_iter=per,
                         cycles_per_handoff=per / handoffs, samples=samples)
    return out
