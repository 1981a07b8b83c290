"""Test stand-ins: torch reference kernels registered as the CPU kernels of fa4kernel's custom ops
(fa4lab::attention_fwd / attention_bwd), so that tracing, torch.compile and autograd through the
ops run on a machine without a GPU. NOT fa4kernel's kernels: fp32 torch math, same layouts as
the real ones (out (b, s_q, h, d) and lse (b, h, s_q) contiguous; dq, dk, dv contiguous).

install() registers them (once per process); the real ops' own CPU answer (a one-line
ValueError: q is on cpu) comes back inside `with real_cpu_ops():`.
"""

import contextlib
import math

import torch

_INSTALLED = False


def reference(q, k, v, causal=False, scale=None):
    """fp32 (out (b, s_q, h, d), lse (b, h, s_q), p (b, h, s_q, s_k), k and v repeated to h heads);
    causal bottom-right aligned, as fa4kernel's."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    group = q.shape[2] // k.shape[2]  # GQA: q head i reads k/v head i // group
    kf, vf = k.float().repeat_interleave(group, 2), v.float().repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vf), lse, p, kf, vf


def _fwd_cpu(q, k, v, causal=False, softmax_scale=None, deterministic=False):
    out, lse, *_ = reference(q, k, v, causal, softmax_scale)
    return out.to(q.dtype).contiguous(), lse.contiguous()


def _bwd_cpu(dout, q, k, v, out, lse, causal=False, softmax_scale=None, deterministic=False):
    # the formulas by hand: a kernel runs below autograd, so torch.autograd.grad is not at hand
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    o, _, p, kf, vf = reference(q, k, v, causal, softmax_scale)
    do = dout.float()
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vf)
    ds = p * (dp - (do * o).sum(-1).transpose(1, 2)[..., None]) * scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kf)
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.float())
    b, sk, hkv, d = k.shape
    dk = dk.view(b, sk, hkv, -1, d).sum(3)  # GQA: a k/v head's grad sums over its q heads
    dv = dv.view(b, sk, hkv, -1, d).sum(3)
    return tuple(g.to(t.dtype).contiguous() for g, t in ((dq, q), (dk, k), (dv, v)))


def install():
    global _INSTALLED
    if not _INSTALLED:
        from fa4kernel import ops

        ops.attention_fwd.register_kernel("cpu")(_fwd_cpu)
        ops.attention_bwd.register_kernel("cpu")(_bwd_cpu)
        _INSTALLED = True


@contextlib.contextmanager
def real_cpu_ops():
    """The ops' own implementation on CPU tensors (fa4kernel.attention: it refuses the CPU)."""
    from fa4kernel import ops

    with ops.attention_fwd.set_kernel_enabled("cpu", False), ops.attention_bwd.set_kernel_enabled("cpu", False):
        yield
