"""CPU-only: the SM90 trace build (fa4kernel.diagnostics.trace_build) and the measured vs
simulated timeline tooling.

- the trace build compiles for sm_90a and reads the SM clock (CS2R Rx, SR_CLOCKLO: clock64)
  and the global timer; the default build reads neither (its code path is untouched)
- `trace` is not a user knob
- stamps buffer -> fa4kernel.trace.decode -> stamps JSON (lab/tools/timeline_sm90.build_doc)
  -> lab/tools/timeline_compare.compare (measured vs simulated interval, overlay figure)
"""
import json
import os
import re
import sys

import pytest

from fa4kernel import trace_layout as tl
from fa4kernel import make_config
from fa4kernel.diagnostics import NONE, trace_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "lab", "tools"))

CLOCK_READ = re.compile(r"\b(?:CS2R|S2R|S2UR)\s+U?R\w+,\s+SR_CLOCK(?:LO|HI)?\b")
TIMER_READ = re.compile(r"\b(?:CS2R|S2R|S2UR)\s+U?R\w+,\s+SR_GLOBALTIMER(?:LO|HI)?\b")

_SASS = {}


def sass(cfg, diagnostics=NONE):
    """The SASS of a build (cached per KernelConfig and Diagnostics)."""
    pytest.importorskip("cutlass")
    import fa4kernel

    if (cfg, diagnostics) not in _SASS:
        _SASS[cfg, diagnostics] = fa4kernel.compile_sass(cfg, arch="sm_90a", diagnostics=diagnostics)
    return _SASS[cfg, diagnostics]


def count(text, op):
    return len(re.findall(r"\s" + re.escape(op) + r"[\s.]", text))


@pytest.mark.compile
@pytest.mark.parametrize("hd,knobs", [
    (128, {}),
    (128, {"pingpong": False}),
    (128, {"intra_wg_overlap": False}),
    (64, {}),
], ids=["hd128", "hd128-pingpong-off", "hd128-overlap-off", "hd64"])
def test_trace_build_reads_clock_default_build_does_not(hd, knobs):
    cfg = make_config("bfloat16", hd, False, False, knobs)
    plain, traced = sass(cfg), sass(cfg, trace_build())
    assert not CLOCK_READ.search(plain) and not TIMER_READ.search(plain), \
        "default build reads the clock: the trace code leaked into it"
    n_clock = len(CLOCK_READ.findall(traced))
    # producer (waits + K/V/Q issues) and consumer (QK, PV, MAX, EXP, CVT, RESC, FIN, ...) stamps
    assert n_clock >= 30, n_clock
    assert len(TIMER_READ.findall(traced)) >= 2  # kernel start and end
    for t in (plain, traced):
        assert count(t, "HGMMA") > 0 and count(t, "UTMALDG") > 0 and count(t, "UTMASTG") > 0
    assert count(traced, "LDL") == 0 and count(traced, "STL") == 0, "trace build spills"
    # the math is the same: as many exp2 and wgmma instructions
    assert count(traced, "MUFU.EX2") == count(plain, "MUFU.EX2")
    assert count(traced, "HGMMA") == count(plain, "HGMMA")


@pytest.mark.compile
@pytest.mark.parametrize("light", [False, True], ids=["full", "light"])
def test_traced_builds_keep_the_exp2s_ahead_of_the_pv_wait(light):
    """The stamps' clock reads pin the source order: in the traced builds the block's exp2s come
    before the PV wait, where the normal build has ptxas hoist the wait above them. So a traced
    timeline shows that (measured slower) order; timeline_compare simulates it with
    pv_wait=after_softmax."""
    cfg = make_config("bfloat16", 128, False, False, {"rescale_threshold": None})  # the always-rescale order

    def ex2_before_wait(text):
        i = text.index("WARPGROUP.DEPBAR.LE gsb0, 0x1")
        return count(text[i:text.index("WARPGROUP.DEPBAR.LE gsb0, 0x0", i)], "MUFU.EX2")

    assert ex2_before_wait(sass(cfg, trace_build(light))) >= 60
    assert ex2_before_wait(sass(cfg)) <= 12  # the acc_scale exp2s and a few P exp2s (10 at hd128)


def test_trace_is_not_a_user_knob():
    with pytest.raises(ValueError, match="unknown knob"):
        make_config("bfloat16", 128, False, False, {"trace": True})
    from fa4kernel.interface import _build_key

    cfg = make_config("bfloat16", 128, False, False, {})
    assert "trace" not in cfg.as_dict() and trace_build().trace is True
    # a separate compile-cache entry; the normal build's key is the KernelConfig itself
    assert _build_key(cfg, trace_build()) != _build_key(cfg) == cfg


# ---------------------------------------------------------------- stamps -> JSON -> compare
def _put(words, role, tile, it, op, start, end):
    i = tl.TRACE_HEADER + (((role * tl.TRACE_TILES + tile) * tl.TRACE_ITERS + it) * tl.TRACE_OPS + op) * 2
    words[i], words[i + 1] = start, end


def synthetic_words(n_iter=24, period=2000, clk0=7_000_000):
    """A periodic 2-consumer-WG timeline (hd128-like), as the kernel would write it."""
    w = [0] * tl.TRACE_WORDS
    w[0], w[1], w[2], w[5] = 0, clk0, 10**12, 132
    for it in range(n_iter):
        t = clk0 + 1000 + it * period
        _put(w, 0, 0, it, tl.T_WAIT_K, t - 900, t - 850)
        _put(w, 0, 0, it, tl.T_LK, t - 850, t - 840)
        _put(w, 0, 0, it, tl.T_LV, t - 800, t - 790)
        for wg in range(2):
            s = t + wg * period // 2
            role = 1 + wg
            _put(w, role, 0, it, tl.T_WAIT_K, s - 20, s - 10)
            _put(w, role, 0, it, tl.T_QK, s, s + 900)
            _put(w, role, 0, it, tl.T_PP, s + 60, s + 90)
            _put(w, role, 0, it, tl.T_MAX, s + 900, s + 1050)
            _put(w, role, 0, it, tl.T_EXP, s + 1050, s + 1550)
            _put(w, role, 0, it, tl.T_CVT, s + 1700, s + 1760)
            _put(w, role, 0, it, tl.T_RESC, s + 1760, s + 1820)
            if it:
                _put(w, role, 0, it - 1, tl.T_PV, s + 30, s + 1650)
    end = clk0 + 1000 + n_iter * period + 3000
    w[3], w[4] = end, w[2] + round((end - clk0) / 1.8)
    _put(w, 3, 0, n_iter - 1, tl.T_ST, end - 1000, end - 100)
    return w


def test_decode_stamps():
    from fa4kernel import trace as ftrace

    dec = ftrace.decode(synthetic_words(), num_wg=2, pingpong=True)
    assert dec["clock_ghz_in_kernel"] == pytest.approx(1.8, rel=1e-3)
    ops = {e["op"] for e in dec["events"]}
    assert {"LK", "LV", "QK0", "QK1", "PV0", "PV1", "MAX0", "EXP1", "CVT0", "RESC1", "PP0", "ST"} <= ops
    assert {e["op"] for e in dec["waits"]} == {"WAIT_K", "WAIT_K0", "WAIT_K1"}
    roles = {e["role"] for e in dec["events"]}
    assert roles == {"load", "wg0", "wg1", "epilogue"}
    assert min(e["start"] for e in dec["events"]) > 0  # relative to the kernel-start stamp
    assert ftrace.interval(dec["events"], "QK0") == 2000
    # pingpong off: PP goes to the waits
    dec2 = ftrace.decode(synthetic_words(), num_wg=2, pingpong=False)
    assert "PP0" not in {e["op"] for e in dec2["events"]}


def test_timeline_compare_on_synthetic_stamps(tmp_path):
    pytest.importorskip("simpy")
    pytest.importorskip("matplotlib")
    import timeline_compare
    import timeline_sm90
    from fa4kernel import trace as ftrace

    cfg = make_config("bfloat16", 128, False, False, {})
    dec = ftrace.decode(synthetic_words(), num_wg=2, pingpong=True)
    doc = timeline_sm90.build_doc("synthetic", 128, {}, cfg, dec, "NVIDIA H200", 0, {})
    assert doc["meta"]["clock_ghz_in_kernel"] == pytest.approx(1.8, rel=1e-3)
    assert doc["meta"]["hw_profile"] == "h200"
    doc["meta"]["problem"] = dict(doc["meta"]["problem"], batch=1, heads=2, seqlen_q=2048, seqlen_k=2048)
    path = tmp_path / "timeline_synthetic.json"
    path.write_text(json.dumps(doc))
    lines = []
    res = timeline_compare.compare(str(path), figdir=str(tmp_path), out=lines.append)
    assert res["measured_interval"] == pytest.approx(2000)
    assert res["simulated_interval"] and res["simulated_interval"] > 0
    assert res["hw"] == "h200"
    text = "\n".join(lines)
    assert "measured 2000.0 cycles" in text and "simulated" in text
    png = tmp_path / "timeline_overlay_synthetic.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    # the CLI entry point too, on the H100 profile
    timeline_compare.main([str(path), "--hw", "h100", "--figdir", str(tmp_path)])
