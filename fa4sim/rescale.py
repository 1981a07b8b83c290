"""Conditional online-softmax rescaling: how often does a warp have to rescale O?

Online softmax keeps a running row max m and rescales the accumulator O by 2^(m_old - m_new)
whenever m grows. FA4 keeps the stale max unless the new block's max exceeds it by more than
tau (log2 units; tau = 8 for 16-bit inputs, a factor 256 that still fits bf16); the final
O / row_sum uses the statistics of the max actually used, so the result stays exact. The
correction warpgroup decides per warp (any of its 32 rows), and the first KV block never
rescales. Source: docs/reference/fa4-schedules.md ("Conditional online-softmax rescaling").

For scores that are i.i.d. normal with standard deviation `score_std` (natural-log units, i.e.
of softmax_scale * q.k; randn inputs give 1.0) we follow the distribution of a row's *stale*
max m on a grid, block by block (s = score_std / ln 2 in log2 units, B = the block's max, with
CDF F(y) = Phi(y/s)^cols):

    rescale at block j:   P_row(j) = E[1 - F(m_j + tau)]
    next stale max:       m_{j+1} = m_j if B <= m_j + tau, else B

which is exact for one row under FA4's rule (for tau = 0 it is the running max). A warp of R
rows fires when any row does: 1 - (1 - P_row)^R (rows independent).
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
    lo, hi = -6 * s, 10 * s + tau
    y = np.linspace(lo, hi, 3001)
    step = y[1] - y[0]
    F = lambda x: np.exp(cols * np.log(np.clip(_phi(x / s), 1e-300, 1.0)))
    edges = np.concatenate(([-np.inf], 0.5 * (y[1:] + y[:-1]), [np.inf]))
    p_new = np.diff(F(edges))                       # block max B on the grid (cell masses)
    survive = F(y + tau)                            # P(B <= m + tau) for a stale max m = y
    shift = int(round(tau / step))
    p = p_new.copy()                                # after block 0: m = B_0
    out = [0.0]
    for _ in range(1, n_kv):
        fire_row = float(np.dot(p, 1.0 - survive))
        out.append(1.0 - (1.0 - min(max(fire_row, 0.0), 1.0)) ** rows)
        cdf_below = np.concatenate((np.zeros(shift), np.cumsum(p)))[: len(y)]  # P(m < y - tau)
        if shift == 0:
            cdf_below = np.concatenate(([0.0], np.cumsum(p)[:-1]))            # strictly below
        p = p * survive + p_new * cdf_below
    return tuple(out)


def rescale_probabilities(n_kv: int, tau: float | None, score_std: float = 1.0,
                          cols: int = 128, rows: int = 32) -> np.ndarray:
    """Probability that a warp rescales O at each KV block 0..n_kv-1.

    tau=None means unconditional rescaling (FA3 style): every block after the first.
    """
    if n_kv < 1:
        raise ValueError("n_kv must be >= 1")
    if tau is None:
        return np.array([0.0] + [1.0] * (n_kv - 1))
    longer = 1 << max(6, (int(n_kv) - 1).bit_length())  # block j's probability does not depend on n_kv
    return np.array(_per_block(longer, float(tau), float(score_std), int(cols), int(rows))[:n_kv])


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
