"""GPU correctness of fa4kernel.attention with cu_seqlens (varlen: packed sequences of unequal
lengths on the SM90 forward's and backward's varlen builds, deterministic too) against an fp32
torch reference of each sequence: odd lengths, empty and one-token sequences, chunks (len_q <
len_k), GQA, every head dim, fp16, pack-GQA for MQA (the default; pack_gqa=True asks for it);
NaN in the rows past the last sequence must not leak into the forward, finite rows there get no
gradient.

Run on the device: python3 -m pytest -c /dev/null --rootdir . -p no:cacheprovider -p no:xdist -q -rfE \
    tests/test_varlen_gpu.py
"""

import math

import pytest

torch = pytest.importorskip("torch")

from hopper import gpu_marks  # noqa: E402

pytestmark = gpu_marks()

import fa4kernel  # noqa: E402

TOL = 1e-2


def _cu(lens):
    return torch.tensor([0] + list(lens), dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)


def _inputs(lens_q, lens_k, h, hkv, d, dtype, seed, tail=0):
    """Packed q, k, v with `tail` rows of NaN after the last sequence (rows the kernel must not use)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    q = torch.randn(sum(lens_q) + tail, h, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(sum(lens_k) + tail, hkv, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(sum(lens_k) + tail, hkv, d, device="cuda", dtype=dtype, generator=gen)
    if tail:
        for t in (q, k, v):
            t[t.shape[0] - tail:] = float("nan")
    return q, k, v


def reference(q, k, v, lens_q, lens_k, causal):
    """fp32 per sequence; causal bottom-right; a sequence without keys: out 0, lse -inf."""
    d = q.shape[-1]
    g = q.shape[1] // k.shape[1]
    outs, lses = [], []
    a = c = 0
    for lq, lk in zip(lens_q, lens_k):
        qs, ks, vs = q[a:a + lq].float(), k[c:c + lk].float(), v[c:c + lk].float()
        s = torch.einsum("qhd,khd->hqk", qs, ks.repeat_interleave(g, 1)) / math.sqrt(d)
        if causal:
            j = torch.arange(lk, device=q.device)[None, :]
            i = torch.arange(lq, device=q.device)[:, None]
            s = s.masked_fill(j > i + lk - lq, float("-inf"))
        lses.append(torch.logsumexp(s, -1))
        p = torch.softmax(s, -1).nan_to_num(0.0)
        outs.append(torch.einsum("hqk,khd->qhd", p, vs.repeat_interleave(g, 1)))
        a, c = a + lq, c + lk
    return torch.cat(outs), torch.cat(lses, dim=1)


def rel(a, b):
    return ((a.float() - b).norm() / b.norm().clamp_min(1e-12)).item()


def check(lens_q, lens_k, causal, h=4, hkv=2, d=128, dtype=torch.bfloat16, seed=0, tail=0, give_max=False,
          **knobs):
    q, k, v = _inputs(lens_q, lens_k, h, hkv, d, dtype, seed, tail)
    kw = dict(max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k)) if give_max else {}
    out, lse = fa4kernel.attention(q, k, v, causal=causal, return_lse=True, cu_seqlens_q=_cu(lens_q),
                                   cu_seqlens_k=_cu(lens_k), **kw, **knobs)
    n = sum(lens_q)
    ref, ref_lse = reference(q, k, v, lens_q, lens_k, causal)
    out, lse = out[:n], lse[:, :n]
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), "NaN in out or lse"
    assert rel(out, ref) < TOL, f"rel err {rel(out, ref):.2e}"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin), "LSE finite pattern differs"
    if fin.any():
        assert (lse[fin] - ref_lse[fin]).abs().max().item() < 2e-2


ODD = [1, 0, 777, 129, 5000, 33, 0, 2]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
def test_odd_lengths_every_head_dim(d, causal):
    check(ODD, ODD, causal, d=d, seed=d, tail=5)


# sequences that fill their tiles exactly (O out by TMA) beside partial ones (row stores), at
# tile_m 128 and 192 alike (multiples of 384); a full tile's store must not touch the next
# sequence's rows
EXACT = [384, 77, 768, 1, 384, 0, 1152, 129]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 192, 256])
def test_full_tiles_beside_partial_ones(d, causal):
    check(EXACT, EXACT, causal, h=4, hkv=4, d=d, seed=100 + d + causal, tail=3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h,hkv", [(4, 4), (8, 2), (16, 1), (6, 3)])
def test_chunks_and_gqa(h, hkv, causal):
    """chunked prefill (len_q < len_k, causal bottom-right) and len_k < len_q, GQA ratios 1-16."""
    check([300, 1, 64, 1000, 7], [2300, 1, 900, 1000, 3], causal, h=h, hkv=hkv, seed=h * 7 + hkv)


def test_fp16_and_given_max_lengths():
    check([100, 8000, 3000, 17], [100, 8000, 3000, 17], True, dtype=torch.float16, seed=3, give_max=True)


def test_many_short_sequences():
    lens = [1 + (37 * i) % 190 for i in range(64)]
    check(lens, lens, True, h=8, hkv=8, seed=4)


def check_kw(lens_q, lens_k, causal, h, hkv, d, seed, **knobs):
    """check(), with attention() knobs; returns the output for a bitwise comparison."""
    q, k, v = _inputs(lens_q, lens_k, h, hkv, d, torch.bfloat16, seed)
    out = fa4kernel.attention(q, k, v, causal=causal, cu_seqlens_q=_cu(lens_q), cu_seqlens_k=_cu(lens_k), **knobs)
    ref, _ = reference(q, k, v, lens_q, lens_k, causal)
    n = sum(lens_q)
    assert not torch.isnan(out[:n]).any(), "NaN in out"
    assert rel(out[:n], ref) < TOL, f"rel err {rel(out[:n], ref):.2e}"
    return out[:n]


# 100 sequences (the tile search's chunks of 32, four of them) with empty and one-row ones;
# a CTA count of 1 makes one CTA walk every tile; 5 makes CTAs take tiles from the counter
# at unequal paces; None: one per SM
MANY = [(0 if i % 17 == 3 else 1 + (53 * i) % 700) for i in range(100)]


@pytest.mark.parametrize("ctas", [1, 5, None])
@pytest.mark.parametrize("d,causal", [(128, True), (128, False), (64, True), (96, False)])
def test_persistent_ctas_take_every_tile_once(d, causal, ctas, monkeypatch):
    """The persistent varlen build: every tile run once whatever the CTA count, the tile counter
    back at 0 after each launch (a second launch gives the same bits)."""
    from fa4kernel import interface

    monkeypatch.setattr(interface, "MAX_CTAS", ctas)
    first = check_kw(MANY, MANY, causal, 4, 2, d, seed=d + causal)
    assert all(int(c.item()) == 0 for c in interface._TILE_COUNTERS.values()), "the tile counter was left nonzero"
    again = check_kw(MANY, MANY, causal, 4, 2, d, seed=d + causal)
    assert torch.equal(first, again)


@pytest.mark.parametrize("d", [128, 256])
def test_one_cta_per_tile_and_persistent_agree(d):
    """persistent=False (one CTA per tile, no counter) and persistent=True (the default; at hd256 O
    shares Q's buffer and Q goes back only after the O store) give the default build's result."""
    lens = [300, 1, 0, 1000, 77, 4097]
    base = check_kw(lens, lens, True, 4, 4, d, seed=11)
    for pers in (False, True):
        other = check_kw(lens, lens, True, 4, 4, d, seed=11, persistent=pers)
        assert rel(other, base.float()) < 1e-3


def test_equals_the_padded_batch():
    """Equal lengths: the varlen build gives the ordinary forward's bits where the tiles agree."""
    b, s, h, d = 3, 1000, 4, 128
    q, k, v = _inputs([b * s], [b * s], h, h, d, torch.bfloat16, 9)
    out = fa4kernel.attention(q, k, v, causal=True, cu_seqlens_q=_cu([s] * b), cu_seqlens_k=_cu([s] * b))
    ref = fa4kernel.attention(q.view(b, s, h, d), k.view(b, s, h, d), v.view(b, s, h, d), causal=True)
    assert rel(out, ref.reshape(b * s, h, d).float()) < 1e-3


def check_backward(lens_q, lens_k, causal, h, hkv, d, dtype=torch.bfloat16, seed=0, tail=0, **kw):
    """Gradients of the packed batch against fp32 autograd per sequence; `tail` finite rows after
    the last sequence (in q, k, v: the kernel reads some of them) get zero gradients."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    q, k, v = (torch.randn(sum(n) + tail, hh, d, device="cuda", dtype=dtype, generator=gen)
               for n, hh in ((lens_q, h), (lens_k, hkv), (lens_k, hkv)))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = fa4kernel.attention(q, k, v, causal=causal, cu_seqlens_q=_cu(lens_q), cu_seqlens_k=_cu(lens_k), **kw)
    dout = torch.randn(out.shape, device="cuda", dtype=dtype, generator=gen)
    out.backward(dout)
    nq, nk = sum(lens_q), sum(lens_k)
    qf, kf, vf = (t.detach()[:n].float().requires_grad_() for t, n in ((q, nq), (k, nk), (v, nk)))
    ref, _ = reference(qf, kf, vf, lens_q, lens_k, causal)
    ref.backward(dout[:nq].float())
    for name, got, want, n in (("dq", q.grad, qf.grad, nq), ("dk", k.grad, kf.grad, nk), ("dv", v.grad, vf.grad, nk)):
        assert not torch.isnan(got).any(), f"NaN in {name}"
        assert rel(got[:n], want) < TOL, f"{name} rel err {rel(got[:n], want):.2e}"
        assert not got[n:].any(), f"{name}: the rows past the last sequence have a gradient"


# one-token and empty sequences, queries without keys, keys without queries, chunks (len_q <
# len_k), len_q > len_k, lengths around the 64 / 128-row blocks and an odd count of 64-key blocks
BWD_Q = [1, 300, 0, 129, 77, 3, 1000, 64]
BWD_K = [5, 300, 4, 129, 200, 0, 1000, 63]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,h,hkv", [(64, 4, 4), (96, 4, 2), (128, 8, 2), (192, 4, 4), (256, 2, 1)])
def test_backward(d, h, hkv, causal):
    check_backward(BWD_Q, BWD_K, causal, h, hkv, d, seed=d + h)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_backward_gqa_tail_and_fp16(d):
    check_backward([777, 1, 2049], [777, 3000, 2049], True, 16, 2, d, dtype=torch.float16, seed=d, tail=37)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,h,hkv", [(64, 8, 1), (96, 4, 2), (128, 8, 2), (128, 16, 1), (192, 4, 1), (256, 4, 2)])
def test_backward_gqa_dkv_reduce(d, h, hkv, causal):
    """gqa_dkv="reduce" on the packed batch (empty and one-token sequences, chunks, a tail after
    the last sequence: its rows' dK and dV stay zero, the next sequence's rows are not added into)."""
    check_backward(BWD_Q, BWD_K, causal, h, hkv, d, seed=d + hkv, tail=5, bwd_knobs={"gqa_dkv": "reduce"})


def test_backward_many_short_sequences():
    lens = [1 + (i * 97) % 300 for i in range(40)]
    check_backward(lens, lens, True, 8, 8, 128, seed=3)


def test_backward_equals_the_padded_batch():
    """Equal lengths: the varlen build's gradients match the dense backward's closely."""
    b, s, h, d = 3, 517, 4, 128
    q, k, v = _inputs([b * s], [b * s], h, h, d, torch.bfloat16, 11)
    dout = torch.randn_like(q)
    grads = []
    for packed in (True, False):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        if packed:
            out = fa4kernel.attention(qq, kk, vv, causal=True, cu_seqlens_q=_cu([s] * b), cu_seqlens_k=_cu([s] * b))
        else:
            out = fa4kernel.attention(qq.view(b, s, h, d), kk.view(b, s, h, d), vv.view(b, s, h, d),
                                      causal=True).reshape(b * s, h, d)
        out.backward(dout)
        grads.append([t.grad.float() for t in (qq, kk, vv)])
    for a, b_ in zip(*grads):
        assert rel(a, b_) < 2e-3


# chunks (few queries on many keys: the rule's copies), an empty and a one-token sequence, keys
# without queries, and odd lengths around the blocks
SLICES_Q = [256, 1, 0, 77, 1000, 129]
SLICES_K = [8191, 3000, 5, 4001, 1000, 63]


@pytest.mark.parametrize("slices", [2, 8, 32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,h,hkv", [(64, 4, 4), (128, 8, 2), (256, 4, 1)])
def test_deterministic_backward_slices(d, h, hkv, causal, slices):
    """dq_slices copies on the packed batch: within the fp32 bound (no NaN), the same bits twice,
    and the default (the rule, from the longest sequences) the same way."""
    check_backward(SLICES_Q, SLICES_K, causal, h, hkv, d, seed=d + slices, tail=3, deterministic=True,
                   bwd_knobs={"dq_slices": slices})
    q, k, v = _inputs(SLICES_Q, SLICES_K, h, hkv, d, torch.bfloat16, 7)
    dout = torch.randn_like(q)
    for knobs in ({"dq_slices": slices}, {}):
        grads = []
        for _ in range(2):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            out = fa4kernel.attention(qq, kk, vv, causal=causal, deterministic=True, cu_seqlens_q=_cu(SLICES_Q),
                                      cu_seqlens_k=_cu(SLICES_K), bwd_knobs=knobs)
            out.backward(dout)
            grads.append([t.grad for t in (qq, kk, vv)])
        assert all(torch.isfinite(a.float()).all() for a in grads[0])
        assert all(torch.equal(a, b) for a, b in zip(*grads)), knobs


@pytest.mark.parametrize("d,causal", [(128, True), (64, False), (256, True), (192, False)])
def test_deterministic_backward_is_bit_repeatable_and_right(d, causal):
    """deterministic=True: the varlen build with a fixed dQ order per query block (short and long
    sequences, GQA): the same bits twice, within the fp32 bound."""
    check_backward(BWD_Q, BWD_K, causal, 4, 2, d, seed=d, deterministic=True)
    lens = [513, 77, 1000, 1, 0, 300]
    q, k, v = _inputs(lens, lens, 8, 2, d, torch.bfloat16, 5)
    dout = torch.randn_like(q)
    grads = []
    for _ in range(2):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = fa4kernel.attention(qq, kk, vv, causal=causal, deterministic=True, cu_seqlens_q=_cu(lens),
                                  cu_seqlens_k=_cu(lens))
        out.backward(dout)
        grads.append([t.grad for t in (qq, kk, vv)])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


# pack-GQA for MQA (its default; pack_gqa=True here: one k/v head, its q heads as the rows of one
# head): one-token and empty sequences, a sequence without keys, chunks (len_q < len_k) and
# len_q > len_k (causal: rows whose token sees no key), lengths around the 128 / 192-row tiles;
# groups that divide a tile's rows and groups that do not (a token's rows across two tiles)
PACK_Q = [1, 0, 777, 129, 4097, 33, 3, 300, 7]
PACK_K = [1, 0, 777, 129, 4097, 33, 0, 2300, 2]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [2, 3, 8, 20, 32])
def test_pack_gqa_mqa(group, causal, dtype):
    check(PACK_Q, PACK_K, causal, h=group, hkv=1, dtype=dtype, seed=group + 2 * causal, tail=5, pack_gqa=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 96, 192, 256])
def test_pack_gqa_mqa_every_head_dim(d, causal):
    check(PACK_Q, PACK_K, causal, h=6, hkv=1, d=d, seed=d, pack_gqa=True, give_max=True)


@pytest.mark.parametrize("persistent", [False, True])
def test_pack_gqa_equals_the_unpacked_build(persistent):
    """The batch of lab/tools/bench_varlen_sm90.py's mqa-hd128-causal (32 q heads on one): packed,
    one CTA per tile or persistent, against the unpacked build; 100 sequences (the tile search's
    chunks) likewise."""
    for lens, h in (([700, 2300, 4097, 1, 150, 3333], 32), (MANY, 4)):
        base = check_kw(lens, lens, True, h, 1, 128, seed=h, pack_gqa=False)
        packed = check_kw(lens, lens, True, h, 1, 128, seed=h, pack_gqa=True, persistent=persistent)
        assert rel(packed, base.float()) < 1e-3


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,h", [(64, 8), (128, 32), (256, 3)])
def test_pack_gqa_backward(d, h, causal):
    """With grad the forward packs too; the backward gets out and lse unpacked."""
    check_backward(BWD_Q, BWD_K, causal, h, 1, d, seed=d + h, tail=5, pack_gqa=True)
