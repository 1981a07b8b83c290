"""Where ptxas puts the PV wait in each build: the SASS table behind fa4sim's pv_wait=compiled.

    CUTE_DSL_ARCH=sm_90a python3 lab/tools/pv_wait_sass.py            # fa4kernel's builds (~1 min, CPU)
    python3 lab/tools/pv_wait_sass.py --cubin DIR [DIR ...] --hdim H [--causal]  # flash-attn-4 cubins

For every fa4kernel build the benchmark and the validation use (lab/tools/sass_tables.py
FWD_BUILDS: the defaults of hd 64 / 96 / 128 / 192 / 256, causal and not, and the hd128 knob
variants), compiles the kernel for sm_90a with fake tensors, splits its KV loop at the wait for
the previous block's PV GEMM (fa4kernel.sass.around_pv_wait) and prints, per pipe, the share of
the block's softmax instructions issued before that wait: the rows of fa4kernel's generated
`pv_wait_sass` table (fa4sim/implementations/fa4kernel-sm90.sass.json, which
lab/tools/sass_tables.py --write writes). With --cubin it reads cubins that flash-attn-4
compiled (its JIT with --keep-cubin, for sm_90a with fake tensors) instead, for the hand-kept
table of flash-attn-4-sm90.json.

With --rescale it prints, per build that rescales O after the PV wait, the share of the rescale's
FMULs that lie among the exp2s, not after the last MUFU.EX2 (lab/findings/pv-wait-placement.md,
"The O rescale's position"; the fa3 schedule keeps the rescale after the exp2s).

    CUTE_DSL_ARCH=sm_90a python3 lab/tools/pv_wait_sass.py --rescale                # fa4kernel's builds
    python3 lab/tools/pv_wait_sass.py --rescale --cubin DIR --hdim H                 # flash-attn-4 cubins
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PIPES = {"max": ("FMNMX",), "fma": ("FFMA", "FADD"), "mufu": ("MUFU",)}


def split(sass: str, dv: int = 0) -> dict:
    """{'max', 'fma', 'mufu'}: the fraction of each pipe's softmax instructions before the PV wait."""
    from fa4kernel.sass import around_pv_wait, kv_loop

    before, after = around_pv_wait(kv_loop(sass))
    b = collections.Counter(o.split(".")[0] for o in before)
    a = collections.Counter(o.split(".")[0] for o in after)
    out = {}
    for pipe, ops in PIPES.items():
        n_b, n_a = sum(b[o] for o in ops), sum(a[o] for o in ops)
        out[pipe] = round(n_b / (n_b + n_a), 3) if n_b + n_a else 0.0
    return out


def rescale_share(sass: str, dv: int) -> float | None:
    """The share of the O rescale's FMULs (dv / 2 per thread) that lie among the exp2s: 1 - the
    FMULs after the block's last MUFU.EX2 over dv / 2 (the softmax's own few FMULs sit before
    it). None where fewer than dv / 2 FMULs follow the PV wait: the rescale is before the PV GEMM."""
    from fa4kernel.sass import around_pv_wait, kv_loop

    _, after = around_pv_wait(kv_loop(sass))
    fmul = [i for i, o in enumerate(after) if o.split(".")[0] == "FMUL"]
    if len(fmul) < dv // 2:
        return None
    last_ex2 = max(i for i, o in enumerate(after) if o.startswith("MUFU.EX2"))
    return round(1.0 - min(1.0, sum(i > last_ex2 for i in fmul) / (dv // 2)), 3)


def fa4kernel_rows(measure=None) -> list[tuple[dict, object]]:
    """(build, measure(sass, hdim)) for each of fa4kernel's builds in the generated table."""
    import fa4kernel
    from fa4kernel import make_config

    from lab.tools.sass_tables import FWD_BUILDS

    measure = measure or split
    rows = []
    for hd, causal, knobs in FWD_BUILDS:
        print(f"# {({'hdim': hd, 'causal': causal, **knobs})}", file=sys.stderr, flush=True)
        cfg = make_config("bfloat16", hd, causal, False, dict(knobs))
        rows.append(({"hdim": hd, "causal": causal, **knobs}, measure(fa4kernel.compile_sass(cfg, arch="sm_90a"), hd)))
    return rows


def cubin_rows(dirs: list[str], hdim: int, causal: bool | None = None, measure=None) -> list[tuple[dict, object]]:
    from cutlass.base_dsl.env_manager import _find_nvdisasm_binary

    measure = measure or split
    rows = []
    for d in dirs:
        for cub in sorted(glob.glob(os.path.join(d, "*.cubin"))):
            sass = subprocess.run([_find_nvdisasm_binary(), "-c", cub], capture_output=True, text=True,
                                  check=True).stdout
            build = {"hdim": hdim} if causal is None else {"hdim": hdim, "causal": causal}
            rows.append((build, measure(sass, hdim)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cubin", nargs="*", help="directories of flash-attn-4 cubins (one head dim)")
    ap.add_argument("--hdim", type=int, help="the head dim of those cubins")
    ap.add_argument("--causal", action="store_true", help="those cubins are causal builds (the row says so)")
    ap.add_argument("--rescale", action="store_true",
                    help="instead: per build, the share of the O rescale's FMULs that lie among the exp2s "
                         "(builds that rescale before the PV GEMM are left out)")
    args = ap.parse_args(argv)
    if args.cubin and args.hdim is None:
        ap.error("--cubin needs --hdim (the rows are keyed by head dim)")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    measure, key = (rescale_share, "among") if args.rescale else (split, "before")
    rows = (cubin_rows(args.cubin, args.hdim, True if args.causal else None, measure) if args.cubin
            else fa4kernel_rows(measure))
    table = [{"build": build, key: v} for build, v in rows if v is not None]
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
