"""CPU-only: compile every calibration microbenchmark for sm_90a (fake tensors) and check that
its SASS holds the instruction it means to measure, at the expected count.

    CUTE_DSL_ARCH=sm_90a python3 -m lab.tools.calibrate.check_sass
"""
from __future__ import annotations

import sys

from . import bench_launch, bench_pipes, bench_smem, bench_sync, bench_tma, bench_wgmma
from .common import run_sass_checks


def cases():
    for op, opcode in bench_pipes.OPS.items():
        for mode, cfg in bench_pipes.CONFIGS.items():
            yield (f"pipes_{op}_{mode}", lambda op=op, cfg=cfg: (bench_pipes.make(op, **cfg), bench_pipes.fake_args()),
                   {opcode: cfg["chains"] * cfg["unroll"]})
    yield ("smem_bw", lambda: (bench_smem.make_bw(), bench_smem.fake_args()), {"LDS.128": bench_smem.UNROLL})
    yield ("smem_chase", lambda: (bench_smem.make_chase(), bench_smem.fake_args()), {"LDS": bench_smem.CHASE_STEPS})
    shapes = [(n, rs) for n in bench_wgmma.NS for rs in (False, True)]
    shapes += [(n, False) for n in bench_wgmma.ODD_NS if n not in bench_wgmma.NS]
    for n, rs in shapes:
        yield (f"wgmma_{'rs' if rs else 'ss'}_n{n}", lambda n=n, rs=rs: (bench_wgmma.make(n, rs), bench_wgmma.fake_args()),
                   {f"HGMMA.64x{n}x16.F32.BF16": bench_wgmma.KB + sum(bench_wgmma.NKS), "STL": 0})
    for fence, arrives, f2fp in (("each", 17, 0), ("each_write", 17, 32), ("mixed", 25, 32)):  # + 9 latency samples
        yield (f"wgmma_rs_n192_{fence}", lambda fence=fence: (bench_wgmma.make(192, True, fence), bench_wgmma.fake_args()),
               {"HGMMA.64x192x16.F32.BF16": bench_wgmma.KB + sum(bench_wgmma.NKS), "WARPGROUP.ARRIVE": arrives,
                "F2FP.BF16.F32.PACK_AB": f2fp, "STL": 0})
    yield ("tma", lambda: (bench_tma.make(), bench_tma.fake_args()), {"UTMALDG.2D": 8 + 2 * 24, "SYNCS.ARRIVE.TRANS64": 2})
    yield ("sync", lambda: (bench_sync.make(), bench_sync.fake_args()), {"BAR.ARV": 2, "SYNCS.ARRIVE": 4})
    yield ("launch", lambda: (bench_launch.make(), bench_launch.fake_args()), {})
    yield ("launch_pdl", lambda: (bench_launch.make(pdl=True), bench_launch.fake_args()), {"ACQBULK": 1, "PREEXIT": 1})


def main() -> int:
    return run_sass_checks(cases())


if __name__ == "__main__":
    sys.exit(main())
