"""Online-softmax max update with FA4's conditional rescaling rule (shared by SM90/SM100).

Classic online softmax (FA2/FA3) rescales O and the row sum by exp2((m_old - m_new) * s)
whenever the row max grows. FA4 keeps the stale max m_old unless the new max exceeds it by
more than tau (log2 units; tau = 8 means a factor 256): then P = exp2(x*s - m_old*s) <= 2^tau
still fits bf16/fp16, the rescale (and on SM100 the TMEM round trip) is skipped, and the final
O / row_sum uses the statistics of the max actually kept, so the result is exact.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32


def rescale_rule_reference(m_old: float, m_new: float, scale_log2: float, tau: float):
    """Python model: returns (max_to_keep, acc_scale)."""
    import math

    if m_new == -math.inf:  # nothing seen yet (m_new includes m_old)
        return m_old, 1.0
    if m_old == -math.inf:
        return m_new, 0.0
    if tau > 0 and (m_new - m_old) * scale_log2 <= tau:
        return m_old, 1.0
    return m_new, math.exp2((m_old - m_new) * scale_log2)


@cute.jit
def update_row_max_log2(row_max_old, row_max_new, scale_log2, rescale_threshold: float):
    """update_row_max without the final exp2: returns (row_max_kept, row_max_safe_scaled,
    log2 of acc_scale), so a caller can issue that exp2 where it schedules best (SM90: after
    the row's P exp2s, fa4kernel/sm90_fwd.py _row_exp)."""
    kept = row_max_new
    if cutlass.const_expr(rescale_threshold > 0.0):
        # NaN (both -inf) and +inf (old -inf) compare False: those rows take the new max.
        if (row_max_new - row_max_old) * scale_log2 <= Float32(rescale_threshold):
            kept = row_max_old
    safe = kept if kept != -Float32.inf else Float32(0.0)
    return kept, safe * scale_log2, (row_max_old - safe) * scale_log2


@cute.jit
def update_row_max(row_max_old, row_max_new, scale_log2, rescale_threshold: float):
    """Device helper (inside @cute.jit code), one row.

    row_max_new already includes row_max_old (max of both). Returns
    (row_max_kept, row_max_safe_scaled, acc_scale):
      row_max_kept        the max stored for the next block,
      row_max_safe_scaled kept max * scale_log2 with -inf replaced by 0 (fully masked rows),
      acc_scale           factor for O and row_sum (1.0 when the stale max is kept).
    rescale_threshold is a compile-time float; 0 = always rescale (FA3 behaviour).
    """
    kept, safe_scaled, log2_scale = update_row_max_log2(row_max_old, row_max_new, scale_log2,
                                                        rescale_threshold)
    return kept, safe_scaled, cute.math.exp2(log2_scale, fastmath=True)
