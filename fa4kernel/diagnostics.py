"""Diagnostic builds of the SM90 kernel: what is measured, kept apart from what is computed.

A KernelConfig (sm90/config.py) holds what a user chooses; a Diagnostics value says which
instrumented variant of that kernel to build. The compile cache keys on both. The default,
NONE, is the normal kernel, whose generated code does not depend on this module. Every other
build takes one more argument, an int64 stamps buffer of trace_layout.TRACE_WORDS words, and
writes only to it (instrument.py holds the device side, trace.py decodes the buffer).

Builds (none of them is a user knob: attention() rejects these names):
  trace        clock64 stamps of one CTA per warp role, op and KV iteration (timeline_sm90.py);
               trace_light: only QK, PV, the softmax as one span, FIN and ST (trace_layout.LIGHT_OPS),
               keeping the normal build's code order
  clock_probe  the normal kernel plus the header stamps of one CTA (its start and end clock64 and
               globaltimer): the SM clock of every launch at no measurable cost;
               cta_log: every CTA also logs its SM id and start / end stamps (trace_layout.CTA_LOG_*),
               and a persistent CTA the start of each tile (trace_layout.TILE_LOG_*)
  skip_softmax no online softmax and no O rescale (P = S converted): the wgmma + pipeline skeleton
  ablate       comma-separated ABLATIONS, each removing one softmax phase: its change in cycles per
               KV block is what that phase costs on the critical path (fa4sim's free_* knobs are the
               same what-ifs)
skip_softmax and ablate builds do not compute attention: timing only.

Plain Python (no CUDA, no CuTe DSL, no torch).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

# "max": the row max from one element (no FMNMX tree, no shuffles); "exp": P = the scaled score
# (no MUFU.EX2); "sum": no row-sum FADDs; "rescale": no O rescale
ABLATIONS = ("max", "exp", "sum", "rescale")


@dataclass(frozen=True)
class Diagnostics:
    """Which instrumented build of a KernelConfig to compile. Hashable: part of the cache key."""

    trace: bool = False
    trace_light: bool = False
    clock_probe: bool = False
    cta_log: bool = False
    skip_softmax: bool = False
    ablate: str = ""  # sorted, comma-separated ABLATIONS

    @property
    def buffered(self) -> bool:
        """The build takes (and writes) the stamps buffer."""
        return self != NONE

    @property
    def probe(self) -> bool:
        """The build writes the buffer's header (kernel start / end of one CTA)."""
        return self.buffered

    @property
    def ablated(self) -> frozenset:
        return frozenset(x for x in self.ablate.split(",") if x)

    def as_dict(self):
        return asdict(self)


NONE = Diagnostics()


def trace_build(light: bool = False) -> Diagnostics:
    """The instrumented (clock64-stamping) build; light=True: a few stamps per block only."""
    return Diagnostics(trace=True, trace_light=bool(light))


def probe_build(skip_softmax: bool = False, ablate: str = "", cta_log: bool = False,
                clock_probe: bool = True) -> Diagnostics:
    """A clock-probe build, optionally with the CTA log, without the softmax, or ablated.
    Raises a one-line ValueError for an unknown ablation or a CTA log without the probe."""
    if not isinstance(ablate, str):
        raise ValueError(f"ablate={ablate!r}; allowed: a comma-separated subset of {', '.join(ABLATIONS)}")
    parts = tuple(sorted(x for x in ablate.split(",") if x))
    bad = [x for x in parts if x not in ABLATIONS]
    if bad:
        raise ValueError(f"ablate={ablate!r}: unknown {', '.join(bad)}; allowed: {', '.join(ABLATIONS)}")
    if cta_log and not clock_probe:
        raise ValueError("cta_log=True needs clock_probe=True (it writes into the probe's stamps buffer)")
    return Diagnostics(clock_probe=bool(clock_probe), skip_softmax=bool(skip_softmax), ablate=",".join(parts),
                       cta_log=bool(cta_log))


NAMES = tuple(Diagnostics.__dataclass_fields__)
