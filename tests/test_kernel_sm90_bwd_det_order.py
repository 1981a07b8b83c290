"""The deterministic backward's dQ order can never hang (plain Python, no GPU, no compile).

Two models of what sm90/bwd.py does:

1. The semaphores of a whole launch: every CTA of bwd_config.launch_order walks its dQ adds
   (bwd_config.dq_walk: the pair's query blocks, the group's q heads, the turn of dq_turn); each
   add waits until its semaphore has reached the turn, then adds 1. CTAs start in linear block
   order as slots free up (a pair's two CTAs together), at most `resident` at once, and a pair's
   CTAs stay within the Q / dO stages of each other (each needs the other's half of dQ for the
   block). Every launch completes however few CTAs run at once, each semaphore ends at the count
   its last turn expects, the adds of every query block come in the same order whatever the
   schedule, no CTA waits for one launched after it, and the preprocess's zeroing covers every
   semaphore the launch uses.

2. One CTA's hand-off of dQ to producer warp 1 (dq_smem="qdo"): the dQ warpgroups arrive on
   DQ_FULL (bar.arrive, 4 warps) once the block's dQ is in its Q / dO stage, warp 1 syncs there
   (bar.sync: the phase completes on the 5th warp, whichever block it comes from), adds, and frees
   the stage for the load of the block `stages` later. Every interleaving is explored, the turn
   coming at any moment. Waiting for the turn before the barrier (the first semaphore build) lets
   a warpgroup arrive for the next block while warp 1 spins: a phase of the wrong warps, then a
   hang; the kernel's order (the barriers, then the turn: test_kernel_sm90_bwd_compile.py checks
   it in the SASS) completes every phase with warp 1 and the block's own warps.
"""
from __future__ import annotations

from collections import defaultdict

import pytest

from fa4kernel.sm90.bwd_config import cluster_ctas, dq_slice, dq_turn, dq_walk, launch_order, make_bwd_config

PREPROCESS_ROWS = 32  # sm90/bwd_preprocess.py BwdPreprocess.ROWS

BUILDS = [  # (head dim, knobs): every dQ path of the deterministic build
    (64, {}), (64, {"tile_m": 64}), (96, {}), (128, {}), (128, {"dq_reduce": "red"}), (192, {}),
    (256, {}), (256, {"dq_sum": "cta"}), (256, {"grid_order": "tail_lpt"}), (128, {"grid_order": "tail_lpt"}),
    # copies of the accumulator: each run of key blocks (pairs) on its own semaphores
    (64, {"dq_slices": 2}), (128, {"dq_slices": 8}), (128, {"dq_slices": 4, "dq_reduce": "red"}),
    (256, {"dq_slices": 2}), (256, {"dq_slices": 8, "dq_sum": "cta"}),
]
LENGTHS = [  # (seqlen_q, seqlen_k): odd key-block counts (pairs rounded up), partial last query
    # blocks, seqlen_q < tile_m, seqlen_k < tile_n, seqlen_k = 1, more queries than keys and the reverse
    (1000, 777), (777, 1000), (1, 1), (1, 777), (777, 1), (50, 63), (63, 50), (200, 64), (64, 200),
    (1000, 150), (150, 1000), (333, 333), (129, 1000), (1000, 129),
]
HEADS = [(2, 4, 2), (1, 3, 1), (2, 2, 2)]  # (batch, q heads, k/v heads): GQA 2, MQA, MHA


def simulate(cfg, b, sq, sk, h, hkv, resident, reverse=False):
    """Runs the launch's CTAs through the semaphores; returns ({semaphore: CTA indices in add
    order}, {semaphore: final count}, [walks]). Fails on a hang (no live CTA can add)."""
    order = launch_order(cfg, sk, hkv, b)
    c = cluster_ctas(cfg)
    assert len(order) % c == 0
    group = h // hkv
    # the semaphore (batch row of its copy: copy * b + batch, q head, query block) of each add
    walks = [[((dq_slice(cfg, n, sk)[0] * b + bi, qh, m), turn) for m, qh, turn in dq_walk(cfg, n, kvh, group, sq, sk)]
             for n, kvh, bi in order]
    lag = cfg.q_stages  # a pair's CTAs: the add of block i needs the partner's of block i - stages
    sem = defaultdict(int)
    log = defaultdict(list)
    pos = [0] * len(order)
    live, nxt, done = [], 0, 0
    while done < len(order):
        while nxt < len(order) and len(live) + c <= max(resident, c):  # a cluster starts whole
            live.extend(range(nxt, nxt + c))
            nxt += c
        moved = False
        for x in (list(reversed(live)) if reverse else list(live)):
            partner = x ^ 1 if c == 2 else None
            while pos[x] < len(walks[x]):
                key, turn = walks[x][pos[x]]
                if sem[key] < turn:
                    break
                if partner is not None and pos[partner] < min(pos[x] - lag, len(walks[partner])):
                    break
                sem[key] += 1
                log[key].append(x)
                pos[x] += 1
                moved = True
            if pos[x] == len(walks[x]):
                live.remove(x)
                done += 1
                moved = True
        if not moved:
            stuck = {x: walks[x][pos[x]] + (sem[walks[x][pos[x]][0]],) for x in live}
            pytest.fail(f"hang: {cfg} b={b} sq={sq} sk={sk} h={h} hkv={hkv} resident={resident}: "
                        f"live CTA -> (semaphore, turn, count) {stuck}")
    return log, sem, walks


def units_of(cfg, order, log):
    c = cluster_ctas(cfg)
    return {key: [order[x][0] // c for x in xs] for key, xs in log.items()}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd,knobs", BUILDS, ids=lambda x: ",".join(f"{a}={b}" for a, b in x.items())
                         if isinstance(x, dict) else str(x))
def test_bwd_deterministic_launch_never_hangs(hd, knobs, causal):
    for b, h, hkv in HEADS:
        for sq, sk in LENGTHS:
            cfg = make_bwd_config("bfloat16", hd, causal, True, **knobs)
            c = cluster_ctas(cfg)
            order = launch_order(cfg, sk, hkv, b)
            sqp = -(-sq // cfg.tile_m) * cfg.tile_m
            # one cluster at a time (each CTA may wait only for finished ones), a few, all at once
            runs = [simulate(cfg, b, sq, sk, h, hkv, r, rev)
                    for r, rev in ((c, False), (3 * c, True), (len(order), True))]
            log, sem, walks = runs[0]
            where = (hd, knobs, causal, b, h, hkv, sq, sk)
            # every add of every CTA was made, the keyless CTA of an odd pair's included
            assert sum(sem.values()) == sum(len(w) for w in walks), where
            if c == 2 and -(-sk // cfg.tile_n) % 2:
                last = [x for x, (n, _, _) in enumerate(order) if n * cfg.tile_n >= sk]
                assert last and all(walks[x] for x in last), where  # it walks and takes its turn
            # each semaphore ends at what its last turn expects: c adds per turn
            for key, xs in log.items():
                turns = sorted(t for x in xs for k, t in walks[x] if k == key)
                assert turns == [i - i % c for i in range(len(turns))], (where, key, turns)
                assert sem[key] == turns[-1] + c, (where, key)
            # the order of the adds is the launch's, not the schedule's (the two CTAs of a turn
            # add disjoint halves of head_dim: their order is free)
            base = units_of(cfg, order, log)
            for other, _, _ in runs[1:]:
                assert units_of(cfg, order, other) == base, where
            # a CTA waits only for CTAs launched before it (clusters: before its own)
            for x, walk in enumerate(walks):
                for key, turn in walk:
                    before = log[key][:turn]
                    assert all(y // c < x // c for y in before), (where, x, key, turn)
            # the semaphores the launch uses: the (dq_slices x b, h, s_q_pad / tile_m) tensor, every
            # one of them zeroed (the first copy by the preprocess: the CTA of 32 rows that starts a
            # query block; the others by the host)
            for bi, qh, m in sem:
                assert 0 <= bi < cfg.dq_slices * b and 0 <= qh < h and 0 <= m < sqp // cfg.tile_m, (where, (bi, qh, m))
            zeroed = {bx * PREPROCESS_ROWS // cfg.tile_m for bx in range(-(-sqp // PREPROCESS_ROWS))
                      if bx * PREPROCESS_ROWS % cfg.tile_m == 0}
            assert zeroed == set(range(sqp // cfg.tile_m)), where


def test_bwd_deterministic_walk_is_the_kernels():
    """dq_walk against the kernel's rules stated directly: causal pairs start at the first CTA's
    query block (_cta_work's n_first), the keyless CTA of an odd pair walks its partner's blocks,
    and a causal key block sees query block m iff dq_turn counts it among those above."""
    cfg = make_bwd_config("bfloat16", 256, True, True)
    sq, sk = 1000, 777
    assert dq_walk(cfg, 13, 0, 2, sq, sk) == dq_walk(cfg, 12, 0, 2, sq, sk)
    assert [m for m, qh, _ in dq_walk(cfg, 13, 1, 2, sq, sk)][:1] == [(12 * 64 - (sk - sq)) // 64]
    assert {qh for _, qh, _ in dq_walk(cfg, 3, 1, 2, sq, sk)} == {2, 3}
    for m in range(-(-sq // 64)):
        seen = [u for u in range(7) if any(mm == m for mm, _, _ in dq_walk(cfg, 2 * u, 0, 1, sq, sk))]
        assert [dq_turn(cfg, 2 * u, m, sq, sk) for u in seen] == [2 * (len(seen) - 1 - u) for u in seen]


# ---- 2. one CTA: the dQ warpgroups and producer warp 1 on the DQ_FULL named barriers

WARPS = 4  # warps of a dQ warpgroup (bar.arrive), besides warp 1 (bar.sync): 128 + 32 threads


def explore(steps, wgs, per_stage, blocks=5, stages=2):
    """Every interleaving of one CTA's dQ hand-off. steps: warp 1's program per block, of "sync w"
    (bar.sync on warpgroup w's barrier of the block), "turn" (spin until the block's turn, which
    comes at any time) and "release" (the bulk adds, their wait, the semaphore's release, the
    stage freed). per_stage: one barrier per (warpgroup, stage of the block) (sm90/bwd.py
    _dq_full_id, deterministic), else one per warpgroup. A warpgroup arrives for block i once its
    stage holds block i (freed for it by warp 1's release of i - stages), one warp at a time, at
    any moment after. Returns the first bad outcome found (a phase completed by other warps than
    warp 1 and the 4 of its block, or a state where nothing can move before the end), or None."""
    nbar = wgs * (stages if per_stage else 1)

    def bar_of(w, i):
        return w * stages + i % stages if per_stage else w

    start = (0, 0, 0, tuple((0, 0) for _ in range(wgs)), tuple(() for _ in range(nbar)))
    seen, stack = set(), [start]
    while stack:
        st = stack.pop()
        if st in seen:
            continue
        seen.add(st)
        blk, pc, freed, cons, bars = st
        if blk == blocks:
            continue
        moves = []
        step = steps[pc]
        if step == "turn":
            moves.append((blk, pc + 1, freed, cons, bars))
        elif step.startswith("sync"):
            b = bar_of(int(step.split()[1]), blk)
            if ("w1", blk) not in bars[b]:
                moves.append(_arrive(st, b, ("w1", blk), cons))
            # else warp 1 waits in the phase: the warpgroups' arrivals complete it
        else:  # release
            moves.append((blk + 1, 0, freed + 1, cons, bars) if pc + 1 == len(steps) else
                         (blk, pc + 1, freed + 1, cons, bars))
        for w, (i, k) in enumerate(cons):
            if i < blocks and i < freed + stages:
                ncons = cons[:w] + (((i + 1, 0) if k + 1 == WARPS else (i, k + 1)),) + cons[w + 1:]
                moves.append(_arrive(st, bar_of(w, i), (f"wg{w}", i), ncons))
        for mv in moves:
            if isinstance(mv, str):
                return mv
        if not moves:
            return f"hang at {st}"
        stack.extend(moves)
    return None


def _arrive(st, b, who, cons):
    """The state after `who` arrives on barrier b: 5 warps complete its phase (warp 1 passes its
    sync), which must be warp 1 and the 4 warps of the block it waits for."""
    blk, pc, freed, _, bars = st
    arr = bars[b] + (who,)
    if len(arr) < WARPS + 1:
        return (blk, pc, freed, cons, bars[:b] + (arr,) + bars[b + 1:])
    if ("w1", blk) not in arr or any(i != blk for _, i in arr):
        return f"a phase completed by {arr} (warp 1 at block {blk})"
    return (blk, pc + 1, freed, cons, bars[:b] + ((),) + bars[b + 1:])  # warp 1 passes its sync


# warp 1's program per block (sm90/bwd.py dq_store, dq_smem="qdo")
DET = {1: ["sync 0", "turn", "release"], 2: ["sync 0", "sync 1", "turn", "release"]}  # the kernel's
TURN_FIRST = {1: ["turn", "sync 0", "release"], 2: ["turn", "sync 0", "sync 1", "release"]}  # the hang
FAST = {1: ["sync 0", "release"], 2: ["sync 0", "sync 1", "release"]}  # non-deterministic


@pytest.mark.parametrize("wgs", [1, 2])  # 1: dq_sum="pair" (the owner warpgroup); 2: dq_sum="cta"
def test_bwd_deterministic_dq_handoff_never_slips_a_phase(wgs):
    """The kernel's deterministic hand-off (a barrier per stage, the turn after it) is right in
    every interleaving, and a barrier per stage alone would be. The first semaphore build (one
    barrier per warpgroup, the turn before it: warp 1 spins for a whole block while the
    warpgroup arrives for the next) slips a phase: the GPU hang. With one barrier per
    warpgroup, the fast build (and a deterministic one that waits for the turn after the
    barrier) is right only by timing: warp 1 reaches the barrier of block i a few instructions
    after freeing the stage of block i + 1, long before the warpgroup has loaded, computed and
    staged that block."""
    assert explore(DET[wgs], wgs, per_stage=True) is None
    assert explore(TURN_FIRST[wgs], wgs, per_stage=True) is None
    bad = explore(TURN_FIRST[wgs], wgs, per_stage=False)
    assert bad is not None and "phase completed" in bad, bad
    assert "phase completed" in (explore(FAST[wgs], wgs, per_stage=False) or "")
