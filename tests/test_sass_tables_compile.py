"""CPU-only: the SASS facts fa4sim keeps as data still match what the compiler makes.

- where the O rescale of fa4kernel's builds lies (lab/tools/pv_wait_sass.py --rescale); the
  generated tables of fa4kernel-sm90.sass.json are tests/test_sass_tables_generated.py's.
- lab/tools/calibrate/bench_bursts.py: its burst loops hold exactly the instructions it times.
- lab/tools/calibrate/bench_wgmma.py and bench_power.py at the N of odd tiles (112, 192), and
  bench_wgmma's fenced chains.
- lab/tools/calibrate/bench_contention.py: its wgmma loops hold 8 HGMMAs, its softmax loops the
  planned instructions; the intra kernel's trip stamps sit outside the HGMMAs and the mix.

Run: pytest -m compile tests/test_sass_tables_compile.py
"""
import pytest

pytest.importorskip("cutlass")

import fa4kernel  # noqa: E402
from fa4kernel import make_config  # noqa: E402

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("hdim, causal, among", [(128, False, 0.0), (64, False, 0.0), (64, True, 1.0), (256, False, None)])
def test_where_the_o_rescale_lies(hdim, causal, among):
    """The fa3 schedule issues the O rescale after the exp2s, as fa4kernel's hd128 and hd64 builds
    do; ptxas puts hd64 causal's among them (as flash-attn-4's at hd 64 and 128), and hd256
    rescales before the PV GEMM (lab/findings/pv-wait-placement.md, "The O rescale's position")."""
    from lab.tools.pv_wait_sass import rescale_share

    # always rescaling (conditional rescaling, the default, puts it before the PV GEMM everywhere)
    cfg = make_config("bfloat16", hdim, causal, False, {"rescale_threshold": None})
    got = rescale_share(fa4kernel.compile_sass(cfg, arch="sm_90a"), hdim)
    assert got == (None if among is None else pytest.approx(among, abs=0.05))


@pytest.mark.parametrize("n", [112, 192])
def test_wgmma_at_the_n_of_odd_tiles_compiles_to_that_hgmma(n):
    """bench_wgmma's run at the N of hd96 / hd192 tiles (ODD_NS) times HGMMA.64xNx16 itself,
    without spills; bench_power's capped load at that N keeps its wgmma loop."""
    from lab.tools.calibrate import bench_power, bench_wgmma
    from lab.tools.calibrate.common import run_sass_checks

    assert n in bench_wgmma.ODD_NS
    case = (f"wgmma_ss_n{n}", lambda: (bench_wgmma.make(n, False), bench_wgmma.fake_args()),
            {f"HGMMA.64x{n}x16.F32.BF16": bench_wgmma.KB + sum(bench_wgmma.NKS), "STL": 0})
    assert run_sass_checks([case]) == 0
    assert bench_power.LOADS[f"tensor{n}"][2] == n and bench_power.check_build("sleep", n, False, False)[0]


@pytest.mark.parametrize("hdim, knobs", [(128, {}), (192, {}), (256, {"tile_n": 80})])
def test_kv_loop_fences_once_per_gemm(hdim, knobs):
    """fa4kernel's KV loop fences the wgmma registers once per GEMM at every tile shape: P converts
    one cvt per pair (fa4kernel/convert.py). With the DSL's own conversion, at 112 keys (hd192) and
    80 ptxas rebuilt P's registers and fenced before each HGMMA of the P V GEMM, each starting ~25
    cycles after the previous one ended (lab/findings/fenced-rs-wgmma.md)."""
    from fa4kernel.sass import kv_loop

    loop = kv_loop(fa4kernel.compile_sass(make_config("bfloat16", hdim, False, False, knobs), arch="sm_90a"))
    assert sum(op == "WARPGROUP.ARRIVE" for op in loop) == 2
    assert not any(op.startswith("PRMT") for op in loop)  # no pairs joined by hand


@pytest.mark.parametrize("fence, arrives, converts", [("group", 10, 0), ("each_write", 17, 32), ("mixed", 25, 32)])
def test_fenced_wgmma_chains_compile_as_planned(fence, arrives, converts):
    """bench_wgmma's fence variants (findings/fenced-rs-wgmma.md): a WARPGROUP.ARRIVE before each of a
    trip's instructions where asked (+ one per latency sample), the A registers rewritten (F2FP)
    where asked, the same HGMMAs, no spills."""
    from lab.tools.calibrate import bench_wgmma
    from lab.tools.calibrate.common import run_sass_checks

    case = (f"wgmma_rs_n192_{fence}", lambda: (bench_wgmma.make(192, True, fence), bench_wgmma.fake_args()),
            {"HGMMA.64x192x16.F32.BF16": bench_wgmma.KB + sum(bench_wgmma.NKS), "WARPGROUP.ARRIVE": arrives,
             "F2FP.BF16.F32.PACK_AB": converts, "STL": 0})
    assert run_sass_checks([case]) == 0
    with pytest.raises(ValueError, match="each_write and mixed need rs"):
        bench_wgmma.make(192, False, "mixed")


def test_best_throughput_takes_the_fastest_timed_launch(monkeypatch):
    """bench_wgmma's timing of a chain: the first launch warms up, the faster of the next two counts;
    per warpgroup its own span (stamps t0, t1 per warpgroup)."""
    from lab.tools.calibrate import bench_wgmma

    spans = iter([[[0, 9000, 0, 0], [0, 9000, 0, 0]], [[0, 4096, 0, 0], [10, 3000, 0, 0]],
                  [[0, 5000, 0, 0], [0, 5000, 0, 0]]])
    monkeypatch.setattr(bench_wgmma, "_throughput", lambda *a: (next(spans), 0.0, True))
    got = bench_wgmma._best_throughput(None, None, None, 128, 2, iters=2)
    assert got["cycles"] == 4096 and got["instructions"] == 2 * 2 * bench_wgmma.KB
    assert got["cycles_per_instr"] == 4096 / 32 and got["per_wg_cycles_per_instr"] == [4096 / 16, 2990 / 16]
    assert got["flops_per_clk"] == pytest.approx(2 * 64 * 128 * 16 * 32 / 4096)


def test_bench_bursts_loops_hold_their_planned_instructions(capsys):
    from lab.tools.calibrate import bench_bursts

    assert bench_bursts.check_sass() == 0, capsys.readouterr().out


def test_bench_contention_loops_hold_their_planned_instructions(capsys):
    from lab.tools.calibrate import bench_contention

    assert bench_contention.check_sass() == 0, capsys.readouterr().out


def test_bench_contention_intra_stamps_bracket_the_wgmma_wait():
    """The trip's stamps: clock reads after the HGMMAs, after the mix and after the wgmma wait, and
    no wait before the mix (so the mix still overlaps the GEMM)."""
    from lab.tools.calibrate import bench_contention as bc
    from lab.tools.calibrate.common import compile_for_sass

    sass = compile_for_sass(bc.make_intra(True), *bc.fake_args_intra())
    ops = [line.split("*/", 1)[1].strip() for line in sass.splitlines() if "*/" in line]
    first_hgmma = next(i for i, o in enumerate(ops) if o.startswith("HGMMA"))
    clocks = [i for i, o in enumerate(ops) if "SR_CLOCKLO" in o and i > first_hgmma]
    waits = [i for i, o in enumerate(ops) if o.startswith("WARPGROUP.DEPBAR") and i > first_hgmma]
    assert len(clocks) >= 3 and waits, ops
    assert clocks[0] < clocks[1] < waits[0] < clocks[2]  # issued, mix done, wait, wait done


@pytest.mark.parametrize("args,says", [
    (["--ops", "mix,mixx"], "--ops: unknown code(s) mixx; allowed: fmul,"),
    (["--wgmma-n", "96"], "argument --wgmma-n: invalid choice: 96 (choose from 64, 128, 256)"),
    (["--mma-gaps", "100,0"], "--mma-gaps: '100,0'; allowed: non-negative ns, the first 0"),
    (["--mma-gaps", "0,1us"], "--mma-gaps: '0,1us'; allowed: comma-separated integers (ns)"),
    (["--stream-warps", "1,4"], "--stream-warps: '1,4'; allowed: comma-separated 1, 2, 3"),
    (["--stream-warps", "3", "--wgmma-n", "256"], "--stream-warps 3: the 512-thread build holds the wgmma at N <= 128"),
])
def test_bench_bursts_options_fail_in_one_line_before_the_gpu(tmp_path, args, says):
    """A wrong burst code, wgmma width or duty sweep is a one-line usage error before the GPU is touched."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, os.path.join(root, "lab", "tools", "calibrate", "bench_bursts.py"),
           "--out", str(tmp_path / "x.json"), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert says in res.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("wgs", ["4", "1,x", ""])
def test_bench_contention_intra_wgs_fail_in_one_line_before_the_gpu(tmp_path, wgs):
    """A warpgroup count the intra kernel has no build for is a one-line usage error, no GPU touched."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, os.path.join(root, "lab", "tools", "calibrate", "bench_contention.py"),
           "--out", str(tmp_path / "x.json"), "--only", "intra", "--intra-wgs", wgs]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--intra-wgs" in res.stderr.strip().splitlines()[-1] and "allowed: comma-separated 1, 2, 3" in res.stderr


def test_bench_dq_turn_runs_the_deterministic_turn_as_the_backward_does():
    """bench_dq_turn's turn holds what dq_store's deterministic turn holds: the acquire loads, the
    bulk reduce-add, the gpu-scope membar of the release and its add (the backward's SASS has
    them too)."""
    from lab.tools.calibrate import bench_dq_turn
    from lab.tools.calibrate.common import compile_for_sass, sass_count

    sass = compile_for_sass(bench_dq_turn.make(32768), *bench_dq_turn.fake_args())
    for op in ("LDG.E.STRONG.GPU", "UBLKRED.G.S.ADD.F32.RN", "MEMBAR.ALL.GPU", "REDG.E.ADD.S32.STRONG.GPU"):
        assert sass_count(sass, op) >= 1, op
    bare = compile_for_sass(bench_dq_turn.make(0), *bench_dq_turn.fake_args())
    assert sass_count(bare, "UBLKRED.G.S.ADD.F32.RN") == 0 and sass_count(bare, "MEMBAR.ALL.GPU") >= 1


def test_bench_lsu_runs_the_instructions_it_counts():
    """bench_lsu's kernels hold the shuffles and the cp.async copies they count per trip."""
    from lab.tools.calibrate import bench_lsu

    assert bench_lsu.check_sass() == 0
