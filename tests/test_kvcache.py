"""fa4kernel.attention_with_kvcache on the CPU: its host side (the plan, pack-GQA views and
copies, the split count, the launches' arguments) against a direct fp64 reference of decode
attention.

The kernels cannot run here: the fixture replaces kvcache.launch_decode and launch_combine with
fp64 torch stand-ins of their contracts (not the kernels): DECODE_STAND_IN runs every (Q tile,
split, k/v head, batch row) CTA of the forward's decode build over the KV range the kernel takes
(block_info.decode_block_range, the kernel's own arithmetic), COMBINE_STAND_IN adds the partials
up as sm90/combine.py does. tests/test_kvcache_gpu.py runs the real kernels."""
import math
import random

import pytest

torch = pytest.importorskip("torch")

import fa4kernel  # noqa: E402
from fa4kernel import kvcache  # noqa: E402
from fa4kernel.block_info import decode_block_range, decode_unmasked  # noqa: E402

LAUNCHES = []
REAL_LAUNCH = kvcache.launch_decode


def DECODE_STAND_IN(cfg, q, k, v, out, lse, seqused_k, group, num_splits, softmax_scale):
    """The decode build's contract in fp64 (FlashFwdSm90Decode's docstring)."""
    b, rows, hkv, d = q.shape
    sk = k.shape[1]
    assert k.shape == (b, sk, hkv, d) and seqused_k.dtype == torch.int32 and seqused_k.shape == (b,)
    assert out.shape == ((num_splits * b if cfg.split_kv else b), rows, hkv, d)
    assert out.dtype == (torch.float32 if cfg.split_kv else q.dtype) and lse.shape == (out.shape[0], hkv, rows)
    assert cfg.split_kv or num_splits == 1
    LAUNCHES.append(("decode", tuple(q.shape), num_splits, cfg.split_kv, cfg.causal))
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    tokens = torch.arange(rows) // group
    for bi in range(b):
        L = int(seqused_k[bi])
        for split in range(num_splits):
            ob = split * b + bi if cfg.split_kv else bi
            for m in range(-(-rows // cfg.tile_m)):
                n_min, n_blocks, limit, offset = decode_block_range(
                    m, split, num_splits, cfg.tile_m, cfg.tile_n, rows, group, L, sk, cfg.causal)
                r = slice(m * cfg.tile_m, min(rows, (m + 1) * cfg.tile_m))
                j = torch.arange(n_blocks * cfg.tile_n)
                absj = n_min * cfg.tile_n + j
                see = (j[None, :] < limit) & (absj[None, :] < sk)
                if cfg.causal:
                    see = see & (j[None, :] <= offset + tokens[r][:, None])
                kk = k[bi, absj.clamp_max(sk - 1)].double()  # (keys, hkv, d)
                vv = v[bi, absj.clamp_max(sk - 1)].double()
                s = torch.einsum("rhd,khd->hrk", q[bi, r].double(), kk) * scale
                s = s.masked_fill(~see[None], float("-inf"))
                ls = torch.logsumexp(s, dim=-1)  # (hkv, rows)
                p = torch.exp(s - ls[..., None]).nan_to_num(0.0)
                o = torch.einsum("hrk,khd->rhd", p, vv.masked_fill(~see.any(0)[:, None, None], 0.0))
                out[ob, r] = o.to(out.dtype)
                lse[ob, :, r] = ls.float()


def COMBINE_STAND_IN(out_accum, lse_accum, out, lse, group, num_splits):
    """sm90/combine.py's contract in fp64."""
    b, sq, h, d = out.shape
    hkv, rows = h // group, sq * group
    assert out_accum.shape == (num_splits * b, rows, hkv, d) and lse_accum.shape == (num_splits * b, hkv, rows)
    LAUNCHES.append(("combine", num_splits))
    o = out_accum.double().view(num_splits, b, rows, hkv, d)
    ls = lse_accum.double().view(num_splits, b, hkv, rows)
    top = ls.amax(0).clamp_min(torch.finfo(torch.float64).min)
    w = torch.exp(ls - top)
    total = w.sum(0)
    lse_p = torch.where(total > 0, top + torch.log(total), float("-inf"))  # (b, hkv, rows)
    w = w / total.clamp_min(1e-300)
    o = torch.einsum("sbhr,sbrhd->brhd", w, o)  # (b, rows, hkv, d)
    out.copy_(o.view(b, sq, group, hkv, d).permute(0, 1, 3, 2, 4).reshape(b, sq, h, d).to(out.dtype))
    lse.copy_(lse_p.view(b, hkv, sq, group).permute(0, 1, 3, 2).reshape(b, h, sq).float())


@pytest.fixture(autouse=True)
def stand_in(monkeypatch):
    monkeypatch.setattr(kvcache, "launch_decode", DECODE_STAND_IN)
    monkeypatch.setattr(kvcache, "launch_combine", COMBINE_STAND_IN)
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


def test_one_new_token_packs_by_a_view_and_splits_in_the_grid():
    q, k, v = _inputs(2, 1, 4096, 8, 4, seed=3)
    fa4kernel.attention_with_kvcache(q, k, v, num_splits=4)
    # 4 packed rows per k/v head; causal with one new token builds no mask
    assert LAUNCHES == [("decode", (2, 4, 8, 64), 4, True, False), ("combine", 4)]
    LAUNCHES.clear()
    out = fa4kernel.attention_with_kvcache(q, k, v, num_splits=1)
    assert LAUNCHES == [("decode", (2, 4, 8, 64), 1, False, False)]  # out written in place: no combine
    ref, _ = reference(q, k, v, [4096, 4096], True)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 2e-3


def test_causal_tokens_run_packed_in_one_launch():
    q, k, v = _inputs(2, 4, 4096, 2, 4, seed=3)
    check(q, k, v, [4096, 4000], True, 1, garbage=False)
    # 4 tokens x group 4 packed rows, no view of out: the combine unpacks them
    assert LAUNCHES == [("decode", (2, 16, 2, 64), 1, True, True), ("combine", 1)]


def test_more_splits_than_blocks_take_one_per_block():
    q, k, v = _inputs(1, 1, 300, 1, 8, seed=4)
    check(q, k, v, [300], False, 64)
    assert LAUNCHES[0][2] == 3  # 300 keys: 3 blocks of 128


def test_heuristic():
    sms = 132
    # the decode rows (hd128: 128 x 128 tiles): CTAs for half the SMs (66 of 132)
    assert kvcache.split_heuristic(1, 8, 4, 1024, 128, sms) == 9  # 8 tiles: 72 CTAs
    assert kvcache.split_heuristic(8, 8, 4, 256, 128, sms) == 2  # 64 tiles: 128 CTAs
    assert kvcache.split_heuristic(64, 8, 8, 32, 128, sms) == 1  # 512 CTAs fill the SMs unsplit
    assert kvcache.split_heuristic(4, 1, 8, 512, 128, sms) == 17  # MQA: 4 tiles, 68 CTAs
    assert kvcache.split_heuristic(8, 8, 16, 256, 128, sms) == 2
    assert kvcache.split_heuristic(1, 8, 4, 16, 128, sms) == 8  # 2k keys: 2 blocks per split at least
    assert kvcache.split_heuristic(12, 8, 4, 256, 128, sms) == 1  # 96 tiles: already half the SMs, no combine
    assert kvcache.split_heuristic(1, 1, 1, 3, 128, sms) == 1  # splits of at least MIN_SPLIT_BLOCKS
    for n in (1, 2, 3, 7):  # the splits of a row cover its blocks exactly once
        for L, causal, rows, g in ((1001, False, 4, 4), (1001, True, 12, 4), (0, False, 1, 1), (129, True, 16, 1)):
            for m in range(-(-rows // 128)):
                got = []
                for s in range(n):
                    lo, nb, limit, _ = decode_block_range(m, s, n, 128, 128, rows, g, L, 2048, causal)
                    got += [lo * 128 + j for j in range(min(nb * 128, max(limit, 0)))]
                tokens = rows // g
                end = L if not causal else L - tokens + min(((m + 1) * 128 - 1) // g, tokens - 1) + 1
                assert sorted(got)[:end] == list(range(end)) and len(set(got)) == len(got), (n, L, causal)


def test_the_blocks_the_kernel_leaves_unmasked_are_visible_to_every_row():
    """decode_unmasked: in a causal tile, the local blocks below it (but the first one the kernel
    runs, which it always masks) take no mask, so each of their keys must be visible to every
    packed row of the tile, within the row's length."""
    rnd = random.Random(5)
    for _ in range(400):
        g, sq = rnd.choice([1, 2, 4, 8, 16]), rnd.choice([1, 2, 3, 5, 16])
        rows, tile_n = sq * g, rnd.choice([64, 112, 128])
        L = rnd.randint(sq, 3000)
        n = rnd.choice([1, 2, 3, 7])
        for m in range(-(-rows // 128)):
            for s in range(n):
                lo, nb, limit, offset = decode_block_range(m, s, n, 128, tile_n, rows, g, L, 4096, True)
                # the kernel masks its first block (local nb - 1) always
                unmasked = min(decode_unmasked(m, 128, tile_n, g, offset), nb - 1)
                last_key = unmasked * tile_n - 1  # the last key of the unmasked blocks
                if unmasked:
                    first_token = (m * 128) // g
                    assert last_key <= offset + first_token and last_key < limit, (g, sq, L, n, m, s)
                # without causal only the first block is masked: the others lie within the length
                lo, nb, limit, _ = decode_block_range(m, s, n, 128, tile_n, rows, g, L, 4096, False)
                assert (nb - 1) * tile_n < max(limit, 1), (g, sq, L, n, m, s)


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
    monkeypatch.setattr(kvcache, "launch_decode", REAL_LAUNCH)
    q, k, v = _inputs(1, 1, 32, 1, 1)
    with pytest.raises(ValueError, match="CUDA device"):
        fa4kernel.attention_with_kvcache(q, k, v)
