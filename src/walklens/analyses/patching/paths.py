"""Path patching: one sender's change reaches chosen receivers and nothing else (Wang et al. 2022, "Interpretability
in the Wild", sec. 3.1; Goldowsky-Dill et al. 2023, "Localizing Model Behavior with Path Patching").

The sender is a head (its A.3 contribution ``z_h W_o,h``) or a sublayer (``attn_out``, ``mlp_out``) at layer s; a
receiver is the residual stream entering layer r > s, or one head's query, key or value input at layer r.  Because the
residual stream is a sum, the path s -> r alone is the patched run's stored input of layer r plus the sender's change
``delta = out_source - out_base`` at one position: every layer between s and r keeps the patched run's values (it never
sees the change), layers r..L-1 see it; each such cell runs from layer r (:func:`walklens.core.patching.start_at`).  A
head receiver computes its q, k or v from the layer's input plus the change, through the layer's attention norm and the
model's own projection; every other reader of that input sees it unchanged.  Post-norm families are refused (their
sublayer outputs are not summands of the residual).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...base.errors import InputError
from ...core.patching import Site, head_input, parse_site, record, run_logits, start_at
from .exact import make_result, setup
from .metrics import Metric
from .result import PatchResult

if TYPE_CHECKING:
    from ...core.loading import LoadedModel
    from ...core.patching import Recorded

_HEAD_INPUT = re.compile(r"^L(\d+)\.H(\d+)\.(q|k|v)$")


@dataclass(frozen=True)
class Receiver:
    """The residual entering layer ``layer`` (``which`` None) or one head's query, key or value there."""

    name: str
    layer: int
    head: int | None = None
    which: str | None = None


def _receiver(lm: LoadedModel, name: str, sender: Site) -> Receiver:
    m = _HEAD_INPUT.match(name.strip())
    if m is not None:
        layer, head, which = int(m.group(1)), int(m.group(2)), m.group(3)
        parse_site(lm, f"L{layer}.H{head}")  # the layer and head in range
        rec = Receiver(name.strip(), layer, head, which)
    else:
        site = parse_site(lm, name)
        if site.kind != "resid_pre":
            raise InputError(f"receiver {name}: give L<r>.resid_pre (the residual entering layer r) or L<r>.H<h>.q|k|v")
        rec = Receiver(site.name, site.layer)
    if rec.layer <= sender.layer:
        raise InputError(f"receiver {name}: it must come after the sender {sender.name}")
    return rec


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
    (``L{r}.resid_pre``: the residual entering layer r > s; ``L{r}.H{h}.q|k|v``: one head's query, key or value input
    there, :func:`walklens.core.patching.head_input`), one position of the sender's change at a time: a [receivers x
    positions] grid, normalised like :func:`~.exact.patch` (clean 1, corrupted 0).  Prompts must have the same token
    count.  With grouped-query attention a key or value receiver is its key/value head, shared by the group."""
    if lm.adapter.residual_kind(lm.config) == "post_norm":
        raise InputError("path patching needs sublayer outputs that add to the residual stream: not a post-norm model")
    s = setup(lm, clean, corrupted, points=[sender], positions=positions, metric=metric, direction=direction)
    snd = s.sites[0]
    if snd.kind not in ("head", "attn_out", "mlp_out"):
        raise InputError(f"sender {sender}: give a head (L<s>.H<h>), L<s>.attn_out or L<s>.mlp_out")
    recs = [_receiver(lm, r, snd) for r in receivers]
    rec_clean = record(lm, s.clean_ids, [snd], -1)
    rec_corr = record(lm, s.corrupted_ids, [snd], -1)
    m_clean = s.metric.value(rec_clean.logits, rec_clean.logits)
    m_corr = s.metric.value(rec_corr.logits, rec_clean.logits)
    if m_clean == m_corr:
        raise InputError(f"clean and corrupted both score {m_clean:.6g} on {s.metric.name}: nothing to normalise")
    base, source = s.base_and_source(rec_clean, rec_corr)
    delta = sender_delta(lm, snd, source, base)
    raw = np.full((len(recs), len(s.positions)), np.nan)
    for i, rc in enumerate(recs):
        rows = torch.zeros(len(s.positions), *base.resid_pre[rc.layer].shape, dtype=base.resid_pre[rc.layer].dtype)
        for j, p in enumerate(s.positions):
            rows[j, p] = delta[p].to(rows.dtype)
        ids = s.base_ids.expand(len(s.positions), -1)
        if rc.which is None:  # the residual: the stored input plus the change, run from layer r
            with start_at(lm, rc.layer, base.resid_pre[rc.layer] + rows):
                logits = run_logits(lm, ids, -1)
        else:  # one head's q, k or v reads input + change; the whole pass runs (layers < r see no change)
            assert rc.head is not None
            with head_input(lm, rc.layer, rc.which, rc.head, rows):
                logits = run_logits(lm, ids, -1)
        raw[i] = [s.metric.value(row, rec_clean.logits) for row in logits]
    layers = [rc.layer for rc in recs]
    s.sites = [Site(rc.layer, "resid_pre") for rc in recs]
    result = make_result(s, raw, m_clean, m_corr, "path", len(layers), float(sum(lm.n_layers - r for r in layers)))
    result.points[:] = [rc.name for rc in recs]
    result.notes.append(f"sender {snd.name} -> each receiver alone; the sender's change at one position per cell")
    return dataclasses.replace(result, sender=snd.name)


__all__ = ["path_patch", "sender_delta", "Receiver"]
