"""Decode the stamps buffer of the instrumented SM90 build (KernelConfig.trace) into
fa4sim.timeline's stamp format. Plain Python: no torch, no CuTe DSL, no fa4sim import.

Buffer layout: trace_layout.py (header, then (start, end) clock64 pairs per role, local tile,
KV iteration and op). Ops map to the simulator's names (fa4sim/schedules/fa3_sm90.py):

  role "load"      LK, LV (start = stage acquired = TMA issue, end = TMA issued), LQ
  role "wg{w}"     QK{w}  start = wgmma issue, end = wait for S done
                   PV{w}  start = wgmma issue, end = its wait done (intra-WG overlap: the
                          wait_group(0) after the next block's softmax)
                   MAX{w} row max (+ shuffles, new scale), EXP{w} exp2 + row sum,
                   CVT{w} P -> 16 bit (registers, or smem + fence + barrier),
                   RESC{w} O *= scale, FIN{w} O / row_sum, LSE and O -> smem (+ barrier),
                   PP{w}  ping-pong arrive (only with pingpong), MASK{w} mask of a block
  role "epilogue"  ST     start = all consumers' O in smem, end = TMA store of O done
Waits that are not simulator ops (consumer: K full, V full, ping-pong barrier; producer: empty
K / V stage) go to a separate "waits" list with ops WAIT_K, WAIT_V, WAIT_PP (+ w on consumers).
"""
from __future__ import annotations

from .trace_layout import (  # noqa: F401  (re-exported)
    CTA_LOG_MAX, CTA_LOG_WORDS, PROBE_SUM_WORDS, SUM_CYCLES, SUM_NS, SUM_SPANS, TILE_LOG_BASE, TILE_LOG_CTAS, TILE_LOG_MAX, T_CVT, T_EXP, T_FIN, T_LK, T_LQ, T_LV, T_MASK, T_MAX, T_PP, T_PV, T_QK, T_RESC, T_ST,
    T_WAIT_K, T_WAIT_PP, T_WAIT_V, TRACE_HEADER, TRACE_ITERS, TRACE_OP_NAMES, TRACE_OPS,
    TRACE_ROLES, TRACE_TILES, TRACE_WORDS,
)

_WG_OPS = {T_QK, T_PV, T_MAX, T_EXP, T_RESC, T_CVT, T_FIN, T_PP, T_MASK}
_WAITS = {T_WAIT_K, T_WAIT_V, T_WAIT_PP}


def role_names(num_wg: int) -> list[str]:
    return ["load"] + [f"wg{w}" for w in range(num_wg)] + ["epilogue"]


def decode(words, num_wg: int, pingpong: bool = True, mask_as_event: bool = False) -> dict:
    """words: the int64 buffer as a sequence of ints. Returns {"header", "events", "waits",
    "clock_ghz_in_kernel", "tiles_recorded"}; event times are clock64 cycles from the kernel
    start stamp (thread 0 of the traced CTA). PP events only with pingpong; MASK events go to
    "waits" unless mask_as_event (the simulator has a MASK op only for masked blocks)."""
    words = [int(x) for x in words]
    if len(words) < TRACE_WORDS:
        raise ValueError(f"stamps buffer has {len(words)} words, expected {TRACE_WORDS}")
    h = words[:TRACE_HEADER]
    origin = h[1]
    names = role_names(num_wg)
    events, waits = [], []
    tiles = set()
    partial = 0
    for role in range(num_wg + 2):
        rname = names[role]
        for tile in range(TRACE_TILES):
            for it in range(TRACE_ITERS):
                base = TRACE_HEADER + ((role * TRACE_TILES + tile) * TRACE_ITERS + it) * TRACE_OPS * 2
                for op in range(TRACE_OPS):
                    s, e = words[base + 2 * op], words[base + 2 * op + 1]
                    if s == 0 and e == 0:
                        continue
                    if s == 0 or e == 0 or e < s:
                        partial += 1
                        continue
                    name = TRACE_OP_NAMES[op]
                    if 1 <= role <= num_wg:
                        name += str(role - 1)
                    ev = {"role": rname, "op": name, "tile": tile, "iter": it,
                          "start": s - origin, "end": e - origin}
                    tiles.add(tile)
                    to_waits = (op in _WAITS or (op == T_PP and not pingpong)
                                or (op == T_MASK and not mask_as_event))
                    (waits if to_waits else events).append(ev)
    events.sort(key=lambda e: (e["start"], e["role"]))
    waits.sort(key=lambda e: (e["start"], e["role"]))
    cycles, ns = h[3] - h[1], h[4] - h[2]
    return {
        "header": {"traced_cta": h[0], "clock64_start": h[1], "globaltimer_start_ns": h[2],
                   "clock64_end": h[3], "globaltimer_end_ns": h[4], "grid": h[5]},
        "events": events,
        "waits": waits,
        "kernel_cycles": cycles,
        "kernel_ns": ns,
        "clock_ghz_in_kernel": (cycles / ns) if ns > 0 and cycles > 0 else None,
        "tiles_recorded": sorted(tiles),
        "partial_pairs_dropped": partial,
    }


def header_clock(words) -> dict:
    """In-kernel clock of the traced CTA from the header alone (trace or clock-probe build):
    {"cycles", "ns", "ghz"} (ghz None when the header was not written)."""
    h = [int(x) for x in words[:5]]
    cycles, ns = h[3] - h[1], h[4] - h[2]
    return {"cycles": cycles, "ns": ns, "ghz": (cycles / ns) if ns > 0 and cycles > 0 else None}


def mean_clock(words) -> dict:
    """The mean in-kernel clock over every launch since the host zeroed the header's running sums
    (trace_layout.SUM_*; any buffered build): {"spans", "cycles", "ns", "ghz"}, spans = launches
    (or, in a CTA-log build, CTAs) added; ghz None when none was."""
    h = [int(x) for x in words[:TRACE_HEADER]]
    cycles, ns, spans = h[SUM_CYCLES], h[SUM_NS], h[SUM_SPANS]
    return {"spans": spans, "cycles": cycles, "ns": ns,
            "ghz": cycles / ns if spans > 0 and ns > 0 and cycles > 0 else None}


def probe_sums(words) -> dict:
    """The backward clock probe's running sums (the last PROBE_SUM_WORDS words of a buffer of
    sm90.bwd.probe_words() words): every CTA's clock64 cycles and globaltimer ns over every launch
    since the host zeroed them, {"ctas", "cycles", "ns", "ghz"}; ghz None when no CTA added."""
    cycles, ns, ctas = (int(x) for x in list(words)[-PROBE_SUM_WORDS:][:3])
    return {"ctas": ctas, "cycles": cycles, "ns": ns, "ghz": cycles / ns if ctas > 0 and ns > 0 and cycles > 0 else None}


def ctas_clock_ghz(words) -> dict:
    """The SM clock of one backward clock-probe launch (sm90/bwd.py, FlashBwdSm90Probe: per CTA
    clock64 and globaltimer ns at its start, then at its end): all CTAs' clock64 cycles over all
    their ns, {"ctas", "cycles", "ns", "ghz"}. CTAs whose four words are not all written (or run
    backwards) are left out; ghz is None when none is left. A CTA shorter than globaltimer's
    step can read 0 ns: it stays in, so that the steps' rounding averages out over the CTAs."""
    words = [int(x) for x in words]
    cycles = ns = ctas = 0
    for i in range(0, len(words) - 3, 4):
        c0, g0, c1, g1 = words[i:i + 4]
        if min(c0, g0, c1, g1) <= 0 or c1 <= c0 or g1 < g0:
            continue
        cycles, ns, ctas = cycles + c1 - c0, ns + g1 - g0, ctas + 1
    return {"ctas": ctas, "cycles": cycles, "ns": ns, "ghz": cycles / ns if ns > 0 else None}


def interval(events, op: str = "QK0", tile: int = 0, skip: int = 2):
    """Median cycles between starts of successive iterations of `op` in `tile` (as
    fa4sim.timeline.interval, without importing fa4sim)."""
    starts = [e["start"] for e in sorted((e for e in events if e["op"] == op and e.get("tile", 0) == tile),
                                         key=lambda e: e["iter"])]
    diffs = sorted(b - a for a, b in zip(starts[skip:], starts[skip + 1:]))
    if not diffs:
        return None
    n = len(diffs)
    return diffs[n // 2] if n % 2 else (diffs[n // 2 - 1] + diffs[n // 2]) / 2


def cta_log(words, grid: int) -> list[dict]:
    """Decode a CTA-log build's buffer (KernelConfig.cta_log): one record per CTA that wrote
    both ends, {"cta", "sm", "start_ns", "end_ns", "cycles"}; start_ns / end_ns are globaltimer
    ns from the earliest CTA start, cycles are the CTA's own clock64 (one SM) from start to end."""
    words = [int(x) for x in words]
    rows = []
    for cta in range(min(grid, CTA_LOG_MAX)):
        b = TRACE_HEADER + cta * CTA_LOG_WORDS
        sm, g0, g1, c0, c1, done = words[b:b + CTA_LOG_WORDS]
        if done != 1 or g1 < g0 or c1 < c0:
            continue
        rows.append({"cta": cta, "sm": sm, "start_ns": g0, "end_ns": g1, "cycles": c1 - c0})
    if rows:
        t0 = min(r["start_ns"] for r in rows)
        for r in rows:
            r["start_ns"] -= t0
            r["end_ns"] -= t0
    return rows


def tile_log(words, table: list[list[int]]) -> list[dict]:
    """Decode a persistent CTA-log build's tile log: for every CTA of the host table (its flat
    tile ids, -1 = stop) whose CTA record and tile stamps were all written, one record per tile,
    {"cta", "tile", "k" (its position in the CTA's row), "cycles"}: from the tile's start to the
    next one's, the last to the CTA's end stamp (after its last O store); clock64 of one SM."""
    if len(table) > TILE_LOG_CTAS:
        raise ValueError(f"tile_log: {len(table)} CTAs; the tile log needs a persistent grid of at most {TILE_LOG_CTAS}")
    words = [int(x) for x in words]
    out = []
    for cta, row in enumerate(table):
        tiles = [t for t in row if t >= 0]
        b = TRACE_HEADER + cta * CTA_LOG_WORDS
        end, done = words[b + 4], words[b + 5]
        if done != 1 or not tiles or max(tiles) >= TILE_LOG_MAX:
            continue
        starts = [words[TILE_LOG_BASE + t] for t in tiles] + [end]
        if any(s <= 0 for s in starts) or any(b2 <= a for a, b2 in zip(starts, starts[1:])):
            continue
        out += [{"cta": cta, "tile": t, "k": k, "cycles": starts[k + 1] - starts[k]} for k, t in enumerate(tiles)]
    return out
