"""CPU-only: fa4kernel.attention rejects bad inputs with a one-line ValueError before compiling."""

import pytest

torch = pytest.importorskip("torch")

import fa4kernel  # noqa: E402
from fa4kernel.sm90 import config  # noqa: E402


def qkv(b=2, sq=64, sk=64, h=2, d=128, dtype=torch.bfloat16, device="cpu"):
    mk = lambda s: torch.randn(b, s, h, d, dtype=dtype, device=device)  # noqa: E731
    return mk(sq), mk(sk), mk(sk)


def raises(match, *args, **kwargs):
    with pytest.raises(ValueError, match=match) as ei:
        fa4kernel.attention(*args, **kwargs)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_dtype():
    q, k, v = qkv(dtype=torch.float32)
    raises("q.dtype", q, k, v)
    q, k, v = qkv()
    raises("dtypes differ", q, k.half(), v.half())


def test_device_is_last_check_and_clear():
    msg = raises("CUDA device", *qkv())
    assert "q" in msg


def test_head_dim():
    raises("head_dim=80 not supported", *qkv(d=80))
    raises("head_dim=32 not supported", *qkv(d=32))


def test_shapes():
    q, k, v = qkv()
    raises("must be 4-D", q[0], k, v)
    raises("k shape", q, k, v[:, :10])
    q2, k2, v2 = qkv(h=3)
    raises("k/v heads=3 with q heads=2; allowed: k/v heads dividing q heads", q, k2, v2)
    q3, k3, v3 = qkv(b=3)
    raises("does not match q shape", q, k3, v3)
    raises("empty input", *qkv(sq=0))


@pytest.mark.parametrize("h,hkv", [(8, 2), (8, 1), (6, 3), (4, 4)])
def test_gqa_and_mqa_pass_the_checks(h, hkv):
    """GQA / MQA: k/v with heads_kv dividing heads get past every argument check (the next one
    is the device's), and the forward's SASS is the same build for any head ratio."""
    q, _, _ = qkv(h=h)
    _, k, v = qkv(h=hkv)
    raises("CUDA device", q, k, v)
    from fa4kernel.interface import resolve_config

    assert resolve_config(q, k, v, True) == resolve_config(q, q, q, True)


@pytest.mark.parametrize("h,hkv", [(8, 3), (2, 4), (5, 2)])
def test_gqa_heads_must_divide(h, hkv):
    q, _, _ = qkv(h=h)
    _, k, v = qkv(h=hkv)
    msg = raises(f"k/v heads={hkv} with q heads={h}", q, k, v)
    assert "dividing" in msg


def test_strides():
    q, k, v = qkv()
    qt = q.transpose(2, 3)  # head_dim not contiguous
    raises(r"q.stride\(-1\)", qt.contiguous().transpose(2, 3), k, v)
    base = torch.randn(2, 64, 2, 130, dtype=torch.bfloat16)[..., :128]  # row stride 130: not 16B
    raises(r"q.stride\(\d\)=\d+; allowed: positive multiples of 8", base, k, v)


def test_scalar_args():
    q, k, v = qkv()
    raises("softmax_scale", q, k, v, softmax_scale=-1.0)
    raises("softmax_scale", q, k, v, softmax_scale=float("nan"))
    raises("causal", q, k, v, causal="yes")
    raises("return_lse", q, k, v, return_lse=1)


def test_unknown_knob():
    msg = raises("unknown knob", *qkv(), tile_k=64)
    assert "tile_m" in msg  # names what is allowed


@pytest.mark.parametrize("knobs,match", [
    (dict(tile_m=64), "tile_m=64"),
    (dict(tile_m=256), "tile_m=256"),
    (dict(tile_n=100), "tile_n=100"),
    (dict(tile_n=512), "tile_n=512"),
    (dict(kv_stages=0), "kv_stages=0"),
    (dict(kv_stages=2.0), "kv_stages=2.0"),
    (dict(pingpong=1), "pingpong=1"),
    (dict(intra_wg_overlap="no"), "intra_wg_overlap"),
    (dict(p_in_registers=None, tile_n=8), "tile_n=8"),
    (dict(exp_emulation=1.5), "exp_emulation=1.5"),
    (dict(exp_emulation=-0.1), "exp_emulation"),
    (dict(exp_emulation=True), "exp_emulation"),
    (dict(rescale_threshold=-1.0), "rescale_threshold"),
    (dict(rescale_threshold=100.0), "rescale_threshold"),
])
def test_bad_knob_values(knobs, match):
    raises(match, *qkv(), **knobs)


@pytest.mark.parametrize("d,knobs,match", [
    (256, dict(tile_n=128), "registers"),  # O 128 + S 64 + P 32 regs > 240
    (128, dict(tile_m=192), "registers"),  # 3 WGs get 160 regs
    (96, dict(p_in_registers=True), "registers"),  # FA4: RS with 192-row tiles does not fit
    (256, dict(kv_stages=3), "shared memory"),
    (192, dict(tile_n=128), "shared memory"),  # 240 KB > 227 KB
    (128, dict(tile_n=256, kv_stages=4, p_in_registers=False), "registers|shared memory"),
])
def test_combinations_that_do_not_fit(d, knobs, match):
    raises(match, *qkv(d=d), **knobs)


def test_defaults_match_fa4_table_and_fit():
    for d in config.SUPPORTED_HEAD_DIMS:
        for causal in (False, True):
            cfg = config.make_config("bfloat16", d, causal, False, {})
            assert config.smem_bytes(d, cfg.tile_m, cfg.tile_n, cfg.kv_stages, cfg.p_in_registers) \
                <= config.SMEM_LIMIT_BYTES
    t = {d: config.default_knobs(d) for d in config.SUPPORTED_HEAD_DIMS}
    assert (t[64]["tile_m"], t[64]["tile_n"], t[64]["p_in_registers"], t[64]["pingpong"]) == (192, 128, True, True)
    assert (t[96]["tile_m"], t[96]["tile_n"], t[96]["p_in_registers"]) == (192, 144, False)
    assert config.default_knobs(96, causal=True)["tile_n"] == 112  # 128 spills in our kernel
    assert (t[128]["tile_m"], t[128]["tile_n"], t[128]["pingpong"]) == (128, 128, True)
    assert (t[192]["pingpong"], t[256]["tile_n"], t[256]["pingpong"]) == (False, 64, False)  # 64: measured


def test_rescale_threshold_none_and_zero_mean_always_rescale():
    a = config.make_config("bfloat16", 128, False, False, dict(rescale_threshold=None))
    b = config.make_config("bfloat16", 128, False, False, dict(rescale_threshold=0))
    assert a.rescale_threshold == b.rescale_threshold == 0.0


def test_rescale_threshold_default_is_fa4s_tau_except_hd256_without_a_mask():
    """Conditional rescaling by default (FA4's tau); hd256 without a mask rescales always."""
    for d in config.SUPPORTED_HEAD_DIMS:
        for causal in (False, True):
            got = config.make_config("bfloat16", d, causal, False, {}).rescale_threshold
            want = 0.0 if (d == 256 and not causal) else config.DEFAULT_RESCALE_THRESHOLD
            assert got == want, (d, causal)
    assert config.make_config("bfloat16", 128, False, False, dict(rescale_threshold=4.0)).rescale_threshold == 4.0


def test_exp2_emulation_reference_accuracy():
    import math

    from fa4kernel.softmax import exp2_emulated_reference

    worst = max(abs(exp2_emulated_reference(x / 97.0) / 2.0 ** (x / 97.0) - 1)
                for x in range(-97 * 120, 97 * 8))
    assert worst < 9e-5
    assert exp2_emulated_reference(-math.inf) == 0.0
    assert exp2_emulated_reference(-127.0) == 0.0


def test_conditional_rescale_rule_is_exact_and_bounded():
    """Python model of the online softmax with FA4's rule: P stays <= 2^tau and the result is
    the exact softmax (the final normalisation uses the max actually kept)."""
    import math
    import random

    from fa4kernel.softmax import rescale_rule_reference

    rng = random.Random(7)
    scale_log2 = 0.125 * math.log2(math.e)
    for tau in (0.0, 8.0):
        scores = [rng.gauss(0, 1) * (1 + i / 40) * 30 for i in range(400)]  # growing max
        vals = [rng.gauss(0, 1) for _ in scores]
        m, l, o, pmax = -math.inf, 0.0, 0.0, 0.0
        for j in range(0, len(scores), 32):
            blk = scores[j:j + 32]
            m_new = max([m] + blk)
            m, acc = rescale_rule_reference(m, m_new, scale_log2, tau)
            p = [math.exp2((x - m) * scale_log2) for x in blk]
            pmax = max(pmax, max(p))
            l = l * acc + sum(p)
            o = o * acc + sum(pi * v for pi, v in zip(p, vals[j:j + 32]))
        mx = max(scores)
        w = [math.exp((x - mx) * 0.125) for x in scores]
        ref = sum(wi * v for wi, v in zip(w, vals)) / sum(w)
        assert abs(o / l - ref) < 1e-9
        assert pmax <= 2.0 ** tau * (1 + 1e-12) if tau > 0 else pmax <= 1.0 + 1e-12


def test_persistent_default_where_o_has_its_own_buffer():
    """attention()'s resolved config: persistent CTAs when O has its own smem buffer (hd64/128),
    causal or not, at any length; one CTA per tile otherwise (hd256); explicit knobs win."""
    import torch

    from fa4kernel.interface import resolve_config

    def cfg(s, hd, causal, **knobs):
        q = torch.zeros(1, s, 2, hd, dtype=torch.bfloat16)
        return resolve_config(q, q, q, causal, **knobs)

    assert cfg(1024, 128, True).persistent and cfg(1000, 64, True).persistent
    # short causal launches take smaller tiles (interface.SHORT_CAUSAL_TILES); knobs win
    assert (cfg(1024, 64, True).tile_m, cfg(2048, 64, True).tile_m, cfg(1024, 64, False).tile_m) == (128, 192, 192)
    assert (cfg(1000, 256, True).tile_n, cfg(4096, 256, True).tile_n, cfg(1000, 256, True, tile_n=80).tile_n) == (64, 64, 80)
    # long launches without a mask at hd256 take 80 keys (interface.LONG_TILES) from 2048 keys; knobs win
    assert (cfg(2047, 256, False).tile_n, cfg(2048, 256, False).tile_n, cfg(16384, 256, False, tile_n=64).tile_n) == (64, 80, 64)
    assert cfg(16384, 128, False).tile_n == 128 and cfg(16384, 256, False, tile_m=128).tile_n == 64
    assert cfg(1024, 64, True, tile_m=192).tile_m == 192 and cfg(1024, 64, True, tile_n=64).tile_m == 192
    assert cfg(16384, 128, True).persistent
    assert not cfg(1024, 256, True).persistent and not cfg(1024, 256, False).persistent  # O in Q's buffer
    assert not cfg(1024, 128, True, persistent=False).persistent
    assert cfg(4096, 128, False).persistent and cfg(4096, 128, True, persistent=True).persistent


def test_rescale_before_pv_auto_and_checked():
    """FA4's rule: O is rescaled before the PV GEMM for head dims > 128 (with the overlap)."""
    always = dict(rescale_threshold=None)  # always rescale: FA4's head-dim rule alone
    auto = {d: config.make_config("bfloat16", d, False, False, always).rescale_before_pv
            for d in config.SUPPORTED_HEAD_DIMS}
    assert auto == {64: False, 96: False, 128: False, 192: True, 256: True}
    assert not config.make_config("bfloat16", 256, False, False, dict(intra_wg_overlap=False)).rescale_before_pv
    # with conditional rescaling the rescale goes before the PV GEMM at every head dim (its branch
    # after the PV wait cost as much as the FMULs it skips), unless asked otherwise
    for d in config.SUPPORTED_HEAD_DIMS:
        for causal in (False, True):
            assert config.make_config("bfloat16", d, causal, False, dict(rescale_threshold=8.0)).rescale_before_pv
    assert not config.make_config("bfloat16", 128, False, False,
                                  dict(rescale_threshold=8.0, rescale_before_pv=False)).rescale_before_pv
    assert not config.make_config("bfloat16", 128, False, False,
                                  dict(rescale_threshold=8.0, intra_wg_overlap=False)).rescale_before_pv
    assert config.make_config("bfloat16", 128, False, False, dict(rescale_before_pv=True)).rescale_before_pv
    with pytest.raises(ValueError, match="rescale_before_pv=True needs intra_wg_overlap=True"):
        config.make_config("bfloat16", 128, False, False, dict(rescale_before_pv=True, intra_wg_overlap=False))
    with pytest.raises(ValueError, match="rescale_before_pv='yes' not supported"):
        config.make_config("bfloat16", 128, False, False, dict(rescale_before_pv="yes"))


def test_early_q_release_auto_and_checked():
    """Q goes back to the producer right after a tile's last QK GEMM where O has its own smem
    buffer, the overlap is on and there are 2 consumer warpgroups (measured); else after the loop."""
    mk = lambda d, **kn: config.make_config("bfloat16", d, False, False, kn)  # noqa: E731
    auto = {d: mk(d).early_q_release for d in config.SUPPORTED_HEAD_DIMS}
    assert auto == {64: False, 96: False, 128: True, 192: False, 256: False}  # 64/96: 192-row tiles; 192/256: O in Q
    assert mk(64, tile_m=128).early_q_release and mk(64, early_q_release=True).early_q_release
    assert not mk(128, intra_wg_overlap=False).early_q_release
    with pytest.raises(ValueError, match="early_q_release=True needs intra_wg_overlap=True"):
        mk(128, early_q_release=True, intra_wg_overlap=False)
    with pytest.raises(ValueError, match="the O store reuses Q"):
        mk(256, early_q_release=True)
    with pytest.raises(ValueError, match="early_q_release=1 not supported"):
        mk(128, early_q_release=1)


def test_defer_o_store_wait_auto_and_checked():
    """The O store's wait moves to the next epilogue wherever O has its own smem buffer."""
    mk = lambda d, **kn: config.make_config("bfloat16", d, False, False, kn)  # noqa: E731
    auto = {d: mk(d).defer_o_store_wait for d in config.SUPPORTED_HEAD_DIMS}
    assert auto == {64: True, 96: False, 128: True, 192: False, 256: False}  # 96 (192 x 144), 192, 256: O in Q
    assert not mk(128, defer_o_store_wait=False).defer_o_store_wait
    with pytest.raises(ValueError, match="defer_o_store_wait=True needs O in its own smem buffer"):
        mk(256, defer_o_store_wait=True)
    with pytest.raises(ValueError, match="defer_o_store_wait='no' not supported"):
        mk(128, defer_o_store_wait="no")


def test_chained_row_sum_auto_and_checked():
    """The softmax order with the O-scale exp2 last and one row-sum chain: auto at causal
    head_dim 64 (measured faster there, slower non-causal and at 128 and 256: fa4kernel/README.md,
    "Softmax order")."""
    mk = lambda d, causal=False, **kn: config.make_config("bfloat16", d, causal, False, kn)  # noqa: E731
    auto = {(d, c): mk(d, c).chained_row_sum for d in config.SUPPORTED_HEAD_DIMS for c in (False, True)}
    assert [k for k, on in auto.items() if on] == [(64, True)]
    assert mk(128, chained_row_sum=True).chained_row_sum and not mk(64, chained_row_sum=False).chained_row_sum
    with pytest.raises(ValueError, match="chained_row_sum=1 not supported"):
        mk(64, chained_row_sum=1)


@pytest.mark.parametrize("cap", [(8, 0), (8, 9), (12, 0)])
def test_attention_on_an_unsupported_gpu_is_one_line(monkeypatch, cap):
    """The kernel is picked by the GPU's compute capability: anything but sm_90 / sm_100 is a
    one-line error naming the architecture and the supported ones (no compile, no launch)."""
    from fa4kernel import interface

    monkeypatch.setattr(interface, "capability", lambda q: cap)
    msg = raises(f"sm_{cap[0]}{cap[1]} GPU", *qkv())
    assert "sm_90" in msg and "sm_100" in msg


@pytest.mark.parametrize("kwargs,says", [
    (dict(arch="sm_80"), "arch='sm_80' not supported; allowed: 'sm_90a'"),
    (dict(arch="sm_100a", cfg=fa4kernel.make_config("bfloat16", 128, False, False, {})), "not the SM100 kernel's"),
    (dict(arch="sm_90a", head_dim=80), "head_dim=80 not supported"),
    (dict(arch="sm_90a", trace=True), "unknown knob(s) trace"),
    (dict(arch="sm_90a", diagnostics="trace"), "diagnostics='trace'"),
    (dict(arch="sm_100a", head_dim=256), "head_dim=256 not supported"),
])
def test_compile_sass_rejects_bad_arguments_before_compiling(kwargs, says):
    with pytest.raises(ValueError) as ei:
        fa4kernel.compile_sass(**kwargs)
    assert says in str(ei.value) and "\n" not in str(ei.value)


def test_package_import_is_plain_python():
    """fa4sim imports fa4kernel.make_config / default_knobs: no torch, CUDA or CuTe DSL on import."""
    import subprocess
    import sys

    code = ("import sys, fa4kernel; fa4kernel.default_knobs(128, True); "
            "fa4kernel.make_config('bfloat16', 64, True, False, {}); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cutlass', 'cuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- backward / autograd: the checks run at forward time, on the CPU


def qkv_grad(d=128, h=2, hkv=2, dtype=torch.bfloat16):
    q, _, _ = qkv(h=h, d=d, dtype=dtype)
    _, k, v = qkv(h=hkv, d=d, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v)]


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("h,hkv", [(2, 2), (8, 2), (8, 1)])
def test_backward_supported_arguments_reach_the_device_check(d, h, hkv):
    """Every forward head dim has a backward: with GQA / MQA it passes the backward's checks
    (the device's is next)."""
    raises("CUDA device", *qkv_grad(d=d, h=h, hkv=hkv), causal=True, deterministic=True)


def test_backward_only_when_grad_is_needed():
    """Backward knobs are checked only when q, k or v requires grad."""
    refused = {"tile_m": 128}  # 128-row blocks at head_dim 64 only: refused at head_dim 256
    q, k, v = qkv_grad(d=256)
    with torch.no_grad():
        raises("CUDA device", q, k, v, bwd_knobs=refused)
    raises("CUDA device", *qkv(d=256), bwd_knobs=refused)  # nothing requires grad
    q, k, v = qkv(d=256)
    raises("tile_m=128 not supported", q, k.requires_grad_(), v, bwd_knobs=refused)  # any of q, k, v


def test_backward_deterministic_argument():
    raises("deterministic='yes'; allowed: True or False", *qkv(), deterministic="yes")
    raises("deterministic=1; allowed: True or False", *qkv_grad(), deterministic=1)


def test_backward_on_sm100_is_one_line(monkeypatch):
    from fa4kernel import interface

    monkeypatch.setattr(interface, "capability", lambda q: (10, 0))
    msg = raises("requires grad on sm_100", *qkv_grad())
    assert "sm_90" in msg


def test_attention_backward_checks_its_tensors():
    q, k, v = qkv(d=128)
    out = torch.randn_like(q)
    lse = torch.randn(q.shape[0], q.shape[2], q.shape[1])

    def bad(match, *args, **kw):
        with pytest.raises(ValueError, match=match) as ei:
            fa4kernel.attention_backward(*args, **kw)
        assert "\n" not in str(ei.value)

    bad(r"lse: \(2, 64, 2\)", out, q, k, v, out, lse.transpose(1, 2).contiguous())
    bad("out: .* torch.float16", out, q, k, v, out.half(), lse)
    bad("dout: ", out[:, :10], q, k, v, out, lse)
    bad("head_dim=160 not supported", *(torch.randn(1, 8, 1, 160, dtype=torch.bfloat16),) * 5,
        torch.zeros(1, 1, 8))
    bad("deterministic=2", out, q, k, v, out, lse, deterministic=2)
    bad("CUDA device", out, q, k, v, out, lse, causal=True)
