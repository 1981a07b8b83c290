"""CPU-only: fa4kernel's SM90 backward compiles for sm_90a with fake tensors (no GPU needed), its
SASS has what the design promises (wgmma, TMA loads and stores, the fp32 dQ reduction, no
register spills), and bad arguments are one-line errors before anything compiles.

Run: pytest -m compile tests/test_kernel_sm90_bwd_compile.py
"""

import collections
import re

import pytest

pytest.importorskip("cutlass")

import fa4kernel  # noqa: E402
from fa4kernel import make_bwd_config  # noqa: E402

pytestmark = pytest.mark.compile

_SASS = {}

# the first design: each knob's other value (dQ by RED from every thread, LSE / D loaded by every
# thread, dV, dK, dQ after the dS^T barrier, the torch preprocess)
BASELINE = dict(dq_reduce="red", stats="thread", mma_order="dv_dk_dq", preprocess="torch")


def bwd_sass(head_dim=128, causal=False, dtype="bfloat16", deterministic=False):
    """The BASELINE build."""
    cfg = make_bwd_config(dtype, head_dim, causal, deterministic, **BASELINE)
    if cfg not in _SASS:
        _SASS[cfg] = fa4kernel.compile_bwd_sass(cfg)
    return _SASS[cfg]


def count(text, op):
    return len(re.findall(r"\s" + re.escape(op) + r"[\s.;]", text))


def assert_spills_as_designed(text, cfg):
    """No register spills (LDL / STL), with one exception checked exactly: grid_order="tail_lpt"
    with the CTA pair at head dim 256 (dq_sum="pair", the causal default there) decodes its key
    block, head and batch from a one-axis block index instead of reading them from special
    registers, and ptxas keeps one of those values in local memory: one STL before the warp roles
    split, reloaded outside the query-block loop (the H100 / H200 measurements are of this build;
    the pair at 192 has none)."""
    if cfg.grid_order == "tail_lpt" and cfg.dq_sum == "pair" and cfg.head_dim == 256:
        assert count(text, "STL") == 1, "tail_lpt with the pair: one value spilled before the roles split"
        assert not [o for o in loop_instructions(text) if o.split()[0].startswith(("LDL", "STL"))], \
            "a spill inside the query-block loop"
    else:
        assert count(text, "LDL") == 0 and count(text, "STL") == 0, "register spills (LDL/STL)"


def hgmma_shapes(text):
    return sorted(set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", text)))


def assert_backward_healthy(text):
    assert count(text, "HGMMA") > 0, "no wgmma (HGMMA) in SASS"
    assert count(text, "UTMALDG") > 0, "no TMA loads (UTMALDG) in SASS"
    assert count(text, "UTMASTG") > 0, "no TMA stores of dK / dV (UTMASTG) in SASS"
    assert len(re.findall(r"\sREDG?\.E\.ADD\.F32", text)) > 0, "no fp32 dQ reduction (RED.ADD.F32) in SASS"
    assert count(text, "MUFU.EX2") > 0, "no exp2 for P"
    assert count(text, "STSM") > 0, "no stmatrix (dS^T and dK / dV to smem)"
    assert count(text, "LDL") == 0 and count(text, "STL") == 0, "register spills (LDL/STL)"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
def test_bwd_every_head_dim_compiles(hd, causal):
    assert_backward_healthy(bwd_sass(hd, causal))


def test_bwd_fp16_and_deterministic_compile():
    assert_backward_healthy(bwd_sass(128, True, dtype="float16"))
    assert_backward_healthy(bwd_sass(64, False, deterministic=True))


@pytest.mark.parametrize("hd,shapes", [
    # S^T and dP^T (64 keys x 64 queries per warpgroup), dV / dK (64 keys x head_dim), dQ (64 x
    # head_dim / dq_wgs: split over both warpgroups at 128 only)
    (128, ["64x128x16", "64x64x16"]),
    (96, ["64x64x16", "64x96x16"]),
    (64, ["64x64x16"]),
    # kv_split: S^T and dP^T 64 keys x 32 queries per warpgroup; dV, dK, dQ head_dim / 2 columns
    (192, ["64x32x16", "64x96x16"]),
    (256, ["64x128x16", "64x32x16"]),
])
def test_bwd_wgmma_shapes(hd, shapes):
    assert hgmma_shapes(bwd_sass(hd)) == shapes


def test_bwd_dq_reduction_count_per_thread():
    """One two-wide RED.ADD.F32x2 per pair of adjacent dQ accumulator elements a thread holds per
    query block: 64 x hd / (2 x 128 x dq_wgs) (hd128: 16, split over both warpgroups; hd64: 16,
    warpgroup 0 alone; hd96: 24; hd192: 24 and hd256: 32, split over both warpgroups)."""
    for hd, n in ((128, 16), (64, 16), (96, 24), (192, 24), (256, 32)):
        text = bwd_sass(hd)
        assert len(re.findall(r"\sREDG?\.E\.ADD\.F32x2", text)) == n, hd
        assert len(re.findall(r"\sREDG?\.E\.ADD\.F32[^x]", text)) == 0, hd  # no scalar ones


def semaphore_ops(text):
    """(acquire loads, release adds) of the deterministic dQ order in SASS."""
    return (len(re.findall(r"\sLDG\.E\.STRONG\.GPU\s", text)),
            len(re.findall(r"\sREDG\.E\.ADD\.S32\.STRONG\.GPU\s", text)))


def test_bwd_deterministic_build_differs_only_in_the_dq_order():
    """The deterministic build (RED path) adds the semaphore's acquire spin (one load before the
    loop, one in it) and one release add, nothing else of the design changes; the fast build has
    neither."""
    a, b = bwd_sass(64, False), bwd_sass(64, False, deterministic=True)
    for op in ("HGMMA", "UTMALDG", "UTMASTG", "MUFU.EX2", "STSM", "REDG.E.ADD.F32x2"):
        assert count(a, op) == count(b, op), op
    assert semaphore_ops(a) == (0, 0) and semaphore_ops(b) == (2, 1)


@pytest.mark.parametrize("kwargs,says", [
    (dict(head_dim=160), "head_dim=160 not supported by the SM90 backward; allowed: 64, 96, 128, 192, 256"),
    (dict(head_dim=32), "head_dim=32 not supported by the SM90 backward"),
    (dict(dtype="float32"), "dtype float32 not supported by the backward"),
    (dict(causal=1), "causal=1 not supported"),
    (dict(deterministic="yes"), "deterministic='yes' not supported"),
])
def test_bwd_compile_rejects_bad_arguments_before_compiling(kwargs, says):
    with pytest.raises(ValueError) as ei:
        fa4kernel.compile_bwd_sass(**kwargs)
    assert says in str(ei.value) and "\n" not in str(ei.value)


def test_bwd_compile_rejects_a_forward_config():
    with pytest.raises(ValueError, match="allowed: None or a BwdConfig") as ei:
        fa4kernel.compile_bwd_sass(fa4kernel.make_config("bfloat16", 128, False, False, {}))
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize("hd,causal", [(128, False), (128, True), (64, True)])
def test_bwd_query_block_loop(hd, causal):
    """The loop over query blocks holds all five GEMMs (hd128: S^T and dP^T 2 x 8 k-steps, dV and
    dK 2 x 4, dQ 8), one named barrier (dS^T is double-buffered), one exp2 per S^T element a
    thread holds (64 x 64 / 128 = 32) and the dQ reduction (two-wide)."""
    from fa4kernel.sass import kv_loop

    loop = kv_loop(bwd_sass(hd, causal))  # the smallest loop with both HGMMA and MUFU.EX2
    ops = [o.split()[0] for o in loop]
    n = lambda prefix: sum(o.startswith(prefix) for o in ops)  # noqa: E731
    assert n("HGMMA") == (32 if hd == 128 else 24)
    assert n("BAR.SYNC") == 1
    assert n("MUFU.EX2") == 32
    assert n("REDG.E.ADD.F32x2") == 16
    assert n("STSM") == 4  # dS^T: 64 x 64 x 2 bytes per warpgroup


_DQ_COORDS = {}  # BwdConfig -> per dQ thread, the (row, col) of each of its dQ accumulator elements


def dq_coords(cfg, dq):
    """Called while a probe traces: per dQ thread t (128 x dq_wgs of them), the tile coordinates
    of its dQ accumulator elements, in element order, from the kernel's own dQ tiled MMA `dq`
    (its wgmma C partition of a tile_m x head_dim identity tensor). Each read traces DSL ops (what
    these probes cost), so they are read once per build and shared by the probes that check them
    (the thread layouts' and the bulk fragment order's: under pytest-xdist one worker runs them,
    tests/conftest.py); the values are plain Python ints."""
    if cfg not in _DQ_COORDS:
        import cutlass.cute as cute

        cQ = cute.make_identity_tensor((cfg.tile_m, cfg.head_dim))
        coords = []
        for t in range(128 * cfg.dq_wgs):  # plain Python: this function is not traced as a kernel
            tq = dq.get_slice(t).partition_C(cQ)
            coords.append([tq[i] for i in range(cute.size(tq))])
        _DQ_COORDS[cfg] = coords
    return _DQ_COORDS[cfg]


@pytest.mark.parametrize("hd,tile_m", [(64, 64), (96, 64), (128, 64), (64, 128)])
def test_bwd_thread_layouts_cover_the_tiles(hd, tile_m):
    """What the kernel assumes of its wgmma thread layouts, checked on the host with the kernel's
    own tiled MMAs: the S^T partition covers the 128 x tile_m tile once; a thread's element (r, c)
    sits in column (its column 0) + (thread 0's column c) and in row r's key for every c (the
    mask compares constants); the dQ partition covers tile_m x head_dim once over the dQ warpgroups,
    and elements 2i, 2i + 1 are adjacent columns (even first) of one row (the two-wide RED)."""
    import cutlass
    import cutlass.cute as cute

    from fa4kernel.sm90.bwd import make_bwd_kernel
    from fa4kernel.sm90.gemm import mn_view

    cfg = make_bwd_config("bfloat16", hd, False, tile_m=tile_m)
    found = {}

    @cute.jit
    def probe():
        # each element's coordinate is read from the DSL once (a read traces ops: the cost of
        # this test), then compared as Python values
        sdp, _, dq = make_bwd_kernel(cfg).tiled_mmas()
        cS = cute.make_identity_tensor((cfg.tile_n, cfg.tile_m))
        t0 = mn_view(sdp.get_slice(0).partition_C(cS))
        t0_row = []
        for c in cutlass.range_constexpr(cute.size(t0, mode=[1])):
            t0_row.append(t0[0, c])
        seen, bad = set(), 0
        for t in cutlass.range_constexpr(128 * cfg.num_consumer_wgs):
            ts = mn_view(sdp.get_slice(t).partition_C(cS))
            el = []
            for r in cutlass.range_constexpr(cute.size(ts, mode=[0])):
                el.append([])
                for c in cutlass.range_constexpr(cute.size(ts, mode=[1])):
                    el[r].append(ts[r, c])
            for r in cutlass.range_constexpr(len(el)):
                for c in cutlass.range_constexpr(len(el[r])):
                    seen.add((el[r][c][0], el[r][c][1]))
                    bad += int(el[r][c][1] != el[0][0][1] + t0_row[c][1]) + int(el[r][c][0] != el[r][0][0])
        found["sdp"] = (len(seen), bad)
        seen, bad = set(), 0
        for t in cutlass.range_constexpr(128 * cfg.dq_wgs):
            el = dq_coords(cfg, dq)[t]  # the dQ partition of thread t
            for i in cutlass.range_constexpr(len(el)):
                seen.add((el[i][0], el[i][1]))
            for i in cutlass.range_constexpr(len(el) // 2):
                a, b = el[2 * i], el[2 * i + 1]
                bad += int(not (a[0] == b[0] and b[1] == a[1] + 1 and a[1] % 2 == 0))
        found["dq"] = (len(seen), bad)

    cute.compile(probe, options="--gpu-arch sm_90a")  # the checks run while it traces
    assert found["sdp"] == (cfg.tile_n * cfg.tile_m, 0)
    assert found["dq"] == (cfg.tile_m * hd, 0)


# ---- dq_reduce="bulk" (the default): dQ through smem and one bulk reduce-add per dQ warpgroup


def bulk_sass(head_dim=128, causal=False, deterministic=False):
    """The build with dq_reduce="bulk", 64-row query blocks and the other knobs' defaults."""
    cfg = make_bwd_config("bfloat16", head_dim, causal, deterministic, dq_reduce="bulk", tile_m=64)
    if cfg not in _SASS:
        _SASS[cfg] = fa4kernel.compile_bwd_sass(cfg)
    return _SASS[cfg]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
def test_bwd_bulk_compiles_with_bulk_reduce_and_no_red(hd, causal):
    """One UBLKRED (cp.reduce.async.bulk .add.f32) per dQ warpgroup (two with dq_smem="qdo": one
    per half; with dq_sum="pair" only the owner warpgroup's), no REDG anywhere; the rest of the
    design (wgmma, TMA, exp2, stmatrix, no spills) as the default build."""
    text = bulk_sass(hd, causal)
    cfg = make_bwd_config("bfloat16", hd, causal, dq_reduce="bulk", tile_m=64)
    wgs = 1 if cfg.dq_sum == "pair" else cfg.dq_wgs
    assert count(text, "UBLKRED") == wgs * (2 if cfg.dq_smem == "qdo" else 1)
    assert len(re.findall(r"\sREDG?\.", text)) == 0, "per-thread RED left in the bulk build"
    for op in ("HGMMA", "UTMALDG", "UTMASTG", "MUFU.EX2", "STSM"):
        assert count(text, op) > 0, op
    assert_spills_as_designed(text, cfg)
    assert hgmma_shapes(text) == hgmma_shapes(bwd_sass(hd))


def test_bwd_baseline_build_has_no_bulk_reduce():
    assert count(bwd_sass(128), "UBLKRED") == 0 and count(bwd_sass(64, True), "UBLKRED") == 0


def test_bwd_bulk_deterministic_compiles():
    """The bulk reduce-adds of a query block sit between the semaphore's acquire and its release,
    after a wait for them to be written (DEPBAR), with a proxy fence on either side; the only RED
    is the release's."""
    text = bulk_sass(64, False, deterministic=True)
    assert count(text, "UBLKRED") == 1 and len(re.findall(r"\sREDG?\.", text)) == 1
    assert semaphore_ops(text) == (2, 1)
    ops = [ln.split(";")[0].split("*/")[-1].strip() for ln in text.splitlines() if "*/" in ln]
    acq = max(i for i, o in enumerate(ops) if o.startswith("LDG.E.STRONG.GPU"))
    red = next(i for i, o in enumerate(ops) if o.startswith("UBLKRED"))
    rel = next(i for i, o in enumerate(ops) if o.startswith("REDG.E.ADD.S32.STRONG.GPU"))
    assert acq < red < rel
    assert any(o.startswith("FENCE.VIEW.ASYNC.G") for o in ops[acq:red])
    assert any(o.startswith("DEPBAR") for o in ops[red:rel])
    assert any(o.startswith("MEMBAR.ALL.GPU") for o in ops[red:rel])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_bwd_deterministic_default_builds(hd, causal):
    """The deterministic default builds (hd64: 128-row blocks; hd256: the CTA pair, each CTA's
    half behind one semaphore) compile without spills, with the semaphore's spin and release and
    the fast build's GEMMs and bulk reduces."""
    cfg = make_bwd_config("bfloat16", hd, causal, True)
    assert cfg.grid_order == "heads_outer"
    if cfg not in _SASS:
        _SASS[cfg] = fa4kernel.compile_bwd_sass(cfg)
    text = _SASS[cfg]
    fast = knob_sass(hd, causal, grid_order="heads_outer")
    assert count(text, "LDL") == 0 and count(text, "STL") == 0, "register spills (LDL/STL)"
    assert semaphore_ops(text) == (2, 1) and semaphore_ops(fast) == (0, 0)
    for op in ("HGMMA", "UBLKRED", "UTMALDG", "UTMASTG", "MUFU.EX2", "STSM"):
        assert count(text, op) == count(fast, op), op


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("knobs", [{}, {"dq_sum": "cta"}], ids=["pair", "cta"])
def test_bwd_deterministic_qdo_waits_for_its_turn_after_a_barrier_per_stage(knobs, causal):
    """dq_smem="qdo", deterministic (hd256): producer warp 1 syncs with the dQ warpgroups on one
    barrier per (warpgroup, Q / dO stage) (a register id, _dq_full_id; the warpgroups arrive
    there too), and only then spins for the block's turn, before its bulk adds. The first
    semaphore build spun first on the fast build's one barrier per warpgroup: a warpgroup arrived
    for the next block meanwhile and completed the phase without warp 1, and the GPU run hung
    (tests/test_kernel_sm90_bwd_det_order.py models both). The fast build keeps its barriers."""
    cfg = make_bwd_config("bfloat16", 256, causal, True, **knobs)
    wgs = 1 if cfg.dq_sum == "pair" else cfg.dq_wgs
    if cfg not in _SASS:
        _SASS[cfg] = fa4kernel.compile_bwd_sass(cfg)

    def ops_of(text):
        return [ln.split(";")[0].split("*/")[-1].strip() for ln in text.splitlines() if "*/" in ln]

    ops = ops_of(_SASS[cfg])
    syncs = [i for i, o in enumerate(ops) if re.fullmatch(r"BAR\.SYNC(\.DEFER_BLOCKING)? R\d+, 0xa0", o)]
    acq = [i for i, o in enumerate(ops) if o.startswith("LDG.E.STRONG.GPU")]
    adds = [i for i, o in enumerate(ops) if "UBLKRED" in o]
    assert len(syncs) == wgs and len(acq) == 2 and adds, (syncs, acq)
    assert not [o for o in ops if re.match(r"BAR\.(SYNC|ARV)\S* 0x[56], 0xa0", o)]  # no shared DQ_FULL
    assert max(syncs) < min(acq) and max(acq) < min(adds)
    arrivals = [o for o in ops if o.startswith("BAR.ARV") and o.endswith(", 0xa0")]  # the dQ warpgroups'
    assert arrivals and all(re.fullmatch(r"BAR\.ARV R\d+, 0xa0", o) for o in arrivals), arrivals
    fast = ops_of(knob_sass(256, causal, grid_order="heads_outer", **knobs))
    assert [o for o in fast if re.fullmatch(r"BAR\.SYNC(\.DEFER_BLOCKING)? 0x[56], 0xa0", o)] == \
        [f"BAR.SYNC.DEFER_BLOCKING 0x{5 + w}, 0xa0" for w in range(wgs)]


@pytest.mark.parametrize("hd,causal", [(128, False), (128, True), (64, True), (96, False)])
def test_bwd_bulk_query_block_loop(hd, causal):
    """The consumers' loop: five GEMMs, 128-bit smem stores of dQ (64 x hd / (128 x dq_wgs) / 4
    per thread), no RED; named barriers: dS^T's and the wait for the dQ buffer (BAR.SYNC), the
    'dQ in smem' signal (BAR.ARV). Producer warp 1's loop issues the bulk reduce-add(s)."""
    from fa4kernel.sass import kv_loop, loop_bodies

    text = bulk_sass(hd, causal)
    dq_wgs = make_bwd_config("bfloat16", hd, causal, tile_m=64).dq_wgs
    ops = [o.split()[0] for o in kv_loop(text)]
    n = lambda prefix: sum(o.startswith(prefix) for o in ops)  # noqa: E731
    # at 64 and 96 (one dQ warpgroup) the loop holds dK twice: after dQ in warpgroup 1's branch
    # and alone in warpgroup 2's (mma_order "dv_dq_dk")
    assert n("HGMMA") == {128: 32, 96: 32, 64: 28}[hd]
    assert n("STS.128") == 64 * hd // (128 * dq_wgs) // 4
    assert n("RED") == 0
    assert n("BAR.SYNC") == 2 and n("BAR.ARV") == 1
    stores = [ops for _, ops in loop_bodies(text) if any(o.startswith("UBLKRED") for o in ops)]
    assert stores, "no loop issues UBLKRED"
    ops = [o.split()[0] for o in min(stores, key=len)]
    assert sum(o.startswith("UBLKRED") for o in ops) == dq_wgs
    assert sum(o.startswith("BAR.ARV") for o in ops) == dq_wgs  # buffers free
    assert sum(o.startswith("BAR.SYNC") for o in ops) == dq_wgs  # dQ in smem
    assert not any(o.startswith("HGMMA") for o in ops)


def test_bwd_bulk_smem_fits():
    from fa4kernel.sm90.bwd_config import bwd_smem_bytes

    for hd in fa4kernel.BWD_HEAD_DIMS:
        red_cfg = make_bwd_config("bfloat16", hd, False, dq_reduce="red")
        bulk_cfg = make_bwd_config("bfloat16", hd, False, dq_reduce="bulk", tile_m=64)
        red, bulk = bwd_smem_bytes(red_cfg), bwd_smem_bytes(bulk_cfg)
        assert bulk <= 227 * 1024, hd
        if bulk_cfg.dq_smem == "own":  # (256: dQ staged in the Q / dO stage, no buffer)
            assert bulk - red == 64 * hd * 4, hd


@pytest.mark.parametrize("hd,tile_m", [(64, 64), (96, 64), (128, 64), (64, 128)])
def test_bwd_bulk_fragment_order(hd, tile_m):
    """The bulk build's smem / accumulator order, checked with the kernel's own tiled MMA and
    the 128-bit store's partition: thread t's dQ element i (coordinate from the wgmma C
    partition) lands at dq_bulk_offset(row, col), every offset once; and the host's
    dq_bulk_to_rows (torch, CPU) inverts dq_bulk_offset."""
    import cutlass
    import cutlass.cute as cute

    from fa4kernel.sm90.bwd import dq_bulk_offset, make_bwd_kernel

    cfg = make_bwd_config("bfloat16", hd, False, dq_reduce="bulk", tile_m=tile_m)
    split = cfg.dq_rows_split
    found = {}

    @cute.jit
    def probe():
        _, _, dq = make_bwd_kernel(cfg).tiled_mmas()
        chunk = cfg.tile_m * hd // cfg.dq_wgs
        copy = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128),
            cute.make_layout((128, cfg.dq_wgs)), cute.make_layout(4))
        cS = cute.make_identity_tensor((chunk, cfg.dq_wgs))
        seen, bad = set(), 0
        for t in cutlass.range_constexpr(128 * cfg.dq_wgs):
            tq = dq_coords(cfg, dq)[t]  # thread t's dQ elements: their coordinates in the wgmma C partition
            ts = copy.get_slice(t).partition_D(cS)
            assert cute.size(ts) == len(tq)
            for i in cutlass.range_constexpr(len(tq)):
                pos, q = ts[cute.idx2crd(i, ts.shape)], tq[i]  # pos: read from the DSL once
                off = pos[0] + chunk * pos[1]
                seen.add(off)
                bad += int(off != dq_bulk_offset(q[0], q[1], hd, cfg.dq_wgs, split))
        found["v"] = (len(seen), bad)

    cute.compile(probe, options="--gpu-arch sm_90a")
    assert found["v"] == (cfg.tile_m * hd, 0)

    torch = pytest.importorskip("torch")
    from fa4kernel.sm90.bwd import dq_bulk_to_rows

    m = cfg.tile_m
    rows = torch.arange(2 * m * hd, dtype=torch.float32).reshape(1, 2 * m, hd)  # two query blocks
    acc = torch.empty_like(rows)
    for r in range(2 * m):
        for c in range(hd):
            off = dq_bulk_offset(r % m, c, hd, cfg.dq_wgs, split)
            acc[0, (r // m) * m + off // hd, off % hd] = rows[0, r, c]
    assert torch.equal(dq_bulk_to_rows(acc, hd, cfg.dq_wgs, split), rows)


def test_bwd_bulk_rejects_a_bad_knob_value():
    with pytest.raises(ValueError) as ei:
        fa4kernel.compile_bwd_sass(dq_reduce="tma")
    assert str(ei.value) == "dq_reduce='tma' not supported; allowed: bulk, red"


# ---- knobs: stats (LSE / D by TMA), mma_order, preprocess kernel


def knob_sass(head_dim=128, causal=False, **knobs):
    cfg = make_bwd_config("bfloat16", head_dim, causal, **knobs)
    if cfg not in _SASS:
        _SASS[cfg] = fa4kernel.compile_bwd_sass(cfg)
    return _SASS[cfg]


def loop_instructions(text):
    """Whole instructions of the consumers' query-block loop (operands kept)."""
    from fa4kernel.sass import kv_loop, loop_bodies

    ops = kv_loop(text)
    for _, body in loop_bodies(text, operands=True):
        if [o.split()[0] for o in body] == ops:
            return body
    raise AssertionError("loop not found")


@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
def test_bwd_stats_tma_reads_smem_not_global(hd):
    """stats="tma": producer warp 0 bulk-copies LSE_log2 and D with Q and dO (two UBLKCP), the
    loop reads them from smem (2 x 16 values per thread, paired: 16 LDS; 2 x 8 with kv_split,
    where a warpgroup's S^T holds 32 queries) and has no global load; same GEMMs, no spills.
    64-row query blocks (128 rows: test_bwd_tile_m_128_at_hd64)."""
    text = knob_sass(hd, stats="tma", tile_m=64)
    cols = 8 if make_bwd_config("bfloat16", hd, False).kv_split else 16  # query columns per thread
    loop = [o.split()[0] for o in loop_instructions(text)]
    assert count(text, "UBLKCP") == 2
    assert not any(o.startswith("LDG") for o in loop)
    # dq_sum="pair" (hd256's default): the owner also reads the peer's dQ half (hd / 16 LDS.128)
    pair_reads = hd // 16 if make_bwd_config("bfloat16", hd, False).dq_sum == "pair" else 0
    assert sum(o.startswith("LDS") for o in loop) == cols + pair_reads
    thread = [o.split()[0] for o in loop_instructions(knob_sass(hd, stats="thread"))]
    assert sum(o.startswith("HGMMA") for o in loop) == sum(o.startswith("HGMMA") for o in thread)
    assert count(text, "LDL") == 0 and count(text, "STL") == 0
    # stats="thread" loads them per thread from global memory (2 x 16 LDG; 2 x 8 with kv_split)
    assert sum(o.startswith("LDG") for o in thread) == 2 * cols


def _positions(body):
    """Indices in the loop of: dS^T stmatrix, the dS^T barrier (BAR.SYNC 0x1), RS wgmma (dV, dK:
    A from registers), SS wgmma of dQ (A = dS^T from smem, transposed) and of S^T / dP^T, dQ's
    smem stores, full waits (wait_group 0)."""
    pos = {"stsm": [], "bar_ds": [], "rs": [], "dq": [], "ss": [], "sts": [], "wait0": []}
    for i, o in enumerate(body):
        op = o.split()[0]
        if op.startswith("STSM"):
            pos["stsm"].append(i)
        elif op.startswith("BAR.SYNC") and "0x1," in o:
            pos["bar_ds"].append(i)
        elif op.startswith("HGMMA"):
            a = o.split()[2]
            pos["rs" if a.startswith("R") else "dq" if "tnspA" in o else "ss"].append(i)
        elif op.startswith("STS.128"):
            pos["sts"].append(i)
        elif op.startswith("WARPGROUP.DEPBAR") and "0x0" in o:
            pos["wait0"].append(i)
    return pos


def test_bwd_mma_order_dv_dk_dq_issues_dv_dk_after_the_barrier():
    p = _positions(loop_instructions(knob_sass(128, mma_order="dv_dk_dq")))
    assert len(p["rs"]) == 8 and len(p["dq"]) == 8 and len(p["bar_ds"]) == 1
    assert min(p["rs"]) > p["bar_ds"][0] and max(p["rs"]) < min(p["dq"])  # dV, dK, then dQ
    assert min(p["sts"]) > max(p["dq"])  # dQ leaves after all GEMMs


@pytest.mark.parametrize("dq_reduce", ["red", "bulk"])
def test_bwd_mma_order_overlaps(dq_reduce):
    """hd128: dV (4 RS k-steps) is issued before the dS^T barrier, after dS^T is stored, dQ (8 SS
    k-steps) right after the barrier, then dK (4 RS); dQ leaves (STS.128 or RED) after dK is
    issued and before the loop's last full wait."""
    text = knob_sass(128, dq_reduce=dq_reduce, mma_order="dv_dq_dk", stats="thread")
    body = loop_instructions(text)
    p = _positions(body)
    bar = p["bar_ds"][0]
    dv, dk = p["rs"][:4], p["rs"][4:]
    assert len(p["rs"]) == 8 and len(p["dq"]) == 8
    assert max(dv) < bar < min(p["dq"]) and max(p["dq"]) < min(dk)
    assert max(dv) > max(p["stsm"])
    out = p["sts"] if dq_reduce == "bulk" else [i for i, o in enumerate(body) if o.startswith("REDG")]
    assert out and min(out) > max(dk) and max(out) < p["wait0"][-1]
    assert count(text, "LDL") == 0 and count(text, "STL") == 0


@pytest.mark.parametrize("hd", [64, 96])
def test_bwd_mma_order_single_dq_warpgroup(hd):
    """At 64 and 96 warpgroup 0 alone runs dQ: the dv_dq_dk order compiles without spills, one
    dS^T barrier per query block, the same GEMM shapes."""
    text = knob_sass(hd, True, dq_reduce="bulk", stats="tma", mma_order="dv_dq_dk", tile_m=64)
    ops = [o.split()[0] for o in loop_instructions(text)]
    assert sum(o.startswith("BAR.SYNC") for o in ops) == 2  # dS^T, dQ buffer
    assert hgmma_shapes(text) == hgmma_shapes(bwd_sass(hd))
    assert count(text, "LDL") == 0 and count(text, "STL") == 0


@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
def test_bwd_preprocess_kernel_compiles(hd):
    """preprocess="kernel": 128-bit loads of O and dO (hd / 32 each per thread: 4 threads per
    row), a 2-step butterfly over the row's quad, one LSE load and the two fp32 stores."""
    import collections

    from fa4kernel.sass import sass_for
    from fa4kernel.sm90.bwd_preprocess import compile_preprocess

    cfg = make_bwd_config("bfloat16", hd, False, preprocess="kernel")
    text = sass_for(lambda opts: compile_preprocess(cfg, opts), "sm_90a", cache=("sm90_bwd_pre", cfg))
    ops = collections.Counter(re.findall(r"\s((?:LDG|STG|SHFL|LDL|STL)[\.\w]*)\s", text))
    assert ops["LDG.E.128"] == 2 * hd // 32
    assert ops["SHFL.BFLY"] == 2 and ops["STG.E"] == 2 and ops["LDG.E"] == 1
    assert ops["LDL"] == 0 and ops["STL"] == 0


@pytest.mark.parametrize("hd,tile_m", [(64, 64), (96, 64), (128, 64), (64, 128)])
def test_bwd_postprocess_coords_invert_the_fragment_map(hd, tile_m):
    """postprocess="kernel": thread g's 16 floats (16 chunk .. 16 chunk + 15 of a block) are the
    elements dq_post_coords names, by dq_bulk_offset; the threads cover the block once, and the
    32 threads of a warp store whole rows (their pieces of a row are contiguous)."""
    from fa4kernel.sm90.bwd import dq_bulk_offset
    from fa4kernel.sm90.bwd_postprocess import dq_post_coords

    cfg = make_bwd_config("bfloat16", hd, False, tile_m=tile_m, postprocess="kernel")
    rows = 64 * cfg.dq_wgs if cfg.dq_rows_split else 64
    seen = set()
    for g in range(rows * hd // 16):
        row0, col0, chunk = dq_post_coords(g, hd, cfg.dq_wgs, cfg.dq_rows_split)
        for i in range(16):
            lane4, vr, vc = i // 4, (i // 2) % 2, i % 2
            row, col = row0 + 8 * vr, col0 + 2 * lane4 + vc
            assert dq_bulk_offset(row, col, hd, cfg.dq_wgs, cfg.dq_rows_split) == 16 * chunk + i, (g, i)
            seen.add((row, col))
    assert seen == {(r, c) for r in range(rows) for c in range(hd)}
    for warp in range(rows * hd // 16 // 32):  # a warp's stores: runs of whole 8-column pieces
        by_row = collections.defaultdict(list)
        for g in range(32 * warp, 32 * warp + 32):
            row0, col0, _ = dq_post_coords(g, hd, cfg.dq_wgs, cfg.dq_rows_split)
            by_row[row0].append(col0)
        for cols in by_row.values():
            assert cols == list(range(cols[0], cols[0] + 8 * len(cols), 8)), (warp, cols)
        assert len(by_row) <= -(-32 // (hd // 8)) + 1, warp


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("hd,tile_m", [(64, 64), (96, 64), (128, 64), (64, 128)])
def test_bwd_postprocess_kernel_compiles(hd, tile_m, dtype):
    """postprocess="kernel": per thread 4 LDG.128 of the accumulator (64 contiguous bytes), 8
    two-wide conversions to 16 bit and 2 STG.128 (8 columns of two rows); no smem, no barrier,
    no spills."""
    import collections

    from fa4kernel.sass import sass_for
    from fa4kernel.sm90.bwd_postprocess import compile_postprocess

    cfg = make_bwd_config(dtype, hd, False, tile_m=tile_m, postprocess="kernel")
    text = sass_for(lambda opts: compile_postprocess(cfg, opts), "sm_90a", cache=("sm90_bwd_post", cfg))
    ops = collections.Counter(re.findall(r"\s((?:LDG|STG|LDS|STS|BAR|F2FP|LDL|STL)[\.\w]*)\s", text))
    cvt = "F2FP.BF16.F32.PACK_AB" if dtype == "bfloat16" else "F2FP.F16.F32.PACK_AB"
    assert ops == {"LDG.E.128": 4, cvt: 8, "STG.E.128": 2}, ops


def test_bwd_postprocess_kernel_needs_bulk():
    with pytest.raises(ValueError) as ei:
        make_bwd_config("bfloat16", 128, False, dq_reduce="red", postprocess="kernel")
    assert str(ei.value) == ("postprocess='kernel' reads the fragment order of dq_reduce='bulk', not "
                             "dq_reduce='red'; allowed with dq_reduce='red': postprocess='torch'")


@pytest.mark.parametrize("name,val,allowed", [
    ("stats", "smem", "tma, thread"),
    ("mma_order", "dq_first", "dv_dq_dk, dv_dk_dq"),
    ("mma_order", "dv_early", "dv_dq_dk, dv_dk_dq"),
    ("preprocess", "cuda", "kernel, torch"),
    ("postprocess", "cuda", "torch, kernel"),
    ("grid_order", "blocks_outer", "heads_outer, tail_lpt"),
])
def test_bwd_rejects_bad_knob_values(name, val, allowed):
    with pytest.raises(ValueError) as ei:
        make_bwd_config("bfloat16", 128, False, **{name: val})
    assert str(ei.value) == f"{name}={val!r} not supported; allowed: {allowed}"


def test_bwd_dq_postprocess_reorders_like_the_fragment_map():
    """dq_postprocess (one torch copy_) = dq_bulk_to_rows (bulk) or the transpose (red), then
    the first s_q rows, (b, s_q, h, d)."""
    torch = pytest.importorskip("torch")
    from fa4kernel.sm90.bwd import dq_bulk_to_rows
    from fa4kernel.sm90.bwd_postprocess import dq_postprocess

    for hd, tile_m in ((64, 64), (96, 64), (128, 64), (64, 128)):
        acc = torch.randn(2, 3, 256, hd)
        for sq in (256, 200, 100):
            bulk = make_bwd_config("bfloat16", hd, False, dq_reduce="bulk", tile_m=tile_m)
            want = dq_bulk_to_rows(acc, hd, bulk.dq_wgs, bulk.dq_rows_split)[:, :, :sq].transpose(1, 2)
            assert torch.equal(dq_postprocess(acc, bulk, sq, torch.float32), want)
            if tile_m == 64:
                red = make_bwd_config("bfloat16", hd, False, dq_reduce="red")
                assert torch.equal(dq_postprocess(acc, red, sq, torch.float32), acc[:, :, :sq].transpose(1, 2))


def test_bwd_smem_with_stats_fits():
    from fa4kernel.sm90.bwd_config import bwd_smem_bytes

    for hd in fa4kernel.BWD_HEAD_DIMS:
        cfg = make_bwd_config("bfloat16", hd, False, dq_reduce="bulk", stats="tma")
        assert bwd_smem_bytes(cfg) <= 227 * 1024, hd


# ---- the defaults, tile_m=128


def test_bwd_defaults_are_the_measured_winners():
    """bulk dQ, LSE / D by TMA, dV first then dQ under dK, the preprocess kernel (which zeroes
    the dQ accumulator), the postprocess kernel, 240 registers per consumer warpgroup, 64-row
    query blocks, 128 at head dim 64 (falling back to 64 where 128 does not hold)."""
    cfg = make_bwd_config("bfloat16", 128, False)
    assert (cfg.dq_reduce, cfg.stats, cfg.mma_order, cfg.preprocess, cfg.postprocess, cfg.dq_zero,
            cfg.tile_m) == ("bulk", "tma", "dv_dq_dk", "kernel", "kernel", "preprocess", 64)
    assert make_bwd_config("bfloat16", 64, True).tile_m == 128
    for knobs in (dict(stats="thread"), dict(dq_reduce="red")):
        assert make_bwd_config("bfloat16", 64, False, **knobs).tile_m == 64, knobs
    cfg = make_bwd_config("bfloat16", 128, False, dq_reduce="red", preprocess="torch")
    assert (cfg.postprocess, cfg.dq_zero) == ("torch", "torch")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
def test_bwd_default_builds_keep_the_wgmmas_asynchronous(hd, causal):
    """Where ptxas cannot give a wgmma batch its registers it serializes every wgmma (a wait
    after each: one WARPGROUP.ARRIVE per HGMMA; 128-row blocks at head dim 64 did, until LSE and
    D were read from smem where they are used). The default builds issue each GEMM's k-steps as
    one batch: at most 6 arrives for 32 or more HGMMA per loop trip."""
    ops = [o.split()[0] for o in loop_instructions(knob_sass(hd, causal))]
    assert sum(o.startswith("HGMMA") for o in ops) >= 32
    assert sum(o.startswith("WARPGROUP.ARRIVE") for o in ops) <= 6


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [d for d in fa4kernel.BWD_HEAD_DIMS if d <= 128])  # 192, 256: test_bwd_kv_split_builds
def test_bwd_default_build(hd, causal):
    """The default build: one UBLKRED per dQ warpgroup and no REDG, two UBLKCP (LSE, D), no
    spills; in the loop dV is issued before the dS^T barrier, dQ right after it, then dK."""
    text = knob_sass(hd, causal)
    cfg = make_bwd_config("bfloat16", hd, causal)
    assert count(text, "UBLKRED") == cfg.dq_wgs and count(text, "UBLKCP") == 2
    assert len(re.findall(r"\sREDG?\.", text)) == 0
    assert count(text, "LDL") == 0 and count(text, "STL") == 0
    p = _positions(loop_instructions(text))
    assert len(p["bar_ds"]) == 1 and p["dq"]
    assert min(p["rs"]) < p["bar_ds"][0] < min(p["dq"]) < max(p["rs"])


def _setmaxreg(text):
    return [int(x, 16) for x in re.findall(r"SETMAXREG\.TRY_ALLOC\.CTAPOOL \w+, (0x[0-9a-f]+)", text)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 96])
def test_bwd_one_setmaxnreg_for_both_consumers(hd, causal):
    """setmaxnreg 240 for both consumer warpgroups, also where warpgroup 0 alone runs dQ (64-row
    blocks): one query-block loop for both, no spills."""
    text = knob_sass(hd, causal, tile_m=64)
    assert _setmaxreg(text) == [240]
    assert count(text, "LDL") == 0 and count(text, "STL") == 0


def test_bwd_regs_is_not_a_knob():
    """One register budget: `regs` is no backward knob (one-line ValueError naming the knobs)."""
    from fa4kernel.sm90.bwd_config import BWD_KNOB_NAMES, bwd_config_from_knobs

    with pytest.raises(ValueError) as ei:
        bwd_config_from_knobs("bfloat16", 64, False, False, {"regs": "split"})
    allowed = ", ".join(n for n in BWD_KNOB_NAMES if n != "deterministic")
    assert str(ei.value) == f"backward knob 'regs' unknown; allowed: {allowed}"
    assert "regs" not in BWD_KNOB_NAMES


@pytest.mark.parametrize("kwargs", [dict(causal=False), dict(causal=True), dict(causal=False, deterministic=True),
                                    dict(causal=True, dtype="float16")])
def test_bwd_tile_m_128_at_hd64(kwargs):
    """hd64 with 128-row query blocks: S^T and dP^T 64 x 128 per warpgroup (N = 128), dQ split by
    query rows (64 x 64 per warpgroup, so both run it: two UBLKRED per block); per loop trip 64
    exp2 per thread, 4 + 4 + 8 + 8 + 8 k-steps (S^T, dP^T, dV, dK, dQ), 8 STS.128 of dQ per
    thread, LSE / D read from smem where they are used (2 x 32 values, paired: 32 LDS), each
    GEMM one batch of wgmmas (5 arrives: not serialized); no spills."""
    kwargs = dict(kwargs)
    dtype = kwargs.pop("dtype", "bfloat16")
    cfg = make_bwd_config(dtype, 64, tile_m=128, **kwargs)
    assert cfg.dq_rows_split and cfg.dq_wgs == 2
    text = fa4kernel.compile_bwd_sass(cfg)
    assert hgmma_shapes(text) == ["64x128x16", "64x64x16"]
    # deterministic: the one RED is the dQ semaphore's release
    assert count(text, "UBLKRED") == 2 and len(re.findall(r"\sREDG?\.", text)) == int(cfg.deterministic)
    assert count(text, "LDL") == 0 and count(text, "STL") == 0
    ops = [o.split()[0] for o in loop_instructions(text)]
    n = lambda prefix: sum(o.startswith(prefix) for o in ops)  # noqa: E731
    assert n("HGMMA") == 32 and n("MUFU.EX2") == 64 and n("STS.128") == 8 and n("LDS") == 32
    assert n("BAR.SYNC") == 2  # dS^T, the dQ buffer
    assert n("WARPGROUP.ARRIVE") == 5  # one batch per GEMM: not serialized


def test_bwd_tile_m_128_smem_fits():
    from fa4kernel.sm90.bwd_config import bwd_smem_bytes

    cfg = make_bwd_config("bfloat16", 64, False, tile_m=128)
    # K, V 16 KiB each, Q, dO 2 x 16 KiB each, dS^T 2 x 32 KiB, dQ 32 KiB, LSE / D 2 KiB
    assert bwd_smem_bytes(cfg) == 1024 + 2 * 16384 + 2 * 32768 + 65536 + 32768 + 2048 <= 227 * 1024


@pytest.mark.parametrize("knobs,says", [
    (dict(head_dim=128, tile_m=128), "tile_m=128 not supported at head_dim 128; allowed: 64"),
    (dict(head_dim=64, tile_m=96), "tile_m=96 not supported at head_dim 64; allowed: 64, 128"),
    (dict(head_dim=64, tile_m=128, dq_reduce="red"), "tile_m=128 with dq_reduce='red' not supported"),
    (dict(head_dim=64, tile_m=128, stats="thread"), "tile_m=128 with stats='thread' spills registers"),
])
def test_bwd_tile_m_rejects_what_does_not_fit(knobs, says):
    knobs = dict(knobs)
    hd = knobs.pop("head_dim")
    with pytest.raises(ValueError) as ei:
        make_bwd_config("bfloat16", hd, False, **knobs)
    assert says in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize("hd,knobs", [(64, dict(tile_m=128, stats="thread"))])
def test_bwd_rejected_combinations_spill(hd, knobs):
    """Why make_bwd_config rejects them: built anyway, ptxas spills (LDL / STL). (Every allowed
    combination of the knobs at every head dim, causal or not, compiles without spills: 124
    builds, checked once; too slow for the suite.)"""
    from fa4kernel.sm90.bwd_config import BwdConfig

    with pytest.raises(ValueError, match="spills registers"):
        make_bwd_config("bfloat16", hd, False, **knobs)
    cfg = BwdConfig(dtype="bfloat16", head_dim=hd, causal=hd == 64, **knobs)
    text = fa4kernel.compile_bwd_sass(cfg)
    assert count(text, "LDL") + count(text, "STL") > 0


# ---- grid_order


@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
def test_bwd_grid_order_tail_lpt_is_the_causal_default(hd):
    """With a causal mask the default launch is tail_lpt, without one heads_outer. Its build:
    the same GEMMs (HGMMA shapes and count), exp2s, TMA and bulk reduce-add as heads_outer's; a
    one-axis grid decoded with the host's fast divisors (IMAD.HI / UIMAD.WIDE, no I2F / F2I
    division); spills as designed (none, or with the pair one value outside the loop)."""
    cfg = make_bwd_config("bfloat16", hd, True)
    assert cfg.grid_order == "tail_lpt" and make_bwd_config("bfloat16", hd, False).grid_order == "heads_outer"
    text, heads_outer = knob_sass(hd, True), knob_sass(hd, True, grid_order="heads_outer")
    assert hgmma_shapes(text) == hgmma_shapes(heads_outer)
    for op in ("HGMMA", "MUFU.EX2", "UTMALDG", "UTMASTG", "UBLKRED", "STSM"):
        assert count(text, op) == count(heads_outer, op), op
    assert count(text, "I2F") == count(heads_outer, "I2F")
    assert_spills_as_designed(text, cfg)


def test_bwd_launch_order_covers_every_cta_once():
    """bwd_config.launch_order (the kernel's decode in plain Python): every (key block, k/v head,
    batch) of the grid exactly once, a pair's two CTAs side by side (rank 0 first); tail_lpt
    keeps heads_outer's order for all but the last tail_heads (batch, k/v head)s, which end the
    launch key block by key block: their longest CTAs (key block 0) come first."""
    from fa4kernel.sm90.bwd_config import cluster_ctas, launch_order, tail_heads

    for hd, s, h, b in ((256, 4096, 8, 4), (256, 999, 12, 2), (128, 1000, 16, 4), (64, 16384, 32, 1)):
        for order in ("heads_outer", "tail_lpt"):
            cfg = make_bwd_config("bfloat16", hd, True, grid_order=order)
            got = launch_order(cfg, s, h, b)
            c = cluster_ctas(cfg)
            units = -(-s // (cfg.tile_n * c))
            assert sorted(got) == sorted((n, hh, bb) for bb in range(b) for hh in range(h) for n in range(units * c))
            assert all(got[i][1:] == got[i + 1][1:] and got[i][0] + 1 == got[i + 1][0] and got[i][0] % 2 == 0
                       for i in range(0, len(got), c) if c == 2)
            if order == "heads_outer":
                continue
            tail = tail_heads(units, h * b, 132 // c)
            head_part = (h * b - tail) * units * c
            assert got[:head_part] == launch_order(make_bwd_config("bfloat16", hd, True, grid_order="heads_outer"),
                                                   s, h, b)[:head_part]
            assert [n for n, _, _ in got[head_part:head_part + tail * c]] == [r for _ in range(tail) for r in range(c)]
            assert tail * units >= min(h * b * units, 2 * 132 // c)


def test_bwd_tail_heads_cover_two_waves():
    from fa4kernel.sm90.bwd_config import tail_heads

    assert tail_heads(units_per_head=32, heads=32, slots=66) == 5  # 4k, hd256 pairs: 5 x 32 >= 132
    assert tail_heads(units_per_head=8, heads=4, slots=132) == 4   # every head, at most
    assert tail_heads(units_per_head=1000, heads=16, slots=132) == 1


def test_bwd_grid_order_rejects_a_bad_value():
    with pytest.raises(ValueError) as ei:
        make_bwd_config("bfloat16", 128, True, grid_order="longest")
    assert str(ei.value) == "grid_order='longest' not supported; allowed: heads_outer, tail_lpt"


# ---- dq_zero


@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
def test_bwd_dq_zero_preprocess_stores_zeros(hd):
    """dq_zero="preprocess": the preprocess kernel adds 128-bit stores of the dQ accumulator's
    rows (hd / 16 per thread), its loads and stats stores as before; the default build has none.
    Deterministic: one 32-bit store more (the semaphore of the query block that starts at the
    CTA's first row), the rest as the fast build's."""
    import collections

    from fa4kernel.sass import sass_for
    from fa4kernel.sm90.bwd_preprocess import compile_preprocess

    def ops(dq_zero, det=False):
        cfg = make_bwd_config("bfloat16", hd, False, det, dq_zero=dq_zero)
        text = sass_for(lambda opts: compile_preprocess(cfg, opts), "sm_90a", cache=("sm90_bwd_pre", cfg))
        return collections.Counter(re.findall(r"\s((?:LDG|STG|SHFL|LDL|STL)[\.\w]*)\s", text))

    base, zero, det = ops("torch"), ops("preprocess"), ops("preprocess", True)
    assert base["STG.E.128"] == 0
    assert zero["STG.E.128"] == hd // 16
    assert {k: v for k, v in zero.items() if k != "STG.E.128"} == dict(base)
    assert zero["LDL"] == 0 and zero["STL"] == 0
    assert det["STG.E"] == zero["STG.E"] + 1
    assert {k: v for k, v in det.items() if k != "STG.E"} == {k: v for k, v in zero.items() if k != "STG.E"}
    assert ops("torch", True) == base  # dq_zero="torch": torch.zeros zeroes the semaphores too


def test_bwd_dq_zero_needs_the_preprocess_kernel():
    with pytest.raises(ValueError) as ei:
        make_bwd_config("bfloat16", 64, False, preprocess="torch", dq_zero="preprocess")
    assert str(ei.value) == ("dq_zero='preprocess' needs the preprocess kernel, not preprocess='torch'; "
                             "allowed with preprocess='torch': dq_zero='torch'")


def test_bwd_host_side_knobs_share_one_kernel_build():
    """postprocess and dq_zero change other launches only: kernel_config (the compile cache's key)
    drops them; grid_order and the others change the kernel and stay."""
    from fa4kernel.sm90.bwd import kernel_config

    base = make_bwd_config("bfloat16", 64, True)
    host = make_bwd_config("bfloat16", 64, True, postprocess="torch", dq_zero="torch")
    assert host != base and kernel_config(host) == kernel_config(base) == base
    grid = make_bwd_config("bfloat16", 64, True, postprocess="torch", grid_order="heads_outer")
    assert kernel_config(grid) == make_bwd_config("bfloat16", 64, True, grid_order="heads_outer") != base


# ---- head dims 192 and 256: kv_split (64 x 64 tiles, dK / dV / dQ split by head_dim)

KV_SPLIT_HEAD_DIMS = tuple(d for d in fa4kernel.BWD_HEAD_DIMS if d > 128)


def test_bwd_kv_split_config():
    """64 x 64 tiles, 2 consumer warpgroups sharing the keys, both running dQ; the dq_reduce
    default is "bulk", staged in the consumed Q / dO stage at 256 (two stages; one with its own
    dQ buffer) and in its own buffer at 192 (two stages); every build fits 227 KiB of smem."""
    from fa4kernel.sm90.bwd_config import bwd_smem_bytes

    for hd in KV_SPLIT_HEAD_DIMS:
        cfg = make_bwd_config("bfloat16", hd, True)
        assert (cfg.tile_m, cfg.tile_n, cfg.num_consumer_wgs, cfg.dq_wgs, cfg.kv_split) == (64, 64, 2, 2, True)
        assert (cfg.dq_reduce, cfg.dq_smem, cfg.q_stages) == ("bulk", "qdo" if hd == 256 else "own", 2)
        assert cfg.dq_sum == ("pair" if hd == 256 else "cta")
        for dq, smem, stages in (("red", "own", 2), ("bulk", "own", 1 if hd == 256 else 2), ("bulk", "qdo", 2)):
            c = make_bwd_config("bfloat16", hd, False, dq_reduce=dq, dq_smem=smem)
            assert bwd_smem_bytes(c) <= 227 * 1024
            assert c.q_stages == stages, (hd, dq, smem)
    assert not make_bwd_config("bfloat16", 128, False).kv_split


@pytest.mark.parametrize("hd", KV_SPLIT_HEAD_DIMS)
@pytest.mark.parametrize("knobs,says", [
    (dict(mma_order="dv_early"), "mma_order='dv_early' not supported; allowed: dv_dq_dk, dv_dk_dq"),
    (dict(tile_m=128), "tile_m=128 not supported at head_dim {hd}; allowed: 64"),
    (dict(dq_reduce="red", dq_smem="qdo"), "dq_smem='qdo' needs head_dim 192 or 256 (both warpgroups split "
                                            "head_dim) and dq_reduce='bulk', not head_dim={hd}, dq_reduce='red'"),
])
def test_bwd_kv_split_rejects_what_does_not_apply(hd, knobs, says):
    with pytest.raises(ValueError) as ei:
        make_bwd_config("bfloat16", hd, False, **knobs)
    assert says.format(hd=hd) in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize("knobs", [dict(), dict(deterministic=True), dict(dq_reduce="bulk"), dict(dq_reduce="red"),
                                   BASELINE, dict(mma_order="dv_dk_dq", dtype="float16"), dict(dq_smem="own"),
                                   dict(dq_smem="qdo", dq_sum="cta"), dict(dq_smem="qdo", mma_order="dv_dk_dq"),
                                   dict(dq_smem="qdo", dq_sum="pair"), dict(dq_smem="qdo", dq_sum="pair", deterministic=True)],
                         ids=["default", "deterministic", "bulk", "red", "baseline", "dv_dk_dq-fp16", "own", "qdo",
                              "qdo-dv_dk_dq", "pair", "pair-deterministic"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", KV_SPLIT_HEAD_DIMS)
def test_bwd_kv_split_builds(hd, causal, knobs):
    """Each build compiles without spills (LDL / STL) inside setmaxnreg 240; the loop holds the
    five GEMMs (S^T, dP^T: hd / 16 k-steps each; dV, dK, dQ: 4 each), all SS (P^T and dS^T from
    smem: 4 stmatrix per thread, 2 each), one exp2 per S^T element a thread holds (64 x 64 / 256
    = 16). GQA / MQA are run-time shapes (the fake tensors' heads are symbolic): one build."""
    knobs = dict(knobs)
    dtype = knobs.pop("dtype", "bfloat16")
    det = knobs.pop("deterministic", False)
    cfg = make_bwd_config(dtype, hd, causal, det, **knobs)
    if cfg not in _SASS:
        _SASS[cfg] = fa4kernel.compile_bwd_sass(cfg)
    text = _SASS[cfg]
    assert_spills_as_designed(text, cfg)
    assert _setmaxreg(text) == [240]
    assert max(int(r) for r in re.findall(r"\bR(\d+)\b", text)) < 240
    ops = [o.split()[0] for o in loop_instructions(text)]
    n = lambda prefix: sum(o.startswith(prefix) for o in ops)  # noqa: E731
    assert n("HGMMA") == 2 * hd // 16 + 3 * 4
    assert not any(o.split()[2].startswith("R") for o in loop_instructions(text) if o.startswith("HGMMA")), "RS"
    assert n("MUFU.EX2") == 16 and n("STSM") == 4
    if cfg.dq_reduce == "red":
        assert n("REDG.E.ADD.F32x2") == 64 * hd // (2 * 256) and count(text, "UBLKRED") == 0
    else:
        # dq_smem="qdo": each warpgroup's dQ in two halves (dO's and Q's columns of the stage);
        # dq_sum="pair": the owner's halves only, the sender's go to the peer CTA (st.async: STAS,
        # 4 floats each: hd / 16 per thread)
        reduces = 2 if cfg.dq_sum == "pair" else (4 if cfg.dq_smem == "qdo" else 2)
        assert count(text, "UBLKRED") == reduces and n("RED") == 0
        assert len(re.findall(r"\sSTAS[\s.]", text)) == (hd // 16 if cfg.dq_sum == "pair" else 0)
    assert count(text, "UTMASTG") > 0 and count(text, "UTMALDG") > 0


@pytest.mark.parametrize("hd", KV_SPLIT_HEAD_DIMS)
def test_bwd_kv_split_thread_layouts_cover_the_tiles(hd):
    """The S^T partition of the kv_split tiled MMA covers 64 keys x 64 queries once over 256
    threads, columns as thread 0's plus the thread's column 0 (the mask's assumption); dQ's
    covers 64 x head_dim once."""
    test_bwd_thread_layouts_cover_the_tiles(hd, 64)


@pytest.mark.parametrize("hd", KV_SPLIT_HEAD_DIMS)
def test_bwd_kv_split_bulk_fragment_order(hd):
    test_bwd_bulk_fragment_order(hd, 64)


def test_bwd_dq_smem_rejected_below_kv_split():
    """dq_smem="qdo" needs both warpgroups to split head_dim (kv_split): elsewhere one warpgroup's
    dK reads every column of Q; a bad value names the allowed ones."""
    with pytest.raises(ValueError) as ei:
        make_bwd_config("bfloat16", 128, False, dq_smem="qdo")
    assert str(ei.value).startswith("dq_smem='qdo' needs head_dim 192 or 256") and "allowed there: dq_smem='own'" \
        in str(ei.value)
    with pytest.raises(ValueError) as ei:
        make_bwd_config("bfloat16", 256, False, dq_smem="tmem")
    assert str(ei.value) == "dq_smem='tmem' not supported; allowed: own, qdo"
    assert make_bwd_config("bfloat16", 128, False).dq_smem == "own"
    assert make_bwd_config("bfloat16", 256, False, dq_reduce="red").dq_smem == "own"


@pytest.mark.parametrize("knobs,says", [
    (dict(dq_sum="pair", dq_smem="own"), "dq_sum='pair' needs dq_smem='qdo'"),
    (dict(dq_sum="pair", dq_reduce="red"), "dq_sum='pair' needs dq_smem='qdo' (head_dim 192 or 256, "
                                           "dq_reduce='bulk'), not dq_smem='own'; allowed there: dq_sum='cta'"),
    (dict(dq_sum="pair", mma_order="dv_dk_dq"), "dq_sum='pair' with mma_order='dv_dk_dq' spills registers"),
    (dict(dq_sum="trio"), "dq_sum='trio' not supported; allowed: cta, pair"),
])
def test_bwd_dq_sum_rejects_what_does_not_apply(knobs, says):
    with pytest.raises(ValueError) as ei:
        make_bwd_config("bfloat16", 256, False, **knobs)
    assert says in str(ei.value) and "\n" not in str(ei.value)


def test_bwd_dq_sum_pair_default_only_where_it_applies():
    """dq_sum defaults to "pair" at 256 and falls back to "cta" where the pair does not apply
    (another dq_smem or GEMM order), so those knobs keep working alone."""
    assert make_bwd_config("bfloat16", 256, True).dq_sum == "pair"
    for knobs in (dict(dq_smem="own"), dict(dq_reduce="red"), dict(mma_order="dv_dk_dq")):
        assert make_bwd_config("bfloat16", 256, False, **knobs).dq_sum == "cta", knobs
    assert make_bwd_config("bfloat16", 192, False, dq_smem="qdo").dq_sum == "cta"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", fa4kernel.BWD_HEAD_DIMS)
def test_bwd_mask_runs_only_where_a_block_needs_it(hd, causal):
    """`if need_mask` stays a branch: after the exp2 stream a BRA skips the selects (FSEL) to a
    label past the last of them, so a Q block off the causal diagonal and inside seqlen_k runs no
    mask (fa4sim's fa4kernel data: mask_every_block false)."""
    lines = [ln.split("*/")[-1].split(";")[0].strip() for ln in knob_sass(hd, causal).splitlines()]
    ex2 = max(i for i, ln in enumerate(lines) if "MUFU.EX2" in ln and i < next(
        j for j, s in enumerate(lines) if s.split()[:1] == ["FSEL"]))
    first = next(j for j in range(ex2, len(lines)) if lines[j].split()[:1] == ["FSEL"])
    branch = [ln for ln in lines[ex2:first] if " BRA " in f" {ln} "]
    assert branch, "no branch before the mask's selects"
    label = re.search(r"`\((\.L_x_\d+)\)", branch[-1]).group(1)
    at = next(j for j, ln in enumerate(lines) if ln.startswith(label + ":"))
    block = lines[first:at]
    assert at > first and all(not ln.startswith(("HGMMA", "MUFU")) for ln in block)
    assert sum(ln.startswith("FSEL") for ln in block) == sum(ln.startswith("FSEL") for ln in lines[ex2:at + 1])


def test_bwd_deterministic_fake_args_carry_the_semaphores():
    """The kernel's arguments: the dQ accumulator (b, h, s_q_pad, d) fp32 in both builds, then the
    semaphores, (b, h, query blocks) int32 when deterministic, None in the fast build."""
    import cutlass

    from fa4kernel.sm90.bwd import fake_bwd_args

    fast = fake_bwd_args(make_bwd_config("bfloat16", 128, True))
    det = fake_bwd_args(make_bwd_config("bfloat16", 128, True, True))
    assert len(fast) == len(det) == 10
    assert fast[7] is None and det[7].element_type == cutlass.Int32 and len(det[7].shape) == 3
    assert fast[6].element_type == det[6].element_type == cutlass.Float32 and len(det[6].shape) == 4


def test_bwd_deterministic_turns_follow_the_launch():
    """bwd_config.dq_turn (the kernel's _dq_turn in plain Python): for every query block, the CTAs
    that add into it, taken in launch order (launch_order), have the turns 0, 1, 2, ... (a pair's
    two CTAs both c u, then each adds 1): a CTA only waits for CTAs launched before it (no
    deadlock, however few run at once) and each semaphore ends at the number of adds. Causal
    builds launch each head's key blocks last first; odd lengths both ways, GQA heads."""
    from fa4kernel.sm90.bwd_config import cluster_ctas, dq_turn, launch_order

    for hd, knobs in ((64, {}), (64, {"tile_m": 64}), (128, {}), (192, {}), (256, {}), (256, {"dq_sum": "cta"}),
                      (256, {"grid_order": "tail_lpt"})):
        for causal in (False, True):
            for sq, sk in ((1000, 1000), (77, 1000), (1000, 333), (4096, 4096), (200, 64), (1, 1), (333, 333)):
                cfg = make_bwd_config("bfloat16", hd, causal, True, **knobs)
                c = cluster_ctas(cfg)
                order = launch_order(cfg, sk, 3, 2)
                m_max = -(-sq // cfg.tile_m)
                adds = {}  # (m_block, head, batch) -> turns in launch order
                for n, h, b in order:
                    first = n - n % c
                    m_min = 0
                    if causal:
                        m_min = min(max(first * cfg.tile_n - (sk - sq), 0) // cfg.tile_m, m_max)
                    for m in range(m_min, m_max):
                        adds.setdefault((m, h, b), []).append(dq_turn(cfg, n, m, sq, sk))
                for key, turns in adds.items():
                    assert turns == [i - i % c for i in range(len(turns))], (hd, knobs, causal, sq, sk, key, turns)
                if causal:
                    assert order[0][0] // c == -(-sk // (c * cfg.tile_n)) - 1  # the last key block (pair) first
