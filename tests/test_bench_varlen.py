"""bench_varlen_sm90.py on the CPU: its batches' FLOPs, its bad input (one line, exit 2),
--predict (fa4sim's varlen predictions, joinable with a measured file by point and kernel) and the
dense twin (--dense-twin: equal-length batches' dense kernels on views of the packed tensors)."""
import json
import math

import pytest

from lab.tools import bench_varlen_sm90 as bench


def test_pairs_count_bottom_right_causal():
    # 3 queries on 5 keys, causal bottom-right: query i sees keys j <= i + 2 -> 3 + 4 + 5
    assert bench.Batch("x", (3,), 1, 64, True, seqlens_k=(5,)).pairs() == 12
    # 5 queries on 3 keys: queries 0 and 1 see none, then 1, 2, 3
    assert bench.Batch("x", (5,), 1, 64, True, seqlens_k=(3,)).pairs() == 6
    assert bench.Batch("x", (3, 4), 2, 64, False).pairs() == 9 + 16
    b = bench.Batch("x", (7,), 4, 128, True)
    assert b.flops() == 4.0 * 4 * 128 * (7 * 8 // 2)


def test_default_batches_have_unique_names_and_odd_lengths():
    names = [b.name for b in bench.BATCHES]
    assert len(set(names)) == len(names)
    assert any(1 in b.seqlens for b in bench.BATCHES)  # a one-token sequence
    assert any(b.seqlens_k and b.seqlens_k != b.seqlens for b in bench.BATCHES)  # chunked prefill
    assert any(b.kv_heads != b.heads for b in bench.BATCHES)  # GQA


@pytest.mark.parametrize("argv, says", [
    (["--batches", "nope"], "--batches: unknown nope"),
    (["--seqlens", "3,0"], "--seqlens '3,0'"),
    (["--seqlens-k", "3"], "--seqlens-k: only with --seqlens"),
    (["--seqlens", "3,4", "--seqlens-k", "5"], "--seqlens-k: 1 lengths"),
    (["--seqlens", "3", "--heads", "6", "--heads-kv", "4"], "--heads-kv 4: must divide --heads 6"),
    (["--reps", "0"], "--reps >= 1"),
    (["--pass", "bwd", "--variants", "deterministic=maybe"], "deterministic='maybe'; allowed: true, false"),
    (["--pass", "bwd", "--variants", "dq_slices=8"], "dq_slices=8 copies the deterministic build's accumulator"),
])
def test_bad_input_is_one_line_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err.strip().splitlines()[-1]


def test_predict_writes_a_row_per_batch_and_candidate(tmp_path):
    out = tmp_path / "pred.json"
    argv = ["--batches", "chunks-gqa-causal", "--seqlens", "300,1,999", "--heads", "8", "--heads-kv", "2",
            "--causal", "--predict", str(out)]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["kind"] == "predictions" and doc["meta"]["profile"] == "h200" and doc["meta"]["model_commit"]
    selected = bench.parse_args(argv).selected
    assert {(r["point"], r["kernel"]) for r in doc["rows"]} == {(b.name, k) for b in selected for k in bench.MODELLED}
    for r in doc["rows"]:
        if "not_modelled" in r:
            assert r["kernel"] == "fa4kernel.varlen" and r["not_modelled"]
            continue
        b = next(b for b in selected if b.name == r["point"])
        assert r["us"] > 0 and r["clock_ghz"] > 0 and r["bottleneck"]
        assert r["tflops"] == pytest.approx(b.flops() / (r["us"] * 1e6))
    fa3 = [r for r in doc["rows"] if r["kernel"] == "flash-attn-3"]
    assert len(fa3) == 2 and all("us" in r for r in fa3)


def test_dry_run_needs_no_gpu(capsys):
    assert bench.main(["--dry-run", "--batches", "ten-hd64"]) == 0
    assert "ten-hd64: 10 sequences" in capsys.readouterr().out


def test_predict_the_backward(tmp_path):
    """--pass bwd --predict: fa4kernel.varlen's backward (its three launches) at 2.5 x the forward's
    FLOPs; the peers, whose backward fa4sim has no varlen model of, say so."""
    out = tmp_path / "pred.json"
    assert bench.main(["--batches", "mqa-hd128-causal", "--pass", "bwd", "--predict", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["pass"] == "bwd"
    (ours,) = [r for r in doc["rows"] if r["kernel"] == "fa4kernel.varlen"]
    b = {x.name: x for x in bench.BATCHES}["mqa-hd128-causal"]
    assert ours["us"] == pytest.approx(ours["pre_us"] + ours["main_us"] + ours["post_us"])
    assert ours["tflops"] == pytest.approx(2.5 * b.flops() / (ours["us"] * 1e6))
    (det,) = [r for r in doc["rows"] if r["kernel"] == "fa4kernel.varlen[deterministic]"]
    assert det["us"] > ours["us"] and det["dq_slices"] >= 1 and "dq_slices" not in ours
    peers = [r for r in doc["rows"] if not r["kernel"].startswith("fa4kernel")]
    assert peers and all("no varlen backward" in r["not_modelled"] for r in peers)


def test_predict_the_backwards_variants(tmp_path):
    """--variants deterministic=true,dq_slices=N: the deterministic build with that many copies,
    predicted as its own row, timed as attention(deterministic=True, bwd_knobs={dq_slices: N})."""
    out = tmp_path / "pred.json"
    argv = ["--batches", "chunks-hd64", "--pass", "bwd", "--variants", "deterministic=true,dq_slices=1",
            "deterministic=true,dq_slices=4", "--predict", str(out)]
    assert bench.main(argv) == 0
    rows = {r["kernel"]: r for r in json.loads(out.read_text())["rows"]}
    one, four = rows["fa4kernel.varlen[deterministic=True,dq_slices=1]"], rows["fa4kernel.varlen[deterministic=True,dq_slices=4]"]
    assert (one["dq_slices"], four["dq_slices"]) == (1, 4)
    assert rows["fa4kernel.varlen"]["us"] < four["us"] < one["us"]  # copies shorten the chunks' chains of turns
    assert bench.parse_args(argv).variants[0] == {"deterministic": True, "dq_slices": 1}
    assert bench.bwd_knobs({"deterministic": True, "dq_slices": 1}) == {"dq_slices": 1}


def test_bench_varlen_times_with_the_clock_of_its_timed_batches():
    """bench_varlen_sm90.time_call with an NVML sampler: each timed batch inside the sampler's
    window for the candidate, its summary recorded beside the time (a stand-in torch and sampler:
    no GPU here)."""
    import contextlib
    import types

    class Event:
        def __init__(self, **_):
            self.t = 0.0

        def record(self):
            self.t = len(calls) * 1e-3

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    calls, windows = [], []
    cuda = types.SimpleNamespace(synchronize=lambda: None, Event=Event)
    fake_torch = types.SimpleNamespace(cuda=cuda)

    class Sampler:
        ok = True

        @contextlib.contextmanager
        def window(self, name):
            windows.append(name)
            yield

        def summary(self, names):
            return {n: {"mhz_mean": 1755.0, "n": 3} for n in names}

    r = bench.time_call(fake_torch, lambda: calls.append(1), 0.0, 3, 1.0, Sampler(), "ten:fa4kernel.varlen")
    assert windows == ["ten:fa4kernel.varlen"] * 3 and r["nvml"] == {"mhz_mean": 1755.0, "n": 3}
    assert r["us"] > 0 and r["calls_per_batch"] >= 1
    assert "nvml" not in bench.time_call(fake_torch, lambda: calls.append(1), 0.0, 2, 1.0)


def test_short_batch_is_64_sequences_of_332_tokens():
    """short-hd128-causal is what every recorded file holds: 64 sequences of 332 tokens (its old
    definition drew one length from a new Random(7) per sequence, 332 each time)."""
    b = {x.name: x for x in bench.BATCHES}["short-hd128-causal"]
    assert b.seqlens == (332,) * 64 and b.keys == (332,) * 64
    assert (b.heads, b.kv_heads, b.hdim, b.causal) == (16, 16, 128, True)
    assert b.dense_shape() == (64, 332, 332)
    eq = {x.name: x for x in bench.BATCHES}["equal-hd128-causal"]
    assert eq.seqlens == (1024,) * 16 and (eq.heads, eq.hdim, eq.causal) == (16, 128, True)
    assert eq.dense_shape() == (16, 1024, 1024)
    # unequal query lengths, or equal query lengths on unequal keys: no dense shape
    assert {x.name: x for x in bench.BATCHES}["ten-hd64"].dense_shape() is None
    assert bench.Batch("x", (4, 4), 1, 64, True, seqlens_k=(8, 9)).dense_shape() is None
    assert bench.Batch("x", (4, 4), 1, 64, True, seqlens_k=(8, 8)).dense_shape() == (2, 4, 8)


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_dry_run_lists_the_dense_twin_for_equal_batches_only(pass_, capsys):
    argv = ["--dry-run", "--dense-twin", "--pass", pass_, "--batches", "short-hd128-causal,ten-hd64,equal-hd128-causal"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    blocks = {}
    for line in out.splitlines():
        if not line.startswith(" "):
            name = line.split(":")[0]
        blocks.setdefault(name, []).append(line)
    assert list(blocks) == ["short-hd128-causal", "ten-hd64", "equal-hd128-causal"]
    for name in ("short-hd128-causal", "equal-hd128-causal"):
        text = "\n".join(blocks[name])
        assert all(t in text for t in ("fa4kernel.dense", "flash-attn-3.dense", "flash-attn-4.dense")), text
        assert "fa4kernel.varlen" in text and "not run" not in text
    assert "q (64, 332, 16, 128), k and v (64, 332, 16, 128)" in "\n".join(blocks["short-hd128-causal"])
    ten = "\n".join(blocks["ten-hd64"])
    assert ".dense" not in ten and "fa4kernel.varlen" in ten and bench.NO_TWIN in ten
    # without the flag: no twin anywhere
    assert bench.main([a for a in argv if a != "--dense-twin"]) == 0
    assert ".dense" not in capsys.readouterr().out


def test_predict_writes_the_dense_twin_as_fa4sims_dense_prediction(tmp_path):
    """--predict --dense-twin: each equal batch's .dense rows are fa4sim's dense prediction of
    (batch, seqlen) (not its varlen one), under the names the measured file has; an unequal batch
    has none; accuracy --compare joins them on (point, kernel)."""
    from fa4sim import Problem, simulate

    from lab.tools import accuracy

    for pass_ in ("fwd", "bwd"):
        out = tmp_path / f"pred_{pass_}.json"
        assert bench.main(["--batches", "short-hd128-causal,equal-hd128-causal,ten-hd64", "--dense-twin",
                           "--pass", pass_, "--predict", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert doc["meta"]["dense_twin"] is True
        twin = [r for r in doc["rows"] if r["kernel"].endswith(".dense")]
        assert {(r["point"], r["kernel"]) for r in twin} == {
            (p, k) for p in ("short-hd128-causal", "equal-hd128-causal") for k in bench.TWINS}
        by = {x.name: x for x in bench.BATCHES}
        for r in twin:
            b = by[r["point"]]
            n, sq, sk = b.dense_shape()
            assert r["dense"] == [n, sq, sk]
            impl = bench.TWINS[r["kernel"]]
            if pass_ == "bwd" and impl == "flash-attn-3":  # fa4sim has no backward of it: said so
                assert "no backward" in r["not_modelled"] and "us" not in r
                continue
            want = simulate("h200", problem=Problem(n, b.heads, sq, sk, b.hdim, b.causal), impl=impl, pass_=pass_)
            assert math.isfinite(r["us"]) and r["us"] > 0 and r["clock_ghz"] > 0
            assert r["us"] == pytest.approx(want.time_us, rel=1e-12)
            mult = 2.5 if pass_ == "bwd" else 1.0
            assert r["tflops"] == pytest.approx(mult * b.flops() / (r["us"] * 1e6))
            if pass_ == "bwd":
                assert r["us"] == pytest.approx(r["pre_us"] + r["main_us"] + r["post_us"])
        # the twin and the varlen row of one implementation are two predictions, not one copied
        rows = {(r["point"], r["kernel"]): r for r in doc["rows"]}
        assert "dense" not in rows[("short-hd128-causal", "fa4kernel.varlen")]

    # a measured file (kind varlen) with the twin's results joins the predictions on (point, kernel)
    pred = json.loads((tmp_path / "pred_fwd.json").read_text())["rows"]
    us = {(r["point"], r["kernel"]): r["us"] for r in pred if "us" in r}
    measured = {"meta": {"kind": "varlen"}, "rows": [
        {"point": p, "results": {k: {"us": 1.25 * us[(p, k)], "ok": True} for (pp, k) in us if pp == p}}
        for p in ("short-hd128-causal", "equal-hd128-causal")]}
    (tmp_path / "measured.json").write_text(json.dumps(measured))
    stats = accuracy.stat_committed_time({}, [str(tmp_path / "measured.json")],
                                         {"predictions": str(tmp_path / "pred_fwd.json")})
    for k in bench.TWINS:
        assert stats[k]["count"] == 2 and stats[k]["median"] == pytest.approx(0.2)  # 1 / 1.25 - 1, absolute


def test_the_dense_twin_runs_the_dense_kernels_on_views_of_the_packed_tensors(monkeypatch):
    """The twin's calls on the CPU, with stand-in dense kernels (torch SDPA) for fa4kernel,
    FlashAttention-3 and flash-attn-4: each takes (batch, seqlen, heads, d) views of the packed
    tensors, and its output (a tuple, as some return) and its gradients come back packed, so the
    run's fp32 check passes; the varlen entry points the stand-ins lack are recorded as errors."""
    import sys
    import types

    import fa4kernel
    import torch

    from lab.tools.bench_decode_sm90 import check_output

    shapes = []

    def dense(q, k, v, causal=False, **kw):
        assert q.dim() == 4 and not kw, (q.shape, kw)
        shapes.append((tuple(q.shape), tuple(k.shape)))
        g = q.shape[2] // k.shape[2]
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).float(), k.transpose(1, 2).float().repeat_interleave(g, dim=1),
            v.transpose(1, 2).float().repeat_interleave(g, dim=1), is_causal=causal)
        return o.transpose(1, 2).to(q.dtype)

    def fa4kernel_attention(q, k, v, causal=False, cu_seqlens_q=None, **kw):
        if cu_seqlens_q is not None:
            raise NotImplementedError("varlen: not in the stand-in")
        return dense(q, k, v, causal)

    monkeypatch.setattr(fa4kernel, "attention", fa4kernel_attention)
    monkeypatch.setitem(sys.modules, "flash_attn_interface",
                        types.SimpleNamespace(flash_attn_func=lambda *a, **k: (dense(*a, **k), None)))
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    cute = types.ModuleType("flash_attn.cute.interface")
    cute.flash_attn_func = lambda *a, **k: (dense(*a, **k), "lse")
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", cute)

    b = bench.Batch("x", (6,) * 3, 4, 32, True, heads_kv=2)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(18, 4, 32, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(18, 2, 32, generator=gen).to(torch.bfloat16) for _ in range(2))
    cq = ck = torch.tensor([0, 6, 12, 18], dtype=torch.int32)
    errors: dict = {}
    ref = bench.reference(torch, b, q, k, v, cq, ck)
    cands = bench.candidates(torch, b, q, k, v, cq, ck, errors, twin=True)
    assert list(cands) == [n for n in bench.candidate_names(b, twin=True) if n not in errors]  # the run's order
    for name in bench.TWINS:
        out = cands[name]()
        assert out.shape == q.shape and check_output(torch, out, ref)["ok"], name
    assert shapes == [((3, 6, 4, 32), (3, 6, 2, 32))] * 3
    assert set(errors) == {"flash-attn-3", "flash-attn-4"}  # their varlen functions: not in the stand-ins

    dout = torch.randn(q.shape, generator=gen).to(torch.bfloat16)
    want = bench.reference_grads(torch, b, q, k, v, cq, ck, dout)
    errors = {}
    grads = bench.bwd_candidates(torch, b, q, k, v, cq, ck, dout, errors, twin=True)
    assert set(grads) == set(bench.TWINS) and set(errors) == {
        "fa4kernel.varlen", "fa4kernel.varlen[deterministic]", "flash-attn-3", "flash-attn-4"}
    for name in bench.TWINS:
        got = grads[name]()
        assert [g.shape for g in got] == [q.shape, k.shape, v.shape]
        assert all(check_output(torch, g, w)["ok"] for g, w in zip(got, want)), name
    # a batch of unequal lengths: no twin, whatever the flag
    u = bench.Batch("u", (5, 7), 4, 32, True)
    assert not set(bench.candidates(torch, u, q[:12], k[:12], v[:12], torch.tensor([0, 5, 12], dtype=torch.int32),
                                    torch.tensor([0, 5, 12], dtype=torch.int32), {}, twin=True)) & set(bench.TWINS)


def test_predict_for_an_h100_is_fa4sims_h100_prediction(tmp_path):
    """--profile h100: meta names the H100, and each row is fa4sim's prediction on the h100 profile
    (not the h200's relabelled)."""
    from fa4sim import Problem, simulate

    out = tmp_path / "pred.json"
    argv = ["--seqlens", "300,1,999", "--heads", "8", "--causal", "--profile", "h100",
            "--predict", str(out)]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["profile"] == "h100" and doc["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    p = Problem.varlen(8, 128, [300, 1, 999], None, causal=True)
    fa3 = next(r for r in doc["rows"] if r["kernel"] == "flash-attn-3")
    assert fa3["us"] == pytest.approx(simulate("h100", problem=p, impl=bench.MODELLED["flash-attn-3"]).time_us)
    assert fa3["us"] != pytest.approx(simulate("h200", problem=p, impl=bench.MODELLED["flash-attn-3"]).time_us)


def test_mqa_batches_time_the_plain_build_too(monkeypatch):
    """The forward of an MQA batch (one k/v head), where fa4kernel packs by default, also times
    fa4kernel.attention(pack_gqa=False), in candidate_names' order; GQA batches and the backward do not."""
    import fa4kernel
    import torch

    calls = []
    monkeypatch.setattr(fa4kernel, "attention", lambda *a, **kw: calls.append(kw.get("pack_gqa")))
    b = bench.Batch("m", (3, 1, 5), 4, 32, True, heads_kv=1)
    q = torch.randn(9, 4, 32)
    cq = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    cands = bench.candidates(torch, b, q, q[:, :1], q[:, :1], cq, cq, {})
    assert list(cands)[:2] == bench.candidate_names(b)[:2] == ["fa4kernel.varlen", bench.UNPACKED]
    cands[bench.UNPACKED]()
    cands["fa4kernel.varlen"]()
    assert calls == [False, None]
    named = {b.name: b for b in bench.BATCHES}
    assert bench.UNPACKED in bench.candidate_names(named["mqa-hd128-causal"])
    assert bench.UNPACKED not in bench.candidate_names(named["gqa-hd128-causal"])
    assert bench.UNPACKED not in bench.candidate_names(named["mqa-hd128-causal"], "bwd")
