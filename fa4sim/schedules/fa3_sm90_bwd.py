"""FA3-style backward on SM90 (H100/H200): flash-attn-4's flash_bwd_sm90.py and fa4kernel's own
sm90/bwd.py (docs/reference/fa4-backward-and-solvers.md; docs/model.md, "The backward pass").

A CTA owns one KV tile (tile_n keys) and iterates over the Q blocks (tile_m rows) that see it;
one CTA per KV tile. Roles:
  load      producer warpgroup, warp 0: TMA of K and V once, then per Q block Q (+ LSE) and
            dO (+ dPsum) through q_stages and do_stages slots
  dq_store  producer warpgroup, warp 1 (dq_reduce "bulk"): per Q block, for each warpgroup's share
            of dQ, a TMA bulk reduce-add from fp32 shared memory into the fp32 dQ accumulator;
            with dq_smem "qdo" it then waits until the adds have read the Q/dO stage they came
            from and releases that stage to the load warp
  wg{w}     two MMA warpgroups; each issues its part of the five wgmmas per Q block and keeps
            its part of the dK and dV accumulators in registers:
              S = Q K^T, dP = dO V^T (async), P = exp2(S scale - LSE) while dP runs, dS = P (dP
              - dPsum), dS -> shared memory (and P, where dV takes it from there), then
              mma_order "dv_dq_dk" (flash-attn-4): dV += P^T dO, a barrier of both warpgroups,
                dQ = dS K, dK += dS^T Q; dQ leaves while dK runs; a wait for dK
              mma_order "dv_dk_dq" (fa4kernel's default): a barrier, dV, dK, dQ, a wait for all
                three, then dQ leaves
            dQ leaves to fp32 shared memory for the dq_store warp (dq_reduce "bulk") or by
            per-thread RED.ADD.F32x2 into the accumulator in global memory ("red"); with "bulk"
            it is staged in a buffer of its own (dq_smem "own") or, where each warpgroup owns
            head_dim / 2 columns of dK, dV and dQ (kv_split), in the Q/dO stage it was computed
            from (dq_smem "qdo": the first half of its floats over its dO columns once its dV is
            done, the second half over its Q columns once its dK is done)
The implementation chooses the tile, how the two warpgroups split each GEMM (atom layouts,
swapped operands), the GEMM order, the dQ path, where LSE and dPsum come from, and whether every
Q block is masked. A warpgroup that computes M = 128 rows issues two m64 wgmmas, each reading
the whole B operand.
"""
from __future__ import annotations

from dataclasses import replace

from ..engine import Edge, Op, Schedule
from ..errors import InputError
from ..params import Context, Knob, Problem
from ..softmax import add, beside_gemm, exp2_phase, mix_limits, phase, scaled
from ..tensor_core import BYTES, check_shape
from . import kernel_bwd
from ..hardware import LSU_WARP_INSTR_PER_CLK
from .fa3_sm90 import LSU_SHARE_FLOOR

NAME = "fa3"
ARCH = "sm90"
PASS = "bwd"
DESCRIPTION = ("FA3-style backward (SM90: producer warpgroup, two MMA warpgroups issuing five wgmmas per Q "
               "block, dQ reduce-added in fp32 through shared memory or by RED from registers)")
DEFAULT_IMPL = "fa4kernel"  # as the forward

PIECES = 8
WGS = 2
STSM_BYTES = 512   # one stmatrix .x4 warp instruction: 4 8x8 bf16 matrices
STS128_BYTES = 512  # one 128-bit store per thread of a warp
RED_BYTES = 256    # one RED.ADD.F32x2 warp instruction: two fp32 per thread
DQW_PIECE_BYTES = 256  # the dQ stores' piece (2 cycles of shared memory)

KNOBS = [
    Knob("tile_m", 64, "rows", "Q rows per Q block", minimum=16, maximum=256),
    Knob("tile_n", 128, "keys", "keys per KV tile", minimum=16, maximum=256),
    Knob("dq_reduce", "bulk", "", "how dQ reaches its fp32 accumulator: bulk = fp32 shared memory and one TMA bulk "
         "reduce-add per dQ warpgroup, issued by producer warp 1; red = every thread's RED.ADD.F32x2 from "
         "registers", kind="choice", choices=("bulk", "red")),  # before q_stages: a stage count may follow it
    Knob("dq_smem", "own", "", "where dq_reduce bulk stages a warpgroup's fp32 dQ: own = a buffer of its own "
         "(tile_m x head dim x 4 bytes); qdo = over the Q/dO stage it was computed from (its dO columns once its "
         "dV is done, its Q columns once its dK is done), released to the load warp after the bulk reduce-adds "
         "have read it (kv_split only)", kind="choice", choices=("own", "qdo")),  # before q_stages too
    Knob("q_stages", 2, "slots", "shared-memory stages of Q (+ LSE)", minimum=1, maximum=3),
    Knob("do_stages", 2, "slots", "shared-memory stages of dO (+ dPsum)", minimum=1, maximum=3),
    Knob("pds_stages", 2, "slots", "shared-memory stages of P and dS", minimum=1, maximum=2),
    Knob("sdp_swapab", True, "", "S and dP computed transposed (keys on the wgmma's M)", kind="bool"),
    Knob("dkv_swapab", False, "", "dK and dV computed transposed (head dim on M)", kind="bool"),
    Knob("dq_swapab", False, "", "dQ computed transposed (head dim on M)", kind="bool"),
    Knob("atom_sdp", 1, "WGs", "warpgroups along the Q rows of S and dP (the rest along the keys; swapped "
         "with the GEMM)", choices=(1, 2)),
    Knob("atom_dkv", 2, "WGs", "warpgroups along the keys of dK and dV (the rest along the head dim)", choices=(1, 2)),
    Knob("atom_dq", 1, "WGs", "warpgroups along the Q rows of dQ (the rest along the head dim)", choices=(1, 2)),
    Knob("p_with_ds", False, "", "where dV takes P from shared memory: P goes there with dS, after the dS math, behind "
         "the one dS barrier (fa4kernel at head dims 192, 256); false: P is stored after the exp2s, behind a barrier "
         "of its own", kind="bool"),
    Knob("dq_single_wg", False, "", "only warpgroup 0 computes dQ", kind="bool"),
    Knob("mma_order", "dv_dq_dk", "", "the three GEMMs after dS: dv_dk_dq = the dS barrier, then dV, dK, dQ, a wait for "
         "all three, then dQ leaves; dv_dq_dk = dV issued before the dS barrier, then dQ, then dK, dQ leaves while "
         "dK runs (flash-attn-4)", kind="choice", choices=("dv_dk_dq", "dv_dq_dk")),
    Knob("dq_sum", "cta", "", "who bulk-adds a Q block's dQ: cta = each CTA its own; pair (dq_smem qdo, dQ leaving "
         "while dK runs) = the CTAs of a 2-CTA cluster on adjacent KV tiles, walking the same Q blocks, first sum "
         "it through distributed shared memory: warpgroup 0 owns its head-dim half here (warpgroup 1 in the peer), "
         "the other warpgroup st.asyncs its half to the peer's owner, the owner adds the peer's half and bulk-adds "
         "the sum (half the reduce-add bytes into L2)", kind="choice", choices=("cta", "pair")),  # after dq_smem, mma_order
    Knob("deterministic", False, "", "dQ added in a fixed order of KV tiles (deterministic_by says how)", kind="bool"),
    Knob("deterministic_by", "semaphore", "", "semaphore: the dQ reduce-adds of a Q block in a fixed KV-tile order, "
         "held by a semaphore per Q block (flash-attn-4, fa4kernel)", kind="choice",
         choices=("semaphore",)),  # before grid_order, whose choice depends on it (fa4kernel)
    Knob("dq_slices", 1, "copies", "deterministic: copies of the fp32 dQ accumulator and of its semaphores; a head's "
         "KV tiles (pairs) are cut into that many runs, each adding in its own order into its own copy (a query "
         "block's chain of turns is a run long), zeroed before the kernel and summed by one reduction before the "
         "postprocess (fa4kernel)", choices=(1, 2, 4, 8, 16, 32)),  # after tile_m, tile_n, dq_sum: facts' dq_units_per_walk
    Knob("grid_order", "heads_outer", "", "the order the KV-tile CTAs launch in: heads_outer = the KV tiles of one "
         "(batch, head) after another (blockIdx order); tail_lpt (fa4kernel, causal) = the same, but the last heads, "
         "at least two waves of clusters, go KV tile by KV tile across them, longest first", kind="choice",
         choices=("heads_outer", "tail_lpt")),
    Knob("stats", "tma", "", "how LSE and dPsum of a Q block reach the MMA warpgroups: tma = with Q and dO into shared "
         "memory (read with LDS); thread = each thread loads its Q columns' from global memory (LDG)",
         kind="choice", choices=("tma", "thread")),
    Knob("stat_shuffle", False, "", "LSE and dPsum fetched per score row by a warp shuffle (8 threads hold a "
         "row's statistics)", kind="bool"),
    Knob("mask_every_block", False, "", "the length (and causal) mask runs on every Q block; false: only on "
         "blocks that cross the diagonal or the sequence end", kind="bool"),
    Knob("gqa_dkv", "reduce", "", "grouped K/V heads (heads_kv < heads): reduce = one CTA per KV tile of each q "
         "head, dK and dV reduce-added in fp32 into per-K/V-head accumulators (zeroed before, converted to 16 bit "
         "after: flash-attn-4); loop = one CTA per KV tile of each K/V head walking the Q blocks of every q head "
         "of its group, dK and dV summed in registers (fa4kernel); no effect without grouped heads",
         kind="choice", choices=("reduce", "loop")),
    Knob("dkv_accum", "split", "", "with gqa_dkv reduce: the fp32 dK and dV accumulators around the kernel: split = "
         "one each, zeroed and turned into 16 bit by a launch each (flash-attn-4); joint = one allocation for both, "
         "one zeroing launch and one conversion (fa4kernel)", kind="choice", choices=("split", "joint")),
    Knob("preprocess", "kernel", "", "dPsum and LSE in log2 units before the main kernel: kernel = one kernel reading O, "
         "dO and LSE (and zeroing the dQ accumulator); torch = fa4kernel's eager torch operations "
         "(kernel_bwd.TORCH_PRE)", kind="choice", choices=("kernel", "torch")),
]


def facts(ctx, k: dict) -> dict:
    """What an implementation's backward rules may test besides the problem and the knobs:
    loop_ctas_per_sm, the CTAs of a grid of one per KV tile of each (batch, K/V head) over the SMs
    (a packed batch: its total keys in tiles, as fa4kernel counts them without reading the
    sequences' offsets on the host: sm90/bwd_config.with_gqa_default); queries_per_key, the
    queries over the keys, each summed over the batch or the packed sequences (the same
    function's)."""
    p = ctx.problem
    keys = sum(sk for _, sk in p.sequences)
    facts = {"queries_per_key": sum(sq for sq, _ in p.sequences) / keys if keys else 0.0}
    n = k.get("tile_n")
    if not n:
        return facts
    tiles = -(-keys // n) if p.is_varlen else p.batch * -(-p.seqlen_k // n)
    facts["loop_ctas_per_sm"] = tiles * p.heads_kv / ctx.hw.num_sms
    if "tile_m" in k and "dq_sum" in k:
        facts["dq_units_per_walk"] = dq_units_per_walk(p, k)
    return facts


def dq_units_per_walk(p: Problem, k: dict) -> float:
    """A head's KV tiles (pairs with dq_sum "pair") over a CTA's walk (the Q blocks of the group's q
    heads it visits without a mask), for the longest sequences (as fa4kernel counts them on the host:
    sm90/bwd_config.dq_slices_for): more than 1, a Q block's deterministic chain of turns is longer
    than the work of the CTA at its end."""
    c = 2 if dq_pair(k) else 1
    units = -(-p.seqlen_k // (c * k["tile_n"]))
    walk = p.heads // p.heads_kv * -(-p.seqlen_q // k["tile_m"])
    return units / walk if walk else 0.0


def rows_per_cta(k: dict) -> int:
    return k["tile_n"]


def dq_wgs(k: dict) -> int:
    return 1 if k["dq_single_wg"] else WGS


def dkv_in_registers(k: dict) -> bool:
    """dV and dK take P and dS from registers (RS): flash_bwd_sm90.py's mma_dkv_is_rs."""
    return k["atom_sdp"] == 1 and k["atom_dkv"] == WGS and k["sdp_swapab"] and not k["dkv_swapab"]


def gemm_shapes(p: Problem, k: dict) -> dict:
    """Per warpgroup: name -> (M, N, K of its wgmmas, A from shared memory, warpgroups issuing).
    A GEMM's logical M x N (S and dP: tile_m x tile_n, dV and dK: tile_n x head dim, dQ: tile_m x
    head dim) is split over the warpgroups by its atom layout (atom warpgroups along logical M,
    the rest along N); a swapped GEMM runs as N x M with the atom layout swapped too
    (flash_bwd_sm90.py _get_tiled_mma: atom_layout_mnk=maybe_swap_mn(atom_layout, swapAB))."""
    d, dv, m, n = p.hdim, p.hdim_v, k["tile_m"], k["tile_n"]
    rs = dkv_in_registers(k)
    nq = dq_wgs(k)
    logical = {  # name: (logical M, N, K, swapped, A in smem, atom along logical M, warpgroups)
        "S": (m, n, d, k["sdp_swapab"], True, k["atom_sdp"], WGS),
        "dP": (m, n, dv, k["sdp_swapab"], True, k["atom_sdp"], WGS),
        "dV": (n, dv, m, k["dkv_swapab"], k["dkv_swapab"] or not rs, k["atom_dkv"], WGS),
        "dK": (n, d, m, k["dkv_swapab"], k["dkv_swapab"] or not rs, k["atom_dkv"], WGS),
        "dQ": (m, d, n, k["dq_swapab"], True, 1 if k["dq_single_wg"] else k["atom_dq"], nq),
    }
    out = {}
    for name, (M, N, K, swap, a_smem, atom_m, wgs) in logical.items():
        atom_n = wgs // atom_m
        if swap:
            M, N, atom_m, atom_n = N, M, atom_n, atom_m
        out[name] = (M // atom_m, N // atom_n, K, a_smem, wgs)
    return out


def gemms(hw, p: Problem, k: dict) -> dict:
    """Per warpgroup: name -> (tensor cycles, smem cycles, latency, k-steps, register-operand
    cycles). Each m64 wgmma of a warpgroup reads its A rows (from shared memory unless RS) and the
    warpgroup's whole B, at smem_bytes_per_clk whatever the operands' swizzle (bench_bwd_units.py);
    each m64 k-step holds the tensor core at least mma_min_cycles (narrow N). An RS wgmma's A
    bytes, in shared-memory cycles, take no bandwidth; the power model prices them
    (tensor_core.MmaCost.rf_operand_cycles)."""
    out = {}
    for name, (mw, nw, K, a_smem, _) in gemm_shapes(p, k).items():
        instr = max(1, -(-mw // 64))
        tensor = max(2.0 * mw * nw * K / hw.tensor_flops_per_clk, instr * (K // 16) * hw.mma_min_cycles)
        smem = ((mw * K * BYTES if a_smem else 0) + instr * nw * K * BYTES) / hw.smem_bytes_per_clk
        rf = 0.0 if a_smem else mw * K * BYTES / hw.smem_bytes_per_clk
        out[name] = (tensor, smem, hw.mma_latency_ss if a_smem else hw.mma_latency_rs, K // 16, rf)
    return out


def qdo_staging(k: dict) -> bool:
    """dQ staged over the Q/dO stage it was computed from (dq_smem "qdo"), not in a buffer of its own."""
    return k["dq_reduce"] == "bulk" and k.get("dq_smem", "own") == "qdo"


def smem_bytes(p: Problem, k: dict) -> int:
    """Q, dO (stages, + LSE, dPsum), K, V, P and dS (stages), the fp32 dQ staging (none with
    dq_smem "qdo": dQ lies over the Q/dO stage), bytes."""
    d, dv, m, n = p.hdim, p.hdim_v, k["tile_m"], k["tile_n"]
    pds = (1 if dkv_in_registers(k) else 2) * m * n * BYTES * k["pds_stages"]
    stats = 0 if (k["stats"] == "thread") else 4
    dq = m * d * 4 if (k["dq_reduce"] == "bulk" and not qdo_staging(k)) else 0
    return int(k["q_stages"] * m * (d * BYTES + stats) + k["do_stages"] * m * (dv * BYTES + stats)
               + n * (d + dv) * BYTES + pds + dq) + 1024


def check(hw, p: Problem, k: dict, impl=None) -> None:
    if hw.arch != ARCH:
        raise InputError("schedule", f"the fa3 backward is the SM90 schedule; hw {hw.name} is {hw.arch} "
                                     f"(use --schedule fa4)")
    for name, kdim in (("tile_m", k["tile_m"]), ("tile_n", k["tile_n"])):
        if kdim % 16:
            raise InputError(name, f"{kdim} must be a multiple of 16 (the K of dV, dK and dQ wgmmas)")
    mw, nw, K, _, _ = gemm_shapes(p, k)["S"]
    check_shape(ARCH, mw, nw, K)  # a warpgroup's part of S
    check_dq_smem(p, k)
    check_dq_sum(p, k)
    if k.get("dq_slices", 1) > 1 and not k["deterministic"]:
        raise InputError("dq_slices", f"{k['dq_slices']} copies of the deterministic dQ order need deterministic "
                                      f"true; allowed with deterministic false: 1")
    need = smem_bytes(p, k)
    if need > hw.smem_capacity_bytes:
        qdo = " (or dq_smem qdo: no fp32 dQ buffer)" if (k["dq_reduce"] == "bulk" and not qdo_staging(k)
                                                         and kv_split(p, k)) else ""
        raise InputError("smem", f"shared memory {need} B exceeds {hw.smem_capacity_bytes} B of {hw.name}; "
                                 f"lower q_stages, do_stages or tile_n{qdo}")


def kv_split(p: Problem, k: dict) -> bool:
    """Both warpgroups split dK, dV and dQ by the head dim (fa4kernel above head dim 128): warpgroup
    w alone reads columns [w d/2, (w+1) d/2) of Q (in dK) and of dO (in dV) and computes those of dQ,
    and its dQ (tile_m x d/2 fp32) is as large as those columns of Q and dO together."""
    return (p.hdim > 128 and p.hdim_v == p.hdim and k["atom_dkv"] == 1 and k["atom_dq"] == 1
            and not k["dq_single_wg"])


def dq_pair(k: dict) -> bool:
    """dQ summed over a 2-CTA cluster before the bulk reduce-add (dq_sum "pair")."""
    return k.get("dq_sum", "cta") == "pair"


def check_dq_sum(p: Problem, k: dict) -> None:
    """dq_sum "pair" needs dq_smem qdo (and so bulk and kv_split) and dQ leaving while dK runs; one-line
    InputError (bwd_config.py make_bwd_config's rules)."""
    if not dq_pair(k):
        return
    if not kv_split(p, k):
        raise InputError("dq_sum", f"pair needs kv_split (head dim > 128, hdim_v = hdim, atom_dkv 1, atom_dq 1, "
                                   f"dq_single_wg false), got hdim {p.hdim}; allowed there: cta")
    if not qdo_staging(k):
        raise InputError("dq_sum", f"pair needs dq_smem qdo (head dim 192 or 256, dq_reduce bulk), not dq_smem "
                                   f"{k.get('dq_smem', 'own')}, dq_reduce {k['dq_reduce']}; allowed there: cta")
    if k["mma_order"] == "dv_dk_dq":
        raise InputError("dq_sum", "pair with mma_order dv_dk_dq spills registers; allowed with dq_sum pair: "
                                   "mma_order dv_dq_dk")


def check_dq_smem(p: Problem, k: dict) -> None:
    """dq_smem "qdo" needs the bulk reduce-add and the kv_split column ownership; one-line InputError."""
    if k.get("dq_smem", "own") != "qdo":
        return
    if k["dq_reduce"] != "bulk":
        raise InputError("dq_smem", f"qdo stages dQ for the bulk reduce-add, not dq_reduce {k['dq_reduce']}; "
                                    f"allowed with dq_reduce {k['dq_reduce']}: own")
    if not kv_split(p, k):
        raise InputError("dq_smem", f"qdo needs kv_split (head dim > 128, hdim_v = hdim, dK, dV and dQ split by "
                                    f"head dim over both warpgroups: atom_dkv 1, atom_dq 1, dq_single_wg false); "
                                    f"got hdim {p.hdim}, hdim_v {p.hdim_v}, atom_dkv {k['atom_dkv']}, atom_dq "
                                    f"{k['atom_dq']}, dq_single_wg {k['dq_single_wg']}; allowed: own")


def dq_hold(hw, p: Problem, k: dict) -> float:
    """Cycles a CTA holds a Q block's deterministic dQ order: its fp32 dQ tile's adds (dq_sum
    "pair": its half of head_dim, the two CTAs of the pair adding theirs at once)."""
    return kernel_bwd.dq_order_wait(hw, k["tile_m"] * p.hdim * 4 // (2 if k["dq_sum"] == "pair" else 1))


def _lsu(warp_instr: float) -> dict:
    return {"lsu": warp_instr / LSU_WARP_INSTR_PER_CLK}


def _instr(hw, thread_instr: float) -> dict:
    """SM issue cycles of thread-instructions (a warp instruction issues for 32 threads)."""
    return {"issue": thread_instr / 32.0 / hw.issue_per_clk}


def l2_shares(hw) -> tuple[float, float]:
    """(load, reduce-add) bytes per SM clock of one SM's share of the whole chip's L2 rates, all
    SMs busy alike: l2_bandwidth_tbps and l2_reduce_bandwidth_tbps over num_sms at clock_ghz, each
    over l2_mixed_time_fraction (the backward's loads and reduce-adds always share the L2)."""
    for name in ("reduce_bytes_per_clk", "l2_reduce_bandwidth_tbps", "l2_mixed_time_fraction"):
        if getattr(hw, name) <= 0:
            raise InputError(name, f"must be > 0, got {getattr(hw, name)!r}")
    per_sm = 1e3 / (hw.num_sms * hw.clock_ghz) / hw.l2_mixed_time_fraction  # TB/s -> B per SM clock
    return hw.l2_bandwidth_tbps * per_sm, hw.l2_reduce_bandwidth_tbps * per_sm


def build(hw, p: Problem, k: dict, n_kv: int, masked_blocks: int, impl=None, hbm_busy: float = 0.0) -> Schedule:
    """One CTA's schedule for a KV tile that visits n_kv Q blocks (iterations), `masked_blocks`
    of them masked."""
    d, dv, m, n = p.hdim, p.hdim_v, k["tile_m"], k["tile_n"]
    mbar, nbar = hw.mbarrier_latency, hw.named_barrier_latency
    smem = lambda nbytes: nbytes / hw.smem_bytes_per_clk  # noqa: E731
    tma = lambda nbytes: nbytes / hw.tma_bytes_per_clk    # noqa: E731
    # The L2 serves every SM's loads and fp32 reduce-adds from the same time (unit "l2": this
    # SM's share of it, at the load or the reduce-add rate); a reduce-add leaves the SM at
    # reduce_bytes_per_clk (bench_bwd_units.py)
    l2_load, l2_red = l2_shares(hw)
    l2 = lambda nbytes: ("l2", nbytes / l2_load)           # noqa: E731
    l2_add = lambda nbytes: ("l2", nbytes / l2_red)        # noqa: E731
    rs = dkv_in_registers(k)
    # P to shared memory with dS, after the dS math, behind the one dS barrier (fa4kernel's
    # kv_split); else, where dV reads P from there, P is stored after the exp2s
    p_late = not rs and k["p_with_ds"]
    g = gemms(hw, p, k)
    # the loop's instructions besides the pointwise phases, counted in the implementation's SASS
    # (its bwd params; none where it gives none): per wgmma k-step (the HGMMA and its uniform-
    # datapath descriptor arithmetic), per consumer warp and Q block (waits, barriers, fences,
    # addresses, loop control), and the mask's per score element
    def const(name):
        return float(impl.value(name, Context(p, hw, impl), k)) if impl is not None and name in impl.params else 0.0

    per_kstep = 4 * const("loop_instr_per_kstep") / hw.issue_per_clk   # SM issue cycles per k-step of a warpgroup
    fixed = _instr(hw, 128 * const("loop_instr_fixed"))                 # per warpgroup and Q block
    mask_instr = const("mask_instr_per_element")
    nq = dq_wgs(k)
    elems = m * n // WGS  # scores per warpgroup per Q block
    per_thread = elems / 128.0
    det = k["deterministic"] and k["deterministic_by"] == "semaphore"
    fa3_order = k["mma_order"] != "dv_dk_dq"  # dV before the dS barrier
    red = k["dq_reduce"] == "red"
    # dQ staged over the Q/dO stage (dq_smem "qdo"): the dq_store warp, not the MMA warpgroups,
    # releases the stage, once its bulk reduce-adds have read it
    qdo = qdo_staging(k)
    # dq_sum "pair": the CTA is one of a 2-CTA cluster whose peer walks the same Q blocks in
    # lockstep, as this CTA's mirror: warpgroup 0 owns its head-dim half of dQ here (the peer's
    # warpgroup 1 there), warpgroup 1 sends its half to the peer's owner; the peer's sender does
    # the same to this CTA's owner, at the same time
    pair = dq_pair(k)
    owner, sender = 0, 1
    stats = 0 if (k["stats"] == "thread") else m * 4
    # LSE and dPsum of a thread's Q columns: its distinct Q rows of S (a swapped m64 accumulator
    # holds 2 keys x per_thread / 2 queries per thread; unswapped, 2 query rows per m64 wgmma)
    mw_s = gemm_shapes(p, k)["S"][0]
    q_per_thread = per_thread / 2 if k["sdp_swapab"] else 2 * max(1, mw_s // 64)

    # Shared memory serves the wgmma's operand fetch first: the warps' own stores and loads (unit
    # smem:lsu) get the share the fetch leaves while a GEMM runs (measured for the forward,
    # bench_bursts.py stsm; fa3_sm90.py); the fetch share here: this Q block's five GEMMs
    cnt = {"S": WGS, "dP": WGS, "dV": WGS, "dK": WGS, "dQ": nq}
    fetch = sum(g[x][1] * c for x, c in cnt.items()) / sum(g[x][0] * c for x, c in cnt.items())
    lsu_share = max(1.0 - fetch, LSU_SHARE_FLOOR)

    ops: list[Op] = [
        Op("LK", "load", (("tma", tma(n * d * BYTES)), l2(n * d * BYTES)), hw.hbm_latency, "load",
           asynchronous=True, issue_cycles=1, when="first", label="TMA K tile"),
        Op("LV", "load", (("tma", tma(n * dv * BYTES)), l2(n * dv * BYTES)), hw.hbm_latency, "load",
           asynchronous=True, issue_cycles=1, when="first", label="TMA V tile"),
        Op("LQ", "load", (("tma", tma(m * d * BYTES + stats)), l2(m * d * BYTES + stats)), hw.l2_latency, "load",
           asynchronous=True, issue_cycles=1, label="TMA Q block" + (" (+ LSE)" if stats else "")),
        Op("LdO", "load", (("tma", tma(m * dv * BYTES + stats)), l2(m * dv * BYTES + stats)), hw.l2_latency, "load",
           asynchronous=True, issue_cycles=1, label="TMA dO block" + (" (+ dPsum)" if stats else "")),
    ]
    edges: list[Edge] = [Edge("LK", f"S{w}", lag=mbar) for w in range(WGS)]

    def wgmma(name, w, label):
        tensor, sm, lat, steps, rf = g[name]
        uses = (("tensor", tensor), ("smem", sm)) + ((("issue", per_kstep * steps),) if per_kstep else ())
        return Op(f"{name}{w}", f"wg{w}", uses, lat, "mma", asynchronous=True,
                  issue_cycles=steps * hw.mma_issue_cycles, chunks=steps, label=label,
                  work=(("rf_operand", rf),) if rf else ())

    # per-element instruction counts of the pointwise phases (per warpgroup, per Q block)
    ds_store = {"smem:lsu": smem(elems * BYTES), **_lsu(elems * BYTES / STSM_BYTES),
                **_instr(hw, elems * BYTES / 16)}  # stmatrix .x4: 16 bytes per thread
    if k["stat_shuffle"]:  # one shuffle per score row for LSE, one for dPsum (flash_bwd_sm90.py _get_stat)
        lse_get = add(_instr(hw, 128 * q_per_thread), _lsu(4 * q_per_thread))
        stat_values = -(-q_per_thread // 8)  # each thread loads ceil(rows / 8) of them from smem
    else:
        lse_get = {}
        stat_values = q_per_thread
    # the statistics' loads into registers: from smem (LDS; two adjacent Q columns per 64-bit load
    # when S is swapped) or from global memory (the STAT op); per statistic and thread
    lds = stat_values / 2 if k["sdp_swapab"] else stat_values
    stat_lds = {} if (k["stats"] == "thread") else add(_instr(hw, 128 * lds), _lsu(4 * lds),
                                                  {"smem:lsu": smem(128 * stat_values * 4)})

    for w in range(WGS):
        r = f"wg{w}"
        if (k["stats"] == "thread"):
            ld = 2 * 128 * q_per_thread  # LSE and dPsum, one LDG per Q column per thread
            ops.append(Op(f"STAT{w}", r, tuple(add(_instr(hw, ld), _lsu(ld / 32)).items()), hw.l2_latency,
                          "load", asynchronous=True, issue_cycles=ld / 128 / hw.warp_issue_ipc,
                          label="LSE, dPsum of its Q columns from global memory (LDG)"))
        ops.append(wgmma("S", w, "S = Q K^T (its part)"))
        ops.append(wgmma("dP", w, "dP = dO V^T (its part)"))
        # the mask: mask_instr ALU instructions (selects, compares) per score element ("mask" phase:
        # 2 per element; the implementation's count where it gives one)
        per_el = scaled(phase(hw, "mask", 1.0), (mask_instr or 2.0) / 2)
        # a mask on every Q block compiles without a branch, and ptxas interleaves its compares
        # and selects with the exp2 (flash-attn-4's SASS): its ALU work runs beside the MUFU, so
        # it joins the exp op; a mask behind a branch runs on its own, on the blocks that need it
        every = scaled(per_el, elems) if k["mask_every_block"] else {}
        mask_op = bool(masked_blocks) and not k["mask_every_block"]
        if mask_op:
            ops.append(Op(f"MASK{w}", r, tuple(scaled(per_el, elems * masked_blocks).items()), 0.0, "softmax",
                          when="first", label=f"causal/length mask, {masked_blocks} Q block(s)"))
        p_store = {} if (rs or p_late) else {"smem:lsu": smem(elems * BYTES), **_lsu(elems * BYTES / STSM_BYTES),
                                 **_instr(hw, elems * BYTES / 16)}
        exp = add(phase(hw, "scale", elems), exp2_phase(hw, elems, 0.0), phase(hw, "convert", elems),
                  lse_get, stat_lds, p_store, scaled(fixed, 0.5), every)
        ops.append(Op(f"EXP{w}", r, tuple(exp.items()), hw.mufu_latency, "exp",
                      label="P = exp2(S scale - LSE), to bf16" + ("" if (rs or p_late) else ", P -> smem")))
        # dS = P (dP - dPsum): a subtract and a multiply per element ("rescale" = one FMUL each);
        # fa4kernel's at head dim 96 (one warpgroup computes dQ) dS = P (dP scale - dPsum scale),
        # dPsum scaled by its preprocess: an FFMA for the subtract, the same count, and dQ and dK
        # need no multiply (its loop's SASS counts, fa4kernel-sm90.sass.json, hold which builds)
        ds = add(phase(hw, "rescale", 2 * elems), phase(hw, "convert", elems), lse_get, stat_lds,
                 ds_store, ds_store if p_late else {}, scaled(fixed, 0.5))
        ops.append(Op(f"DS{w}", r, tuple(ds.items()), 0.0, "softmax",
                      label="dS = P (dP - dPsum), " + ("P and dS -> smem" if p_late else "dS -> smem")))
        ops.append(wgmma("dV", w, "dV += P^T dO" + (" (P in registers)" if rs else "")))
        if fa3_order:
            if w < nq:
                ops.append(wgmma("dQ", w, "dQ = dS K (its part)"))
            ops.append(wgmma("dK", w, "dK += dS^T Q" + (" (dS in registers)" if rs else "")))
        else:
            ops.append(wgmma("dK", w, "dK += dS^T Q" + (" (dS in registers)" if rs else "")))
            if w < nq:
                ops.append(wgmma("dQ", w, "dQ = dS K (its part)"))
        part = m * d * 4 / nq  # this warpgroup's dQ, fp32 bytes
        dq_q = None  # qdo: the second half of dQ, over its Q columns
        recv = None  # pair, the owner: the peer's half read back and added
        if pair and w == sender:
            # once its dV and dK are done (its columns of the stage are dead), it tells the peer so,
            # waits for the peer's same word (an mbarrier each way), then st.asyncs its dQ into the
            # peer's copy of those columns; the sends leave at the SM-to-SM network's rate, and the
            # peer's sends land in this SM's shared memory meanwhile (the mirror)
            # the st.asyncs hold the warpgroup until all but dsmem_queue_bytes have left; those
            # drain after it goes on (bench_dsmem.py: issue against transfer)
            queued = min(part, float(hw.dsmem_queue_bytes))
            sent = {"dsmem": (part - queued) / hw.dsmem_bytes_per_clk, "smem": smem(part),
                    **_lsu(part / STS128_BYTES), **_instr(hw, part / 16)}
            dq_out = Op(f"SEND{w}", r, tuple(sent.items()), 0.0, "correction",
                        label="dQ (fp32) -> the peer's shared memory (st.async), the peer's lands here")
            drain = Op(f"LAND{w}", r, (("dsmem", queued / hw.dsmem_bytes_per_clk),), hw.mbarrier_latency, "store",
                       asynchronous=True, issue_cycles=0,
                       label="the last st.asyncs in flight land in the peer's shared memory")
        elif pair and w == owner:
            # the peer's half (st.async, complete_tx on an mbarrier): LDS it, add it to its own
            got = add({"smem:lsu": smem(part), "fma": part / 4 / hw.fma_lanes_per_clk, **_lsu(part / STS128_BYTES)},
                      _instr(hw, part / 16 + part / 4))
            recv = Op(f"RECV{w}", r, tuple(got.items()), hw.smem_latency, "correction",
                      label="the peer's dQ half: wait, read from smem, add")
        if not (pair and w == sender) and w < nq and not red and qdo:
            half = part / 2
            dqw = {"smem:lsu": smem(half), **_lsu(half / STS128_BYTES), **_instr(hw, half / 16)}
            dq_out = Op(f"DQW{w}", r, tuple(dqw.items()), hw.smem_latency, "correction",
                        label="dQ (fp32), first half -> smem over its dO columns")
            dq_q = Op(f"DQWQ{w}", r, tuple(dqw.items()), hw.smem_latency + nbar, "correction",
                      label="dQ (fp32), second half -> smem over its Q columns, to warp 1")
        elif not (pair and w == sender) and w < nq and not red:
            dqw = {"smem:lsu": smem(part), **_lsu(part / STS128_BYTES), **_instr(hw, part / 16)}
            dq_out = Op(f"DQW{w}", r, tuple(dqw.items()), hw.smem_latency + nbar, "correction",
                        label="dQ (fp32) -> smem, to warp 1")
        elif not pair and w < nq:
            n_red = part / RED_BYTES  # warp instructions
            dqr = {**_instr(hw, 32 * n_red), **_lsu(n_red), "red": part / hw.reduce_bytes_per_clk,
                   "l2": part / l2_red}
            dq_out = Op(f"DQR{w}", r, tuple(dqr.items()), 0.0, "correction",
                        label="dQ (fp32) -> RED.ADD.F32x2 into the accumulator")
        release = "" if qdo else (", release Q" + ("" if fa3_order else ", dO"))
        wait = Op(f"WAIT{w}", r, (), 0.0, "sync", label="wait for its wgmmas" + release)
        dq_ops = ([recv] if recv is not None else []) + ([dq_out] if w < nq else []) + (
            [drain] if pair and w == sender else []) + ([dq_q] if dq_q is not None else [])
        if fa3_order:
            ops += dq_ops + [wait]
        else:
            ops += [wait] + dq_ops
        ops.append(Op(f"EPI{w}", r, (("smem:lsu", smem(n * (d + dv) * BYTES / WGS)),), hw.smem_latency, "correction",
                      when="last", label="dK, dV -> bf16 -> smem"))

        edges += [Edge("LQ", f"S{w}", lag=mbar), Edge("LdO", f"dP{w}", lag=mbar), Edge("LV", f"dP{w}", lag=mbar),
                  Edge(f"S{w}", f"MASK{w}" if mask_op else f"EXP{w}"),
                  Edge(f"dP{w}", f"DS{w}"),
                  Edge(f"dV{w}", f"WAIT{w}"), Edge(f"dK{w}", f"WAIT{w}"),
                  Edge(f"dK{w}", f"EPI{w}"), Edge(f"dV{w}", f"EPI{w}"),
                  Edge(f"EPI{w}", f"dV{w}", distance=1, per="tile", kind="anti"),
                  Edge(f"EPI{w}", f"dK{w}", distance=1, per="tile", kind="anti")]
        if not qdo:  # the MMA warpgroups release the stage; with qdo the dq_store warp does (below)
            edges += [Edge(f"WAIT{w}", "LQ", distance=k["q_stages"], kind="anti", lag=mbar),
                      Edge(f"dV{w}" if fa3_order else f"WAIT{w}", "LdO", distance=k["do_stages"], kind="anti",
                           lag=mbar)]
        if mask_op:
            edges.append(Edge(f"MASK{w}", f"EXP{w}"))
        if (k["stats"] == "thread"):
            edges += [Edge(f"STAT{w}", f"EXP{w}"), Edge(f"STAT{w}", f"DS{w}")]
        if w < nq:
            edges.append(Edge(f"dQ{w}", f"WAIT{w}"))
            if fa3_order:
                # dQ issued with wait_group(1): dK issues once dV is done; dK with wait_group(1):
                # dQ leaves once dQ is done
                edges += [Edge(f"dV{w}", f"dK{w}"), Edge(f"dQ{w}", dq_out.name)]
            else:
                edges.append(Edge(f"WAIT{w}", dq_out.name))
        # the dS barrier: both warpgroups' dS (and P) are in smem, fenced
        hand = hw.smem_latency + nbar
        for v in range(WGS):
            edges.append(Edge(f"DS{v}", f"dK{w}", lag=hand))
            if w < nq:
                edges.append(Edge(f"DS{v}", f"dQ{w}", lag=hand))
            if not fa3_order or p_late:
                edges.append(Edge(f"DS{v}", f"dV{w}", lag=hand))
            elif not rs:
                edges.append(Edge(f"EXP{v}", f"dV{w}", lag=nbar))
            if p_late:  # the next P into a slot waits for the dV GEMMs that read it
                edges.append(Edge(f"dV{v}", f"DS{w}", distance=k["pds_stages"], kind="anti", lag=nbar))
            # the next P/dS into a slot waits for the GEMMs that read it
            if v < nq:
                edges.append(Edge(f"dQ{v}", f"DS{w}", distance=k["pds_stages"], kind="anti", lag=nbar))
            edges.append(Edge(f"dK{v}", f"DS{w}", distance=k["pds_stages"], kind="anti", lag=nbar))
        if pair and w == sender:
            # its columns of the stage are dead (dV, dK done), and the peer's (its mirror's) too
            edges += [Edge(f"dV{w}", dq_out.name, lag=mbar), Edge(f"dK{w}", dq_out.name, lag=mbar),
                      Edge(dq_out.name, drain.name), Edge(drain.name, f"RECV{owner}")]
        elif w < nq and not red and qdo:
            # the dO half over columns only its dV reads (both warpgroups' dP^T are done before
            # the dS barrier), the Q half over columns only its dK reads; then warp 1 is told
            edges += [Edge(f"dV{w}", dq_out.name), Edge(f"dK{w}", dq_q.name),
                      Edge(dq_q.name, f"ADDQ{w}", lag=nbar)]
            if recv is not None:
                edges += [Edge(f"dQ{w}", recv.name), Edge(recv.name, dq_out.name)]
        elif w < nq and not red:
            edges += [Edge(f"DQW{w}", f"ADDQ{w}", lag=nbar),
                      Edge(f"ADDQ{w}", f"DQW{w}", distance=1, kind="anti", lag=nbar)]
    # the CTA ends once the TMA engine has read dK and dV from shared memory (bulk wait_group,
    # read=True): the implementation's store time (its forward's O store, the same TMA store of a
    # tile from shared memory: a fixed part plus the bytes at a rate far below the TMA load rate),
    # else the bytes at the load rate after an L2 round trip
    kv_bytes = n * (d + dv) * BYTES
    st_tma = tma(kv_bytes)
    st = const("dkv_store_fixed_cycles") + kv_bytes / const("dkv_store_bytes_per_clk") \
        if impl is not None and "dkv_store_fixed_cycles" in impl.params else st_tma + hw.l2_latency
    ops.append(Op("STKV", "wg0", (("tma", st_tma), l2(kv_bytes)), max(0.0, st - st_tma),
                  "store", asynchronous=True, issue_cycles=1, when="last", label="TMA store dK, dV (smem read)"))
    edges += [Edge(f"EPI{w}", "STKV", lag=nbar) for w in range(WGS)]
    edges += [Edge("dQ0", "LK", distance=1, per="tile", kind="anti", lag=mbar),
              Edge("dP0", "LV", distance=1, per="tile", kind="anti", lag=mbar)]

    roles = ["load"]
    if not red:
        # dQ store warp: one bulk reduce-add per dQ warpgroup; deterministic: inside the semaphore
        roles.append("dq_store")
        if det:
            ops.append(Op("SEMA", "dq_store", (), hw.l2_latency, "sync", label="deterministic: read the semaphore"))
        adders = [owner] if pair else list(range(nq))  # pair: the sum of the owner's columns only
        for w in adders:
            part = m * d * 4 / nq
            # qdo: two bulk reduce-adds, one per half (its dO columns, its Q columns)
            ops.append(Op(f"ADDQ{w}", "dq_store", (("tma", part / hw.reduce_bytes_per_clk), ("smem", smem(part)),
                                                    l2_add(part)), 0.0, "store",
                          asynchronous=True, issue_cycles=2 if qdo else 1,
                          label=f"TMA reduce-add dQ (WG{w}'s part" + (", the pair's sum" if pair else "")
                          + (", from its Q and dO columns)" if qdo else ")")))
        if qdo:
            # cp.async.bulk.wait_group.read: the adds have read the stage; then the Q and dO
            # stage goes back to the load warp
            ops.append(Op("RELQ", "dq_store", (), 0.0, "sync",
                          label="wait until the reduce-adds have read the Q/dO stage, release it"))
            edges += [Edge(f"ADDQ{w}", "RELQ") for w in adders]
            edges += [Edge("RELQ", "LQ", distance=k["q_stages"], kind="anti", lag=mbar),
                      Edge("RELQ", "LdO", distance=k["do_stages"], kind="anti", lag=mbar)]
        if det:
            ops.append(Op("SEMR", "dq_store", (), hw.l2_latency, "sync", label="deterministic: adds landed, release"))
            edges += [Edge(f"ADDQ{w}", "SEMR", lag=hw.l2_latency) for w in adders]

    compute_roles = [f"wg{w}" for w in range(WGS)]
    softmax_ops = tuple(f"{x}{w}" for x in ("MASK", "EXP", "DS") for w in range(WGS))
    ops = [mix_limits(hw, o) if o.name in softmax_ops else o for o in ops]
    ops = [replace(o, chunks=PIECES) if not o.asynchronous and o.uses else o for o in ops]
    # dQ's fp32 stores beside a GEMM get what its fetch leaves (often nothing): in pieces of a
    # few cycles, so the stores after the GEMM has finished run at the full rate
    fine = {f"DQW{w}": max(PIECES, int(m * d * 4 / nq / DQW_PIECE_BYTES)) for w in range(nq)}
    if qdo:  # two halves
        fine = {f"{x}{w}": max(PIECES, int(m * d * 4 / nq / 2 / DQW_PIECE_BYTES)) for x in ("DQW", "DQWQ")
                for w in range(nq)}
    if pair:  # the send and the read-back in 256-byte pieces too
        fine.update({f"SEND{sender}": int(m * d * 4 / nq / DQW_PIECE_BYTES),
                     f"RECV{owner}": int(m * d * 4 / nq / DQW_PIECE_BYTES)})
    ops = [replace(o, chunks=fine[o.name]) if o.name in fine else o for o in ops]
    units = {"tensor": 1, "smem": 1, "smem:lsu": 1, "lsu": 1, "mufu": 1, "fma": 1, "alu": 1, "issue": 1, "tma": 1,
             "l2": 1,
             **({"red": 1} if red else {}), **({"dsmem": 1} if pair else {}), **{f"issue:{r}": 1 for r in compute_roles}}
    roles += compute_roles
    flops = 2.0 * m * n * (3 * d + 2 * dv)
    return Schedule(f"{NAME}-bwd", units, roles, ops, edges, marker="S0",
                    issue_depth={"tensor": int(hw.mma_queue_depth)},
                    interference={**beside_gemm(hw, compute_roles), "smem:lsu": ("tensor", lsu_share)},
                    meta={"flops_per_iter": flops, "dq_hold": dq_hold(hw, p, k) if k["deterministic"] else 0.0,
                          "lsu_share": lsu_share})


def launch_order(k: dict) -> tuple[str, int]:
    """(tile_order.ORDERS kind, units per cluster) of the KV-tile CTAs' launch (knob grid_order)."""
    kind = {"heads_outer": "index"}.get(k.get("grid_order", "heads_outer"), k.get("grid_order"))
    return kind, 2 if dq_pair(k) else 1


def units(p: Problem, keys: int, tile_m: int, k: dict) -> list:
    """The launch's KV-tile units (kernel_bwd.kv_units): with dq_sum "pair" in 2-CTA clusters, an
    even count, both CTAs of a cluster walking the Q blocks of its first KV tile."""
    return kernel_bwd.kv_units(p, keys, tile_m, pair=dq_pair(k))
