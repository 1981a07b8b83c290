"""Named barrier ids of the SM100 forward (sm100/fwd.py; bar.sync / bar.arrive, 16 per CTA, 0 is
__syncthreads). A member with a range takes an offset (id = member + i). Plain Python."""

from enum import IntEnum


class NamedBarrierFwdSm100(IntEnum):
    TMEM = 1  # MMA + softmax + correction warps: TMEM pointer handoff and dealloc
    SM_STATS = 2  # 2..9 (+ s * 4 + w): softmax warp w of WG s <-> correction warp w
