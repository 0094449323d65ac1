"""Tiny configs of any Hugging Face ``model_type``, built in code (no downloads): the one sizing rule of the test
models (:mod:`walklens.testing`) and of the model ``walklens calibrate`` times
(:func:`walklens.costs.measure.tiny_llama`)."""

from __future__ import annotations

from typing import Any

#: Small sizes for any config class: each is set where the config has the attribute (names via attribute_map too).
SMALL: dict[str, Any] = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    rotary_dim=4,
)


def _settable(cls: type, attr: str) -> bool:
    """Whether a config class lets ``attr`` be set (not a read-only property, as Falcon's ``head_dim``)."""
    prop = getattr(cls, attr, None)
    return not isinstance(prop, property) or prop.fset is not None


def tiny_config(model_type: str, vocab_size: int, **overrides: Any) -> Any:
    """A tiny config of any Hugging Face ``model_type``: :data:`SMALL` sizes where the config class has them,
    then ``overrides``."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    defaults = CONFIG_MAPPING[model_type]()
    kw = {k: v for k, v in SMALL.items() if hasattr(defaults, k) and _settable(type(defaults), k)}
    for attr, tiny_id in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 1)):  # ids of tiny_tokenizer
        if isinstance(getattr(defaults, attr, None), int) and getattr(defaults, attr) >= vocab_size:
            kw[attr] = tiny_id
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, **{**kw, **overrides})


__all__ = ["SMALL", "tiny_config"]
