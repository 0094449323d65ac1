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

from .base import (
    Adapter,
    HeadWeights,
    HFModule,
    Position,
    Residual,
    StackSpec,
    act_from_config,
    fold_rope_factor,
    get_module,
    lm_head_logits,
    zeros_or,
)


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
    layout: str  # "separate" or one of LAYOUTS (a fused projection named ``q``)
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


# ---- per-head weights from the roles ---------------------------------------------------------------------------


def _weight(lin: HFModule, conv1d: bool) -> torch.Tensor:
    """A projection's weight (of an nn.Linear, or of GPT-2's Conv1D when ``conv1d``) as [out, in] (nn.Linear's
    layout)."""
    w = lin.weight.detach()
    return w.t() if conv1d else w


def split_fused(w: torch.Tensor, b: torch.Tensor, layout: str, H: int, H_kv: int, d: int) -> list[torch.Tensor]:
    """Split a fused q/k/v weight [out, D] and bias [out] into q, k, v rows ([n, d, D] and [n, d] each).

    ``blocks``: [q | k | v] (Phi-3, GPT-2, GPT-BigCode); ``per_head``: [q_h | k_h | v_h] per head (GPT-NeoX,
    BLOOM); ``grouped``: per key/value group [q ... q | k | v] (Falcon's new decoder architecture)."""
    D = w.shape[1]
    if layout == "blocks":
        sizes = (H * d, H_kv * d, H_kv * d)
        ws, bs = w.split(sizes), b.split(sizes)
        return [t.reshape(-1, d, D) for t in ws] + [t.reshape(-1, d) for t in bs]
    if layout == "per_head":
        if H != H_kv:
            raise ValueError("per-head layout needs as many key/value heads as query heads")
        wr, br = w.reshape(H, 3, d, D), b.reshape(H, 3, d)
        return [wr[:, 0], wr[:, 1], wr[:, 2], br[:, 0], br[:, 1], br[:, 2]]
    if layout == "grouped":
        g = H // H_kv
        wr, br = w.reshape(H_kv, g + 2, d, D), b.reshape(H_kv, g + 2, d)
        return [wr[:, :g].reshape(H, d, D), wr[:, g], wr[:, g + 1], br[:, :g].reshape(H, d), br[:, g], br[:, g + 1]]
    raise ValueError(f"unknown layout {layout!r}")


def head_weights_from(roles: Roles) -> Callable[[nn.Module, Any], HeadWeights]:
    """The adapter's ``head_weights_fn`` for these roles."""
    H, H_kv, d = roles.n_heads, roles.n_kv_heads, roles.d_head

    def fn(attn: nn.Module, _config: Any) -> HeadWeights:
        def wb(path: str) -> tuple[torch.Tensor, torch.Tensor]:
            lin = get_module(attn, path)
            w = _weight(lin, roles.conv1d)
            return w, zeros_or(getattr(lin, "bias", None), w.shape[0], like=w)

        if roles.layout == "separate":
            (wq, bq), (wk, bk), (wv, bv) = wb(roles.q), wb(roles.k), wb(roles.v)
            qkv = [
                wq.reshape(H, d, -1),
                wk.reshape(H_kv, d, -1),
                wv.reshape(H_kv, d, -1),
                bq.reshape(H, d),
                bk.reshape(H_kv, d),
                bv.reshape(H_kv, d),
            ]
        else:
            qkv = split_fused(*wb(roles.q), roles.layout, H, H_kv, d)
        w_q, w_k, w_v = (t.transpose(1, 2).contiguous() for t in qkv[:3])
        wo, bo = wb(roles.o)  # [D, H*d]
        w_o = wo.t().reshape(H, d, -1).contiguous()
        group = H // H_kv
        hw = HeadWeights(
            w_q,
            w_k,
            w_v,
            w_o,
            qkv[3].contiguous(),
            qkv[4].contiguous(),
            qkv[5].contiguous(),
            bo,
            tuple(h // group for h in range(H)),
            roles.scale,
            qk_norm=roles.qk_norm,
            notes="derived adapter" + ("; q/k normalised: W_qk is a direction summary" if roles.qk_norm else ""),
        )
        return fold_rope_factor(hw, _config) if roles.position == "rotary" else hw

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


__all__ = ["Roles", "build_adapter", "head_weights_from", "layer_at", "logits_fn", "render", "split_fused"]
