"""fa4kernel's transformers integration (fa4kernel/integrations/transformers.py) on the CPU: a tiny
random Llama (nothing downloaded) with attn_implementation="fa4lab" against the same model with
"sdpa", forward and backward; and the refusals (dropout, padding, sliding window, softcap).

fa4kernel's kernels need a GPU, so here the attention underneath is a stand-in: either the
integration's attention_op replaced by an fp32 torch reference (monkeypatched, fp32 exact), or
the custom op itself with its CPU kernels replaced by torch reference kernels
(tests/cpu_attention_kernels.py; bf16). Skips without transformers (not a required install).
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

import cpu_attention_kernels as cpu  # noqa: E402

from fa4kernel.integrations import register_transformers  # noqa: E402
from fa4kernel.integrations import transformers as fa4_transformers  # noqa: E402

NAME = register_transformers()
cpu.install()


def tiny_llama(impl, dtype=torch.float32, seed=0):
    """2 layers, hidden 64, 4 heads of 64 (head_dim is set: fa4kernel has no head_dim 16), 2 k/v heads."""
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=256, attn_implementation=impl)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def pair(dtype=torch.float32):
    ours, sdpa = tiny_llama(NAME, dtype), tiny_llama("sdpa", dtype)
    sdpa.load_state_dict(ours.state_dict())
    return ours, sdpa


def ids(b=2, s=37, seed=1):
    return torch.randint(0, 128, (b, s), generator=torch.Generator().manual_seed(seed))


def loss_and_grads(model, input_ids, **kw):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=input_ids, labels=input_ids, **kw).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def test_registered_in_both_interfaces():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert NAME == "fa4lab"
    assert ALL_ATTENTION_FUNCTIONS[NAME] is fa4_transformers.attention_forward
    assert NAME in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping  # so padding reaches us, not dropped
    assert tiny_llama(NAME).config._attn_implementation == NAME


def test_fp32_forward_and_backward_match_sdpa_through_the_integration(monkeypatch):
    calls = []

    def reference_attention(q, k, v, causal=False, softmax_scale=None):
        # STAND-IN for fa4kernel's attention (fp32 torch math, autograd by torch)
        calls.append((tuple(q.shape), tuple(k.shape), causal, softmax_scale))
        return cpu.reference(q, k, v, causal, softmax_scale)[0]

    monkeypatch.setattr(fa4_transformers, "attention_op", reference_attention)
    ours, sdpa = pair()
    x = ids()
    loss, grads = loss_and_grads(ours, x)
    want_loss, want = loss_and_grads(sdpa, x)
    # each layer: (b, s, h, d) q and k/v with 2 heads (GQA passed through, not repeated), causal, 1/sqrt(64)
    assert calls == [((2, 37, 4, 64), (2, 37, 2, 64), True, 0.125)] * 2
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss)
    for n, g in grads.items():
        assert rel(g, want[n]) < 1e-5, n


def test_bf16_through_the_custom_op_and_its_autograd_match_sdpa():
    # the op, its fake and its autograd formula run; the CPU kernels underneath are the stand-ins
    ours, sdpa = pair(torch.bfloat16)
    x = ids()
    loss, grads = loss_and_grads(ours, x)
    want_loss, want = loss_and_grads(sdpa, x)
    assert abs(loss - want_loss) < 1e-2 * abs(want_loss)
    for n, g in grads.items():
        assert rel(g, want[n]) < 3e-2, n


def test_an_all_ones_attention_mask_and_a_plain_causal_mask_are_accepted():
    ours, _ = pair(torch.bfloat16)
    x = ids()
    with torch.no_grad():
        base = ours(input_ids=x).logits
        ones = ours(input_ids=x, attention_mask=torch.ones_like(x)).logits
        q = torch.randn(2, 4, 37, 64)
        k, v = torch.randn(2, 2, 37, 64), torch.randn(2, 2, 37, 64)
        causal_mask = torch.ones(37, 37, dtype=torch.bool).tril()[None, None]
        layer = ours.model.layers[0].self_attn
        with_mask = fa4_transformers.attention_forward(layer, q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                       causal_mask)[0]
        without = fa4_transformers.attention_forward(layer, q.bfloat16(), k.bfloat16(), v.bfloat16(), None)[0]
    assert torch.equal(base, ones)
    assert with_mask.shape == (2, 37, 4, 64) and torch.equal(with_mask, without)


def _one_line(excinfo, pattern):
    import re

    assert "\n" not in str(excinfo.value) and re.search(pattern, str(excinfo.value)), str(excinfo.value)


def test_padding_is_refused_in_one_line():
    ours, _ = pair(torch.bfloat16)
    x = ids()
    mask = torch.ones_like(x)
    mask[0, :5] = 0  # left padding of the first row
    with pytest.raises(ValueError) as e:
        ours(input_ids=x, attention_mask=mask)
    _one_line(e, r"padding.*supported: no mask or a plain causal one.*varlen is not implemented")


def test_refusals_of_the_attention_function():
    layer = pair()[0].model.layers[0].self_attn
    q = torch.randn(1, 4, 8, 64, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    cases = [
        (dict(dropout=0.1), r"^dropout=0.1; allowed: 0.0"),
        (dict(sliding_window=4), r"^sliding_window= \(sliding-window attention\) is not supported"),
        (dict(softcap=30.0), r"^softcap= \(logit softcap\) is not supported"),
    ]
    for kw, pattern in cases:
        with pytest.raises(ValueError) as e:
            fa4_transformers.attention_forward(layer, q, kv, kv, None, **kw)
        _one_line(e, pattern)
    for mask in (torch.ones(1, 8, dtype=torch.bool), torch.rand(1, 1, 8, 8) > 0.5):
        with pytest.raises(ValueError) as e:
            fa4_transformers.attention_forward(layer, q, kv, kv, mask)
        _one_line(e, r"varlen is not implemented")


def test_the_model_compiles_fullgraph_and_matches_eager():
    # torch.compile over the whole model: the op is one node each layer, no graph break
    ours, _ = pair(torch.bfloat16)
    x = ids()

    def loss_of(input_ids):
        return ours(input_ids=input_ids, labels=input_ids).loss

    torch._dynamo.reset()
    assert torch._dynamo.explain(loss_of)(x).graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(loss_of, backend="aot_eager", fullgraph=True)
    loss = compiled(x)
    loss.backward()
    grads = {n: p.grad for n, p in ours.named_parameters()}
    want_loss, want = loss_and_grads(ours, x)
    assert torch.equal(loss.detach(), want_loss)
    for n, g in grads.items():
        assert rel(g, want[n]) < 1e-2, n
