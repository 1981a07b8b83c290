"""CPU-only: dq_slices, the deterministic backward's copies of the fp32 dQ accumulator.

The rule (bwd_config.dq_slices_for) on square problems, chunks and GQA, against the copies
fa4sim's predictions were made for; the run partition (bwd_config.dq_slice, the plain-Python
mirror of sm90/bwd.py _dq_slice); the one-line errors; the builds compile for sm_90a (dense and
varlen); and every build that does not copy (non-deterministic, or dq_slices=1) has the SASS of
the base revision (FA4_SASS_BASE, else the merge base with main), byte for byte.

Run: pytest -m compile tests/test_kernel_sm90_bwd_slices.py
"""

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fa4kernel.sm90 import bwd_config as bc

ROOT = Path(__file__).resolve().parent.parent
PREDICTED = ROOT / "lab/campaigns/kernel-sm90-backward"


def det(hd, causal=False, **knobs):
    return bc.make_bwd_config("bfloat16", hd, causal, True, **knobs)


# ---- the rule


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", bc.BWD_HEAD_DIMS)
def test_rule_takes_one_copy_on_square_problems(hd, causal):
    for s in (1, 63, 1000, 4096, 16384):
        for group in (1, 8):
            assert bc.dq_slices_for(det(hd, causal), s, s, group) == 1, (hd, s, group)


def test_rule_on_chunks_and_grouped_heads():
    # hd64, 128-row query blocks, 128-key blocks: 2 query blocks against 64 key blocks
    assert bc.dq_slices_for(det(64), 256, 8192) == 32  # 64 key blocks over 2 query blocks
    assert bc.dq_slices_for(det(64), 128, 16384) == 32  # 128 over 1: capped at 32
    assert bc.dq_slices_for(det(64), 256, 1024) == 4  # 8 key blocks over 2 query blocks
    assert bc.dq_slices_for(det(64), 256, 512) == 2
    assert bc.dq_slices_for(det(64), 256, 256) == 1
    # hd128, 64-row query blocks: 4 of them against 128 key blocks; a GQA CTA walks the group's q heads
    assert [bc.dq_slices_for(det(128, True), 256, 16384, g) for g in (1, 4, 8, 16, 32)] == [32, 8, 4, 2, 1]
    # hd256: the unit is the CTA pair (128 keys), the query blocks 64 rows
    assert det(256).dq_sum == "pair"
    assert bc.dq_slices_for(det(256), 256, 2048) == 4  # 16 pairs over 4 query blocks
    assert bc.dq_slices_for(det(256, dq_sum="cta"), 256, 2048) == 8  # 32 key blocks
    # no queries, or not deterministic: one
    assert bc.dq_slices_for(det(64), 0, 8192) == 1
    assert bc.dq_slices_for(bc.make_bwd_config("bfloat16", 64, False), 256, 8192) == 1


def test_rule_gives_the_copies_the_predictions_were_made_for():
    """fa4sim's predictions (committed before any run) name the rule's choice for the shipped
    deterministic build: one copy on the square problems of the first file, and on the two packed
    chunk batches of the last (dq-slices-32.diff) the copies each of its rows records, which the
    host picks from the longest sequences (no read of cu_seqlens)."""
    rows = json.loads((PREDICTED / "predicted_dq_slices_dense_h200_2026-12-04.json").read_text())["rows"]
    square = [r for r in rows if r["kernel"] == "fa4kernel[deterministic]" and r.get("seqlen_k", r["seqlen"]) == r["seqlen"]]
    assert len(square) == 3
    for r in square:
        cfg = det(r["hdim"], r["causal"])
        assert bc.dq_slices_for(cfg, r["seqlen"], r["seqlen"], r["heads"] // r["heads_kv"]) == r["dq_slices"] == 1, r
    # chunks-hd64 (lab/tools/bench_varlen_sm90.py): 256, 1024, 77 queries on 8192, 3000, 4000 keys;
    # the custom batch: 128, 200, 64 on 12000, 8000, 16000 at hd128
    for dev in ("h100", "h200"):
        rows = json.loads((PREDICTED / f"predicted_dq_slices32_{dev}_2026-12-07.json").read_text())["rows"]
        got = {r["point"]: r["dq_slices"] for r in rows if r["kernel"] == "fa4kernel.varlen[deterministic]"}
        assert got == {"chunks-hd64": 8, "custom": 32}
    for hd, lq, lk, want in ((64, (256, 1024, 77), (8192, 3000, 4000), 8), (128, (128, 200, 64), (12000, 8000, 16000), 32)):
        assert bc.with_dq_slices_default({}, "bfloat16", hd, False, True, max(lq), max(lk), 1) == {"dq_slices": want}


def test_host_default_takes_the_rule_only_when_left_out_and_deterministic():
    assert bc.with_dq_slices_default({}, "bfloat16", 64, False, True, 256, 8192, 1) == {"dq_slices": 32}
    assert bc.with_dq_slices_default({"dq_slices": 1}, "bfloat16", 64, False, True, 256, 8192, 1) == {"dq_slices": 1}
    assert bc.with_dq_slices_default({}, "bfloat16", 64, False, False, 256, 8192, 1) == {}
    # the rule reads the build's tiles: 64-row blocks at hd64 walk twice as many
    assert bc.with_dq_slices_default({"tile_m": 64}, "bfloat16", 64, False, True, 256, 1024, 1) == \
        {"tile_m": 64, "dq_slices": 2}
    assert bc.make_bwd_config("bfloat16", 128, False).dq_slices == 1


# ---- the run partition (bwd_config.dq_slice: sm90/bwd.py _dq_slice)


@pytest.mark.parametrize("slices", bc.DQ_SLICES)
@pytest.mark.parametrize("hd", [64, 256])
def test_runs_cut_every_head_into_contiguous_runs_each_in_order(hd, slices):
    cfg = det(hd, dq_slices=slices)
    c = bc.cluster_ctas(cfg)
    for sk in (1, 100, 129, 1000, 4097, 8192, 16000):
        units = -(-sk // (c * cfg.tile_n))
        runs = {}
        for n in range(units * c):
            copy, idx, run, keys = bc.dq_slice(cfg, n, sk)
            assert 0 <= copy < slices and 0 <= idx < run, (sk, n)
            if n % c == 0:
                runs.setdefault(copy, []).append(idx)
            # the run's keys start at its first unit; its last unit holds the head's last keys or a full block
            first = n // c - idx
            assert keys == sk - first * c * cfg.tile_n and 0 < keys
            assert min(keys, run * c * cfg.tile_n) > (run - 1) * c * cfg.tile_n
        # each unit once, copies in launch order (the last ones empty where the runs of
        # ceil(units / slices) end early), each copy's units its turns 0 .. run - 1
        longest = -(-units // slices)
        assert sorted(runs) == list(range(-(-units // longest)))
        for copy, idxs in runs.items():
            assert idxs == list(range(len(idxs))), (sk, copy)
        assert sum(map(len, runs.values())) == units
        lengths = [len(runs[r]) for r in sorted(runs)]
        assert max(lengths) == longest and lengths == sorted(lengths, reverse=True)


def test_one_copy_is_todays_turn():
    """dq_slices=1 leaves dq_turn as it was: key block (pair) u after the units before it."""
    cfg = det(128)
    assert [bc.dq_turn(cfg, n, 0, 1000, 1000) for n in range(8)] == list(range(8))
    two = det(128, dq_slices=2)
    assert [bc.dq_turn(two, n, 0, 1000, 1000) for n in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


# ---- one-line errors


@pytest.mark.parametrize("val", [0, 3, 64, -2, True, 2.0, "2"])
def test_bad_dq_slices(val):
    with pytest.raises(ValueError, match=r"^dq_slices=.* not supported; allowed: 1, 2, 4, 8, 16, 32$"):
        det(128, dq_slices=val)


def test_dq_slices_needs_the_deterministic_build():
    with pytest.raises(ValueError, match="allowed with deterministic=False: dq_slices=1$"):
        bc.make_bwd_config("bfloat16", 128, False, dq_slices=2)
    with pytest.raises(ValueError, match="allowed with deterministic=False: dq_slices=1$"):
        bc.make_varlen_bwd_config("bfloat16", 128, False, {"dq_slices": 4})
    assert bc.make_varlen_bwd_config("bfloat16", 128, True, {"dq_slices": 4}, deterministic=True).dq_slices == 4


# ---- compiles (sm_90a, on the CPU)


def _sass(cfg):
    import fa4kernel

    return fa4kernel.compile_bwd_sass(cfg)


def _lines(text):
    return [ln for ln in text.splitlines() if "/*" in ln and ";" in ln]  # instructions


@pytest.mark.compile
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_slices_build_compiles(hd, causal, varlen):
    pytest.importorskip("cutlass")
    from test_kernel_sm90_bwd_compile import assert_spills_as_designed, count, semaphore_ops

    def cfg(s):
        if varlen:
            return bc.make_varlen_bwd_config("bfloat16", hd, causal, {"dq_slices": s}, deterministic=True)
        return det(hd, causal, dq_slices=s)

    one = _sass(cfg(1))
    for s in (2, 8, 32):
        text = _sass(cfg(s))
        if varlen and hd == 256:
            # the varlen builds at hd256 keep a few values in local memory (their consumers at the
            # 240-register limit: causal one copy 5 STL / 12 LDL, the fast build without a mask
            # 2 / 2): no more than the one-copy or the fast build
            fast = _sass(bc.make_varlen_bwd_config("bfloat16", hd, causal, {}))
            spills = [count(t, "STL") + count(t, "LDL") for t in (text, one, fast)]
            assert spills[0] <= max(spills[1:]), spills
        else:
            assert_spills_as_designed(text, cfg(s))
        assert count(text, "HGMMA") == count(one, "HGMMA")
        assert count(text, "UBLKRED") == count(one, "UBLKRED")
        assert semaphore_ops(text) == semaphore_ops(one)  # the same acquire / release per query block
        # the copy's offsets and the run's division, once per CTA (ptxas may schedule the rest
        # into as many lines)
        extra = len(_lines(text)) - len(_lines(one))
        assert text != one and 0 <= extra <= 100, extra


# ---- the builds that do not copy: the base revision's SASS, byte for byte


@pytest.mark.compile
@pytest.mark.parametrize("deterministic", [False, True])
def test_builds_without_copies_never_trace_the_slice(deterministic, monkeypatch):
    """As test_kernel_sm90_varlen_compile.py does for the varlen branches: one copy, the same SASS
    with _dq_slice raising."""
    pytest.importorskip("cutlass")
    import fa4kernel
    from fa4kernel.sm90.bwd import FlashBwdSm90

    monkeypatch.setenv("FA4LAB_CACHE", "off")
    cfgs = [bc.make_bwd_config("bfloat16", 256, True, deterministic),
            bc.make_varlen_bwd_config("bfloat16", 128, True, {}, deterministic)]
    plain = [fa4kernel.compile_bwd_sass(c) for c in cfgs]

    def boom(*a, **k):
        raise AssertionError("_dq_slice traced into a build with one copy")

    monkeypatch.setattr(FlashBwdSm90, "_dq_slice", boom)
    assert [fa4kernel.compile_bwd_sass(c) for c in cfgs] == plain

NO_COPY_BUILDS = [  # (head dim, causal, deterministic, varlen, knobs)
    *[(hd, causal, False, False, {}) for hd in bc.BWD_HEAD_DIMS for causal in (False, True)],
    (128, False, False, False, {"dq_reduce": "red", "stats": "thread", "mma_order": "dv_dk_dq",
                                "preprocess": "torch"}),
    (64, True, False, False, {"gqa_dkv": "reduce"}),
    (256, True, False, False, {"dq_sum": "cta"}),
    *[(hd, causal, False, True, {}) for hd in (64, 128, 256) for causal in (False, True)],
    # deterministic with one copy: the build as it was
    *[(hd, causal, True, False, {}) for hd in (64, 128, 256) for causal in (False, True)],
    (128, True, True, True, {}),
]

_SASS_SCRIPT = """
import json, sys
import fa4kernel
from fa4kernel.sm90 import bwd_config as bc
out = []
for hd, causal, det, varlen, knobs in json.loads(sys.argv[1]):
    if varlen:
        cfg = bc.make_varlen_bwd_config("bfloat16", hd, causal, knobs, deterministic=det)
    else:
        cfg = bc.make_bwd_config("bfloat16", hd, causal, det, **knobs)
    out.append(fa4kernel.compile_bwd_sass(cfg))
json.dump(out, open(sys.argv[2], "w"))
"""


def _git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def _base_revision():
    base = os.environ.get("FA4_SASS_BASE")
    try:
        return _git("rev-parse", base or _git("merge-base", "HEAD", "main").strip()).strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


def _sass_of(tree: Path, builds, out: Path):
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", _SASS_SCRIPT, json.dumps(builds), str(out)], env=env, check=True,
                   cwd=tree, capture_output=True)
    return json.loads(out.read_text())


@pytest.mark.compile
def test_builds_without_copies_keep_the_base_sass(tmp_path):
    pytest.importorskip("cutlass")
    base = _base_revision()
    if base is None:
        pytest.skip("no git checkout with a main branch (set FA4_SASS_BASE)")
    if not _git("diff", base, "--", "fa4kernel"):
        pytest.skip(f"fa4kernel/ is {base[:7]}'s: nothing to compare")
    tree = tmp_path / "base"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", base, "fa4kernel"], capture_output=True,
                             check=True).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(tree)
    builds = [list(b) for b in NO_COPY_BUILDS]
    old = _sass_of(tree, builds, tmp_path / "old.json")
    new = _sass_of(ROOT, builds, tmp_path / "new.json")
    for b, a, n in zip(NO_COPY_BUILDS, old, new):
        assert a == n, f"{b}: SASS differs from {base[:7]}'s"
