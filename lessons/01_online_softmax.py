# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 01: attention, tiling and the online softmax (about 25 minutes)
#
# Attention is `O = softmax(Q K^T * scale) V`. Written naively it builds the whole
# `seqlen x seqlen` score matrix; FlashAttention never does. It walks over **blocks of keys**,
# keeps for each query row a running maximum `m` and a running sum `l`, and rescales the partial
# output whenever the maximum grows: the **online softmax**. FA4 adds a twist, **conditional
# rescaling**: keep the stale maximum unless the new one is larger by more than `tau`.
#
# In this lesson you build all three in numpy, check they agree, and measure how often the
# conditional rescale fires on realistic scores, against `fa4sim.rescale`'s model.

# %%
import matplotlib.pyplot as plt
import numpy as np

import lessonkit as kit
from fa4sim.rescale import online_softmax_blocks, rescale_probabilities, rescale_rate

LIVE = kit.live()  # this lesson is numpy only; LIVE is unused
rng = np.random.default_rng(0)
LOG2E = np.log2(np.e)

# %% [markdown]
# ## 1. Attention, the direct way

# %%
def attention_reference(q, k, v, scale):
    s = (q @ k.T) * scale                       # (rows, keys) scores
    p = np.exp(s - s.max(axis=1, keepdims=True))  # subtract the row max: no overflow
    return (p / p.sum(axis=1, keepdims=True)) @ v


rows, keys, d = 256, 1024, 64
q, k, v = (rng.standard_normal((n, d)) for n in (rows, keys, keys))
scale = 1 / np.sqrt(d)
O_ref = attention_reference(q, k, v, scale)
print(O_ref.shape)

# %% [markdown]
# ## 2. Tiled attention with the online softmax
#
# Process keys in blocks of `block`. For each block: new max `m_new = max(m, rowmax(S_j))`,
# rescale what we have by `alpha = exp2(m - m_new)`, add the new block's contribution.
# Kernels work in base 2 (`exp2` is the hardware instruction), so we scale scores by `log2(e)`.

# %%
def attention_online(q, k, v, scale, block=128, tau=None):
    """Online softmax over key blocks; tau=None: always rescale (FA2/FA3), else FA4's rule."""
    n = q.shape[0]
    m = np.full(n, -np.inf)            # running max (log2 units)
    l = np.zeros(n)                    # running sum of exp2
    o = np.zeros((n, v.shape[1]))      # unnormalised output
    rescaled = []                      # per block: which rows rescaled
    for j in range(0, k.shape[0], block):
        s = (q @ k[j:j + block].T) * scale * LOG2E
        m_blk = s.max(axis=1)
        first = np.isinf(m)
        if tau is None:
            grow = m_blk > m
        else:
            grow = m_blk > m + tau     # FA4: keep the stale max unless it grew by more than tau
        m_use = np.where(first | grow, np.maximum(m, m_blk), m)
        alpha = np.where(first, 0.0, np.exp2(m - m_use))
        p = np.exp2(s - m_use[:, None])  # with the stale max, p can exceed 1 (up to 2^tau)
        o = o * alpha[:, None] + p @ v[j:j + block]
        l = l * alpha + p.sum(axis=1)
        rescaled.append(~first & (m_use != m))
        m = m_use
    return o / l[:, None], np.array(rescaled)


O_online, fired_always = attention_online(q, k, v, scale, tau=None)
O_cond, fired_cond = attention_online(q, k, v, scale, tau=8.0)
print("max |online - reference|      :", np.abs(O_online - O_ref).max())
print("max |conditional - reference| :", np.abs(O_cond - O_ref).max())
print("(row, block) pairs where the max grew (FA3 rescales on every block anyway):",
      fired_always.sum(), "of", fired_always.size)
print("(row, block) pairs that rescaled with tau = 8:", fired_cond.sum())

# %% [markdown]
# **Why is the conditional version still exact?** The output is `O / l`, and *both* `O` and `l`
# were accumulated with the same max. Whatever max you use, it cancels in the division, as long
# as no number overflows. With `tau = 8` the stale max is at most 8 below the true one, so every
# `p = exp2(s - m)` is at most `2^8 = 256`: comfortably inside bf16/fp16 range. The kernel pays
# for it only in the last division, which it does anyway.
#
# `fa4sim.rescale.online_softmax_blocks` is the same reference the simulator uses (with V = the
# identity, so its output is the probability matrix itself):

# %%
s_log2 = (q @ k.T) * scale * LOG2E
P_direct = np.exp2(s_log2 - s_log2.max(axis=1, keepdims=True))
P_direct /= P_direct.sum(axis=1, keepdims=True)
for tau in (None, 0.0, 8.0):
    P, n_rescales = online_softmax_blocks(s_log2, block=128, tau=tau)
    print(f"tau={tau!s:5s} max |P - direct| = {np.abs(P - P_direct).max():.1e}, "
          f"mean rescales per row = {n_rescales.mean():.2f} of {keys // 128 - 1} possible")

# %% [markdown]
# ## 3. How often does a warp rescale?
#
# In FA4 the correction warpgroup rescales `O` in TMEM, and it decides **per warp** (32 rows):
# if *any* of its rows rescaled, the warp does the whole `tcgen05.ld -> multiply -> tcgen05.st`
# round trip. So the rate that costs time is: the fraction of (warp, block) pairs where any row
# fired. Let us measure it on realistic scores: `q, k ~ randn`, `scale = 1/sqrt(d)`, which gives
# scores with a standard deviation of about 1 (in natural-log units), over a 16k-key row.

# %%
def warp_rate(fired, warp=32):
    """fired: (blocks, rows) bool -> fraction of (warp, block) pairs where any row fired."""
    b, n = fired.shape
    return fired.reshape(b, n // warp, warp).any(axis=2).mean()


rows, keys, d = 512, 16384, 128
q2 = rng.standard_normal((rows, d))
k2 = rng.standard_normal((keys, d))
v2 = rng.standard_normal((keys, d))
taus = [0.0, 1.0, 2.0, 3.0, 4.0, 8.0]
measured = {}
for tau in taus:
    _, fired = attention_online(q2, k2, v2, 1 / np.sqrt(d), tau=tau)
    measured[tau] = warp_rate(fired)

# the same count against the *true running max* instead of the stale max the kernel keeps
s2 = (q2 @ k2.T) / np.sqrt(d) * LOG2E
blk_max = s2.reshape(rows, -1, 128).max(axis=2)            # (rows, blocks)
run_max = np.maximum.accumulate(blk_max, axis=1)
vs_running = {tau: warp_rate(np.vstack([np.zeros((1, rows), bool), (blk_max[:, 1:] > run_max[:, :-1] + tau).T]))
              for tau in taus}
model = {tau: rescale_rate(keys // 128, tau, score_std=1.0) for tau in taus}
print(f"score std (nats): {(s2 / LOG2E).std():.3f};  {rows // 32} warps x {keys // 128} blocks")
print(" tau   kernel rule (stale max)   vs running max   model (fa4sim.rescale)")
for tau in taus:
    print(f"{tau:4.1f}   {measured[tau]:23.4f}   {vs_running[tau]:14.4f}   {model[tau]:.2e}")

# %% [markdown]
# The model treats scores as i.i.d. normal with standard deviation `score_std` and follows, block
# by block, the distribution of the **stale** max the kernel keeps (which can sit up to `tau`
# below the true running max). It should match the first column, the kernel's own rule, within
# the sampling noise of this small experiment; the middle column shows how much a model of the
# *running* max would under-count between `tau = 1` and `tau = 4`. At `tau = 0` the two rules
# are the same, and at `tau = 8` both are essentially zero: **after the first block, FA4 almost
# never rescales** on such data. Unconditional rescaling (FA3) pays on every block after the first.
#
# The model's probability falls with the block index: the stale max settles quickly.

# %%
n_kv = keys // 128
fig, ax = plt.subplots(1, 2, figsize=(11, 3.5))
for tau in (0.0, 1.0, 2.0, 4.0):
    ax[0].plot(rescale_probabilities(n_kv, tau), label=f"tau={tau:g}")
ax[0].set(xlabel="KV block", ylabel="P(warp rescales)", title="per block (score_std = 1)")
ax[0].legend()
grid = np.linspace(0, 10, 41)
for std in (1.0, 2.0, 4.0):
    ax[1].semilogy(grid, [max(rescale_rate(n_kv, t, score_std=std), 1e-12) for t in grid], label=f"score_std={std:g}")
ax[1].set(xlabel="tau (log2 units)", ylabel="mean rescale rate", title=f"mean over {n_kv} blocks", ylim=(1e-12, 1.5))
ax[1].legend()
fig.tight_layout()

# %% [markdown]
# Wider score distributions (`score_std` 2 or 4, e.g. sharper attention heads) rescale more, yet
# at `tau = 8` the rate stays small. Adversarial data can still make every block rescale: if
# each block's scores are larger than the last by more than `tau`, every block fires. Correctness
# never depends on the rate, only the speed does.
#
# ### Exercise 1.1: the worst case
#
# Build a (1 row x 2048 keys) score row, in log2 units, for which the `tau = 8` rule rescales
# at **every** block after the first (block = 128), and check with `online_softmax_blocks`.
# Hint: make the scores of block `j` around `9 * j`.

# %%
worst_scores = None  # <- your (1, 2048) numpy array, in log2 units

# %%
# SOLUTION (try the exercise first).
if worst_scores is None:
    worst_scores = (9.0 * (np.arange(2048) // 128)).reshape(1, -1).astype(float)

# %%
P_worst, n_worst = online_softmax_blocks(np.asarray(worst_scores, dtype=float), block=128, tau=8.0)
kit.check(np.asarray(worst_scores).shape == (1, 2048), "shape must be (1, 2048)")
kit.check(n_worst[0] == 2048 // 128 - 1, f"got {n_worst[0]} rescales; every block after the first must fire (15)")
ref = np.exp2(worst_scores - worst_scores.max())
kit.check(np.allclose(P_worst, ref / ref.sum()), "the result must still equal the direct softmax")

# %% [markdown]
# ### Exercise 1.2: how large can P get?
#
# With `tau = 8`, what is the largest value `p = exp2(s - m_used)` can take? (The kernel stores P
# as bf16; bf16 holds up to about 3.4e38, but more importantly the *sum* `l` and `O` stay finite.)

# %%
p_max = None  # <- your answer, a number

# %%
# SOLUTION (try the exercise first).
if p_max is None:
    p_max = 2.0 ** 8

# %%
kit.check(p_max == 2.0 ** 8, "the stale max is at most tau below the true max: p <= 2^tau")

# %% [markdown]
# ## What to remember
#
# - Online softmax is exact: any max that both `O` and `l` share cancels in `O / l`.
# - FA4 rescales only when the max grew by more than `tau = 8` (factor 256): `P <= 256` fits
#   16-bit types, and on realistic scores the correction warpgroup almost never has to touch `O`.
# - The decision is per warp (32 rows), so the relevant rate is "any of 32 rows fired".
#
# Next: lesson 02 asks what each tile costs each unit of the SM.
