"""GPU correctness of fa4kernel.attention_with_kvcache (decode over a KV cache on the SM90
forward) against an fp32 torch reference.

Run on the device: pytest -m gpu tests/test_kvcache_gpu.py
"""

import math

import pytest

torch = pytest.importorskip("torch")

from hopper import gpu_marks  # noqa: E402

pytestmark = gpu_marks()

import fa4kernel  # noqa: E402

TOL = 1e-2


def _inputs(b, sq, sk, hkv, g, d=128, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    q = torch.randn(b, sq, hkv * g, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=gen)
    return q, k, v


def reference(q, k, v, lens, causal):
    """fp32: token t of row b sees keys [0, L_b) (causal: j <= L_b - sq + t); no key: 0, -inf.
    The keys past a row's length (NaN in check's cache, for the kernel) are zeros here: a masked
    key has p = 0, and 0 * NaN would be NaN in the reference's own sum."""
    b, sq, h, d = q.shape
    sk, g = k.shape[1], h // k.shape[2]
    past = (torch.arange(sk, device=q.device)[None, :] >= torch.tensor(lens, device=q.device)[:, None])
    kf = k.float().masked_fill(past[:, :, None, None], 0.0).repeat_interleave(g, dim=2)
    vf = v.float().masked_fill(past[:, :, None, None], 0.0).repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) / math.sqrt(d)
    L = torch.tensor(lens, device=q.device)[:, None, None, None]
    j = torch.arange(sk, device=q.device)
    t = torch.arange(sq, device=q.device)[:, None]
    mask = j >= L
    if causal:
        mask = mask | (j > L - sq + t)
    s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vf), lse


def check(q, k, v, lens, causal, num_splits):
    sk = k.shape[1]
    for r, L in enumerate(lens):  # keys past a row's length must not count
        k[r, L:] = float("nan")
        v[r, L:] = float("nan")
    seqlens = None if lens == [sk] * len(lens) else torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = fa4kernel.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=causal,
                                                num_splits=num_splits, return_lse=True)
    ref, ref_lse = reference(q, k, v, lens, causal)
    assert not torch.isnan(out).any(), "NaN in output"
    assert not torch.isnan(lse).any(), "NaN in lse"
    err = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-12)).item()
    assert err < TOL, f"rel err {err:.2e}"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin), "LSE finite pattern differs"
    if fin.any():
        assert (lse[fin] - ref_lse[fin]).abs().max().item() < 2e-2
    return err


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("g", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("sq", [1, 2, 5, 16])
def test_gqa_and_new_tokens(sq, g, causal):
    check(*_inputs(2, sq, 1000, 2, g, seed=sq * 31 + g), [1000, 1000], causal, None)


@pytest.mark.parametrize("ns", [None, 1, 2, 3, 4, 5, 6, 7, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_splits_odd_lengths(ns, causal):
    check(*_inputs(3, 3, 1001, 2, 4, seed=7), [1001] * 3, causal, ns)
    check(*_inputs(1, 1, 777, 8, 4, seed=8), [777], causal, ns)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq", [1, 4])
def test_ragged_lengths(sq, causal):
    low = sq if causal else 0
    lens = [low, 4096, 1234, 1234, 1234, 4095, low + 1, 4096]
    check(*_inputs(len(lens), sq, 4096, 4, 4, seed=11), lens, causal, None)
    check(*_inputs(len(lens), sq, 4096, 4, 4, seed=12), lens, causal, 3)


@pytest.mark.parametrize("hd", [64, 96, 128, 192, 256])
def test_head_dims(hd):
    check(*_inputs(2, 2, 3000, 2, 8, d=hd, seed=hd), [3000, 2500], True, None)


def test_fp16_and_the_decode_shapes():
    check(*_inputs(2, 1, 8192, 1, 8, dtype=torch.float16, seed=1), [8192, 8192], False, None)
    check(*_inputs(1, 1, 131072, 8, 4, seed=2), [131072], True, None)
    check(*_inputs(8, 4, 32768, 8, 4, seed=3), [32768] * 8, True, None)
