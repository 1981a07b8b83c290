"""Conditional online-softmax rescaling: how often does a warp have to rescale O?

Online softmax keeps a running row max m and rescales the accumulator O by 2^(m_old - m_new)
whenever m grows. FA4 keeps the stale max unless the new block's max exceeds it by more than
tau (log2 units; tau = 8 for 16-bit inputs, a factor 256 that still fits bf16); the final
O / row_sum uses the statistics of the max actually used, so the result stays exact. The
correction warpgroup decides per warp (any of its 32 rows), and the first KV block never
rescales. Source: ../shared/reference/fa4-schedules.md ("Conditional online-softmax rescaling").

For scores that are i.i.d. normal with standard deviation `score_std` (natural-log units, i.e.
of softmax_scale * q.k; randn inputs give 1.0), the probability that a row's block-j max beats
the running max of the previous j blocks by more than tau is

    P_row(j) = integral dF_new(y) * F_old(y - tau),   F_new = Phi(y/s)^cols, F_old = Phi(y/s)^(cols*j)

with s = score_std / ln 2 (log2 units), and a warp of R rows fires with 1 - (1 - P_row)^R. The
running max stands in for the stale max (exact for tau = 0; for tau > 0 it slightly
under-counts, and both round to ~0 at tau = 8 for realistic scores).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

LN2 = math.log(2.0)


def _phi(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))


@lru_cache(maxsize=256)
def _per_block(n_kv: int, tau: float, score_std: float, cols: int, rows: int) -> tuple[float, ...]:
    s = score_std / LN2
    y = np.linspace(-8 * s, 12 * s + tau, 4001)
    log_phi = np.log(np.clip(_phi(y / s), 1e-300, 1.0))
    f_new = np.exp(cols * log_phi)
    d_new = np.diff(f_new)
    y_mid = 0.5 * (y[1:] + y[:-1])
    log_phi_shift = np.log(np.clip(_phi((y_mid - tau) / s), 1e-300, 1.0))
    j = np.arange(1, n_kv)[:, None]
    p_row = (d_new[None, :] * np.exp(cols * j * log_phi_shift[None, :])).sum(axis=1)
    p_warp = 1.0 - (1.0 - np.clip(p_row, 0.0, 1.0)) ** rows
    return (0.0, *p_warp.tolist())


def rescale_probabilities(n_kv: int, tau: float | None, score_std: float = 1.0,
                          cols: int = 128, rows: int = 32) -> np.ndarray:
    """Probability that a warp rescales O at each KV block 0..n_kv-1.

    tau=None means unconditional rescaling (FA3 style): every block after the first.
    """
    if n_kv < 1:
        raise ValueError("n_kv must be >= 1")
    if tau is None:
        return np.array([0.0] + [1.0] * (n_kv - 1))
    return np.array(_per_block(int(n_kv), float(tau), float(score_std), int(cols), int(rows)))


def rescale_rate(n_kv: int, tau: float | None, score_std: float = 1.0,
                 cols: int = 128, rows: int = 32) -> float:
    """Mean fraction of (warp, KV block) pairs that rescale, over a tile's n_kv blocks."""
    return float(rescale_probabilities(n_kv, tau, score_std, cols, rows).mean())


def online_softmax_blocks(scores: np.ndarray, block: int, tau: float | None):
    """Reference online softmax over key blocks with conditional rescaling, in numpy (float64).

    scores: (rows, keys) already multiplied by softmax_scale * log2(e) (log2 units).
    Returns (probabilities (rows, keys) as the kernel's final P / row_sum, number of rescales
    per row). Exact for any tau: the final division uses the max that was actually used.
    """
    rows, keys = scores.shape
    m = np.full(rows, -np.inf)
    row_sum = np.zeros(rows)
    acc = np.zeros((rows, keys))  # stands in for O = P V with V = identity
    rescales = np.zeros(rows, dtype=int)
    for k0 in range(0, keys, block):
        s = scores[:, k0:k0 + block]
        new_max = np.maximum(m, s.max(axis=1))
        first = np.isinf(m)
        grow = new_max > m if tau is None else new_max > m + tau
        use = np.where(first | grow, new_max, m)
        scale = np.where(first, 0.0, np.exp2(m - use))
        rescales += (~first & (use != m)).astype(int)
        p = np.exp2(s - use[:, None])
        acc *= scale[:, None]
        acc[:, k0:k0 + block] = p
        row_sum = row_sum * scale + p.sum(axis=1)
        m = use
    return acc / row_sum[:, None], rescales
