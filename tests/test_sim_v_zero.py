"""fa4sim's cost of fa4kernel's V zeroing (sm90/fwd.py _zero_v_past_keys): which tiles of a varlen
or split-KV launch zero V rows past their sequence's keys, how many, and what a tile pays for them
(fa3_sm90.v_zero_cycles, from the zeroing loop's SASS counts in the implementation's v_zero_sass)."""
import math

import pytest

from fa4sim import Problem, simulate
from fa4sim.hardware import load as load_hw
from fa4sim.implementation import load
from fa4kernel.sass import dependent_chain
from fa4sim.kernel_model import past_keys, split_units, varlen_units
from fa4sim.params import Context
from fa4sim.schedules import fa3_sm90

SHORT = Problem.varlen(16, 128, [332] * 64, None, causal=True)  # 332 = 2 x 128 + 76


def test_dependent_chain_follows_registers_and_predicates():
    trip = ["SHF.R.S32.HI R17, RZ, 0x1f, R14",      # 1
            "LEA.HI R17, R17, R14, RZ, 0x7",         # 2 (R17)
            "VIADD R14, R14, 0x100",                 # 1: not on R17's chain
            "ISETP.GE.AND P0, PT, R17, 0x3f00, PT",  # 3
            "@!P0 IMAD.MOV R18, RZ, RZ, R17",        # 3 (its guard dropped by loop_bodies)
            "STS.U16 [R18], RZ",                     # 4: reads R18
            "BRA `(.L_x_30)"]
    assert dependent_chain(trip) == 4
    assert dependent_chain(["MOV R1, R2", "MOV R3, R4"]) == 1


def test_past_keys_is_the_last_blocks_rows_past_the_sequence():
    assert past_keys(3, 332, 128) == 52 and past_keys(2, 332, 128) == 0  # a causal tile short of the end
    assert past_keys(3, 384, 128) == 0  # the keys fill their blocks
    assert past_keys(1, 0, 128) == 128  # a sequence without keys: the whole block


def test_varlen_and_split_units_carry_their_zero_rows():
    units = varlen_units(SHORT, 128, 128)
    assert [u.zero_rows for u in units[:3]] == [0, 0, 52]  # only the tile that reaches the last block
    chunks = split_units(varlen_units(Problem.varlen(8, 128, [1], [5000]), 128, 128), 4)
    assert [c.zero_rows for c in chunks] == [0, 0, 0, 40 * 128 - 5000]  # 40 blocks, 10 a chunk


def test_a_tile_pays_the_v_wait_its_trips_and_the_barrier_and_only_fa4kernel_zeroes():
    hw = load_hw("h100")
    ours, fa3 = load("fa4kernel", "sm90"), load("flash-attn-3", "sm90")
    k = simulate("h100", problem=SHORT, impl="fa4kernel").knobs
    wait, work = fa3_sm90.v_zero_cycles(hw, SHORT, k, ours, 52)
    assert "v_zero_loop_instr" in ours.params and "v_zero_loop_instr" not in fa3.params
    ctx = Context(SHORT, hw, ours)
    instr, chain, elems = (ours.value(n, ctx, k) for n in ("v_zero_loop_instr", "v_zero_loop_chain",
                                                           "v_zero_elems_per_trip"))
    assert wait == pytest.approx(128 * 128 * 2 / hw.tma_bytes_per_clk)
    trips = math.ceil(52 * 128 / (256 * elems))  # 256 consumer threads at hd128
    trip = max(chain * hw.fma_latency, instr * 8 / hw.issue_per_clk)
    assert work == pytest.approx(trips * trip + hw.named_barrier_latency)
    assert fa3_sm90.v_zero_cycles(hw, SHORT, k, ours, 0) == (0.0, 0.0)
    assert fa3_sm90.v_zero_cycles(hw, SHORT, k, fa3, 52) == (0.0, 0.0)  # its TMA loads zero-fill


def test_the_zeroing_shows_in_a_launch_of_short_sequences():
    full = simulate("h100", problem=SHORT, impl="fa4kernel")
    none = simulate("h100", problem=SHORT, impl="fa4kernel",
                    overrides={"v_zero_loop_instr": 0, "v_zero_loop_chain": 0})
    assert full.time_us > none.time_us
    filled = simulate("h100", problem=Problem.varlen(16, 128, [384] * 64, None, causal=True), impl="fa4kernel")
    same = simulate("h100", problem=Problem.varlen(16, 128, [384] * 64, None, causal=True), impl="fa4kernel",
                    overrides={"v_zero_loop_instr": 0, "v_zero_loop_chain": 0})
    assert filled.time_us == pytest.approx(same.time_us)  # no partial block, nothing to zero


def test_a_trip_of_zeroing_is_a_loop_of_2_byte_stores_or_one_run_of_16_byte_ones():
    from fa4kernel.sass import v_zero_trip

    loop = """.L_x_30:
        /*3ee0*/                   VIADD R14, R14, 0x100 ;
        /*3ef0*/                   LEA R17, R14, UR41, 0x1 ;
        /*3f00*/                   STS.U16 [R17], RZ ;
        /*3f10*/              @!P0 BRA `(.L_x_30) ;"""
    trip, elems = v_zero_trip(loop)
    assert elems == 1 and len(trip) == 4 and dependent_chain(trip) == 3
    run = """        /*3f40*/              @!P0 BRA `(.L_x_27) ;
        /*3f50*/              @!P1 STS.128 [R17], RZ ;
        /*3f60*/               @P2 STS.128 [R17+0x1000], RZ ;
        /*3f70*/               @P3 STS.128 [R17+0x2000], RZ ;
        /*3fd0*/                   MEMBAR.ALL.CTA ;"""
    trip, elems = v_zero_trip(run)
    assert elems == 24 and len(trip) == 3 and dependent_chain(trip) == 1
    with pytest.raises(ValueError, match="no V zeroing"):
        v_zero_trip("        /*0000*/                   EXIT ;")


@pytest.mark.parametrize("name", ["v_zero_elems_per_trip", "combine_partial_splits_per_round",
                                  "combine_lse_splits_per_round"])
def test_a_divisor_set_to_0_is_one_line_exit_2(name, capsys):
    from fa4sim.cli import main

    code = main(["run", "--hw", "h100", "--impl", "fa4kernel", "--seqlens", "332,332", "--heads", "16", "--causal",
                 "--set", f"{name}=0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and name in err and "\n" not in err and ">= " in err
