"""fa4kernel's attention in Hugging Face transformers' models (Llama, Mistral, Qwen, ...):

    from fa4kernel.integrations import register_transformers
    register_transformers()                                  # name "fa4lab"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa4lab")

attention_forward is the function transformers calls in each attention layer: query (batch,
heads, seqlen_q, head_dim), key and value (batch, heads_kv, seqlen_k, head_dim), as the sdpa
integration takes them; it returns (out (batch, seqlen_q, heads, head_dim), None). It runs the
custom op (fa4kernel/ops.py: traced by torch.compile, captured by CUDA graphs), so the
kernels' rules hold: bf16 / fp16 on sm_90, head_dim 64, 96, 128, 192 or 256.

Supported: causal or not (module.is_causal / is_causal), GQA / MQA (k/v heads passed through,
not repeated), scaling. Refused with a one-line ValueError: dropout > 0, padding and other masks
(a mask with padded positions, packed sequences: variable-length batches are not implemented),
sliding windows, logit softcap, attention sinks, position bias.
"""

from __future__ import annotations

import torch

from ..ops import attention_op

SUPPORTED = "supported: no mask or a plain causal one (no padding, no packed sequences: varlen is not implemented)"
_REFUSED_KWARGS = {  # kwarg transformers passes -> what it is
    "sliding_window": "sliding-window attention", "softcap": "logit softcap", "s_aux": "attention sinks",
    "position_bias": "position bias", "cu_seq_lens_q": "packed sequences (varlen)",
    "cu_seq_lens_k": "packed sequences (varlen)",
}


def register_transformers(name: str = "fa4lab") -> str:
    """Register attention_forward with transformers' AttentionInterface under `name`, and
    transformers' sdpa mask builder as its mask function (it gives None for a plain causal batch,
    so padding is seen here and refused, never silently ignored). Returns `name`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _mask_is_causal(mask, sq: int, sk: int) -> bool:
    """Whether a 4-D mask (batch or 1, heads or 1, sq, sk) is the plain causal one (True) or
    masks nothing (False); anything else raises. Reads the mask: one host sync per call."""
    if mask.dim() != 4 or tuple(mask.shape[-2:]) != (sq, sk):
        raise ValueError(f"attention_mask of shape {tuple(mask.shape)} (a padding mask); {SUPPORTED}")
    if torch.compiler.is_compiling():
        raise ValueError("attention_mask: a mask tensor cannot be read while torch.compile traces; "
                         "allowed under torch.compile: attention_mask=None (inputs without padding)")
    allowed = mask if mask.dtype == torch.bool else mask == 0  # additive masks: 0 where attended
    i = torch.arange(sq, device=mask.device)[:, None]
    j = torch.arange(sk, device=mask.device)[None, :]
    if bool((allowed == (j <= i + (sk - sq))).all()):  # bottom-right aligned, as the kernel's
        return True
    if bool(allowed.all()):
        return False
    raise ValueError(f"attention_mask masks more than the causal positions (padding or packed sequences); "
                     f"{SUPPORTED}")


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout: float = 0.0,
                      is_causal=None, **kwargs):
    """transformers' attention function: softmax(q k^T * scaling [+ causal]) v by fa4kernel.
    query (b, h, s_q, d), key / value (b, h_kv, s_k, d); returns ((b, s_q, h, d), None)."""
    if dropout:
        raise ValueError(f"dropout={dropout}; allowed: 0.0 (fa4kernel has no attention dropout: "
                         "set attention_dropout=0 or call model.eval())")
    for kw, what in _REFUSED_KWARGS.items():
        if kwargs.get(kw) is not None:
            raise ValueError(f"{kw}= ({what}) is not supported by fa4kernel's attention; allowed: {kw}=None")
    sq, sk = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is not None:
        causal = _mask_is_causal(attention_mask, sq, sk)
    elif causal and sq == 1:
        causal = False  # one query row sees every key either way (as transformers' sdpa path)
    elif causal and sk > sq:
        # no mask, more keys than queries: transformers' empty static-cache prefill (top-left
        # aligned, as sdpa's is_causal): the keys past the queries are empty slots
        key, value = key[:, :, :sq], value[:, :, :sq]
    out = attention_op(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=bool(causal),
                       softmax_scale=scaling)
    return out, None
