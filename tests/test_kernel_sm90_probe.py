"""CPU-only: the clock-probe builds of the SM90 kernel (fa4kernel.diagnostics.probe_build).

- the clock-probe build is the normal kernel plus exactly two clock64 and two globaltimer reads
  (CTA start and end) and three atomic adds into the header's running sums: same wgmma, MUFU
  and FMNMX counts, no spills
- the skip-softmax build keeps the wgmma + TMA skeleton and drops the softmax (no FMNMX, only the
  epilogue's few MUFU)
- the CTA-log build adds per-CTA stamps and the SM id outside the KV loop; a persistent one
  also stamps each tile's start (the tile log), still outside the KV loop
- none is a user knob (diagnostics are not knobs); fa4kernel.trace.header_clock turns a header
  into cycles / ns
"""
import pytest

from fa4kernel import make_config
from fa4kernel.diagnostics import NAMES, probe_build
from fa4kernel.sass import kv_loop
from fa4kernel.trace import header_clock
# the SASS helpers (and their compile cache) of the instrumented-build tests
from test_kernel_sm90_trace import CLOCK_READ, TIMER_READ, count, sass


@pytest.mark.compile
def test_clock_probe_build_adds_only_the_header_stamps():
    cfg = make_config("bfloat16", 128, False, False, {})
    plain, probe = sass(cfg), sass(cfg, probe_build())
    assert len(CLOCK_READ.findall(probe)) == 2 and len(TIMER_READ.findall(probe)) == 2
    assert not CLOCK_READ.search(plain)
    for op in ("HGMMA", "MUFU", "FMNMX", "FFMA", "UTMALDG"):
        assert count(probe, op) == count(plain, op) > 0, op
    assert count(probe, "STL") == 0
    # the running sums: one 64-bit atomic add each of cycles, ns and spans, at the kernel's end
    assert count(probe, "REDG.E.ADD.64") == 3 and count(plain, "REDG") == 0


@pytest.mark.compile
def test_skip_softmax_build_drops_the_softmax():
    cfg = make_config("bfloat16", 128, False, False, {})
    plain, skip = sass(cfg), sass(cfg, probe_build(skip_softmax=True))
    # the GEMMs stay: per KV block (its P: 32 F2FP at 128 keys) the steady loop issues the same 16
    # HGMMA; ptxas unrolls the skip build's short loop over two blocks
    from fa4kernel.sass import kv_loop, loop_bodies

    def per_block(ops):
        return sum(x.startswith("HGMMA") for x in ops) / (sum(x.startswith("F2FP") for x in ops) / 32)

    steady = min((o for _, o in loop_bodies(skip) if any(x.startswith("HGMMA") for x in o)), key=len)
    assert per_block(steady) == per_block(kv_loop(plain)) == 16
    assert count(skip, "FMNMX") == 0 < count(plain, "FMNMX")
    assert count(skip, "MUFU") < count(plain, "MUFU") // 10


@pytest.mark.parametrize("name", NAMES)
def test_diagnostics_are_not_user_knobs(name):
    """Every diagnostic field is refused as a knob, by make_config and by attention() (one line,
    before any device check), and the KernelConfig has no such field."""
    value = "max" if name == "ablate" else True
    with pytest.raises(ValueError, match=f"unknown knob\\(s\\) {name};"):
        make_config("bfloat16", 128, False, False, {name: value})
    assert name not in make_config("bfloat16", 128, False, False, {}).as_dict()
    torch = pytest.importorskip("torch")
    import fa4kernel

    q = torch.zeros(1, 64, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"unknown knob\\(s\\) {name};") as ei:
        fa4kernel.attention(q, q, q, **{name: value})
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize("kw,says", [
    (dict(ablate="vote_sum"), "ablate='vote_sum': unknown vote_sum; allowed: max, exp, sum, rescale"),
    (dict(ablate="max,bogus"), "unknown bogus"),
    (dict(cta_log=True, clock_probe=False), "cta_log=True needs clock_probe=True"),
])
def test_bad_probe_builds_fail_in_one_line(kw, says):
    with pytest.raises(ValueError) as ei:
        probe_build(**kw)
    assert says in str(ei.value) and "\n" not in str(ei.value)


def test_mean_clock():
    """The header's running sums: cycles over ns of every span added; no span gives None."""
    from fa4kernel.trace import mean_clock
    from fa4kernel.trace_layout import SUM_CYCLES, SUM_NS, SUM_SPANS, TRACE_HEADER

    words = [0] * TRACE_HEADER
    words[SUM_CYCLES], words[SUM_NS], words[SUM_SPANS] = 3_000_000, 2_000_000, 7
    assert mean_clock(words) == {"spans": 7, "cycles": 3_000_000, "ns": 2_000_000, "ghz": pytest.approx(1.5)}
    assert mean_clock([0] * TRACE_HEADER)["ghz"] is None


def test_header_clock():
    # 1.8e6 cycles over 1e6 ns = 1.8 GHz; an unwritten header gives None, not a division error
    assert header_clock([0, 100, 5000, 100 + 1_800_000, 5000 + 1_000_000])["ghz"] == pytest.approx(1.8)
    assert header_clock([0, 0, 0, 0, 0])["ghz"] is None


@pytest.mark.compile
def test_cta_log_build_adds_stamps_outside_the_kv_loop():
    """The CTA-log build (every CTA: SM id, start and end stamps) keeps the clock-probe build's
    KV loop; its extra reads are one %smid and two more clock64 / globaltimer pairs."""
    cfg = make_config("bfloat16", 256, True, False, {})
    probe, log = sass(cfg, probe_build()), sass(cfg, probe_build(cta_log=True))
    assert len(CLOCK_READ.findall(log)) == 4 and len(TIMER_READ.findall(log)) == 4
    assert "SMID" in log and "SMID" not in probe
    a, b = kv_loop(log), kv_loop(probe)
    assert len(a) == len(b)  # ptxas may pick IMAD.MOV for IMAD somewhere; nothing is added
    for op in ("HGMMA", "MUFU", "FMNMX", "FFMA", "SYNCS"):
        assert sum(o.startswith(op) for o in a) == sum(o.startswith(op) for o in b) > 0, op
    with pytest.raises(ValueError, match="cta_log"):
        probe_build(clock_probe=False, cta_log=True)


@pytest.mark.compile
def test_persistent_cta_log_build_also_stamps_each_tile_start():
    """A persistent CTA-log build adds one clock64 read per tile (in the tile loop, outside the
    KV loop) to the four of a CTA-log build; the KV loop is the clock-probe build's."""
    cfg = make_config("bfloat16", 128, False, False, {"persistent": True})
    probe, log = sass(cfg, probe_build()), sass(cfg, probe_build(cta_log=True))
    assert len(CLOCK_READ.findall(log)) == 5 and len(TIMER_READ.findall(log)) == 4
    a, b = kv_loop(log), kv_loop(probe)
    assert len(a) == len(b)
    for op in ("HGMMA", "MUFU", "FMNMX", "FFMA", "SYNCS"):
        assert sum(o.startswith(op) for o in a) == sum(o.startswith(op) for o in b) > 0, op


def test_cta_log_decode():
    from fa4kernel.trace import cta_log
    from fa4kernel.trace_layout import CTA_LOG_WORDS, TRACE_HEADER, TRACE_WORDS

    words = [0] * TRACE_WORDS
    for cta, (sm, g0, g1, c0, c1) in enumerate([(5, 1000, 3000, 10, 3610), (7, 1200, 2200, 50, 1850)]):
        words[TRACE_HEADER + cta * CTA_LOG_WORDS:TRACE_HEADER + (cta + 1) * CTA_LOG_WORDS] = [sm, g0, g1, c0, c1, 1]
    rows = cta_log(words, grid=3)  # CTA 2 never wrote: dropped, not a zero row
    assert rows == [{"cta": 0, "sm": 5, "start_ns": 0, "end_ns": 2000, "cycles": 3600},
                    {"cta": 1, "sm": 7, "start_ns": 200, "end_ns": 1200, "cycles": 1800}]


def test_tile_log_decode():
    """A persistent CTA-log build's tile log: each tile runs from its start stamp to the next
    tile's, the last one to the CTA's end stamp; a CTA that did not write everything is dropped."""
    from fa4kernel.trace import tile_log
    from fa4kernel.trace_layout import CTA_LOG_WORDS, TILE_LOG_BASE, TILE_LOG_CTAS, TRACE_HEADER, TRACE_WORDS

    words = [0] * TRACE_WORDS
    table = [[4, 1, -1], [0, 2, 3], [5, -1, -1]]
    for cta, (c0, c1) in enumerate([(100, 900), (50, 2000), (10, 20)]):
        words[TRACE_HEADER + cta * CTA_LOG_WORDS:TRACE_HEADER + (cta + 1) * CTA_LOG_WORDS] = [0, 0, 1, c0, c1, 1]
    for tile, t0 in {4: 100, 1: 400, 0: 50, 2: 700, 3: 1500}.items():  # tile 5 (CTA 2) never stamped
        words[TILE_LOG_BASE + tile] = t0
    assert tile_log(words, table) == [
        {"cta": 0, "tile": 4, "k": 0, "cycles": 300}, {"cta": 0, "tile": 1, "k": 1, "cycles": 500},
        {"cta": 1, "tile": 0, "k": 0, "cycles": 650}, {"cta": 1, "tile": 2, "k": 1, "cycles": 800},
        {"cta": 1, "tile": 3, "k": 2, "cycles": 500}]
    with pytest.raises(ValueError, match="persistent grid"):
        tile_log(words, [[0]] * (TILE_LOG_CTAS + 1))
