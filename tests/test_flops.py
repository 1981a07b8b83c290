"""The FLOP count (fa4sim/flops.py, Problem.flops): the visible (query, key) pairs of the
bottom-right-aligned causal mask, counted exactly, against a brute-force count of the mask."""
import importlib.util
from pathlib import Path

import pytest

from fa4sim import Problem
from fa4sim.flops import attention_flops, visible_pairs

ROOT = Path(__file__).resolve().parents[1]


def brute_force_pairs(sq: int, sk: int, causal: bool) -> int:
    """Count the mask entry by entry: row i sees key j iff j <= i + sk - sq (flash_attn's convention)."""
    return sum(1 for i in range(sq) for j in range(sk) if not causal or j <= i + sk - sq)


def kernel_visible(sq: int, sk: int) -> int:
    """The pairs fa4kernel's own mask leaves visible (fa4kernel/block_info.py, the arithmetic its
    kernels and host schedule share): per row, the columns below causal_col_limit."""
    from fa4kernel.block_info import causal_col_limit

    return sum(max(0, min(sk, causal_col_limit(i, 0, 1, sq, sk))) for i in range(sq))


@pytest.mark.parametrize("sq,sk", [(1, 1), (2, 2), (7, 7), (64, 64), (3, 10), (10, 3), (5, 6), (6, 5), (1, 9), (9, 1),
                                   (16, 128), (128, 16), (33, 65)])
@pytest.mark.parametrize("causal", [False, True])
def test_pairs_match_a_brute_force_mask_count(sq, sk, causal):
    assert visible_pairs(sq, sk, causal) == brute_force_pairs(sq, sk, causal)


@pytest.mark.parametrize("sq,sk", [(7, 7), (3, 10), (10, 3), (33, 65), (65, 33)])
def test_pairs_are_fa4kernels_mask(sq, sk):
    assert visible_pairs(sq, sk, True) == kernel_visible(sq, sk)


def test_square_causal_is_the_exact_triangle():
    # sq (sq + 1) / 2 pairs: the old count (half the square, the FA papers' convention) is 1 / sq smaller
    for s in (1024, 4096, 16384):
        p = Problem(2, 16, s, s, 128, causal=True)
        assert p.flops == 2.0 * 2 * 16 * 256 * s * (s + 1) // 2
        half_square = 4.0 * 2 * 16 * s * s * 128 / 2
        assert p.flops / half_square == pytest.approx(1 + 1 / s, rel=1e-12)


def test_chunked_prefill_sees_most_of_the_rectangle():
    # 2048 new queries against an 8192-token cache: each row sees 6144 + i + 1 keys
    sq, sk = 2048, 8192
    pairs = visible_pairs(sq, sk, True)
    assert pairs == sq * (sk - sq) + sq * (sq + 1) // 2
    assert pairs / (sq * sk) == pytest.approx(1 - (sq - 1) / (2 * sk))  # 0.875, where half was counted
    p = Problem(8, 16, sq, sk, 128, causal=True)
    assert p.flops == attention_flops(8, 16, sq, sk, 128, 128, True) == 2.0 * 8 * 16 * 256 * pairs


def test_rows_that_see_no_key_count_nothing():
    # 10 queries, 3 keys: the first 7 rows see nothing, the last 3 see 1, 2 and 3 keys
    assert visible_pairs(10, 3, True) == 6
    assert visible_pairs(4096, 1024, True) == 1024 * 1025 // 2


def test_non_causal_and_hdim_v():
    p = Problem(2, 16, 1000, 3000, 192, hdim_v=128)
    assert p.flops == 2.0 * 2 * 16 * 1000 * 3000 * (192 + 128)
    assert attention_flops(1, 1, 5, 7, 64) == 2.0 * 5 * 7 * 128


def test_benchmarks_count_with_the_same_definition():
    """bench_fwd_sm90.flops loads fa4sim/flops.py by its path (no simpy on the device) and agrees."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("bench_fwd_sm90_flops", ROOT / "lab" / "tools" / "bench_fwd_sm90.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for args in ((16, 16, 1024, 1024, 128, True), (8, 16, 2048, 8192, 128, True), (1, 16, 32768, 32768, 64, False)):
        b, h, sq, sk, d, causal = args
        assert bench.flops(*args) == Problem(b, h, sq, sk, d, causal).flops
    assert bench.flops(4, 16, 4096, 4096, 192, False, dv=128) == Problem(4, 16, 4096, 4096, 192, hdim_v=128).flops
