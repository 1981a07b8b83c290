"""GPU correctness of fa4kernel's SM90 forward against an fp32 torch reference.

Run on the device: pytest -m gpu tests/test_kernel_sm90_gpu.py
"""

import math

import pytest

torch = pytest.importorskip("torch")

from hopper import gpu_marks  # noqa: E402

pytestmark = gpu_marks()

import fa4kernel  # noqa: E402
from fa4kernel import make_config  # noqa: E402
from fa4kernel.interface import _run  # noqa: E402

TOL = 1e-2


def _inputs(b, sq, sk, h, d, dtype=torch.bfloat16, seed=None):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed if seed is not None else torch.randint(0, 2**31 - 1, (1,)).item())
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, h, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, h, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def reference(q, k, v, causal, scale=None):
    """fp32 reference; causal is bottom-right aligned; rows that see no key give O = 0, lse = -inf."""
    d = q.shape[-1]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    qf, kf, vf = q.float(), k.float(), v.float()
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (b, h, sq)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vf)
    return o, lse


def rel_err(out, ref):
    out = out.float()
    assert not torch.isnan(out).any(), "NaN in output"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def check(q, k, v, causal, **knobs):
    out, lse = fa4kernel.attention(q, k, v, causal=causal, return_lse=True, **knobs)
    ref, ref_lse = reference(q, k, v, causal)
    err = rel_err(out, ref)
    assert err < TOL, f"rel err {err:.2e}"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin), "LSE finite pattern differs"
    lerr = (lse[fin] - ref_lse[fin]).abs().max().item() if fin.any() else 0.0
    assert lerr < 2e-2, f"lse max abs err {lerr:.2e}"
    return err


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 96, 128, 192, 256])
def test_head_dims(hd, causal):
    check(*_inputs(2, 1000, 1000, 3, hd), causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 17), (1234, 1234), (1, 300), (17, 1000), (1000, 17),
                                   (300, 1), (129, 257), (1000, 1234)])
def test_odd_lengths_hd128(sq, sk, causal):
    check(*_inputs(2, sq, sk, 2, 128), causal)


@pytest.mark.parametrize("hd", [64, 96, 192, 256])
@pytest.mark.parametrize("sq,sk", [(17, 17), (1234, 1000)])
def test_odd_lengths_other_hd(hd, sq, sk):
    check(*_inputs(1, sq, sk, 2, hd), True)


KNOB_CASES = [
    dict(pingpong=False),
    dict(intra_wg_overlap=False),
    dict(intra_wg_overlap=False, pingpong=False),
    dict(p_in_registers=False),
    dict(p_in_registers=False, intra_wg_overlap=False),
    dict(kv_stages=1),
    dict(kv_stages=3),
    dict(tile_n=64),
    dict(tile_n=176),
    dict(tile_m=192, tile_n=96, p_in_registers=False),
    dict(exp_emulation=0.125),
    dict(exp_emulation=0.5),
    dict(exp_emulation=1.0),
    dict(rescale_threshold=8.0),
    dict(rescale_threshold=8.0, exp_emulation=0.25),
    dict(rescale_before_pv=True),
    dict(rescale_before_pv=True, rescale_threshold=8.0),
    dict(chained_row_sum=True),
    dict(chained_row_sum=True, rescale_threshold=8.0, exp_emulation=0.25),
    dict(rescale_threshold=8.0, rescale_before_pv=False),
    dict(rescale_threshold=8.0, exp_emulation=0.125, p_in_registers=False),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("knobs", KNOB_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_knobs_hd128(knobs, causal):
    check(*_inputs(2, 1111, 1234, 2, 128), causal, **knobs)


@pytest.mark.parametrize("hd,knobs", [
    (64, dict(p_in_registers=False)), (64, dict(tile_m=128)), (64, dict(intra_wg_overlap=False)),
    (96, dict(tile_m=128, p_in_registers=True, tile_n=128)), (96, dict(intra_wg_overlap=False)),
    (192, dict(pingpong=True)), (256, dict(rescale_threshold=8.0, exp_emulation=0.28)),
    (256, dict(rescale_before_pv=False)), (192, dict(rescale_before_pv=False)),
    (64, dict(chained_row_sum=False)), (64, dict(tile_m=128, chained_row_sum=False)),
    (64, dict(tile_m=192, chained_row_sum=True)),
    (64, dict(rescale_threshold=8.0, exp_emulation=0.25, chained_row_sum=False)),
    (64, dict(rescale_threshold=8.0, rescale_before_pv=False)),
])
def test_knobs_other_hd(hd, knobs):
    check(*_inputs(1, 777, 900, 2, hd), True, **knobs)


def test_fp16_and_scale():
    q, k, v = _inputs(2, 513, 700, 2, 128, dtype=torch.float16)
    out = fa4kernel.attention(q, k, v, softmax_scale=0.3)
    ref, _ = reference(q, k, v, False, scale=0.3)
    assert rel_err(out, ref) < TOL


def test_large_scores_rescale():
    """Scores spanning a wide range (keys with growing magnitude) exercise the rescale paths."""
    q, k, v = _inputs(1, 600, 2000, 2, 128)
    k = k * torch.linspace(0.1, 6.0, 2000, device="cuda", dtype=torch.bfloat16)[None, :, None, None]
    for tau in (None, 8.0):
        check(q, k, v, False, rescale_threshold=tau)
        check(q, k, v, True, rescale_threshold=tau)
    for causal in (False, True):  # conditional rescaling with O rescaled after the PV wait too
        check(q, k, v, causal, rescale_threshold=8.0, rescale_before_pv=False)


def test_non_contiguous_strides():
    base = torch.randn(2, 500, 4, 128, device="cuda", dtype=torch.bfloat16)
    q = base[:, :, :2]  # heads sliced: strides (256000, 512, 128, 1)
    k = torch.randn(2, 4, 700, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)[:, :, :2]
    v = torch.randn(2, 700, 2, 128, device="cuda", dtype=torch.bfloat16)
    check(q, k, v, False)


@pytest.mark.parametrize("causal", [False, True])
def test_nan_poisoned_outputs_overwritten(causal):
    q, k, v = _inputs(2, 1234, 1000, 3, 128)
    cfg = make_config("bfloat16", 128, causal, True, {})
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 3, 1234), float("nan"), device="cuda")
    _run(cfg, q, k, v, out, lse, None)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "output elements left unwritten"
    assert not torch.isnan(lse).any(), "lse elements left unwritten"
    ref, ref_lse = reference(q, k, v, causal)
    assert rel_err(out, ref) < TOL


def test_nan_input_not_hidden():
    """A NaN in the inputs must show up in the output (the check itself must catch NaN)."""
    q, k, v = _inputs(1, 300, 300, 1, 128)
    v[0, 5, 0, 3] = float("nan")
    out = fa4kernel.attention(q, k, v)
    assert torch.isnan(out).any()
    with pytest.raises(AssertionError):
        rel_err(out, reference(q, k, v, False)[0])


def test_exp_emulation_matches_mufu():
    """Emulated exp2 (degree-3 polynomial) agrees with MUFU.EX2 within bf16 rounding."""
    q, k, v = _inputs(2, 1000, 1000, 2, 128)
    a = fa4kernel.attention(q, k, v, exp_emulation=0.0).float()
    b = fa4kernel.attention(q, k, v, exp_emulation=1.0).float()
    # P is rounded to bf16 (8 bits) before PV; the polynomial's 8.8e-5 error flips ~1% of them
    # by one ulp, so outputs differ by far less than one bf16 ulp of O on average.
    assert ((a - b).norm() / a.norm()).item() < 2e-3
    ulp = a.abs().clamp_min(1e-3) * 2.0**-7
    assert ((a - b).abs() <= 2 * ulp + 1e-3).float().mean().item() > 0.999


@pytest.mark.parametrize("hd,causal,knobs", [
    (128, False, {}), (128, True, {}), (64, True, {}), (96, False, {}), (192, True, {}),
    (256, False, {}), (128, True, dict(intra_wg_overlap=False)), (128, False, dict(pingpong=False)),
    (64, False, dict(p_in_registers=False, intra_wg_overlap=False)),
    (128, True, dict(persistent=True)), (64, True, dict(persistent=True)),
    (256, True, dict(persistent=True)), (128, False, dict(persistent=False)),
    (64, True, dict(tile_m=128, tile_n=128)), (256, True, dict(tile_n=64)),  # short-causal tiles
    # Q handed back after the last QK GEMM (peeled last block) or after the KV loop; with tile_n <
    # tile_m a causal tile can end in masked blocks only (no plain block to peel)
    (128, True, dict(early_q_release=False)), (128, False, dict(early_q_release=False)),
    (128, True, dict(tile_n=64, early_q_release=True)), (64, False, dict(early_q_release=True)),
    (64, True, dict(tile_m=128, tile_n=64, early_q_release=True)),
    # the O store's wait right after issuing it, as before defer_o_store_wait
    (128, False, dict(defer_o_store_wait=False)), (64, True, dict(tile_m=128, defer_o_store_wait=False)),
])
def test_persistent_many_tiles_per_cta(hd, causal, knobs):
    """More tiles than SMs: each persistent CTA runs several tiles back to back (Q/O buffer
    hand-over between tiles, pipeline phases carried across tiles, odd lengths)."""
    b, s, h = 3, 1999, 2048 // hd
    check(*_inputs(b, s, s + 77, h, hd), causal, **knobs)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd,sq,knobs", [
    (128, 1030, {}), (128, 1030, dict(pingpong=False)), (128, 1030, dict(intra_wg_overlap=False)),
    (128, 1030, dict(p_in_registers=False)), (64, 1000, {}), (64, 1030, {}),
    (64, 1000, dict(intra_wg_overlap=False)), (64, 1000, dict(persistent=False)),
    (96, 1000, {}), (64, 70, {}), (64, 1000, dict(early_q_release=True)),
])
def test_idle_warpgroups(hd, sq, knobs, causal):
    """The last tile of each head has consumer warpgroups without rows (1030 = 8 x 128 + 6;
    1000 = 5 x 192 + 40; 70 < 128): they skip their GEMMs and softmax but keep the pipelines'
    and ping-pong barriers' protocol. Many tiles per persistent CTA, so a protocol slip would
    hang or corrupt the next tile."""
    check(*_inputs(3, sq, sq + 50, 2048 // hd // 2, hd), causal, **knobs)


def test_results_repeatable():
    q, k, v = _inputs(4, 2048, 2048, 8, 128)
    a = fa4kernel.attention(q, k, v, causal=True)
    b = fa4kernel.attention(q, k, v, causal=True)
    assert torch.equal(a, b), "results changed between identical runs (race?)"


def test_compile_cache_reused():
    q, k, v = _inputs(1, 100, 100, 1, 128)
    fa4kernel.attention(q, k, v)
    n = len(fa4kernel.interface._CACHE)
    fa4kernel.attention(*_inputs(3, 300, 200, 2, 128))
    assert len(fa4kernel.interface._CACHE) == n


def test_one_tile_per_cta_grid_matches_persistent():
    """The persistent kernel launched with one CTA per tile gives the same result."""
    from fa4kernel import interface

    q, k, v = _inputs(4, 1500, 1500, 8, 128)
    a = fa4kernel.attention(q, k, v)
    interface.PERSISTENT = False
    try:
        b = fa4kernel.attention(q, k, v)
    finally:
        interface.PERSISTENT = True
    assert torch.equal(a, b)


@pytest.mark.parametrize("max_ctas,section_bytes", [(5, None), (132, 1), (None, 0)])
def test_causal_schedule_variants_match(max_ctas, section_bytes):
    """The causal tile schedule (host, tile_schedule.py) only decides which CTA runs a tile and
    when: a 5-CTA grid (many tiles per CTA, uneven counts), one head per section, or one section
    give bit-identical outputs to the default, which matches the reference."""
    from fa4kernel import interface

    q, k, v = _inputs(3, 1111, 1111, 5, 128)
    ref = check(q, k, v, True, persistent=True)
    assert ref < TOL
    a = fa4kernel.attention(q, k, v, causal=True, persistent=True)
    interface.MAX_CTAS, interface.L2_SECTION_BYTES = max_ctas, section_bytes
    try:
        b = fa4kernel.attention(q, k, v, causal=True, persistent=True)
    finally:
        interface.MAX_CTAS, interface.L2_SECTION_BYTES = None, None
    assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_cta_log_build_logs_every_cta_and_still_computes_attention(causal):
    """The CTA-log diagnostic build (lab/tools/cta_log_sm90.py): every CTA of a one-CTA-per-tile
    launch writes its record, on a real SM, with end after start; the output is still attention."""
    from fa4kernel.interface import attention_probed
    from fa4kernel.trace import cta_log

    q, k, v = _inputs(3, 1000, 1000, 2, 256)
    out, st = attention_probed(q, k, v, causal=causal, cta_log=True)
    torch.cuda.synchronize()
    grid = 3 * 2 * 8  # 128-row tiles of 1000 rows
    rows = cta_log(st.tolist(), grid)
    assert sorted(r["cta"] for r in rows) == list(range(grid))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert all(0 <= r["sm"] < sms and r["end_ns"] > r["start_ns"] and r["cycles"] > 0 for r in rows)
    assert rel_err(out, reference(q, k, v, causal)[0]) < 1e-2


@pytest.mark.parametrize("causal", [False, True])
def test_persistent_cta_log_build_logs_every_tile(causal):
    """A persistent CTA-log build's tile log: every tile of the host table gets a start stamp,
    in its CTA's order, each tile takes > 0 cycles; the output is still attention."""
    from fa4kernel import interface
    from fa4kernel.interface import attention_probed, resolve_config
    from fa4kernel.trace import tile_log

    q, k, v = _inputs(3, 1000, 1000, 2, 128)
    interface.MAX_CTAS = 5  # 48 tiles on 5 CTAs: 9-10 tiles each
    try:
        cfg = resolve_config(q, k, v, causal, False, persistent=True)
        table = interface._schedule(cfg, q, k).tolist()
        out, st = attention_probed(q, k, v, causal=causal, cta_log=True, persistent=True)
        torch.cuda.synchronize()
    finally:
        interface.MAX_CTAS = None
    assert len(table) == 5
    tiles = tile_log(st.tolist(), table)
    assert sorted(x["tile"] for x in tiles) == sorted(t for row in table for t in row if t >= 0)
    assert all(x["cycles"] > 0 for x in tiles)
    assert rel_err(out, reference(q, k, v, causal)[0]) < 1e-2


@pytest.mark.parametrize("cta_log", [False, True])
def test_probe_sums_every_launch(cta_log):
    """The clock probe's running sums (trace.mean_clock): every launch adds one span (a CTA-log
    build: one per CTA), the mean clock is a real SM clock, it matches the launches' own headers,
    and zeroing the sums starts a new count."""
    from fa4kernel.interface import attention_probed
    from fa4kernel.trace import header_clock, mean_clock
    from fa4kernel.trace_layout import SUM_CYCLES, SUM_SPANS, TRACE_WORDS

    q, k, v = _inputs(2, 1000, 1000, 2, 256 if cta_log else 128)
    st = torch.zeros((TRACE_WORDS,), dtype=torch.int64, device="cuda")
    spans_per_launch = 2 * 2 * 8 if cta_log else 1  # one CTA per 128-row tile, or CTA 0 alone
    heads = []
    for _ in range(4):
        out, _ = attention_probed(q, k, v, causal=True, stamps=st, cta_log=cta_log)
        torch.cuda.synchronize()
        heads.append(header_clock(st[:5].tolist()))
    m = mean_clock(st.tolist())
    assert m["spans"] == 4 * spans_per_launch
    assert 0.5 < m["ghz"] < 2.2  # an SM clock in GHz, not a unit slip
    if not cta_log:  # CTA 0's spans, launch by launch
        assert m["cycles"] == sum(h["cycles"] for h in heads) and m["ns"] == sum(h["ns"] for h in heads)
    st[SUM_CYCLES:SUM_SPANS + 1].zero_()
    attention_probed(q, k, v, causal=False, stamps=st, cta_log=cta_log)
    torch.cuda.synchronize()
    assert mean_clock(st.tolist())["spans"] == spans_per_launch
    assert rel_err(out, reference(q, k, v, True)[0]) < 1e-2
