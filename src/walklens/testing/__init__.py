"""Tiny randomly initialised models of every supported family, built in code (no downloads).

Used by the test-suite and handy for users who want to try walklens without weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..loading import LoadedModel, auto_model_class, wrap
from ..models import get_adapter, has_adapter
from ..precision import model_label, parse_dtype

WORDS = (
    "the a of to and in is was it that he she they on for with as at by from this his her their "
    "capital france paris city river london england king queen man woman boy girl dog cat house car "
    "red blue green one two three four five big small run runs ran walk walks eat eats good bad"
).split()


def tiny_tokenizer() -> Any:
    """A word-level fast tokenizer over :data:`WORDS` with <pad>=0, </s>=1, <unk>=2, [CLS]=3, [SEP]=4, [MASK]=5."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + [w for w in WORDS])}
    vocab.update({"Ġ" + w: len(vocab) + i for i, w in enumerate(WORDS)})
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def _configs(V: int) -> dict[str, Callable[[], Any]]:
    """Builders of every tiny config, by family key, over a vocabulary of ``V``."""
    return {**_decoder_configs(V), **_falcon_configs(V), **_encoder_configs(V)}


def _decoder_configs(V: int) -> dict[str, Callable[[], Any]]:
    """Builders of the GPT, Llama and Gemma tiny configs."""
    import transformers as T

    return {
        "gpt2": lambda: T.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        "gpt_neo": lambda: T.GPTNeoConfig(
            vocab_size=V,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=4,
            max_position_embeddings=64,
        ),
        "gpt_neox": lambda: T.GPTNeoXConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            use_parallel_residual=True,
        ),
        "gpt_neox_seq": lambda: T.GPTNeoXConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            use_parallel_residual=False,
        ),
        "llama": lambda: T.LlamaConfig(
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=True,
        ),
        "gemma3": lambda: T.Gemma3TextConfig(
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=4,
            max_position_embeddings=64,
            layer_types=["sliding_attention", "full_attention"],
        ),
    }


def _falcon_configs(V: int) -> dict[str, Callable[[], Any]]:
    """Builders of the Falcon tiny configs (the new decoder architecture, ALiBi with parallel attention, and the
    sequential layer)."""
    import transformers as T

    return {
        "falcon": lambda: T.FalconConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            new_decoder_architecture=True,
            num_kv_heads=2,
            alibi=False,
            max_position_embeddings=64,
        ),
        "falcon_alibi": lambda: T.FalconConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            multi_query=True,
            parallel_attn=True,
            alibi=True,
            new_decoder_architecture=False,
            max_position_embeddings=64,
        ),
        "falcon_seq": lambda: T.FalconConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            multi_query=False,
            parallel_attn=False,
            alibi=False,
            new_decoder_architecture=False,
            bias=True,
            max_position_embeddings=64,
        ),
    }


def _encoder_configs(V: int) -> dict[str, Callable[[], Any]]:
    """Builders of the T5, BERT and ALBERT tiny configs."""
    import transformers as T

    return {
        # decoder_start_token_id (T5 shifts its labels right with it) is no field of transformers 5's T5Config:
        # PretrainedConfig keeps it from **kwargs as an attribute
        "t5": lambda: T.T5Config(
            vocab_size=V,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        ),  # type: ignore[call-arg]  # a **kwargs extra: see above
        "bert": lambda: T.BertConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        "albert": lambda: T.AlbertConfig(
            vocab_size=V,
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
    }


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


def tiny_config(model_type: str, vocab_size: int, **overrides: Any) -> Any:
    """A tiny config of any Hugging Face ``model_type``: :data:`SMALL` sizes where the config class has them,
    then ``overrides``."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    defaults = CONFIG_MAPPING[model_type]()
    kw = {k: v for k, v in SMALL.items() if hasattr(defaults, k)}
    for attr, tiny_id in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 1)):  # ids of tiny_tokenizer
        if isinstance(getattr(defaults, attr, None), int) and getattr(defaults, attr) >= vocab_size:
            kw[attr] = tiny_id
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, **{**kw, **overrides})


#: Tiny variants of the families with an adapter file: name -> (model_type, config overrides).  A name that is
#: a model_type and not listed here gets :func:`tiny_config` with no overrides.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
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

TINY_FAMILIES = (
    "gpt2",
    "gpt_neo",
    "gpt_neox",
    "gpt_neox_seq",
    "llama",
    "gemma3",
    "falcon",
    "falcon_alibi",
    "falcon_seq",
    "t5",
    "bert",
    "albert",
    *VARIANTS,
)


def tiny_config_of(family: str, vocab_size: int) -> Any:
    """The tiny config of a family variant (:data:`TINY_FAMILIES`) or of any model_type."""
    named = _configs(vocab_size)
    if family in named:
        return named[family]()
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
    :func:`~walklens.loading.load_model` names it.
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
