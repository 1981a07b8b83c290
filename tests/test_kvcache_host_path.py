"""attention_with_kvcache's host path on the CPU: what it keeps per call signature (the _Record:
checks' verdict, plan, packed views' geometry, compiled functions) and per layout and stream (the
fp32 workspaces), and that none of it changes what a call computes or lets a bad input through.

The launches are replaced (the kernels cannot run here): by recorders of their arguments, or, for
the bound path (the compiled functions called directly), by interface's compile functions
returning recorders, with kvcache.validate_device's CUDA-device check left out (CPU tensors)."""
import pytest

torch = pytest.importorskip("torch")

import fa4kernel  # noqa: E402
from fa4kernel import interface, kvcache  # noqa: E402

SEEN = []


def _decode(cfg, q, k, v, out, lse, seqused, group, num_splits, softmax_scale):
    SEEN.append(("decode", cfg, q, k, v, out, lse, seqused, group, num_splits, softmax_scale))
    out.zero_()
    lse.zero_()


def _combine(out_accum, lse_accum, out, lse, group, num_splits):
    SEEN.append(("combine", out_accum, lse_accum, out, lse, group, num_splits))
    out.zero_()
    lse.zero_()


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Empty caches per test; the recorders as the launches."""
    monkeypatch.setattr(kvcache, "_RECORDS", {})
    monkeypatch.setattr(kvcache, "_WORKSPACES", {})
    monkeypatch.setattr(kvcache, "_WORKSPACE_BYTES", [0])
    monkeypatch.setattr(kvcache, "launch_decode", _decode)
    monkeypatch.setattr(kvcache, "launch_combine", _combine)
    SEEN.clear()
    yield


def _inputs(b=2, sq=1, sk=256, hkv=2, g=4, d=64, dtype=torch.float16):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, sq, hkv * g, d, generator=gen).to(dtype)
    k = torch.randn(b, sk, hkv, d, generator=gen).to(dtype)
    v = torch.randn(b, sk, hkv, d, generator=gen).to(dtype)
    return q, k, v


def _call(q, k, v, **kw):
    return fa4kernel.attention_with_kvcache(q, k, v, **kw)


def _record(q, k, v, cache_seqlens=None, causal=True, softmax_scale=None, num_splits=None, return_lse=False):
    key = kvcache._call_key(q, k, v, cache_seqlens, causal, softmax_scale, num_splits, return_lse)
    return kvcache._RECORDS[key]


def _storage(t):
    return t.untyped_storage().data_ptr()


def test_one_record_per_signature_and_its_plan():
    q, k, v = _inputs()
    _call(q, k, v)
    r = _record(q, k, v)
    assert len(kvcache._RECORDS) == 1
    q2, k2, v2 = (t.clone() for t in (q, k, v))  # other tensors, the same signature
    _call(q2, k2, v2)
    assert len(kvcache._RECORDS) == 1 and _record(q2, k2, v2) is r
    b, sq, sk, h, hkv, d = r.shape
    assert r.shape == (2, 1, 256, 8, 2, 64)
    assert r.plan is kvcache.decode_plan(b, sq, sk, h, hkv, d, "float16", True, None, kvcache.DEFAULT_SMS)
    assert (r.cfg, r.num_splits, r.group, r.rows) == (r.plan["cfg"], r.plan["num_splits"], 4, 4)
    # the launches got the plan's config and split count both times
    decodes = [s for s in SEEN if s[0] == "decode"]
    assert len(decodes) == 2 and all(s[1] is r.cfg and s[9] == r.num_splits for s in decodes)


@pytest.mark.parametrize("change", ["seqlen_cache", "batch", "heads", "heads_kv", "head_dim", "dtype", "num_splits",
                                    "causal", "return_lse", "softmax_scale", "cache_seqlens", "q_strides",
                                    "seqlen_q"])
def test_a_different_signature_gets_its_own_record(change):
    base = dict(b=2, sq=1, sk=256, hkv=2, g=4, d=64, dtype=torch.float16)
    kw = dict(causal=True, num_splits=None, return_lse=False, softmax_scale=None, cache_seqlens=None)
    q, k, v = _inputs(**base)
    _call(q, k, v, **kw)
    r0 = _record(q, k, v, **kw)
    shape_change = {"seqlen_cache": dict(sk=512), "batch": dict(b=3), "heads": dict(g=2), "heads_kv": dict(hkv=1, g=8),
                    "head_dim": dict(d=128), "dtype": dict(dtype=torch.bfloat16), "seqlen_q": dict(sq=2)}
    if change in shape_change:
        q, k, v = _inputs(**{**base, **shape_change[change]})
    elif change == "q_strides":  # the same values in a strided q: other strides, another record
        q = torch.empty(2, 3, 8, 64, dtype=torch.float16)[:, 1:2].copy_(q)
    else:
        kw[change] = {"num_splits": 3, "causal": False, "return_lse": True, "softmax_scale": 0.5,
                      "cache_seqlens": torch.full((2,), 200, dtype=torch.int32)}[change]
    _call(q, k, v, **kw)
    r1 = _record(q, k, v, **kw)
    assert r1 is not r0 and len(kvcache._RECORDS) == 2
    _call(q, k, v, **kw)  # and keeps it
    assert _record(q, k, v, **kw) is r1 and len(kvcache._RECORDS) == 2
    if change in ("seqlen_cache", "batch", "heads", "heads_kv", "head_dim", "seqlen_q"):
        assert r1.shape != r0.shape
    if change in ("dtype", "head_dim") or (change == "num_splits" and r0.num_splits == 1):
        assert r1.cfg != r0.cfg
    if change == "causal":  # one new token sees the whole row either way: the same build, its own record
        assert r1.cfg == r0.cfg


def test_true_and_one_are_different_signatures():
    q, k, v = _inputs()
    _call(q, k, v, num_splits=1, softmax_scale=1)
    with pytest.raises(ValueError, match="num_splits=True"):
        _call(q, k, v, num_splits=True, softmax_scale=1)
    with pytest.raises(ValueError, match="softmax_scale=True"):
        _call(q, k, v, num_splits=1, softmax_scale=True)
    with pytest.raises(ValueError, match="causal=1"):
        _call(q, k, v, causal=1)


def test_bad_inputs_still_raise_after_a_good_call_with_the_same_shapes():
    q, k, v = _inputs(b=2, sq=2, sk=32, hkv=2, g=2)
    good = torch.tensor([5, 32], dtype=torch.int32)
    for _ in range(2):
        _call(q, k, v, cache_seqlens=good)
    # cache_seqlens' values (on the CPU) are checked every call: the same signature, bad values
    with pytest.raises(ValueError, match=r"allowed: each in \[2, 32\]"):
        _call(q, k, v, cache_seqlens=torch.tensor([1, 32], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"allowed: each in \[2, 32\]"):
        _call(q, k, v, cache_seqlens=torch.tensor([5, 33], dtype=torch.int32))
    # grad: the signature knows whether grad is needed
    _call(q, k, v)
    with pytest.raises(ValueError, match="requires grad"):
        _call(q.clone().requires_grad_(), k, v)
    with torch.no_grad():
        _call(q.clone().requires_grad_(), k, v)  # under no_grad it is fine
    # the rest of test_kvcache's bad inputs, each after a good call
    bad = [dict(k_cache=k[:, :1], v_cache=v[:, :1]), dict(cache_seqlens=torch.tensor([3, 3])),
           dict(cache_seqlens=[3, 3]), dict(q=q.float()), dict(v_cache=v[:, :5]), dict(num_splits=0),
           dict(num_splits=2.0), dict(softmax_scale=-1.0), dict(softmax_scale=float("nan")),
           dict(softmax_scale=[1.0]), dict(causal="yes"), dict(return_lse=1),
           dict(q=torch.zeros(2, 2, 3, 64, dtype=torch.float16))]
    for kw in bad:
        _call(q, k, v)
        args = {**dict(q=q, k_cache=k, v_cache=v), **kw}
        for _ in range(2):  # and a second time: a failed check keeps no record
            n = len(kvcache._RECORDS)
            with pytest.raises(ValueError) as e:
                fa4kernel.attention_with_kvcache(**args)
            assert "\n" not in str(e.value), kw
            assert len(kvcache._RECORDS) == n


def test_tensor_subclasses_take_the_uncached_path():
    q, k, v = _inputs()
    p = torch.nn.Parameter(q, requires_grad=False)
    assert kvcache._call_key(p, k, v, None, True, None, None, False) is None
    _call(p, k, v)
    _call(p, k, v)
    assert kvcache._RECORDS == {} and len([s for s in SEEN if s[0] == "decode"]) == 2


@pytest.mark.parametrize("num_splits,return_lse", [(None, False), (None, True), (1, False), (1, True)])
@pytest.mark.parametrize("sq", [1, 3])
def test_workspaces_are_kept_and_never_returned(num_splits, return_lse, sq):
    q, k, v = _inputs(sq=sq, sk=2048)
    outs, workspaces = [], []
    for _ in range(3):
        SEEN.clear()
        res = _call(q, k, v, num_splits=num_splits, return_lse=return_lse)
        got = list(res) if return_lse else [res]
        dec = SEEN[0]
        comb = SEEN[1] if len(SEEN) > 1 else None
        if comb is not None:  # the partials, and the combine's lse where it is not returned
            ws = [dec[5], dec[6]] + ([] if return_lse else [comb[4]])
            assert comb[3] is got[0] and (not return_lse or comb[4] is got[1])
        else:  # out and lse written through their packed views; the lse a workspace when not returned
            ws = [] if return_lse else [dec[6]]
            assert dec[5]._base is got[0] or _storage(dec[5]) == _storage(got[0])
        for t in ws:
            assert t.dtype == torch.float32
            for o in got + [x for prev in outs for x in prev]:  # this call's outputs and every earlier one
                assert _storage(t) != _storage(o)
        outs.append(got)
        workspaces.append([_storage(t) for t in ws])
    assert workspaces[0] == workspaces[1] == workspaces[2]  # kept: the same buffers every call
    fresh = [_storage(t) for got in outs for t in got]
    assert len(set(fresh)) == len(fresh)  # out (and lse) new every call
    assert outs[0][0].shape == q.shape and outs[0][0].is_contiguous() and outs[0][0].dtype == q.dtype
    if return_lse:
        assert outs[0][1].shape == (2, 8, sq) and outs[0][1].dtype == torch.float32


def test_two_streams_get_their_own_workspaces(monkeypatch):
    q, k, v = _inputs(sk=2048)  # splits: the partials are workspaces
    stream = ["s1"]
    monkeypatch.setattr(kvcache, "_stream_key", lambda device: stream[0])

    def partials():
        SEEN.clear()
        _call(q, k, v)
        return _storage(SEEN[0][5]), _storage(SEEN[1][4])  # out_accum, the unreturned lse

    a = partials()
    stream[0] = "s2"
    b = partials()
    assert set(a).isdisjoint(b)
    stream[0] = "s1"
    assert partials() == a
    stream[0] = "s2"
    assert partials() == b
    assert len(kvcache._WORKSPACES) == 2
    # during CUDA graph capture (_NO_CACHE): fresh buffers every call, none kept
    stream[0] = kvcache._NO_CACHE
    c1 = partials()
    held = SEEN[0][5]  # alive, so that the next buffers cannot take its memory
    c2 = partials()
    assert held is not None and set(c1).isdisjoint(c2) and set(c1).isdisjoint(a + b)
    assert len(kvcache._WORKSPACES) == 2


def test_stream_key(monkeypatch):
    """Keyed by (device index, current stream id); _NO_CACHE while capturing or off the current
    device; None off CUDA."""
    assert kvcache._stream_key(torch.device("cpu")) is None
    kvcache._bind_torch()
    streams = {0: (111, 0, 1), 1: (222, 1, 1)}
    state = {"capturing": False, "device": 0}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: state["device"], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentStream", lambda i: streams[i], raising=False)
    assert kvcache._stream_key(torch.device("cuda", 0)) == (111, 0)
    streams[0] = (333, 0, 1)  # another current stream on the device
    assert kvcache._stream_key(torch.device("cuda", 0)) == (333, 0)
    assert kvcache._stream_key(torch.device("cuda", 1)) is kvcache._NO_CACHE  # not the current device
    state["device"] = 1
    assert kvcache._stream_key(torch.device("cuda", 1)) == (222, 1)
    state["capturing"] = True
    assert kvcache._stream_key(torch.device("cuda", 1)) is kvcache._NO_CACHE


def test_workspaces_are_bounded(monkeypatch):
    monkeypatch.setattr(kvcache, "MAX_WORKSPACES", 2)
    for sk in (1024, 2048, 4096):  # other split counts: other layouts
        q, k, v = _inputs(sk=sk, hkv=1, g=8)
        _call(q, k, v, num_splits=sk // 256)
    assert len(kvcache._WORKSPACES) == 2
    assert kvcache._WORKSPACE_BYTES[0] == sum(t.numel() * 4 for ws in kvcache._WORKSPACES.values()
                                              for t in ws if t is not None)
    monkeypatch.setattr(kvcache, "MAX_WORKSPACE_BYTES", 1024)  # larger than this: not kept
    q, k, v = _inputs(sk=4096, hkv=2, g=4)
    _call(q, k, v, num_splits=8)
    assert len(kvcache._WORKSPACES) == 2


def test_a_capture_keeps_no_record(monkeypatch):
    monkeypatch.setattr(kvcache, "_capturing", lambda r: True)
    q, k, v = _inputs()
    _call(q, k, v)
    _call(q, k, v)
    assert kvcache._RECORDS == {}


def test_workspaces_made_in_inference_mode_serve_later_calls():
    q, k, v = _inputs(sk=2048)
    with torch.inference_mode():
        _call(q, k, v)
    SEEN.clear()
    _call(q, k, v)  # the recorders write the workspaces in place: not inference tensors
    assert not SEEN[0][5].is_inference()


def _old_one_token_view(t, heads_kv):
    """pack's one-token view as it was written (view, transpose)."""
    b, sq, h, d = t.shape
    return t.view(b, heads_kv, h // heads_kv, d).transpose(1, 2)


@pytest.mark.parametrize("b,h,hkv", [(1, 8, 1), (1, 8, 8), (2, 8, 8), (1, 1, 1), (3, 32, 8), (4, 16, 2)])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "offset"])
def test_one_token_pack_is_the_old_view(b, h, hkv, layout):
    d = 64
    if layout == "contiguous":
        t = torch.randn(b, 1, h, d)
    elif layout == "strided":  # one token of a longer q, heads of a wider buffer
        t = torch.randn(b, 3, h + 4, d + 8)[:, 1:2, 2:2 + h, :d]
    else:  # a non-zero storage offset
        t = torch.randn(b * h * d + 24)[24:].view(b, 1, h, d)
    old, new = _old_one_token_view(t, hkv), kvcache.pack(t, hkv)
    for p in (new, t.as_strided(*kvcache._view_geometry(old, t))):  # pack, and the call's own (_Record.q_view)
        assert p.shape == old.shape and p.stride() == old.stride()
        assert p.storage_offset() == old.storage_offset() and p.data_ptr() == old.data_ptr()
        assert p._base is not None and torch.equal(p, old)
    assert kvcache.pack(t, hkv).stride() == old.stride()  # the kept geometry, a second time


def test_the_calls_packed_views_are_packs(monkeypatch):
    """What the launches get: pack(q) (a view for one token or group 1, a copy else) and pack(out)."""
    for sq, g, ns in ((1, 4, 1), (1, 4, None), (3, 1, 1), (3, 4, 1)):
        q, k, v = _inputs(sq=sq, g=g, hkv=2, sk=2048)
        q = torch.empty(2, sq + 2, 2 * g, 72, dtype=q.dtype)[:, 1:1 + sq, :, :64].copy_(q)  # strided
        for _ in range(2):
            SEEN.clear()
            out = _call(q, k, v, num_splits=ns, causal=False)
            qp = SEEN[0][2]
            ref = kvcache._pack_views(q, 2)
            assert qp.shape == ref.shape and qp.stride() == ref.stride() and torch.equal(qp, ref)
            assert (qp.data_ptr() == q.data_ptr()) == (sq == 1 or g == 1)
            if len(SEEN) == 1:  # no combine: out through its packed view
                op, ref = SEEN[0][5], kvcache._pack_views(out, 2)
                assert op.shape == ref.shape and op.stride() == ref.stride() and op.data_ptr() == out.data_ptr()
            assert out.stride() == torch.empty(q.shape).stride()  # contiguous, as empty_like(contiguous)


@pytest.fixture
def bound(monkeypatch):
    """The real launches, their compiled functions recorders (interface's compile stubbed), the
    TVM-FFI path, and validate_device without its CUDA-device check (CPU tensors)."""
    monkeypatch.setattr(kvcache, "launch_decode", kvcache._LAUNCH_DECODE)
    monkeypatch.setattr(kvcache, "launch_combine", kvcache._LAUNCH_COMBINE)
    monkeypatch.setattr(interface, "_CACHE", {})
    monkeypatch.setattr(interface, "_USE_TVM_FFI", True)
    calls = []

    def compiled(name):
        def fn(*args):
            calls.append((name, fn, args))
        return fn

    monkeypatch.setattr(interface, "_compile_decode", lambda cfg, options=None: compiled("decode"))
    monkeypatch.setattr(interface, "_compile_combine", lambda dtype, d, options=None: compiled("combine"))
    checked = []

    def validate_device(q, k, v):
        checked.append(q.data_ptr())
        kvcache._check_alignment(q, k, v)

    monkeypatch.setattr(kvcache, "validate_device", validate_device)
    return calls, checked


@pytest.mark.parametrize("ns", [None, 1])
def test_the_record_calls_the_compiled_functions_as_the_wrappers_do(bound, ns):
    calls, checked = bound
    q, k, v = _inputs(sk=2048)
    _call(q, k, v, num_splits=ns, softmax_scale=0.25)
    r = _record(q, k, v, num_splits=ns, softmax_scale=0.25)
    first = list(calls)
    assert checked == [q.data_ptr()]  # the first call: validate_device through launch_decode
    assert r.decode_fn is interface._CACHE[r.cfg] and r.decode_fn is first[0][1]
    assert r.scale_log2 == interface._scale_log2(q, 0.25)
    if r.combine:
        assert r.combine_fn is interface._CACHE[("combine", "float16", 64)]
    calls.clear()
    _call(q, k, v, num_splits=ns, softmax_scale=0.25)
    assert checked == [q.data_ptr()]  # bound: no wrapper
    assert [(n, f) for n, f, _ in calls] == [(n, f) for n, f, _ in first]

    def sig(args):
        return [(tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args]

    assert [sig(a) for _, _, a in calls] == [sig(a) for _, _, a in first]  # the same arguments
    # another signature: its own record and, for another config, its own compiled function
    q2, k2, v2 = _inputs(sk=2048, dtype=torch.bfloat16)
    _call(q2, k2, v2, num_splits=ns, softmax_scale=0.25)
    r2 = _record(q2, k2, v2, num_splits=ns, softmax_scale=0.25)
    assert r2 is not r and r2.cfg != r.cfg and r2.decode_fn is not r.decode_fn


def test_a_misaligned_pointer_raises_on_the_bound_path(bound):
    calls, checked = bound
    q, k, v = _inputs(sk=2048)
    _call(q, k, v)
    _call(q, k, v)
    n = len(calls)
    buf = torch.empty(q.numel() + 4, dtype=q.dtype)
    q_off = buf[4:].view(q.shape).copy_(q)  # 8 bytes off: the same shape, strides, dtype
    assert kvcache._call_key(q_off, k, v, None, True, None, None, False) == \
        kvcache._call_key(q, k, v, None, True, None, None, False)
    with pytest.raises(ValueError, match=r"q.data_ptr\(\) is not 16-byte aligned"):
        _call(q_off, k, v)
    k_off = torch.empty(k.numel() + 4, dtype=k.dtype)[4:].view(k.shape)
    with pytest.raises(ValueError, match=r"k.data_ptr\(\) is not 16-byte aligned"):
        _call(q, k_off, v)
    assert len(calls) == n and checked == [q.data_ptr()]  # nothing launched


def test_the_real_launch_still_refuses_the_cpu_every_call(monkeypatch):
    monkeypatch.setattr(kvcache, "launch_decode", kvcache._LAUNCH_DECODE)
    monkeypatch.setattr(kvcache, "launch_combine", kvcache._LAUNCH_COMBINE)
    q, k, v = _inputs(sk=32)
    for _ in range(2):
        with pytest.raises(ValueError, match="CUDA device"):
            _call(q, k, v)


@pytest.mark.parametrize("b", [1, 2])
def test_out_is_contiguous_whatever_q_strides(b):
    """out as torch.empty_like(q, memory_format=torch.contiguous_format) makes it, also where q is
    'contiguous' with other strides on its size-1 dims (one token of a longer buffer)."""
    _, k, v = _inputs(b=b, sk=256)
    for q in (torch.randn(b, 3, 8, 64).half()[:, 1:2], torch.randn(b, 1, 8, 64).half(),
              torch.randn(b, 1, 8, 64).half().transpose(0, 1).contiguous().transpose(0, 1)):
        for _ in range(2):
            out = _call(q, k, v)
            assert out.stride() == torch.empty(q.shape).stride() and out.shape == q.shape
