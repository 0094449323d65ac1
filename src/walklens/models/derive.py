"""An adapter derived for a family with no adapter file, from its config and its module tree.

The roles of seed 000's Figure 1 (token embeddings V, the layer list, per layer the attention and MLP modules
and the norms around them, the final norm, the unembedding) are looked up by the names families use, then
*confirmed by data flow*: one probe forward pass records every candidate module's input and output, and a role
is assigned only where the tensors say so (the attention norm is the norm whose output is the attention's input;
the residual is pre-norm when the MLP norm reads ``resid_pre + attn_out``, parallel when it reads
``resid_pre``, ...).  The per-head split of a fused q/k/v projection is chosen among the known layouts by
the A.3 identity (W_v, W_o) and by attention scores rebuilt from W_q, W_k at position 0 (rotation-free).

A derived adapter is accepted only when, on the probe: the logits recomputed from ``final`` equal the model's,
each layer's contributions add up to its output, and the A.3 identity holds on every layer; otherwise
:class:`~walklens.base.errors.UnsupportedFamilyError` names the check that failed and the module paths it tried.
Where the scores cannot be rebuilt from W_q, W_k (q/k norms, soft-capping, an unknown position term) the
adapter declares ``qk_bilinear`` broken instead of guessing.  :func:`render` writes the roles as a reviewable
adapter file (``walklens adapter MODEL --write``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from torch import nn

from ..base.errors import UnsupportedFamilyError
from .base import Adapter, HeadWeights, HFModule, Position, get_module, has_module, sliding_window_limit
from .heads import LAYOUTS
from .probe import (
    PROBE_TOL,
    QK_NORM_NAMES,
    Probe,
    close,
    identity_ok,
    own_forward,
    probe_ids,
    qk_norms,
    rows_sum_to_one,
    score_softcap,
    scores_error,
)
from .roles import Roles, build_adapter, head_weights_from, layer_at, logits_fn

ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention", "mixer")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "feedforward")
Q_NAMES, K_NAMES, V_NAMES = (
    ("q_proj", "query", "wq", "q_lin", "q"),
    ("k_proj", "key", "wk", "k_lin", "k"),
    ("v_proj", "value", "wv", "v_lin", "v"),
)
O_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "wo", "out_lin", "o_lin", "o")
QKV_NAMES = ("qkv_proj", "Wqkv", "c_attn", "query_key_value", "W_pack", "qkv")
#: config attributes that scale the logits: (attribute, multiply or divide)
LOGIT_SCALES = (("logit_scale", "mul"), ("logits_scaling", "div"), ("output_multiplier", "mul"))
ACT_NAMES = ("act_fn", "act", "activation_fn", "activation", "act_func")


# ---- finding the roles ---------------------------------------------------------------------------------------


def _path_of(root: nn.Module, target: nn.Module) -> str | None:
    return next((name for name, m in root.named_modules() if m is target), None)


def _first(root: nn.Module, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if has_module(root, n) and isinstance(get_module(root, n), nn.Module)), None)


def _is_norm(m: nn.Module) -> bool:
    return isinstance(m, nn.LayerNorm) or "norm" in type(m).__name__.lower() or type(m).__name__.endswith("LN")


def _config_int(cfg: Any, *names: str) -> tuple[str, int] | None:
    for n in names:
        v = getattr(cfg, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return n, v
    return None


def _refuse(model_type: str, check: str, tried: str) -> UnsupportedFamilyError:
    return UnsupportedFamilyError(
        f"model_type {model_type!r} has no adapter file and none could be derived: {check} (tried {tried})"
    )


def _layer_roles(probe: Probe, layer: nn.Module, attn: str, mlp: str) -> dict[str, Any]:
    """Norms and residual kind of layer 0 from the probe's tensors."""
    ins, outs = probe.ins, probe.outs
    pre, post = ins.get("layer"), outs.get("layer")
    a_in, a_out, m_in, m_out = ins.get(attn), outs.get(attn), ins.get(mlp), outs.get(mlp)
    norms = [n for n, m in layer.named_children() if _is_norm(m)]
    role: dict[str, str] = {}
    for n in norms:
        if close(outs.get(n), a_in, probe.tol) and "attn" not in role:
            role["attn"] = n
        if close(outs.get(n), m_in, probe.tol) and "mlp" not in role:
            role["mlp"] = n
        if close(ins.get(n), a_out, probe.tol):
            role["attn_post"] = n
        if close(ins.get(n), m_out, probe.tol):
            role["mlp_post"] = n
    a_add = outs.get(role["attn_post"]) if "attn_post" in role else a_out
    m_add = outs.get(role["mlp_post"]) if "mlp_post" in role else m_out
    if pre is None or post is None or a_add is None or m_add is None:
        return {"norms": role, "residual": None}
    mlp_reads = ins.get(role["mlp"]) if "mlp" in role else m_in
    if close(mlp_reads, pre, probe.tol):
        residual = "parallel"
    elif close(mlp_reads, pre + a_add, probe.tol):
        residual = "pre_norm"
    else:
        residual = None
    if residual and not close(pre + a_add + m_add, post, probe.tol):
        residual = None
    return {
        "norms": role,
        "residual": residual,
        "attn_out": role.get("attn_post", attn),
        "mlp_out": role.get("mlp_post", mlp),
    }


def _final_norm(model: HFModule, probe: Probe, last_out: torch.Tensor | None) -> str | None:
    """The norm of the model body that reads the last layer's output."""
    body = _path_of(model, model.base_model) or ""
    for name, m in model.base_model.named_children():
        if _is_norm(m) and close(probe.ins.get(f"final:{name}"), last_out, probe.tol):
            return f"{body}.{name}" if body else name
    return None


@dataclass(frozen=True)
class _Skeleton:
    """What the names and the config say, before the probe confirms anything."""

    model_type: str
    n_layers_attr: str
    embed: str
    unembed: str
    layers_path: str
    layers: nn.ModuleList
    attn: str
    mlp: str
    proj: tuple[str, str, str, str]
    n_heads: int
    n_kv_heads: int
    d_head: int


def _skeleton(model: HFModule) -> _Skeleton:
    """The candidate modules of each role, by the names families use, or one refusal naming what was tried."""
    cfg = model.config
    mt = str(getattr(cfg, "model_type", "?"))
    found = _config_int(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    if found is None:
        raise _refuse(mt, "the config names no layer count", "num_hidden_layers, n_layer, num_layers")
    L = found[1]
    embed = _path_of(model, model.get_input_embeddings())
    head = model.get_output_embeddings()
    unembed = _path_of(model, head) if head is not None else None
    if not embed or not unembed:
        raise _refuse(mt, "no input or output embeddings", "get_input_embeddings, get_output_embeddings")
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == L]
    if not lists:
        raise _refuse(mt, f"no list of {L} layers", "every nn.ModuleList of the model")
    layers_path, layers = lists[0]
    attn, mlp = _first(layers[0], ATTN_NAMES), _first(layers[0], MLP_NAMES)
    if attn is None or mlp is None:
        raise _refuse(
            mt, "no attention or MLP module in a layer", f"{layers_path}.0.{{{','.join(ATTN_NAMES + MLP_NAMES)}}}"
        )
    proj = _projections(get_module(layers[0], attn))
    if proj is None:
        raise _refuse(
            mt,
            "no q/k/v/o projections in the attention module",
            f"{layers_path}.0.{attn}.{{{','.join(Q_NAMES + QKV_NAMES + O_NAMES)}}}",
        )
    heads = _config_int(cfg, "num_attention_heads", "n_head", "num_heads")
    if heads is None:
        raise _refuse(mt, "the config names no head count", "num_attention_heads, n_head, num_heads")
    H = heads[1]
    kv = _config_int(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv")
    d = _config_int(cfg, "head_dim")
    D = model.get_input_embeddings().weight.shape[1]
    return _Skeleton(
        mt,
        found[0],
        embed,
        unembed,
        layers_path,
        layers,
        attn,
        mlp,
        proj,
        H,
        1 if getattr(cfg, "multi_query", False) else (kv[1] if kv else H),
        d[1] if d else D // H,
    )


def _run_probe(model: HFModule, sk: _Skeleton) -> tuple[Probe, torch.Tensor]:
    """One forward pass over :data:`~.probe.PROBE_LEN` token ids with every position id 0 (rotation-free), recording the
    first and last layer, its attention, MLP and norms and the body's norms; returns the probe and the logits."""
    layer = sk.layers[0]
    watched = {
        "layer": layer,
        sk.attn: get_module(layer, sk.attn),
        sk.mlp: get_module(layer, sk.mlp),
        "last": sk.layers[len(sk.layers) - 1],
    }
    watched.update({n: m for n, m in layer.named_children() if _is_norm(m)})
    watched.update({f"final:{n}": m for n, m in model.base_model.named_children() if _is_norm(m)})
    probe = Probe(watched, PROBE_TOL.get(model.get_input_embeddings().weight.dtype, 1e-4))
    return probe, _forward(probe, model, sk.model_type)


def _forward(probe: Probe, model: HFModule, model_type: str) -> torch.Tensor:
    """The probe's forward pass over :data:`~.probe.PROBE_LEN` token ids, every position id 0 where the model takes
    position ids; its logits [T, V] in float64.  A failure of the model's own forward is one line
    (:func:`~.probe.own_forward`)."""
    ids = probe_ids(model)
    # an explicit mask: without one, transformers reads position ids that repeat 0 as packed sequences
    kw: dict[str, Any] = {"input_ids": ids, "use_cache": False, "attention_mask": torch.ones_like(ids)}

    def run() -> Any:
        try:
            return probe.run(model, **kw, position_ids=torch.zeros_like(ids))
        except TypeError:  # no position ids: the positions are not a rotation or a learned table of ids
            return probe.run(model, **kw)

    return own_forward(run, model_type).logits[0].double()


def _check_sum(probe: Probe, roles: Roles, l: int) -> None:
    """Layer ``l``'s input plus its attention and MLP contributions equals its output, else a refusal."""
    pre, a_out, m_out, post = (
        probe.ins.get(f"L{l}"),
        probe.outs.get(f"L{l}.a"),
        probe.outs.get(f"L{l}.m"),
        probe.outs.get(f"L{l}"),
    )
    if pre is None or a_out is None or m_out is None or post is None or not close(pre + a_out + m_out, post, probe.tol):
        raise _refuse(
            roles.model_type,
            f"layer {l}'s contributions do not add up to its output (the roles found on layer 0 do not hold there)",
            f"{roles.layers}.{l}",
        )


def _confirm_every_layer(roles: Roles, model: HFModule) -> Roles:
    """The roles found on layer 0, checked on every layer in a second probe: the contributions add up to the
    layer's output and the A.3 identity holds (else a refusal naming the layer); where the scores do not rebuild
    from W_q, W_k on some layer, ``qk_bilinear`` is declared broken with the layers named."""
    layers = cast(nn.ModuleList, get_module(model, roles.layers))
    watched: dict[str, nn.Module] = {}
    for l, layer in enumerate(layers):
        watched.update(
            {
                f"L{l}": layer,
                f"L{l}.attn": get_module(layer, roles.attn),
                f"L{l}.a": get_module(layer, roles.attn_out),
                f"L{l}.m": get_module(layer, roles.mlp_out),
            }
        )
    probe = Probe(watched, PROBE_TOL.get(model.get_input_embeddings().weight.dtype, 1e-4))
    _forward(probe, model, roles.model_type)
    weights, bad_scores = head_weights_from(roles), []
    for l in range(len(layers)):
        _check_sum(probe, roles, l)
        X, A, out = probe.ins.get(f"L{l}.attn"), probe.extra.get(f"L{l}.attn"), probe.outs.get(f"L{l}.attn")
        hw: HeadWeights | None = None
        try:
            hw = weights(watched[f"L{l}.attn"], model.config)
            ok = X is not None and A is not None and out is not None and identity_ok(hw, X[0], A[0], out[0], probe.tol)
        except (RuntimeError, ValueError):
            ok = False
        if not ok or hw is None or X is None or A is None:  # (ok: hw, X and A are set)
            sinks = A is not None and not rows_sum_to_one(A[0], probe.tol)
            raise _refuse(
                roles.model_type,
                f"the A.3 identity fails on layer {l}"
                + (" (its attention rows do not sum to 1: attention sinks)" if sinks else ""),
                f"{roles.layers}.{l}.{roles.attn}",
            )
        norms = qk_norms(watched[f"L{l}.attn"]) if roles.qk_norm else (None, None)
        if (
            "qk_rebuild" not in roles.limits
            and scores_error(hw, X[0], A[0], *norms, softcap=score_softcap(model.config)) > probe.tol
        ):
            bad_scores.append(l)
    if not bad_scores:
        return roles
    why = (
        f"the attention scores rebuilt from W_q, W_k at position 0 (with the model's q/k norms and soft-cap) "
        f"differ from the model's on layers {bad_scores}: a position term or score transform walklens does not know"
    )
    return replace(roles, limits={"qk_bilinear": why, **roles.limits, "qk_rebuild": why})


def static_roles(model: HFModule) -> dict[str, Any]:
    """The fields of :class:`Roles` that the module names and the config give without a probe (all but the
    norms, their outputs, the final norm, the residual kind, a fused layout and the limits); one refusal naming
    what was tried when the names are not there."""
    return _static(model, _skeleton(model))


def _static(model: HFModule, sk: _Skeleton) -> dict[str, Any]:
    cfg = model.config
    attn_mod = get_module(sk.layers[0], sk.attn)
    q, k, v, o = sk.proj
    softcap = "final_logit_softcapping" if getattr(cfg, "final_logit_softcapping", None) else None
    scale = next(
        (
            (a, how)
            for a, how in LOGIT_SCALES
            if isinstance(getattr(cfg, a, None), (int, float)) and getattr(cfg, a) not in (1, 1.0)
        ),
        None,
    )
    acts = ("hidden_act", "hidden_activation", "activation_function")
    return dict(
        model_type=sk.model_type,
        embed=sk.embed,
        unembed=sk.unembed,
        layers=sk.layers_path,
        attn=sk.attn,
        mlp=sk.mlp,
        position=_position(model, cfg),
        q=q,
        k=k,
        v=v,
        o=o,
        conv1d=_is_conv1d(attn_mod, o),
        n_heads=sk.n_heads,
        n_kv_heads=sk.n_kv_heads,
        d_head=sk.d_head,
        scale=float(getattr(attn_mod, "scaling", None) or 1 / math.sqrt(sk.d_head)),
        n_layers_attr=sk.n_layers_attr,
        act_attr=next((a for a in acts if isinstance(getattr(cfg, a, None), str)), "hidden_act"),
        qk_norm=any(has_module(attn_mod, n) for n in QK_NORM_NAMES),
        act_module=_first(get_module(sk.layers[0], sk.mlp), ACT_NAMES),
        softcap_attr=softcap,
        logit_scale=scale,
    )


def derive_roles(model: HFModule) -> Roles:
    """Find and confirm the roles of a causal LM (see the module docstring), or refuse in one line."""
    sk = _skeleton(model)
    probe, logits = _run_probe(model, sk)
    lr = _layer_roles(probe, sk.layers[0], sk.attn, sk.mlp)
    if lr["residual"] is None:
        raise _refuse(
            sk.model_type,
            "the layer's contributions do not add up to its output (resid_pre + attn_out + "
            "mlp_out != resid_post for every norm placement tried)",
            f"{sk.layers_path}.0.{{{sk.attn},{sk.mlp}}} with norms {sorted(lr['norms'].values()) or 'none'}",
        )
    static = _static(model, sk)
    roles = Roles(
        **static,
        attn_out=lr["attn_out"],
        mlp_out=lr["mlp_out"],
        final_norm=_final_norm(model, probe, probe.outs.get("last")),
        norms=lr["norms"],
        residual=lr["residual"],
        layout="blocks" if static["k"] == "" else "separate",
    )
    roles = _logit_roles(roles, model, probe, logits)
    return _confirm_every_layer(_attention_roles(roles, model, probe), model)


def _projections(attn: nn.Module) -> tuple[str, str, str, str] | None:
    """(q, k, v, o) child names; a fused projection is (qkv, "", "", o)."""
    o = _first(attn, O_NAMES)
    q, k, v = _first(attn, Q_NAMES), _first(attn, K_NAMES), _first(attn, V_NAMES)
    if q and k and v and o:
        return q, k, v, o
    fused = _first(attn, QKV_NAMES)
    if fused and o:
        return fused, "", "", o
    return None


def _is_conv1d(attn: nn.Module, o: str) -> bool:
    return type(get_module(attn, o)).__name__ == "Conv1D"


def _position(model: nn.Module, cfg: Any) -> Position:
    if getattr(cfg, "alibi", False) or any("alibi" in n for n, _ in model.named_buffers()):
        return "alibi"
    if (
        any("rotary" in n or "rope" in n for n, _ in model.named_modules())
        or getattr(cfg, "rope_theta", None)
        or getattr(cfg, "rope_parameters", None)
    ):
        return "rotary"
    if any(n.split(".")[-1] in ("wpe", "embed_positions", "position_embeddings") for n, _ in model.named_modules()):
        return "learned"
    return "none"


def _logit_roles(roles: Roles, model: HFModule, probe: Probe, logits: torch.Tensor) -> Roles:
    """Soft-cap and logit scale from the config (:func:`static_roles`), confirmed: logits rebuilt from ``final``
    equal the model's."""
    softcap, scale = roles.softcap_attr, roles.logit_scale
    if roles.final_norm is None:
        raise _refuse(
            roles.model_type, "no final norm reads the last layer's output", "the norm modules of the model body"
        )
    final = probe.outs.get(f"final:{roles.final_norm.rsplit('.', 1)[-1]}")
    with torch.no_grad():
        rebuilt = logits_fn(roles)(model, final).double() if final is not None else None
    if rebuilt is None or not close(rebuilt[0], logits, probe.tol):
        err = float((rebuilt[0] - logits).abs().max()) if rebuilt is not None else float("nan")
        raise _refuse(
            roles.model_type,
            f"the logits recomputed from the final norm's output differ from the "
            f"model's (max |dlogit| {err:.3g}): an unknown logit scale or cap",
            f"{roles.final_norm} -> {roles.unembed}, soft-cap {softcap}, scale {scale}",
        )
    limits = dict(roles.limits)
    if softcap or scale:
        how = " and ".join(([f"scaled by {scale[0]}"] if scale else []) + (["soft-capped"] if softcap else []))
        limits["logit_linear"] = f"logits are {how} (applied exactly by the logit lens)"
    return replace(roles, limits=limits)


def _attention_roles(roles: Roles, model: HFModule, probe: Probe) -> Roles:
    """The fused layout (if any) under which the A.3 identity holds, and whether scores rebuild from W_q, W_k."""
    A = probe.extra.get(roles.attn)
    X, out = probe.ins.get(roles.attn), probe.outs.get(roles.attn)
    attn_mod = get_module(layer_at(model, roles.layers, 0), roles.attn)
    if A is None or X is None or out is None:
        raise _refuse(
            roles.model_type,
            "the attention module returns no attention probabilities (eager)",
            f"{roles.layers}.0.{roles.attn}",
        )
    layouts = ("separate",) if roles.layout == "separate" else LAYOUTS
    tried = []
    for layout in layouts:
        cand = replace(roles, layout=layout)
        try:
            hw = head_weights_from(cand)(attn_mod, model.config)
        except (RuntimeError, ValueError):
            tried.append(f"{layout} (shapes)")
            continue
        if not identity_ok(hw, X[0], A[0], out[0], probe.tol):
            tried.append(layout)
            continue
        limits = dict(cand.limits)
        cfg = model.config
        if getattr(cfg, "use_sliding_window", True) is not False:
            limits.update(sliding_window_limit(cfg))
        mlp = get_module(layer_at(model, roles.layers, 0), roles.mlp)
        if has_module(mlp, "experts") or any(w in type(mlp).__name__.lower() for w in ("moe", "sparse", "expert")):
            limits["dense_mlp"] = "the MLP is a mixture of experts: its point is the routed sum of the experts' outputs"
        if getattr(cfg, "attn_logit_softcapping", None):
            limits["qk_bilinear"] = "attention scores are soft-capped (tanh) before the softmax"
        elif cand.qk_norm:
            limits["qk_bilinear"] = "q and k are normalised before the dot product"
        return replace(cand, limits=limits)  # scores: checked on every layer by _confirm_every_layer
    sinks = "" if rows_sum_to_one(A[0], probe.tol) else " (its attention rows do not sum to 1: attention sinks)"
    raise _refuse(
        roles.model_type,
        f"the A.3 identity fails (the attention output is not sum_h A_h X W_vo,h + b) for every per-head layout{sinks}",
        f"{roles.attn}: {', '.join(tried)}",
    )


def derive_adapter(model: nn.Module) -> Adapter:
    """:func:`derive_roles` then :func:`build_adapter`."""
    return build_adapter(derive_roles(model))


__all__ = ["derive_adapter", "derive_roles", "static_roles"]
