"""Configuration and validation of the SM90 (Hopper) forward kernel (sm90/fwd.py).

A KernelConfig holds what a user chooses: dtype, head_dim, causal, has_lse and the knobs
(KNOB_NAMES), every auto value resolved. Diagnostic builds are not part of it
(diagnostics.Diagnostics). Everything here is plain Python (no CUDA, no CuTe DSL, no torch at
import), so the checks run on a CPU-only machine and happen BEFORE anything is compiled;
fa4sim reads the defaults from here (make_config, default_knobs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, asdict

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
SUPPORTED_DTYPES = ("bfloat16", "float16")
KNOB_NAMES = (
    "tile_m",
    "tile_n",
    "kv_stages",
    "pingpong",
    "intra_wg_overlap",
    "p_in_registers",
    "exp_emulation",
    "rescale_threshold",
    "persistent",
    "rescale_before_pv",
    "early_q_release",
    "defer_o_store_wait",
    "chained_row_sum",
)

# Hopper limits the kernel has to live within.
SMEM_LIMIT_BYTES = 227 * 1024  # max dynamic smem per CTA on H100/H200
MBARRIER_AND_ALIGN_BYTES = 1024  # barrier words + 1 KiB alignment of the first buffer
# setmaxnreg budgets (consumer, producer) by number of consumer warpgroups, as in FA3/FA4:
# 2 WGs: 240 + 24, 3 WGs: 160 + 32 (the 64K register file split over 384 / 512 threads).
REG_BUDGET = {2: (240, 24), 3: (160, 32)}
# Registers a consumer thread needs besides the O / S / P fragments: row stats, addresses,
# loop state, masks. Rough, but it keeps configurations that would spill from compiling.
REG_OVERHEAD = 32

DEFAULT_RESCALE_THRESHOLD = 8.0  # tau in log2 units (a factor of 256), FA4's value for 16-bit

# Per-head-dim defaults from the SM90 table in docs/reference/fa4-schedules.md
# (tile_m, tile_n, p_in_registers, pingpong). Deviations: hd192 uses tile_n = 112 because
# 128 x 128 with 2 K and 2 V stages needs 240 KB of smem (> 227 KB); FA4's own
# _tile_size_fwd_sm90 picks 112 for head_dim_v = 192 too. hd256 uses tile_n = 64, not 80:
# measured side by side on H100 (lab/tools/tile_choice_sm90.py with idle warpgroups skipping their
# work: lab/campaigns/kernel-sm90-forward/, lab/findings/kernel-design-sm90.md), non-causal
# 1k / 4k / 16k 647 / 766 / 768 TFLOP/s vs 628 / 744 / 751 with 80 (no partial last block at
# power-of-two lengths, fewer S registers); causal 458 / 693 / 756 vs 457 / 685 / 760.
_DEFAULTS = {
    64: (192, 128, True, True),
    96: (192, 144, False, True),
    128: (128, 128, True, True),
    192: (128, 112, True, False),
    256: (128, 64, True, False),
}


@dataclass(frozen=True)
class KernelConfig:
    """One kernel variant: what the user chose, auto values resolved. Hashable: the compile
    cache keys on it (with diagnostics.Diagnostics for instrumented builds)."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int
    causal: bool
    has_lse: bool
    tile_m: int
    tile_n: int
    kv_stages: int
    pingpong: bool
    intra_wg_overlap: bool
    p_in_registers: bool
    exp_emulation: float
    rescale_threshold: float  # 0.0 = always rescale (FA3 behaviour)
    # one CTA per SM looping over tiles (True) or one CTA per tile (False); resolved by make_config
    persistent: bool = True
    # intra-WG overlap only: O *= the previous block's scale while S(j) is computed, before the
    # PV GEMM (FA4's RescaleOBeforeGemm), instead of after the PV wait; auto: head_dim > 128, and
    # with conditional rescaling (rescale_threshold > 0) at every head dim
    rescale_before_pv: bool = False
    # intra-WG overlap with O in its own smem buffer: each consumer hands Q back right after the
    # tile's last QK GEMM (its last KV block peeled out of the loop), so the next tile's Q loads
    # behind this tile's last softmax, PV and epilogue; False: after the whole KV loop. Auto: with
    # 2 consumer warpgroups (measured; with 3 ptxas scheduled hd64's loop worse)
    early_q_release: bool = False
    # O in its own smem buffer: the warp that issues a tile's O store (warp 4, in consumer
    # warpgroup 0) waits for the store to have read sO only before the next tile's O goes there,
    # not right after issuing it, so warpgroup 0 starts its next tile at once. Auto: on
    defer_o_store_wait: bool = False
    # the softmax's instruction order (same arithmetic up to fp32 summation order): each row's
    # O-scale exp2 after its P exp2s and its sum as one FADD chain, so ptxas interleaves the O
    # rescale with the exp2s (lab/findings/kernel-design-sm90.md, "Softmax order"). Auto: causal head_dim 64 (measured)
    chained_row_sum: bool = False
    # the decode build (kvcache.py, docs/decode.md): per-row key counts from a device tensor
    # (seqused_k), pack-GQA rows (a CTA of one k/v head runs its group's q heads' rows, token-major,
    # causal per row's token), split-KV in the grid; one CTA per tile, no tile table
    decode: bool = False
    # decode with num_splits > 1: fp32 partial O and lse per split (combine.py adds them up)
    split_kv: bool = False
    # the varlen build (varlen.py, docs/varlen.md): packed sequences of unequal lengths, each
    # sequence's rows and keys from cu_seqlens (device tensors); its Q tiles counted on the
    # device (no tile table), persistent or one CTA per tile; O leaves by TMA, a sequence's
    # partial last tile through 16-byte row stores
    varlen: bool = False
    # varlen only, pack-GQA for MQA (varlen.py, docs/varlen.md): q (total_q x group, 1, d), a free
    # view of MQA's q, so a CTA's tile holds tile_m / group tokens of every q head and a short
    # sequence fills its tiles; the kernel takes group at run time, reads cu_seqlens_q x group as
    # the rows, masks each row by its token (row r: token r // group) and writes lse in (heads,
    # total_q), row r at (r % group, r // group)
    pack_gqa: bool = False

    @property
    def num_consumer_wgs(self) -> int:
        return self.tile_m // 64

    @property
    def num_threads(self) -> int:
        return 128 * (self.num_consumer_wgs + 1)

    @property
    def regs(self):
        return REG_BUDGET[self.num_consumer_wgs]

    @property
    def separate_o(self) -> bool:
        """O gets its own smem buffer (instead of reusing Q's) when that still fits."""
        return smem_bytes(self.head_dim, self.tile_m, self.tile_n, self.kv_stages,
                          self.p_in_registers) + self.tile_m * self.head_dim * 2 <= SMEM_LIMIT_BYTES

    def as_dict(self):
        return asdict(self)


def rescale_threshold_default(head_dim: int, causal: bool) -> float | None:
    """Conditional rescaling (O and the row sum rescaled only where a row's max grew by more than
    tau) on by default, as in FA4: H200, settled, +1.7 to +5.4 % at 11 grid points of hd64 / hd128
    and hd256 causal; hd256 without a mask, where the O rescale's 128 FMULs weigh least against
    its two GEMMs, +0.3 % at 4k and -1.9 % at 16k, so it rescales always there. hd96 and hd192
    are not measured (fa4sim: +2.0 to +2.4 %). The rule was read off that run (in-sample;
    lab/campaigns/kernel-sm90-peers/README.md, "Conditional rescaling on by default")."""
    return None if head_dim == 256 and not causal else DEFAULT_RESCALE_THRESHOLD


def default_knobs(head_dim: int, causal: bool = False) -> dict:
    """The defaults for a head dim (validated head dim expected)."""
    tile_m, tile_n, p_rs, pingpong = _DEFAULTS[head_dim]
    if head_dim == 96 and causal:
        # FA4 uses 192 x 128 for causal hd96; in our kernel that spills a few registers in the
        # 160-register consumer WGs (the causal mask keeps more values live), 192 x 112 does not.
        tile_n = 112
    return dict(
        tile_m=tile_m,
        tile_n=tile_n,
        kv_stages=2,
        pingpong=pingpong,
        intra_wg_overlap=True,
        p_in_registers=p_rs,
        exp_emulation=0.0,
        rescale_threshold=rescale_threshold_default(head_dim, causal),
        persistent=None,
        rescale_before_pv=None,
        early_q_release=None,
        defer_o_store_wait=None,
        chained_row_sum=None,
    )


def smem_bytes(head_dim: int, tile_m: int, tile_n: int, kv_stages: int, p_in_registers: bool,
               elem_bytes: int = 2) -> int:
    """Shared memory the kernel allocates: Q (reused for O), K and V rings, P if staged in smem."""
    q = tile_m * head_dim * elem_bytes
    kv = 2 * kv_stages * tile_n * head_dim * elem_bytes
    p = 0 if p_in_registers else tile_m * tile_n * elem_bytes
    # each buffer is 1 KiB aligned
    align = lambda x: (x + 1023) // 1024 * 1024  # noqa: E731
    return MBARRIER_AND_ALIGN_BYTES + align(q) + align(kv // 2) * 2 + align(p)


def consumer_regs_estimate(head_dim: int, tile_n: int, p_in_registers: bool) -> int:
    """fp32 O accumulator (hd/2 per thread per 64 rows) + S (tile_n/2) + bf16 P (tile_n/4)."""
    return head_dim // 2 + tile_n // 2 + (tile_n // 4 if p_in_registers else 0) + REG_OVERHEAD


def _is_bool(x) -> bool:
    return isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def resolve_knobs(head_dim: int, causal: bool, knobs: dict) -> dict:
    """Merge user knobs with defaults and validate each. Raises ValueError (one line)."""
    unknown = [k for k in knobs if k not in KNOB_NAMES]
    if unknown:
        raise ValueError(
            f"unknown knob(s) {', '.join(sorted(unknown))}; allowed knobs: {', '.join(KNOB_NAMES)}"
        )
    out = default_knobs(head_dim, causal)
    for k, v in knobs.items():
        if v is not None or k == "rescale_threshold":
            out[k] = v

    tile_m, tile_n, stages = out["tile_m"], out["tile_n"], out["kv_stages"]
    if not _is_int(tile_m) or tile_m not in (128, 192):
        raise ValueError(
            f"tile_m={tile_m!r} not supported; allowed: 128 (2 consumer warpgroups) or 192 (3)"
        )
    if not _is_int(tile_n) or tile_n < 16 or tile_n > 256 or tile_n % 16 != 0:
        raise ValueError(f"tile_n={tile_n!r} not supported; allowed: a multiple of 16 in [16, 256]")
    if not _is_int(stages) or not 1 <= stages <= 8:
        raise ValueError(f"kv_stages={stages!r} not supported; allowed: an int in [1, 8]")
    for name in ("pingpong", "intra_wg_overlap", "p_in_registers"):
        if not _is_bool(out[name]):
            raise ValueError(f"{name}={out[name]!r} not supported; allowed: True or False")
    emu = out["exp_emulation"]
    if _is_bool(emu) or not isinstance(emu, (int, float)) or not (0.0 <= float(emu) <= 1.0) \
            or math.isnan(float(emu)):
        raise ValueError(f"exp_emulation={emu!r} not supported; allowed: a number in [0, 1]")
    out["exp_emulation"] = float(emu)
    tau = out["rescale_threshold"]
    if tau is None:
        tau = 0.0
    if _is_bool(tau) or not isinstance(tau, (int, float)) or math.isnan(float(tau)) \
            or not (0.0 <= float(tau) <= 16.0):
        raise ValueError(
            f"rescale_threshold={tau!r} not supported; allowed: None/0 (always rescale) or a "
            f"number in (0, 16] (log2 units; {DEFAULT_RESCALE_THRESHOLD} is FA4's value)"
        )
    out["rescale_threshold"] = float(tau)

    # Combinations that cannot fit.
    n_wg = tile_m // 64
    budget = REG_BUDGET[n_wg][0]
    need = consumer_regs_estimate(head_dim, tile_n, out["p_in_registers"])
    if need > budget:
        raise ValueError(
            f"tile_m={tile_m}, tile_n={tile_n}, p_in_registers={out['p_in_registers']} at "
            f"head_dim={head_dim} needs ~{need} registers per consumer thread but {n_wg} consumer "
            f"warpgroups get {budget}; allowed: a smaller tile_n, tile_m=128 or p_in_registers=False"
        )
    smem = smem_bytes(head_dim, tile_m, tile_n, stages, out["p_in_registers"])
    if smem > SMEM_LIMIT_BYTES:
        raise ValueError(
            f"tile_m={tile_m}, tile_n={tile_n}, kv_stages={stages} at head_dim={head_dim} needs "
            f"{smem} bytes of shared memory; allowed: at most {SMEM_LIMIT_BYTES} (227 KB): "
            f"reduce tile_n or kv_stages"
        )
    if out["pingpong"] and n_wg < 2:
        raise ValueError("pingpong=True needs at least 2 consumer warpgroups (tile_m >= 128)")
    own_o = smem + tile_m * head_dim * 2 <= SMEM_LIMIT_BYTES  # else O goes out through Q's buffer
    pers = out["persistent"]
    if pers is None:  # auto: persistent where O has its own smem buffer (causal too: the host's
        # tile schedule balances the unequal causal tiles, fa4kernel/tile_schedule.py)
        pers = own_o
    if not _is_bool(pers):
        raise ValueError(f"persistent={pers!r} not supported; allowed: None (auto), True or False")
    out["persistent"] = bool(pers)
    before = out["rescale_before_pv"]
    if before is None:  # auto: FA4's rule, where O (head_dim / 2 fp32 per thread) is large, and with
        # conditional rescaling, whose branch after the PV wait costs as much as the FMULs it skips
        # (measured on H100, lab/findings/kernel-design-sm90.md "Where the conditional rescale goes")
        before = (head_dim > 128 or out["rescale_threshold"] > 0.0) and out["intra_wg_overlap"]
    if not _is_bool(before):
        raise ValueError(f"rescale_before_pv={before!r} not supported; allowed: None (auto), True or False")
    if before and not out["intra_wg_overlap"]:
        raise ValueError("rescale_before_pv=True needs intra_wg_overlap=True (without the overlap O is "
                         "rescaled before its PV GEMM anyway)")
    out["rescale_before_pv"] = bool(before)
    early = out["early_q_release"]
    if early is None:  # auto: measured on H100 (fa4kernel/README.md, knob table)
        early = own_o and out["intra_wg_overlap"] and n_wg == 2
    if not _is_bool(early):
        raise ValueError(f"early_q_release={early!r} not supported; allowed: None (auto), True or False")
    if early and not (own_o and out["intra_wg_overlap"]):
        raise ValueError("early_q_release=True needs intra_wg_overlap=True and O in its own smem buffer "
                         f"(here {'the O store reuses Q' if not own_o else 'no overlap'}); allowed: False or None")
    out["early_q_release"] = bool(early)
    defer = out["defer_o_store_wait"]
    if defer is None:  # auto: wherever O has its own buffer (measured on H100, fa4kernel/README.md)
        defer = own_o
    if not _is_bool(defer):
        raise ValueError(f"defer_o_store_wait={defer!r} not supported; allowed: None (auto), True or False")
    if defer and not own_o:
        raise ValueError("defer_o_store_wait=True needs O in its own smem buffer (here the O store reuses Q, "
                         "which goes back to the producer right after the store); allowed: False or None")
    out["defer_o_store_wait"] = bool(defer)
    chained = out["chained_row_sum"]
    if chained is None:  # auto: measured on H100 (lab/findings/kernel-design-sm90.md, "Softmax order"): +1.3..4.5 %
        chained = head_dim == 64 and causal  # at hd64 causal, -1 % non-causal, -1..4 % at hd128/256
    if not _is_bool(chained):
        raise ValueError(f"chained_row_sum={chained!r} not supported; allowed: None (auto), True or False")
    out["chained_row_sum"] = bool(chained)
    return out


def make_config(dtype: str, head_dim: int, causal: bool, has_lse: bool, knobs: dict) -> KernelConfig:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype} not supported; allowed: {', '.join(SUPPORTED_DTYPES)}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head_dim={head_dim} not supported; allowed: {', '.join(map(str, SUPPORTED_HEAD_DIMS))}"
        )
    if not _is_bool(causal):
        raise ValueError(f"causal={causal!r} not supported; allowed: True or False")
    k = resolve_knobs(head_dim, causal, knobs)
    return KernelConfig(dtype=dtype, head_dim=head_dim, causal=causal, has_lse=bool(has_lse), **k)


# The decode build's knobs: 128-row tiles (2 consumer warpgroups: a packed tile of decode holds
# seqlen_q x group rows, mostly <= 64, and a third warpgroup would idle too), one CTA per tile
# (the grid is tiles x splits; no tile table), the overlapped KV loop (the only one it has).
DECODE_KNOBS = {"tile_m": 128, "persistent": False, "intra_wg_overlap": True}


def make_decode_config(dtype: str, head_dim: int, causal: bool, split_kv: bool) -> KernelConfig:
    """The decode build of the forward (KernelConfig.decode) for these problem options."""
    from dataclasses import replace

    knobs = dict(DECODE_KNOBS)
    if head_dim in (64, 96):  # their default tile_n assumes 3 warpgroups' registers; FA3's decode tile
        knobs["tile_n"] = 128
    cfg = make_config(dtype, head_dim, causal, True, knobs)
    return replace(cfg, decode=True, split_kv=bool(split_kv))


# The varlen build is persistent at every head dim (persistent=None): where O shares Q's buffer
# (hd96 without a mask, hd192, hd256) the dense forward is not, but there its varlen CTAs, which
# count their tiles on the device and take the next free one, ran 0.5-4.4 % faster than one CTA
# per tile, as fa4sim had predicted (+0.7-1.8 %; H200, lab/campaigns/varlen-sm90/, persistent_ab:
# an end-to-end comparison, in-sample for this choice).
VARLEN_PERSISTENT = True


def make_varlen_config(dtype: str, head_dim: int, causal: bool, has_lse: bool, knobs: dict,
                       pack_gqa: bool = False) -> KernelConfig:
    """The varlen build of the forward (KernelConfig.varlen) for these problem options and knobs:
    the tiles are counted on the device from cu_seqlens (no host table); persistent unless the
    knobs say otherwise (VARLEN_PERSISTENT); pack_gqa: KernelConfig.pack_gqa."""
    from dataclasses import replace

    if knobs.get("persistent") is None:
        knobs = {**knobs, "persistent": VARLEN_PERSISTENT}
    cfg = make_config(dtype, head_dim, causal, has_lse, knobs)
    return replace(cfg, varlen=True, pack_gqa=bool(pack_gqa))

