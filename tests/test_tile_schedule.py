"""CPU: the causal tile schedule fa4kernel computes on the host (fa4kernel/tile_schedule.py)."""
import math

import pytest

from fa4kernel.tile_schedule import (TAIL_WAVES, TILE_OVERHEAD_BLOCKS, as_table, causal_schedule,
                                     kv_blocks, tile_order)


def _cost(rows, num_m, tm, tn, sq, sk):
    return [sum(kv_blocks(t % num_m, tm, tn, sq, sk) + TILE_OVERHEAD_BLOCKS for t in r) for r in rows]


@pytest.mark.parametrize("hd,tm,tn", [(64, 192, 128), (128, 128, 128), (256, 128, 80)])
@pytest.mark.parametrize("s", [1024, 4096, 16384])
def test_every_tile_once_and_balanced(hd, tm, tn, s):
    b, h = 16384 // s, 2048 // hd
    rows = causal_schedule(b, h, s, s, hd, tm, tn, 132, 12 << 20)
    num_m = math.ceil(s / tm)
    flat = sorted(t for r in rows for t in r)
    assert flat == list(range(num_m * b * h))
    cost = _cost(rows, num_m, tm, tn, s, s)
    # predicted finish of the busiest CTA within 3 % of the mean (static round-robin: up to 25 %)
    assert max(cost) <= 1.03 * sum(cost) / len(cost)


def test_one_cta_per_tile_keeps_the_order():
    rows = causal_schedule(2, 3, 1000, 1000, 128, 128, 128, 10_000, 1 << 20, sms=1)
    assert all(len(r) == 1 for r in rows)
    assert [r[0] for r in rows] == tile_order(8, 6, 2 * 1000 * 128 * 2, 1 << 20, TAIL_WAVES)


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
    assert kv_blocks(0, 128, 128, 100, 1000) == 8  # seqlen_k > seqlen_q: rows see the prefix
    assert kv_blocks(0, 128, 128, 1000, 100) == 1  # no key visible: still one (masked) block


def test_table_pads_with_stop_marker():
    assert as_table([[3, 1], [2]]) == [[3, 1, -1], [2, -1, -1]]


def test_bad_input_one_line_error():
    with pytest.raises(ValueError, match="grid"):
        causal_schedule(1, 1, 128, 128, 128, 128, 128, 0, 1 << 20)
