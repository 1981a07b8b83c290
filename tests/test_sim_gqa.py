"""Grouped K/V heads (GQA / MQA) in fa4sim: Problem.heads_kv, the forward's K/V traffic by K/V
head and flash-attn-4's packed tiles, the backward's launch as each kernel schedules it
(fa4kernel: one CTA per KV tile of a K/V head walking its group's q heads; flash-attn-4: one per
q head, dK and dV reduce-added in fp32), the CLI's --heads-kv, and the sustained runner's kv=."""
import json
import os
import subprocess
import sys

import pytest

from fa4sim import Problem, simulate
from fa4sim.errors import InputError
from fa4sim.kernel_model import work_units
from fa4sim.schedules import kernel_bwd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lab.tools import sustained_sm90 as bench  # noqa: E402

MQA = dict(batch=8, heads=16, seqlen_q=2048, seqlen_k=2048, hdim=64, causal=True)  # measured on an H200


def test_heads_kv_defaults_to_heads_and_must_divide_them():
    p = Problem(**MQA)
    assert p.heads_kv == 16 and p.heads_per_kv == 1
    assert Problem(**MQA, heads_kv=1).heads_per_kv == 16
    assert Problem(8, 16, 2048, 2048, 64, True, 64, 4).heads_kv == 4  # positional, after hdim_v
    for bad, says in ((3, "must divide heads (16): one of 1, 2, 4, 8, 16; got 3"), (32, "got 32"),
                      (0, "positive integer"), (True, "positive integer")):
        with pytest.raises(InputError) as e:
            Problem(**MQA, heads_kv=bad)
        assert e.value.param == "heads_kv" and says in str(e.value) and "\n" not in str(e.value)


def test_flops_do_not_depend_on_heads_kv():
    assert Problem(**MQA, heads_kv=1).flops == Problem(**MQA).flops


@pytest.mark.parametrize("impl,pass_", [("fa4kernel", "fwd"), ("fa4kernel", "bwd"), ("flash-attn-4", "fwd"),
                                        ("flash-attn-4", "bwd")])
def test_mha_given_heads_kv_is_bit_identical(impl, pass_):
    a = simulate("h200", None, Problem(**MQA), impl=impl, pass_=pass_)
    b = simulate("h200", None, Problem(**MQA, heads_kv=16), impl=impl, pass_=pass_)
    assert (a.tflops, a.cycles, a.kernel.hbm_bytes, a.kernel.l2_bytes) == (b.tflops, b.cycles, b.kernel.hbm_bytes,
                                                                           b.kernel.l2_bytes)


def test_packed_units_cover_the_same_rows_and_keys():
    """flash-attn-4's pack_gqa: a (batch, K/V head)'s tiles hold group x seqlen_q rows, token by
    token; with tile_m = tile_n = 128 and 16 heads each tile spans 8 tokens, so its KV blocks are
    those of 8 tokens: the same multiset of blocks as 16 unpacked heads."""
    p = Problem(**MQA, heads_kv=1)
    packed = work_units(p, 128, 128, pack=16)
    plain = work_units(p, 128, 128)
    assert sum(u.rows for u in packed) == 16 * sum(u.rows for u in plain)
    assert sorted(u.n_kv for u in packed) == sorted(u.n_kv for u in plain * 16)
    assert all(u.masked == 1 for u in packed)


@pytest.mark.parametrize("impl", ["fa4kernel", "flash-attn-4"])
def test_gqa_forward_reads_less_kv_from_hbm_and_is_no_slower(impl):
    mha = simulate("h200", None, Problem(**MQA), impl=impl)
    for kv in (4, 1):
        gqa = simulate("h200", None, Problem(**MQA, heads_kv=kv), impl=impl)
        assert gqa.kernel.hbm_bytes < mha.kernel.hbm_bytes
        assert gqa.time_us <= mha.time_us
        assert gqa.knobs["pack_gqa"] == (impl == "flash-attn-4")


def test_fa4kernel_backward_mqa_loop_runs_one_cta_per_kv_tile_of_a_kv_head():
    """sm90/bwd.py with gqa_dkv "loop": grid (key blocks, k/v heads, batch), each CTA looping over
    group x query blocks. At 16 q heads over one K/V head, batch 8, 2k keys of 128: 16 x 8 = 128
    CTAs on 132 SMs, the longest walking 16 x 16 Q blocks: slower per FLOP than MHA (measured on
    an H200: 252-254 TFLOP/s against about 440 for MHA)."""
    mha = simulate("h200", None, Problem(**MQA), impl="fa4kernel", pass_="bwd")
    mqa = simulate("h200", None, Problem(**MQA, heads_kv=1), {"gqa_dkv": "loop"}, impl="fa4kernel", pass_="bwd")
    assert mqa.knobs["gqa_dkv"] == "loop"
    assert mha.kernel.units == 16 * 128 and mqa.kernel.units == 16 * 8
    assert mqa.kernel.waves < 1
    assert mqa.tflops < 0.8 * mha.tflops
    units = kernel_bwd.grouped(kernel_bwd.kv_units(Problem(**MQA), 128, 128), 16)
    assert max(u.n_kv for u in units) == 16 * 16 and min(u.n_kv for u in units) == 16


def test_flash_attn_4_backward_gqa_keeps_a_cta_per_q_head_and_reduces_dkv():
    """flash_bwd_sm90.py: one CTA per (KV tile, q head, batch), dK and dV reduce-added in fp32 into
    per-K/V-head accumulators zeroed before and converted after (two launches each side)."""
    mha = simulate("h200", None, Problem(**MQA), impl="flash-attn-4", pass_="bwd")
    mqa = simulate("h200", None, Problem(**MQA, heads_kv=1), impl="flash-attn-4", pass_="bwd")
    assert mqa.knobs["gqa_dkv"] == "reduce" and mqa.kernel.units == mha.kernel.units
    assert mqa.main_us > mha.main_us and mqa.pre_us > mha.pre_us and mqa.post_us > mha.post_us
    pre, post = kernel_bwd.passes(Problem(**MQA, heads_kv=1), mqa.knobs)
    assert len(pre) == 3 and len(post) == 3
    # its scheme keeps the chip full: far less slowdown per FLOP than fa4kernel's loop in one wave
    loop = simulate("h200", None, Problem(**MQA, heads_kv=1), {"gqa_dkv": "loop"}, impl="fa4kernel", pass_="bwd")
    assert mqa.tflops > 1.2 * loop.tflops


def test_fa4kernel_backward_mqa_defaults_to_reduce_with_joint_accumulators():
    """fa4kernel takes "reduce" where the loop's CTAs (128 here) are fewer than the SMs (132):
    flash-attn-4's grid, its dK and dV accumulators in one allocation (one zeroing launch, one
    conversion); with 32 q heads on 8 K/V heads the loop fills the SMs and stays without a mask
    (with one, as many queries as keys take "reduce")."""
    mqa = simulate("h200", None, Problem(**MQA, heads_kv=1), impl="fa4kernel", pass_="bwd")
    fa4 = simulate("h200", None, Problem(**MQA, heads_kv=1), impl="flash-attn-4", pass_="bwd")
    assert mqa.knobs["gqa_dkv"] == "reduce" and mqa.knobs["dkv_accum"] == "joint"
    assert mqa.kernel.units == fa4.kernel.units
    pre, post = kernel_bwd.passes(Problem(**MQA, heads_kv=1), mqa.knobs)
    assert len(pre) == 2 and len(post) == 2  # flash-attn-4's: 3 and 3
    assert dict(pre)["dkv_accum = zeros (fp32)"] == 8 * 2048 * (64 + 64) * 4
    gqa = simulate("h200", None, Problem(8, 32, 2048, 2048, 64, False, heads_kv=8), impl="fa4kernel", pass_="bwd")
    assert gqa.knobs["gqa_dkv"] == "loop"
    gqa = simulate("h200", None, Problem(8, 32, 2048, 2048, 64, True, heads_kv=8), impl="fa4kernel", pass_="bwd")
    assert gqa.knobs["gqa_dkv"] == "reduce"
    chunk = simulate("h200", None, Problem(8, 32, 512, 2048, 64, True, heads_kv=8), impl="fa4kernel", pass_="bwd")
    assert chunk.knobs["gqa_dkv"] == "loop"  # a quarter as many queries as keys


def test_cli_heads_kv():
    run = [sys.executable, "-m", "fa4sim.cli", "run", "--hw", "h200", "--hdim", "64", "--seqlen", "2048",
           "--batch", "8", "--heads", "16", "--causal"]
    bad = subprocess.run(run + ["--heads-kv", "3"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "heads_kv" in lines[0] and "Traceback" not in bad.stderr
    ok = subprocess.run(run + ["--heads-kv", "1", "--json", "--compact"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["problem"]["heads_kv"] == 1


def test_validate_reads_heads_kv_from_points():
    from fa4sim.validate import backward, sustained

    pt = {"batch": 8, "heads": 16, "seqlen": 2048, "hdim": 64, "causal": True}
    assert sustained.problem_of(pt).heads_kv == 16 and backward.problem_of(pt).heads_kv == 16
    assert sustained.problem_of({**pt, "heads_kv": 1}).heads_kv == 1
    assert backward.problem_of({**pt, "heads_kv": 2}).heads_kv == 2


def test_sustained_runner_takes_kv():
    p = bench.parse_problem("b=8,h=16,kv=1,sq=2048,d=64,causal")
    assert (p.heads, p.heads_kv) == (16, 1) and p.name == "hd64-2k-b8-h16-kv1-causal"
    assert bench.parse_problem("b=8,h=16,sq=2048,d=64").heads_kv == 16
    assert bench.parse_problem("b=8,h=16,kv=16,sq=2048,d=64").name == "hd64-2k-b8-h16"
    assert p.record()["heads_kv"] == 1 and p.flops == Problem(**MQA, heads_kv=1).flops
    assert set(p.candidates()) == {bench.OURS, bench.PROBE, bench.FA3, bench.PEER, bench.CUDNN}
    with pytest.raises(ValueError, match="kv=3 must divide h=16"):
        bench.parse_problem("b=8,h=16,kv=3,sq=2048,d=64")
    assert bench.Point(1, 8, 64, 64, 64, 64, False, "grid").heads_kv == 8  # every existing point: MHA


def test_reference_check_maps_q_heads_to_their_kv_head():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 32, 4, 16, generator=g)
    k, v = (torch.randn(2, 40, 2, 16, generator=g) for _ in range(2))
    ref = bench.reference_check(q, k, v, True, [(1, 3)])
    full = bench.reference_check(q, k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2), True, [(1, 3)])
    assert torch.allclose(ref[(1, 3)], full[(1, 3)])
