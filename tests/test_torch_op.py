"""fa4kernel's torch custom ops (fa4kernel/ops.py) on the CPU: registration and schema, the fake
implementations' shapes / dtypes / strides, torch.compile / export / the joint graph with no graph
break, and the one-line ValueErrors for bad input (eager, fake, compiled).

Fake tensors here are CPU fake tensors: this CPU build of torch cannot make fake CUDA tensors
("PyTorch is not linked with support for cuda devices"); the fake functions read no device.
Where a test runs the ops (torch.compile, opcheck, autograd), the ops' CPU kernels are test
stand-ins (tests/cpu_attention_kernels.py: fp32 torch math, labelled there), not fa4kernel's.
"""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import cpu_attention_kernels as cpu  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import fa4kernel  # noqa: E402
from fa4kernel import ops  # noqa: E402

cpu.install()

FWD = torch.ops.fa4lab.attention_fwd.default
BWD = torch.ops.fa4lab.attention_bwd.default


def qkv(b=2, sq=37, sk=53, h=4, hkv=2, d=64, dtype=torch.bfloat16, grad=False, bhsd=False, seed=0):
    """q (b, sq, h, d), k, v (b, sk, hkv, d); bhsd: views of (b, heads, s, d) tensors, as
    transformers hands them over (non-contiguous)."""
    g = torch.Generator().manual_seed(seed)

    def make(s, n):
        if bhsd:
            return torch.randn(b, n, s, d, generator=g).to(dtype).transpose(1, 2).requires_grad_(grad)
        return torch.randn(b, s, n, d, generator=g).to(dtype).requires_grad_(grad)

    return make(sq, h), make(sk, hkv), make(sk, hkv)


# ---- registration


def test_the_ops_are_registered_with_their_schemas():
    assert str(FWD._schema) == ("fa4lab::attention_fwd(Tensor q, Tensor k, Tensor v, bool causal=False, "
                                "float? softmax_scale=None, bool deterministic=False) -> (Tensor, Tensor)")
    assert str(BWD._schema) == ("fa4lab::attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
                                "Tensor lse, bool causal=False, float? softmax_scale=None, bool deterministic=False)"
                                " -> (Tensor, Tensor, Tensor)")
    assert fa4kernel.attention_op is ops.attention_op


def test_import_fa4kernel_does_not_import_torch_and_attention_op_loads_the_ops():
    code = ("import sys, fa4kernel; print('torch' in sys.modules, 'fa4kernel.ops' in sys.modules); "
            "f = fa4kernel.attention_op; import torch; print(hasattr(torch.ops.fa4lab, 'attention_fwd'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True"]


def test_on_the_cpu_the_real_op_refuses_in_one_line():
    q, k, v = qkv()
    with cpu.real_cpu_ops(), pytest.raises(ValueError, match=r"^q is on device cpu; allowed: a CUDA device") as e:
        fa4kernel.attention_op(q, k, v)
    assert "\n" not in str(e.value)


# ---- fake implementations: what torch.compile sees


SHAPES = [  # b, sq, sk, h, hkv, d
    (1, 1, 1, 1, 1, 64), (2, 37, 53, 4, 4, 64), (2, 37, 53, 4, 2, 128), (3, 129, 77, 6, 1, 96),
    (1, 200, 200, 8, 2, 256), (2, 5, 300, 2, 1, 192),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bhsd", [False, True], ids=["bshd", "bhsd-view"])
def test_fake_shapes_dtypes_and_strides(shape, causal, bhsd):
    b, sq, sk, h, hkv, d = shape
    q, k, v = qkv(b, sq, sk, h, hkv, d, dtype=torch.float16, bhsd=bhsd)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out, lse = FWD(fq, fk, fv, causal, None, False)
        dq, dk, dv = BWD(torch.empty_like(out), fq, fk, fv, out, lse, causal, 0.5, True)
    assert (out.shape, out.dtype, out.stride()) == ((b, sq, h, d), torch.float16, (sq * h * d, h * d, d, 1))
    assert (lse.shape, lse.dtype, lse.stride()) == ((b, h, sq), torch.float32, (h * sq, sq, 1))
    for g, t in ((dq, q), (dk, k), (dv, v)):  # contiguous whatever the inputs' strides
        assert g.shape == t.shape and g.dtype == t.dtype and g.is_contiguous()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [4, 1])
def test_opcheck_fake_against_the_cpu_stand_in(causal, hkv):
    # torch.library.opcheck: schema, autograd registration, fake vs real metadata (shapes, strides),
    # and the AOT dispatcher with dynamic shapes
    q, k, v = qkv(2, 19, 33, 4, hkv, 64, bhsd=True)
    torch.library.opcheck(ops.attention_fwd, (q, k, v, causal, None, False))
    out, lse = ops.attention_fwd(q, k, v, causal, None, False)
    torch.library.opcheck(ops.attention_bwd, (torch.randn_like(out), q, k, v, out, lse, causal, None, False))
    torch.library.opcheck(ops.attention_fwd, (q.requires_grad_(), k, v, causal, 0.2, True),
                          test_utils=("test_autograd_registration", "test_aot_dispatch_dynamic"))


# ---- autograd through the ops


@pytest.mark.parametrize("causal", [False, True])
def test_grads_through_the_op_are_the_reference_grads(causal):
    q, k, v = qkv(grad=True, bhsd=True)
    out, lse = fa4kernel.attention_op(q, k, v, causal, 0.3, return_lse=True)
    assert out.requires_grad and not lse.requires_grad  # lse carries no gradient
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref, ref_lse, *_ = cpu.reference(qf, kf, vf, causal, 0.3)
    want = torch.autograd.grad(ref, (qf, kf, vf), dout.float())
    assert torch.allclose(lse, ref_lse.detach())
    for g, w in zip(got, want):
        assert g.shape == w.shape and ((g.float() - w).norm() / w.norm()).item() < 1e-2


# ---- tracing: no graph break, and the backward traces too


class Block(torch.nn.Module):
    """A tiny attention block: q, k, v projections (GQA: 4 q heads, 2 k/v heads of 64) -> op."""

    def __init__(self, causal=True):
        super().__init__()
        self.q, self.kv, self.o = torch.nn.Linear(64, 256), torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
        self.causal = causal

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 64)
        k, v = self.kv(x).view(b, s, 2, 2, 64).unbind(2)
        return self.o(fa4kernel.attention_op(q, k, v, causal=self.causal).reshape(b, s, 256))


def _block_and_input():
    torch.manual_seed(0)
    return Block().to(torch.bfloat16), torch.randn(2, 45, 64, dtype=torch.bfloat16, requires_grad=True)


def test_dynamo_sees_one_graph_and_no_break():
    block, x = _block_and_input()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(block)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_compile_fullgraph_forward_and_backward_graphs_hold_the_ops_and_match_eager():
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs = {}

    def keep(name):
        def compiler(gm, _example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)
        return compiler

    block, x = _block_and_input()
    torch._dynamo.reset()
    compiled = torch.compile(block, backend=aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw")),
                             fullgraph=True)
    y = compiled(x)
    y.float().square().sum().backward()
    got = [x.grad] + [p.grad for p in block.parameters()]
    x.grad = None
    block.zero_grad(set_to_none=True)
    y_eager = block(x)
    y_eager.float().square().sum().backward()
    want = [x.grad] + [p.grad for p in block.parameters()]
    targets = lambda gm: [n.target for n in gm.graph.nodes if n.op == "call_function"]  # noqa: E731
    assert FWD in targets(graphs["fw"]) and BWD not in targets(graphs["fw"])
    assert BWD in targets(graphs["bw"]) and FWD not in targets(graphs["bw"])  # no recompute of the forward
    assert torch.equal(y, y_eager)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-2, atol=1e-2)


def test_export_traces_on_fake_tensors_without_running_a_kernel():
    # strict export (dynamo, no graph break allowed) runs only the fake functions: the real op
    # would refuse these CPU tensors
    block, x = _block_and_input()
    with cpu.real_cpu_ops():
        ep = torch.export.export(block, (x.detach(),), strict=True)
    assert FWD in [n.target for n in ep.graph.nodes if n.op == "call_function"]


def test_joint_graph_traces_on_fake_tensors_with_the_backward_arguments():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, k, v, dout):
        out = fa4kernel.attention_op(q, k, v, causal=True, softmax_scale=0.25, deterministic=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    q, k, v = qkv(grad=True)
    dout = torch.randn(2, 37, 4, 64, dtype=torch.bfloat16)
    with cpu.real_cpu_ops():
        gm = make_fx(step, tracing_mode="fake")(q, k, v, dout)
    calls = {n.target: n for n in gm.graph.nodes if n.op == "call_function"}
    assert FWD in calls and BWD in calls
    assert tuple(calls[BWD].args[6:]) == (True, 0.25, True)  # causal, softmax_scale, deterministic


# ---- bad input: the same one-line ValueError eager, fake and compiled


BAD = {  # name: (q shape, k/v shape, dtype)
    "head_dim_100": ((1, 8, 4, 100), (1, 8, 4, 100), torch.bfloat16),
    "heads_3_of_kv_2": ((1, 8, 3, 64), (1, 8, 2, 64), torch.bfloat16),
    "fp32": ((1, 8, 4, 64), (1, 8, 4, 64), torch.float32),
}


def _bad(name, grad=False):
    qs, ks, dtype = BAD[name]
    return [torch.randn(s, dtype=dtype, requires_grad=grad) for s in (qs, ks, ks)]


def _eager_message(q, k, v):
    with pytest.raises(ValueError) as e:
        fa4kernel.attention(q.detach(), k.detach(), v.detach(), causal=True)
    return str(e.value)


@pytest.mark.parametrize("name", BAD)
def test_bad_input_raises_the_one_line_error_eager_and_fake(name):
    q, k, v = _bad(name)
    message = _eager_message(q, k, v)
    assert "\n" not in message
    with pytest.raises(ValueError) as e:
        fa4kernel.attention_op(q, k, v, causal=True)
    assert str(e.value) == message
    with FakeTensorMode() as mode, pytest.raises(ValueError) as e:
        FWD(*(mode.from_tensor(t) for t in (q, k, v)), True, None, False)
    assert str(e.value) == message


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize("grad", [False, True])
def test_bad_input_raises_the_same_error_under_torch_compile(name, grad):
    q, k, v = _bad(name, grad)
    message = _eager_message(q, k, v)

    def fn(q, k, v):
        return fa4kernel.attention_op(q, k, v, causal=True)

    torch._dynamo.reset()
    with pytest.raises(ValueError) as e:
        torch.compile(fn, backend="aot_eager")(q, k, v)
    assert str(e.value) == message
    # fullgraph=True: dynamo reports the raise as its own error (Unsupported: "Observed exception"),
    # the ValueError's line inside it
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported) as e:
        torch.compile(fn, backend="aot_eager", fullgraph=True)(q, k, v)
    assert repr(ValueError(message)) in str(e.value)


def test_the_fake_backward_checks_its_arguments():
    q, k, v = qkv()
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out, lse = FWD(fq, fk, fv, False, None, False)
        with pytest.raises(ValueError, match=r"^lse: \(2, 4, 37\) torch.bfloat16; allowed: a torch.float32 tensor"):
            BWD(out, fq, fk, fv, out, lse.to(torch.bfloat16), False, None, False)
    with pytest.raises(ValueError, match=r"^deterministic=1; allowed: True or False$"):
        fa4kernel.attention_op(q, k, v, deterministic=1)  # (the op's schema would take 1 as True)
