"""Kernel schedules as data: each module builds an engine.Schedule (ops, units, dependencies).

fa4_sm100: FlashAttention-4 forward on Blackwell. fa3_sm90: the FA3-style forward on Hopper.
A schedule module provides NAME, ARCH, DESCRIPTION, KNOBS, check(), rows_per_cta(), build().
"""
from . import fa3_sm90, fa4_sm100

SCHEDULES = {m.NAME: m for m in (fa4_sm100, fa3_sm90)}
