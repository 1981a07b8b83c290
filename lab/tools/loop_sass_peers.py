"""Three SM90 forward KV loops side by side: static SASS opcode counts per KV block (CPU only).

    python3 lab/tools/loop_sass_peers.py --hdims 128,256 --both --out FILE.json
    python3 lab/tools/loop_sass_peers.py --ours-knobs 128:tile_n=160 --fa3-so SO --fa4-path DIR

What it measures. Each consumer warpgroup of an attention forward runs one trip of its KV loop per
KV block (tile_n keys of K and V): the S GEMM (HGMMA), the online softmax (FMNMX, FFMA / FADD /
FMUL, MUFU.EX2), the P pack (F2FP), the PV GEMM, and the waits (WARPGROUP.DEPBAR for wgmma
groups, SYNCS for mbarriers). Static counts of that one loop body, over tile_n, say how many
instructions a warp issues per key besides the tensor cores: where one kernel spends more than
another, and whether that is softmax math or integer / uniform bookkeeping. Kernels:
  ours          fa4kernel.compile_sass (the defaults, and each --ours-knobs build)
  flash-attn-4  flash_attn/cute/flash_fwd_sm90.py, compiled here for sm_90a with fake tensors and the
                tile its interface picks (_tile_size_fwd_sm90); no LSE, no pack_gqa, as inference runs it
  FA3           the plain bf16 kernel of FlashAttention-3's library (cubins in _C.abi3.so's .nv_fatbin),
                chosen by the mainloop's template arguments; non-causal: the 2x1 cluster kernel a long
                launch with an even number of Q tiles runs (the 1x1 one is listed as an alternative)

How the KV loop is found. A loop is a backward branch; latches after the kernel's last EXIT are not
loops but the out-of-line retry paths of mbarrier waits, which jump back into the body. The KV loop
candidates are the innermost loops holding both HGMMA and MUFU.EX2 (the persistent tile loop
contains them); the steady loop is the one with the most HGMMA (a whole block: S and PV GEMMs), the
fewest instructions among those (masked loops add masking). Every candidate is printed. Waits: the
position of each WARPGROUP.DEPBAR and SYNCS in the loop, as the number of MUFU.EX2 issued before it.
Bad input: one line, exit 2; a peer that cannot be built leaves its row with the reason.
"""
from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from lab.tools.fa3_cubins import fa3_kernels, fa3_pick, function_sass  # noqa: E402

FA3_VERSION = "3.0.0.post20260810"  # tokenspeed-fa3, the FlashAttention-3 build the GPU runs
FA3_SO = "/tmp/fa3/flash_attn_3/_C.abi3.so"
PEER_HEAD_DIMS = (64, 128, 192, 256)  # the head dims all three kernels build (FA3's package has no hd96)
COLUMNS = ("HGMMA", "MUFU.EX2", "FMNMX", "FFMA", "FADD", "FMUL", "F2FP", "PRMT", "SHFL", "SYNCS", "BAR",
           "WG.ARRIVE", "WG.DEPBAR", "bookkeeping", "other")
# integer, uniform-datapath and predicate ops (PRMT, a byte permute, has its own column: it packs P)
BOOKKEEPING = re.compile(r"^(I[A-Z0-9]+|U[A-Z0-9]+|LOP3|SHF|SEL|MOV|LEA|VIADD|PLOP3|P2R|R2P|R2UR|S2R|S2UR|CS2R)$")


# ------------------------------------------------------------------ the loops
def loops(sass: str) -> list:
    """[{label, start, end, ops}] for each backward branch before the function's last EXIT (later
    ones are wait retry paths, not loops); ops: instruction texts of label .. branch, no predicates."""
    labels, ops, exits = {}, [], []
    for line in sass.splitlines():
        if m := re.match(r"^(\.L_x_\d+):", line.strip()):
            labels[m.group(1)] = len(ops)
        elif "*/" in line and (t := line.split("*/", 1)[1].strip().rstrip(";").strip()):
            t = t.split(None, 1)[1] if t.startswith("@") else t
            exits += [len(ops)] if t.startswith("EXIT") else []
            ops.append(t)
    last = max(exits, default=len(ops))
    return [{"label": m.group(1), "start": labels[m.group(1)], "end": k, "ops": ops[labels[m.group(1)]:k + 1]}
            for k, t in enumerate(ops) if t.startswith("BRA") and k < last
            and (m := re.search(r"\((\.L_x_\d+)\)", t)) and m.group(1) in labels and labels[m.group(1)] <= k]


def column(op: str) -> str:
    base = op.split(".")[0]
    return ("MUFU.EX2" if op.startswith("MUFU.EX2") else "WG.ARRIVE" if op.startswith("WARPGROUP.ARRIVE")
            else "WG.DEPBAR" if op.startswith("WARPGROUP.DEPBAR") else base if base in COLUMNS
            else "bookkeeping" if BOOKKEEPING.match(base) else "other")


def summarise(body: list, tile_n: int) -> dict:
    """Counts of one loop trip by column, every opcode, and the waits: each WARPGROUP.DEPBAR and
    SYNCS with its index in the body and the number of MUFU.EX2 issued before it."""
    ops = [t.split()[0] for t in body]
    cols, hist = dict.fromkeys(COLUMNS, 0), {}
    waits, ex2 = [], 0
    for i, (o, t) in enumerate(zip(ops, body)):
        cols[column(o)] += 1
        hist[o] = hist.get(o, 0) + 1
        ex2 += o.startswith("MUFU.EX2")
        if o.startswith(("WARPGROUP.DEPBAR", "SYNCS")):
            waits.append({"at": i, "ex2_before": ex2, "instr": t})
    return {"tile_n": tile_n, "instructions": len(ops), "per_key": round(len(ops) / tile_n, 3), "counts": cols,
            "opcodes": dict(sorted(hist.items())), "waits": waits}


def kv_loop(sass: str, tile_n: int) -> dict:
    """The steady KV loop (module docstring) summarised, with every candidate loop."""
    def n(lp, op):
        return sum(t.startswith(op) for t in lp["ops"])
    cands = [lp for lp in loops(sass) if n(lp, "HGMMA") and n(lp, "MUFU.EX2")]
    inner = [lp for lp in cands if not any(o is not lp and lp["start"] <= o["start"] and o["end"] <= lp["end"]
                                           for o in cands)]
    if not inner:
        raise ValueError("no loop with both HGMMA and MUFU.EX2")
    most = max(n(lp, "HGMMA") for lp in inner)
    steady = min((lp for lp in inner if n(lp, "HGMMA") == most), key=lambda lp: len(lp["ops"]))
    return {"label": steady["label"], **summarise(steady["ops"], tile_n),
            "candidates": [{"label": lp["label"], "instructions": len(lp["ops"]), "HGMMA": n(lp, "HGMMA"),
                            "MUFU.EX2": n(lp, "MUFU.EX2"), "innermost": lp in inner, "steady": lp is steady}
                           for lp in cands]}


# ------------------------------------------------------------------ the three builds
def build_ours(hd: int, causal: bool, knobs: dict) -> dict:
    import fa4kernel
    from fa4kernel.sm90.config import make_config

    cfg = make_config("bfloat16", hd, causal, False, dict(knobs))
    sass = fa4kernel.compile_sass(head_dim=hd, causal=causal, **knobs)
    return {"name": f"fa4kernel {cfg!r}", "tile_m": cfg.tile_m, **kv_loop(sass, cfg.tile_n)}


def fa4_packages(path: str) -> None:
    """Make flash-attn-4's install at `path` importable without the packages' __init__s (they
    import the torch-facing API and its autotuner, which a compile does not need)."""
    for name in ("flash_attn", "flash_attn.cute", "quack"):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [os.path.join(path, *name.split("."))]
            sys.modules[name] = mod
    sys.path.insert(0, path)


def fa4_interface(path: str, *names: str) -> dict:
    """The named top-level definitions of flash-attn-4's interface.py (its tile choices), read from
    its source: importing interface.py needs triton."""
    src = open(os.path.join(path, "flash_attn", "cute", "interface.py")).read()
    keep = [n for n in ast.parse(src).body if getattr(n, "name", "") in names]
    from dataclasses import dataclass
    ns = {"dataclass": dataclass}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "interface.py", "exec"), ns)
    return ns


def _fa4_import(path: str):
    """flash-attn-4's SM90 forward class and its interface's tile choice."""
    fa4_packages(path)
    from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90

    return FlashAttentionForwardSm90, fa4_interface(path, "FwdConfig", "_tile_size_fwd_sm90")["_tile_size_fwd_sm90"]


def build_fa4(hd: int, causal: bool, path: str) -> dict:
    import cutlass
    import cutlass.cute as cute
    import torch
    from fa4kernel.sass import sass_for

    fwd_cls, tile_size = _fa4_import(path)
    from flash_attn.cute.cute_dsl_utils import to_cute_tensor
    from flash_attn.cute.utils import AuxData

    cfg = tile_size(hd, hd, causal, False)
    tm, tn = cfg.m_block_size, cfg.n_block_size

    def build(options):
        # CPU tensors through FA4's own conversion: dynamic layouts, unit stride last, as its JIT marks them
        q, k, v, o = (to_cute_tensor(torch.empty(1, 256, 1, hd, dtype=torch.bfloat16), enable_tvm_ffi=False)
                      for _ in range(4))
        kernel = fwd_cls(cutlass.BFloat16, hd, hd, 1, is_causal=causal, is_local=False, pack_gqa=False,
                         tile_m=tm, tile_n=tn, num_stages=2, num_threads=384, Q_in_regs=False,
                         intra_wg_overlap=cfg.intra_wg_overlap, mma_pv_is_rs=cfg.mma_pv_is_rs, mask_mod=None,
                         score_mod=None, has_aux_tensors=False, q_subtile_factor=1, paged_kv_non_tma=False)
        # the interface's positional order: lse, scale, cu_seqlens q/k, seqused q/k, page table, window
        # left/right, learnable sink, block sparsity, aux data, cu_total_m_blocks, ..splits.., stream
        cute.compile(kernel, q, k, v, o, None, 1.0 / math.sqrt(hd), None, None, None, None, None, None, None,
                     None, None, AuxData(None, None), None, None, cute.runtime.make_fake_stream(), options=options)

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # AuxData is passed as a compile-time constant
        sass = sass_for(build, "sm_90a")
    name = f"FlashAttentionForwardSm90 {tm}x{tn} rs={cfg.mma_pv_is_rs} overlap={cfg.intra_wg_overlap}"
    return {"name": name, "tile_m": tm, **kv_loop(sass, tn)}


_FA3 = {}


def build_fa3(hd: int, causal: bool, so_path: str) -> dict:
    from fa4kernel.sass import disassemble

    if not os.path.isfile(so_path):
        raise ValueError(f"no FlashAttention-3 library at {so_path} (--fa3-so)")
    if so_path not in _FA3:
        _FA3[so_path] = fa3_kernels(so_path)
    picked = fa3_pick(_FA3[so_path], hd, causal)
    if not picked:
        raise ValueError(f"no plain bf16 hd{hd} {'causal' if causal else 'non-causal'} kernel in {so_path}")
    rows = []
    for cub, name, cfg in picked:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
            fh.write(cub)
            fh.flush()
            sass = function_sass(disassemble(fh.name), name)
        rows.append({"name": name, "config": cfg, "tile_m": cfg["tile_m"], **kv_loop(sass, cfg["tile_n"])})
    first = rows[0]
    first["alternatives"] = [{k: r[k] for k in ("name", "config", "instructions", "per_key", "counts", "waits")}
                             for r in rows[1:]]
    return first


# ------------------------------------------------------------------ the command line
def _bad(msg: str):
    print(f"loop_sass_peers: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse_knobs(item: str) -> tuple:
    """'[HD:]KNOB=VALUE[,KNOB=VALUE]' -> (head dim or None for every one, {knob: value})."""
    hd, sep, rest = item.partition(":")
    knobs = {}
    for kv in (rest if sep else item).split(","):
        key, eq, val = (x.strip() for x in kv.partition("="))
        if not (eq and key and val and (hd.isdigit() or not sep)):
            raise ValueError(f"--ours-knobs {item!r}: want [HD:]KNOB=VALUE[,KNOB=VALUE], e.g. 128:tile_n=160")
        try:
            knobs[key] = ast.literal_eval({"true": "True", "false": "False"}.get(val.lower(), val))
        except (ValueError, SyntaxError):
            knobs[key] = val
    return (int(hd) if sep else None), knobs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hdims", default="64,128,256", help="head dims, comma-separated: 64, 128, 192, 256 "
                    "(default 64,128,256)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--causal", action="store_true", help="causal kernels only (default: non-causal only)")
    mode.add_argument("--both", action="store_true", help="non-causal and causal kernels")
    ap.add_argument("--fa3-so", default=FA3_SO, help=f"FlashAttention-3's flash_attn_3/_C.abi3.so (default {FA3_SO})")
    ap.add_argument("--fa4-path", help="the folder holding flash-attn-4's flash_attn/ and quack/ (pip install "
                                       "--no-deps --target DIR; default: the importable flash_attn's)")
    ap.add_argument("--ours-knobs", action="append", default=[], metavar="[HD:]KNOB=VALUE[,...]",
                    help="an extra non-causal fa4kernel build with these knobs (fa4kernel/README.md), at every "
                         "head dim or at HD only (128:tile_n=160); repeatable")
    ap.add_argument("--out", help="write every count, the command line and the versions as JSON")
    args = ap.parse_args(argv)
    try:
        hdims = [int(h) for h in args.hdims.split(",")]
        extra = [parse_knobs(item) for item in args.ours_knobs]
    except ValueError as e:
        _bad(str(e) if "ours-knobs" in str(e) else f"--hdims {args.hdims!r}: want integers, e.g. 64,128,256")
    if bad := [h for h in hdims if h not in PEER_HEAD_DIMS]:
        _bad(f"--hdims {bad}: the peers are compared at {', '.join(map(str, PEER_HEAD_DIMS))}")
    from fa4kernel.sm90.config import make_config
    for h, k in extra:
        for hd in [hd for hd in hdims if h in (None, hd)]:
            try:
                make_config("bfloat16", hd, False, False, dict(k))
            except ValueError as e:
                _bad(f"--ours-knobs {k} at hd{hd}: {str(e).splitlines()[0]}")
    spec = importlib.util.find_spec("flash_attn") if args.fa4_path is None else None
    fa4_path = args.fa4_path or (os.path.dirname(list(spec.submodule_search_locations)[0]) if spec else None)
    if args.fa4_path and not os.path.isfile(os.path.join(args.fa4_path, "flash_attn", "cute", "flash_fwd_sm90.py")):
        _bad(f"--fa4-path {args.fa4_path}: no flash_attn/cute/flash_fwd_sm90.py under it")
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"  # FA4's classes read the target arch when they are built
    jobs = []
    for hd in hdims:
        for causal in (False, True) if args.both else (args.causal,):
            jobs += [("fa4kernel", hd, causal, {})] + [("fa4kernel", hd, causal, k) for h, k in extra
                                                       if h in (None, hd) and not causal]
            jobs += [("flash-attn-4", hd, causal, {}), ("FA3", hd, causal, {})]
    rows = []
    for kernel, hd, causal, knobs in jobs:
        row = {"kernel": kernel, "hdim": hd, "causal": causal, "knobs": knobs}
        try:
            if kernel == "fa4kernel":
                row.update(build_ours(hd, causal, knobs))
            elif kernel == "FA3":
                row.update(build_fa3(hd, causal, args.fa3_so))
            elif fa4_path is None:
                raise ValueError("flash-attn-4 not importable; give --fa4-path")
            else:
                row.update(build_fa4(hd, causal, fa4_path))
        except Exception as e:  # a peer that cannot be built: its row says why, the rest still runs
            row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:200]
        rows.append(row)
        print(_line(row), flush=True)
    _report(rows)
    if args.out:
        _write(args.out, rows, sys.argv[1:] if argv is None else argv, fa4_path)
    return 0


def _line(row: dict) -> str:
    what = f"{row['kernel']:<12} hd{row['hdim']:<3} {'causal' if row['causal'] else 'full  '} " + \
        (",".join(f"{k}={v}" for k, v in row["knobs"].items()) or "-").ljust(10)
    if "error" in row:
        return f"{what} {row['error']}"
    c = row["counts"]
    deps = ",".join(str(w["ex2_before"]) for w in row["waits"] if w["instr"].startswith("WARPGROUP.DEPBAR"))
    return (f"{what} {row['tile_m']:>3}x{row['tile_n']:<4}{row['instructions']:>5} {row['per_key']:>6.2f} "
            + " ".join(f"{c[k]:>{max(len(k), 3)}}" for k in COLUMNS) + f"  {deps}/{c['MUFU.EX2']}")


def _report(rows: list):
    print("\n" + "kernel".ljust(12) + " hd    mask   knobs      tile      ins  /key  "
          + " ".join(k.rjust(max(len(k), 3)) for k in COLUMNS) + "  EX2 before each DEPBAR/EX2")
    for row in rows:
        print(_line(row))
    print("\nloop candidates (innermost with HGMMA and MUFU.EX2; * = the steady KV loop):")
    for row in rows:
        cands = " ".join(f"{c['label']}:{c['instructions']}ins/{c['HGMMA']}hgmma/{c['MUFU.EX2']}ex2"
                         + ("*" if c["steady"] else "") + ("" if c["innermost"] else "(outer)")
                         for c in row.get("candidates", []))
        print(f"  {row['kernel']:<12} hd{row['hdim']:<3} {'causal' if row['causal'] else 'full  '} "
              f"{','.join(f'{k}={v}' for k, v in row['knobs'].items()) or '-':<10} {cands or row.get('error', '')}")


def _write(path: str, rows: list, argv: list, fa4_path):
    from importlib import metadata

    from lab.tools.provenance import stamp

    fa4 = [d.version for d in metadata.distributions(path=[fa4_path]) if d.metadata["Name"] == "flash-attn-4"] \
        if fa4_path else []
    meta = stamp({"device": "cpu (static SASS, compiled for sm_90a)", "date": datetime.date.today().isoformat(),
                  "what": " ".join(__doc__.split("\n\n")[1].split()),
                  "command": " ".join(["python3", "lab/tools/loop_sass_peers.py", *argv]),
                  "versions": {"nvidia_cutlass_dsl": metadata.version("nvidia-cutlass-dsl"),
                               "flash_attn_4": fa4[0] if fa4 else None, "tokenspeed_fa3": FA3_VERSION}}, "loop_sass")
    with open(path, "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
