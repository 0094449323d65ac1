"""The similarity-map report (``walklens simmap``; seed 000, Figs. 3, 11, 12) and its JSON document: the inner
product or cosine between every pair of positions at a captured point.  Nothing here runs a model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .html import Report, block_labels, block_mean, pyplot, show, ticks


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


def view_document(
    maps: Mapping[str, Any], labels: Sequence[str], block: int = 1, scale: tuple[float, float] | None = None
) -> dict[str, Any]:
    """What a page draws of similarity maps (``walklensResults.draw.simmap_view``; the explorer's similarity view
    draws its reply, :func:`document` with ``block`` and ``labels``, with the same function): the maps, a label
    per row (a block of positions when ``block`` > 1); ``scale``: one colour range (lo, hi) for maps compared side
    by side (else each map's own 1st-99th percentile off the diagonal)."""
    doc = {"maps": dict(maps), "labels": list(labels), "block": block}
    return doc | ({"scale": list(scale)} if scale is not None else {})


def shared_range(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, bool]:
    """One colour range for two maps: the 1st-99th percentiles of both maps' values off the diagonal together
    (symmetric about 0 when both signs occur)."""
    offs = [
        m.float()[~torch.eye(m.shape[0], dtype=torch.bool)] if m.shape[0] > 1 else m.float().reshape(-1) for m in (a, b)
    ]
    return _colour_range(torch.cat(offs), 1)  # n = 1: the values as given (already off the diagonal)


def build_pair(
    maps_a: Mapping[str, torch.Tensor],
    tokens_a: Sequence[str],
    maps_b: Mapping[str, torch.Tensor],
    tokens_b: Sequence[str],
    title: str,
    subtitle: str = "",
    names: tuple[str, str] = ("A", "B"),
    figures: bool = True,
) -> Report:
    """Two texts' similarity maps side by side, each pair (the same ``"point/metric"`` key) on one colour scale
    (:func:`shared_range`), drawn from :func:`view_document` by the same function as one text's maps."""
    rep = Report(title, subtitle)
    for key in maps_a:
        za, zb = maps_a[key].float(), maps_b[key].float()
        lo, hi, diverging = shared_range(za, zb)
        rep.h2(f"similarity maps: {key}, {names[0]} and {names[1]} on one colour scale")
        rep.p(
            f"one colour range for both: {lo:.4g} .. {hi:.4g} (1st-99th percentile off the diagonal of both)", note=True
        )
        rep.raw("<div class='wl-pair' style='display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start'>")
        for name, z, tokens in ((names[0], za, tokens_a), (names[1], zb, tokens_b)):
            zq = [[float(f"{v:.3g}") for v in row] for row in z.tolist()]
            rep.raw("<div>")
            rep.p(f"{name}: {len(tokens)} tokens")
            rep.result("simmap_view", view_document({f"{name} {key}": zq}, tokens, 1, (lo, hi)))
            rep.raw("</div>")
        rep.raw("</div>")
        if figures:
            _pair_figure(
                rep,
                key,
                (za, zb),
                ([show(t) for t in tokens_a], [show(t) for t in tokens_b]),
                names,
                (lo, hi, diverging),
            )
    return rep


def _pair_figure(
    rep: Report,
    key: str,
    z: tuple[torch.Tensor, torch.Tensor],
    labels: tuple[list[str], list[str]],
    names: tuple[str, str],
    scale: tuple[float, float, bool],
) -> None:
    """The two maps of ``key`` side by side in one PNG, one colour bar for both."""
    lo, hi, diverging = scale
    plt = pyplot()
    n = max(len(labels[0]), len(labels[1]))
    size = min(11.0, 4 + 0.08 * n)
    fig, axes = plt.subplots(1, 2, figsize=(2 * size + 1, size))
    im = None
    for ax, m, lab, name in zip(axes, z, labels, names):
        im = ax.imshow(m.numpy(), cmap="RdBu_r" if diverging else "viridis", vmin=lo, vmax=hi, interpolation="nearest")
        ax.set_xticks(*ticks(lab), rotation=90, fontsize=7)
        ax.set_yticks(*ticks(lab), fontsize=7)
        ax.set_title(f"{name}: {key}", fontsize=10)
    fig.colorbar(im, ax=list(axes), fraction=0.03, label="similarity (one scale for both)")
    rep.figure(fig, "simmap_pair_" + key.replace("/", "_").replace(".", "_").replace("+", "_"), embed=False)


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
    ax.set_xticks(*ticks(labels), rotation=90, fontsize=7)
    ax.set_yticks(*ticks(labels), fontsize=7)
    ax.set_title(key, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    rep.figure(
        fig, "simmap_" + key.replace("/", "_").replace(".", "_").replace("+", "_"), embed=False
    )  # the interactive map above shows the same view


__all__ = ["build", "build_pair", "document", "key", "shared_range", "view_document"]
