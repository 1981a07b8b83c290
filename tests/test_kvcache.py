"""fa4kernel.attention_with_kvcache on the CPU: its host side (pack-GQA, the causal tail, split-KV
views, ragged cache lengths, the combine) against a direct fp64 reference of decode attention.

The kernel cannot run here: every launch goes through fa4kernel.interface.attention, which the
fixture replaces with STAND_IN, a torch fp64 stand-in of exactly its contract (the same input
checks, bottom-right causal, GQA, out in q's dtype, lse fp32 natural log, out 0 and lse -inf for
rows that see no key). tests/test_kvcache_gpu.py runs the real kernel."""
import math
import random

import pytest

torch = pytest.importorskip("torch")

import fa4kernel  # noqa: E402
from fa4kernel import interface, kvcache  # noqa: E402
from fa4kernel.inputs import validate_tensors  # noqa: E402
from fa4kernel.sm90.config import SUPPORTED_HEAD_DIMS  # noqa: E402

LAUNCHES = []
REAL_ATTENTION = interface.attention


def STAND_IN(q, k, v, causal=False, softmax_scale=None, return_lse=False, **knobs):
    """A stand-in for the kernel (not the kernel): fa4kernel.attention's contract in fp64."""
    validate_tensors(q, k, v, causal, softmax_scale, return_lse, head_dims=SUPPORTED_HEAD_DIMS, gqa=True)
    assert not knobs
    LAUNCHES.append((tuple(q.shape), tuple(k.shape), causal))
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    kf = k.double().repeat_interleave(h // hkv, dim=2)
    vf = v.double().repeat_interleave(h // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kf) * scale
    if causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vf).to(q.dtype)
    return (o, lse.float()) if return_lse else o


@pytest.fixture(autouse=True)
def stand_in(monkeypatch):
    monkeypatch.setattr(interface, "attention", STAND_IN)
    LAUNCHES.clear()
    yield


def reference(q, k_cache, v_cache, lens, causal, scale=None):
    """Decode attention in fp64, row by row: token t of row b sees keys [0, L_b) (causal:
    j <= L_b - sq + t). Rows that see no key: out 0, lse -inf."""
    b, sq, h, d = q.shape
    g = h // k_cache.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    out = torch.zeros(b, sq, h, d, dtype=torch.float64)
    lse = torch.full((b, h, sq), float("-inf"), dtype=torch.float64)
    for r in range(b):
        L = lens[r]
        if L == 0:
            continue
        kk = k_cache[r, :L].double().repeat_interleave(g, dim=1)  # (L, h, d)
        vv = v_cache[r, :L].double().repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[r].double(), kk) * scale
        if causal:
            t = torch.arange(sq)[:, None]
            j = torch.arange(L)[None, :]
            s = s.masked_fill(j > L - sq + t, float("-inf"))
        lse[r] = torch.logsumexp(s, dim=-1)
        out[r] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv)
    return out, lse


def _inputs(b, sq, sk, hkv, g, d=64, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, hkv * g, d, generator=gen).to(dtype)
    k = torch.randn(b, sk, hkv, d, generator=gen).to(dtype)
    v = torch.randn(b, sk, hkv, d, generator=gen).to(dtype)
    return q, k, v


def check(q, k, v, lens, causal, num_splits, scale=None, garbage=True):
    if garbage:  # keys past a row's length must not count: NaN there would show
        for r, L in enumerate(lens):
            k[r, L:] = float("nan")
            v[r, L:] = float("nan")
    seqlens = None if lens == [k.shape[1]] * k.shape[0] else torch.tensor(lens, dtype=torch.int32)
    out, lse = fa4kernel.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=causal, softmax_scale=scale,
                                                num_splits=num_splits, return_lse=True)
    ref, ref_lse = reference(q, k, v, lens, causal, scale)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin].double() - ref_lse[fin]).abs().max().item() < 1e-4 if fin.any() else True
    assert torch.equal(out[~fin.transpose(1, 2)].float(), torch.zeros_like(out[~fin.transpose(1, 2)].float()))
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-12)).item()
    assert err < 2e-3, f"rel err {err:.2e}"


def _cases(n, seed):
    rnd = random.Random(seed)
    for _ in range(n):
        g = rnd.choice([1, 2, 4, 8, 16])
        hkv = rnd.choice([1, 2]) if g < 16 else 1
        sq = rnd.choice([1, 1, 2, 3, 5, 16])
        b = rnd.choice([1, 2, 3, 4])
        sk = rnd.choice([sq, 17, 64, 129, 255, 300, 1001])
        sk = max(sk, sq)
        causal = rnd.random() < 0.5
        yield g, hkv, sq, b, sk, causal, rnd.choice([None, 1, 2, 3, 4, 5, 6, 7]), rnd.randrange(2**31)


@pytest.mark.parametrize("g,hkv,sq,b,sk,causal,ns,seed", list(_cases(60, 1)))
def test_full_cache_random(g, hkv, sq, b, sk, causal, ns, seed):
    q, k, v = _inputs(b, sq, sk, hkv, g, seed=seed)
    check(q, k, v, [sk] * b, causal, ns)


@pytest.mark.parametrize("g,hkv,sq,b,sk,causal,ns,seed", list(_cases(60, 2)))
def test_ragged_cache_random(g, hkv, sq, b, sk, causal, ns, seed):
    rnd = random.Random(seed)
    low = sq if causal else 0
    lens = [rnd.choice([low, sk, rnd.randint(low, sk)]) for _ in range(b)]
    q, k, v = _inputs(b, sq, sk, hkv, g, seed=seed)
    check(q, k, v, lens, causal, ns)


@pytest.mark.parametrize("ns", range(1, 8))
@pytest.mark.parametrize("causal", [False, True])
def test_every_split_count_and_more_splits_than_keys(ns, causal):
    q, k, v = _inputs(3, 4, 6, 2, 4, seed=ns)
    check(q, k, v, [6, 6, 6], causal, ns)
    q, k, v = _inputs(1, 1, 5, 1, 8, seed=ns)
    check(q, k, v, [5], causal, 7 * ns)
    q, k, v = _inputs(4, 2, 300, 2, 2, seed=ns)
    check(q, k, v, [300, 2, 0 if not causal else 2, 299], causal, ns)


def test_zero_length_rows_give_zero_and_minus_inf():
    q, k, v = _inputs(3, 1, 40, 2, 4, seed=5)
    check(q, k, v, [0, 40, 0], False, 3)
    out, lse = fa4kernel.attention_with_kvcache(q, k, v, torch.zeros(3, dtype=torch.int32), causal=False,
                                                return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_bf16_and_a_scale():
    q, k, v = _inputs(2, 3, 200, 2, 4, dtype=torch.bfloat16, seed=9)
    out = fa4kernel.attention_with_kvcache(q, k, v, torch.tensor([200, 77], dtype=torch.int32), causal=True,
                                           softmax_scale=0.3, num_splits=3)
    ref, _ = reference(q, k, v, [200, 77], True, 0.3)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_one_new_token_packs_and_splits_in_one_launch():
    q, k, v = _inputs(2, 1, 4096, 8, 4, seed=3)
    fa4kernel.attention_with_kvcache(q, k, v, num_splits=4)
    assert LAUNCHES == [((8, 4, 8, 64), (8, 1024, 8, 64), False)]  # 2 rows x 4 chunks, 4 packed rows, heads_kv


def test_causal_tokens_run_body_gaps_and_tail():
    q, k, v = _inputs(2, 4, 4096, 2, 4, seed=3)
    check(q, k, v, [4096, 4096], True, 4, garbage=False)
    assert LAUNCHES == [((2, 4, 8, 64), (2, 4, 2, 64), True),        # the tail: unpacked, causal
                        ((8, 16, 2, 64), (8, 1020, 2, 64), False),   # the body's chunks
                        ((8, 16, 2, 64), (8, 4, 2, 64), False)]      # the keys between them


def test_heuristic():
    sms = 132
    assert kvcache.split_heuristic(1, 8, 4, 131072, 128, sms) == 16
    assert kvcache.split_heuristic(8, 8, 4, 32768, 128, sms) == 2
    assert kvcache.split_heuristic(64, 8, 8, 4096, 128, sms) == 1
    assert kvcache.split_heuristic(4, 1, 8, 65536, 128, sms) == 32
    assert kvcache.split_heuristic(1, 1, 1, 300, 128, sms) == 1  # chunks of at least MIN_SPLIT_KEYS
    for n in (1, 2, 3, 7):  # plans cover [0, P) exactly once
        for P, rows, period in ((1001, 1, None), (1001, 2, 1001), (4092, 3, 4096), (5, 2, 300), (300, 4, 300)):
            plan = kvcache.plan_body(P, n, rows, period)
            keys = sorted(p.start + s * p.stride + j for p in plan for s in range(p.used) for j in range(p.length))
            assert keys == list(range(P)), (P, n, rows, period)
            if rows > 1:
                assert all(p.count == 1 or p.count * p.stride == period for p in plan)


def _bad(**kw):
    q, k, v = _inputs(2, 2, 32, 2, 2)
    args = dict(q=q, k_cache=k, v_cache=v)
    args.update(kw)
    with pytest.raises(ValueError) as e:
        fa4kernel.attention_with_kvcache(**args)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_inputs():
    q, k, v = _inputs(2, 2, 32, 2, 2)
    assert "heads_kv dividing heads" in _bad(q=torch.randn(2, 2, 3, 64, dtype=torch.float16))
    assert "seqlen_cache=1 < seqlen_q=2" in _bad(k_cache=k[:, :1], v_cache=v[:, :1])
    assert "allowed: each in [2, 32]" in _bad(cache_seqlens=torch.tensor([1, 32], dtype=torch.int32))
    assert "allowed: each in [0, 32]" in _bad(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32), causal=False)
    assert "allowed: each in [2, 32]" in _bad(cache_seqlens=torch.tensor([33, 3], dtype=torch.int32))
    assert "int32 tensor of shape (2,)" in _bad(cache_seqlens=torch.tensor([3, 3]))
    assert "int32 tensor of shape (2,)" in _bad(cache_seqlens=torch.tensor([3], dtype=torch.int32))
    assert "int32 tensor of shape (2,)" in _bad(cache_seqlens=[3, 3])
    assert "dtype" in _bad(q=q.float())
    assert "dtypes differ" in _bad(k_cache=k.bfloat16(), v_cache=v.bfloat16())
    assert "k_cache shape" in _bad(v_cache=v[:, :5])
    assert "must be 4-D" in _bad(q=q[0])
    assert "does not match q shape" in _bad(k_cache=k[:1], v_cache=v[:1])
    assert "num_splits=0" in _bad(num_splits=0)
    assert "num_splits=True" in _bad(num_splits=True)
    assert "num_splits=2.0" in _bad(num_splits=2.0)
    assert "causal=1" in _bad(causal=1)
    assert "softmax_scale" in _bad(softmax_scale=-1.0)
    assert "requires grad" in _bad(q=q.clone().requires_grad_())
    assert "head_dim=32 not supported" in _bad(q=q[..., :32], k_cache=k[..., :32].contiguous(),
                                                v_cache=v[..., :32].contiguous())


def test_the_real_launch_refuses_the_cpu(monkeypatch):
    monkeypatch.setattr(interface, "attention", REAL_ATTENTION)
    q, k, v = _inputs(1, 1, 32, 1, 1)
    with pytest.raises(ValueError, match="CUDA device"):
        fa4kernel.attention_with_kvcache(q, k, v)
