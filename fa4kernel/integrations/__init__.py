"""fa4kernel inside other libraries' models.

    from fa4kernel.integrations import register_transformers
    register_transformers()        # then attn_implementation="fa4lab" in transformers

Importing this package imports nothing beyond it: transformers and torch are imported when
register_transformers() is called (fa4kernel/integrations/transformers.py).
"""


def register_transformers(name: str = "fa4lab") -> str:
    """Register fa4kernel's attention with Hugging Face transformers under `name` (its
    AttentionInterface and its mask function); returns the name for attn_implementation=."""
    from .transformers import register_transformers as register

    return register(name)


__all__ = ["register_transformers"]
