"""The deterministic backward's dQ turn: how long one CTA's turn takes to pass to the next.

The deterministic SM90 backward (fa4kernel/sm90/bwd.py, dq_store with deterministic=True) adds a
query block's dQ in a fixed order of key blocks: a CTA's elected thread spins on the block's
semaphore (ld.acquire.gpu) until its turn, fences the async proxy, bulk reduce-adds its dQ
(cp.reduce.async.bulk .add.f32), waits until the adds are written, fences again and releases the
next turn (red.release.gpu.add 1). Here two CTAs, one warp each and on two SMs (200 KB of shared
memory each), take turns on one semaphore with exactly that sequence, `rounds` turns each, adding
`bytes` of fp32 (0: no add) into one accumulator. Thread 0 of CTA 0 stamps clock64 and
%globaltimer around its first and last turns: cycles per turn = its span / (2 x rounds - 1) turns
between them. fa4sim's model of a turn: kernel_bwd.dq_order_wait (two L2 round trips and the
add at the reduce-add rate).

    python3 lab/tools/calibrate/bench_dq_turn.py --out FILE.json                (on the GPU)
    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_dq_turn --check-sass
"""

import argparse
import os
import sys

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from fa4kernel.sm90.bwd import (bulk_reduce_add_f32, fence_proxy_async_global, ld_acquire_s32,  # noqa: E402
                                red_release_add_s32)
from lab.tools.calibrate.common import clk, gtimer  # noqa: E402

SMEM_FLOATS = 16384          # 64 KB of dQ staged in shared memory (tile_m 128 x hd 128 fp32)
PAD = 200 * 1024             # one CTA per SM
BYTES = (0, 16384, 32768, 65536)  # a dQ warpgroup's share: hd64 / hd128 x tile_m 64 / 128


def make(nbytes: int):
    @cute.struct
    class Storage:
        buf: cute.struct.Align[cute.struct.MemRange[Float32, SMEM_FLOATS], 1024]
        pad: cute.struct.MemRange[cutlass.Int8, PAD - SMEM_FLOATS * 4]  # one CTA per SM

    @cute.kernel
    def kernel(sem: cute.Tensor, acc: cute.Tensor, stamps: cute.Tensor, rounds: Int32):
        tid = cute.arch.thread_idx()[0]
        cta = cute.arch.block_idx()[0]
        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        buf = storage.buf.get_tensor(cute.make_layout(SMEM_FLOATS))
        for i in cutlass.range(tid, SMEM_FLOATS, 32, unroll=1):
            buf[i] = Float32(1.0)
        cute.arch.fence_view_async_shared()  # generic-proxy writes -> the bulk reduce (async proxy)
        cute.arch.sync_warp()
        if tid == 0:
            c0, g0, c1, g1 = Int64(0), Int64(0), Int64(0), Int64(0)
            for r in cutlass.range(rounds, unroll=1):
                turn = 2 * r + cta
                seen = ld_acquire_s32(sem.iterator)
                while seen < turn:
                    seen = ld_acquire_s32(sem.iterator)
                fence_proxy_async_global()
                if r == 0:
                    c0 = clk()
                    g0 = gtimer()
                if cutlass.const_expr(nbytes > 0):
                    bulk_reduce_add_f32(acc.iterator, buf.iterator, nbytes)
                    cute.arch.cp_async_bulk_commit_group()
                    cute.arch.cp_async_bulk_wait_group(0, read=False)
                fence_proxy_async_global()
                red_release_add_s32(sem.iterator, 1)
                c1 = clk()
                g1 = gtimer()
            o = cta * 4
            stamps[o] = c0
            stamps[o + 1] = c1
            stamps[o + 2] = g0
            stamps[o + 3] = g1

    @cute.jit
    def host(sem: cute.Tensor, acc: cute.Tensor, stamps: cute.Tensor, rounds: Int32, stream):
        kernel(sem, acc, stamps, rounds).launch(grid=[2, 1, 1], block=[32, 1, 1], smem=Storage.size_in_bytes(),
                                                stream=stream)

    return host


def fake_args():
    from lab.tools.calibrate.common import fake_stream, fake_tensor

    return (fake_tensor(Int32, (1,)), fake_tensor(Float32, (SMEM_FLOATS,)), fake_tensor(Int64, (8,)), Int32(100),
            fake_stream())


def run(dev, rounds: int = 2000):
    torch = dev.torch
    out = {"what": "two CTAs (one warp each, one per SM) take turns on one semaphore as the deterministic "
                   "backward's dq_store does (spin ld.acquire, fence.proxy.async, bulk reduce-add of `bytes`, "
                   "wait written, fence, red.release); cycles and ns per turn", "rounds": rounds, "rows": []}
    for nbytes in BYTES:
        fn = make(nbytes)
        per_turn = []
        for _ in range(3):  # the last two launches are kept
            sem = torch.zeros(1, dtype=torch.int32, device="cuda")
            acc = torch.zeros(SMEM_FLOATS, dtype=torch.float32, device="cuda")
            stamps = torch.zeros(8, dtype=torch.int64, device="cuda")
            dev.call(("dq_turn", nbytes), fn, sem, acc, stamps, Int32(rounds))
            s = stamps.cpu().tolist()
            turns = 2 * rounds - 1  # from CTA 0's first turn to its last
            per_turn.append(((s[1] - s[0]) / turns, (s[3] - s[2]) / turns))
        cyc, ns = per_turn[-1]
        ok = abs(float(acc[0].item()) - 2 * rounds * (1.0 if nbytes else 0.0)) < 1e-3 if nbytes else True
        out["rows"].append({"bytes": nbytes, "cycles_per_turn": cyc, "ns_per_turn": ns,
                            "runs": per_turn[1:], "sum_checked": bool(ok)})
        print(f"  dQ turn, {nbytes:6d} bytes: {cyc:7.0f} cycles = {ns:6.0f} ns per turn (sum {'ok' if ok else 'WRONG'})",
              flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--check-sass", action="store_true")
    a = ap.parse_args(argv)
    if a.check_sass:
        from lab.tools.calibrate.common import compile_for_sass

        sass = compile_for_sass(make(32768), *fake_args())
        ok = "UBLKRED" in sass or "UBLKCP" in sass or "BULK" in sass
        print("bulk reduce-add:", "ok" if ok else "MISSING")
        return 0 if ok else 1
    from lab.tools.calibrate.common import Device, write_result

    return write_result("dq_turn", run(Device(), a.rounds), a.out)


if __name__ == "__main__":
    sys.exit(main())
