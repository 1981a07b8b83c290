"""The kernels' named barrier ids (sm90/named_barrier.py, sm100/named_barrier.py): within a
kernel, every id with its range (member + i) is its own, none is 0 (__syncthreads), all < 16.
Plain Python: no DSL, no GPU."""

import pytest

from fa4kernel.sm90.named_barrier import NamedBarrierBwd, NamedBarrierFwd
from fa4kernel.sm100.named_barrier import NamedBarrierFwdSm100

# ids a member spans: one per consumer warpgroup (SM90 forward: up to 3; backward dQ: up to 2),
# one per (dQ warpgroup, Q / dO stage) for the backward's DQ_FULL_STAGE (up to 8: FlashBwdSm90
# asserts it), one per (softmax warpgroup, warp) pair on SM100; keyed by name (IntEnum members of
# equal value from different enums compare and hash equal)
SPANS = {
    NamedBarrierFwd: {"PINGPONG": 3},
    NamedBarrierBwd: {"DQ_EMPTY": 2, "DQ_FULL": 2, "DQ_FULL_STAGE": 8},
    NamedBarrierFwdSm100: {"SM_STATS": 8},
}


@pytest.mark.parametrize("enum", [NamedBarrierFwd, NamedBarrierBwd, NamedBarrierFwdSm100])
def test_named_barrier_ids_are_disjoint_and_in_range(enum):
    ids = [int(m) + i for m in enum for i in range(SPANS[enum].get(m.name, 1))]
    assert len(ids) == len(set(ids)), sorted(ids)
    assert min(ids) >= 1 and max(ids) <= 15, sorted(ids)
