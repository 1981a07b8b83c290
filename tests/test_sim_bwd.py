"""The backward pass: per-tile feeds against the FA4 paper's roofline, the SM100 and SM90
backward schedules through simulate() and `fa4sim run --pass bwd`, and their one-line errors."""
import pytest

from fa4sim import hardware
from fa4sim.feeds import bwd_gemms, bwd_smem_parts, bwd_tile_costs

B200 = hardware.load("b200")


def test_bwd_roofline_one_cta_is_the_papers():
    # FA4 paper (arXiv 2603.05451), B200, M = N = d = 128: MMA 2560, shared memory 3328, exp 1024
    c = bwd_tile_costs(B200, 128, 128, 128, 128, two_cta=False)
    assert c["mma"] == 2560
    assert c["smem"] == 3328
    assert c["exp_mufu"] == 1024
    assert c["flops"] == 2.5 * 4 * 128 * 128 * 128  # 2.5 x the forward's tile


def test_bwd_roofline_smem_parts_one_cta():
    # 8 operand tiles of 32 KB read by the MMAs, dS stored once, dQ staged in fp32 and read back
    parts = bwd_smem_parts(B200, 128, 128, 128, 128, two_cta=False)
    assert parts == {"mma_operands": 2048, "dS_store": 256, "dS_exchange": 0, "dQ_store": 512, "dQ_reduce": 512}
    mma = bwd_gemms(B200, 128, 128, 128, 128, two_cta=False)
    assert {n: c.tensor_cycles for n, c in mma.items()} == {n: 512 for n in ("S", "dP", "dV", "dK", "dQ")}


def test_bwd_roofline_cta_pair_brings_smem_down_to_the_mma():
    # the paper: with a CTA pair shared memory exceeds the MMA time by only about 5 %; our
    # itemisation (half of every B operand per SM, half of dQ per SM, the dS exchange) gives 0 %
    one = bwd_tile_costs(B200, two_cta=False)
    pair = bwd_tile_costs(B200, two_cta=True)
    assert pair["mma"] == one["mma"] == 2560
    assert pair["exp_mufu"] == 1024
    assert 1.0 <= pair["smem"] / pair["mma"] <= 1.06
    assert pair["smem"] < one["smem"]
