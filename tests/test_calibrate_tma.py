"""lab/tools/calibrate/bench_tma.py: its kernel (the latency, ring and latency-under-load modes in
one build) compiles for sm_90a on the CPU with the TMA loads it times and the mbarrier waits.

Run: pytest tests/test_calibrate_tma.py (CPU)
"""
import pytest


@pytest.mark.compile
def test_tma_bench_compiles_to_tma_loads_and_mbarrier_waits():
    pytest.importorskip("cutlass")
    from lab.tools.calibrate import bench_tma
    from lab.tools.calibrate.common import compile_for_sass, sass_count

    sass = compile_for_sass(bench_tma.make(), *bench_tma.fake_args())
    assert sass_count(sass, "UTMALDG") >= 2  # the probe's loads and the ring's
    assert sass_count(sass, "SYNCS") >= 1


def test_probe_tiles_stay_below_the_first_streamer():
    from lab.tools.calibrate import bench_tma as t

    # mode 3: the probe's cold tiles (i * MAX_REQ + r) lie below CTA 1's region, which starts at
    # one streamer's stride, and the last streamer's region ends inside the tensor
    nsm = 132
    stride = (t.ROWS // t.BOX // nsm) // t.STAGES * t.STAGES
    assert t.PROBES * t.MAX_REQ <= stride
    assert nsm * stride <= t.ROWS // t.BOX
    assert t.PROBE_STAMPS >= 4 * nsm and t.PROBE_STAMPS + t.PROBES <= 8192
