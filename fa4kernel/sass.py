"""SASS on a machine without a GPU: making it (sass_for: compile for an arch, disassemble the
cubin) and reading it (loop bodies by their backward branches, a KV loop, its waits).

CPU-only helpers for fa4kernel.compile_sass, tests and benchmarks that check what ptxas made of
a kernel: which instructions a loop runs per trip, and where its waits sit. Plain Python at
import (the CuTe DSL is imported by sass_for's caller and disassemble).
"""
from __future__ import annotations

import glob
import os
import re
import tempfile
from typing import Optional


def instructions(sass: str, labels: dict | None = None) -> list[str]:
    """The whole instructions in order (FMUL R42, R42, R51.reuse), predicates (@P0) dropped;
    labels, if given, gets each label's index into the list."""
    ops = []
    for line in sass.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            if labels is not None:
                labels[m.group(1)] = len(ops)
            continue
        if "*/" in line:
            s = line.split("*/", 1)[1].strip().rstrip(";").strip()
            if not s:
                continue
            if s.startswith("@"):
                s = s.split(None, 1)[1] if " " in s else s
            ops.append(s)
    return ops


def loop_bodies(sass: str, operands: bool = False) -> list[tuple[str, list[str]]]:
    """[(label, [opcode, ...])] for every backward branch (a loop body: label .. branch).
    Predicates (@P0) are dropped; an opcode keeps its modifiers (HGMMA.64x128x16.F32.BF16).
    operands=True: whole instructions (FMUL R42, R42, R51.reuse) instead of opcodes."""
    labels: dict = {}
    ops = instructions(sass, labels)
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


def v_zero_trip(sass: str) -> tuple[list[str], int]:
    """(whole instructions of one trip, elements of V a thread sets to 0 per trip) of the decode /
    varlen forward's V zeroing (sm90/fwd.py _zero_v_past_keys): a loop of 2-byte shared-memory
    stores (the smallest loop body with STS.U16 and no wgmma: one element a trip), else one trip
    of 16-byte stores of zeros (the longest run of STS.128 [...], RZ: 8 elements each)."""
    bodies = [ops for _, ops in loop_bodies(sass, operands=True)
              if any(o.split()[0] == "STS.U16" for o in ops) and not any(o.startswith("HGMMA") for o in ops)]
    if bodies:
        return min(bodies, key=len), 1
    run, best = [], []
    for ins in instructions(sass):
        run = run + [ins] if re.fullmatch(r"STS\.128 \[[^]]*\], RZ", ins) else []
        best = run if len(run) > len(best) else best
    if not best:
        raise ValueError("no V zeroing in this SASS: no loop with STS.U16, no 16-byte stores of zeros")
    return best, 8 * len(best)


_NO_DEST = ("ST", "BRA", "BAR", "RED", "MEMBAR", "FENCE", "SYNCS", "EXIT", "RET", "CALL", "BSYNC", "BSSY", "NOP")


def _regs(text: str) -> list[str]:
    return re.findall(r"\b(U?R\d+|U?P\d)\b", text)


def dependent_chain(instrs: list[str]) -> int:
    """The longest chain of instructions in `instrs` (one loop trip, in order) each of which reads
    a register or predicate the one before it in the chain wrote: how many results one trip waits
    for in a row. An instruction writes its leading operands up to the first one it reads (a
    compare's one or two predicates, else the first register); stores, branches, barriers and
    fences write none. Values from before the trip start chains at 0."""
    depth: dict[str, int] = {}
    longest = 0
    for ins in instrs:
        op, _, rest = ins.partition(" ")
        operands = [x.strip() for x in rest.split(",")]
        if op.startswith(_NO_DEST) or not operands or not operands[0]:
            dests, srcs = [], operands
        elif "SETP" in op or op.startswith("PLOP3"):
            n = 0
            while n < len(operands) and re.fullmatch(r"U?P(\d|T)", operands[n].lstrip("!")):
                n += 1
            n = max(1, n - 1) if n == len(operands) else n
            dests, srcs = operands[:min(n, 2)], operands[min(n, 2):]
        else:
            dests, srcs = operands[:1], operands[1:]
        d = 1 + max([depth.get(r, 0) for x in srcs for r in _regs(x)], default=0)
        for x in dests:
            for r in _regs(x):
                depth[r] = d
        longest = max(longest, d)
    return longest


def around_pv_wait(loop: list[str]) -> tuple[list[str], list[str]]:
    """A KV loop's opcodes split at its waits: (between the S wait and the PV wait, from the PV
    wait on). The first two WARPGROUP.DEPBARs of the loop are those waits (wait_group 1, then 0)."""
    s_wait, pv_wait = [i for i, o in enumerate(loop) if o.startswith("WARPGROUP.DEPBAR")][:2]
    return loop[s_wait:pv_wait], loop[pv_wait:]


def sass_for(compile_call, arch: str, dump_dir: Optional[str] = None, cache=None, sources=()) -> str:
    """Run compile_call(options) (a cute.compile with fake tensors) for `arch` on the CPU and
    return the SASS of the cubin it writes. Shared by the SM90 and SM100 kernels.

    cache: (kind, config) naming the build for the on-disk SASS cache (compile_cache.py): kind a
    short name of what compile_call builds ("sm90_bwd_pre"), config its configuration (keyed by
    repr: a frozen dataclass); the text comes from the cache when it holds the build. sources:
    files the build imports besides fa4kernel's own (a benchmark kernel's module), keyed too.
    None: always compile (the cache cannot know what an unnamed compile_call builds). With
    dump_dir the compile always runs (its files are what is wanted) and the entry is rewritten."""
    if cache is None:
        return _compile_and_disassemble(compile_call, arch, dump_dir)
    from .compile_cache import cached

    kind, config = cache
    return cached(kind, arch, config, lambda: _compile_and_disassemble(compile_call, arch, dump_dir), sources,
                  refresh=dump_dir is not None)


def _compile_and_disassemble(compile_call, arch: str, dump_dir: Optional[str] = None) -> str:
    own_dir = dump_dir is None
    dump_dir = dump_dir or tempfile.mkdtemp(prefix="fa4kernel_sass_")
    os.makedirs(dump_dir, exist_ok=True)
    env_keys = ("CUTE_DSL_ARCH", "CUTE_DSL_KEEP", "CUTE_DSL_DUMP_DIR")
    saved = {k: os.environ.get(k) for k in env_keys}
    os.environ.update(CUTE_DSL_ARCH=arch, CUTE_DSL_KEEP="sass", CUTE_DSL_DUMP_DIR=dump_dir)
    try:
        compile_call(f"--gpu-arch {arch} --keep-cubin --dump-dir {dump_dir}")
    finally:
        for key, val in saved.items():
            if val is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = val
    try:
        cubins = sorted(glob.glob(os.path.join(dump_dir, "**", "*.cubin"), recursive=True),
                        key=os.path.getmtime)
        if not cubins:
            raise RuntimeError(f"no cubin written under {dump_dir}")
        return disassemble(cubins[-1], arch)
    finally:
        if own_dir:
            import shutil

            shutil.rmtree(dump_dir, ignore_errors=True)


def disassemble(cubin_path: str, arch: Optional[str] = None) -> str:
    """SASS text of a cubin with the nvdisasm the DSL itself would use (pip nvidia-cuda-nvdisasm).

    For sm_90a, -ndf (no dataflow analysis): nvdisasm drops it for these cubins anyway (it warns
    that it reads their ELF in the old format), so the text is the same, a third faster. On sm_100a
    the analysis names an indirect branch's targets (BRX ... BRANCH_TARGETS), which we keep."""
    import subprocess

    from cutlass.base_dsl.env_manager import _find_nvdisasm_binary

    flags = ["-c", "-ndf"] if arch == "sm_90a" else ["-c"]
    res = subprocess.run([_find_nvdisasm_binary(), *flags, cubin_path], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {res.stderr.strip()}")
    return res.stdout


def combine_in_flight(sass: str, splits_per_trip: int) -> float:
    """The splits whose partials the split-KV combine (sm90/combine.py) has in flight when it
    waits for the first of them: in its partial loop (the loop body with SHFL.IDX, LDG and
    FFMA), the global loads issued before the first FFMA over the loads of one split (the body's
    LDGs over the `splits_per_trip` splits a trip walks). ptxas weaves the loads between the adds
    as it likes, so this is what runs, not what the source asks for."""
    bodies = [ops for _, ops in loop_bodies(sass)
              if "SHFL.IDX" in ops and any(o.startswith("LDG") for o in ops) and "FFMA" in ops]
    if not bodies:
        raise ValueError("no loop with SHFL.IDX, LDG and FFMA in this SASS (the combine's partial loop)")
    body = min(bodies, key=len)
    loads = [i for i, o in enumerate(body) if o.startswith("LDG")]
    first_add = body.index("FFMA")
    per_split = len(loads) / splits_per_trip
    return sum(1 for i in loads if i < first_add) / per_split
