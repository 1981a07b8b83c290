"""The FLOPs of an attention forward: the two GEMMs (S = Q K^T and O = P V) over the (query, key)
pairs the mask leaves visible. Every TFLOP/s in the repository, predicted or measured, counts
with these functions.

Causal attention is bottom-right aligned, as in flash_attn and fa4kernel
(fa4kernel/block_info.py, flash_attn/cute/mask.py): query row i (0-based) sees key j iff
j <= i + seqlen_k - seqlen_q. With seqlen_q <= seqlen_k every row sees at least one key (the
chunked-prefill case: a chunk of new queries against a longer cache); with seqlen_q > seqlen_k
the first seqlen_q - seqlen_k rows see none and count nothing.

Square causal attention counts seqlen (seqlen + 1) / 2 pairs, the exact count; the FA papers'
seqlen^2 / 2 is 1 / seqlen smaller (0.1 % at 1k tokens). Half the rectangle is wrong for
seqlen_q != seqlen_k by up to 2x (seqlen_q << seqlen_k sees almost the whole rectangle).

Plain Python without imports: GPU scripts that lack fa4sim's dependencies (simpy) load this file
by its path (lab/tools/bench_fwd_sm90.py, load_flops) and count the same way.
"""


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """The (query, key) pairs that attend: seqlen_q * seqlen_k, or with the bottom-right causal
    mask the sum over rows i of min(seqlen_k, max(0, i + seqlen_k - seqlen_q + 1))."""
    if not causal:
        return seqlen_q * seqlen_k
    offset = seqlen_k - seqlen_q
    first = max(0, -offset)  # the first row that sees a key
    rows = seqlen_q - first
    if rows <= 0:
        return 0
    # row i sees i + offset + 1 keys, from first + offset + 1 up to the last row's seqlen_k
    return rows * (first + offset + 1 + seqlen_k) // 2


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, hdim: int, hdim_v: int | None = None,
                    causal: bool = False) -> float:
    """FLOPs of one forward: 2 * batch * heads * (hdim + hdim_v) * visible pairs (a multiply and
    an add per pair and dimension, in Q K^T over hdim and in P V over hdim_v)."""
    hdim_v = hdim if hdim_v is None else hdim_v
    return 2.0 * batch * heads * (hdim + hdim_v) * visible_pairs(seqlen_q, seqlen_k, causal)
