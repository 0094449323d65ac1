"""Activation patching: each (point, position) cell of a grid scored by one patched forward pass (docs/patching.md).

Denoising (Meng et al. 2022, "Locating and Editing Factual Associations in GPT", sec. 2.1, causal tracing's restoring
run; Heimersheim & Nanda 2024, sec. 2): the corrupted run with the clean run's vector at one cell; noising: the clean
run with the corrupted run's vector.  Values are normalised so the clean run scores 1 and the corrupted run 0.

The work is batched and incremental: the cells of one layer run as one batch, and every pass starts at that layer from
the stored input of the run it patches (:func:`walklens.core.patching.start_at`), so it runs layers l..L-1 only; a
full layer x position grid costs about half the layer work of one full forward pass per cell.  ``batch=1,
incremental=False`` is the plain single-patch forward pass of each cell, which the tests compare with bit for bit.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import numpy as np
import torch

from ...base.errors import InputError
from ...core.capture import tokenize
from ...core.patching import (
    KINDS,
    Cell,
    Recorded,
    Site,
    check_model,
    n_heads,
    parse_site,
    patched_from,
    record,
    record_rows,
)
from ...core.patching import run_logits as _run_logits
from .metrics import Metric, parse_metric
from .result import PatchResult

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

DIRECTIONS = ("denoise", "noise")


@dataclass
class Setup:
    """What one grid needs, checked: the metric, both runs' ids, the sites (rows), the columns (corrupted positions)
    and, for each, the clean position it maps to."""

    lm: LoadedModel
    metric: Metric
    clean_ids: torch.Tensor
    corrupted_ids: torch.Tensor
    sites: list[Site]
    positions: list[int]
    clean_positions: list[int]
    direction: str
    paired: bool = True

    @property
    def denoise(self) -> bool:
        return self.direction == "denoise"

    def base_and_source(self, clean: Recorded, corrupted: Recorded) -> tuple[Recorded, Recorded]:
        """The run patched and the run its vectors come from."""
        return (corrupted, clean) if self.denoise else (clean, corrupted)

    @property
    def base_ids(self) -> torch.Tensor:
        return self.corrupted_ids if self.denoise else self.clean_ids

    def cell_positions(self, j: int) -> tuple[int, int]:
        """Column j's position in the patched run and in the source run."""
        c = self.positions[j]
        if not self.paired:  # a given vector is the source: no clean position
            return c, c
        k = self.clean_positions[j]
        return (c, k) if self.denoise else (k, c)


def _ids(lm: LoadedModel, text: str | Sequence[int] | torch.Tensor) -> torch.Tensor:
    if isinstance(text, str):
        return tokenize(lm, text)
    ids = torch.as_tensor(text, dtype=torch.long).reshape(1, -1)
    if ids.shape[1] == 0:
        raise InputError("a prompt has no tokens")
    return ids


def expand_points(lm: LoadedModel, points: str | Sequence[str], heads: bool = False) -> list[Site]:
    """The sites of ``points``: a kind (``resid_pre``: every layer's), ``head``/``heads`` (every head of every layer),
    a name (``L3.attn_out``, ``L2.H1``) or a glob of names; ``heads``: every head of every layer added.  In layer
    order, each kind in the order of a layer."""
    given = [points] if isinstance(points, str) else list(points)
    if heads:
        given.append("head")
    if not given:
        raise InputError("no points given")
    L, H = lm.n_layers, n_heads(lm)
    parallel = lm.adapter.residual_kind(lm.config) == "parallel"
    every = [f"L{l}.{k}" for l in range(L) for k in KINDS[:-1] if not (parallel and k == "resid_mid")]
    every += [f"L{l}.H{h}" for l in range(L) for h in range(H)]
    names: list[str] = []
    for p in given:
        p = p.strip()
        if p in ("head", "heads"):
            names += [f"L{l}.H{h}" for l in range(L) for h in range(H)]
        elif p in KINDS:
            names += [f"L{l}.{p}" for l in range(L)]
        elif any(ch in p for ch in "*?["):
            found = [n for n in every if fnmatch.fnmatchcase(n, p)]
            if not found:
                raise InputError(f"no point matches {p!r}")
            names += found
        else:
            names.append(p)
    sites = list(dict.fromkeys(parse_site(lm, n) for n in names))
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(sites, key=lambda s: (s.layer, order[s.kind], s.head or 0))


class Cells(TypedDict, total=False):
    """The cells of a patching grid, as :func:`patch`, :func:`~.attribution.attribute` and
    :func:`~.paths.path_patch` take them: ``points`` (kinds, names or globs; default ``resid_pre``), ``positions``
    of the corrupted prompt (default all), ``metric`` (default ``kl``), ``direction`` (``denoise``, the default, or
    ``noise``), ``position_map`` (corrupted position -> clean position) and ``heads`` (each head a point)."""

    points: str | Sequence[str]
    positions: Sequence[int] | None
    metric: str | Metric | Callable[..., Any]
    direction: str
    position_map: Mapping[int, int] | None
    heads: bool


def setup(
    lm: LoadedModel,
    clean: str | Sequence[int] | torch.Tensor,
    corrupted: str | Sequence[int] | torch.Tensor,
    paired: bool = True,
    **cells: Unpack[Cells],
) -> Setup:
    """Every input checked, each failure one line: the model, the direction, the metric, token counts (different ones
    need ``position_map``: corrupted position -> clean position), points and positions in range (:class:`Cells`;
    absent keys take their defaults).  ``paired=False``: no cell takes a clean vector (a given vector is patched in),
    so the prompts' token counts may differ and nothing maps positions."""
    points, positions = cells.get("points", "resid_pre"), cells.get("positions")
    metric, direction = cells.get("metric", "kl"), cells.get("direction", "denoise")
    position_map, heads = cells.get("position_map"), cells.get("heads", False)
    check_model(lm)
    if direction not in DIRECTIONS:
        raise InputError(f"direction {direction!r}: give denoise or noise")
    m = parse_metric(lm, metric)
    c_ids, x_ids = _ids(lm, clean), _ids(lm, corrupted)
    Tc, Tx = c_ids.shape[1], x_ids.shape[1]
    if not paired and position_map is not None:
        raise InputError("position_map pairs clean and corrupted positions: a patched-in vector has none")
    if paired and position_map is None and Tc != Tx:
        raise InputError(
            f"clean has {Tc} tokens and corrupted {Tx}: patching pairs positions one to one; give position_map "
            "(corrupted position -> clean position) to pair them explicitly"
        )
    cols = list(range(Tx)) if positions is None else [int(p) + Tx if int(p) < 0 else int(p) for p in positions]
    if position_map is not None and positions is None:
        cols = sorted(int(p) for p in position_map)
    if not cols:
        raise InputError("no positions given")
    bad = [p for p in cols if not 0 <= p < Tx]
    if bad:
        raise InputError(f"position {bad[0]} out of range: the corrupted prompt has {Tx} tokens")
    if not paired:
        return Setup(
            lm, m, c_ids, x_ids, expand_points(lm, points, heads), list(dict.fromkeys(cols)), [], direction, False
        )
    pmap = {p: p for p in cols} if position_map is None else {int(k): int(v) for k, v in position_map.items()}
    missing = [p for p in cols if p not in pmap]
    if missing:
        raise InputError(f"position {missing[0]} has no clean position in position_map")
    clean_cols = [pmap[p] for p in cols]
    bad = [p for p in clean_cols if not 0 <= p < Tc]
    if bad:
        raise InputError(f"position_map: clean position {bad[0]} out of range (the clean prompt has {Tc} tokens)")
    sites = expand_points(lm, points, heads)
    return Setup(lm, m, c_ids, x_ids, sites, list(dict.fromkeys(cols)), clean_cols, direction)


def source_value(site: Site, run: Recorded, position: int, d_head: int) -> torch.Tensor:
    """A site's vector at one position of a recorded run ([D], or a head's [d])."""
    if site.kind == "head":
        assert site.head is not None
        z = run.vectors[f"L{site.layer}.heads"][position]
        return z[site.head * d_head : (site.head + 1) * d_head]
    return run.vectors[site.name][position]


def references(s: Setup, graph: bool = False) -> tuple[Recorded, Recorded, float, float]:
    """Both runs recorded and their metrics (clean, corrupted); refuses a metric that cannot be normalised (the two
    runs score the same).  With ``graph`` (attribution patching) both runs are one batched pass in the autograd graph
    when their token counts agree (an estimate needs no bit-exact references), else two passes, the patched run's in
    the graph."""
    lm = s.lm
    if graph and s.clean_ids.shape == s.corrupted_ids.shape:
        clean, corrupted = record_rows(lm, torch.cat([s.clean_ids, s.corrupted_ids]), s.sites, -1, graph=True)
    else:
        clean = record(lm, s.clean_ids, s.sites, -1, graph=graph and not s.denoise)
        corrupted = record(lm, s.corrupted_ids, s.sites, -1, graph=graph and s.denoise)
    m_clean = s.metric.value(clean.logits, clean.logits)
    m_corr = s.metric.value(corrupted.logits, clean.logits)
    if m_clean == m_corr:
        raise InputError(f"clean and corrupted both score {m_clean:.6g} on {s.metric.name}: nothing to normalise")
    return clean, corrupted, m_clean, m_corr


def patch(
    lm: LoadedModel,
    clean: str | Sequence[int] | torch.Tensor,
    corrupted: str | Sequence[int] | torch.Tensor,
    *,
    batch: int | None = None,
    incremental: bool = True,
    **cells: Unpack[Cells],
) -> PatchResult:
    """Activation patching of every (point, position) cell (the cells: :class:`Cells`): ``points`` are
    kinds (``resid_pre``, ``attn_out``, ``resid_mid``, ``mlp_out``, ``resid_post``, ``head``), names
    (``L3.mlp_out``, ``L2.H1``) or globs; ``positions`` the corrupted prompt's (default all); ``metric``
    ``logitdiff:A,B``, ``logprob:T``, ``rank:T``, ``kl`` or a callable of the logits at the last position.
    ``batch``: cells per forward pass (default: a layer's cells in one); ``incremental``: each pass starts at its
    layer from the stored residual.  Each cell's value equals the single-patch forward pass's (``batch=1,
    incremental=False``); the model is restored bit for bit."""
    s = setup(lm, clean, corrupted, **cells)
    rec_clean, rec_corr, m_clean, m_corr = references(s)
    raw, passes, work = exact_grid(s, rec_clean, rec_corr, batch=batch, incremental=incremental)
    return make_result(s, raw, m_clean, m_corr, "exact", passes, work)


#: a cell's new vector from (site, column, the vector it replaces); default: the source run's at the cell
CellValue = Callable[[Site, int, torch.Tensor], torch.Tensor]


@torch.no_grad()
def exact_grid(
    s: Setup,
    rec_clean: Recorded,
    rec_corr: Recorded,
    *,
    batch: int | None = None,
    incremental: bool = True,
    value: CellValue | None = None,
) -> tuple[np.ndarray, int, float]:
    """The raw metric of every cell [sites, positions], the passes run and their layer work in forward passes;
    ``value``: the vector each cell receives (default: the source run's at the paired position)."""
    lm = s.lm
    base, source = s.base_and_source(rec_clean, rec_corr)
    L, d = lm.n_layers, lm.head_shape[1]
    raw = np.full((len(s.sites), len(s.positions)), np.nan)
    passes, work = 0, 0.0
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for i, site in enumerate(s.sites):
        by_layer.setdefault(site.layer, []).extend((i, j) for j in range(len(s.positions)))
    for layer, cells in by_layer.items():
        size = len(cells) if batch is None else max(int(batch), 1)
        for k in range(0, len(cells), size):
            chunk = cells[k : k + size]
            rows = []
            for i, j in chunk:
                p_base, p_src = s.cell_positions(j)
                site = s.sites[i]
                new = (
                    source_value(site, source, p_src, d)
                    if value is None
                    else value(site, j, source_value(site, base, p_base, d))
                )
                rows.append(Cell(site, p_base, new))
            start = layer if incremental else None
            with patched_from(lm, start, base.resid_pre[layer], rows):
                logits = _run_logits(lm, s.base_ids.expand(len(rows), -1), -1)
            for (i, j), row in zip(chunk, logits):
                raw[i, j] = s.metric.value(row, rec_clean.logits)
            passes += 1
            work += len(rows) * ((L - layer) / L if incremental else 1.0)
    return raw, passes, work


def make_result(
    s: Setup, raw: np.ndarray, m_clean: float, m_corr: float, method: str, passes: int, work: float
) -> PatchResult:
    """The grid normalised (clean 1, corrupted 0) with its references and labels."""
    lm = s.lm
    x_tokens = lm.token_strings(s.corrupted_ids[0].tolist())
    c_tokens = lm.token_strings(s.clean_ids[0].tolist())
    return PatchResult(
        model_name=lm.name,
        metric=s.metric.name,
        direction=s.direction,
        method=method,
        points=[site.name for site in s.sites],
        positions=list(s.positions),
        tokens=[x_tokens[p] for p in s.positions],
        clean_tokens=[c_tokens[p] for p in s.clean_positions] if s.paired else [],
        values=(raw - m_corr) / (m_clean - m_corr),
        raw=raw,
        clean_metric=m_clean,
        corrupted_metric=m_corr,
        answer_position=int(s.corrupted_ids.shape[1] - 1),
        passes=passes,
        forward_equivalents=work,
    )


__all__ = ["patch", "setup", "Setup", "expand_points", "exact_grid", "make_result", "references", "DIRECTIONS"]
