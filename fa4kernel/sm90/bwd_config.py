"""Configuration of the SM90 (Hopper) attention backward (sm90/bwd.py): plain Python, no CUDA,
CuTe DSL or torch at import, so every check runs on a CPU-only machine before anything compiles.

One CTA = one block of `tile_n` keys of one (batch, k/v head): K and V stay in shared memory
while the CTA walks the query blocks of `tile_m` rows of every q head of its group (GQA / MQA).
Tiles follow FA3's SM90 backward for head dims <= 128 (64 x 128, S^T and dP^T computed with
the keys on the wgmma M axis, 2 consumer warpgroups of 64 keys each); `tile_m=128` at head dim
64 is flash-attn-4's hd64 tile (128 x 128, dQ split by query rows over both warpgroups).

Head dims 192 and 256 take 64 x 64 tiles with the work split the other way (kv_split): both
consumer warpgroups see the same 64 keys; S^T and dP^T are split by queries (32 each), dK, dV and
dQ by head_dim (head_dim / 2 columns each). A warpgroup owning 64 keys x 256 columns of dK and dV
would hold 2 x 128 fp32 registers per thread for them alone (ptxas spills); split by head_dim
they take 2 x 64 at 256 (2 x 48 at 192), plus 64 (48) for dQ and 2 x 16 for S^T and dP^T. Each
warpgroup then needs all the queries' P^T and dS^T: both go to shared memory (2 buffers each)
and dV, dK read them from there (SS). At 192 a warpgroup's 96 columns are 3 swizzle atoms of
32 columns (Q, dO, K, V in smem with the 64-byte swizzle), not 1.5 of 64.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

BWD_HEAD_DIMS = (64, 96, 128, 192, 256)
BWD_DTYPES = ("bfloat16", "float16")
BWD_KNOB_NAMES = ("deterministic", "dq_reduce", "dq_smem", "dq_sum", "stats", "mma_order", "preprocess", "postprocess",
                  "tile_m", "grid_order", "dq_zero", "gqa_dkv", "dq_slices")
# each knob's values, the default first (measured on the H100: fa4kernel/README.md, "Backward")
DQ_REDUCE_MODES = ("bulk", "red")
DQ_SMEM_MODES = ("own", "qdo")
DQ_SUM_MODES = ("cta", "pair")
STATS_MODES = ("tma", "thread")
MMA_ORDERS = ("dv_dq_dk", "dv_dk_dq")
PREPROCESS_MODES = ("kernel", "torch")
POSTPROCESS_MODES = ("torch", "kernel")
GRID_ORDERS = ("heads_outer", "tail_lpt")
# grid_order="tail_lpt": the last (batch, k/v head)s, at least TAIL_WAVES waves of CTAs on
# TAIL_SLOTS SMs (H100 SXM and H200; on another SM count the tail is a little longer or shorter
# than two waves, the gradients the same), launch longest first
TAIL_WAVES = 2
TAIL_SLOTS = 132
# grid_order default by causal: with a causal mask the last heads go longest first (H200, every
# head dim at 1k-4k: the SMs busy 97-99 % of the launch instead of 93-96 %; hd256 1k / 4k +4 / +5 %
# sustained: fa4kernel/README.md, "Backward"); without one every CTA walks as many query blocks
GRID_ORDER_DEFAULT = {False: "heads_outer", True: "tail_lpt"}
# deterministic builds: "heads_outer" at every mask. With a causal mask their key blocks launch last
# (shortest) first, so the dQ turns of a query block follow the launch (sm90/bwd.py _dq_turn): the
# tail's longest-first order is gone either way, and at head dim 256 its decode spills a register
DQ_ZERO_MODES = ("torch", "preprocess")
GQA_DKV_MODES = ("loop", "reduce")
# dq_slices: copies of the deterministic build's dQ accumulator, powers of two (dq_slices_for picks one)
DQ_SLICES = (1, 2, 4, 8, 16, 32)
# gqa_dkv default with grouped K/V heads (gqa_dkv_for): "reduce" where the loop's grid, a CTA per
# key block of each (batch, k/v head), has fewer CTAs than the GPU has SMs. There the loop leaves
# SMs idle while each CTA walks its group's q heads (H200: MQA hd64 2k causal 254 -> 353 TFLOP/s,
# a varlen MQA batch 154 -> 437). Where the loop fills them, "reduce" with a causal mask and at
# least REDUCE_QUERIES_PER_KEY queries per key: a causal loop CTA walks its group's q heads over
# 1 to all of its query blocks, a long and uneven walk the tail cannot balance, while reduce's
# CTAs are a group's times as many and as short. Without a mask, or with few queries per key (a
# chunk), each CTA's fp32 adds of dK and dV cost as much as they give or more (a GQA chunk batch:
# 430 -> 317, H200): the loop. The 0.5 is fa4sim's crossover of the two (GQA 32/8, hd128, 512-8k
# queries on 8k keys, H100 profile: loop and reduce within 0.6 % at 0.5; reduce 8 % ahead at 1,
# behind below 0.5 and at every length without a mask); fa4kernel/README.md, "Backward".
REDUCE_QUERIES_PER_KEY = 0.5
# query rows per block by head dim: 128 only at 64, where dQ is split by query rows over both
# warpgroups (flash-attn-4's hd64 tile)
TILE_M_BY_HEAD_DIM = {64: (64, 128), 96: (64,), 128: (64,), 192: (64,), 256: (64,)}
# tile_m default by head dim where it can hold (else TILE_M): at 64 the 128-row block, which
# reads LSE and D from smem where they are used so that ptxas keeps the wgmmas asynchronous
# (H100: +1 to +11 % over 64 rows at 1k-16k: fa4kernel/README.md, "Backward")
TILE_M_DEFAULT = {64: 128}
# keys per CTA by head dim: 128 (2 warpgroups x 64 keys) up to 128; 64 above, where both
# warpgroups share the keys and split dK / dV by head_dim (BwdConfig.kv_split)
TILE_N_BY_HEAD_DIM = {64: 128, 96: 128, 128: 128, 192: 64, 256: 64}
# dq_reduce default by head dim: "bulk" everywhere. At 192 its 48 KiB dQ buffer fits beside 2-stage
# Q / dO rings (226 KiB); at 256 its own 64 KiB buffer leaves room for one stage only (bulk with one
# stage still beats red with two: H100 +0.5 to +10 %), and dq_smem="qdo" gives it two
DQ_REDUCE_DEFAULT = {64: "bulk", 96: "bulk", 128: "bulk", 192: "bulk", 256: "bulk"}
# dq_smem default with dq_reduce="bulk" (kv_split only; "own" elsewhere): at 256 dQ is staged in the
# Q / dO stage it was computed from, which frees the 64 KiB dQ buffer for a second Q / dO stage
# (H100: +15 to +25 % over hd256 1k-16k); at 192, which has 2 stages beside its own buffer, holding
# the stage until the bulk reduces have read it costs 6 to 18 % (fa4kernel/README.md, "Backward")
DQ_SMEM_DEFAULT = {256: "qdo"}
# dq_sum default with dq_smem="qdo" (and the heads-outer grid, dv_dq_dk): at 256 the two CTAs of a
# cluster sum dQ before the bulk reduce (H100: +7 to +15 % over qdo alone at 1k-16k non-causal,
# 0 to +8 % causal; H200 +7 to +11 %, causal -3.5 to +3 %: fa4kernel/README.md, "Backward")
DQ_SUM_DEFAULT = {256: "pair"}
SMEM_LIMIT_BYTES = 227 * 1024  # dynamic shared memory of one CTA on H100 / H200

TILE_M = 64  # query rows per m block (the N of S^T = K Q^T)
TILE_N = 128  # keys per CTA: 2 consumer warpgroups x 64 rows of wgmma M
Q_STAGES = 2  # Q and dO pipeline depth


@dataclass(frozen=True)
class BwdConfig:
    """One backward build. Hashable: the compile cache keys on it."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int
    causal: bool
    # dQ partial sums are added into the one fp32 accumulator a key block (pair) at a time per query
    # block, in a fixed order kept by an int32 semaphore per (batch, q head, query block), so the
    # sums are the same bits on every run (sm90/bwd.py _dq_turn); with a causal mask the key blocks
    # of a (batch, k/v head) launch last first (launch_order)
    deterministic: bool = False
    # how dQ partial sums reach the fp32 accumulator: "red" = every consumer thread issues
    # RED.ADD.F32x2 into global memory; "bulk" = the dQ warpgroups store them to an fp32 smem
    # buffer and producer warp 1 adds it with one cp.reduce.async.bulk .add.f32 per warpgroup
    # (the accumulator then holds each query block in the wgmma fragment order, see bwd.py)
    dq_reduce: str = "bulk"
    # dq_reduce="bulk": where a dQ warpgroup stages its fp32 partial sum for the bulk reduce: "own" =
    # its own smem buffer (tile_m x head_dim / dq_wgs floats); "qdo" (kv_split only) = the bytes of
    # the Q / dO stage the block was computed from: warpgroup w's columns of dO (dead once its dV is
    # done) and of Q (dead once its dK is done) hold the two halves of its floats, and producer
    # warp 1 releases the stage to the loads once its bulk reduces have read it. No dQ buffer:
    # at head_dim 256 the 64 KiB it frees hold a second Q / dO stage
    dq_smem: str = "own"
    # who adds a query block's dQ into the accumulator: "cta" = every CTA its own partial sum;
    # "pair" (with dq_smem="qdo") = the two CTAs of a cluster (adjacent key blocks, the same query
    # blocks in the same order) sum their partials through distributed shared memory first: each
    # owns half of head_dim, receives the other CTA's half there (st.async) and bulk-adds the sum,
    # so the L2 takes half the reduce-add bytes
    dq_sum: str = "cta"
    # how LSE_log2 and D of a query block reach the consumers: "thread" = every consumer thread
    # loads its 2 x 16 values from global memory at the top of the block; "tma" = producer warp 0
    # bulk-copies the block's 64 + 64 floats into smem with its Q and dO (same mbarriers), so
    # they arrive with the stage and are read with LDS (flash-attn-4's sLSE / sdPsum)
    stats: str = "tma"
    # issue order of the three GEMMs after P^T and dS^T: "dv_dk_dq" = dS^T barrier, dV, dK, dQ,
    # wait for all three, then dQ leaves (the tensor core idles while dQ is written out);
    # "dv_dq_dk" = dV issued before the dS^T barrier (it runs under the fence and the barrier),
    # then dQ, then dK: dQ leaves while dK runs (flash-attn-4's order)
    mma_order: str = "dv_dq_dk"
    # D = rowsum(dO * O) and LSE_log2: "torch" = torch ops on the host stream; "kernel" = one
    # CuTe DSL kernel (sm90/bwd_preprocess.py, BwdPreprocess) reading dO and O once
    preprocess: str = "kernel"
    # the dQ accumulator (fp32, each query block in the wgmma fragment order of dq_reduce="bulk")
    # -> dQ in row order and 16 bit: "torch" = one torch copy_ through a 10-axis permuted view
    # (plus a copy where s_q is not a multiple of the block); "kernel" = one CuTe DSL kernel
    # (sm90/bwd_postprocess.py, BwdPostprocess): 128-bit loads of the accumulator in its own
    # order, 128-bit stores of 8 columns of a row, the first s_q rows only (flash-attn-4's postprocess)
    postprocess: str = "kernel"
    # the order the CTAs launch in: "heads_outer" = grid (key blocks, k/v heads, batch), the key
    # blocks of one (batch, k/v head) in a row (they read the same Q and dO: L2 reuse); "tail_lpt" = a
    # one-dimensional grid in heads_outer order, except that the last (batch, k/v head)s, at least
    # two waves of CTAs (tail_heads), go key block by key block across them: with a causal mask
    # the launch ends on their shortest CTAs instead of on the last head's longest ones, and only
    # the Q / dO of those few heads are read a wave apart (launch_order says which CTA runs what)
    grid_order: str = "heads_outer"
    # who zeroes the fp32 dQ accumulator (and the deterministic build's semaphores) before the
    # backward: "torch" = torch.zeros (a memset launch); "preprocess" = the preprocess kernel, for
    # the 32 rows of each of its CTAs (one launch fewer, the same bytes; flash-attn-4's
    # preprocess). Needs preprocess="kernel"
    dq_zero: str = "preprocess"
    # query rows per block: 64, or 128 at head dim 64 (TILE_M_BY_HEAD_DIM; dQ split by rows)
    # grouped K/V heads (GQA / MQA): "loop" = one CTA per key block of a k/v head walks the query
    # blocks of every q head of its group, dK and dV summed in registers and stored once; "reduce" =
    # one CTA per key block of each q head (a group's CTAs run side by side), its dK and dV added
    # into fp32 accumulators (RED.ADD.F32x2 from registers, sm90/bwd.py _reduce_dkv) that the host
    # turns into 16 bit; not deterministic (the q heads add in no fixed order). The same kernel
    # either way without grouped heads
    gqa_dkv: str = "loop"
    # deterministic: copies of the fp32 dQ accumulator and of its semaphores (a power of two). A
    # head's key blocks (pairs) are cut into that many contiguous runs, run r adding into copy r in
    # its own fixed order (sm90/bwd.py _dq_slice), so a query block's chain of turns is one run long;
    # the host sums the copies (one torch reduction, a fixed order) before the postprocess. The
    # host's default is dq_slices_for's rule; 1 here and in every non-deterministic build
    dq_slices: int = 1
    tile_m: int = TILE_M
    tile_n: int = TILE_N
    q_stages: int = Q_STAGES
    # the varlen build (make_varlen_bwd_config, FlashBwdSm90Varlen): packed sequences, the grid's
    # z axis one per sequence, offsets from cu_seqlens on the device; the statistics and the dQ
    # accumulator in a layout padded per sequence (sm90/bwd_varlen.py)
    varlen: bool = False

    @property
    def kv_split(self) -> bool:
        """Head dims above 128: both consumer warpgroups share the tile_n = 64 keys; S^T and dP^T
        are split by queries, dK, dV and dQ by head_dim; P^T and dS^T go through shared memory."""
        return self.head_dim > 128

    @property
    def ds_scaled(self) -> bool:
        """dS carries the softmax scale (D scaled by the preprocess, dS = P (dP scale - D)), so dQ and
        dK leave their GEMMs scaled, where one warpgroup computes dQ alone (dq_wgs 1: head dim 96,
        and 64 with 64-row blocks): there the dQ multiplies (tile_m x head_dim / 128 FMUL per query
        block, 48 at 96) lie on that warpgroup's path alone. Where both share dQ the multiplies
        split, and the change measured level (lab/campaigns/kernel-sm90-backward, ds-scale); with
        kv_split the consumers sit at the 240-register limit and holding the scale spills. Else dQ
        and dK are multiplied by the scale after their GEMMs, and the preprocess scales D by 1."""
        return not self.kv_split and self.dq_wgs == 1

    @property
    def num_consumer_wgs(self) -> int:
        return 2 if self.kv_split else self.tile_n // 64

    @property
    def num_threads(self) -> int:
        return 128 * (self.num_consumer_wgs + 1)

    @property
    def dq_rows_split(self) -> bool:
        """dQ = dS K split by query rows (64 per warpgroup, all head_dim columns): 128-row blocks."""
        return self.tile_m == 2 * 64

    @property
    def dq_wgs(self) -> int:
        """Warpgroups that share the dQ = dS K GEMM: both with 128-row blocks (split by query
        rows) and at head_dim 128 (split along head_dim: 64 columns each, one 128-byte swizzle
        atom of K^T); one at 64 and 96 with 64-row blocks, where half the columns would cut a
        swizzle atom of the MN-major K^T operand."""
        if self.dq_rows_split or self.head_dim == 128 or self.kv_split:
            return self.num_consumer_wgs
        return 1

    def as_dict(self):
        return asdict(self)


def make_bwd_config(dtype: str, head_dim: int, causal: bool, deterministic: bool = False,
                    dq_reduce: str = None, dq_smem: str = None, dq_sum: str = None, stats: str = "tma", mma_order: str = "dv_dq_dk",
                    preprocess: str = "kernel", tile_m: int = None,
                    postprocess: str = None, grid_order: str = None,
                    dq_zero: str = None, gqa_dkv: str = "loop", dq_slices: int = BwdConfig.dq_slices) -> BwdConfig:
    """The backward build for these arguments; one-line ValueError naming what is allowed.
    dq_reduce=None, dq_smem=None, dq_sum=None, tile_m=None: the head dim's defaults
    (DQ_REDUCE_DEFAULT, DQ_SMEM_DEFAULT, DQ_SUM_DEFAULT, TILE_M_DEFAULT; each falls back to the
    value that holds with the other knobs: dq_sum "cta", tile_m 64). postprocess=None: "kernel"
    with dq_reduce="bulk", else "torch"; dq_zero=None: "preprocess" with preprocess="kernel",
    else "torch"; grid_order=None: GRID_ORDER_DEFAULT by causal ("heads_outer" when deterministic)."""
    if dtype not in BWD_DTYPES:
        raise ValueError(f"dtype {dtype} not supported by the backward; allowed: {', '.join(BWD_DTYPES)}")
    if isinstance(head_dim, bool) or head_dim not in BWD_HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim} not supported by the SM90 backward; allowed: "
                         f"{', '.join(map(str, BWD_HEAD_DIMS))}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r} not supported; allowed: True or False")
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic={deterministic!r} not supported; allowed: True or False")
    if grid_order is None:
        grid_order = "heads_outer" if deterministic else GRID_ORDER_DEFAULT[causal]
    if dq_reduce is None:
        dq_reduce = DQ_REDUCE_DEFAULT[head_dim]
    if dq_reduce not in DQ_REDUCE_MODES:
        raise ValueError(f"dq_reduce={dq_reduce!r} not supported; allowed: {', '.join(DQ_REDUCE_MODES)}")
    if dq_smem is None:
        dq_smem = DQ_SMEM_DEFAULT.get(head_dim, "own") if dq_reduce == "bulk" else "own"
    if dq_smem not in DQ_SMEM_MODES:
        raise ValueError(f"dq_smem={dq_smem!r} not supported; allowed: {', '.join(DQ_SMEM_MODES)}")
    if dq_sum is None:
        applies = dq_smem == "qdo" and mma_order == "dv_dq_dk"
        dq_sum = DQ_SUM_DEFAULT.get(head_dim, "cta") if applies else "cta"
    if dq_sum not in DQ_SUM_MODES:
        raise ValueError(f"dq_sum={dq_sum!r} not supported; allowed: {', '.join(DQ_SUM_MODES)}")
    if dq_sum == "pair" and dq_smem != "qdo":
        raise ValueError(f"dq_sum='pair' needs dq_smem='qdo' (head_dim 192 or 256, dq_reduce='bulk'), not "
                         f"dq_smem={dq_smem!r}; allowed there: dq_sum='cta'")
    if dq_sum == "pair" and mma_order == "dv_dk_dq":
        raise ValueError("dq_sum='pair' with mma_order='dv_dk_dq' spills registers; allowed with dq_sum='pair': "
                         "mma_order='dv_dq_dk'")
    if dq_smem == "qdo" and (head_dim <= 128 or dq_reduce != "bulk"):
        raise ValueError(f"dq_smem='qdo' needs head_dim 192 or 256 (both warpgroups split head_dim) and "
                         f"dq_reduce='bulk', not head_dim={head_dim}, dq_reduce={dq_reduce!r}; allowed there: "
                         f"dq_smem='own'")
    if postprocess is None:
        postprocess = "kernel" if dq_reduce == "bulk" else "torch"
    if dq_zero is None:
        dq_zero = "preprocess" if preprocess == "kernel" else "torch"
    if tile_m is None:
        fits = (dq_reduce, stats) == ("bulk", "tma")
        tile_m = TILE_M_DEFAULT.get(head_dim, TILE_M) if fits else TILE_M
    for name, val, allowed in (("stats", stats, STATS_MODES), ("mma_order", mma_order, MMA_ORDERS),
                               ("preprocess", preprocess, PREPROCESS_MODES),
                               ("postprocess", postprocess, POSTPROCESS_MODES),
                               ("grid_order", grid_order, GRID_ORDERS), ("dq_zero", dq_zero, DQ_ZERO_MODES),
                               ("gqa_dkv", gqa_dkv, GQA_DKV_MODES)):
        if val not in allowed:
            raise ValueError(f"{name}={val!r} not supported; allowed: {', '.join(allowed)}")
    if postprocess == "kernel" and dq_reduce != "bulk":
        raise ValueError(f"postprocess='kernel' reads the fragment order of dq_reduce='bulk', not "
                         f"dq_reduce={dq_reduce!r}; allowed with dq_reduce={dq_reduce!r}: postprocess='torch'")
    if dq_zero == "preprocess" and preprocess != "kernel":
        raise ValueError(f"dq_zero='preprocess' needs the preprocess kernel, not preprocess={preprocess!r}; "
                         f"allowed with preprocess={preprocess!r}: dq_zero='torch'")
    if gqa_dkv == "reduce" and deterministic:
        raise ValueError("gqa_dkv='reduce' adds the q heads' dK, dV in no fixed order; allowed with "
                         "deterministic=True: gqa_dkv='loop'")
    if type(dq_slices) is not int or dq_slices not in DQ_SLICES:
        raise ValueError(f"dq_slices={dq_slices!r} not supported; allowed: {', '.join(map(str, DQ_SLICES))}")
    if dq_slices > 1 and not deterministic:
        raise ValueError(f"dq_slices={dq_slices} copies the deterministic build's accumulator; allowed with "
                         f"deterministic=False: dq_slices=1")
    tiles = TILE_M_BY_HEAD_DIM[head_dim]
    if isinstance(tile_m, bool) or tile_m not in tiles:
        raise ValueError(f"tile_m={tile_m!r} not supported at head_dim {head_dim}; allowed: "
                         f"{', '.join(map(str, tiles))}")
    if tile_m == 128:
        # 128 queries per block: S^T and dP^T take 64 + 64 fp32 registers per thread; what else
        # a thread holds must stay in smem or die early, else ptxas spills or serializes the
        # wgmmas (CPU tests)
        if dq_reduce != "bulk":
            raise ValueError(f"tile_m=128 with dq_reduce={dq_reduce!r} not supported (dQ split by query rows "
                             f"goes out by bulk reduce-add); allowed with tile_m=128: dq_reduce='bulk'")
        if stats != "tma":
            raise ValueError(f"tile_m=128 with stats={stats!r} spills registers; allowed with tile_m=128: "
                             f"stats='tma'")
    cfg = BwdConfig(dtype=dtype, head_dim=head_dim, causal=causal, deterministic=deterministic,
                    dq_reduce=dq_reduce, dq_smem=dq_smem, dq_sum=dq_sum, stats=stats, mma_order=mma_order, preprocess=preprocess,
                    postprocess=postprocess, tile_m=tile_m, grid_order=grid_order,
                    dq_zero=dq_zero, gqa_dkv=gqa_dkv, dq_slices=dq_slices, tile_n=TILE_N_BY_HEAD_DIM[head_dim])
    if bwd_smem_bytes(cfg) > SMEM_LIMIT_BYTES:
        # single-stage Q / dO rings (head_dim 256 with dq_reduce="bulk": the 64 KiB dQ buffer)
        cfg = dataclasses.replace(cfg, q_stages=1)
    return cfg


# what the varlen build fixes: its preprocess and postprocess are the varlen kernels (the former
# zeroes the padded dQ accumulator, the latter reads its bulk order), its CTAs launch in grid
# order (sm90/bwd_varlen.py)
VARLEN_FIXED = {"preprocess": "kernel", "postprocess": "kernel", "dq_zero": "preprocess", "dq_reduce": "bulk",
                "grid_order": "heads_outer"}


def make_varlen_bwd_config(dtype: str, head_dim: int, causal: bool, knobs, deterministic: bool = False) -> BwdConfig:
    """The varlen backward build (BwdConfig.varlen) for these knobs: the dense build's defaults and
    checks, with VARLEN_FIXED's choices; one-line ValueError for a knob it fixes set otherwise."""
    check_bwd_knob_names(knobs, tuple(n for n in BWD_KNOB_NAMES if n != "deterministic"), "varlen backward knob")
    for name, val in knobs.items():
        if name in VARLEN_FIXED and val != VARLEN_FIXED[name]:
            raise ValueError(f"{name}={val!r} with cu_seqlens: the varlen backward's is fixed; allowed: "
                             f"{VARLEN_FIXED[name]!r} (or leave it out)")
    rest = {n: v for n, v in knobs.items() if n not in VARLEN_FIXED}
    cfg = make_bwd_config(dtype, head_dim, causal, deterministic, **rest, **VARLEN_FIXED)
    return dataclasses.replace(cfg, varlen=True)


def check_bwd_knob_names(knobs, allowed=BWD_KNOB_NAMES, what: str = "backward knob") -> None:
    """One-line ValueError for a name that is not one of the backward's knobs, naming them."""
    for name in knobs:
        if name not in allowed:
            raise ValueError(f"{what} {name!r} unknown; allowed: {', '.join(allowed)}")


def bwd_config_from_knobs(dtype: str, head_dim: int, causal: bool, deterministic: bool, knobs) -> BwdConfig:
    """make_bwd_config with the knobs of a dict (names checked first: one-line ValueError)."""
    check_bwd_knob_names(knobs, tuple(n for n in BWD_KNOB_NAMES if n != "deterministic"))
    return make_bwd_config(dtype, head_dim, causal, deterministic, **knobs)


def bwd_smem_bytes(cfg: BwdConfig, elem_bytes: int = 2) -> int:
    """Shared memory of one CTA: K, V, Q and dO rings, 2 dS^T buffers (2 P^T buffers with
    kv_split, the fp32 dQ buffer of dq_reduce="bulk" with dq_smem="own"); each 1 KiB aligned."""
    align = lambda x: (x + 1023) // 1024 * 1024  # noqa: E731
    kv = align(cfg.tile_n * cfg.head_dim * elem_bytes)
    qdo = align(cfg.q_stages * cfg.tile_m * cfg.head_dim * elem_bytes)
    ds = align(2 * cfg.tile_n * cfg.tile_m * elem_bytes)  # 2 buffers
    if cfg.kv_split:
        ds *= 2  # and 2 P^T buffers
    dq = align(cfg.tile_m * cfg.head_dim * 4) if (cfg.dq_reduce == "bulk" and cfg.dq_smem == "own") else 0
    stats = 2 * cfg.q_stages * cfg.tile_m * 4 if cfg.stats == "tma" else 0
    return 1024 + 2 * kv + 2 * qdo + ds + dq + stats


def cluster_ctas(cfg: BwdConfig) -> int:
    """CTAs per cluster: 2 with dq_sum="pair" (adjacent key blocks), else 1."""
    return 2 if cfg.dq_sum == "pair" else 1


def tail_heads(units_per_head: int, heads: int, slots: int = TAIL_SLOTS, waves: int = TAIL_WAVES) -> int:
    """grid_order="tail_lpt": how many of the `heads` (batch, k/v head)s, each `units_per_head`
    clusters, end the launch longest first: enough for `waves` waves of the slots // cluster size
    clusters that run at once (slots = clusters here), at least 1, at most all."""
    return min(heads, max(1, -(-waves * slots // max(1, units_per_head))))


def gqa_dkv_for(heads: int, heads_kv: int, key_blocks: int, deterministic: bool = False, sms: int = TAIL_SLOTS,
                causal: bool = False, queries_per_key: float = 0.0) -> str:
    """The gqa_dkv default: "loop" without grouped K/V heads (heads_kv == heads) and always when
    deterministic (reduce adds in no fixed order); else "reduce" where the loop's CTAs, key_blocks
    per k/v head (summed over the batch or the packed sequences) x heads_kv, are fewer than the
    SMs, or with a causal mask and queries_per_key (queries over keys, both summed over the batch)
    at least REDUCE_QUERIES_PER_KEY; else "loop"."""
    if deterministic or heads_kv >= heads:
        return "loop"
    if key_blocks * heads_kv < sms or (causal and queries_per_key >= REDUCE_QUERIES_PER_KEY):
        return "reduce"
    return "loop"


def with_gqa_default(knobs: dict, head_dim: int, heads: int, heads_kv: int, batch: int, seqlen_k: int,
                     deterministic: bool, sms: int = TAIL_SLOTS, causal: bool = False, seqlen_q: int = 0) -> dict:
    """knobs with gqa_dkv set to gqa_dkv_for's choice where the caller left it out: the loop's key
    blocks of tile_n keys per (batch, k/v head) (a packed batch: batch 1, seqlen_k its total
    keys, whose blocks are about its sequences' sum; seqlen_q its total queries)."""
    if "gqa_dkv" in knobs or head_dim not in TILE_N_BY_HEAD_DIM:
        return knobs
    blocks = batch * -(-seqlen_k // TILE_N_BY_HEAD_DIM[head_dim])
    return {**knobs, "gqa_dkv": gqa_dkv_for(heads, heads_kv, blocks, deterministic, sms, causal,
                                            seqlen_q / seqlen_k if seqlen_k else 0.0)}


def dq_slices_for(cfg: BwdConfig, seqlen_q: int, seqlen_k: int, group: int = 1) -> int:
    """The dq_slices default of a deterministic build (1 otherwise): the fewest copies, a power of
    two up to DQ_SLICES' last, that leave no run of key blocks (pairs) longer than a CTA's walk
    (the query blocks of the group's q heads it visits without a mask; causal: the longest). Then
    a query block's chain of turns is no longer than the work of the CTA that waits on it: 1 on
    square problems, more where few queries see many keys (a chunk: 256 queries on 8k-16k keys).
    Measured on an H100 (lab/campaigns/kernel-sm90-backward); fa4sim's fa4kernel takes the same
    rule (its knob dq_slices)."""
    c = cluster_ctas(cfg)
    units = -(-seqlen_k // (c * cfg.tile_n))
    walk = group * -(-seqlen_q // cfg.tile_m)
    slices = 1
    if not cfg.deterministic or walk == 0:
        return slices
    while slices < DQ_SLICES[-1] and -(-units // slices) > walk:
        slices *= 2
    return slices


def with_dq_slices_default(knobs: dict, dtype: str, head_dim: int, causal: bool, deterministic: bool,
                           seqlen_q: int, seqlen_k: int, group: int) -> dict:
    """knobs with dq_slices set to dq_slices_for's choice where the caller left it out and the build
    is deterministic (a packed batch: its longest sequences' lengths, as the host knows them
    without reading cu_seqlens). Bad knobs: make_bwd_config's one-line ValueError."""
    if "dq_slices" in knobs or not deterministic:
        return knobs
    cfg = bwd_config_from_knobs(dtype, head_dim, causal, deterministic, knobs)
    return {**knobs, "dq_slices": dq_slices_for(cfg, seqlen_q, seqlen_k, group)}


def grid_heads(cfg: BwdConfig, heads: int, heads_kv: int) -> int:
    """The grid's head axis: one per q head with gqa_dkv="reduce", else one per k/v head."""
    return heads if cfg.gqa_dkv == "reduce" else heads_kv


def launch_order(cfg: BwdConfig, seqlen_k: int, heads_kv: int, batch: int) -> list[tuple[int, int, int]]:
    """(key block, k/v head, batch) of every CTA of the launch, in launch order (the CTA's linear
    block index: blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)), as sm90/bwd.py
    decodes it. Pairs (dq_sum="pair") round the key blocks up to even; their two CTAs are
    adjacent. Deterministic with a causal mask: the key blocks (pairs) of each (batch, k/v head)
    in reverse (the last first, where the plain order has the first). With gqa_dkv="reduce"
    pass the grid's heads (grid_heads: the q heads), whose index the second entry then is.
    Plain Python: the clock probe's per-CTA stamps are read back with it."""
    c = cluster_ctas(cfg)
    units = -(-seqlen_k // (cfg.tile_n * c))  # clusters per (batch, k/v head)
    nb = units * c
    g_all = heads_kv * batch
    out = []
    rev = cfg.deterministic and cfg.causal
    if cfg.grid_order == "heads_outer":
        for bi in range(batch):
            for h in range(heads_kv):
                for n in range(nb):
                    out.append((((units - 1 - n // c) * c + n % c) if rev else n, h, bi))
        return out
    tail = tail_heads(units, g_all, TAIL_SLOTS // c)
    for p in range(units * g_all):
        if p < (g_all - tail) * units:
            g, j = divmod(p, units)
        else:
            r = p - (g_all - tail) * units
            j, g = r // tail, g_all - tail + r % tail
        if rev:
            j = units - 1 - j
        for rank in range(c):
            out.append((j * c + rank, g % heads_kv, g // heads_kv))
    return out


def dq_slice(cfg: BwdConfig, n_block: int, seqlen_k: int) -> tuple[int, int, int, int]:
    """Deterministic builds: (accumulator copy, index of the key block's pair / key block within
    its run, the run's units, the keys from the run's first on) of the CTA of key block n_block
    (sm90/bwd.py FlashBwdSm90._dq_slice, in plain Python): a head's units cut into dq_slices runs of
    ceil(units / dq_slices), the last ones shorter or empty; dq_slices=1: one run, copy 0."""
    c = cluster_ctas(cfg)
    unit, units = n_block // c, -(-seqlen_k // (c * cfg.tile_n))
    if cfg.dq_slices == 1:
        return 0, unit, units, seqlen_k
    run = max(-(-units // cfg.dq_slices), 1)
    copy = unit // run
    first = copy * run
    return copy, unit - first, min(run, units - first), seqlen_k - first * c * cfg.tile_n


def dq_turn(cfg: BwdConfig, n_block: int, m_block: int, seqlen_q: int, seqlen_k: int) -> int:
    """Deterministic builds: the count the semaphore of query block m_block must have reached
    before the CTA of key block n_block adds its dQ there (sm90/bwd.py FlashBwdSm90._dq_turn, in
    plain Python). Key blocks go in pairs with dq_sum="pair" (both CTAs of pair u take turn c u,
    c = 2, and each adds 1). Without a mask pair / key block u goes u-th; causal: query block m is
    seen by the first n_max(m) of them, which launch last first (launch_order), so u comes after
    the n_max(m) - 1 - u above it. With dq_slices > 1 the turn is within the unit's run (dq_slice),
    on the copy's semaphore: a head of the run's keys alone."""
    c = cluster_ctas(cfg)
    _, unit, units, seqlen_k = dq_slice(cfg, n_block, seqlen_k)
    if not cfg.causal:
        return unit * c
    reach = max((m_block + 1) * cfg.tile_m + seqlen_k - seqlen_q, 0)
    n_max = min(units, -(-reach // (c * cfg.tile_n)))
    return (n_max - 1 - unit) * c


def dq_walk(cfg: BwdConfig, n_block: int, kv_head: int, group: int, seqlen_q: int,
            seqlen_k: int) -> list[tuple[int, int, int]]:
    """(query block, q head, turn) of every dQ add of the CTA of key block n_block of k/v head
    kv_head, in the order it makes them (sm90/bwd.py: _cta_work's query blocks of the CTA's pair,
    _next_block's walk, query blocks fastest, then the group's q heads kv_head * group + i; the
    turn is dq_turn's, deterministic builds only). Every CTA walks them, a pair's second one
    included where its keys lie past seqlen_k (it adds its half, zeros, and takes its turn); a
    CTA with no query block (none here: bottom-right causal, every key block sees one) adds
    nothing. Plain Python, for the semaphore walk of the whole launch (tests)."""
    c = cluster_ctas(cfg)
    first = n_block - n_block % c  # the pair's first key block: where its query blocks start
    m_max = -(-seqlen_q // cfg.tile_m)
    m_min = 0
    if cfg.causal:
        m_min = min(max(first * cfg.tile_n - (seqlen_k - seqlen_q), 0) // cfg.tile_m, m_max)
    return [(m, kv_head * group + i, dq_turn(cfg, n_block, m, seqlen_q, seqlen_k) if cfg.deterministic else 0)
            for i in range(group) for m in range(m_min, m_max)]
