"""CPU-only: the backward's clock-probe build (sm90/bwd.py, FlashBwdSm90Probe).

- it is the default backward plus exactly two clock64 and two globaltimer reads per CTA (its
  start and its end) and three 64-bit atomic adds (the running sums): the same wgmma, MUFU, TMA
  and bulk reduce-add counts and spills
- fa4kernel.trace.ctas_clock_ghz turns its stamps into the launch's clock: all CTAs' cycles
  over all their ns, unwritten or backward rows left out
- run_bwd refuses a stamps buffer too short for the grid (one line)
"""
import pytest

import fa4kernel
from fa4kernel import make_bwd_config
from fa4kernel.sm90.bwd import probe_words
from fa4kernel.trace import PROBE_SUM_WORDS, ctas_clock_ghz, probe_sums
from test_kernel_sm90_bwd_compile import assert_spills_as_designed
from test_kernel_sm90_trace import CLOCK_READ, TIMER_READ, count

_SASS = {}


def bwd_sass(head_dim, causal, clock_probe):
    key = (head_dim, causal, clock_probe)
    if key not in _SASS:
        cfg = make_bwd_config("bfloat16", head_dim, causal)
        _SASS[key] = fa4kernel.compile_bwd_sass(cfg, clock_probe=clock_probe)
    return _SASS[key]


@pytest.mark.compile
@pytest.mark.parametrize("hd,causal", [(128, False), (64, True), (256, True)])
def test_bwd_clock_probe_adds_only_four_stamps(hd, causal):
    plain, probe = bwd_sass(hd, causal, False), bwd_sass(hd, causal, True)
    assert len(CLOCK_READ.findall(probe)) == 2 and len(TIMER_READ.findall(probe)) == 2
    assert not CLOCK_READ.search(plain) and not TIMER_READ.search(plain)
    assert count(probe, "REDG.E.ADD.64") - count(plain, "REDG.E.ADD.64") == 3  # cycles, ns, CTAs
    for op in ("HGMMA", "MUFU", "UTMALDG", "UTMASTG", "UBLKRED"):
        assert count(probe, op) == count(plain, op), op
    assert count(probe, "HGMMA") > 0 and count(probe, "MUFU") > 0
    assert count(probe, "LDL") == count(plain, "LDL") and count(probe, "STL") == count(plain, "STL")
    assert_spills_as_designed(probe, make_bwd_config("bfloat16", hd, causal))


def test_ctas_clock_ghz_sums_every_cta():
    # two CTAs: 1.6e6 cycles over 1e6 ns and 2.0e5 over 1e5: 1.8e6 / 1.1e6 ns
    words = [100, 5000, 100 + 1_600_000, 5000 + 1_000_000, 7, 9, 7 + 200_000, 9 + 100_000]
    got = ctas_clock_ghz(words)
    assert got["ctas"] == 2 and got["ghz"] == pytest.approx(1.8e6 / 1.1e6)
    # an unwritten row (zeros) and one whose end precedes its start are left out
    got = ctas_clock_ghz(words + [0, 0, 0, 0] + [50, 50, 40, 60])
    assert got["ctas"] == 2 and got["ghz"] == pytest.approx(1.8e6 / 1.1e6)
    # a CTA within one globaltimer step (0 ns) keeps its cycles: the steps' rounding averages out
    got = ctas_clock_ghz(words + [10, 1000, 1010, 1000])
    assert got["ctas"] == 3 and got["ghz"] == pytest.approx((1.8e6 + 1000) / 1.1e6)
    assert ctas_clock_ghz([0] * 8)["ghz"] is None
    # the running sums after the rows (cycles, ns, CTAs, 0) are no row: left out
    got = ctas_clock_ghz(words + [3_600_000, 2_200_000, 4, 0])
    assert got["ctas"] == 2 and got["ghz"] == pytest.approx(1.8e6 / 1.1e6)


def test_probe_sums_are_the_buffers_last_words():
    words = [100, 5000, 1_600_100, 1_005_000] + [3_600_000, 2_200_000, 4, 0]
    got = probe_sums(words)
    assert got == {"ctas": 4, "cycles": 3_600_000, "ns": 2_200_000, "ghz": pytest.approx(3.6e6 / 2.2e6)}
    assert probe_sums([0] * 8)["ghz"] is None


def test_probe_words_cover_the_grid():
    cfg = make_bwd_config("bfloat16", 128, False)
    # 8 blocks of 128 keys, then the running sums
    assert probe_words(cfg, batch=2, seqlen_k=1000, heads_kv=3) == 4 * 8 * 3 * 2 + PROBE_SUM_WORDS
    pair = make_bwd_config("bfloat16", 256, False)
    assert pair.dq_sum == "pair"
    assert probe_words(pair, batch=1, seqlen_k=3 * 64, heads_kv=1) == 4 * 4 + PROBE_SUM_WORDS  # 3 blocks -> a pair


def test_run_bwd_refuses_a_short_stamps_buffer():
    torch = pytest.importorskip("torch")
    from fa4kernel.sm90.bwd import run_bwd

    cfg = make_bwd_config("bfloat16", 64, False)
    q = torch.randn(1, 128, 1, 64, dtype=torch.bfloat16)
    lse = torch.zeros(1, 1, 128)
    with pytest.raises(ValueError, match="stamps: torch.int64 x 3; allowed: int64 with at least 8 words") as ei:
        run_bwd(cfg, q, q, q, q, q, lse, 0.125, stamps=torch.zeros(3, dtype=torch.int64))
    assert "\n" not in str(ei.value)
