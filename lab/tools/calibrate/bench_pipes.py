"""FFMA / MUFU.EX2 / FMNMX / F2FP throughput and dependent-issue latency on one SM.

Each thread runs `chains` independent dependency chains of one instruction (inline PTX, so
exactly that SASS op), `unroll` steps per loop trip, `iters` trips. Warp 0..W-1 lane 0 stamp
clock64 before and after the loop (after a CTA barrier). One CTA on one SM.
 - latency:    1 warp, 1 chain       -> cycles per dependent instruction
 - throughput: 32 warps (8 per sub-partition), 8 chains -> lane-ops per clock per SM
The chain values are summed into `sink` so nothing can be deleted.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .common import clk, ex2, f2bf16x2, ffma, fmax

OPS = {
    # name: (SASS opcode to find, PTX)
    "ffma": "FFMA",
    "ex2": "MUFU.EX2",
    "fmnmx": "FMNMX",
    "f2fp": "F2FP.BF16.F32.PACK_AB",
}
CONFIGS = {"lat": dict(threads=32, chains=1, unroll=64), "thr": dict(threads=1024, chains=8, unroll=16)}


def make(op: str, threads: int, chains: int, unroll: int):
    @cute.kernel
    def kernel(stamps: cute.Tensor, sink: cute.Tensor, iters: Int32, a: Float32, b: Float32):
        tid = cute.arch.thread_idx()[0]
        warp = tid // 32
        lane = tid % 32
        x = [Float32(tid) * Float32(1e-3) + Float32(0.01 * j) - Float32(0.5) for j in range(chains)]
        y = [Float32(0.25 + 0.01 * j) * a for j in range(chains)]
        cute.arch.sync_threads()
        t0 = clk()
        for _ in cutlass.range(iters, unroll=1):
            for u in cutlass.range_constexpr(unroll):
                for j in cutlass.range_constexpr(chains):
                    if cutlass.const_expr(op == "ffma"):
                        x[j] = ffma(x[j], a, b)
                    elif cutlass.const_expr(op == "ex2"):
                        x[j] = ex2(x[j])
                    elif cutlass.const_expr(op == "fmnmx"):
                        # alternate the second operand so no two steps are the same max
                        x[j] = fmax(x[j], y[j] if u % 2 == 0 else b)
                    else:
                        x[j] = f2bf16x2(x[j], y[j])
        t1 = clk()
        if lane == 0:
            stamps[2 * warp] = t0
            stamps[2 * warp + 1] = t1
        s = Float32(0.0)
        for j in cutlass.range_constexpr(chains):
            s = s + x[j]
        sink[tid] = s

    @cute.jit
    def host(stamps: cute.Tensor, sink: cute.Tensor, iters: Int32, a: Float32, b: Float32, stream):
        kernel(stamps, sink, iters, a, b).launch(grid=[1, 1, 1], block=[threads, 1, 1], stream=stream)

    return host


def fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (64,)), fake_tensor(Float32, (1024,)), Int32(10), Float32(0.999),
            Float32(0.001), fake_stream())


def run(dev, iters_lat=2000, iters_thr=400):
    """On the GPU: {op: {latency_cycles, lanes_per_clk, ...}}."""
    torch = dev.torch
    out = {}
    for op in OPS:
        res = {}
        for mode, cfg in CONFIGS.items():
            fn = make(op, **cfg)
            stamps = torch.zeros(64, dtype=torch.int64, device="cuda")
            sink = torch.zeros(1024, dtype=torch.float32, device="cuda")
            iters = iters_lat if mode == "lat" else iters_thr
            samples = []
            for rep in range(4):  # first launch warms up; keep the rest
                dev.call(("pipes", op, mode), fn, stamps, sink, Int32(iters), Float32(0.999), Float32(0.001))
                st = stamps.cpu().tolist()
                nw = cfg["threads"] // 32
                t0 = min(st[2 * w] for w in range(nw))
                t1 = max(st[2 * w + 1] for w in range(nw))
                if rep:
                    samples.append(t1 - t0)
            cyc = min(samples)
            ops = cfg["threads"] * cfg["chains"] * cfg["unroll"] * iters
            steps = cfg["chains"] * cfg["unroll"] * iters  # per thread
            sink_ok = bool(torch.isfinite(sink).any().item()) or op == "ex2"
            if mode == "lat":
                res["latency_cycles"] = cyc / steps
                res["latency_raw"] = dict(cycles=cyc, dependent_steps=steps, samples=samples)
            else:
                res["lanes_per_clk"] = ops / cyc
                res["throughput_raw"] = dict(cycles=cyc, lane_ops=ops, threads=cfg["threads"],
                                             chains=cfg["chains"], samples=samples)
            res["sink_nonzero_" + mode] = bool((sink != 0).any().item())
            res["sink_finite_" + mode] = sink_ok
        out[op] = res
    return out
