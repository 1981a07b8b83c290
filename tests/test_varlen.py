"""fa4kernel's varlen (attention with cu_seqlens, fa4kernel/varlen.py) on the CPU: its one-line
errors, the forward's host side (the packed views the launch gets, the grid's Q tiles) against a
direct fp64 reference of packed attention (one attention over all tokens with a block-diagonal
mask), the backward's padded layout and the knobs its varlen build fixes.

The kernels cannot run here: RUN_STAND_IN is the forward's varlen build's contract in fp64
(FlashFwdSm90Varlen's docstring and, with pack_gqa, FlashFwdSm90VarlenPacked's; not the kernel).
tests/test_varlen_gpu.py runs the real kernels."""
import math

import pytest

torch = pytest.importorskip("torch")

import fa4kernel  # noqa: E402
from fa4kernel import varlen  # noqa: E402
from fa4kernel.sm90 import bwd_varlen  # noqa: E402
from fa4kernel.sm90.bwd_config import make_varlen_bwd_config  # noqa: E402

GRIDS = []


def _attend(q, k, v, causal, scale):
    """fp64 attention of one sequence (len_q, h, d) x (len_k, hkv, d); causal bottom-right."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    if causal:
        lq, lk = q.shape[0], k.shape[0]
        s = s.masked_fill(torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + lk - lq, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, vv), lse


def RUN_STAND_IN(cfg, q, k, v, out, lse, cu_q, cu_k, tiles, softmax_scale, group=1):
    assert q.shape[0] == k.shape[0] == out.shape[0] == 1 and cfg.varlen
    assert (lse is not None) == cfg.has_lse and (lse is None or lse.shape[0] == 1)
    assert cu_q.dtype == cu_k.dtype == torch.int32 and cu_q.shape == cu_k.shape
    assert cfg.pack_gqa == (group > 1)
    GRIDS.append(tiles)
    scale = softmax_scale or 1.0 / math.sqrt(q.shape[-1])
    oq, ok = cu_q.tolist(), cu_k.tolist()
    real = q.shape[2] * sum(-(-(oq[i + 1] - oq[i]) * group // cfg.tile_m) for i in range(len(oq) - 1))
    assert real <= tiles, "the bound on the tiles is below the batch's tiles"
    if cfg.pack_gqa:
        return _packed_stand_in(cfg, q, k, v, out, lse, oq, ok, scale, group)
    for i in range(len(oq) - 1):
        a, b, c, e = oq[i], oq[i + 1], ok[i], ok[i + 1]
        if b == a:
            continue
        if e == c:
            o, ls = torch.zeros(b - a, q.shape[2], q.shape[3]), torch.full((q.shape[2], b - a), float("-inf"))
        else:
            o, ls = _attend(q[0, a:b], k[0, c:e], v[0, c:e], cfg.causal, scale)
        out[0, a:b] = o.to(out.dtype)
        if lse is not None:
            lse[0, :, a:b] = ls.float()


def _packed_stand_in(cfg, q, k, v, out, lse, oq, ok, scale, group):
    """FlashFwdSm90VarlenPacked's contract: q / out (1, total_q x group, 1, d), k / v one head,
    cu_seqlens in tokens; sequence i's packed rows [oq[i] x group, oq[i + 1] x group), row r (in
    the sequence) of token r // group sees key j iff j <= len_k - len_q + r // group; lse (1,
    group, total_q), row r at (r % group, token)."""
    assert q.shape[2] == k.shape[2] == 1 and out.shape == q.shape
    assert lse is None or (lse.shape[1] == group and lse.shape[2] * group == q.shape[1])
    for i in range(len(oq) - 1):
        a, b, c, e = oq[i] * group, oq[i + 1] * group, ok[i], ok[i + 1]
        if b == a:
            continue
        s = (q[0, a:b, 0].double() @ k[0, c:e, 0].double().T) * scale
        if cfg.causal:
            token = torch.arange(b - a)[:, None] // group
            s = s.masked_fill(torch.arange(e - c)[None, :] > token + (e - c) - (oq[i + 1] - oq[i]), float("-inf"))
        ls = torch.logsumexp(s, -1)  # -inf for a sequence without keys (its O 0)
        p = torch.softmax(s, -1).nan_to_num(0.0)
        out[0, a:b, 0] = (p @ v[0, c:e, 0].double()).to(out.dtype)
        if lse is not None:
            rows = torch.arange(a, b)
            lse[0, rows % group, rows // group] = ls.float()


def packed_reference(q, k, v, lens_q, lens_k, causal, scale):
    """One attention over every token: query i of sequence s sees key j iff j is in s (and, with
    causal, j - start_k(s) <= i - start_q(s) + len_k(s) - len_q(s))."""
    seq_q = torch.repeat_interleave(torch.arange(len(lens_q)), torch.tensor(lens_q))
    seq_k = torch.repeat_interleave(torch.arange(len(lens_k)), torch.tensor(lens_k))
    start_q = torch.tensor([0] + lens_q).cumsum(0)[seq_q]
    start_k = torch.tensor([0] + lens_k).cumsum(0)[seq_k]
    see = seq_q[:, None] == seq_k[None, :]
    if causal:
        iq = torch.arange(len(seq_q)) - start_q
        jk = torch.arange(len(seq_k)) - start_k
        off = (torch.tensor(lens_k)[seq_q] - torch.tensor(lens_q)[seq_q])
        see &= jk[None, :] <= (iq + off)[:, None]
    g = q.shape[1] // k.shape[1]
    s = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(g, 1)) * scale
    s = s.masked_fill(~see, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v.repeat_interleave(g, 1))


def _cu(lens):
    return torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)


@pytest.mark.parametrize("causal,lens_q,lens_k,h,hkv", [
    (False, [5, 0, 130, 1, 77], [9, 3, 130, 1, 200], 4, 2),
    (True, [33, 1, 0, 129], [33, 40, 5, 300], 2, 2),   # chunked prefill: len_q < len_k
    (True, [3, 7], [0, 2], 4, 1),                       # a sequence without keys; len_k < len_q
])
def test_forward_host_side(causal, lens_q, lens_k, h, hkv):
    torch.manual_seed(0)
    d = 64
    q = torch.randn(sum(lens_q), h, d, dtype=torch.float64)
    k = torch.randn(sum(lens_k), hkv, d, dtype=torch.float64)
    v = torch.randn(sum(lens_k), hkv, d, dtype=torch.float64)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    n, _, _, _, _, mq, mk = varlen.check_varlen(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu_q, cu_k, None,
                                                None, causal, None, True)
    assert (n, mq, mk) == (len(lens_q), max(lens_q), max(lens_k))
    cfg = varlen.varlen_config(d, "bfloat16", causal, True, mq, mk, {}, fa4kernel.interface.tile_rule)
    GRIDS.clear()
    out, lse = varlen.forward(RUN_STAND_IN, cfg, q, k, v, cu_q, cu_k, mq, None)
    assert GRIDS == [varlen.tile_bound(len(lens_q), q.shape[0], mq, q.shape[1], cfg.tile_m)]
    scale = 1.0 / math.sqrt(d)
    torch.testing.assert_close(out, packed_reference(q, k, v, lens_q, lens_k, causal, scale))


@pytest.mark.parametrize("tile_m", [64, 128, 192])
def test_tile_bound_holds_every_tile_and_is_tight_for_equal_lengths(tile_m):
    """tile_bound >= the batch's Q tiles x heads for random lengths (empty and one-row sequences,
    packed rows past the last), and equals them where every sequence fills whole tiles."""
    gen = torch.Generator().manual_seed(tile_m)
    for _ in range(200):
        n = int(torch.randint(1, 80, (1,), generator=gen))
        lens = torch.randint(0, 3 * tile_m, (n,), generator=gen).tolist()
        total = sum(lens) + int(torch.randint(0, 50, (1,), generator=gen))
        real = 3 * sum(-(-x // tile_m) for x in lens)
        assert varlen.tile_bound(n, total, max(lens), 3, tile_m) >= real
    assert varlen.tile_bound(5, 5 * 2 * tile_m, 2 * tile_m, 4, tile_m) == 4 * 5 * 2
    assert varlen.tile_bound(3, 10 * tile_m, tile_m, 1, tile_m) == 3  # capped by max_seqlen_q's tiles


def test_grid_ctas_one_per_sm_when_persistent_else_one_per_tile():
    assert [varlen.grid_ctas(True, t, 132) for t in (0, 1, 131, 132, 5000)] == [1, 1, 131, 132, 132]
    assert [varlen.grid_ctas(False, t, 132) for t in (0, 1, 5000)] == [1, 1, 5000]


def test_varlen_build_is_persistent_at_every_head_dim():
    """make_varlen_config: persistent unless the knobs say otherwise (VARLEN_PERSISTENT), also where
    O shares Q's buffer and the dense forward is not; the knob as the dense forward has it."""
    from fa4kernel.sm90.config import make_varlen_config

    for d in (64, 96, 128, 192, 256):
        for causal in (False, True):
            assert make_varlen_config("bfloat16", d, causal, True, {}).persistent
    assert not fa4kernel.make_config("bfloat16", 256, True, True, {}).persistent  # the dense rule
    assert not make_varlen_config("bfloat16", 128, False, True, {"persistent": False}).persistent


@pytest.mark.parametrize("block", [64, 128, 256])
def test_padded_starts_give_each_sequence_whole_blocks(block):
    """The varlen backward's padded layout (sm90/bwd_varlen.py): each sequence starts on a block
    and its whole blocks end before the next one starts, all inside padded_length's rows."""
    torch.manual_seed(2)
    lens = [0, 1, block - 1, block, block + 1, 0, 3 * block + 5] + torch.randint(0, 500, (20,)).tolist()
    cu = _cu(lens).tolist()
    starts = [bwd_varlen.padded_start(cu[i], i, block) for i in range(len(lens))]
    ends = [s + -(-n // block) * block for s, n in zip(starts, lens)]
    assert all(s % block == 0 for s in starts)
    assert all(e <= s for e, s in zip(ends, starts[1:])), "a sequence's blocks overlap the next one's"
    total = bwd_varlen.padded_length(sum(lens), len(lens), block)
    assert total % 128 == 0 and max(ends) <= total


@pytest.mark.parametrize("kw,msg", [({"grid_order": "tail_lpt"}, "grid_order='tail_lpt' with cu_seqlens"),
                                    ({"preprocess": "torch"}, "allowed: 'kernel'"),
                                    ({"dq_reduce": "red"}, "dq_reduce='red' with cu_seqlens"),
                                    ({"tile": 3}, "varlen backward knob 'tile' unknown"),
                                    ({"tile_m": 100}, "tile_m=100")])
def test_varlen_backward_knobs_it_fixes_are_refused(kw, msg):
    with pytest.raises(ValueError) as e:
        make_varlen_bwd_config("bfloat16", 128, True, kw)
    assert msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_backward_build(deterministic):
    """The knobs it fixes may be given at their values; the rest are the dense build's."""
    cfg = make_varlen_bwd_config("bfloat16", 64, False, {"preprocess": "kernel", "tile_m": 64}, deterministic)
    dense = make_varlen_bwd_config("bfloat16", 64, False, {"tile_m": 64}, deterministic)
    assert cfg == dense and cfg.varlen and cfg.deterministic == deterministic and cfg.tile_m == 64
    assert (cfg.grid_order, cfg.dq_zero, cfg.postprocess) == ("heads_outer", "preprocess", "kernel")


def _args(**kw):
    q = torch.randn(10, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(12, 2, 64, dtype=torch.bfloat16)
    a = dict(q=q, k=k, v=k.clone(), cu_seqlens_q=_cu([4, 6]), cu_seqlens_k=_cu([5, 7]))
    a.update(kw)
    return a


@pytest.mark.parametrize("kw,msg", [
    (dict(cu_seqlens_k=None), "both given"),
    (dict(cu_seqlens_q=torch.tensor([0, 4, 10])), "int32 tensor"),
    (dict(cu_seqlens_q=_cu([4, 6])[None]), "int32 tensor"),
    (dict(cu_seqlens_k=_cu([5, 3, 4])), "one per sequence"),
    (dict(cu_seqlens_q=torch.tensor([1, 4, 10], dtype=torch.int32)), "allowed: 0"),
    (dict(cu_seqlens_q=torch.tensor([0, 6, 4], dtype=torch.int32)), "non-decreasing"),
    (dict(cu_seqlens_k=_cu([5, 8])), "past the 12 packed rows"),
    (dict(max_seqlen_q=3), "max_seqlen_q=3 < the longest"),
    (dict(max_seqlen_k=-1), "max_seqlen_k=-1"),
    (dict(max_seqlen_q=True), "max_seqlen_q=True"),
    (dict(q=torch.randn(1, 10, 4, 64, dtype=torch.bfloat16)), "3-D"),
    (dict(k=torch.randn(12, 3, 64, dtype=torch.bfloat16), v=torch.randn(12, 3, 64, dtype=torch.bfloat16)),
     "k/v heads=3"),
    (dict(persistent=2), "persistent=2"),
    (dict(tile_m=100), "tile_m=100"),
])
def test_bad_input_is_one_line(kw, msg):
    a = _args(**kw)
    with pytest.raises(ValueError) as e:
        fa4kernel.attention(a.pop("q"), a.pop("k"), a.pop("v"), **a)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_cpu_tensors_pass_the_checks_then_ask_for_a_gpu():
    with pytest.raises(ValueError, match="CUDA device"):
        fa4kernel.attention(**_args())


def test_forward_without_lse_launches_without_one():
    """return_lse=False and no grad: the build has no LSE output and the launch passes None."""
    q = torch.randn(9, 2, 64, dtype=torch.float64)
    cu = _cu([4, 5])
    cfg = varlen.varlen_config(64, "bfloat16", True, False, 5, 5, {}, fa4kernel.interface.tile_rule)
    out, lse = varlen.forward(RUN_STAND_IN, cfg, q, q, q, cu, cu, 5, None)
    assert lse is None and not cfg.has_lse
    torch.testing.assert_close(out, packed_reference(q, q, q, [4, 5], [4, 5], True, 1 / 8))


# pack-GQA (KernelConfig.pack_gqa, MQA's default): MQA's q heads as rows of one head, a view of q
PACK_LENS = [  # (lens_q, lens_k): odd lengths, one-token, empty, chunks, queries without keys
    ([5, 0, 130, 1, 77], [9, 3, 130, 1, 200]),
    ([3, 7, 64], [0, 2, 64]),
]


@pytest.mark.parametrize("group", [2, 3, 32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", PACK_LENS)
def test_pack_gqa_host_side(lens, causal, group):
    """The packed launch (q and out as (1, total_q x group, 1, d) views, cu_seqlens in tokens, the
    tile bound over the packed rows) gives the unpacked attention's out and its (heads, total_q)
    lse."""
    lens_q, lens_k = lens
    torch.manual_seed(group)
    d = 64
    q = torch.randn(sum(lens_q), group, d, dtype=torch.float64)
    k = torch.randn(sum(lens_k), 1, d, dtype=torch.float64)
    v = torch.randn(sum(lens_k), 1, d, dtype=torch.float64)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    mq, mk = max(lens_q), max(lens_k)
    assert varlen.pack_plan(True, q, k) == group
    cfg = varlen.varlen_config(d, "bfloat16", causal, True, mq, mk, {}, fa4kernel.interface.tile_rule, group)
    assert cfg.pack_gqa and cfg.varlen
    GRIDS.clear()
    out, lse = varlen.forward(RUN_STAND_IN, cfg, q, k, v, cu_q, cu_k, mq, None)
    assert GRIDS == [varlen.tile_bound(len(lens_q), q.shape[0] * group, mq * group, 1, cfg.tile_m)]
    assert out.shape == q.shape and lse.shape == (group, q.shape[0]) and lse.is_contiguous()
    torch.testing.assert_close(out, packed_reference(q, k, v, lens_q, lens_k, causal, 1.0 / math.sqrt(d)))
    plain = varlen.varlen_config(d, "bfloat16", causal, True, mq, mk, {}, fa4kernel.interface.tile_rule)
    _, want_lse = varlen.forward(RUN_STAND_IN, plain, q, k, v, cu_q, cu_k, mq, None)
    assert not plain.pack_gqa and torch.isinf(want_lse).any() == (lens_k[0] == 0)
    torch.testing.assert_close(lse, want_lse)


def test_pack_gqa_rows_are_a_view_of_q():
    """packed_view: row token x heads + j is q head j of the token, in q's own memory; heads 1 or
    no pack: the unpacked launch's (1, total_q, heads, d)."""
    q = torch.randn(7, 5, 64, dtype=torch.bfloat16)
    p = varlen.packed_view(q, 5)
    assert p.shape == (1, 35, 1, 64) and p.data_ptr() == q.data_ptr() and p.stride(1) == 64
    for t, j in ((0, 0), (3, 4), (6, 2)):
        assert torch.equal(p[0, t * 5 + j, 0], q[t, j])
    assert varlen.packed_view(q, 1).shape == (1, 7, 5, 64)
    padded = torch.randn(7, 5, 128, dtype=torch.bfloat16)[:, :, :64]  # heads 128 apart: still a view
    assert varlen.pack_plan(True, padded, torch.randn(3, 1, 64)) == 5
    assert varlen.packed_view(padded, 5).stride(1) == 128 and torch.equal(varlen.packed_view(padded, 5)[0, 7, 0],
                                                                           padded[1, 2])
    k1 = torch.randn(3, 1, 64)
    assert varlen.pack_plan(False, q, k1) == 1 and varlen.pack_plan(True, q[:, :1], k1) == 1


def test_pack_gqa_is_the_default_wherever_the_rows_are_a_view():
    """pack_gqa None (the default): MQA packs; GQA, one q head and a q whose heads of a token are
    not adjacent run unpacked, without an error (True asks for the pack and says why not)."""
    assert varlen.PACK_GQA_DEFAULT is None
    q, k1, k2 = torch.randn(7, 4, 64), torch.randn(3, 1, 64), torch.randn(3, 2, 64)
    assert varlen.pack_plan(None, q, k1) == 4
    assert varlen.pack_plan(None, q, k2) == 1 and varlen.pack_plan(None, q[:, :1], k1) == 1
    sliced = torch.randn(7, 6, 64)[:, 1:5]  # heads of a token 64 apart, tokens 384 apart: no view
    assert varlen.pack_plan(None, sliced, k1) == 1
    with pytest.raises(ValueError, match="q.stride"):
        varlen.pack_plan(True, sliced, k1)


@pytest.mark.parametrize("kw,msg", [
    (dict(pack_gqa="yes"), "pack_gqa='yes'"),
    (dict(pack_gqa=True), "pack_gqa=True with heads_kv=2"),  # GQA: the pack is no view
    (dict(pack_gqa=True, q=torch.randn(10, 6, 64, dtype=torch.bfloat16)[:, 1:5], k=torch.randn(12, 1, 64,
     dtype=torch.bfloat16), v=torch.randn(12, 1, 64, dtype=torch.bfloat16)), "q.stride(0) == heads x q.stride(1)"),
])
def test_pack_gqa_bad_input_is_one_line(kw, msg):
    a = _args(**kw)
    with pytest.raises(ValueError) as e:
        fa4kernel.attention(a.pop("q"), a.pop("k"), a.pop("v"), **a)
    assert msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("pack", [True, None, False])
@pytest.mark.parametrize("grad", [False, True])
def test_pack_gqa_knob_reaches_the_launch(grad, pack, monkeypatch):
    """attention(..., pack_gqa=True or left out) with MQA: the packed build, the rest of the knobs
    as given; with grad the autograd path packs the same way and keeps out and lse unpacked (the
    backward's); pack_gqa=False: the plain build, the same out."""
    from fa4kernel import inputs

    monkeypatch.setattr(inputs, "validate_device", lambda *a: None)
    seen = []

    def run(cfg, *a, **kw):
        seen.append((cfg, kw.get("group", 1), a[0].shape))
        RUN_STAND_IN(cfg, *a, **kw)

    lens = [4, 0, 9]
    q = torch.randn(13, 8, 64, dtype=torch.bfloat16, requires_grad=grad)
    k = torch.randn(13, 1, 64, dtype=torch.bfloat16, requires_grad=grad)
    v = torch.randn(13, 1, 64, dtype=torch.bfloat16, requires_grad=grad)
    knobs = {"kv_stages": 3} if pack is None else {"pack_gqa": pack, "kv_stages": 3}
    out, lse = varlen.attention_varlen(run, fa4kernel.interface.tile_rule, q, k, v, _cu(lens), _cu(lens), None,
                                       None, True, None, True, False, {}, knobs)
    (cfg, group, q_shape), = seen
    packed = pack is not False
    assert cfg.pack_gqa == packed and cfg.kv_stages == 3 and group == (8 if packed else 1)
    assert q_shape == ((1, 13 * 8, 1, 64) if packed else (1, 13, 8, 64))
    assert out.shape == q.shape and lse.shape == (8, 13) and (out.grad_fn is not None) == grad
    want = packed_reference(q.detach().double(), k.detach().double(), v.detach().double(), lens, lens, True, 1 / 8)
    torch.testing.assert_close(out.detach().double(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("tile_m,tile_n", [(128, 128), (192, 112), (128, 64)])
def test_packed_kv_block_range_covers_each_rows_tokens_keys(tile_m, tile_n):
    """block_info.packed_kv_block_range against the visible keys of every row of a tile: the
    visited blocks hold all of them, the block past them holds none (at least one block), the
    blocks below n_unmasked are visible to every row; group 1 is kv_block_range."""
    from fa4kernel import block_info

    gen = torch.Generator().manual_seed(tile_m + tile_n)
    for _ in range(300):
        group = int(torch.randint(1, 40, (1,), generator=gen))
        tokens = int(torch.randint(1, 400, (1,), generator=gen))
        seqlen_k = int(torch.randint(0, 700, (1,), generator=gen))
        rows = tokens * group
        for m_block in range(-(-rows // tile_m)):
            n_max, n_unmasked, offset = block_info.packed_kv_block_range(m_block, tile_m, tile_n, rows, group,
                                                                         seqlen_k, True)
            assert offset == seqlen_k - tokens
            r = torch.arange(m_block * tile_m, min((m_block + 1) * tile_m, rows))
            see = torch.clamp(r // group + offset + 1, 0, seqlen_k)  # keys [0, see) for each row
            assert n_max == max(1, -(-int(see.max()) // tile_n))
            assert n_unmasked * tile_n <= int(see.min()) and (n_unmasked + 1) * tile_n > int(see.min())
            if group == 1:
                assert (n_max, n_unmasked) == block_info.kv_block_range(m_block, tile_m, tile_n, tokens, seqlen_k,
                                                                        True)
        assert block_info.packed_kv_block_range(0, tile_m, tile_n, rows, group, seqlen_k, False)[:2] == \
            block_info.kv_block_range(0, tile_m, tile_n, tokens, seqlen_k, False)
