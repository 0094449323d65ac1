"""The similarity-map report (``walklens simmap``; seed 000, Figs. 3, 11, 12) and its JSON document: the inner
product or cosine between every pair of positions at a captured point.  Nothing here runs a model."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .html import Report, block_labels, block_mean, pyplot, show


def key(point: str, metric: str, normed: bool = False) -> str:
    """The name of one map in :func:`document` and the report: ``"point/metric"``, ``"point+norm/metric"`` with
    the final norm applied first."""
    return f"{point}{'+norm' if normed else ''}/{metric}"


def document(
    maps: Mapping[str, torch.Tensor], tokens: Sequence[str], token_ids: torch.Tensor, model: str, text: str
) -> dict[str, Any]:
    """The ``--json`` document: every value of every map (never block means); ``maps`` is keyed by :func:`key`.
    The explorer's similarity view sends it too, its one map reduced by blocks of positions when large."""
    return {"model": model, "text": text, "tokens": tokens, "token_ids": token_ids, "maps": maps}


def view_document(maps: Mapping[str, Any], labels: Sequence[str], block: int = 1) -> dict[str, Any]:
    """What a page draws of similarity maps (``walklensResults.draw.simmap_view``; the explorer's similarity view
    draws its reply, :func:`document` with ``block`` and ``labels``, with the same function): the maps, a label
    per row (a block of positions when ``block`` > 1)."""
    return {"maps": dict(maps), "labels": list(labels), "block": block}


def build(
    maps: Mapping[str, torch.Tensor],
    tokens: Sequence[str],
    title: str,
    subtitle: str = "",
    figures: bool = True,
    block: int = 1,
) -> Report:
    """The ``walklens simmap`` report (Figs. 3, 11, 12): one labelled heatmap per ``"point/metric"`` key, drawn
    from :func:`view_document` by ``walklensResults`` (coloured over its 1st-99th percentile off the diagonal).

    ``block`` > 1 draws each map as means over ``block`` x ``block`` positions (:func:`.html.block_mean`, a
    note says so; the JSON keeps every value)."""
    if block > 1:
        maps = {k: block_mean(m, block) for k, m in maps.items()}
        tokens = block_labels(tokens, block)
        subtitle += (
            f"{'; ' if subtitle else ''}each cell is the mean over a block of {block} x {block} positions "
            "(labels: first-last position)"
        )
    rep = Report(title, subtitle)
    for key, m in maps.items():
        rep.h2(f"similarity map: {key}")
        z = m.float()
        zq = [[float(f"{v:.3g}") for v in row] for row in z.tolist()]  # 3 significant digits keep the page small
        rep.result("simmap_view", view_document({key: zq}, tokens, block))
        if figures:
            _figure(rep, key, z, [show(t) for t in tokens], _colour_range(z, len(tokens)))
    return rep


def _colour_range(z: torch.Tensor, n: int) -> tuple[float, float, bool]:
    """The colour range of a map ``z`` [n, n] and whether it is diverging."""
    # colour range from the 1st-99th percentiles off the diagonal, so a few huge entries (massive
    # activations) do not wash the map out (the hover shows exact values); diverging only when both
    # signs occur
    off = z[~torch.eye(n, dtype=torch.bool)] if n > 1 else z.reshape(-1)
    off = off[:1_000_000]
    lo, hi = float(torch.quantile(off, 0.01)), float(torch.quantile(off, 0.99))
    diverging = lo < 0 < hi
    if diverging:
        lo, hi = -max(-lo, hi), max(-lo, hi)
    if not hi > lo:
        lo, hi = float(z.min()), float(z.max()) if float(z.max()) > float(z.min()) else float(z.min()) + 1
    return lo, hi, diverging


def _figure(rep: Report, key: str, z: torch.Tensor, labels: list[str], scale: tuple[float, float, bool]) -> None:
    """The map ``key`` as a PNG figure (not embedded: the interactive map shows the same view), coloured over
    ``scale`` (lo, hi, diverging)."""
    lo, hi, diverging = scale
    n = len(labels)
    plt = pyplot()
    size = min(13.0, 4 + 0.1 * n)
    fig, ax = plt.subplots(figsize=(size, size))
    im = ax.imshow(z.numpy(), cmap="RdBu_r" if diverging else "viridis", vmin=lo, vmax=hi, interpolation="nearest")
    step = max(1, math.ceil(n / 80))
    ax.set_xticks(range(0, n, step), labels[::step], rotation=90, fontsize=5)
    ax.set_yticks(range(0, n, step), labels[::step], fontsize=5)
    ax.set_title(key, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    rep.figure(
        fig, "simmap_" + key.replace("/", "_").replace(".", "_").replace("+", "_"), embed=False
    )  # the interactive map above shows the same view


__all__ = ["build", "document", "key", "view_document"]
