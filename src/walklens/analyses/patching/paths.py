"""Path patching to the residual stream: one sender's change reaches chosen receivers and nothing else (Wang et al.
2022, "Interpretability in the Wild", sec. 3.1; Goldowsky-Dill et al. 2023, "Localizing Model Behavior with Path
Patching").

The sender is a head (its A.3 contribution ``z_h W_o,h``) or a sublayer (``attn_out``, ``mlp_out``) at layer s; a
receiver is the residual stream entering layer r > s.  Because the residual stream is a sum, the path s -> r alone is
the patched run's stored input of layer r plus the sender's change ``delta = out_source - out_base`` at one position:
every layer between s and r keeps the patched run's values (it never sees the change), layers r..L-1 see it.  Each cell
runs from layer r (:func:`walklens.core.patching.start_at`).  Receivers' queries, keys or values (one head's input
only) are not built yet; post-norm families are refused (their sublayer outputs are not summands of the residual).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...base.errors import InputError
from ...core.patching import Site, parse_site, record, run_logits, start_at
from .exact import make_result, setup
from .metrics import Metric
from .result import PatchResult

if TYPE_CHECKING:
    from ...core.loading import LoadedModel
    from ...core.patching import Recorded


def _receiver_layer(lm: LoadedModel, name: str, sender: Site) -> int:
    site = parse_site(lm, name)
    if site.kind != "resid_pre":
        raise InputError(f"receiver {name}: path patching reaches the residual entering a layer (L<r>.resid_pre)")
    if site.layer <= sender.layer:
        raise InputError(f"receiver {name}: it must come after the sender {sender.name}")
    return site.layer


def sender_delta(lm: LoadedModel, sender: Site, source: Recorded, base: Recorded) -> torch.Tensor:
    """The sender's change of the residual stream [T, D]: a head's ``(z_src - z_base) W_o,h`` (A.3), or a sublayer's
    output difference."""
    if sender.kind == "head":
        assert sender.head is not None
        hw = lm.head_weights(sender.layer)
        d = hw.d_head
        key = f"L{sender.layer}.heads"
        cols = slice(sender.head * d, (sender.head + 1) * d)
        dz = source.vectors[key][:, cols] - base.vectors[key][:, cols]
        return dz @ hw.w_o[sender.head].to(dz.dtype)
    return source.vectors[sender.name] - base.vectors[sender.name]


@torch.no_grad()
def path_patch(
    lm: LoadedModel,
    clean: str | Sequence[int] | torch.Tensor,
    corrupted: str | Sequence[int] | torch.Tensor,
    *,
    sender: str,
    receivers: Sequence[str],
    positions: Sequence[int] | None = None,
    metric: str | Metric | Callable[..., Any] = "kl",
    direction: str = "denoise",
) -> PatchResult:
    """Path patching from ``sender`` (``L{s}.H{h}``, ``L{s}.attn_out`` or ``L{s}.mlp_out``) to each receiver
    (``L{r}.resid_pre``, r > s), one position of the sender's change at a time: a [receivers x positions] grid,
    normalised like :func:`~.exact.patch` (clean 1, corrupted 0).  Prompts must have the same token count."""
    if lm.adapter.residual_kind(lm.config) == "post_norm":
        raise InputError("path patching needs sublayer outputs that add to the residual stream: not a post-norm model")
    s = setup(
        lm,
        clean,
        corrupted,
        points=[sender],
        positions=positions,
        metric=metric,
        direction=direction,
        position_map=None,
    )
    snd = s.sites[0]
    if snd.kind not in ("head", "attn_out", "mlp_out"):
        raise InputError(f"sender {sender}: give a head (L<s>.H<h>), L<s>.attn_out or L<s>.mlp_out")
    layers = [_receiver_layer(lm, r, snd) for r in receivers]
    rec_clean = record(lm, s.clean_ids, [snd], -1)
    rec_corr = record(lm, s.corrupted_ids, [snd], -1)
    m_clean = s.metric.value(rec_clean.logits, rec_clean.logits)
    m_corr = s.metric.value(rec_corr.logits, rec_clean.logits)
    if m_clean == m_corr:
        raise InputError(f"clean and corrupted both score {m_clean:.6g} on {s.metric.name}: nothing to normalise")
    base, source = s.base_and_source(rec_clean, rec_corr)
    delta = sender_delta(lm, snd, source, base)
    raw = np.full((len(layers), len(s.positions)), np.nan)
    for i, r in enumerate(layers):
        resid = base.resid_pre[r].expand(len(s.positions), -1, -1).clone()
        for j, p in enumerate(s.positions):
            resid[j, p] = resid[j, p] + delta[p].to(resid.dtype)
        with start_at(lm, r, resid):
            logits = run_logits(lm, s.base_ids.expand(len(s.positions), -1), -1)
        raw[i] = [s.metric.value(row, rec_clean.logits) for row in logits]
    s.sites = [Site(r, "resid_pre") for r in layers]
    result = make_result(s, raw, m_clean, m_corr, "path", len(layers), float(sum(lm.n_layers - r for r in layers)))
    result.notes.append(f"sender {snd.name} -> each receiver's residual; the sender's change at one position per cell")
    return result


__all__ = ["path_patch", "sender_delta"]
