"""bench_varlen_sm90.py on the CPU: its batches' FLOPs, its bad input (one line, exit 2) and
--predict (fa4sim's varlen predictions, joinable with a measured file by point and kernel)."""
import json

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
    assert all("no varlen backward" in r["not_modelled"] for r in doc["rows"] if r["kernel"] != "fa4kernel.varlen")


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
