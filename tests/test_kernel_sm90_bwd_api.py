"""CPU-only: the backward's knobs reach it through fa4kernel.attention(bwd_knobs=...) and
compile_bwd_sass(**knobs); bad names and values are one-line ValueErrors before anything
compiles or runs (the device check comes last)."""

import pytest

torch = pytest.importorskip("torch")

import fa4kernel  # noqa: E402
from fa4kernel.sm90.bwd_config import BWD_KNOB_NAMES, make_bwd_config  # noqa: E402


def qkv_grad(d=64, h=2):
    return [torch.randn(2, 64, h, d, dtype=torch.bfloat16).requires_grad_() for _ in range(3)]


def raises(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match) as ei:
        fn(*args, **kwargs)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_attention_takes_backward_knobs():
    """Valid knobs pass every backward check; the device's check comes next (CPU tensors)."""
    for knobs in ({"tile_m": 128}, {"grid_order": "tail_lpt"}, {"dq_reduce": "red", "stats": "thread",
                                                                "mma_order": "dv_dk_dq", "preprocess": "torch"}):
        raises("CUDA device", fa4kernel.attention, *qkv_grad(64), bwd_knobs=knobs)
    raises("CUDA device", fa4kernel.attention, *qkv_grad(64), dq_reduce="red", bwd_knobs={"stats": "thread"})


def test_attention_rejects_an_unknown_backward_knob():
    msg = raises("bwd_knobs: 'tile_n' unknown; allowed: ", fa4kernel.attention, *qkv_grad(), bwd_knobs={"tile_n": 64})
    for name in BWD_KNOB_NAMES:
        if name != "deterministic":
            assert name in msg
    # checked without grad too: a typo never passes silently
    with torch.no_grad():
        raises("bwd_knobs: 'tilem' unknown", fa4kernel.attention, *qkv_grad(), bwd_knobs={"tilem": 128})
    # one register budget: regs is no knob
    raises("bwd_knobs: 'regs' unknown; allowed: ", fa4kernel.attention, *qkv_grad(64), bwd_knobs={"regs": "split"})
    raises("bwd_knobs=list; allowed: None or a dict", fa4kernel.attention, *qkv_grad(), bwd_knobs=["tile_m"])


@pytest.mark.parametrize("d,knobs,says", [
    (128, {"tile_m": 128}, "tile_m=128 not supported at head_dim 128; allowed: 64"),
    (128, {"mma_order": "dv_early"}, "mma_order='dv_early' not supported; allowed: dv_dq_dk, dv_dk_dq"),
    (128, {"grid_order": "blocks_outer"}, "grid_order='blocks_outer' not supported; allowed: heads_outer, tail_lpt"),
    (128, {"stats": "smem"}, "stats='smem' not supported; allowed: tma, thread"),
    (64, {"tile_m": 128, "dq_reduce": "red"}, "tile_m=128 with dq_reduce='red' not supported"),
])
def test_attention_rejects_bad_backward_knob_values_at_forward_time(d, knobs, says):
    msg = raises("not supported|needs|spills", fa4kernel.attention, *qkv_grad(d), bwd_knobs=knobs)
    assert says in msg


def test_attention_dq_reduce_twice():
    raises("dq_reduce='red' and bwd_knobs dq_reduce='bulk'", fa4kernel.attention, *qkv_grad(),
           dq_reduce="red", bwd_knobs={"dq_reduce": "bulk"})


def test_forward_knobs_stay_the_forwards():
    """tile_m as a keyword is the forward's knob (its values: 128, 192), the backward's goes in
    bwd_knobs."""
    raises("tile_m", fa4kernel.attention, *qkv_grad(64), tile_m=64)


def test_attention_backward_and_trainable_take_the_knobs():
    from fa4kernel.interface import attention_trainable

    q, k, v = qkv_grad(64)
    raises("CUDA device", attention_trainable, q, k, v, tile_m=128)
    raises("backward knob 'foo' unknown", attention_trainable, q, k, v, foo=1)
    out = torch.randn_like(q)
    lse = torch.randn(q.shape[0], q.shape[2], q.shape[1])
    raises("CUDA device", fa4kernel.attention_backward, out, q, k, v, out, lse, tile_m=128, grid_order="tail_lpt")
    raises("backward knob 'regs' unknown", fa4kernel.attention_backward, out, q, k, v, out, lse,
           tile_m=128, regs="split")


def test_compile_bwd_sass_checks_knobs_before_compiling():
    raises("backward knob 'order' unknown", fa4kernel.compile_bwd_sass, order="dv_dq_dk")
    raises("tile_m=128 not supported at head_dim 96", fa4kernel.compile_bwd_sass, head_dim=96, tile_m=128)


def test_make_bwd_config_defaults():
    cfg = make_bwd_config("bfloat16", 64, True)
    assert (cfg.dq_reduce, cfg.stats, cfg.mma_order, cfg.preprocess, cfg.postprocess, cfg.dq_zero,
            cfg.tile_m) == ("bulk", "tma", "dv_dq_dk", "kernel", "kernel", "preprocess", 128)
