"""Configuration and validation of the SM100 (Blackwell) forward kernel (sm100/fwd.py).

Plain Python (no CUDA, no CuTe DSL, no torch at import): the knobs are checked before anything
is compiled, and CPU-only tests read the configuration without the compiler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SUPPORTED_HEAD_DIMS = (64, 96, 128)
SUPPORTED_DTYPES = ("bfloat16", "float16")
TILE_M = 128  # rows per Q tile (one UMMA M=128, one TMEM lane per row)
TILE_N = 128  # keys per KV block
Q_STAGES = 2  # two Q tiles per CTA, processed in ping-pong
SMEM_LIMIT_BYTES = 232448  # sm100 max dynamic smem per CTA (227 KB)
SMEM_EXTRA_BYTES = 2048  # mbarriers + sScale (2 x 128 fp32), padded to the 1 KB alignment
# FA4 defaults: K and V share one ring of kv_stages slots (hd128 1-CTA: 3, hd96: 5, hd64: 10)
DEFAULT_KV_STAGES = {64: 10, 96: 5, 128: 3}
# exp2 emulation pattern (FA4): a row is 4 fragments of 32 columns; the first fragment
# (start_frg = 1) and the last are never emulated; in the others the last `res` of every
# `freq` = 16 columns are. exp_emulation = emulated fraction of the row = 4 * res / 128.
EMU_FRAG = 32
EMU_FREQ = 16
EMU_START_FRG = 1
DEFAULT_EXP_EMULATION = 0.125  # res = 4 of 16: FA4's default (16/4/1)
MAX_EXP_EMULATION = 0.5  # res = 16: every column of fragments 1 and 2
DEFAULT_RESCALE_THRESHOLD = 8.0
# setmaxnreg per role (FA4): softmax / correction / others; sum over warps = 64K registers
REGS = {64: (200, 64, 48), 96: (192, 80, 48), 128: (192, 80, 48)}

@dataclass(frozen=True)
class Sm100Config:
    head_dim: int
    causal: bool
    exp_emulation: float  # fraction of a row's exp2 on the FMA pipe (FA4 fragment pattern)
    emu_res: int  # emulated columns per 16 in the eligible fragments
    rescale_threshold: float  # tau (log2 units); 0 = always rescale
    kv_stages: int
    dtype: str
    has_lse: bool = False

    @property
    def regs(self):
        return REGS[self.head_dim]


def smem_bytes(head_dim: int, kv_stages: int, has_lse: bool = False, elem_bytes: int = 2) -> int:
    """Shared memory of the kernel (matches SharedStorage.size_in_bytes())."""
    q = Q_STAGES * TILE_M * head_dim * elem_bytes
    o = Q_STAGES * TILE_M * head_dim * elem_bytes
    kv = kv_stages * TILE_N * head_dim * elem_bytes
    lse = Q_STAGES * TILE_M * 4 if has_lse else 0  # row_max slots
    return q + o + kv + SMEM_EXTRA_BYTES + lse


def make_sm100_config(head_dim=128, causal=False, exp_emulation=DEFAULT_EXP_EMULATION,
                      rescale_threshold=DEFAULT_RESCALE_THRESHOLD, kv_stages=None,
                      dtype="bfloat16", return_lse=False) -> Sm100Config:
    """Validate the knobs (plain Python, no compile); raises a one-line ValueError."""
    if isinstance(head_dim, bool) or head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim!r} not supported; allowed: "
                         f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r} not supported; allowed: True or False")
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse={return_lse!r} not supported; allowed: True or False")
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype={dtype!r} not supported; allowed: {', '.join(SUPPORTED_DTYPES)}")
    emu = exp_emulation
    if isinstance(emu, bool) or not isinstance(emu, (int, float)) or math.isnan(float(emu)) \
            or not 0.0 <= float(emu) <= MAX_EXP_EMULATION:
        raise ValueError(f"exp_emulation={emu!r} not supported; allowed: a number in "
                         f"[0, {MAX_EXP_EMULATION}] (FA4 pattern: fragments 1-2 of 4 only)")
    n_groups = (TILE_N // EMU_FRAG - 1 - EMU_START_FRG) * (EMU_FRAG // EMU_FREQ)
    res = int(round(float(emu) * TILE_N / n_groups))
    tau = rescale_threshold
    if tau is None:
        tau = 0.0
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or math.isnan(float(tau)) \
            or not 0.0 <= float(tau) <= 16.0:
        raise ValueError(f"rescale_threshold={tau!r} not supported; allowed: None/0 (always "
                         f"rescale) or a number in (0, 16] (FA4: 8.0)")
    if kv_stages is None:
        kv_stages = DEFAULT_KV_STAGES[head_dim]
    if isinstance(kv_stages, bool) or not isinstance(kv_stages, int) or kv_stages < 2:
        raise ValueError(f"kv_stages={kv_stages!r} not supported; allowed: an int >= 2")
    need = smem_bytes(head_dim, kv_stages, bool(return_lse))
    if need > SMEM_LIMIT_BYTES:
        max_st = (SMEM_LIMIT_BYTES - smem_bytes(head_dim, 0, bool(return_lse))) // (TILE_N * head_dim * 2)
        raise ValueError(f"kv_stages={kv_stages} at head_dim={head_dim} needs {need} bytes of "
                         f"smem; allowed: kv_stages <= {max_st} (227 KB)")
    return Sm100Config(head_dim=head_dim, causal=causal, exp_emulation=res * n_groups / TILE_N,
                       emu_res=res, rescale_threshold=float(tau), kv_stages=kv_stages,
                       dtype=dtype, has_lse=return_lse)


def emulated_mask(emu_res: int, n: int = TILE_N) -> tuple:
    """Per column of a row: True where exp2 uses the polynomial (FA4 fragment pattern)."""
    n_frg = n // EMU_FRAG
    out = []
    for c in range(n):
        frg = c // EMU_FRAG
        eligible = EMU_START_FRG <= frg < n_frg - 1
        out.append(bool(eligible and emu_res > 0 and (c % EMU_FREQ) >= EMU_FREQ - emu_res))
    return tuple(out)
