"""The LSU pipe, one SM: warp instructions per clock of warp shuffles, and of 16-byte cp.async copies
from L2 into shared memory, with the bytes per clock those copies reach.

fa4sim assumes the LSU (MIO) takes one warp instruction per clock per SM (fa4sim/hardware.py
LSU_WARP_INSTR_PER_CLK: shuffles, shared-memory and global loads and stores, cp.async)
and costs a paged cache's cp.async path by it (fa4sim/paged_kv.py). Here:
  shfl      `threads` threads, each CHAINS independent shfl.sync.bfly chains, UNROLL per trip
  cp_async  `threads` threads copy 16 bytes each per cp.async.cg from a 1 MB L2-resident region
            into a 64 KB shared ring (as a paged cache's producer warpgroup does: 128 threads; and
            a whole CTA of 1024), committing a group per trip and keeping DEPTH groups in flight
  latency   one warp, one 16-byte cp.async at a time, waited for (cp.async.wait_all)
Warp instructions per clock = warps x instructions / (last warp end - first warp start).

    python3 lab/tools/calibrate/bench_lsu.py --out FILE.json                 (on the GPU)
    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_lsu --check-sass
"""

import argparse
import os
import sys

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from lab.tools.calibrate.common import _asm, clk, lop3_xor, smem_addr  # noqa: E402

CHAINS = 8            # independent shuffle chains per thread
UNROLL = 16           # instructions per chain (shfl) or copies per thread (cp.async) per trip
RING_BYTES = 64 * 1024
REGION_BYTES = 1 << 20  # global memory the copies read (L2-resident after the first trip)
DEPTH = 4             # cp.async groups in flight
THREADS = (128, 1024)


@dsl_user_op
def shfl_bfly(x, lane_mask: int, *, loc=None, ip=None):
    """shfl.sync.bfly.b32 over the full warp (SHFL.BFLY)."""
    return Int32(_asm(T.i32(), [Int32(x).ir_value()], f"shfl.sync.bfly.b32 $0, $1, {lane_mask}, 31, -1;", "=r,r"))


@dsl_user_op
def cp_async_16(smem: Int32, gmem: Int64, *, loc=None, ip=None):
    """cp.async.cg.shared.global of 16 bytes (LDGSTS.E.BYPASS.128)."""
    _asm(None, [Int32(smem).ir_value(), Int64(gmem).ir_value()], "cp.async.cg.shared.global [$0], [$1], 16;", "r,l")


@dsl_user_op
def cp_async_commit(*, loc=None, ip=None):
    _asm(None, [], "cp.async.commit_group;", "")


@dsl_user_op
def cp_async_wait(n: int, *, loc=None, ip=None):
    _asm(None, [], f"cp.async.wait_group {n};", "")


@dsl_user_op
def gmem_addr(ptr, *, loc=None, ip=None):
    """64-bit global address of a gmem cute pointer."""
    return Int64(llvm.ptrtoint(T.i64(), ptr.to_llvm_ptr()))


def make_shfl(threads: int):
    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, iters: Int32):
        tid = cute.arch.thread_idx()[0]
        v = [Int32(tid * (c + 3)) for c in range(CHAINS)]
        t0 = clk()
        for _ in cutlass.range(iters, unroll=1):
            for u in cutlass.range_constexpr(UNROLL):
                for c in cutlass.range_constexpr(CHAINS):
                    v[c] = shfl_bfly(v[c], 1 << ((u + c) % 5))
        t1 = clk()
        if tid % 32 == 0:
            stamps[2 * (tid // 32)] = t0
            stamps[2 * (tid // 32) + 1] = t1
        acc = Int32(0)
        for c in cutlass.range_constexpr(0, CHAINS, 2):
            acc = lop3_xor(acc, v[c], v[c + 1])
        sink[tid] = Float32(acc)

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, region: cute.Tensor, iters: Int32, stream):
        kernel(stamps, sink, iters).launch(grid=[1, 1, 1], block=[threads, 1, 1], stream=stream)

    return host


def make_cp_async(threads: int, latency: bool = False):
    per_trip = threads * 16 * UNROLL  # bytes a trip copies

    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, region: cute.Tensor, iters: Int32):
        tid = cute.arch.thread_idx()[0]
        alloc = cutlass.memory.SmemAllocator()
        ring = alloc.allocate_array(Int32, RING_BYTES // 4, byte_alignment=128)
        base = smem_addr(ring)
        src = gmem_addr(region.iterator)
        t0 = clk()
        for it in cutlass.range(iters, unroll=1):
            off = (it * per_trip) % REGION_BYTES
            for u in cutlass.range_constexpr(UNROLL):
                at = (u * threads + tid) * 16
                cp_async_16(base + (at + it * per_trip) % RING_BYTES, src + Int64(off + at))
                if cutlass.const_expr(latency):
                    cp_async_wait(0)
            if cutlass.const_expr(not latency):
                cp_async_commit()
                cp_async_wait(DEPTH - 1)
        cp_async_wait(0)
        t1 = clk()
        if tid % 32 == 0:
            stamps[2 * (tid // 32)] = t0
            stamps[2 * (tid // 32) + 1] = t1
        cute.arch.sync_threads()
        sink[tid] = Float32(ring[tid])

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, region: cute.Tensor, iters: Int32, stream):
        kernel(stamps, sink, region, iters).launch(grid=[1, 1, 1], block=[threads, 1, 1],
                                                   smem=RING_BYTES + 1024, stream=stream)

    return host


def fake_args():
    from lab.tools.calibrate.common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (64,)), fake_tensor(Float32, (1024,)), fake_tensor(Int32, (REGION_BYTES // 4,)),
            Int32(10), fake_stream())


def run(dev, iters: int = 400):
    torch = dev.torch
    out = {"what": "one SM: warp shuffles and 16-byte cp.async copies from L2 per clock (warp instructions, "
                   "bytes), and one cp.async's latency", "rows": []}
    stamps = torch.zeros(64, dtype=torch.int64, device="cuda")
    sink = torch.zeros(1024, dtype=torch.float32, device="cuda")
    region = torch.randint(0, 1 << 30, (REGION_BYTES // 4,), dtype=torch.int32, device="cuda")
    cases = [("shfl", t, make_shfl(t), CHAINS * UNROLL, 0) for t in THREADS]
    cases += [("cp_async", t, make_cp_async(t), UNROLL, 16) for t in THREADS]
    cases.append(("cp_async_latency", 32, make_cp_async(32, latency=True), UNROLL, 16))
    for what, threads, fn, per_trip, nbytes in cases:
        n = iters if what != "cp_async_latency" else iters // 8
        spans = []
        for rep in range(3):  # the first launch warms the L2 and the instruction cache
            dev.call((what, threads), fn, stamps, sink, region, Int32(n))
            st = stamps.cpu().tolist()
            warps = threads // 32
            if rep:
                spans.append(max(st[2 * w + 1] for w in range(warps)) - min(st[2 * w] for w in range(warps)))
        cycles = min(spans)
        warp_instr = threads // 32 * per_trip * n
        row = {"what": what, "threads": threads, "cycles": cycles, "warp_instr": warp_instr,
               "warp_instr_per_clk": warp_instr / cycles, "spans": spans}
        if nbytes:
            row["bytes_per_clk"] = threads * nbytes * per_trip * n / cycles
        if what == "cp_async_latency":
            row["cycles_per_copy"] = cycles / (per_trip * n)
        out["rows"].append(row)
        print(f"  {what:17s} {threads:5d} threads: {row['warp_instr_per_clk']:6.3f} warp instr/clk"
              + (f", {row['bytes_per_clk']:6.1f} B/clk" if nbytes else "")
              + (f", {row['cycles_per_copy']:6.0f} cycles per copy" if "cycles_per_copy" in row else ""), flush=True)
    return out


SASS_WANT = {"shfl": ("SHFL.BFLY", CHAINS * UNROLL), "cp_async": ("LDGSTS", UNROLL)}


def check_sass() -> int:
    """Compile each kernel for sm_90a on the CPU; its SASS holds the instruction measured, as often."""
    from lab.tools.calibrate.common import compile_for_sass, sass_count

    bad = 0
    for name, fn in (("shfl", make_shfl(128)), ("cp_async", make_cp_async(128))):
        sass = compile_for_sass(fn, *fake_args())
        opcode, want = SASS_WANT[name]
        got = sass_count(sass, opcode)
        print(f"{name:9s} {opcode}: {got} (want {want})")
        bad += got != want
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--check-sass", action="store_true")
    a = ap.parse_args(argv)
    if a.check_sass:
        return check_sass()
    from lab.tools.calibrate.common import Device, write_result

    return write_result("lsu", run(Device(), a.iters), a.out)


if __name__ == "__main__":
    sys.exit(main())
