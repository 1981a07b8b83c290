"""Where the compiled SM90 KV loop waits for the previous block's PV GEMM: SASS tables.

With intra-warpgroup overlap the source lets block j's softmax run while PV(j-1) is on the tensor
core, and the wait for PV(j-1) (the second WARPGROUP.DEPBAR of the loop) could sit anywhere
before O is touched. ptxas decides where, and it decides differently per build: at hd128 the
default issues the whole row max, 44 % of the FMA-pipe softmax and 15 % of the exp2s before the
wait (causal and not); with exp2 emulation it waits a little earlier; at hd64 it waits after 60 %
(non-causal) or 97 % (causal) of the row max and before any exp2. What runs before the wait
overlaps the previous PV; the rest waits for it. (Since the ninth session the loop no longer
peels its last block; with the peeled copy ptxas had put the hd128 waits earlier, e.g. the
causal default after 85 % of the row max and none of the exp2s, and one CTA's emulation-0.25
loop ran 11 % slower: fa4kernel/README.md.) So the fa3 schedule splits the softmax at the wait by the
compiled code's own counts (knobs max_before_pv, fma_before_pv, mufu_before_pv).

Each entry: the knobs a build differs in, and per pipe the fraction of the block's softmax
instructions between the S wait and the PV wait (fa4kernel.sass.around_pv_wait):
  max   FMNMX                       (the row max; its quad shuffles go with it)
  fma   FFMA + FADD                 (scale, row sum, and the emulated exp2's polynomial)
  mufu  MUFU.EX2                    (the exp2s, with the acc_scale exp2s)
Written by `python3 benchmarks/pv_wait_sass.py` (CPU: compiles every build for sm_90a; CUDA 13.0
ptxas via nvidia-cutlass-dsl 4.8.1; flash-attn-4 4.0.0b36 compiled the same way with fake
tensors: its JIT given --keep-cubin through a wrapped cute.compile, and FLASH_ATTENTION_NUM_SMS);
tests/test_sass_tables_compile.py recompiles some of fa4kernel's entries and checks them.
A configuration not in the table takes its head dim's default build, then the order the model
had before these tables: the whole row max before the wait, the exp2s and the row sum after.
"""
from __future__ import annotations

# knobs that change the compiled KV loop; a table entry lists those it was compiled with
KEYS = ("hdim", "causal", "tile_n", "exp_emulation", "rescale_threshold", "p_in_registers", "kv_stages",
        "pingpong", "rescale_before_pv")
FALLBACK = {"max": 1.0, "fma": 0.0, "mufu": 0.0}

# kernel -> list of (build, fractions); the first entry whose build matches wins, so variants
# come before their head dim's default (which matches on hdim and causal alone)
TABLES: dict[str, list[tuple[dict, dict]]] = {
  "fa4kernel": [
    ({'hdim': 128, 'causal': False, 'exp_emulation': 0.125}, {'max': 0.934, 'fma': 0.258, 'mufu': 0.121}),
    ({'hdim': 128, 'causal': False, 'exp_emulation': 0.25}, {'max': 0.869, 'fma': 0.222, 'mufu': 0.14}),
    ({'hdim': 128, 'causal': False, 'rescale_threshold': 8.0, 'rescale_before_pv': True}, {'max': 1.0, 'fma': 0.514, 'mufu': 0.242}),
    ({'hdim': 128, 'causal': False, 'exp_emulation': 0.125, 'rescale_threshold': 8.0, 'rescale_before_pv': True}, {'max': 0.934, 'fma': 0.255, 'mufu': 0.121}),
    ({'hdim': 128, 'causal': False, 'pingpong': False}, {'max': 1.0, 'fma': 0.428, 'mufu': 0.152}),
    ({'hdim': 128, 'causal': False, 'p_in_registers': False}, {'max': 1.0, 'fma': 0.362, 'mufu': 0.152}),
    ({'hdim': 128, 'causal': False, 'kv_stages': 3}, {'max': 1.0, 'fma': 0.261, 'mufu': 0.106}),
    ({'hdim': 128, 'causal': False, 'rescale_threshold': 8.0, 'rescale_before_pv': False}, {'max': 1.0, 'fma': 0.443, 'mufu': 0.076}),
    ({'hdim': 128, 'causal': False, 'exp_emulation': 0.125, 'rescale_threshold': 8.0, 'rescale_before_pv': False}, {'max': 0.921, 'fma': 0.324, 'mufu': 0.017}),
    ({'hdim': 128, 'causal': True, 'exp_emulation': 0.125}, {'max': 0.961, 'fma': 0.263, 'mufu': 0.103}),
    ({'hdim': 128, 'causal': True, 'exp_emulation': 0.25}, {'max': 0.857, 'fma': 0.209, 'mufu': 0.12}),
    ({'hdim': 128, 'causal': True, 'rescale_threshold': 8.0, 'rescale_before_pv': True}, {'max': 1.0, 'fma': 0.514, 'mufu': 0.167}),
    ({'hdim': 128, 'causal': True, 'exp_emulation': 0.125, 'rescale_threshold': 8.0, 'rescale_before_pv': True}, {'max': 0.934, 'fma': 0.25, 'mufu': 0.121}),
    ({'hdim': 128, 'causal': True, 'pingpong': False}, {'max': 1.0, 'fma': 0.442, 'mufu': 0.152}),
    ({'hdim': 128, 'causal': True, 'p_in_registers': False}, {'max': 1.0, 'fma': 0.362, 'mufu': 0.197}),
    ({'hdim': 128, 'causal': True, 'kv_stages': 3}, {'max': 1.0, 'fma': 0.261, 'mufu': 0.091}),
    ({'hdim': 128, 'causal': True, 'rescale_threshold': 8.0, 'rescale_before_pv': False}, {'max': 1.0, 'fma': 0.464, 'mufu': 0.091}),
    ({'hdim': 128, 'causal': True, 'exp_emulation': 0.125, 'rescale_threshold': 8.0, 'rescale_before_pv': False}, {'max': 0.961, 'fma': 0.351, 'mufu': 0.017}),
    ({'hdim': 64, 'causal': False, 'tile_n': 128, 'rescale_before_pv': False}, {'max': 0.603, 'fma': 0.0, 'mufu': 0.0}),
    ({'hdim': 64, 'causal': True, 'tile_n': 128, 'rescale_before_pv': False}, {'max': 0.971, 'fma': 0.0, 'mufu': 0.0}),
    ({'hdim': 128, 'causal': False, 'tile_n': 128, 'rescale_before_pv': False}, {'max': 1.0, 'fma': 0.435, 'mufu': 0.152}),
    ({'hdim': 128, 'causal': True, 'tile_n': 128, 'rescale_before_pv': False}, {'max': 1.0, 'fma': 0.442, 'mufu': 0.152}),
    ({'hdim': 256, 'causal': False, 'tile_n': 64, 'rescale_before_pv': True}, {'max': 1.0, 'fma': 0.73, 'mufu': 0.559}),
    ({'hdim': 256, 'causal': True, 'tile_n': 64, 'rescale_before_pv': True}, {'max': 1.0, 'fma': 0.689, 'mufu': 0.559}),
  ],
  # its SM90 defaults (hd 64 and 128 with tile_n 128, hd 256 with tile_n 80), compiled through its
  # own JIT with fake tensors: the causal builds match the non-causal ones at hd 64 and 256
  "flash-attn-4": [
    ({'hdim': 128, 'causal': True}, {'max': 1.0, 'fma': 0.523, 'mufu': 0.091}),
    ({'hdim': 64}, {'max': 1.0, 'fma': 0.562, 'mufu': 0.167}),
    ({'hdim': 128}, {'max': 1.0, 'fma': 0.554, 'mufu': 0.152}),
    ({'hdim': 256}, {'max': 1.0, 'fma': 0.585, 'mufu': 0.333}),
  ],
}


def fractions(kernel: str, hdim: int, causal: bool, k: dict) -> dict:
    """{'max', 'fma', 'mufu'}: the fractions issued before the PV wait for this build."""
    cfg = {"hdim": hdim, "causal": causal, **k}
    rows = TABLES.get(kernel, [])
    for build, frac in rows:
        if all(_same(cfg.get(key), v) for key, v in build.items()):
            return dict(frac)
    return dict(FALLBACK)


def _same(a, b) -> bool:
    if isinstance(b, float) or isinstance(a, float):
        return a is not None and b is not None and abs(float(a) - float(b)) < 1e-9
    return a == b
