"""flash-attn-4's SM90 backward, compiled on the CPU: its Q-block loop's instruction counts for fa4sim.

    python3 lab/tools/fa4_bwd_sass.py --fa4-path DIR [--write]

Writes (with --write; else prints) fa4sim/implementations/flash-attn-4-sm90.sass.json, which the
implementation loader merges into flash-attn-4-sm90's backward constants (fa4sim/implementation.py):
loop_instr_per_kstep and loop_instr_fixed for every head dim its backward runs (32 to 256 in steps
of 32, and 192 / 128), causal and not.

How. FlashAttentionBackwardSm90 from the flash-attn-4 install at DIR (pip download flash-attn-4,
then pip install --no-deps --target DIR the wheel and quack-kernels) is built with the tile its
interface picks (interface.py _tile_size_bwd_sm90, read from its source), compiled for sm_90a
against fake tensors and disassembled (fa4kernel.sass.sass_for). Its innermost Q-block loop
(fa4kernel.sass.kv_loop: the smallest loop with HGMMA and MUFU.EX2) is counted per consumer
thread as lab/tools/sass_tables.py counts fa4kernel's (loop_counts). Where its two warpgroups run
loops of their own (hd96: dQ_single_wg, one computes dQ), that is the loop of the warpgroup
without dQ (hd96: 340 instructions against the dQ warpgroup's 397); fa4kernel's one loop holds
both warpgroups' branches. Counted:
  per_kstep  (HGMMA + uniform datapath) / HGMMA
  fixed      the rest that is not a pointwise instruction fa4sim counts itself (FFMA, FADD, FMUL,
             MUFU.EX2, F2FP, FSEL, SHFL, LDS, STSM, STS, ...), less the causal mask's one
             ISETP.GT.AND per score element where the build has one per element (fa4sim's
             mask_instr_per_element counts those)
Bad input: one line, exit 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PATH = os.path.join(ROOT, "fa4sim", "implementations", "flash-attn-4-sm90.sass.json")
GENERATED = "by python3 lab/tools/fa4_bwd_sass.py --write from the compiled kernels; do not edit"
HEAD_DIMS = [(d, d) for d in range(32, 257, 32)] + [(192, 128)]  # flash-attn-4-sm90.json's bwd head_dims
MASK_OP = "ISETP.GT.AND"


def _import(path: str):
    """FlashAttentionBackwardSm90 and the interface's tile choice from the install at `path`
    (loop_sass_peers.fa4_packages: without the packages' __init__s); quack.dsl is imported for its
    tensor indexing, which the kernel's code uses."""
    from loop_sass_peers import fa4_interface, fa4_packages

    fa4_packages(path)
    import quack.dsl  # noqa: F401
    from flash_attn.cute.flash_bwd_sm90 import FlashAttentionBackwardSm90

    return FlashAttentionBackwardSm90, fa4_interface(path, "BwdConfig", "_tile_size_bwd_sm90")["_tile_size_bwd_sm90"]


def compile_sass(hd: int, hdv: int, causal: bool, path: str) -> tuple[object, str]:
    """(the interface's BwdConfig, the SASS) of flash-attn-4's SM90 backward at this head dim."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    from fa4kernel.sass import sass_for

    bwd_cls, tile_size = _import(path)
    from flash_attn.cute.utils import AuxData

    cfg = tile_size(hd, hdv, causal, False)

    def build(options):
        b, s, h, sr, n = (cute.sym_int() for _ in range(5))
        rows = lambda d: make_fake_tensor(  # noqa: E731
            cutlass.BFloat16, (b, s, h, d), stride=tuple(cute.sym_int64(divisibility=8) for _ in range(3)) + (1,),
            assumed_align=16)
        stats = lambda m: make_fake_tensor(  # noqa: E731
            cutlass.Float32, (b, h, m), stride=(cute.sym_int64(divisibility=4), cute.sym_int64(divisibility=4), 1),
            assumed_align=16)
        q, k, do, dk = rows(hd), rows(hd), rows(hdv), rows(hd)
        v, dv = rows(hdv), rows(hdv)
        kernel = bwd_cls(cutlass.BFloat16, hd, hdv, 1, causal, is_local=False, deterministic=False,
                         tile_m=cfg.m_block_size, tile_n=cfg.n_block_size, Q_stage=cfg.num_stages_Q,
                         dO_stage=cfg.num_stages_dO, PdS_stage=cfg.num_stages_PdS, SdP_swapAB=cfg.SdP_swapAB,
                         dKV_swapAB=cfg.dKV_swapAB, dQ_swapAB=cfg.dQ_swapAB, AtomLayoutMSdP=cfg.AtomLayoutMSdP,
                         AtomLayoutNdKV=cfg.AtomLayoutNdKV, AtomLayoutMdQ=cfg.AtomLayoutMdQ,
                         num_threads=(cfg.num_wg + 1) * 128, V_in_regs=False, score_mod=None, score_mod_bwd=None,
                         mask_mod=None, has_aux_tensors=False, q_subtile_factor=1, dQ_single_wg=cfg.dQ_single_wg)
        # the interface's positional order: ..., softmax scale, cu_seqlens q/k, seqused q/k, window
        # left/right, dQ/dK/dV semaphores, aux data, block sparsity, cu_total_m_blocks, stream
        cute.compile(kernel, q, k, v, do, stats(sr), stats(sr), stats(n), dk, dv, 1.0 / math.sqrt(hd), None, None,
                     None, None, None, None, None, None, None, AuxData(None, None), None, None,
                     cute.runtime.make_fake_stream(), options=options)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cfg, sass_for(build, "sm_90a")


def row(hd: int, hdv: int, causal: bool, path: str) -> dict:
    from fa4kernel.sass import kv_loop
    from sass_tables import loop_counts

    cfg, sass = compile_sass(hd, hdv, causal, path)
    c = loop_counts(sass)
    elements = cfg.m_block_size * cfg.n_block_size // (cfg.num_wg * 128)  # scores per consumer thread
    mask = sum(op.startswith(MASK_OP) for op in kv_loop(sass))
    per_element_mask = elements if causal and mask >= elements else 0
    tile = f"{cfg.m_block_size} x {cfg.n_block_size}"
    return {"build": {"hdim": hd, "hdim_v": hdv, "causal": causal},
            "compiled_from": f"_tile_size_bwd_sm90({hd}, {hdv}, {causal}, False): {tile}, SdP_swapAB="
                             f"{cfg.SdP_swapAB}, dKV_swapAB={cfg.dKV_swapAB}",
            "per_kstep": round((c["hgmma"] + c["uniform"]) / c["hgmma"], 2),
            "fixed": c["other"] - per_element_mask}


def document(path: str, version: str) -> dict:
    rows = []
    for hd, hdv in HEAD_DIMS:
        for causal in (False, True):
            print(f"# hd{hd}/{hdv} causal={causal}", file=sys.stderr, flush=True)
            rows.append(row(hd, hdv, causal, path))
    source = (f"flash-attn-4 {version} SM90 backward (FlashAttentionBackwardSm90) compiled for sm_90a on the CPU with "
              f"fake tensors and its interface's tile (nvidia-cutlass-dsl 4.8.1), its innermost Q-block loop per "
              f"consumer thread, counted statically (lab/tools/fa4_bwd_sass.py): per_kstep (HGMMA + uniform "
              f"datapath) / HGMMA, fixed the rest less the pointwise instructions fa4sim counts itself and the "
              f"causal mask's per-element ISETP")
    return {"generated": GENERATED,
            "bwd": {"loop_instr_sass": {"source": source,
                                        "columns": {"loop_instr_per_kstep": "per_kstep", "loop_instr_fixed": "fixed"},
                                        "keys": ["hdim", "hdim_v", "causal"], "fallbacks": [], "rows": rows}}}


def _bad(msg: str):
    print(f"fa4_bwd_sass.py: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fa4-path", required=True, help="the folder holding flash-attn-4's flash_attn/ and quack/")
    ap.add_argument("--write", action="store_true", help=f"write {os.path.relpath(PATH, ROOT)} (default: print it)")
    args = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(args.fa4_path, "flash_attn", "cute", "flash_bwd_sm90.py")):
        _bad(f"--fa4-path {args.fa4_path}: no flash_attn/cute/flash_bwd_sm90.py under it")
    if not os.path.isdir(os.path.join(args.fa4_path, "quack")):
        _bad(f"--fa4-path {args.fa4_path}: no quack/ beside flash_attn/ (pip install --no-deps --target DIR "
             f"quack-kernels)")
    dist = [d for d in os.listdir(args.fa4_path) if d.startswith("flash_attn_4-") and d.endswith(".dist-info")]
    version = dist[0][len("flash_attn_4-"):-len(".dist-info")] if dist else "(version unknown)"
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"  # FA4's classes read the target arch when they are built
    text = json.dumps(document(args.fa4_path, version), indent=1) + "\n"
    if args.write:
        with open(PATH, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(PATH, ROOT)}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
