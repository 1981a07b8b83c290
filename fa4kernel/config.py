"""Configuration and validation for the SM90 forward kernel.

Everything here is plain Python (no CUDA, no CuTe DSL, no torch import at module level) so the
checks run on a CPU-only CI machine and happen BEFORE anything is compiled.
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

# Per-head-dim defaults from the SM90 table in shared/reference/fa4-schedules.md
# (tile_m, tile_n, p_in_registers, pingpong). Deviations: hd192 uses tile_n = 112 because
# 128 x 128 with 2 K and 2 V stages needs 240 KB of smem (> 227 KB); FA4's own
# _tile_size_fwd_sm90 picks 112 for head_dim_v = 192 too. hd256 uses tile_n = 64, not 80:
# measured side by side on H100 (2026-11-22, benchmarks/results/tile_choice_idle_h100_2026-11-22.json),
# non-causal 1k / 4k / 16k 647 / 766 / 768 TFLOP/s vs 628 / 744 / 751 with 80 (no partial last
# block at power-of-two lengths, fewer S registers); causal 458 / 693 / 756 vs 457 / 685 / 760.
_DEFAULTS = {
    64: (192, 128, True, True),
    96: (192, 144, False, True),
    128: (128, 128, True, True),
    192: (128, 112, True, False),
    256: (128, 64, True, False),
}


@dataclass(frozen=True)
class KernelConfig:
    """One compiled kernel variant. Hashable: it is the compile-cache key."""

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
    # rescale with the exp2s (fa4kernel/README.md, "Softmax order"). Auto: causal head_dim 64 (measured)
    chained_row_sum: bool = False
    # Instrumented build (issue 4): clock64 stamps of one CTA into a global int64 buffer. Not a
    # user knob (attention() rejects it); set only through trace_config(). False = the normal
    # kernel, whose generated code does not depend on this field.
    trace: bool = False
    # Diagnostic builds (issue 4), also set only through diagnostic_config(): clock_probe = the
    # normal kernel plus two clock64/globaltimer stamps of one CTA (its start and end), i.e. the
    # trace buffer's header without the per-op stamps: the in-kernel SM clock of every launch at
    # no measurable cost. skip_softmax = no online softmax and no O rescale (P = S converted):
    # the wgmma + pipeline skeleton alone. Its output is NOT attention; timing only.
    clock_probe: bool = False
    skip_softmax: bool = False
    # cta_log (with clock_probe): every CTA also logs its SM id and start / end stamps
    # (trace_layout.CTA_LOG_*): which SM ran which tile, for how long, and the gaps between them
    cta_log: bool = False
    # ablations (timing only; the output is NOT attention), comma-separated: "max" (row max from
    # one element: no FMNMX tree, no shuffles), "exp" (P = the scaled score: no MUFU.EX2), "sum"
    # (no row-sum FADDs), "rescale" (no O rescale). Each one's change in cycles per KV block is
    # what that phase costs on the critical path; fa4sim's free_* knobs are the same what-ifs.
    ablate: str = ""
    # with trace: stamp only QK, PV, the softmax as one span, FIN and ST (trace_layout.LIGHT_OPS),
    # keeping the normal build's code order; set through trace_config(cfg, light=True)
    trace_light: bool = False
    # diagnostic (diagnostic_config): keep the exp2s ahead of the PV wait with a never-taken branch
    # on the row sums (ptxas otherwise hoists the wait above them; fa4kernel/README.md "Where the
    # PV wait sits"). Measured slower; kept to study why.
    exp_before_pv_wait: bool = False

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
        rescale_threshold=None,
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
        # (measured on H100, fa4kernel/README.md "Where the conditional rescale goes")
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
    if chained is None:  # auto: measured on H100 (fa4kernel/README.md, "Softmax order"): +1.3..4.5 %
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


def trace_config(cfg: KernelConfig, light: bool = False) -> KernelConfig:
    """The instrumented (clock64-stamping) build of a configuration; buffer layout in trace_layout.py.
    light=True: a few stamps per block only (trace_layout.LIGHT_OPS), less perturbation."""
    from dataclasses import replace

    return replace(cfg, trace=True, trace_light=bool(light))


# "vote_sum" / "vote_row0" (conditional rescaling only): the rescale's warp vote on a predicate
# that is never true and depends only on the row sums (after the exp2s), or on row 0's scale
# alone: what the vote's dependence on every row's max costs the compiled order
ABLATIONS = ("max", "exp", "sum", "rescale", "vote_sum", "vote_row0")


def diagnostic_config(cfg: KernelConfig, clock_probe: bool = True, skip_softmax: bool = False,
                      ablate: str = "", exp_before_pv_wait: bool = False, cta_log: bool = False) -> KernelConfig:
    """A diagnostic build of a configuration (see KernelConfig.clock_probe / skip_softmax /
    ablate); it takes the trace buffer (trace_layout.TRACE_WORDS int64) like the instrumented build."""
    from dataclasses import replace

    parts = tuple(sorted(x for x in ablate.split(",") if x))
    bad = [x for x in parts if x not in ABLATIONS]
    if bad:
        raise ValueError(f"ablate={ablate!r}: unknown {', '.join(bad)}; allowed: {', '.join(ABLATIONS)}")
    if cta_log and not clock_probe:
        raise ValueError("cta_log=True needs clock_probe=True (it writes into the probe's stamps buffer)")
    return replace(cfg, clock_probe=bool(clock_probe), skip_softmax=bool(skip_softmax), ablate=",".join(parts),
                   exp_before_pv_wait=bool(exp_before_pv_wait), cta_log=bool(cta_log))


def validate_tensors(q, k, v, causal=False, softmax_scale=None, return_lse=False):
    """Checks on torch tensors q, k, v shaped (batch, seqlen, heads, head_dim).

    Device-independent checks only (testable with CPU tensors); validate_device() runs after the
    knobs are validated, so every argument error is reported without a GPU.
    Returns (batch, seqlen_q, seqlen_k, heads, head_dim, dtype_name).
    """
    import torch  # imported lazily: config is importable without torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"{name}.dtype={t.dtype} not supported; allowed: torch.bfloat16, torch.float16")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); allowed: all the same")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
    b, sq, h, d = q.shape
    bk, sk, hk, dk = k.shape
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim={d} not supported; allowed: {', '.join(map(str, SUPPORTED_HEAD_DIMS))}")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k shape {tuple(k.shape)} != v shape {tuple(v.shape)}; allowed: equal shapes")
    if bk != b or hk != h or dk != d:
        raise ValueError(
            f"k/v shape {tuple(k.shape)} does not match q shape {tuple(q.shape)}; allowed: same "
            f"batch, heads and head_dim (seqlen may differ)"
        )
    if b < 1 or h < 1 or sq < 1 or sk < 1:
        raise ValueError(f"empty input (q {tuple(q.shape)}, k {tuple(k.shape)}); allowed: all dims >= 1")
    if b * h > 65535 * 65535 or h > 65535 or b > 65535:
        raise ValueError("batch and heads must each be <= 65535 (grid limits)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}.stride(-1)={t.stride(-1)}; allowed: 1 (head_dim contiguous)")
        for i in range(3):
            if t.stride(i) % 8 != 0 or t.stride(i) <= 0:
                raise ValueError(
                    f"{name}.stride({i})={t.stride(i)}; allowed: positive multiples of 8 elements "
                    f"(16-byte aligned rows for TMA)"
                )
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r}; allowed: True or False")
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
                or not math.isfinite(softmax_scale) or softmax_scale <= 0:
            raise ValueError(f"softmax_scale={softmax_scale!r}; allowed: None or a finite number > 0")
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse={return_lse!r}; allowed: True or False")
    dtype = "bfloat16" if q.dtype == torch.bfloat16 else "float16"
    return b, sq, sk, h, d, dtype


def validate_device(q, k, v):
    """Last checks (need the tensors' device): CUDA, same device, 16-byte aligned pointers."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on device {t.device}; allowed: a CUDA device (Hopper sm_90)")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.data_ptr() % 16 != 0:
            raise ValueError(f"{name}.data_ptr() is not 16-byte aligned; allowed: 16-byte aligned")
