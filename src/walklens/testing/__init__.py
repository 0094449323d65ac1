"""Tiny randomly initialised models of every supported family, built in code (no downloads).

Used by the test-suite and handy for users who want to try walklens without weights.
"""

from __future__ import annotations

from typing import Any

import torch

from ..base.precision import model_label, parse_dtype
from ..core.loading import LoadedModel, auto_model_class, wrap
from ..models import get_adapter, has_adapter
from ..models.tiny import tiny_config

WORDS = (
    "the a of to and in is was it that he she they on for with as at by from this his her their "
    "capital france paris city river london england king queen man woman boy girl dog cat house car "
    "red blue green one two three four five big small run runs ran walk walks eat eats good bad"
).split()


#: The special tokens of :func:`tiny_tokenizer`, by role, in the order of their ids (0 to 5).
SPECIALS = {
    "pad_token": "<pad>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def tiny_tokenizer() -> Any:
    """A word-level fast tokenizer over :data:`WORDS` with <pad>=0, </s>=1, <unk>=2, [CLS]=3, [SEP]=4, [MASK]=5."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate([*SPECIALS.values(), *WORDS])}
    vocab.update({"Ġ" + w: len(vocab) + i for i, w in enumerate(WORDS)})
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIALS["unk_token"]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk, **SPECIALS)


#: The tiny families: name -> (model_type, config overrides of :func:`tiny_config`).  A name that is a model_type
#: and not listed here gets :func:`tiny_config` with no overrides.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # GPT-2 and GPT-Neo keep the ids of their default configs (beyond the tiny vocabulary)
    "gpt2": ("gpt2", dict(bos_token_id=50256, eos_token_id=50256)),
    "gpt_neo": (
        "gpt_neo",
        dict(
            attention_types=[[["global", "local"], 1]],
            window_size=4,
            intermediate_size=None,
            bos_token_id=50256,
            eos_token_id=50256,
        ),
    ),
    "gpt_neox": (
        "gpt_neox",
        dict(rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5}, use_parallel_residual=True),
    ),
    "gpt_neox_seq": ("gpt_neox", dict(use_parallel_residual=False)),
    "llama": ("llama", dict(tie_word_embeddings=True)),
    "gemma3": ("gemma3_text", dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    # Falcon: the new decoder architecture, ALiBi with parallel attention, and the sequential layer
    "falcon": ("falcon", dict(new_decoder_architecture=True, num_kv_heads=2, alibi=False)),
    "falcon_alibi": (
        "falcon",
        dict(multi_query=True, parallel_attn=True, alibi=True, new_decoder_architecture=False),
    ),
    "falcon_seq": (
        "falcon",
        dict(multi_query=False, parallel_attn=False, alibi=False, new_decoder_architecture=False, bias=True),
    ),
    # decoder_start_token_id (T5 shifts its labels right with it) is no field of transformers 5's T5Config:
    # PretrainedConfig keeps it from **kwargs as an attribute
    "t5": (
        "t5",
        dict(
            d_ff=64,
            num_decoder_layers=2,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        ),
    ),
    "bert": ("bert", {}),
    "albert": ("albert", dict(embedding_size=16, num_hidden_layers=3)),
    "qwen3": ("qwen3", {}),
    "qwen3_sliding": (
        "qwen3",
        dict(use_sliding_window=True, sliding_window=4, max_window_layers=1, attention_bias=True),
    ),
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)),
    "qwen3_moe_mixed": (
        "qwen3_moe",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[0], norm_topk_prob=True),
    ),
    "qwen2_moe": (
        "qwen2_moe",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32),
    ),
    "qwen2_moe_sliding": (
        "qwen2_moe",
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=32,
            decoder_sparse_step=2,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=2,
        ),
    ),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32)),
    "mixtral_sliding": (
        "mixtral",
        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, sliding_window=4),
    ),
    "starcoder2": ("starcoder2", {}),
    "starcoder2_sliding": ("starcoder2", dict(use_bias=False, sliding_window=4)),
    "gemma": ("gemma", {}),
    "gemma2": (
        "gemma2",
        dict(
            query_pre_attn_scalar=8,
            sliding_window=4,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    "gemma2_nocap": (
        "gemma2",
        dict(
            query_pre_attn_scalar=8,
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            layer_types=["full_attention", "full_attention"],
        ),
    ),
    "cohere": ("cohere", dict(bos_token_id=1, eos_token_id=1)),
    "cohere_qknorm": ("cohere", dict(bos_token_id=1, eos_token_id=1, use_qk_norm=True)),
    "olmo2": ("olmo2", dict(pad_token_id=0, eos_token_id=1)),
    "phi": ("phi", {}),
    "phi_qkln": ("phi", {"qk_layernorm": True}),
    "phi3": ("phi3", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1}),
    "phi3_sliding": ("phi3", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1, "sliding_window": 4}),
    "phi3_longrope": (
        "phi3",
        {
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 1,
            "original_max_position_embeddings": 16,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.5, 2.0, 4.0],
                "long_factor": [2.0, 3.0, 4.0, 8.0],
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "stablelm": ("stablelm", {"use_qkv_bias": True}),
    "stablelm_parallel": ("stablelm", {"use_parallel_residual": True}),
    "stablelm_qkln": ("stablelm", {"qk_layernorm": True}),
    "stablelm_yarn": (
        "stablelm",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "partial_rotary_factor": 0.5,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "gptj": ("gptj", {"rotary_dim": 4, "bos_token_id": 1, "eos_token_id": 1}),
    "codegen": ("codegen", {"rotary_dim": 4, "n_ctx": 64, "bos_token_id": 1, "eos_token_id": 1}),
    "opt": ("opt", dict(ffn_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=1)),
    "opt_postnorm": (
        "opt",
        dict(ffn_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=1, do_layer_norm_before=False),
    ),
    "opt_proj": (
        "opt",
        dict(
            ffn_dim=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=1,  # opt-350m's layout
            do_layer_norm_before=False,
            word_embed_proj_dim=16,
        ),
    ),
    "bloom": ("bloom", dict(pad_token_id=0, bos_token_id=1, eos_token_id=1)),
    "mpt": ("mpt", dict(max_seq_len=64, pad_token_id=0, bos_token_id=1, eos_token_id=1)),
    "gpt_bigcode": ("gpt_bigcode", dict(n_inner=64, pad_token_id=0, bos_token_id=1, eos_token_id=1)),
    "gpt_bigcode_mha": (
        "gpt_bigcode",
        dict(n_inner=64, multi_query=False, pad_token_id=0, bos_token_id=1, eos_token_id=1),
    ),
}

TINY_FAMILIES = tuple(VARIANTS)


def tiny_config_of(family: str, vocab_size: int) -> Any:
    """The tiny config of a family variant (:data:`TINY_FAMILIES`) or of any model_type."""
    model_type, overrides = VARIANTS.get(family, (family, {}))
    return tiny_config(model_type, vocab_size, **overrides)


def tiny_model(
    family: str,
    seed: int = 0,
    init_std: float | None = 0.2,
    dtype: str | torch.dtype = torch.float32,
    *,
    as_model_type: bool = False,
) -> LoadedModel:
    """A tiny random model of ``family`` (a name of :data:`TINY_FAMILIES`, or any causal model_type of the
    installed transformers, sized by :func:`tiny_config`), eager attention, eval mode.  ``as_model_type``: read
    ``family`` as a model_type (a named variant of the same name is used only when it is of that type), built as
    a causal LM.

    ``init_std`` re-draws every weight matrix with a larger std than HF's 0.02 so that attention patterns
    and logits are far from uniform (numerical checks are then meaningful).  ``dtype``: the weights are drawn
    in float32 (the same for every dtype) and then cast; the name carries a dtype other than float32, as
    :func:`~walklens.core.loading.load_model` names it.
    """
    dtype = parse_dtype(dtype)
    tok = tiny_tokenizer()
    config = tiny_config_of(family, len(tok))
    if as_model_type and config.model_type != family:  # a named variant of another type (gemma3 -> gemma3_text)
        config = tiny_config(family, len(tok))
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    adapter = get_adapter(config) if has_adapter(config) and not as_model_type else None
    model = auto_model_class(adapter).from_config(config, attn_implementation="eager", dtype=torch.float32)
    if init_std:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2 or "relative_attention_bias" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * init_std)
                elif name.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return wrap(model.to(dtype), tok, name=model_label(f"tiny-{family}", dtype))
