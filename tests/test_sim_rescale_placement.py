"""The O rescale before the PV GEMM (hd256) issues as the S GEMM starts, as ptxas compiles it: after
the GEMM's first k-step, not after the wgmma queue has taken the whole GEMM."""
import pytest

from fa4sim import Problem, simulate
from fa4sim.model import build_cta
from fa4sim.schedules import fa3_sm90


def build(hdim, **knobs):
    return build_cta("h100", Problem(1, 1, 128, 8192, hdim, False), knobs, 12, 0, schedule="fa3")


def order(sched, role):
    return [o.name for o in sched.ops if o.role == role]


def test_the_rescale_sits_between_the_s_gemms_first_kstep_and_the_rest():
    s = build(256)  # fa4kernel's hd256: tile_n 64, O rescaled before PV
    for w in (0, 1):
        names = order(s, f"wg{w}")
        assert names.index(f"QKH{w}") < names.index(f"RESC{w}") < names.index(f"QK{w}") < names.index(f"PV{w}")
    head, rest = s.op("QKH0"), s.op("QK0")
    assert head.chunks == fa3_sm90.QK_HEAD_KSTEPS and head.chunks + rest.chunks == 256 // 16
    whole = build(256, rescale_before_pv=False).op("QK0")  # the same GEMM in one op
    for unit in ("tensor", "smem", "issue"):
        assert dict(head.uses)[unit] + dict(rest.uses)[unit] == pytest.approx(dict(whole.uses)[unit])
    assert head.issue_cycles + rest.issue_cycles == pytest.approx(whole.issue_cycles)
    # the loads gate the GEMM's first HGMMA; the softmax waits for the whole GEMM
    edges = {(e.src, e.dst) for e in s.edges if e.distance == 0}
    assert {("LQ", "QKH0"), ("LK", "QKH0"), ("QK0", "MAX0")} <= edges


@pytest.mark.parametrize("hdim,knobs", [(128, {"rescale_threshold": None}), (64, {"rescale_threshold": None}),
                                        (256, {"rescale_before_pv": False}), (256, {"intra_wg_overlap": False})])
def test_without_the_rescale_before_pv_the_s_gemm_stays_one_op(hdim, knobs):
    s = build(hdim, **knobs)
    assert not any(o.name.startswith("QKH") for o in s.ops)


def test_issuing_the_rescale_at_the_gemms_start_keeps_the_tensor_core_busier(monkeypatch):
    """Issued after the whole S GEMM, the rescale starts only when the wgmma queue has room for the
    GEMM's last k-step, a few k-steps before the tensor core runs dry, and PV waits for it: the
    tensor core idles. Issued after the first k-step it overlaps the GEMM: the loop is shorter and
    the tensor core busier."""
    p = Problem(1, 1, 128, 8192, 256, False)
    at_start = simulate("h100", "fa3", p)
    monkeypatch.setattr(fa3_sm90, "QK_HEAD_KSTEPS", 0)  # no head: the rescale after the whole GEMM
    after_gemm = simulate("h100", "fa3", p)
    assert at_start.interval < after_gemm.interval
    assert at_start.utilization["tensor"] > after_gemm.utilization["tensor"]


def test_the_rescale_among_the_hgmmas_issues_at_the_inline_rate():
    """Issued by the wgmma warps between their own HGMMAs, the rescale gets the rate bench_bursts
    --inline measured for that placement (inline_issue_under_mma), not a separate burst's
    (dense_issue_under_mma); after the PV wait it keeps the separate burst's. A lower inline rate
    makes the rescale take the issue slots longer: the loop is no shorter."""
    from fa4sim import hardware

    hw = hardware.load("h100")
    assert dict(build(256).op("RESC0").slowed) == {"issue": hw.inline_issue_under_mma}
    assert dict(build(256, rescale_before_pv=False).op("RESC0").slowed) == {"issue": hw.dense_issue_under_mma}
    p = Problem(1, 1, 128, 8192, 256, False)
    t = [simulate("h100", "fa3", p, {"inline_issue_under_mma": v}).interval for v in (0.2, 0.451, 1.0)]
    assert t[0] > t[1] >= t[2]
    after = [simulate("h100", "fa3", p, {"inline_issue_under_mma": v, "rescale_before_pv": False}).interval
             for v in (0.2, 1.0)]
    assert after[0] == after[1]  # not used when the rescale follows the PV wait
