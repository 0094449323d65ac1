"""Reports for encoding walks, decoding walks and similarity maps (seed 000: Figs. 3, 9, 11, 12; A.1, A.2).

Everything here draws from the result dataclasses of :mod:`walklens.walks` plus a ``labels`` mapping from
token id to its text; nothing loads a model or recomputes an analysis.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from .html import Report

if TYPE_CHECKING:
    from ..decoding import DecodingWalk
    from ..walks import EncodingWalk

TOP_HOVER = 5


def show(tok: str) -> str:
    """A token as a visible label: whitespace and control characters escaped (``'\\n'``), nothing else."""
    return repr(tok)[1:-1] if tok else "∅"


def _pos_labels(tokens: Sequence[str], n: int) -> list[str]:
    return [f"{t}:{show(tokens[t])}" for t in range(n)]


def _rows(walk: EncodingWalk) -> list[int]:
    """Residual points to show as rows: embed, after attention (resid_mid/resid_cross), after MLP, final.

    ``resid_pre`` of layer l+1 equals ``resid_post`` of layer l, so it is left out.
    """
    out = [i for i, (p, r) in enumerate(zip(walk.points, walk.residual)) if r and not p.endswith(".resid_pre")]
    return out or list(range(len(walk.points)))


def _matplotlib() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rank_figure(z: torch.Tensor, rows: list[str], cols: list[str], title: str) -> Any:
    plt = _matplotlib()
    h = min(14.0, 2.0 + 0.22 * len(rows))
    w = min(18.0, 3.0 + 0.14 * len(cols))
    fig, ax = plt.subplots(figsize=(w, h))
    im = ax.imshow(z.numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
    step_r = max(1, math.ceil(len(rows) / 60))
    step_c = max(1, math.ceil(len(cols) / 60))
    ax.set_yticks(range(0, len(rows), step_r), rows[::step_r], fontsize=7)
    ax.set_xticks(range(0, len(cols), step_c), cols[::step_c], fontsize=6, rotation=90)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="log10(1 + rank)  (0 = nearest token)")
    fig.tight_layout()
    return fig


def _grid_html(walk: EncodingWalk, labels: Mapping[int, str], rows: list[int], n_cols: int) -> str:
    """Nearest-token grid: the top-1 token of each position at each point (Fig. 9 style).

    Green: the top-1 token is w_{t+1} (the walk reached the next token's neighbourhood); grey: it is w_t.
    """
    cols = _pos_labels(walk.tokens, n_cols)
    head = "<tr><th>point</th>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>"
    ids = walk.token_ids.tolist()
    body = []
    for i in rows:
        cells = []
        for t in range(n_cols):
            top = int(walk.top_ids[i, t, 0])
            style = ""
            if t + 1 < len(ids) and top == ids[t + 1]:
                style = " style='background:#c8f0c8'"
            elif top == ids[t]:
                style = " style='background:#e4e4e4'"
            cells.append(f"<td{style}>{html.escape(show(labels.get(top, str(top))))}</td>")
        body.append(f"<tr><th>{html.escape(walk.points[i])}</th>{''.join(cells)}</tr>")
    return f"<div style='overflow-x:auto'><table class='wl wl-grid'>{head}{''.join(body)}</table></div>"


def _band(x: torch.Tensor) -> tuple[list[float], list[float], list[float]]:
    """Mean and 10th/90th percentiles over positions (NaNs ignored) for each row of x [points, tokens]."""
    mean, lo, hi = [], [], []
    for row in x:
        v = row[~torch.isnan(row)]
        if len(v) == 0:
            mean.append(float("nan")), lo.append(float("nan")), hi.append(float("nan"))
            continue
        mean.append(float(v.mean()))
        lo.append(float(torch.quantile(v, 0.1)))
        hi.append(float(torch.quantile(v, 0.9)))
    return mean, lo, hi


def add_encoding_walk(report: Report, walk: EncodingWalk, labels: Mapping[int, str], key: str,
                      heading: str, figures: bool = True, max_cols: int = 96) -> None:
    """One encoding walk (one reading, one stack) as report sections."""
    rows = _rows(walk)
    T = len(walk.tokens)
    n_cols = min(T, max_cols)
    row_names = [walk.points[i] for i in rows]
    cols = _pos_labels(walk.tokens, n_cols)
    fi = walk.points.index("final") if "final" in walk.points else rows[-1]
    report.h2(heading)
    report.p(f"metric: {walk.metric}; norm: {walk.norm}; compared with: {walk.matrix}; k = {walk.k}. "
             f"Ranks count the tokens scoring strictly higher (0 = nearest).", note=True)
    if n_cols < T:
        report.p(f"Showing the first {n_cols} of {T} positions; the JSON output holds all of them.", note=True)

    # summary per position
    esc, stab = walk.escape_names, walk.escape_stable_names
    table_rows = []
    for t in range(n_cols):
        nxt = show(walk.tokens[t + 1]) if t + 1 < T else ""
        top = int(walk.top_ids[fi, t, 0])
        rn = int(walk.rank_of_next[fi, t])
        table_rows.append([t, show(walk.tokens[t]), nxt, show(labels.get(top, str(top))),
                           int(walk.rank_of_input[fi, t]), rn if rn >= 0 else "",
                           float(walk.prob_of_next[fi, t]) if rn >= 0 else "", esc[t] or "-", stab[t] or "-"])
    report.table(["t", "w_t", "w_t+1", f"top-1 at {walk.points[fi]}", "rank w_t", "rank w_t+1", "P(w_t+1)",
                  "w_t+1 first outranks w_t", "… and stays ahead from"], table_rows)

    # rank heatmaps with hover: one row per position, one column per point (reading left to right = up the stack)
    hover = []
    for t in range(n_cols):
        line = []
        for i in rows:
            tops = ", ".join(repr(labels.get(int(j), str(int(j)))) for j in walk.top_ids[i, t, :TOP_HOVER])
            rn = int(walk.rank_of_next[i, t])
            line.append(f"rank of w_t {int(walk.rank_of_input[i, t])}" + (f", of w_t+1 {rn}" if rn >= 0 else "")
                        + f"\nnearest: {tops}")  # plain text: plots.js inserts it with textContent
        hover.append(line)
    for what, ranks in (("input", walk.rank_of_input), ("next", walk.rank_of_next)):
        r = ranks[rows, :n_cols].t()
        z = torch.log10(1 + r.clamp_min(0).float())
        z[r < 0] = float("nan")
        sym = "w_t" if what == "input" else "w_t+1"
        report.heatmap(z, row_labels=cols, col_labels=row_names, hover=hover,
                       title=f"rank of {sym} at each point, log10(1 + rank): dark = near (hover for the nearest tokens)")
        if figures:
            report.figure(_rank_figure(z, cols, row_names, f"{heading}: rank of {sym}"), f"rank_{what}_{key}",
                          caption=f"log10(1 + rank of {sym}) for each position (rows) at each point (columns)",
                          embed=False)  # the interactive heatmap above shows the same view

    report.raw("<h3>nearest token at each point (green: w_t+1, grey: w_t)</h3>")
    grid_rows = rows if len(rows) <= 70 else [i for i in rows if not walk.points[i].endswith(("resid_mid", "resid_cross"))]
    report.raw(_grid_html(walk, labels, grid_rows, n_cols))

    # per-layer curves (mean over positions, 10-90 % band), and per position for short texts
    x = list(row_names)
    ci, cn = walk.cos_input[rows], walk.cos_next[rows]
    series = []
    for name, v, colour in (("cos(x, w_t)", ci, "#1f77b4"), ("cos(x, w_t+1)", cn, "#d62728")):
        m, lo, hi = _band(v)
        series.append({"name": name + " mean", "y": m, "band": [lo, hi], "color": colour})
    if T <= 12:
        for t in range(T - 1):
            series.append({"name": f"{t}:{show(walk.tokens[t])} → {show(walk.tokens[t + 1])}",
                           "y": cn[:, t].tolist(), "dash": True})
    report.lines(x, series, title="cosine with w_t and with w_t+1 through the stack", xlabel="point",
                 width=900, height=340)
    sl, sa = walk.step_length[rows], walk.step_angle[rows]
    m1, lo1, hi1 = _band(sl)
    report.lines(x, [{"name": "step length |x_p - x_p-1|", "y": m1, "band": [lo1, hi1]}],
                 title="step length between consecutive residual points (mean over positions, 10-90 % band)",
                 xlabel="point", width=900, height=300)
    m2, lo2, hi2 = _band(sa)
    report.lines(x, [{"name": "angle (degrees)", "y": m2, "band": [lo2, hi2], "color": "#2ca02c"}],
                 title="angle between consecutive residual points", xlabel="point", width=900, height=300)


def encoding_walk_report(walks: Mapping[str, EncodingWalk], labels: Mapping[int, str], title: str,
                         subtitle: str = "", figures: bool = True, max_cols: int = 96) -> Report:
    """Report of one text's encoding walks; ``walks`` maps a key (e.g. ``"none"``, ``"final"``) to a walk.

    Encoder-decoder walks (``walk.encoder``) get an encoder section beside the decoder's (A.2).
    """
    rep = Report(title, subtitle)
    names = {"none": "raw vectors against V (norm=none, the papers' reading)",
             "final": "final norm + the model's head (norm=final, the logit lens)"}
    for key, walk in walks.items():
        label = names.get(key, key)
        if walk.encoder is not None:
            add_encoding_walk(rep, walk.encoder, labels, f"enc_{key}", f"Encoder walk: {label}", figures, max_cols)
            add_encoding_walk(rep, walk, labels, key, f"Decoder walk: {label}", figures, max_cols)
        else:
            add_encoding_walk(rep, walk, labels, key, f"Encoding walk: {label}", figures, max_cols)
    return rep


def decoding_walk_report(dw: DecodingWalk, title: str, figures: bool = True) -> Report:
    """Report of a decoding walk (eq. 10): the step table, probabilities, movement of d_t, the target path."""
    rep = Report(title, f"prompt: {dw.prompt!r}")
    mode = ("teacher-forced target" if dw.target is not None else
            f"sampled (seed {dw.seed}, temperature {dw.temperature}, top-k {dw.top_k}, top-p {dw.top_p})"
            if dw.sample else "greedy")
    rep.h2("Decoding walk")
    rep.p(f"{mode}; {len(dw.tokens)} steps{'; stopped at end-of-sequence' if dw.stopped_at_eos else ''}. "
          f"Output: {dw.text!r}")
    if dw.target is not None:
        where = ("the walk stays on the target path (every d_t has the target token as nearest token)"
                 if dw.left_path_at < 0 else
                 f"the walk leaves the target path at step {dw.left_path_at} "
                 f"(target {show(dw.tokens[dw.left_path_at])!r}, nearest {show(dw.top_tokens[dw.left_path_at][0])!r})")
        rep.p(f"Target path (A.1): {where}.")
    heads = ["step", "token", "P(token)", "rank", "in N(target)" if dw.target is not None else "greedy",
             "|d_t|", "step |Δd|", "angle°", "nearest tokens (P)"]
    rows = []
    for i, tok in enumerate(dw.tokens):
        near = ", ".join(f"{show(s)} {float(p):.3f}" for s, p in zip(dw.top_tokens[i][:5], dw.top_probs[i][:5]))
        flag = (("yes" if bool(dw.in_neighbourhood[i]) else "no") if dw.in_neighbourhood is not None
                else ("=" if int(dw.greedy_ids[i]) == int(dw.token_ids[i]) else show(dw.top_tokens[i][0])))
        rows.append([i, show(tok), float(dw.probs[i]), int(dw.ranks[i]), flag, float(dw.d_norm[i]),
                     float(dw.step_length[i]), float(dw.step_angle[i]), near])
    rep.table(heads, rows)
    x = [f"{i}:{show(t)}" for i, t in enumerate(dw.tokens)]
    rep.lines(x, [{"name": "P(emitted token)", "y": dw.probs.tolist()},
                  {"name": "P(nearest token)", "y": dw.top_probs[:, 0].tolist(), "dash": True}],
              title="probability of each emitted token", xlabel="step: token", width=900)
    rep.lines(x, [{"name": "step |d_t - d_t-1|", "y": dw.step_length.tolist()},
                  {"name": "|d_t|", "y": dw.d_norm.tolist(), "dash": True}],
              title="movement of the decoding vector d_t", xlabel="step: token", width=900)
    if figures:
        plt = _matplotlib()
        fig, ax = plt.subplots(figsize=(min(16, 3 + 0.45 * len(dw.tokens)), 3.2))
        ax.bar(range(len(dw.tokens)), dw.probs.numpy(), color=["#2ca02c" if int(r) == 0 else "#d62728" for r in dw.ranks])
        ax.set_xticks(range(len(dw.tokens)), [show(t) for t in dw.tokens], rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("P(token)")
        ax.set_title("decoding walk: probability of each emitted token (green: the nearest token)", fontsize=10)
        fig.tight_layout()
        rep.figure(fig, "decoding_walk", embed=False)  # repeats the first line chart
    return rep


def similarity_report(maps: Mapping[str, torch.Tensor], tokens: Sequence[str], title: str, subtitle: str = "",
                      figures: bool = True) -> Report:
    """Similarity maps (Figs. 3, 11, 12): one labelled heatmap per ``"point/metric"`` key."""
    rep = Report(title, subtitle)
    labels = [show(t) for t in tokens]
    for key, m in maps.items():
        rep.h2(f"similarity map: {key}")
        cosine = key.endswith("cosine")
        z = m.float()
        n = len(labels)
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
        rep.p(f"colour range {lo:.4g} .. {hi:.4g} (1st-99th percentile off the diagonal); min {float(z.min()):.4g}, "
              f"max {float(z.max()):.4g}", note=True)
        zq = [[float(f"{v:.3g}") for v in row] for row in z.tolist()]  # 3 significant digits keep the page small
        rep.heatmap(zq, row_labels=labels, col_labels=labels, diverging=diverging, vmin=lo, vmax=hi,
                    title=f"{key}: {'cosine' if cosine else 'inner product'} between every pair of positions",
                    cell=None if n <= 150 else 4)
        if figures:
            plt = _matplotlib()
            size = min(13.0, 4 + 0.1 * n)
            fig, ax = plt.subplots(figsize=(size, size))
            im = ax.imshow(z.numpy(), cmap="RdBu_r" if diverging else "viridis", vmin=lo, vmax=hi,
                           interpolation="nearest")
            step = max(1, math.ceil(n / 80))
            ax.set_xticks(range(0, n, step), labels[::step], rotation=90, fontsize=5)
            ax.set_yticks(range(0, n, step), labels[::step], fontsize=5)
            ax.set_title(key, fontsize=10)
            fig.colorbar(im, ax=ax, fraction=0.04)
            fig.tight_layout()
            rep.figure(fig, "simmap_" + key.replace("/", "_").replace(".", "_").replace("+", "_"),
                       embed=False)  # the interactive map above shows the same view
    return rep


__all__ = ["encoding_walk_report", "add_encoding_walk", "decoding_walk_report", "similarity_report", "show"]
