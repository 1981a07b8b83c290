"""dq_slices (fa3_sm90_bwd.py, kernel_bwd.py): the deterministic backward's copies of the fp32 dQ
accumulator, as fa4kernel ships them. fa4sim's choice for fa4kernel is the kernel's rule
(bwd_config.dq_slices_for), its partition of a head's KV tiles into runs is the kernel's
(bwd_config.dq_slice), a Q block's chain of turns is a run long, and the copies' launches
around the kernel carry their bytes. No timing is asserted: where the model orders two builds,
the order is what its structure implies (a chain a run long is shorter than one a head long)."""
import pytest

from fa4sim import Problem, simulate
from fa4sim.cli import main
from fa4sim.errors import InputError
from fa4sim.model import setup
from fa4sim.schedules import kernel_bwd
from fa4kernel.sm90 import bwd_config as bc

CHUNKS = Problem.varlen(32, 64, (256, 1024, 77), (8192, 3000, 4000), causal=True)


def knobs_of(problem, overrides=None, impl="fa4kernel"):
    return setup("h100", None, problem, overrides or {}, impl, "bwd")[4]


def det_cfg(hd, causal):
    return bc.make_bwd_config("bfloat16", hd, causal, True)


# ---------------------------------------------------------------- fa4kernel's choice is its rule
@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fa4kernels_copies_are_its_rule(hd, causal):
    for sq, sk, heads, heads_kv in ((1000, 1000, 8, 8), (256, 8192, 8, 8), (256, 1024, 8, 8), (256, 512, 8, 8),
                                    (256, 16384, 16, 4), (256, 16384, 32, 2), (77, 4000, 4, 1), (4096, 4096, 8, 1)):
        p = Problem(1, heads, sq, sk, hd, causal=causal, heads_kv=heads_kv)
        want = bc.dq_slices_for(det_cfg(hd, causal), sq, sk, heads // heads_kv)
        assert knobs_of(p, {"deterministic": True})["dq_slices"] == want, (hd, causal, sq, sk, heads, heads_kv)
        assert knobs_of(p)["dq_slices"] == 1


def test_a_varlen_batch_counts_its_longest_sequences_as_the_host_does():
    want = bc.with_dq_slices_default({}, "bfloat16", 64, True, True, 1024, 8192, 1)["dq_slices"]
    assert knobs_of(CHUNKS, {"deterministic": True})["dq_slices"] == want == 8


def test_flash_attn_4_keeps_one_accumulator():
    assert knobs_of(Problem(1, 8, 256, 8192, 128), {"deterministic": True}, "flash-attn-4")["dq_slices"] == 1


# ---------------------------------------------------------------- the runs are the kernel's
@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("sk", [128, 1000, 8192, 12345])
@pytest.mark.parametrize("copies", [2, 4, 8])
def test_a_tiles_copy_is_the_kernels(hd, sk, copies):
    cfg = bc.make_bwd_config("bfloat16", hd, False, True, dq_slices=copies)
    c = bc.cluster_ctas(cfg)
    tiles = -(-sk // (c * cfg.tile_n)) * c
    for n_block in range(tiles):
        assert kernel_bwd.dq_copy(n_block, tiles, copies, c) == bc.dq_slice(cfg, n_block, sk)[0], n_block


def test_one_copy_is_one_chain_per_head():
    assert {kernel_bwd.dq_copy(r, 64, 1) for r in range(64)} == {0}


# ---------------------------------------------------------------- the chains and the launches around
def test_copies_shorten_the_chain_of_a_chunk():
    one = simulate("h100", None, CHUNKS, {"deterministic": True, "dq_slices": 1}, impl="fa4kernel", pass_="bwd")
    eight = simulate("h100", None, CHUNKS, {"deterministic": True}, impl="fa4kernel", pass_="bwd")
    fast = simulate("h100", None, CHUNKS, {}, impl="fa4kernel", pass_="bwd")
    assert eight.knobs["dq_slices"] == 8
    assert fast.main_us < eight.main_us < one.main_us
    # the copies cost launches around the kernel: zeroing 7 copies, summing 8 into one
    assert eight.pre_us > one.pre_us and eight.post_us > one.post_us
    assert any("8 copies of the dQ accumulator" in n for n in eight.notes)


def test_the_copies_passes_carry_their_bytes():
    p = Problem(2, 8, 256, 8192, 128, causal=True)
    k = knobs_of(p, {"deterministic": True})
    assert k["dq_slices"] == 16  # 64 key-block pairs over a walk of 4 query blocks
    pre, post = kernel_bwd.passes(p, k)
    acc = 2 * 8 * 256 * 128 * 4  # one copy's fp32 rows, bytes
    assert dict(pre)["dQ accumulator copies = zeros (fp32)"] == 15 * acc
    assert dict(post)["dQ copies summed (fp32)"] == 17 * acc
    assert [w for w, _ in post][-1].startswith("dQ fp32 -> 16 bit")  # the sum comes before the postprocess
    one = kernel_bwd.passes(p, {**k, "dq_slices": 1})
    assert len(one[0]) == len(pre) - 2 and len(one[1]) == len(post) - 1


# ---------------------------------------------------------------- errors
def test_copies_without_the_deterministic_build_is_one_line():
    with pytest.raises(InputError) as e:
        knobs_of(Problem(1, 8, 256, 8192, 128), {"dq_slices": 4})
    assert e.value.param == "dq_slices" and "\n" not in str(e.value) and "deterministic" in str(e.value)


def test_cli_rejects_a_copy_count_it_has_no_build_for(capsys):
    code = main(["run", "--hw", "h100", "--impl", "fa4kernel", "--pass", "bwd", "--seqlen", "256", "--seqlen-k",
                 "8192", "--hdim", "128", "--set", "deterministic=true", "--set", "dq_slices=3"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "dq_slices" in err and "\n" not in err
