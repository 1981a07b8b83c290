"""Reading compiled SASS (nvdisasm text): loop bodies by their backward branches.

CPU-only helpers for tests and benchmarks that check what ptxas made of a kernel: which
instructions a loop runs per trip, and where its waits sit.
"""
from __future__ import annotations

import re


def loop_bodies(sass: str, operands: bool = False) -> list[tuple[str, list[str]]]:
    """[(label, [opcode, ...])] for every backward branch (a loop body: label .. branch).
    Predicates (@P0) are dropped; an opcode keeps its modifiers (HGMMA.64x128x16.F32.BF16).
    operands=True: whole instructions (FMUL R42, R42, R51.reuse) instead of opcodes."""
    labels = {}
    ops = []  # instruction texts, in order
    for line in sass.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = len(ops)
            continue
        if "*/" in line:
            s = line.split("*/", 1)[1].strip().rstrip(";").strip()
            if not s:
                continue
            if s.startswith("@"):
                s = s.split(None, 1)[1] if " " in s else s
            ops.append(s)
    out = []
    for k, s in enumerate(ops):
        if s.startswith("BRA"):
            m = re.search(r"\((\.L_x_\d+)\)", s)
            if m and m.group(1) in labels and labels[m.group(1)] <= k:
                body = ops[labels[m.group(1)]:k + 1]
                out.append((m.group(1), body if operands else [o.split()[0] for o in body]))
    return out


def kv_loop(sass: str) -> list[str]:
    """Opcodes of an attention kernel's KV loop: the smallest loop body holding both wgmma
    (HGMMA) and MUFU.EX2."""
    bodies = [ops for _, ops in loop_bodies(sass)
              if any(o.startswith("HGMMA") for o in ops) and "MUFU.EX2" in ops]
    if not bodies:
        raise ValueError("no loop with both HGMMA and MUFU.EX2 in this SASS")
    return min(bodies, key=len)


def around_pv_wait(loop: list[str]) -> tuple[list[str], list[str]]:
    """A KV loop's opcodes split at its waits: (between the S wait and the PV wait, from the PV
    wait on). The first two WARPGROUP.DEPBARs of the loop are those waits (wait_group 1, then 0)."""
    s_wait, pv_wait = [i for i, o in enumerate(loop) if o.startswith("WARPGROUP.DEPBAR")][:2]
    return loop[s_wait:pv_wait], loop[pv_wait:]
