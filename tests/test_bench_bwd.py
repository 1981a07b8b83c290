"""bench_bwd_sm90's problems on the CPU: its --problem spec (a chunk: sk= keys, more than the
queries), and one line with exit 2 for a bad one."""
import pytest

from lab.tools import bench_bwd_sm90 as bench


def test_problem_with_keys_of_its_own():
    assert bench.parse_problem("b=2,h=32,s=256,sk=8192,d=64") == (64, 256, False, (2, 32, 32, 8192))
    assert bench.parse_problem("b=2,h=32,kv=8,s=4096,d=128,causal") == (128, 4096, True, (2, 32, 8, 4096))


@pytest.mark.parametrize("spec,says", [("b=2,h=32,s=256,sk=0,d=64", "sk=0"), ("b=2,h=32,sk=256,d=64", "give b=, h=, s="),
                                       ("b=2,h=30,kv=8,s=256,d=64", "kv=8 must divide h=30")])
def test_a_bad_problem_is_one_line_and_exit_2(spec, says, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_problem(spec)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_variant_takes_dq_slices_as_an_integer(capsys):
    """The dq_slices predictions' command: --variants deterministic=true,dq_slices=2."""
    assert bench.parse_variant("deterministic=true,dq_slices=2") == {"deterministic": True, "dq_slices": 2}
    with pytest.raises(SystemExit) as e:
        bench.parse_variant("deterministic=true,dq_slices=two")
    assert e.value.code == 2 and "dq_slices=INTEGER" in capsys.readouterr().err


def test_predict_writes_a_row_per_point_and_candidate(tmp_path):
    """--predict (no GPU): fa4kernel, its deterministic build, a variant and flash-attn-4 at each
    point, each row carrying the point's problem (accuracy --compare joins on it)."""
    import json

    from lab.tools import accuracy

    out = tmp_path / "pred.json"
    runs = [bench.parse_problem("b=2,h=8,kv=2,s=777,d=64,causal"), bench.parse_problem("b=1,h=4,s=1000,d=128")]
    doc = bench.write_predictions(str(out), runs, ["gqa_dkv=loop"], True, "h100", ["--predict", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert rows == doc["rows"] and doc["meta"]["kind"] == "predictions" and doc["meta"]["profile"] == "h100"
    kernels = {"fa4kernel", "fa4kernel[deterministic]", "fa4kernel[gqa_dkv=loop]", "flash-attn-4"}
    assert {r["kernel"] for r in rows} == kernels and len(rows) == 2 * len(kernels)
    gqa = [r for r in rows if r["heads_kv"] == 2]
    assert all(r["seqlen"] == 777 and r["causal"] and r["hdim"] == 64 for r in gqa)
    for r in rows:
        assert r["us"] > 0 and r["tflops"] > 0 and r["us"] >= r["main_us"] > 0
        assert abs(r["tflops"] - bench.bwd_flops(r["batch"], r["heads"], r["seqlen"], r["seqlen_k"], r["hdim"],
                                                 r["causal"]) / (r["us"] * 1e6)) < 1e-9
    assert next(r for r in gqa if r["kernel"] == "fa4kernel[gqa_dkv=loop]")["gqa_dkv"] == "loop"
    # the measured file's point, as bench_point writes it, joins on the problem
    point = dict(batch=2, seqlen=777, seqlen_k=777, heads=8, heads_kv=2, hdim=64, causal=True,
                 results={"fa4kernel": {"tflops": 1.1 * next(r["tflops"] for r in gqa if r["kernel"] == "fa4kernel")}})
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"meta": {"kind": "sm90_bwd"}, "points": [point]}))
    got = accuracy.stat_committed_time({}, [str(run)], {"predictions": str(out)})
    assert abs(got["fa4kernel"]["median"] - 0.10) < 1e-9  # 10 % above the prediction
