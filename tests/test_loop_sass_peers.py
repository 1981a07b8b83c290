"""The pure parsing helpers of lab/tools/loop_sass_peers.py and lab/tools/fa3_cubins.py: FA3
kernel names read into their configuration, cubins taken out of a fatbin, loops found in SASS
text, the KV loop chosen and counted. No kernel is compiled here."""
import struct

import pytest

from lab.tools import fa3_cubins as fa3
from lab.tools import loop_sass_peers as peers

# FA3's hd128 bf16 non-causal forward with PackGQA, 1x1 and 2x1 clusters (tokenspeed-fa3's library)
HEAD = ("_ZN7cutlass13device_kernelIN5flash11enable_sm90INS1_16FlashAttnFwdSm90INS1_25CollectiveMainloopFwdSm90ILi2E"
        "N4cute5tupleIJNS5_1CILi1EEE")
HD128 = (HEAD + "S8_S8_EEENS6_IJNS7_ILi128EEENS7_ILi176EEESA_EEELi128ENS_10bfloat16_tEfNS_4arch4Sm90ELb0ELb0ELb0ELb0"
         "ELb0ELb0ELb0ELb1ELb1ELb1ELb0ELb0ESD_EENS1_21CollectiveEpilogueFwdINS6_IJSA_SA_SB_EEES9_SD_SF_Li256ELb0ELb1"
         "ELb0ELb0EEENS1_29StaticPersistentTileSchedulerILb0EEEEEEEEEvNT_6ParamsE")
HD128_CLUSTER2 = (HEAD[:-len("CILi1EEE")] + "CILi2EEENS7_ILi1EEES9_EEENS6_IJNS7_ILi128EEENS7_ILi176EEESB_EEELi128ENS_10"
                  "bfloat16_tEfNS_4arch4Sm90ELb0ELb0ELb0ELb0ELb0ELb0ELb0ELb1ELb1ELb1ELb0ELb0ESE_EENS1_21CollectiveEpi"
                  "logueFwdINS6_IJSB_SB_SC_EEESA_SE_SG_Li256ELb0ELb1ELb0ELb0EEENS1_29StaticPersistentTileScheduler"
                  "ILb0EEEEEEEEEvNT_6ParamsE")


def test_fa3_name_gives_the_mainloop_configuration():
    cfg = fa3.fa3_config(HD128)
    assert (cfg["stages"], cfg["cluster"], cfg["tile_m"], cfg["tile_n"], cfg["head_dim"], cfg["head_dim_v"]) \
        == (2, (1, 1, 1), 128, 176, 128, 128)
    assert cfg["element"] == "cutlass::bfloat16_t" and cfg["scheduler"] == "StaticPersistentTileScheduler"
    on = {f for f in fa3.FA3_FLAGS if cfg[f]}
    assert on == {"mma_pv_is_rs", "intra_wg_overlap", "pack_gqa"}
    # the substitutions shift by one with a 2x1 cluster (C<2>, C<1> are two entries): same tile, same flags
    cfg2 = fa3.fa3_config(HD128_CLUSTER2)
    assert cfg2["cluster"] == (2, 1, 1) and (cfg2["tile_m"], cfg2["tile_n"], cfg2["head_dim"]) == (128, 176, 128)
    assert {f for f in fa3.FA3_FLAGS if cfg2[f]} == on
    # the epilogue's tile (M, hdim_v, N) is read through the same substitutions
    assert fa3.demangle_args(HD128)["flash::CollectiveEpilogueFwd"][1:5] == [
        ("cute::tuple", [[("cute::C", [1])] * 3]), "cutlass::bfloat16_t", "cutlass::arch::Sm90", 256]
    assert fa3.fa3_config("_Z3foov") is None and fa3.fa3_config("not mangled") is None


def test_fa3_pick_keeps_plain_kernels_and_prefers_the_2x1_cluster():
    plain = dict(fa3.fa3_config(HD128), pack_gqa=False)
    kernels = [(b"", "a", dict(plain, cluster=(1, 1, 1))), (b"", "b", dict(plain, cluster=(2, 1, 1))),
               (b"", "c", dict(plain, pack_gqa=True)), (b"", "d", dict(plain, varlen=True)),
               (b"", "e", dict(plain, causal=True)), (b"", "f", dict(plain, element="cutlass::half_t"))]
    assert [k[1] for k in fa3.fa3_pick(kernels, 128, False)] == ["b", "a"]
    assert [k[1] for k in fa3.fa3_pick(kernels, 128, True)] == ["e"]
    assert fa3.fa3_pick(kernels, 256, False) == []


def _elf(names, payload=b"", trailing_nobits=0):
    """A minimal ELF64 (e_machine 190): a null section, PROGBITS .text.<name> sections, .shstrtab,
    and an optional NOBITS section claiming `trailing_nobits` bytes past the end (which hold nothing)."""
    strtab = b"\0" + b"".join(b".text." + n.encode() + b"\0" for n in names) + b".shstrtab\0.bss\0"
    body = payload + strtab
    shoff = 64 + len(body)
    heads = [bytes(64)]
    off, name_off = 64, 1
    for n in names:
        heads.append(struct.pack("<IIQQQQIIQQ", name_off, 1, 0, 0, off, len(payload) // max(len(names), 1),
                                 0, 0, 1, 0))
        name_off += len(b".text." + n.encode() + b"\0")
    heads.append(struct.pack("<IIQQQQIIQQ", name_off, 3, 0, 0, 64 + len(payload), len(strtab), 0, 0, 1, 0))
    heads.append(struct.pack("<IIQQQQIIQQ", name_off + len(b".shstrtab\0"), 8, 0, 0, shoff + 64 * 4,
                             trailing_nobits, 0, 0, 1, 0))
    header = (b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 56,
                                                              0, 64, len(heads), len(names) + 1))
    return header + body + b"".join(heads)


def test_cubins_come_out_of_a_fatbin_whole_and_in_order():
    a, b = _elf(["kernel_a"], b"\x01" * 48, trailing_nobits=4096), _elf(["kernel_b", "kernel_c"], b"\x02" * 32)
    assert fa3.elf_size(a) == len(a)  # the NOBITS section adds nothing
    host = b"\x7fELF\x02" + struct.pack("<13xH", 62)  # a host ELF header in the way: not a cubin
    blob = b"fatbin header" + host + a + b"\0" * 8 + b + b"tail"
    got = fa3.cubins(blob)
    assert got == [a, b]
    assert [s for s in fa3.elf_sections(got[1]) if s.startswith(".text.")] == [".text.kernel_b", ".text.kernel_c"]


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_9:
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
.L_x_1:
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R3 ;
        /*0030*/               @!P0 BRA `(.L_x_5) ;
.L_x_2:
        /*0040*/                   WARPGROUP.ARRIVE ;
        /*0050*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR8], RZ, !UPT, gsb0 ;
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0070*/                   FMNMX R4, R88, R89, !PT ;
        /*0080*/                   FFMA R5, R88, UR5, -R4 ;
        /*0090*/                   MUFU.EX2 R5, R5 ;
        /*00a0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*00b0*/                   MUFU.EX2 R6, R6 ;
        /*00c0*/                   F2FP.BF16.F32.PACK_AB R7, R6, R5 ;
        /*00d0*/                   UIADD3 UR6, UR6, 0x1, URZ ;
        /*00e0*/               @P1 BRA `(.L_x_1) ;
        /*00f0*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR8], R88, gsb0 ;
        /*0100*/                   MUFU.EX2 R6, R6 ;
        /*0110*/               @P2 BRA `(.L_x_9) ;
        /*0120*/                   EXIT ;
.L_x_5:
        /*0130*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R3 ;
        /*0140*/               @!P0 BRA `(.L_x_5) ;
        /*0150*/                   BRA `(.L_x_2) ;
"""


def test_loops_skip_the_wait_retry_paths_after_exit():
    got = [(lp["label"], lp["start"], lp["end"]) for lp in peers.loops(SASS)]
    assert got == [(".L_x_1", 2, 14), (".L_x_9", 1, 17)]  # not .L_x_5's self loop nor its branch back to .L_x_2
    assert peers.loops(SASS)[0]["ops"][-1] == "BRA `(.L_x_1)"  # the predicate is dropped


def test_kv_loop_is_the_innermost_and_its_waits_sit_among_the_exp2s():
    loop = peers.kv_loop(SASS, tile_n=128)
    assert loop["label"] == ".L_x_1" and loop["instructions"] == 13
    assert loop["per_key"] == pytest.approx(13 / 128, abs=1e-3)
    c = loop["counts"]
    assert (c["HGMMA"], c["MUFU.EX2"], c["FMNMX"], c["FFMA"], c["F2FP"], c["SYNCS"], c["WG.ARRIVE"], c["WG.DEPBAR"],
            c["bookkeeping"], c["other"]) == (1, 2, 1, 1, 1, 1, 1, 2, 1, 2)  # other: the two BRAs
    assert sum(c.values()) == loop["instructions"]
    assert loop["opcodes"]["WARPGROUP.DEPBAR.LE"] == 2
    assert [(w["at"], w["ex2_before"]) for w in loop["waits"]] == [(0, 0), (4, 0), (8, 1)]
    assert loop["waits"][2]["instr"] == "WARPGROUP.DEPBAR.LE gsb0, 0x0"
    assert [(k["label"], k["innermost"], k["steady"]) for k in loop["candidates"]] == [
        (".L_x_1", True, True), (".L_x_9", False, False)]
    with pytest.raises(ValueError):
        peers.kv_loop("        /*0000*/                   EXIT ;\n", tile_n=128)


def test_ours_knobs_and_bad_input(capsys):
    assert peers.parse_knobs("128:tile_n=160,pingpong=false") == (128, {"tile_n": 160, "pingpong": False})
    assert peers.parse_knobs("exp_emulation=0.25") == (None, {"exp_emulation": 0.25})
    for bad in (["--ours-knobs", "tile_n"], ["--ours-knobs", "x:tile_n=1"], ["--hdims", "96"], ["--hdims", "a"]):
        with pytest.raises(SystemExit) as e:
            peers.main(bad)
        assert e.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
