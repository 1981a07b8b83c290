"""GPU tests of fa4kernel's custom ops (fa4kernel/ops.py) with the real SM90 kernels: numerics
against an fp32 reference, the fake functions against the real outputs (opcheck), torch.compile
against eager, and a CUDA graph of forward + backward replayed against eager.

Run on the device: pytest -m gpu tests/test_torch_op_gpu.py
"""

import pytest

torch = pytest.importorskip("torch")

from hopper import gpu_marks  # noqa: E402

pytestmark = gpu_marks()

import cpu_attention_kernels as cpu  # noqa: E402
import fa4kernel  # noqa: E402
from fa4kernel import ops  # noqa: E402

TOL = 1e-2


def inputs(b, sq, sk, h, hkv, d, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *s: torch.randn(*s, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    q, k, v = make(b, sq, h, d), make(b, sk, hkv, d), make(b, sk, hkv, d)
    return [t.requires_grad_() for t in (q, k, v)] + [make(b, sq, h, d)]


def reference(q, k, v, causal, scale=None):
    """fp32 out; GQA by repeating k/v heads; causal bottom-right aligned (the CPU tests' reference)."""
    return cpu.reference(q, k, v, causal, scale)[0]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,sq,sk,h,hkv,d", [(2, 333, 1000, 8, 2, 128), (1, 1000, 333, 4, 4, 64),
                                             (3, 129, 257, 6, 1, 96), (2, 77, 77, 4, 2, 256)])
def test_op_forward_and_backward_match_the_fp32_reference(b, sq, sk, h, hkv, d, causal):
    q, k, v, dout = inputs(b, sq, sk, h, hkv, d)
    out = fa4kernel.attention_op(q, k, v, causal=causal)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference(q, k, v, causal)
    want = torch.autograd.grad(ref, (q, k, v), dout.float())
    errs = {"out": rel(out, ref), **{n: rel(g, w) for n, g, w in zip(("dq", "dk", "dv"), got, want)}}
    assert all(e < TOL for e in errs.values()), errs


@pytest.mark.parametrize("causal", [False, True])
def test_eager_attention_op_and_the_op_path_give_the_same_bits(causal):
    # eager attention_op runs fa4kernel.attention's autograd Function; torch.compile graphs run
    # torch.ops.fa4lab.attention_fwd / _bwd: the same kernels, so the same bits
    q, k, v, dout = inputs(2, 333, 517, 8, 2, 128, seed=4)
    out = fa4kernel.attention_op(q, k, v, causal=causal, deterministic=True)
    assert out.grad_fn is not None and "FlashAttnFuncSm90" in type(out.grad_fn).__name__
    got = (out, *torch.autograd.grad(out, (q, k, v), dout))
    op_out, _ = ops.attention_fwd(q, k, v, causal, None, True)
    want = (op_out, *torch.autograd.grad(op_out, (q, k, v), dout))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_real_kernels_against_the_fake_functions(causal):
    q, k, v, dout = inputs(2, 129, 200, 4, 2, 64)
    q, k, v = (t.detach() for t in (q, k, v))
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(ops.attention_fwd, (q, k, v, causal, None, False), test_utils=utils)
    out, lse = ops.attention_fwd(q, k, v, causal)
    # deterministic: the AOT check compares two runs of the backward
    torch.library.opcheck(ops.attention_bwd, (dout, q, k, v, out, lse, causal, None, True),
                          test_utils=utils)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.kv, self.o = torch.nn.Linear(256, 512), torch.nn.Linear(256, 256), torch.nn.Linear(512, 256)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 128)
        k, v = self.kv(x).view(b, s, 2, 1, 128).unbind(2)  # MQA: one k/v head
        return self.o(fa4kernel.attention_op(q, k, v, causal=True, deterministic=True).reshape(b, s, 512))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_output_and_grads_equal_eager(backend):
    torch.manual_seed(0)
    block = Block().cuda().to(torch.bfloat16)
    x = torch.randn(2, 333, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def run(fn):
        x.grad = None
        block.zero_grad(set_to_none=True)
        y = fn(x)
        y.float().square().mean().backward()
        return [y.detach(), x.grad] + [p.grad for p in block.parameters()]

    want = run(block)
    torch._dynamo.reset()
    got = run(torch.compile(block, backend=backend, fullgraph=True))
    assert torch.equal(got[0], want[0]) if backend == "aot_eager" else rel(got[0], want[0]) < TOL
    for g, w in zip(got[1:], want[1:]):  # (inductor fuses the rest of the block its own way)
        assert rel(g, w) < (1e-3 if backend == "aot_eager" else TOL)


def test_cuda_graph_of_forward_and_backward_replays_to_eager():
    q, k, v, dout = inputs(2, 333, 517, 8, 2, 128, seed=1)

    def step():
        out = fa4kernel.attention_op(q, k, v, causal=True, deterministic=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles, tile schedules, allocator pools
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for seed in (2, 3):  # new data into the captured inputs, then replay
        nq, nk, nv, ndout = inputs(2, 333, 517, 8, 2, 128, seed=seed)
        with torch.no_grad():
            for t, n in ((q, nq), (k, nk), (v, nv), (dout, ndout)):
                t.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        for s, e in zip(static, step()):
            assert torch.equal(s, e)


def test_capture_of_a_shape_not_run_before_is_refused_in_one_line():
    q, k, v, _ = inputs(1, 64, 64, 4, 4, 64)
    with torch.no_grad():
        fa4kernel.attention_op(q, k, v, causal=True)  # compiled; this shape's schedule uploaded
        q2, k2, v2, _ = inputs(1, 1000, 1000, 4, 4, 64)  # the same build (short causal tiles), new shape
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(Exception) as e:
            with torch.cuda.graph(graph):
                fa4kernel.attention_op(q2, k2, v2, causal=True)
    err = e.value if isinstance(e.value, ValueError) else e.value.__context__
    assert isinstance(err, ValueError) and "\n" not in str(err)
    assert str(err).startswith("CUDA graph capture of a shape not run before")
