"""Kernel schedules as data: each module builds an engine.Schedule (ops, units, dependencies).

fa4_sm100: FlashAttention-4 forward on Blackwell. fa3_sm90: the FA3-style forward on Hopper.
fa4_sm100_bwd, fa3_sm90_bwd: their backward passes (BWD_SCHEDULES, by the forward's name);
kernel_bwd: the backward's launch (KV tiles over the SMs, its traffic, the deterministic order).
A schedule module provides NAME, ARCH, DESCRIPTION, KNOBS, check(), rows_per_cta(), build()
and facts() (what an implementation's rules may test; registered with fa4sim.implementation here).
"""
from .. import implementation
from . import fa3_sm90, fa3_sm90_bwd, fa4_sm100, fa4_sm100_bwd

SCHEDULES = {m.NAME: m for m in (fa4_sm100, fa3_sm90)}
BWD_SCHEDULES = {m.NAME: m for m in (fa4_sm100_bwd, fa3_sm90_bwd)}


def _register_facts() -> None:
    """Let the implementations' rules test what each schedule derives (its facts())."""
    for pass_, table in (("fwd", SCHEDULES), ("bwd", BWD_SCHEDULES)):
        for name, module in table.items():
            implementation.register_facts(name, pass_, module.facts)


_register_facts()
