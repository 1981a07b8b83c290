"""exp2 emulation: FA4's Cody-Waite range reduction + degree-3 polynomial on the FMA pipe.

MUFU.EX2 gives 16 results per clock per SM on both Hopper and Blackwell, while Blackwell's tensor
core doubled. FA4 moves part of each row's exp2 work to the 128-lane FMA pipe:

    x    = max(x, -127)
    xr   = x + (2^23 + 2^22)            rounds toward -inf: floor(x) lands in the low mantissa bits
    frac = x - (xr - (2^23 + 2^22))     in [0, 1)
    p    = ((c3*frac + c2)*frac + c1)*frac + c0  ~= 2^frac
    out  = (bits(xr) << 23) + bits(p)   adds floor(x) to p's exponent

Cost (packed f32x2, per pair of elements): 6 FMA-pipe instructions (1 add, 2 sub, 3 fma), so 6
FMA lane-ops per element, plus ALU work: one FMNMX and one shift+add (LEA) per element. A MUFU
element costs 1/16 cycle of the SM's MUFU; an emulated one 6/128 cycle of its FMA pipe and
2/64 cycle of its ALU pipe. Source: docs/reference/fa4-schedules.md ("exp2 emulation").
"""
from __future__ import annotations

from fa4kernel.exp2_poly import COEFFS  # c0..c3: the kernels' copy (fa4kernel/exp2_poly.py)
FMA_OPS_PER_ELEMENT = 6.0     # 6 packed instructions per pair = 6 lane-ops per element
ALU_OPS_PER_ELEMENT = 2.0     # FMNMX clamp + LEA (shift+add) per element
# Instructions issued per emulated element. SM100 packs two elements per FMA-pipe instruction
# (3 packed FMA-pipe + 2 ALU); SM90 has no packed FP32 ops: 6 + 2. Checked in the SASS of our
# SM90 kernel (fa4kernel, hd128, sm_90a, cutlass-dsl 4.8.1): exp_emulation=0.25 turns 16 of a
# thread's 64 MUFU.EX2 per KV block into +48 FADD, +48 FFMA, +16 FMNMX, +13 LEA and a few moves:
# +113 instructions net, 8.1 per emulated element (lab/tools/calibrate/README.md).
ISSUE_PER_ELEMENT = {"sm100": 3.0 + 2.0, "sm90": 6.0 + 2.0}
ROUND = 2.0**23 + 2.0**22  # exact in float32: x + ROUND leaves floor(x) in the low mantissa bits


def exp2_emulated(x) -> np.ndarray:
    """exp2 of float32 x, computed the way the emulation does, bit for bit in float32."""
    import numpy as np  # here, not at the top: the simulator's costs need none of it (importing it takes long)
    rnd = np.float32(ROUND)
    x = np.maximum(np.asarray(x, dtype=np.float32), np.float32(-127.0))
    xr = (x + rnd).astype(np.float32)  # float32 round-to-nearest, like FADD.RN
    # FA4 rounds toward -inf (FADD.RM); emulate by stepping down where nearest rounded up.
    xr = np.where((xr - rnd) > x, (xr - np.float32(1.0)).astype(np.float32), xr)
    frac = (x - (xr - rnd)).astype(np.float32)
    c0, c1, c2, c3 = (np.float32(c) for c in COEFFS)
    p = ((c3 * frac + c2) * frac + c1) * frac + c0
    p = p.astype(np.float32)
    ipart = xr.view(np.int32) - rnd.view(np.int32)  # floor(x) as an integer
    return (p.view(np.int32) + (ipart << 23)).astype(np.int32).view(np.float32)


def emulated_columns(cols: int, fraction: float, n_fragments: int = 4) -> np.ndarray:
    """Boolean mask over a row's columns: which get the polynomial instead of MUFU.

    FA4 splits a row into fragments and never emulates the first and the last fragment, so the
    MUFU works while the polynomial's inputs are produced and the final P quarter is not delayed.
    Inside eligible fragments it emulates the last elements of every group. We spread
    round(fraction * cols) emulated columns evenly over the eligible fragments; a fraction above
    what they hold spills into the first and last fragments.
    """
    import numpy as np  # see exp2_emulated
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("fraction must be in [0, 1]")
    n_emu = int(round(fraction * cols))
    frag = cols // n_fragments
    eligible = [f for f in range(1, n_fragments - 1)] or list(range(n_fragments))
    order = eligible + [f for f in range(n_fragments) if f not in eligible]
    mask = np.zeros(cols, dtype=bool)
    left = n_emu
    # fill eligible fragments evenly first, then the others
    for group in (eligible, [f for f in order if f not in eligible]):
        if left <= 0 or not group:
            continue
        per = min(frag, -(-left // len(group)))
        for f in group:
            take = min(per, left)
            if take > 0:
                # the last `take` columns of the fragment, spread: every (frag/take)-th from the end
                idx = f * frag + frag - 1 - np.floor(np.arange(take) * frag / take).astype(int)
                mask[idx] = True
            left -= take
    return mask


def exp2_costs(n_elements: float, fraction: float, hw) -> dict[str, float]:
    """Unit cycles (per SM) for n_elements exp2 with `fraction` emulated: {unit: cycles}."""
    emu = n_elements * fraction
    mufu = n_elements - emu
    return {
        "mufu": mufu / hw.mufu_ex2_per_clk,
        "fma": emu * FMA_OPS_PER_ELEMENT / hw.fma_lanes_per_clk,
        "alu": emu * ALU_OPS_PER_ELEMENT / hw.alu_lanes_per_clk,
    }
