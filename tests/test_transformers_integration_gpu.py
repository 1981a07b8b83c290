"""GPU test of fa4kernel's transformers integration: a tiny random Llama in bf16 on CUDA with
attn_implementation="fa4lab" (the real SM90 kernels) against the same model with "sdpa".

Run on the device: pytest -m gpu tests/test_transformers_integration_gpu.py
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

from hopper import gpu_marks  # noqa: E402

pytestmark = gpu_marks()

from fa4kernel.integrations import register_transformers  # noqa: E402

NAME = register_transformers()


def tiny_llama(impl):
    """2 layers, hidden 64, 4 heads of 64, 2 k/v heads (GQA), vocab 128; random weights."""
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=1024, attn_implementation=impl)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("seqlen", [37, 333])
def test_tiny_llama_loss_and_grads_match_sdpa(seqlen):
    ours, sdpa = tiny_llama(NAME), tiny_llama("sdpa")
    sdpa.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 128, (2, seqlen), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    loss, grads = loss_and_grads(ours, ids)
    want_loss, want = loss_and_grads(sdpa, ids)
    assert rel(loss, want_loss) < 1e-2
    errs = {n: rel(g, want[n]) for n, g in grads.items()}
    assert max(errs.values()) < 1e-2, errs
