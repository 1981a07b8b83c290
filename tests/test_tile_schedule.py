"""CPU: the tile schedule fa4kernel computes on the host (fa4kernel/tile_schedule.py)."""
import math

import pytest

from fa4kernel.tile_schedule import (LIVE_WG_COST, TAIL_WAVES, TILE_OVERHEAD_BLOCKS, as_table, kv_blocks, make_schedule,
                                     tile_cost, tile_order)


def _cost(rows, num_m, tm, tn, sq, sk, causal=True):
    return [sum(tile_cost(t % num_m, tm, tn, sq, sk, causal) for t in r) for r in rows]


@pytest.mark.parametrize("hd,tm,tn", [(64, 192, 128), (128, 128, 128), (256, 128, 80)])
@pytest.mark.parametrize("s", [1024, 4096, 16384])
@pytest.mark.parametrize("causal", [True, False])
def test_every_tile_once_and_balanced(hd, tm, tn, s, causal):
    b, h = 16384 // s, 2048 // hd
    rows = make_schedule(b, h, s, s, hd, tm, tn, 132, 12 << 20, causal)
    num_m = math.ceil(s / tm)
    flat = sorted(t for r in rows for t in r)
    assert flat == list(range(num_m * b * h))
    cost = _cost(rows, num_m, tm, tn, s, s, causal)
    # predicted finish of the busiest CTA within 3 % of the mean, or one tile over it (causal
    # static round-robin: up to 25 %)
    mean = sum(cost) / len(cost)
    assert max(cost) <= max(1.03 * mean, mean + tile_cost(0, tm, tn, s, s, causal))


def test_partial_tiles_spread_over_ctas():
    """hd64 1k non-causal: 6 tiles of 192 rows per head, the 6th with one warpgroup's rows. A
    static round-robin (m_block fastest, 132 CTAs = 22 x 6) gives all 512 of them to 22 CTAs;
    the schedule spreads them so no CTA runs more than its share of KV-block work plus a tile."""
    rows = make_schedule(16, 32, 1024, 1024, 64, 192, 128, 132, 6 << 20, causal=False)
    assert max(sum(1 for t in r if t % 6 == 5) for r in rows) < 22  # round-robin: 23 or 24 each on 22 CTAs
    cost = _cost(rows, 6, 192, 128, 1024, 1024, causal=False)
    assert max(cost) - min(cost) <= tile_cost(0, 192, 128, 1024, 1024, False)
    static = [sum(tile_cost(t % 6, 192, 128, 1024, 1024, False) for t in range(c, 3072, 132)) for c in range(132)]
    assert max(cost) < 0.93 * max(static)  # the busiest CTA: >= 7 % less work than round-robin's


def test_tile_cost_counts_warpgroups_with_rows():
    full = 8 + TILE_OVERHEAD_BLOCKS
    assert tile_cost(0, 192, 128, 1024, 1024, False) == full
    one_live = 8 * LIVE_WG_COST[(3, 1)] + TILE_OVERHEAD_BLOCKS
    assert tile_cost(5, 192, 128, 1024, 1024, False) == pytest.approx(one_live)  # 64 rows
    assert tile_cost(5, 192, 128, 1000, 1000, False) == pytest.approx(one_live)  # 40 rows
    assert tile_cost(5, 192, 128, 1030, 1024, False) == pytest.approx(8 * LIVE_WG_COST[(3, 2)] + TILE_OVERHEAD_BLOCKS)
    assert tile_cost(0, 192, 128, 64, 64, False) < tile_cost(0, 192, 128, 128, 128, False) < full
    assert tile_cost(4, 192, 128, 1000, 1000, False) == full
    assert tile_cost(7, 128, 128, 1024, 1024, True) == full  # causal: 8 blocks on the diagonal


def test_one_cta_per_tile_keeps_the_order():
    rows = make_schedule(2, 3, 1000, 1000, 128, 128, 128, 10_000, 1 << 20, sms=1)
    assert all(len(r) == 1 for r in rows)
    assert [r[0] for r in rows] == tile_order(8, 6, 2 * 1000 * 128 * 2, 1 << 20, TAIL_WAVES)


def test_equal_tiles_go_round_robin():
    """Non-causal tiles of equal cost: list scheduling hands them out in order, CTA by CTA."""
    rows = make_schedule(1, 16, 16384, 16384, 128, 128, 128, 132, 6 << 20, causal=False)
    order = [t for i in range(max(map(len, rows))) for r in rows if i < len(r) for t in [r[i]]]
    assert sorted(order) == list(range(16 * 128))
    assert [len(r) for r in rows] == [16] * 68 + [15] * 64
    # and one head's tiles together: the CTAs running at once share its K/V
    rows = make_schedule(16, 16, 1024, 1024, 128, 128, 128, 132, 6 << 20, causal=False)
    assert [r[0] // 8 for r in rows[:16]] == [0] * 8 + [1] * 8


def test_sections_group_heads_longest_first():
    num_m, kv = 8, 512 * 1024  # 1k keys, hd128: K + V of one head
    order = tile_order(num_m, 256, kv, 12 << 20)  # 24 heads per section
    first = order[:24 * num_m]
    assert {t // num_m for t in first} == set(range(24))       # one section's heads only
    assert [t % num_m for t in first[:24]] == [num_m - 1] * 24  # its longest tiles first
    assert [t % num_m for t in first[-24:]] == [0] * 24
    # one section: every head's longest tile before any shorter one
    assert [t % num_m for t in tile_order(num_m, 256, kv, 0)[:256]] == [num_m - 1] * 256


def test_last_section_merged_to_tail_waves():
    num_m, grid = 8, 132
    order = tile_order(num_m, 128, 1 << 20, 12 << 20, TAIL_WAVES * grid)  # 12 heads per section
    heads_in_last = set()
    for t in reversed(order):
        if t % num_m == num_m - 1 and heads_in_last and (t // num_m) not in heads_in_last and \
                len(heads_in_last) * num_m >= TAIL_WAVES * grid:
            break
        heads_in_last.add(t // num_m)
    assert len(heads_in_last) * num_m >= TAIL_WAVES * grid


def test_kv_blocks_bottom_right_causal():
    assert [kv_blocks(m, 128, 128, 1024, 1024) for m in range(8)] == list(range(1, 9))
    assert kv_blocks(0, 128, 128, 1024, 1000, causal=False) == 8
    assert kv_blocks(0, 128, 128, 100, 1000) == 8  # seqlen_k > seqlen_q: rows see the prefix
    assert kv_blocks(0, 128, 128, 1000, 100) == 1  # no key visible: still one (masked) block


def test_table_pads_with_stop_marker():
    assert as_table([[3, 1], [2]]) == [[3, 1, -1], [2, -1, -1]]


def test_bad_input_one_line_error():
    with pytest.raises(ValueError, match="grid"):
        make_schedule(1, 1, 128, 128, 128, 128, 128, 0, 1 << 20)
