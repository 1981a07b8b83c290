"""Two independent wgmma chains from one warpgroup: in issue order, or interleaved?

FA3's intra-warpgroup overlap issues S(j) = Q K^T (8 x m64n128k16 on accumulator S), then
O += P V (8 more on accumulator O), and waits for S first (wait_group(1)). If the tensor core
runs the two chains in issue order, S is ready after ~8 x 64 cycles; if it interleaves the
independent chains, S is ready only when both are nearly done (~16 x 64). This decides when the
softmax can start. One CTA, 1 or 2 warpgroups, SS, N = 128:

    t0; fence; 8 wgmma -> accA; commit; 8 wgmma -> accB; commit; t_issue;
    wait_group(1); tA; wait_group(0); tB

Stamps (lane 0 of each warpgroup) per sample: t_issue - t0, tA - t0, tB - t0.

    python3 lab/tools/calibrate/bench_two_chains.py --out FILE.json    (on the GPU)
    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.bench_two_chains --check-sass
"""
from __future__ import annotations

import argparse
import os
import sys

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import BFloat16, Float32, Int32, Int64
from cutlass.cute.nvgpu import warpgroup

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from lab.tools.calibrate.bench_wgmma import KB, KT, _smem_layout  # noqa: E402
from lab.tools.calibrate.common import clk, fill_random_bf16, smem_addr  # noqa: E402

N = 128
THREADS = 256
SAMPLES = 64


def make():
    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, nwg: Int32, tiled_mma: cute.TiledMma,
               sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout):
        tid = cute.arch.thread_idx()[0]
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx() // 4)
        wtid = tid % 128

        @cute.struct
        class Storage:
            sA: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sB_layout)], 1024]

        storage = cutlass.utils.SmemAllocator().allocate(Storage)  # (the deprecated name, as the other benchmarks)
        a_words = cute.cosize(sA_layout) // 2
        nwords = a_words + cute.cosize(sB_layout) // 2
        base_a, base_b = smem_addr(storage.sA.data_ptr()), smem_addr(storage.sB.data_ptr())
        fill_random_bf16(base_a, a_words, base_b, nwords, tid, THREADS, 0)
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        thr_mma = tiled_mma.get_slice(wtid)
        wg_mma = tiled_mma.get_slice(0)
        tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA[None, None, wg]))
        tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB))
        acc_a = cute.make_rmem_tensor(thr_mma.partition_shape_C((64, N)), Float32)
        acc_b = cute.make_rmem_tensor(thr_mma.partition_shape_C((64, N)), Float32)
        acc_a.fill(0.0)
        acc_b.fill(0.0)
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        cute.arch.sync_threads()
        if wg < nwg:
            for s in cutlass.range(SAMPLES, unroll=1):
                t0 = clk()
                warpgroup.fence()
                for k in cutlass.range_constexpr(KB):
                    cute.gemm(atom, acc_a, tCrA[None, None, k], tCrB[None, None, k], acc_a)
                warpgroup.commit_group()
                for k in cutlass.range_constexpr(KB):
                    cute.gemm(atom, acc_b, tCrA[None, None, k], tCrB[None, None, k], acc_b)
                warpgroup.commit_group()
                ti = clk()
                warpgroup.wait_group(1)
                ta = clk()
                warpgroup.wait_group(0)
                tb = clk()
                if wtid == 0:
                    o = (wg * SAMPLES + s) * 3
                    stamps[o] = ti - t0
                    stamps[o + 1] = ta - t0
                    stamps[o + 2] = tb - t0
        total = Float32(0.0)
        for i in cutlass.range_constexpr(cute.size(acc_a)):
            total = total + acc_a[i] + acc_b[i]
        sink[tid] = total

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, nwg: Int32, stream):
        tiled_mma = sm90_helpers.make_trivial_tiled_mma(
            BFloat16, BFloat16, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
            atom_layout_mnk=(1, 1, 1), tiler_mn=(64, N), a_source=warpgroup.OperandSource.SMEM)
        sA_layout = _smem_layout(BFloat16, 64, KT, 2)
        sB_layout = _smem_layout(BFloat16, N, KT)
        smem = (cute.cosize(sA_layout) + cute.cosize(sB_layout)) * 2 + 2048
        kernel(stamps, sink, nwg, tiled_mma, sA_layout, sB_layout).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], smem=smem, stream=stream)

    return host


def fake_args():
    from lab.tools.calibrate.common import fake_stream, fake_tensor

    return fake_tensor(Int64, (2 * SAMPLES * 3,)), fake_tensor(Float32, (THREADS,)), Int32(1), fake_stream()


def run(dev):
    from lab.tools.calibrate.common import median

    torch = dev.torch
    fn = make()
    out = {"what": "one warpgroup: 8 wgmma m64n128k16 SS on accA, commit, 8 on accB, commit; "
                   "cycles from the first issue to: all issued, wait_group(1) (chain A), wait_group(0)",
           "ideal_chain_cycles": KB * N / 2}
    for nwg in (1, 2):
        stamps = torch.zeros(2 * SAMPLES * 3, dtype=torch.int64, device="cuda")
        sink = torch.zeros(THREADS, dtype=torch.float32, device="cuda")
        for _ in range(2):  # the second launch is the measured one (warm)
            dev.call(("two_chains",), fn, stamps, sink, Int32(nwg))
        st = stamps.cpu().tolist()
        rows = [st[(w * SAMPLES + s) * 3:(w * SAMPLES + s) * 3 + 3] for w in range(nwg) for s in range(2, SAMPLES)]
        out[f"wg{nwg}"] = {"issued": median([r[0] for r in rows]), "chain_a_done": median([r[1] for r in rows]),
                           "chain_b_done": median([r[2] for r in rows]),
                           "sink_finite": bool(torch.isfinite(sink).all().item())}
        r = out[f"wg{nwg}"]
        print(f"  {nwg} WG: all issued {r['issued']:.0f}, chain A done {r['chain_a_done']:.0f}, "
              f"chain B done {r['chain_b_done']:.0f} cycles (one chain alone ideal {KB * N // 2})", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--check-sass", action="store_true")
    a = ap.parse_args(argv)
    if a.check_sass:
        from lab.tools.calibrate.common import compile_for_sass, sass_count

        n = sass_count(compile_for_sass(make(), *fake_args()), "HGMMA")
        print(f"HGMMA {n} (want 16)", "ok" if n == 16 else "UNEXPECTED")
        return 0 if n == 16 else 1
    from lab.tools.calibrate.common import Device, write_result

    return write_result("two_chains", run(Device()), a.out)


if __name__ == "__main__":
    sys.exit(main())
