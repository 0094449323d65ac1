"""Per-head attention weights (:class:`~.base.HeadWeights`, row convention) read from a family's projections.

One reading serves every adapter and every derived adapter (:mod:`.roles`): the q, k and v projections are
separate modules or one fused module whose output rows follow a :data:`Layout`; each is split into heads,
transposed to the row convention (``x @ W``), and the output projection is split by its input columns.  Only
indexing, transposes and copies happen here: the weights are the model's own, bit for bit.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from .base import HeadWeights, HFModule, fold_rope_factor, get_module, partial_rotary

#: How a fused q/k/v projection lays out its output rows: ``blocks`` [q (H d) | k (H_kv d) | v (H_kv d)] (GPT-2,
#: MPT, Phi-3, multi-query Falcon and GPT-BigCode); ``per_head`` [q_h | k_h | v_h] head by head (GPT-NeoX, BLOOM,
#: Falcon); ``grouped`` [q ... q | k | v] per key/value group (Falcon's new decoder architecture).
Layout = Literal["blocks", "per_head", "grouped"]
LAYOUTS: tuple[Layout, ...] = ("blocks", "per_head", "grouped")
#: The q, k and v projections of most families (Llama's names).
QKV_PROJ = ("q_proj", "k_proj", "v_proj")
#: One projection split into heads: weight [n, d, D] (output rows of each head) and bias [n, d].
Split = tuple[torch.Tensor, torch.Tensor]


def zeros_or(bias: torch.Tensor | None, *shape: int, like: torch.Tensor) -> torch.Tensor:
    """``bias`` reshaped to ``shape``, or zeros of that shape (and of ``like``'s dtype and device) when None."""
    if bias is None:
        return torch.zeros(*shape, dtype=like.dtype, device=like.device)
    return bias.detach().reshape(*shape)


def rows(proj: HFModule, conv1d: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A projection's weight as output rows [out, in] (nn.Linear's layout; GPT-2's Conv1D, stored [in, out], is
    transposed when ``conv1d``) and its bias [out] (zeros where it has none)."""
    w = proj.weight.detach()
    w = w.t() if conv1d else w
    return w, zeros_or(getattr(proj, "bias", None), w.shape[0], like=w)


def split_rows(w: torch.Tensor, b: torch.Tensor, n: int, d: int) -> Split:
    """Output rows [n d, D] of one projection (or one block of a fused one) and their bias [n d] as n heads."""
    return w.reshape(n, d, w.shape[1]), b.reshape(n, d)


def split_fused(w: torch.Tensor, b: torch.Tensor, layout: str, H: int, H_kv: int, d: int) -> tuple[Split, Split, Split]:
    """A fused q/k/v weight [out, D] and bias [out] as the q, k and v heads, read by ``layout`` (:data:`Layout`)."""
    D = w.shape[1]
    if layout == "blocks":
        sizes = (H * d, H_kv * d, H_kv * d)
        q, k, v = (split_rows(wi, bi, n, d) for wi, bi, n in zip(w.split(sizes), b.split(sizes), (H, H_kv, H_kv)))
        return q, k, v
    if layout == "per_head":
        if H != H_kv:
            raise ValueError("per-head layout needs as many key/value heads as query heads")
        wr, br = w.reshape(H, 3, d, D), b.reshape(H, 3, d)
        return (wr[:, 0], br[:, 0]), (wr[:, 1], br[:, 1]), (wr[:, 2], br[:, 2])
    if layout == "grouped":
        g = H // H_kv
        wr, br = w.reshape(H_kv, g + 2, d, D), b.reshape(H_kv, g + 2, d)
        return (wr[:, :g].reshape(H, d, D), br[:, :g].reshape(H, d)), (wr[:, g], br[:, g]), (wr[:, g + 1], br[:, g + 1])
    raise ValueError(f"unknown layout {layout!r}")


def from_splits(
    q: Split,
    k: Split,
    v: Split,
    out: tuple[torch.Tensor, torch.Tensor],
    scale: float,
    *,
    qk_norm: bool = False,
    notes: str = "",
    rope: Any = None,
) -> HeadWeights:
    """The heads of q, k and v (:data:`Split`) and of the output projection's rows [D, H d] and bias [D], with
    query head h reading key/value head ``h // (H / H_kv)``; ``rope``: a config whose rotary cos/sin factor is
    folded in (:func:`~.base.fold_rope_factor`)."""
    (w_q, b_q), (w_k, b_k), (w_v, b_v) = ((w.transpose(1, 2).contiguous(), b.contiguous()) for w, b in (q, k, v))
    H, d = w_q.shape[0], w_q.shape[2]
    w_o = out[0].t().reshape(H, d, out[0].shape[0]).contiguous()
    group = H // w_k.shape[0]
    kv_head = tuple(h // group for h in range(H))
    hw = HeadWeights(w_q, w_k, w_v, w_o, b_q, b_k, b_v, out[1], kv_head, float(scale), qk_norm=qk_norm, notes=notes)
    return fold_rope_factor(hw, rope) if rope is not None else hw


def attention_heads(
    attn: HFModule,
    qkv: str | tuple[str, str, str],
    out: str,
    n_heads: int,
    d_head: int,
    scale: float | None = None,
    *,
    n_kv: int | None = None,
    layout: str = "blocks",
    conv1d: bool = False,
    qk_norm: bool = False,
    notes: str = "",
    rope: Any = None,
) -> HeadWeights:
    """Per-head weights of the attention module ``attn``: ``qkv`` names its q, k and v projections (paths below
    ``attn``), or one fused projection laid out as ``layout``; ``out`` names the output projection.  ``scale``:
    by default 1/sqrt(d_head); ``n_kv``: the key/value heads (grouped-query attention; default ``n_heads``);
    ``conv1d``: weights stored [in, out]."""
    H, H_kv = n_heads, n_heads if n_kv is None else n_kv
    if isinstance(qkv, str):
        q, k, v = split_fused(*rows(get_module(attn, qkv), conv1d), layout, H, H_kv, d_head)
    else:
        q, k, v = (split_rows(*rows(get_module(attn, p), conv1d), n, d_head) for p, n in zip(qkv, (H, H_kv, H_kv)))
    o = rows(get_module(attn, out), conv1d)
    scale = 1.0 / math.sqrt(d_head) if scale is None else scale
    return from_splits(q, k, v, o, scale, qk_norm=qk_norm, notes=notes, rope=rope)


def config_heads(
    attn: HFModule, config: Any, out: str = "o_proj", *, qk_norm: bool = False, notes: str = ""
) -> HeadWeights:
    """The attention of most current families: separate ``q_proj``, ``k_proj``, ``v_proj`` and the output
    projection ``out``, head counts and size from the config (``num_attention_heads``, ``num_key_value_heads``,
    ``head_dim``), the module's own ``scaling``, and the rope scaling's cos/sin factor folded in."""
    H = config.num_attention_heads
    H_kv = getattr(config, "num_key_value_heads", None) or H
    d = getattr(config, "head_dim", None) or config.hidden_size // H
    return attention_heads(
        attn, QKV_PROJ, out, H, d, attn.scaling, n_kv=H_kv, qk_norm=qk_norm, notes=notes, rope=config
    )


def qk_norm_note(how: str) -> str:
    """The note of a family that normalises q and k (``how``: "RMS-normalised per head", ...) before q·k."""
    return f"q and k are {how} before the dot product, so W_qk is only a direction-level summary; W_vo is exact"


def rotary_note(config: Any) -> str:
    """The note of a family with rotary positions on part of each head (:func:`~.base.partial_rotary`)."""
    return f"rotary on the first {partial_rotary(config):.0%} of each head: W_qk is the position-0 (no rotation) form"


__all__ = [
    "LAYOUTS",
    "QKV_PROJ",
    "Layout",
    "attention_heads",
    "config_heads",
    "from_splits",
    "qk_norm_note",
    "rotary_note",
    "rows",
    "split_fused",
    "split_rows",
    "zeros_or",
]
