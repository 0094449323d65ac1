"""Declarative architecture adapters (one file per family beside this one).

An :class:`Adapter` names, for one Hugging Face ``model_type``, where each part of seed 000's Figure 1 lives
in the real module tree: the token-embedding matrix V, the layer list(s), per layer the self-attention,
cross-attention and MLP modules whose outputs are added to the residual stream, the norms, the final norm and
the unembedding.  Nothing here re-implements a forward pass: capture hooks the modules named here.

Conventions: vectors are rows (seed 000, A.3), so a head computes ``A_h X W_v,h W_o,h``.  Per-head weights
are returned by :func:`Adapter.head_weights` in that row convention.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, cast

import torch
from torch import nn

Residual = Literal["pre_norm", "parallel", "post_norm"]
Position = Literal["learned", "rotary", "t5_relative", "alibi", "none"]
AutoClass = Literal["causal", "seq2seq", "masked"]
#: The architecture words of seed 000's A.6 (the names :meth:`walklens.analyses.concepts.schemes.Scheme.validate`
# takes).
Kind = Literal["decoder", "encoder-decoder", "encoder"]

#: The A.6 architecture word of each transformers auto class an adapter declares.
KINDS: dict[str, Kind] = {"causal": "decoder", "seq2seq": "encoder-decoder", "masked": "encoder"}

#: A module of a Hugging Face model whose attributes an adapter reads by name (``attn.q_proj``,
#: ``attn.num_heads``, ``model.lm_head``): they differ by family and transformers version, and are submodules,
#: tensors, ints or floats, where nn.Module's ``__getattr__`` would type each as ``Tensor | Module``.
HFModule = Any

#: Identities an analysis may rely on and a family may break (``Adapter.limits`` maps each one broken to why).
IDENTITIES: dict[str, str] = {
    "qk_bilinear": "attention scores are scale * (x W_q + b_q)(y W_k + b_k)^T plus a position term (A.3)",
    "qk_rebuild": "attention scores rebuild from W_q, W_k with the family's own q/k norms and score soft-cap",
    "logit_linear": "logits are final @ W_U^T + b, with no scale or soft-cap (eq. 12)",
    "dense_mlp": "each layer has one feed-forward network, applied to every token",
    "full_attention": "every position may attend to every earlier position (no sliding window)",
}


def get_module(root: nn.Module, path: str) -> nn.Module:
    """Resolve a dotted path (``"model.layers"``, ``"layer.0.SelfAttention"``) below ``root``."""
    mod: Any = root
    for part in path.split("."):
        mod = mod[int(part)] if part.isdigit() else getattr(mod, part)
    return mod


def has_module(root: nn.Module, path: str) -> bool:
    """Whether ``path`` names a module below ``root`` (an attribute set to None, as StableLM's absent
    post-attention norm in its parallel layout, names none)."""
    try:
        return get_module(root, path) is not None
    except (AttributeError, IndexError, TypeError):
        return False


@dataclass(frozen=True)
class HeadWeights:
    """Per-head attention weights of one attention module, row convention (x @ W).

    Shapes: ``w_q`` [H, D, d], ``w_k``/``w_v`` [H_kv, D, d], ``w_o`` [H, d, D]; biases ``b_q`` [H, d],
    ``b_k``/``b_v`` [H_kv, d], ``b_o`` [D] (zeros where the module has none).  ``kv_head[h]`` maps query head
    h to its key/value head (grouped-query attention).  ``scale`` multiplies q·k before the softmax.
    ``qk_norm`` is True when the family normalises q and k per head (Gemma 3), so that q·k is not bilinear
    in x; ``notes`` says anything else a user should know.
    """

    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    w_o: torch.Tensor
    b_q: torch.Tensor
    b_k: torch.Tensor
    b_v: torch.Tensor
    b_o: torch.Tensor
    kv_head: tuple[int, ...]
    scale: float
    qk_norm: bool = False
    notes: str = ""

    @property
    def n_heads(self) -> int:
        return self.w_q.shape[0]

    @property
    def d_head(self) -> int:
        return self.w_q.shape[2]

    @property
    def d_model(self) -> int:
        return self.w_q.shape[1]


@dataclass(frozen=True)
class StackSpec:
    """One transformer stack (decoder-only models have one; T5 has ``enc`` and ``dec``).

    Paths of ``layers`` and ``final_norm`` are relative to the model root; the other paths are relative to
    one layer.  ``attn_out``/``cross_out``/``mlp_out`` name the modules whose outputs are the
    contributions added to the residual stream (pre-norm and parallel families) or, for post-norm families,
    the projection added before the sublayer's norm; ``mid`` names a module whose output *is* the residual
    after attention (post-norm families), else it is computed as ``resid_pre + attn_out``.
    ``shared_layer``: one layer module applied ``n_layers`` times (ALBERT).
    ``attn_proj``/``cross_proj`` name the module whose output is the raw attention projection
    ``sum_h A_h X W_vo,h + b_o`` (seed 000, A.3) before any post-norm or residual add, when that is not
    ``attn_out``/``cross_out`` (Gemma 3's sandwich norm); the A.3 identity check compares against it.
    """

    name: str
    layers: str
    attn: str
    attn_out: str
    mlp_out: str
    final_norm: str | None = None
    cross_attn: str | None = None
    cross_out: str | None = None
    mid: str | None = None
    norms: dict[str, str] = field(default_factory=dict)
    embed_point: str | None = None
    shared_layer: bool = False
    causal: bool = True
    attn_proj: str | None = None
    cross_proj: str | None = None

    @property
    def attn_proj_path(self) -> str:
        """Module whose output is the self-attention projection (before post-norms and the residual add)."""
        return self.attn_proj or self.attn_out

    @property
    def cross_proj_path(self) -> str | None:
        """Module whose output is the cross-attention projection, if the stack has cross-attention."""
        return self.cross_proj or self.cross_out

    def norm_module(self, layer: nn.Module, role: str) -> nn.Module | None:
        """The norm playing ``role`` ("attn", "mlp", ...) in one layer; a path may list alternatives
        separated by ``|`` (the first that exists wins: Falcon's layouts differ by config)."""
        for path in self.norms.get(role, "").split("|"):
            if path and has_module(layer, path):
                return get_module(layer, path)
        return None


@dataclass(frozen=True)
class Adapter:
    """Everything walklens needs to know about one architecture family.

    Its kind is declared once, by ``auto_class`` (the transformers auto class that builds it); every question
    about the kind is answered here (:attr:`kind`, :attr:`is_causal`, :attr:`is_encoder_decoder`,
    :attr:`is_masked`, :meth:`reading_stack`) and by :class:`walklens.core.loading.LoadedModel`, never by testing
    ``auto_class`` elsewhere.
    """

    family: str
    model_types: tuple[str, ...]
    auto_class: AutoClass
    embed: str
    stacks: tuple[StackSpec, ...]
    position: Position | Callable[[Any], Position]
    residual: Residual | Callable[[Any], Residual]
    head_weights_fn: Callable[[HFModule, Any], HeadWeights]
    logits_fn: Callable[[HFModule, torch.Tensor], torch.Tensor]
    n_layers_fn: Callable[[Any], int] = lambda c: c.num_hidden_layers
    mlp_act_fn: Callable[[HFModule, int], Callable[[torch.Tensor], torch.Tensor]] | None = None
    unembed: str | None = None
    embed_scale_fn: Callable[[Any], float] = lambda c: 1.0
    #: identities of :data:`IDENTITIES` this family breaks, each with the reason (a dict, or a function of the
    #: config when it depends on the checkpoint).
    limits: dict[str, str] | Callable[[Any], dict[str, str]] = field(default_factory=dict)
    #: the adapter of one config, when its module tree depends on the config beyond what the callable fields
    #: say (OPT's final norm exists only in pre-norm checkpoints); may refuse a config it does not support
    #: by raising :class:`~walklens.base.errors.UnsupportedFamilyError`.
    for_config: Callable[[Adapter, Any], Adapter] | None = None
    #: whether lm-evaluation-harness prefixes the BOS token to this family's inputs (it does for Gemma:
    #: ``add_bos_token`` is set when the model type contains "gemma"); HellaSwag encodes as the harness does.
    harness_bos: bool = False

    # --- the model's kind --------------------------------------------------------------------------------
    @property
    def kind(self) -> Kind:
        """``decoder``, ``encoder-decoder`` or ``encoder``: the architecture word of seed 000's A.6."""
        return KINDS[self.auto_class]

    @property
    def is_causal(self) -> bool:
        """A decoder-only causal LM: one stack, each position sees only earlier ones, and it generates."""
        return self.auto_class == "causal"

    @property
    def is_encoder_decoder(self) -> bool:
        """An encoder-decoder LM (T5): an ``enc`` stack reads the text, a ``dec`` stack generates."""
        return self.auto_class == "seq2seq"

    @property
    def is_masked(self) -> bool:
        """An encoder-only masked LM (BERT, ALBERT): it reads a text and generates nothing."""
        return self.auto_class == "masked"

    def reading_stack(self) -> StackSpec:
        """The stack that reads a text: the encoder of an encoder-decoder model, else the only stack."""
        return self.stack("enc") if self.is_encoder_decoder else self.stack()

    # --- convenience -------------------------------------------------------------------------------------
    def specialize(self, config: Any) -> Adapter:
        """This adapter as it applies to ``config`` (see :attr:`for_config`)."""
        return self.for_config(self, config) if self.for_config is not None else self

    def position_scheme(self, config: Any) -> Position:
        return self.position(config) if callable(self.position) else self.position

    def residual_kind(self, config: Any) -> Residual:
        return self.residual(config) if callable(self.residual) else self.residual

    def n_layers(self, config: Any) -> int:
        return int(self.n_layers_fn(config))

    def broken(self, config: Any) -> dict[str, str]:
        """The identities of :data:`IDENTITIES` this model breaks, each with its reason."""
        got = self.limits(config) if callable(self.limits) else self.limits
        return {k: v for k, v in got.items() if v}

    def require(self, config: Any, identity: str, analysis: str) -> None:
        """Refuse, in one line naming the reason, an analysis that relies on an identity this model breaks."""
        from ..base.errors import UnsupportedFamilyError

        if identity not in IDENTITIES:
            raise KeyError(identity)
        why = self.broken(config).get(identity)
        if why:
            raise UnsupportedFamilyError(
                f"{analysis} relies on {IDENTITIES[identity]}, which {self.family} breaks: {why}"
            )

    def stack(self, name: str | None = None) -> StackSpec:
        if name is None:
            return self.stacks[-1]
        for s in self.stacks:
            if s.name == name:
                return s
        raise KeyError(f"{self.family} has no stack {name!r}; stacks: {[s.name for s in self.stacks]}")

    def layer_modules(self, model: nn.Module, stack: str | None = None) -> list[nn.Module]:
        """The layer module applied at each depth (the same module L times for a shared-weight stack)."""
        spec = self.stack(stack)
        layers = list(cast(nn.ModuleList, get_module(model, spec.layers)))
        if spec.shared_layer:
            return [layers[0]] * self.n_layers(model.config)
        return layers

    def embedding_matrix(self, model: nn.Module) -> torch.Tensor:
        """V, the token-embedding matrix [vocab, D_embed] (eq. 2)."""
        return cast(nn.Embedding, get_module(model, self.embed)).weight

    def attention_module(
        self, model: nn.Module, layer: int, stack: str | None = None, cross: bool = False
    ) -> nn.Module:
        spec = self.stack(stack)
        path = spec.cross_attn if cross else spec.attn
        if path is None:
            raise KeyError(f"stack {spec.name!r} of {self.family} has no cross-attention")
        return get_module(self.layer_modules(model, stack)[layer], path)

    def head_weights(self, model: nn.Module, layer: int, stack: str | None = None, cross: bool = False) -> HeadWeights:
        return self.head_weights_fn(self.attention_module(model, layer, stack, cross), model.config)

    def logits(self, model: nn.Module, final: torch.Tensor) -> torch.Tensor:
        """Logits from the ``final`` captured point (eq. 12, plus any family-specific head)."""
        return self.logits_fn(model, final)

    def mlp_activation(self, model: nn.Module, layer: int = 0) -> Callable[[torch.Tensor], torch.Tensor]:
        """The model's own feed-forward activation function (used by relu|mean word aggregation, A.6)."""
        if self.mlp_act_fn is not None:
            return self.mlp_act_fn(model, layer)
        raise NotImplementedError(f"{self.family}: no MLP activation registered")


# ---- helpers shared by adapters ------------------------------------------------------------------------------


#: The norms of most families, Llama's names: the attention's input norm and the MLP's.
NORMS: Mapping[str, str] = {"attn": "input_layernorm", "mlp": "post_attention_layernorm"}


class Tree(TypedDict):
    """The module tree of :func:`causal_lm`'s first paths, one value that families sharing it pass on: the token
    embeddings, the layer list and the final norm (below the model root) and each layer's attention module."""

    embed: str
    layers: str
    attn: str
    final_norm: str | None


def causal_lm(
    family: str,
    *,
    embed: str,
    layers: str,
    attn: str,
    final_norm: str | None,
    norms: Mapping[str, str] = NORMS,
    attn_out: str | None = None,
    mlp_out: str = "mlp",
    **fields: Any,
) -> Adapter:
    """The adapter of a decoder-only causal LM of model type ``family``, with one stack (``layers``; per layer the
    attention module ``attn``, the contributions ``attn_out``, by default ``attn`` itself, and ``mlp_out``, the
    ``norms``; ``final_norm``), a pre-norm residual stream, the MLP activation the config's ``hidden_act`` names
    (:func:`act_from_config`) and logits from its ``lm_head`` (:func:`lm_head_logits`) unless ``fields``, the
    other fields of :class:`Adapter`, say otherwise."""
    spec = StackSpec("", layers, attn, attn_out or attn, mlp_out, final_norm=final_norm, norms=dict(norms))
    defaults: dict[str, Any] = {
        "model_types": (family,),
        "residual": "pre_norm",
        "logits_fn": lm_head_logits("lm_head"),
        "mlp_act_fn": act_from_config("hidden_act"),
        "unembed": "lm_head",
    }
    return Adapter(
        **{"family": family, "auto_class": "causal", "embed": embed, "stacks": (spec,), **defaults, **fields}
    )


def variant(adapter: Adapter, family: str, *, stack: dict[str, Any] | None = None, **changes: Any) -> Adapter:
    """``adapter``'s module tree for another family (model type ``family`` unless ``changes`` name others), with
    ``changes`` to its fields and ``stack`` to the fields of its one stack."""
    stacks = (dataclasses.replace(adapter.stacks[0], **stack),) if stack else adapter.stacks
    return dataclasses.replace(adapter, **{"family": family, "model_types": (family,), "stacks": stacks, **changes})


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(x / cap)``, the soft-capping of attention scores or logits (Gemma 2); ``x`` when ``cap`` is
    None or 0."""
    return torch.tanh(x / cap) * cap if cap else x


def lm_head_logits(
    path: str, softcap_attr: str | None = None, scale: tuple[str, str] | None = None
) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """Logits = final @ W_U^T (+ b), then multiplied or divided by a config attribute (``scale``: the attribute and
    ``"mul"`` or ``"div"``), then soft-capped by the config's ``softcap_attr`` (:func:`soft_cap`)."""

    def fn(model: nn.Module, final: torch.Tensor) -> torch.Tensor:
        head = cast(nn.Linear, get_module(model, path))
        out = head(final.to(head.weight.dtype))
        if scale is not None:
            s = float(getattr(model.config, scale[0]))
            out = out * s if scale[1] == "mul" else out / s
        return soft_cap(out, getattr(model.config, softcap_attr, None) if softcap_attr else None)

    return fn


def act_from_config(attr: str) -> Callable[[nn.Module, int], Callable[[torch.Tensor], torch.Tensor]]:
    from transformers.activations import ACT2FN

    def fn(model: nn.Module, layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
        cfg = model.config
        name = getattr(cfg, attr, None) or getattr(cfg, "hidden_act", None) or "gelu"
        return ACT2FN[name]

    return fn


def sliding_window_limit(config: Any) -> dict[str, str]:
    """``{"full_attention": why}`` when some layer attends through a sliding window shorter than the context
    (``config.sliding_window``, on the layers ``config.layer_types`` marks ``"sliding_attention"`` if it has
    them, else on every layer), else ``{}``."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window or (types is not None and "sliding_attention" not in types):
        return {}
    context = getattr(config, "max_position_embeddings", None)
    if isinstance(context, int) and window >= context:
        return {}
    where = f"layers {[i for i, t in enumerate(types) if t == 'sliding_attention']}" if types else "every layer"
    return {"full_attention": f"{where}: each position sees only the last {window} positions (sliding window)"}


def rope_attention_factor(config: Any) -> float:
    """The factor Hugging Face's rotary embedding multiplies cos and sin by (``attention_scaling``: 1 for plain
    rotary, > 1 for YaRN or LongRoPE), computed as the model's own rotary module computes it."""
    rope = getattr(config, "rope_parameters", None) or {}
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return float(ROPE_INIT_FUNCTIONS[kind](config)[1])


def partial_rotary(config: Any) -> float:
    """The fraction of each head the rotary embedding turns (``partial_rotary_factor`` of the rope parameters)."""
    return (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)


def fold_rope_factor(hw: HeadWeights, config: Any) -> HeadWeights:
    """Fold the rotary embedding's cos/sin factor f (:func:`rope_attention_factor`) into the head weights, so that
    the position-0 form of W_qk is exact: with full rotary into ``scale`` (times f**2), with partial rotary into the
    rotary columns (the first ``partial_rotary_factor`` of each head) of W_q, W_k, b_q and b_k."""
    f = rope_attention_factor(config)
    if f == 1.0:
        return hw
    note = f"{hw.notes}; the rotary factor {f:.4g} of the rope scaling is folded into "
    rot = int(hw.d_head * partial_rotary(config))
    if rot >= hw.d_head:
        return dataclasses.replace(hw, scale=hw.scale * f * f, notes=note + "scale (times its square)")
    w_q, w_k, b_q, b_k = (t.clone() for t in (hw.w_q, hw.w_k, hw.b_q, hw.b_k))
    for t in (w_q, w_k, b_q, b_k):
        t[..., :rot] *= f
    return dataclasses.replace(
        hw,
        w_q=w_q,
        w_k=w_k,
        b_q=b_q,
        b_k=b_k,
        notes=note + f"the first {rot} (rotary) columns of W_q, W_k, b_q and b_k",
    )
