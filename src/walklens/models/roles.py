"""The roles of a derived adapter (:class:`Roles`: where each part of one causal LM lives, found by
:mod:`.derive`) and the declarative :class:`~.base.Adapter` they describe: per-head weights (a fused q/k/v
projection split by its layout), logits with the config's scale and soft-cap, the MLP activation, and the roles
rendered as a reviewable adapter file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
from torch import nn

from .base import Adapter, HeadWeights, Position, Residual, StackSpec, act_from_config, get_module, lm_head_logits
from .heads import attention_heads


@dataclass(frozen=True)
class Roles:
    """Where each part of one causal LM lives (paths below the model root, or below one layer for the
    per-layer fields), and how its attention weights are laid out.  Everything a derived adapter knows."""

    model_type: str
    embed: str
    unembed: str
    layers: str
    attn: str
    mlp: str
    attn_out: str
    mlp_out: str
    final_norm: str | None
    norms: dict[str, str]
    residual: Residual
    position: Position
    q: str
    k: str
    v: str
    o: str
    layout: str  # "separate" or one of heads.LAYOUTS (a fused projection named ``q``)
    conv1d: bool  # weights stored [in, out] (GPT-2's Conv1D)
    n_heads: int
    n_kv_heads: int
    d_head: int
    scale: float
    n_layers_attr: str
    act_attr: str = "hidden_act"
    act_module: str | None = None  # the MLP's own activation module (below ``mlp``), used when it exists
    softcap_attr: str | None = None
    logit_scale: tuple[str, str] | None = None
    qk_norm: bool = False
    limits: dict[str, str] = field(default_factory=dict)


# ---- per-head weights and logits from the roles ----------------------------------------------------------------


def head_weights_from(roles: Roles) -> Callable[[nn.Module, Any], HeadWeights]:
    """The adapter's ``head_weights_fn`` for these roles (:func:`~.heads.attention_heads`)."""
    qkv = (roles.q, roles.k, roles.v) if roles.layout == "separate" else roles.q
    notes = "derived adapter" + ("; q/k normalised: W_qk is a direction summary" if roles.qk_norm else "")

    def fn(attn: nn.Module, config: Any) -> HeadWeights:
        return attention_heads(
            attn,
            qkv,
            roles.o,
            roles.n_heads,
            roles.d_head,
            roles.scale,
            n_kv=roles.n_kv_heads,
            layout=roles.layout,
            conv1d=roles.conv1d,
            qk_norm=roles.qk_norm,
            notes=notes,
            rope=config if roles.position == "rotary" else None,
        )

    return fn


def logits_fn(roles: Roles) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """The head, then the config's logit scale (multiplied or divided), then its soft-cap."""
    return lm_head_logits(roles.unembed, softcap_attr=roles.softcap_attr, scale=roles.logit_scale)


def _activation(roles: Roles) -> Callable[[nn.Module, int], Callable[[torch.Tensor], torch.Tensor]]:
    """The MLP activation of a layer: the model's own module where the MLP has one (a learned activation such as
    xIELU keeps its parameters), else the config's function."""
    if roles.act_module is None:
        return act_from_config(roles.act_attr)
    act = roles.act_module

    def fn(model: nn.Module, layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
        return get_module(layer_at(model, roles.layers, layer), f"{roles.mlp}.{act}")

    return fn


def build_adapter(roles: Roles, family: str | None = None) -> Adapter:
    """The declarative :class:`Adapter` these roles describe; ``family`` defaults to ``"derived:<model_type>"``
    (a reviewed file kept in ``models/`` names the family itself).  ``harness_bos`` follows
    lm-evaluation-harness's own rule, which prefixes BOS when the model type contains "gemma"."""
    spec = StackSpec(
        name="",
        layers=roles.layers,
        attn=roles.attn,
        attn_out=roles.attn_out,
        mlp_out=roles.mlp_out,
        final_norm=roles.final_norm,
        norms=dict(roles.norms),
        attn_proj=roles.attn if roles.attn_out != roles.attn else None,
    )
    attr = roles.n_layers_attr
    return Adapter(
        family=family or f"derived:{roles.model_type}",
        model_types=(roles.model_type,),
        auto_class="causal",
        embed=roles.embed,
        stacks=(spec,),
        position=roles.position,
        residual=roles.residual,
        head_weights_fn=head_weights_from(roles),
        logits_fn=logits_fn(roles),
        n_layers_fn=lambda c: getattr(c, attr),
        mlp_act_fn=_activation(roles),
        unembed=roles.unembed,
        limits=dict(roles.limits),
        harness_bos="gemma" in roles.model_type,
    )


def render(roles: Roles) -> str:
    """The roles as a reviewable adapter file for ``src/walklens/models/`` (``walklens adapter --write``)."""
    fields = ",\n".join(f"    {k}={v!r}" for k, v in asdict(roles).items())
    return (
        f'"""{roles.model_type}: an adapter derived by walklens from the module tree and confirmed by its '
        f"parity checks\n(`walklens verify`).  Review the roles, then keep this file as the family's "
        f'adapter."""\n\nfrom __future__ import annotations\n\nfrom .roles import Roles, build_adapter\n\n'
        f"ROLES = Roles(\n{fields},\n)\n\nADAPTER = build_adapter(ROLES, family={roles.model_type!r})\n"
    )


def layer_at(model: nn.Module, layers: str, i: int) -> nn.Module:
    """Layer ``i`` of the layer list at the path ``layers``."""
    return cast(nn.ModuleList, get_module(model, layers))[i]


__all__ = ["Roles", "build_adapter", "head_weights_from", "layer_at", "logits_fn", "render"]
