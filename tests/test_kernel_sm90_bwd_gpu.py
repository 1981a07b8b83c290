"""GPU correctness of fa4kernel's SM90 backward (and the GQA forward) against an fp32 torch
reference: ||g - ref|| / ||ref|| <= 1e-2 for each of dq, dk, dv, on fresh random inputs.

Run on the device: pytest -m gpu tests/test_kernel_sm90_bwd_gpu.py

torch.autograd.gradcheck (finite differences in float64) does not apply: the kernel computes in
bf16 / fp16 with fp32 accumulation, far from float64's precision. The autograd tests compare the
gradients autograd produces through fa4kernel.attention with those of the fp32 reference instead.
"""

import math

import pytest

torch = pytest.importorskip("torch")

from hopper import gpu_marks  # noqa: E402

pytestmark = gpu_marks()

import fa4kernel  # noqa: E402

TOL = 1e-2
# head dims with 2 x 64 keys per CTA (the knob grid runs here); 192 and 256 split dK / dV / dQ by
# head_dim instead (kv_split) and have their own, smaller set of cases below
KEY_SPLIT_HEAD_DIMS = tuple(d for d in fa4kernel.BWD_HEAD_DIMS if d <= 128)
KV_SPLIT_HEAD_DIMS = tuple(d for d in fa4kernel.BWD_HEAD_DIMS if d > 128)


def _inputs(b, sq, sk, h, hkv, d, dtype=torch.bfloat16, seed=None):
    """Fresh random q, k, v (requires grad) and dout, never zeros."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed if seed is not None else torch.randint(0, 2**31 - 1, (1,)).item())
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def reference(q, k, v, causal, scale=None):
    """fp32 attention, differentiable; k / v heads repeated for GQA (q head i reads k/v head
    i // (heads // heads_kv)); causal bottom-right aligned; rows that see no key give 0."""
    d = q.shape[-1]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    group = q.shape[2] // k.shape[2]
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        visible = j <= i + (sk - sq)
        s = s.masked_fill(~visible, float("-inf"))
        has_key = visible.any(-1)[:, None]  # (sq, 1)
        s = torch.where(has_key, s, torch.zeros_like(s))  # no NaN from all -inf rows
        p = torch.softmax(s, dim=-1) * has_key
    else:
        p = torch.softmax(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", p, vf)


def rel_err(g, ref):
    """||g - ref|| / ||ref||, with an RMS floor of 1e-3 for gradients that are ~0 (length 1)."""
    assert g is not None, "no gradient"
    g = g.float()
    assert torch.isfinite(g).all(), "non-finite values in the gradient"
    denom = max(ref.norm().item(), 1e-3 * math.sqrt(ref.numel()))
    return (g - ref).norm().item() / denom


def grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


def check(b, sq, sk, h, hkv, d, causal, dtype=torch.bfloat16, deterministic=False, scale=None, seed=None,
          **bwd_knobs):
    """Gradients through fa4kernel.attention(..., bwd_knobs=bwd_knobs) (left out: the defaults)
    against the fp32 reference's."""
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, d, dtype, seed)
    out = fa4kernel.attention(q, k, v, causal=causal, softmax_scale=scale, deterministic=deterministic,
                              bwd_knobs=bwd_knobs)
    assert out.grad_fn is not None, "attention() output has no grad_fn"
    dq, dk, dv = grads(out, (q, k, v), dout)
    ref = reference(q, k, v, causal, scale)
    rq, rk, rv = grads(ref, (q, k, v), dout.float())
    errs = {"out": rel_err(out.detach(), ref.detach()), "dq": rel_err(dq, rq), "dk": rel_err(dk, rk),
            "dv": rel_err(dv, rv)}
    bad = {n: e for n, e in errs.items() if not e <= TOL}
    assert not bad, f"rel err above {TOL}: {bad} (all: {errs})"
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    return errs


# ---- the GQA / MQA forward


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("h,hkv", [(8, 2), (8, 1)])
def test_gqa_forward(hd, causal, h, hkv):
    q, k, v, _ = _inputs(2, 333, 1000, h, hkv, hd)
    with torch.no_grad():
        out, lse = fa4kernel.attention(q, k, v, causal=causal, return_lse=True)
        ref = reference(q, k, v, causal)
    assert rel_err(out, ref) <= TOL
    assert lse.shape == (2, h, 333)


# ---- the backward


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 333), (77, 77), (77, 1000), (333, 77), (333, 333),
                                   (1000, 1000), (1000, 333), (128, 256), (200, 64)])
def test_bwd_odd_lengths_hd128(sq, sk, causal):
    check(2, sq, sk, 2, 2, 128, causal)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
def test_bwd_head_dims_and_dtypes(hd, causal, dtype):
    check(2, 1000, 1000, 3, 3, hd, causal, dtype)
    check(1, 333, 1000, 2, 2, hd, causal, dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", KEY_SPLIT_HEAD_DIMS)
@pytest.mark.parametrize("h,hkv", [(8, 2), (8, 1)], ids=["gqa8:2", "mqa8:1"])
@pytest.mark.parametrize("sq,sk", [(333, 1000), (1000, 77)])
def test_bwd_gqa_mqa(hd, causal, h, hkv, sq, sk):
    check(2, sq, sk, h, hkv, hd, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 333), (77, 77), (77, 1000), (333, 77), (333, 333),
                                   (1000, 1000), (1000, 333), (128, 256), (200, 64)])
def test_bwd_odd_lengths_hd64_tile_m_128(sq, sk, causal):
    """hd64 with 128-row query blocks (dQ split by query rows): lengths that are not multiples of
    128, in both orders."""
    check(2, sq, sk, 2, 2, 64, causal, tile_m=128)


# the first design: each knob's other value
BASELINE = dict(dq_reduce="red", stats="thread", mma_order="dv_dk_dq", preprocess="torch")
VARIANTS = [
    BASELINE,
    dict(dq_reduce="red"),
    dict(stats="thread"),
    dict(mma_order="dv_dk_dq"),
    dict(preprocess="torch"),
    dict(tile_m=128),
    dict(tile_m=128, mma_order="dv_dk_dq"),
    dict(tile_m=128, preprocess="torch"),
    dict(postprocess="kernel"),
    dict(postprocess="kernel", tile_m=128),
    dict(dq_zero="preprocess"),
    dict(dq_zero="preprocess", postprocess="kernel", tile_m=128),
    dict(dq_zero="preprocess", postprocess="kernel", grid_order="heads_outer"),
    dict(grid_order="tail_lpt"),
    dict(grid_order="tail_lpt", tile_m=128),
]


def _applies(hd, knobs):
    from fa4kernel.sm90.bwd_config import make_bwd_config

    try:
        make_bwd_config("bfloat16", hd, False, **knobs)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd,knobs", [(hd, k) for k in VARIANTS for hd in KEY_SPLIT_HEAD_DIMS if _applies(hd, k)],
                         ids=lambda x: ",".join(f"{a}={b}" for a, b in x.items()) if isinstance(x, dict) else str(x))
def test_bwd_variants(hd, causal, knobs):
    """The backward knobs of sm90/bwd_config.py (dq_reduce, stats, mma_order, preprocess,
    postprocess, tile_m, grid_order, dq_zero) where they apply: the same gradients, at odd lengths
    in both orders (rows that see no key: LSE = -inf), with GQA, fp16 and deterministic once."""
    check(2, 1000, 1000, 3, 3, hd, causal, **knobs)
    check(1, 1000, 333, 2, 2, hd, causal, **knobs)
    check(2, 77, 1000, 8, 2, hd, causal, **knobs)
    # (fp16 and deterministic of postprocess and dq_zero at every head dim: their own tests below)
    if hd == 128 or knobs.get("tile_m") == 128:
        check(2, 333, 333, 2, 2, hd, causal, torch.float16, **knobs)
        check(2, 333, 333, 4, 2, hd, causal, deterministic=True, **knobs)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd,b,h,hkv,s", [(64, 4, 16, 16, 1000), (128, 4, 16, 16, 1000), (256, 2, 12, 12, 999),
                                          (256, 4, 12, 6, 1000)])
def test_bwd_tail_lpt_both_parts(hd, b, h, hkv, s, causal):
    """grid_order="tail_lpt" where the launch has heads in both parts (heads_outer, then the tail
    longest first): more (batch, k/v head)s than bwd_config.tail_heads puts in the tail; the pair's
    odd key-block count at 999; GQA."""
    from fa4kernel.sm90.bwd_config import cluster_ctas, make_bwd_config, tail_heads

    cfg = make_bwd_config("bfloat16", hd, causal, grid_order="tail_lpt")
    c = cluster_ctas(cfg)
    assert tail_heads(-(-s // (cfg.tile_n * c)), b * hkv, 132 // c) < b * hkv
    check(b, s, s, h, hkv, hd, causal, grid_order="tail_lpt")


# ---- gqa_dkv="reduce": one CTA per key block of each q head, dK / dV added in fp32


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
@pytest.mark.parametrize("b,sq,sk,h,hkv", [(2, 333, 1000, 8, 2), (2, 1000, 77, 8, 1), (1, 777, 777, 16, 1),
                                           (2, 77, 333, 3, 3)], ids=["gqa8:2", "mqa8:1", "mqa16:1", "mha3"])
def test_bwd_gqa_dkv_reduce(hd, causal, b, sq, sk, h, hkv):
    """The q heads of a group add dK and dV into one fp32 accumulator: the gradients of the loop
    at odd lengths in both orders (keys past the last key block's rows: not added), GQA, MQA, and
    without grouped heads; with the causal mask's default tail_lpt grid (q heads on its head axis)
    and heads_outer."""
    check(b, sq, sk, h, hkv, hd, causal, gqa_dkv="reduce")
    if causal:
        check(b, sq, sk, h, hkv, hd, causal, gqa_dkv="reduce", grid_order="heads_outer")


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_bwd_gqa_dkv_reduce_tail_lpt_both_parts_and_fp16(hd):
    """More (batch, q head)s than the tail takes (its head part and its tail), fp16."""
    check(4, 1000, 1000, 16, 2, hd, True, torch.float16, gqa_dkv="reduce")


@pytest.mark.parametrize("hd", [128, 256])
def test_bwd_gqa_dkv_reduce_clock_probe_and_main_alone(hd):
    """The clock probe's grid has a CTA per key block of each q head (probe_words of grid_heads):
    its gradients are the build's to bf16 rounding (the fp32 adds land in another order: 2e-5
    apart at hd256 on an H200); main() launched twice adds dK and dV twice, as it does dQ."""
    from fa4kernel.sm90.bwd import prepare_bwd
    from fa4kernel.trace import PROBE_SUM_WORDS, ctas_clock_ghz

    b, s, h, hkv = 2, 500, 8, 2
    q, k, v, dout = _inputs(b, s, s, h, hkv, hd, seed=7)
    with torch.no_grad():
        out, lse = fa4kernel.attention(q, k, v, causal=True, return_lse=True)
        plain = fa4kernel.attention_backward(dout, q, k, v, out, lse, causal=True, gqa_dkv="reduce")
        *probed, stamps = fa4kernel.attention_backward_probed(dout, q, k, v, out, lse, causal=True,
                                                              gqa_dkv="reduce")
    for a, w in zip(probed, plain):
        assert rel_err(a, w.float()) < 1e-3
    cfg = fa4kernel.make_bwd_config("bfloat16", hd, True, gqa_dkv="reduce")
    pairs = 2 if cfg.dq_sum == "pair" else 1
    blocks = -(-s // (pairs * cfg.tile_n)) * pairs
    assert (stamps.numel() - PROBE_SUM_WORDS) // 4 == ctas_clock_ghz(stamps.tolist())["ctas"] == blocks * h * b
    main, finish = prepare_bwd(cfg, dout, q, k, v, out, lse, 1.0 / math.sqrt(hd))
    main()
    main()
    dq2, dk2, dv2 = finish()
    for name, got, want in (("dq", dq2, plain[0]), ("dk", dk2, plain[1]), ("dv", dv2, plain[2])):
        assert rel_err(got.float() / 2, want.float()) < 1e-2, name


# ---- head dims 192 and 256 (kv_split: 64 x 64 tiles, dK / dV / dQ split by head_dim)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", KV_SPLIT_HEAD_DIMS)
@pytest.mark.parametrize("h,hkv,sq,sk", [(8, 2, 333, 1000), (8, 1, 1000, 77)], ids=["gqa8:2", "mqa8:1"])
def test_bwd_kv_split_gqa_mqa(hd, causal, h, hkv, sq, sk):
    check(2, sq, sk, h, hkv, hd, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (200, 64)])
def test_bwd_odd_lengths_hd256(sq, sk, causal):
    check(2, sq, sk, 2, 2, 256, causal)


KV_SPLIT_VARIANTS = [
    BASELINE,
    dict(mma_order="dv_dk_dq"),
    # the dq_reduce that is not the default ("red"; at 256 with 2-stage Q / dO rings)
    "other_dq_reduce",
    dict(dq_reduce="bulk", postprocess="kernel", dq_zero="preprocess", grid_order="heads_outer"),
    # where dQ is staged that is not the default: its own smem buffer (one Q / dO stage at 256) or
    # the consumed Q / dO stage (at 192), in both GEMM orders
    "other_dq_smem",
    "other_dq_smem,mma_order=dv_dk_dq",
    # the two CTAs of a cluster sum dQ through distributed shared memory
    dict(dq_smem="qdo", dq_sum="pair"),
    dict(dq_sum="cta"),
    dict(grid_order="tail_lpt"),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", KV_SPLIT_HEAD_DIMS)
@pytest.mark.parametrize("knobs", KV_SPLIT_VARIANTS,
                         ids=lambda x: ",".join(f"{a}={b}" for a, b in x.items()) if isinstance(x, dict) else x)
def test_bwd_kv_split_variants(hd, causal, knobs):
    """The knobs at head dims 192 and 256: the same gradients at odd lengths in both orders,
    with GQA (rows that see no key: LSE = -inf)."""
    from fa4kernel.sm90.bwd_config import make_bwd_config

    if knobs == "other_dq_reduce":
        knobs = dict(dq_reduce="red" if make_bwd_config("bfloat16", hd, causal).dq_reduce == "bulk" else "bulk")
    elif isinstance(knobs, str) and knobs.startswith("other_dq_smem"):
        default = make_bwd_config("bfloat16", hd, causal, dq_reduce="bulk").dq_smem
        order = "dv_dk_dq" if knobs.endswith("dv_dk_dq") else "dv_dq_dk"
        knobs = dict(dq_reduce="bulk", dq_smem="own" if default == "qdo" else "qdo", mma_order=order)
    check(2, 1000, 1000, 3, 3, hd, causal, **knobs)
    check(1, 1000, 333, 2, 2, hd, causal, **knobs)
    check(2, 77, 1000, 8, 2, hd, causal, **knobs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hd,tile_m", [(64, 64), (96, 64), (128, 64), (64, 128), (192, 64), (256, 64)])
def test_bwd_postprocess_kernel_equals_the_torch_copy(hd, tile_m, dtype):
    """postprocess="kernel" (BwdPostprocess) on a random accumulator gives the bits of the torch
    copy_ (both round to nearest even), at lengths that are and are not multiples of the block;
    NaN and inf in the accumulator land where the torch copy puts them."""
    from fa4kernel.interop import tvm_ffi_available
    from fa4kernel.sm90.bwd import dq_bulk_offset
    from fa4kernel.sm90.bwd_postprocess import dq_postprocess, postprocess_kernel
    from fa4kernel.sm90.bwd_config import make_bwd_config

    name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    cfg = make_bwd_config(name, hd, False, tile_m=tile_m, postprocess="kernel")
    g = torch.Generator(device="cuda")
    g.manual_seed(17)
    for b, h, sqp in ((1, 1, 128), (2, 3, 384), (3, 2, 1024)):
        acc = torch.randn(b, h, sqp, hd, device="cuda", generator=g) * 3
        flat = acc.view(b, h, sqp * hd)  # rows 5 and 1 of the first block: below every s_q here
        flat[0, 0, dq_bulk_offset(5, 7, hd, cfg.dq_wgs, cfg.dq_rows_split)] = float("nan")
        flat[-1, -1, dq_bulk_offset(1, hd - 2, hd, cfg.dq_wgs, cfg.dq_rows_split)] = float("inf")
        for sq in sorted({sqp, sqp - 1, sqp - 63, sqp // 2 + 1}):
            want = dq_postprocess(acc, cfg, sq, dtype)
            assert want.isnan().sum() == 1 and want.isinf().sum() == 1
            for tvm_ffi in (False, True) if tvm_ffi_available() else (False,):
                got = postprocess_kernel(cfg, acc, sq, dtype, tvm_ffi)
                assert got.shape == want.shape == (b, sq, h, hd) and got.dtype == dtype
                assert torch.equal(got.isnan(), want.isnan()), (b, h, sqp, sq, tvm_ffi)
                assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want)), (b, h, sqp, sq, tvm_ffi)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 96, 128, 192, 256])
def test_bwd_postprocess_kernel_deterministic_bits(hd, causal):
    """deterministic=True: the same dq bits with postprocess="kernel" as with the torch copy_
    (same accumulator, same rounding), dk and dv untouched."""
    q, k, v, dout = _inputs(2, 1000, 777, 4, 2, hd, seed=21)
    runs = []
    for post in ("torch", "kernel"):
        out = fa4kernel.attention(q, k, v, causal=causal, deterministic=True, bwd_knobs={"postprocess": post})
        runs.append(grads(out, (q, k, v), dout))
    for a, b, name in zip(runs[0], runs[1], ("dq", "dk", "dv")):
        assert torch.isfinite(a.float()).all() and torch.isfinite(b.float()).all(), name
        assert torch.equal(a, b), f"{name} differs between the torch and the kernel postprocess"


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_bwd_dq_zero_preprocess_after_nan_in_the_allocator(hd, deterministic):
    """dq_zero="preprocess" allocates the dQ accumulator with torch.empty: with the caching
    allocator's free memory full of NaN first, the gradients are still finite and right (the
    preprocess zeroed the accumulator, padding rows included, and the deterministic semaphores)."""
    for _ in range(2):
        poison = torch.full((64 << 20,), float("nan"), device="cuda")  # 256 MiB, freed at once
        del poison
        errs = check(2, 1000, 777, 4, 2, hd, True, deterministic=deterministic, dq_zero="preprocess",
                     postprocess="kernel")
        assert all(e <= TOL for e in errs.values()), errs


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", KV_SPLIT_HEAD_DIMS)
@pytest.mark.parametrize("sq,sk", [(1, 1), (200, 64), (150, 150), (77, 333), (1000, 150), (333, 1000)])
def test_bwd_dq_sum_pair_odd_key_blocks(hd, causal, sq, sk):
    """dq_sum="pair": an odd number of 64-key blocks leaves the last pair's second CTA past
    seqlen_k (it still walks the pair's query blocks, with nothing to add); causal pairs start at
    the first CTA's query block; GQA and the deterministic order per pair (one semaphore per
    query block, both CTAs of a pair take one turn)."""
    check(2, sq, sk, 4, 2, hd, causal, dq_smem="qdo", dq_sum="pair")
    check(1, sq, sk, 2, 1, hd, causal, deterministic=True, dq_smem="qdo", dq_sum="pair")


@pytest.mark.parametrize("causal", [False, True])
def test_bwd_softmax_scale(causal):
    check(2, 333, 333, 2, 2, 128, causal, scale=0.3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd,knobs", [(64, {}), (96, {}), (128, {}), (64, {"tile_m": 128}), (128, BASELINE),
                                     (192, {}), (256, {}), (192, {"dq_smem": "qdo"}), (256, {"dq_smem": "own"})],
                         ids=["hd64", "hd96", "hd128", "hd64-tile_m=128", "hd128-baseline", "hd192", "hd256",
                              "hd192-dq_smem=qdo", "hd256-dq_smem=own"])
def test_bwd_deterministic_is_bitwise_repeatable(hd, knobs, causal):
    """deterministic=True: two backward passes over the same inputs give the same bits (and are
    correct); the default (atomic dQ reduction) is only required to be correct."""
    errs = check(2, 1000, 1000, 4, 2, hd, causal, deterministic=True, seed=7, **knobs)
    assert all(e <= TOL for e in errs.values())
    q, k, v, dout = _inputs(2, 1000, 1000, 4, 2, hd, seed=11)
    runs = []
    for _ in range(2):
        out = fa4kernel.attention(q, k, v, causal=causal, deterministic=True, bwd_knobs=knobs)
        runs.append(grads(out, (q, k, v), dout))
    for a, b, name in zip(runs[0], runs[1], ("dq", "dk", "dv")):
        assert torch.isfinite(a.float()).all()
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("b,sq,sk,h,hkv", [(2, 333, 1000, 8, 1), (1, 1000, 333, 8, 2), (2, 77, 77, 3, 3),
                                          (1, 1, 200, 4, 1)],
                         ids=["mqa-333x1000", "gqa-1000x333", "mha-77", "mqa-1x200"])
def test_bwd_deterministic_odd_lengths_gqa_mqa(hd, causal, b, sq, sk, h, hkv):
    """deterministic=True at odd lengths both ways (causal: query blocks that no key block or only
    some see), with GQA and MQA (a CTA adds into every q head of its group, one semaphore each):
    right, and the same bits twice."""
    check(b, sq, sk, h, hkv, hd, causal, deterministic=True, seed=3)
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, hd, seed=5)
    runs = []
    for _ in range(2):
        out = fa4kernel.attention(q, k, v, causal=causal, deterministic=True)
        runs.append(grads(out, (q, k, v), dout))
    for a, b_, name in zip(runs[0], runs[1], ("dq", "dk", "dv")):
        assert torch.equal(a, b_), f"{name} differs between two deterministic runs"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 256])
def test_bwd_deterministic_more_key_blocks_than_sms(hd, causal):
    """One (batch, head) with more key blocks (pairs) than the H200 runs at once (20000 keys: 157
    blocks of 128, 157 pairs of 64): each CTA waits only for CTAs launched before it (causal: the
    last key block first), so the launch ends; the same bits twice, dq as the fast build's."""
    q, k, v, dout = _inputs(1, 20000, 20000, 2, 1, hd, seed=9)
    runs = []
    for det in (True, True, False):
        out = fa4kernel.attention(q, k, v, causal=causal, deterministic=det)
        runs.append(grads(out, (q, k, v), dout))
        torch.cuda.synchronize()
    for a, b_, name in zip(runs[0], runs[1], ("dq", "dk", "dv")):
        assert torch.equal(a, b_), f"{name} differs between two deterministic runs"
    for a, f, name in zip(runs[0], runs[2], ("dq", "dk", "dv")):
        assert rel_err(a, f.float()) <= TOL, name


# ---- dq_slices: the deterministic accumulator in copies, a run of key blocks (pairs) each

# (batch, seqlen_q, seqlen_k, heads, heads_kv): chunks (few queries on many keys, odd lengths), GQA
# and MQA, and a square problem where 8 copies leave runs of one key block (pair) and empty copies
SLICES_CASES = [(2, 256, 8191, 4, 4), (1, 77, 5003, 8, 2), (2, 200, 3001, 3, 1), (2, 333, 333, 4, 2)]


def _det_grads(b, sq, sk, h, hkv, hd, causal, seed, **knobs):
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, hd, seed=seed)
    out = fa4kernel.attention(q, k, v, causal=causal, deterministic=True, bwd_knobs=knobs)
    return grads(out, (q, k, v), dout)


@pytest.mark.parametrize("slices", [2, 8, 32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_bwd_slices_right_and_bit_repeatable(hd, causal, slices):
    """dq_slices copies: within the fp32 bound at odd lengths, chunks, GQA and MQA, the caching
    allocator's free memory full of NaN first (the host zeroes the copies the preprocess does not);
    the same bits twice."""
    for i, (b, sq, sk, h, hkv) in enumerate(SLICES_CASES):
        poison = torch.full((64 << 20,), float("nan"), device="cuda")
        del poison
        check(b, sq, sk, h, hkv, hd, causal, deterministic=True, seed=20 + i, dq_slices=slices)
        runs = [_det_grads(b, sq, sk, h, hkv, hd, causal, 40 + i, dq_slices=slices) for _ in range(2)]
        for a, b_, name in zip(runs[0], runs[1], ("dq", "dk", "dv")):
            assert torch.isfinite(a.float()).all(), name
            assert torch.equal(a, b_), f"{name} differs between two runs with dq_slices={slices}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_bwd_slices_default_on_a_chunk(hd, causal):
    """deterministic=True with dq_slices left out on a chunk (128 queries on 16k keys): the rule's
    32 copies (bwd_config.dq_slices_for), right and the same bits twice; dq close to one copy's,
    dK and dV its bits."""
    from fa4kernel.sm90 import bwd
    from fa4kernel.sm90.bwd_config import dq_slices_for, make_bwd_config

    assert dq_slices_for(make_bwd_config("bfloat16", hd, causal, True), 128, 16384, 2) == 32
    check(1, 128, 16384, 4, 2, hd, causal, deterministic=True, seed=13)
    assert any(c.dq_slices == 32 and c.head_dim == hd and c.causal == causal
               for c in (k[0] if isinstance(k, tuple) else k for k in bwd._CACHE))
    runs = [_det_grads(1, 128, 16384, 4, 2, hd, causal, 17) for _ in range(2)]
    one = _det_grads(1, 128, 16384, 4, 2, hd, causal, 17, dq_slices=1)
    for a, b_, name in zip(runs[0], runs[1], ("dq", "dk", "dv")):
        assert torch.equal(a, b_), f"{name} differs between two runs"
    # the copies change only the order of dQ's fp32 adds (at most a 16-bit ulp apart per element)
    assert rel_err(runs[0][0], one[0].float()) <= TOL
    assert torch.equal(runs[0][1], one[1]) and torch.equal(runs[0][2], one[2]), "dK / dV do not depend on dq_slices"


# ---- torch.autograd


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_fills_grads_like_the_reference(causal):
    """loss.backward() through fa4kernel.attention fills q.grad, k.grad, v.grad, as the fp32
    reference's autograd does (small shapes, GQA, a loss that is not a plain sum)."""
    q, k, v, w = _inputs(2, 77, 130, 4, 2, 64, seed=3)
    loss = (fa4kernel.attention(q, k, v, causal=causal).float() * w.float()).sum()
    loss.backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref_loss = (reference(q, k, v, causal) * w.float()).sum()
    ref_loss.backward()
    for g, t, name in zip(got, (q, k, v), ("dq", "dk", "dv")):
        assert g.shape == t.shape and g.dtype == t.dtype, name
        assert rel_err(g, t.grad.float()) <= TOL, name


def test_autograd_with_return_lse_and_only_k_requiring_grad():
    q, k, v, dout = _inputs(1, 200, 300, 2, 2, 128, seed=5)
    q, v = q.detach(), v.detach()
    out, lse = fa4kernel.attention(q, k, v, causal=True, return_lse=True)
    assert out.grad_fn is not None and not lse.requires_grad
    (dk,) = torch.autograd.grad(out, (k,), dout)
    (rk,) = torch.autograd.grad(reference(q, k, v, True), (k,), dout.float())
    assert rel_err(dk, rk) <= TOL


def test_forward_output_is_the_same_with_and_without_grad():
    q, k, v, _ = _inputs(2, 1000, 1000, 4, 4, 128, seed=9)
    out_grad = fa4kernel.attention(q, k, v, causal=True)
    with torch.no_grad():
        out_plain = fa4kernel.attention(q, k, v, causal=True)
    # (the grad build also writes the LSE: another build, so equal up to rounding, not bit for bit)
    assert rel_err(out_grad.detach(), out_plain.float()) <= 1e-3


def test_attention_backward_direct_call_matches_autograd():
    q, k, v, dout = _inputs(2, 333, 1000, 4, 1, 96, seed=13)
    with torch.no_grad():
        out, lse = fa4kernel.attention(q, k, v, causal=True, return_lse=True)
        dq, dk, dv = fa4kernel.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    out2 = fa4kernel.attention(q, k, v, causal=True, deterministic=True)
    for a, b in zip((dq, dk, dv), grads(out2, (q, k, v), dout)):
        assert torch.isfinite(a.float()).all()
        assert torch.equal(a, b)


@pytest.mark.parametrize("hd,causal", [(64, True), (128, False), (256, True)])
def test_bwd_clock_probe_computes_the_same_gradients(hd, causal):
    """The clock-probe build (four stamps per CTA and running sums) gives the deterministic build's
    gradients bit for bit, its stamps give a clock between the GPU's idle and boost clocks, and
    its running sums hold every CTA's span of every launch until the host zeroes them."""
    from fa4kernel.trace import PROBE_SUM_WORDS, ctas_clock_ghz, probe_sums

    q, k, v, dout = _inputs(2, 777, 1333, 4, 2, hd, seed=hd)
    with torch.no_grad():
        out, lse = fa4kernel.attention(q, k, v, causal=causal, return_lse=True)
        plain = fa4kernel.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
        *probed, stamps = fa4kernel.attention_backward_probed(dout, q, k, v, out, lse, causal=causal,
                                                              deterministic=True)
    for a, b in zip(plain, probed):
        assert torch.isfinite(a.float()).all()
        assert torch.equal(a, b)
    clock = ctas_clock_ghz(stamps.tolist())
    grid = (stamps.numel() - PROBE_SUM_WORDS) // 4
    assert clock["ctas"] == grid
    assert 0.3 < clock["ghz"] < 2.1, clock
    sums = probe_sums(stamps.tolist())  # one launch: the sums are its rows' spans
    assert (sums["ctas"], sums["cycles"], sums["ns"]) == (grid, clock["cycles"], clock["ns"])
    with torch.no_grad():  # a second launch adds to them
        *_, stamps = fa4kernel.attention_backward_probed(dout, q, k, v, out, lse, causal=causal,
                                                         deterministic=True, stamps=stamps)
    again = probe_sums(stamps.tolist())
    assert again["ctas"] == 2 * grid and again["cycles"] > sums["cycles"] and again["ns"] >= sums["ns"]
    stamps[-PROBE_SUM_WORDS:].zero_()
    assert probe_sums(stamps.tolist())["ghz"] is None


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("hd,causal", [(64, False), (128, True), (256, False), (256, True)])
def test_bwd_main_kernel_alone_accumulates_dq_per_launch(hd, causal, deterministic):
    """prepare_bwd's main() launches the main kernel alone (the power benchmark's load): called
    twice, dK and dV are the reference's and the dQ accumulator holds twice dQ (deterministic:
    the second launch's turns start over from zeroed semaphores, so it ends too)."""
    from fa4kernel.sm90.bwd import prepare_bwd

    q, k, v, dout = _inputs(2, 555, 555, 4, 4, hd, seed=7 * hd)
    with torch.no_grad():
        out, lse = fa4kernel.attention(q, k, v, causal=causal, return_lse=True)
    cfg = fa4kernel.make_bwd_config("bfloat16", hd, causal, deterministic)
    main, finish = prepare_bwd(cfg, dout, q, k, v, out, lse, 1.0 / math.sqrt(hd))
    main()
    main()
    dq2, dk, dv = finish()
    ref = reference(q, k, v, causal)
    rq, rk, rv = grads(ref, (q, k, v), dout.float())
    errs = {"dq / 2": rel_err(dq2.float() / 2, rq), "dk": rel_err(dk, rk), "dv": rel_err(dv, rv)}
    assert all(e <= TOL for e in errs.values()), errs
