"""Back-to-back kernel launch gap, timed with CUDA events (as benchmark loops time kernels).

The GPU is first kept busy with torch.cuda._sleep so that the host has queued all N launches
before the first runs: events around N launches then time the GPU-side gap per kernel
(launch + ramp + drain of an empty one-CTA kernel), not the Python call overhead. Also the
plain loop without the head start (host-bound), and a CUDA-graph replay, for reference.

cute_empty_pdl: the same empty kernel launched as a programmatic dependent launch (PDL, use_pdl:
each launch may start while the one before it runs; it waits in griddepcontrol.wait until that
grid has finished and its memory is visible, and lets its own dependents launch at its start with
griddepcontrol.launch_dependents): the gap a kernel launched so adds behind another, as
fa4kernel's split-KV combine is launched behind its decode kernel.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64


def make(pdl: bool = False):
    @cute.kernel
    def kernel(stamps: cute.Tensor, flag: Int32):
        tid = cute.arch.thread_idx()[0]
        if cutlass.const_expr(pdl):
            cute.arch.griddepcontrol_launch_dependents()  # the next launch may start now
            cute.arch.griddepcontrol_wait()  # ... and this one goes on once the grid before it is done
        if flag == 12345:  # never true: the kernel stays empty but keeps its argument
            stamps[tid] = Int64(flag)

    @cute.jit
    def host(stamps: cute.Tensor, flag: Int32, stream):
        kernel(stamps, flag).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream, use_pdl=pdl)

    return host


def fake_args():
    from .common import fake_stream, fake_tensor

    return (fake_tensor(Int64, (64,)), Int32(0), fake_stream())


def run(dev, n=200):
    torch = dev.torch
    stamps = torch.zeros(64, dtype=torch.int64, device="cuda")
    dev.call("launch", make(), stamps, Int32(0))
    dev.call("launch_pdl", make(pdl=True), stamps, Int32(0))
    compiled, compiled_pdl = dev.cache["launch"], dev.cache["launch_pdl"]
    args = [dev.ct(stamps), Int32(0)]
    stream = dev.stream()
    x = torch.zeros(1, device="cuda")
    out = {}

    def timed(launch, head_start):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        if head_start:
            torch.cuda._sleep(int(50e6))  # tens of ms of GPU work while the host queues
        e0.record()
        for _ in range(n):
            launch()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) * 1e3 / n  # us per launch

    for name, launch in (("cute_empty", lambda: compiled(*args, stream)),
                         ("cute_empty_pdl", lambda: compiled_pdl(*args, stream)),
                         ("torch_add_1elem", lambda: x.add_(1.0))):
        timed(launch, True)
        out[name] = dict(gpu_side_us=min(timed(launch, True) for _ in range(3)),
                         host_loop_us=min(timed(launch, False) for _ in range(3)))
    graphed = (("torch_add_graph_us", lambda: x.add_(1.0)),
               ("cute_empty_graph_us", lambda: compiled(*args, dev.stream())),
               ("cute_empty_pdl_graph_us", lambda: compiled_pdl(*args, dev.stream())))
    for name, launch in graphed:
        try:  # replayed from a CUDA graph (a PDL launch is captured as a programmatic edge)
            out[name] = _graph_us(torch, launch, n)
        except Exception as e:  # noqa: BLE001
            out[name] = f"failed: {e}"
    return out


def _graph_us(torch, launch, n):
    """us per launch of n launches captured in one CUDA graph, replayed."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        launch()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(n):
            launch()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / n
