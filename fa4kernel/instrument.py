"""Device side of the diagnostic builds (diagnostics.py): every clock64 / globaltimer stamp the
SM90 kernel writes goes through one Instrument, so the kernel's algorithm reads without them.

In the normal build (Diagnostics NONE) every method here emits nothing: the checks are
trace-time constants (const_expr), and stamp() / tile() return without touching the buffer.
Buffer layout: trace_layout.py; host decoding: trace.py.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from .diagnostics import Diagnostics
from .trace_layout import (
    CTA_LOG_MAX, CTA_LOG_WORDS, LIGHT_OPS, SUM_CYCLES, SUM_NS, SUM_SPANS, T_EXP, T_MAX, TILE_LOG_BASE,
    TILE_LOG_MAX, TRACE_HEADER, TRACE_ITERS, TRACE_OPS, TRACE_TILES,
)


@cutlass.dsl_user_op
def _smid(*, loc=None, ip=None) -> Int32:
    """%smid: the SM this CTA runs on (CTA log only)."""
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    return Int32(llvm.inline_asm(T.i32(), [], "mov.u32 $0, %smid;", "=r", has_side_effects=True,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


class Instrument:
    """The stamps of one build. A trace context `tr` = (mTrace, on, local tile, role) names where
    a warp role's stamps go (None in builds without the per-op trace)."""

    def __init__(self, diag: Diagnostics):
        self.trace = diag.trace
        # light trace: only QK, PV, the whole softmax (stamped as EXP: MAX start .. EXP end), FIN
        # and ST, with the normal build's softmax code order: ~6 stamps per warpgroup and block
        self.trace_light = diag.trace and diag.trace_light
        # header stamps (kernel start / end clock64 + globaltimer of one CTA): every buffered build
        self.probe = diag.probe
        self.cta_log = diag.probe and not diag.trace and diag.cta_log
        # the full trace stamps all rows' max, then all rows' exp2 (MAX and EXP as two spans)
        self.split_softmax = diag.trace and not diag.trace_light

    @cute.jit
    def kernel_start(self, mTrace):
        """At kernel start (every thread): the traced CTA's thread 0 writes the header's start
        stamps; with the CTA log every CTA's thread 0 its SM id and start. Returns tr_cta (this
        CTA is the traced one) in buffered builds, else None."""
        tr_cta = None
        if const_expr(self.probe):
            tr_cta = cute.arch.block_idx()[0] == Int32(mTrace[0])
            if tr_cta & (cute.arch.thread_idx()[0] == 0):
                mTrace[1] = cute.arch.clock64()
                mTrace[2] = cute.arch.globaltimer()
                mTrace[5] = cutlass.Int64(cute.arch.grid_dim()[0])
            if const_expr(self.cta_log):
                bid = cute.arch.block_idx()[0]
                if (cute.arch.thread_idx()[0] == 0) & (bid < CTA_LOG_MAX):
                    base = TRACE_HEADER + bid * CTA_LOG_WORDS
                    mTrace[base + 1] = cute.arch.globaltimer()
                    mTrace[base + 3] = cute.arch.clock64()
                    mTrace[base] = cutlass.Int64(_smid())
        return tr_cta

    @cute.jit
    def kernel_end(self, mTrace, tr_cta, tidx):
        """At the end of the first consumer thread (tidx 0, after its CTA's last O store): the
        header's end stamps and the CTA log's end."""
        if const_expr(self.probe):
            if tr_cta & (tidx == 0):
                c1 = cute.arch.clock64()
                g1 = cute.arch.globaltimer()
                mTrace[3] = c1
                mTrace[4] = g1
                if const_expr(not self.cta_log):
                    # the running sums: the mean clock over every launch, not one launch's sample
                    # (the start stamps are visible here: thread 0 wrote them before sync_threads)
                    self._add_span(mTrace, c1 - mTrace[1], g1 - mTrace[2])
            if const_expr(self.cta_log):
                bid = cute.arch.block_idx()[0]
                if (tidx == 0) & (bid < CTA_LOG_MAX):
                    base = TRACE_HEADER + bid * CTA_LOG_WORDS
                    c1 = cute.arch.clock64()
                    g1 = cute.arch.globaltimer()
                    mTrace[base + 4] = c1
                    mTrace[base + 2] = g1
                    mTrace[base + 5] = cutlass.Int64(1)
                    # every logged CTA adds its span: CTAs end concurrently, so the adds are atomic
                    self._add_span(mTrace, c1 - mTrace[base + 3], g1 - mTrace[base + 1])

    @cute.jit
    def _add_span(self, mTrace, cycles, ns):
        """Add one span (clock64 cycles, globaltimer ns) to the header's running sums: one relaxed
        atomic add each, since several CTAs of a launch may end at once."""
        cute.arch.red(mTrace.iterator + SUM_CYCLES, cutlass.Uint64(cycles), op="add", dtype=cutlass.Uint64,
                      sem="relaxed", scope="gpu")
        cute.arch.red(mTrace.iterator + SUM_NS, cutlass.Uint64(ns), op="add", dtype=cutlass.Uint64,
                      sem="relaxed", scope="gpu")
        cute.arch.red(mTrace.iterator + SUM_SPANS, cutlass.Uint64(1), op="add", dtype=cutlass.Uint64,
                      sem="relaxed", scope="gpu")

    @cute.jit
    def tile_start(self, mTrace, tidx, tile):
        """CTA log of a persistent launch: when this CTA starts tile `tile` (static-table jitter)."""
        if const_expr(self.cta_log):
            if (tidx == 0) & (tile < TILE_LOG_MAX):
                mTrace[TILE_LOG_BASE + tile] = cute.arch.clock64()

    def leader(self, tr_cta, is_leader):
        """The per-op trace's writer flag of a warp role: the traced CTA and is_leader() (a
        callable, evaluated only in trace builds); None otherwise."""
        if self.trace:
            return tr_cta & is_leader()
        return None

    @cute.jit
    def tile(self, mTrace, on, role, local=None):
        """Per-tile trace context (mTrace, on, local tile index, role), or None without the trace.
        local: this CTA's tile count so far (None: its only tile)."""
        tr = None
        if const_expr(self.trace):
            tr = (mTrace, on, Int32(0) if const_expr(local is None) else local, role)
        return tr

    def with_role(self, tr, role: int):
        """The same tile's trace context for another role (the epilogue's O store)."""
        if self.trace:
            return (tr[0], tr[1], tr[2], Int32(role))
        return None

    def prev(self, it):
        """The iteration before `it` (intra-WG overlap: a block body issues PV of it - 1)."""
        if self.trace:
            return it - 1
        return None

    @cute.jit
    def stamp(self, tr, op: cutlass.Constexpr, it, which: cutlass.Constexpr):
        """clock64 -> start (which=0) or end (which=1) of `op` at KV iteration `it`."""
        if const_expr(self.trace_light and op == T_MAX and which == 0):
            op = T_EXP  # the light trace stamps the softmax as one span
        if const_expr(self.trace and (not self.trace_light or op in LIGHT_OPS)):
            t = cute.arch.clock64()
            mT, on, local, role = tr
            if on & (it < TRACE_ITERS) & (local < TRACE_TILES):
                mT[TRACE_HEADER + (((role * TRACE_TILES + local) * TRACE_ITERS + it) * TRACE_OPS + op) * 2
                   + which] = t
