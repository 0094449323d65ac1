"""TransformerLens hook names for walklens' points, both ways (docs/ecosystem.md), so that a sparse autoencoder or a
probe trained on TransformerLens activations reads walklens' vectors.

The map (TransformerLens ``components/transformer_block.py`` and ``HookedTransformer.input_to_embed``; every
name below is a ``[batch, pos, d_model]`` hook of ``HookedTransformer.run_with_cache``):

=====================  ===============================  =======================================================
walklens point         TransformerLens hook             the same vector
=====================  ===============================  =======================================================
``embed``              ``hook_embed``                   the token embedding W_E[t], before learned positions
``L{l}.resid_pre``     ``blocks.{l}.hook_resid_pre``    the input of block l (positions already added)
``L{l}.attn_out``      ``blocks.{l}.hook_attn_out``     what attention adds (after ``ln1_post`` in Gemma 2/3)
``L{l}.resid_mid``     ``blocks.{l}.hook_resid_mid``    resid_pre + attn_out (no such point in parallel blocks)
``L{l}.mlp_out``       ``blocks.{l}.hook_mlp_out``      what the MLP adds (after ``ln2_post`` in Gemma 2/3)
``L{l}.resid_post``    ``blocks.{l}.hook_resid_post``   the output of block l
=====================  ===============================  =======================================================

Refused, in one line naming the nearest valid names: ``final`` (TransformerLens hooks no output of its final
norm: ``ln_final.hook_normalized`` is ``x / scale``, before the norm's weight and bias), the T5 points
``cross_out``/``resid_cross``, and every TransformerLens hook without a walklens point (``hook_pos_embed``,
``hook_tokens``, ``attn.hook_pattern`` and the other per-head or MLP internals, norm internals, ``hook_mlp_in``
and ``hook_attn_in`` copies).  Only decoder-only models with pre-norm or parallel blocks are mapped: in a post-norm
model (BERT, ALBERT, post-norm OPT) TransformerLens' ``hook_resid_mid``/``hook_resid_post`` are the sums before
the norms where walklens' are after them, and T5 is HookedEncoderDecoder's ``encoder.{l}``/``decoder.{l}``.  For
BLOOM ``embed`` is not mapped: TransformerLens' ``hook_embed`` includes ``word_embeddings_layernorm`` (walklens'
``L0.resid_pre``), walklens' ``embed`` is the raw row.

Values are equal when TransformerLens runs the same weights unprocessed
(``HookedTransformer.from_pretrained_no_processing``) on the same token ids; this is checked numerically on
GPT-2 against an independent TransformerLens-style forward pass (tests/test_ecosystem.py), not against
TransformerLens itself.  Its default ``from_pretrained`` centres the weights that write to the residual of a
LayerNorm model (``center_writing_weights``), so every vector above is then walklens' minus its mean over
d_model: :func:`tl_cache` with ``centered=True`` gives that.  ``fold_ln`` changes weights after the norms, not
these vectors.  TransformerLens prepends a BOS token by default (``prepend_bos``): compare the same ids.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..base.errors import InputError
from ..models.base import get_module
from .trace import Trace

if TYPE_CHECKING:
    from .loading import LoadedModel

WALKLENS = "walklens"
TRANSFORMERLENS = "transformerlens"
#: The namings ``capture(..., names=)`` accepts.
NAMINGS = (WALKLENS, TRANSFORMERLENS)

#: walklens point kind of layer l -> TransformerLens hook of ``blocks.{l}``.
BLOCK_HOOKS = {
    "resid_pre": "hook_resid_pre",
    "attn_out": "hook_attn_out",
    "resid_mid": "hook_resid_mid",
    "mlp_out": "hook_mlp_out",
    "resid_post": "hook_resid_post",
}
_KIND_OF_HOOK = {hook: kind for kind, hook in BLOCK_HOOKS.items()}
_POINT = re.compile(r"^L(\d+)\.(\w+)$")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")

#: Why a walklens point has no TransformerLens counterpart.
_NO_HOOK = {
    "final": "TransformerLens hooks no output of its final norm (ln_final.hook_normalized is x / scale, before the "
    "norm's weight and bias); the norm's input is the last block's hook_resid_post",
    "cross_out": "T5's cross-attention is HookedEncoderDecoder's decoder.{l}.hook_cross_attn_out, which walklens "
    "does not map",
    "resid_cross": "T5's residual after cross-attention is HookedEncoderDecoder's decoder.{l}.hook_resid_mid_cross, "
    "which walklens does not map",
}

#: Why a TransformerLens hook has no walklens point: (pattern, reason); ``{l}`` is the name's block.
_NO_POINT: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), why)
    for p, why in (
        (
            r"^hook_pos_embed$",
            "walklens records no position embedding; with learned absolute positions it is "
            "blocks.0.hook_resid_pre - hook_embed",
        ),
        (r"^hook_tokens$", "the token ids are trace.token_ids"),
        (
            r"^blocks\.\d+\.attn\.hook_pattern$",
            "attention probabilities are no point: capture(..., attentions=True) "
            "keeps trace.attentions['L{l}.attn'] as [heads, query, key]",
        ),
        (r"^blocks\.\d+\.hook_mlp_in$", "it is a copy of blocks.{l}.hook_resid_mid (recorded with use_hook_mlp_in)"),
        (
            r"^blocks\.\d+\.hook_(attn_in|q_input|k_input|v_input)$",
            "it is a copy of blocks.{l}.hook_resid_pre with a head axis",
        ),
        (
            r"^ln_final\.hook_\w+$",
            "walklens' final is the final norm's output after its weight and bias, which "
            "TransformerLens does not hook (hook_normalized is x / scale, before them); the "
            "norm's input is the last block's hook_resid_post",
        ),
        (
            r"^(blocks\.\d+\.)?ln\w*\.hook_(normalized|scale)$",
            "norm internals are not recorded (hook_normalized is x / scale, before the norm's weight and bias)",
        ),
        (
            r"^blocks\.\d+\.attn\.hook_\w+$",
            "per-head attention internals are not recorded; what attention adds is blocks.{l}.hook_attn_out",
        ),
        (
            r"^blocks\.\d+\.mlp\.hook_\w+$",
            "MLP internals are not recorded; what the MLP adds is blocks.{l}.hook_mlp_out",
        ),
        (r"^(encoder|decoder)\.\d+\.", "HookedEncoderDecoder (T5) names are not mapped"),
    )
)

#: Families whose walklens point differs from TransformerLens' hook of the same name: point -> reason.
_DIFFERENT = {
    "bloom": {
        "embed": "BLOOM's hook_embed includes word_embeddings_layernorm, which is walklens' L0.resid_pre "
        "(blocks.0.hook_resid_pre); walklens' embed is the raw token row"
    },
}


def _layer_of(name: str) -> str:
    m = _BLOCK.match(name) or _POINT.match(name) or re.match(r"^(?:encoder|decoder)\.(\d+)\.", name)
    return m.group(1) if m else "{l}"


def _nearest(name: str, valid: Sequence[str]) -> str:
    near = difflib.get_close_matches(name, list(valid), n=3, cutoff=0.0) if valid else []
    return ", ".join(near)


def _generic_hooks(layer: str) -> list[str]:
    return ["hook_embed", *(f"blocks.{layer}.{h}" for h in BLOCK_HOOKS.values())]


def _generic_points(layer: str) -> list[str]:
    return ["embed", *(f"L{layer}.{k}" for k in BLOCK_HOOKS)]


def tl_name(point: str) -> str:
    """The TransformerLens hook name of a walklens point (``"L3.resid_post"`` -> ``"blocks.3.hook_resid_post"``),
    for any mapped family; a point with no counterpart is refused in one line naming the nearest valid ones."""
    if point == "embed":
        return "hook_embed"
    m = _POINT.match(point)
    if m and m.group(2) in BLOCK_HOOKS:
        return f"blocks.{int(m.group(1))}.{BLOCK_HOOKS[m.group(2)]}"
    kind = m.group(2) if m else point
    layer = m.group(1) if m else "0"
    if kind in _NO_HOOK:
        raise InputError(
            f"walklens point {point!r} has no TransformerLens hook: {_NO_HOOK[kind]}; mapped points "
            f"are {', '.join(_generic_points('{l}'))}"
        )
    raise InputError(f"{point!r} is not a walklens point; nearest: {_nearest(point, _generic_points(layer))}")


def walklens_point(name: str) -> str:
    """The walklens point of a TransformerLens hook name (``"blocks.3.hook_resid_post"`` -> ``"L3.resid_post"``);
    a hook with no walklens point is refused in one line naming the nearest valid names."""
    if name == "hook_embed":
        return "embed"
    m = _BLOCK.match(name)
    if m and m.group(2) in _KIND_OF_HOOK:
        return f"L{int(m.group(1))}.{_KIND_OF_HOOK[m.group(2)]}"
    layer = _layer_of(name)
    for pattern, why in _NO_POINT:
        if pattern.match(name):
            why = why.replace("{l}", layer)
            raise InputError(
                f"TransformerLens hook {name!r} has no walklens point: {why}; mapped hooks near it: "
                f"{_nearest(name, _generic_hooks(layer))}"
            )
    raise InputError(
        f"{name!r} is not a TransformerLens hook name walklens maps; nearest: "
        f"{_nearest(name, _generic_hooks('0' if layer == '{l}' else layer))}"
    )


def naming(names: str) -> str:
    """``names`` checked: ``"walklens"`` or ``"transformerlens"``."""
    if names not in NAMINGS:
        raise InputError(f"unknown names {names!r}; choose {' or '.join(NAMINGS)}")
    return names


def _model(trace: Trace, lm: LoadedModel | None) -> LoadedModel:
    lm = lm if lm is not None else trace.lm
    if lm is None:
        raise InputError(
            "this trace is not attached to a model, which says whether its family is mapped; pass lm= "
            "(or Trace.load(path, lm=lm))"
        )
    return lm


def require_mapped(lm: LoadedModel) -> None:
    """Refuse, in one line, a model whose points TransformerLens' hooks do not mean (module docstring)."""
    residual = lm.adapter.residual_kind(lm.model.config)
    if lm.is_encoder_decoder:
        raise InputError(
            f"{lm.adapter.family}: TransformerLens names are mapped for decoder-only models only "
            "(T5 is HookedEncoderDecoder's encoder.{l} / decoder.{l}, which walklens does not map)"
        )
    if residual == "post_norm":
        raise InputError(
            f"{lm.adapter.family} is post-norm: TransformerLens' blocks.{{l}}.hook_resid_mid and "
            "hook_resid_post are the sums before the norms, walklens' are after them; use "
            "names='walklens'"
        )


def mapped(lm: LoadedModel, point: str) -> str | None:
    """The TransformerLens name of ``point`` for this model, or None when it has none (or a different value)."""
    if point in _DIFFERENT.get(lm.adapter.family, {}):
        return None
    try:
        return tl_name(point)
    except InputError:
        return None


def model_tl_name(lm: LoadedModel, point: str) -> str:
    """:func:`tl_name` for this model: also refuses a point whose value differs in its family (BLOOM's embed)."""
    why = _DIFFERENT.get(lm.adapter.family, {}).get(point)
    if why:
        raise InputError(f"walklens point {point!r} has no TransformerLens hook of equal value: {why}")
    return tl_name(point)


def select(lm: LoadedModel, every: Sequence[str], patterns: Sequence[str] | str | None) -> list[str]:
    """The walklens points of ``every`` (a model's points, capture order) whose TransformerLens names match the glob
    ``patterns`` (``"blocks.*.hook_resid_post"``; None: every mapped point).  A pattern matching no mapped name is
    refused in one line: a plain name by :func:`walklens_point`'s reason, a glob with the nearest mapped names."""
    require_mapped(lm)
    names = {p: n for p in every if (n := mapped(lm, p)) is not None}
    if patterns is None:
        return list(names)
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    for pat in patterns:
        if any(fnmatch.fnmatchcase(n, pat) for n in names.values()):
            continue
        if not any(c in pat for c in "*?["):
            point = walklens_point(pat)  # refuses a hook with no point, with its reason
            if point in every:
                model_tl_name(lm, point)  # refuses a point whose value differs in this family
            raise InputError(
                f"{lm.name} records no {pat!r} ({point}; {len(every)} points in {lm.n_layers} "
                f"layers); nearest: {_nearest(pat, list(names.values()))}"
            )
        raise InputError(
            f"no TransformerLens hook name of {lm.name} matches {pat!r}; nearest: {_nearest(pat, list(names.values()))}"
        )
    return [p for p, n in names.items() if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]


def names_of(trace: Trace) -> str:
    """The naming of a trace's point labels: ``"walklens"`` or ``"transformerlens"`` (a mix is refused)."""
    tl = [p == "hook_embed" or bool(_BLOCK.match(p)) for p in trace.points]
    if all(tl) and tl:
        return TRANSFORMERLENS
    if not any(tl):
        return WALKLENS
    raise InputError("the trace's point labels mix walklens and TransformerLens names")


def to_transformerlens(trace: Trace, lm: LoadedModel | None = None) -> Trace:
    """The trace with its points labelled by TransformerLens hook names; points without an equal-valued hook
    (``final``; BLOOM's ``embed``) are left out (their rows copied out; the same tensor when every point maps).
    ``lm``: default ``trace.lm``."""
    if names_of(trace) == TRANSFORMERLENS:
        return trace
    lm = _model(trace, lm)
    require_mapped(lm)
    keep = [(i, n) for i, p in enumerate(trace.points) if (n := mapped(lm, p)) is not None]
    if not keep:
        raise InputError(f"none of the trace's points ({', '.join(trace.points[:4])}) has a TransformerLens hook")
    rows = [i for i, _ in keep]
    hidden = trace.hidden if rows == list(range(len(trace.points))) else trace.hidden[rows]
    return replace(trace, points=[n for _, n in keep], hidden=hidden, encoder=None)


def to_walklens(trace: Trace) -> Trace:
    """A TransformerLens-labelled trace with walklens point names again (the same tensor)."""
    if names_of(trace) == WALKLENS:
        return trace
    return replace(trace, points=[walklens_point(n) for n in trace.points])


def _layer_norm_model(lm: LoadedModel) -> bool:
    """Whether the model's final norm is a LayerNorm (mean-centring), the only kind TransformerLens centres the
    writing weights of."""
    spec = lm.adapter.stack()
    if not spec.final_norm:
        return False
    norm = get_module(lm.model, spec.final_norm)
    name = type(norm).__name__
    return isinstance(norm, nn.LayerNorm) or ("LayerNorm" in name and "RMS" not in name)


def tl_cache(trace: Trace, *, centered: bool = False, lm: LoadedModel | None = None) -> dict[str, torch.Tensor]:
    """``{TransformerLens hook name: [1, pos, d_model] tensor}``, shaped like ``ActivationCache`` entries of one
    text, e.g. ``sae.encode(cache["blocks.6.hook_resid_pre"])``.  ``centered``: each vector minus its mean over
    d_model, the values of ``HookedTransformer.from_pretrained``'s default ``center_writing_weights`` on a
    LayerNorm model (refused for other norms, whose writing weights TransformerLens leaves as they are)."""
    tl = to_transformerlens(trace, lm)
    if centered:
        model = _model(trace, lm)
        if not _layer_norm_model(model):
            raise InputError(
                f"{model.adapter.family} has no LayerNorm: TransformerLens centres writing weights only "
                "for LayerNorm models, so its default values are the uncentred ones; leave centered=False"
            )
    out = {}
    for i, name in enumerate(tl.points):
        x = tl.hidden[i]
        out[name] = (x - x.mean(-1, keepdim=True) if centered else x).unsqueeze(0)
    return out


__all__ = ["BLOCK_HOOKS", "NAMINGS", "tl_cache", "tl_name", "to_transformerlens", "to_walklens", "walklens_point"]
