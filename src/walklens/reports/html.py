"""Self-contained HTML reports: one file, every script and image inlined (works offline, no CDN).

A :class:`Report` collects sections; interactive heatmaps (canvas + hover) and line charts (SVG) are drawn
by the small inline script ``assets/plots.js``; matplotlib figures are written as PNG beside the HTML and
embedded too, unless they repeat an interactive view (``embed=False``: the page links the PNG instead).
Reports take plain tensors/lists and strings; they never load models.  Files that belong with a page (CSV
tables, a JSON summary) are attached to it (:meth:`Report.attach`) and written by :meth:`Report.save`.  The
helpers every topic's builder shares live here too: :func:`show` (a token as a label), :func:`block_mean` /
:func:`block_labels` (maps averaged over blocks of positions), :func:`pyplot` and :func:`fields_of` (a
result's public fields, where every topic's document starts).

One document per result: ``document()`` of each topic is what ``--json`` writes, and the parts of the page
that draw a result from it (:meth:`Report.result`: the document embedded, drawn by ``assets/results.js``)
read the same dict as the explorer's API sends and its views draw, with the same script.

Every string (token, text, database value) reaches the page as text, never markup: Python escapes it with
:func:`html.escape` (JSON specs live in attributes, escaped the same way), and ``plots.js`` inserts labels,
tooltips and chart text with ``textContent`` only.  Every page and attached text file passes
:func:`~walklens.base.errors.displayable` on its way out (:meth:`Report.render`, :meth:`Report.save`): a name holding
a lone surrogate (a path of undecodable bytes) shows as ``\\udcff``, never a ``UnicodeEncodeError``.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import html
import io
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import torch

from ..base.errors import displayable
from ..base.outputs import jsonable, make_dir, write_atomic

_CSS = """
body{font-family:system-ui,-apple-system,sans-serif;margin:24px auto;max-width:1200px;color:#222;padding:0 16px}
h1{font-size:1.6em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}
table.wl{border-collapse:collapse;font-size:13px;margin:8px 0;display:block;max-width:100%;overflow-x:auto}
table.wl td,table.wl th{border:1px solid #ddd;
padding:3px 7px;text-align:left;white-space:pre}table.wl th{background:#f4f4f4}.wl-heatmap{position:relative;
overflow-x:auto;margin:8px 0}.wl-tip{position:absolute;display:none;background:#fffbe6;border:1px solid #aaa;
padding:4px 6px;font-size:12px;pointer-events:none;white-space:pre;z-index:10}.note{color:#666;font-size:13px}
img.wl{max-width:100%}code{background:#f4f4f4;padding:1px 4px}
"""

#: False while :func:`inline_only` is active: figures a page would only link are left out
_LINKED = contextvars.ContextVar("walklens_linked_figures", default=True)


@contextlib.contextmanager
def inline_only() -> Iterator[None]:
    """Reports built inside leave out the figures they would only link (``figure(..., embed=False)``: a PNG file
    beside the page that repeats an interactive view): a notebook's view is one document with no files."""
    token = _LINKED.set(False)
    try:
        yield
    finally:
        _LINKED.reset(token)


DIGITS = 6  # decimals of the numbers in a chart's spec (keeps the page small)


def _esc(x: Any) -> str:
    return html.escape(str(x))


#: control characters (C0, DEL, C1) -> a visible escape: a NUL or an ESC in a cell shows as ``\x00``, ``\x1b``
_CONTROL = {c: repr(chr(c))[1:-1] for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (0x09, 0x0A)}


def visible(text: str) -> str:
    """``text`` with its control characters escaped visibly (``\x00``), tabs and newlines kept: what a table
    cell of a report shows of a prompt or a continuation."""
    return text.translate(_CONTROL)


def show(tok: str) -> str:
    """A token as a visible label: whitespace and control characters escaped (``'\\n'``), nothing else."""
    return repr(tok)[1:-1] if tok else "∅"


def pyplot() -> Any:
    """matplotlib's pyplot on the non-interactive Agg backend (figures are only written as PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fields_of(result: Any, leave_out: Iterable[str] = ()) -> dict[str, Any]:
    """A result dataclass's public fields as a dict, values as they are (:func:`walklens.base.outputs.jsonable`
    converts them when the document is written), less ``leave_out``: where every document starts, so that a
    field added to a result reaches ``--json``, the report and the explorer without another edit."""
    skip = set(leave_out)
    return {k: getattr(result, k) for k in result.__dataclass_fields__ if not k.startswith("_") and k not in skip}


MAX_TICKS = 40  #: the most labels a PNG figure's axis carries (thinned evenly beyond it)


def ticks(labels: Sequence[str], most: int = MAX_TICKS) -> tuple[list[int], list[str]]:
    """At most ``most`` evenly spaced positions of ``labels`` and their labels (all of them when they fit), so a
    figure's axis stays readable at any number of points."""
    step = max(1, math.ceil(len(labels) / most))
    at = list(range(0, len(labels), step))
    return at, [labels[i] for i in at]


def block_mean(x: torch.Tensor, b: int) -> torch.Tensor:
    """Mean of x [..., R, C] over b x b blocks (the last blocks may be smaller): [..., ceil(R/b), ceil(C/b)]."""
    if b <= 1:
        return x
    R, C = x.shape[-2:]
    pr, pc = (-R) % b, (-C) % b
    lead = x.shape[:-2]
    xs = torch.nn.functional.pad(x.float(), (0, pc, 0, pr))
    sums = xs.reshape(*lead, (R + pr) // b, b, (C + pc) // b, b).sum((-3, -1))
    ones = torch.nn.functional.pad(torch.ones(R, C), (0, pc, 0, pr))
    counts = ones.reshape((R + pr) // b, b, (C + pc) // b, b).sum((-3, -1))
    return sums / counts


def block_labels(tokens: Sequence[str], b: int) -> list[str]:
    """Labels of the blocks of positions: ``"12-23 tok"`` (first position, last position, first token)."""
    if b <= 1:
        return list(tokens)
    return [f"{i}-{min(i + b, len(tokens)) - 1} {tokens[i]}" for i in range(0, len(tokens), b)]


class Charts:
    """The charts a page's script draws from a spec, one spec for both renderings of a view: the HTML
    :class:`Report` and the explorer's parts (:class:`walklens.lab.reports.steercard.Parts`), each of which says in
    ``_widget`` where a chart goes."""

    def lines(
        self,
        x: Sequence[Any],
        series: Sequence[dict[str, Any]],
        title: str = "",
        xlabel: str = "",
        width: int = 720,
        height: int = 320,
    ) -> Self:
        """SVG line chart; each series is ``{"name", "y", optional "band": [lo, hi], "dash", "color"}``."""
        spec = {
            "x": [str(v) for v in x],
            "series": [
                {**s, "y": jsonable(s["y"], DIGITS), **({"band": jsonable(s["band"], DIGITS)} if "band" in s else {})}
                for s in series
            ],
            "xlabel": xlabel,
            "width": width,
            "height": height,
        }
        return self._widget("lines", spec, title)

    def _widget(self, kind: str, spec: dict[str, Any], title: str) -> Self:
        """Add the chart ``kind`` drawn from ``spec``, titled ``title``."""
        raise NotImplementedError


class Report(Charts):
    """An HTML report being built; ``save(out_dir)`` writes ``index.html`` plus PNG figures and any files
    attached with :meth:`attach` (tables as CSV, a summary as JSON or Markdown)."""

    def __init__(self, title: str, subtitle: str = "") -> None:
        self.title = title
        self.parts: list[str] = [f"<h1>{_esc(title)}</h1>"]
        if subtitle:
            self.parts.append(f"<p class='note'>{_esc(subtitle)}</p>")
        self.images: dict[str, bytes] = {}
        self.files: dict[str, str | bytes] = {}

    def attach(self, name: str, data: str | bytes) -> Report:
        """A file written beside the page by :meth:`save` (``name``: a plain file name)."""
        if Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"attach: {name!r} is not a plain file name")
        self.files[name] = data
        return self

    def h2(self, text: str) -> Report:
        self.parts.append(f"<h2>{_esc(text)}</h2>")
        return self

    def p(self, text: str, note: bool = False) -> Report:
        self.parts.append(f"<p{' class=note' if note else ''}>{_esc(text)}</p>")
        return self

    def raw(self, markup: str) -> Report:
        self.parts.append(markup)
        return self

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str = "{:.4g}") -> Report:
        def cell(v: Any) -> str:
            return _esc(fmt.format(v)) if isinstance(v, float) else _esc(visible(str(v)))

        head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
        self.parts.append(f"<table class='wl'><tr>{head}</tr>{body}</table>")
        return self

    def heatmap(
        self,
        z: Any,
        row_labels: Sequence[str] | None = None,
        col_labels: Sequence[str] | None = None,
        title: str = "",
        *,
        hover: Sequence[Sequence[str]] | None = None,
        diverging: bool = False,
        vmin: float | None = None,
        vmax: float | None = None,
        cell: int | None = None,
        legend: str = "",
    ) -> Report:
        """Interactive heatmap (canvas); ``hover[i][j]`` adds plain text (``\\n`` breaks lines) to the tooltip
        of cell (i, j).  Every heatmap has a colour bar with its range; ``legend`` says what the colours mean."""
        spec = {
            "z": jsonable(z, DIGITS),
            "row_labels": list(map(str, row_labels)) if row_labels is not None else None,
            "col_labels": list(map(str, col_labels)) if col_labels is not None else None,
            "hover": hover,
            "diverging": diverging,
            "vmin": vmin,
            "vmax": vmax,
            "cell": cell,
            "legend": legend,
        }
        return self._widget("heatmap", spec, title)

    def _widget(self, kind: str, spec: dict[str, Any], title: str) -> Self:
        """A chart drawn by the page's script from its ``spec`` (``<div class='wl-{kind}'>``, the spec as JSON in
        an escaped attribute), under an ``<h3>`` when there is a ``title``."""
        if title:
            self.parts.append(f"<h3>{_esc(title)}</h3>")
        self.parts.append(f"<div class='wl-{kind}' data-spec='{_esc(json.dumps(spec))}'></div>")
        return self

    def result(self, kind: str, doc: Any) -> Report:
        """A result drawn in the page by ``walklensResults[kind]`` of ``assets/results.js`` from its document
        (``doc``: the topic's ``document()`` or a part of it, embedded as JSON in an attribute, escaped like the
        specs); the explorer's views call the same function on the same document sent by its API."""
        data = json.dumps(jsonable(doc, DIGITS))
        self.parts.append(f"<div class='wl-result' data-result='{_esc(kind)}' data-doc='{_esc(data)}'></div>")
        return self

    def figure(self, fig: Any, name: str, caption: str = "", embed: bool = True) -> Report:
        """A matplotlib figure, written as ``name.png`` beside the HTML (for papers).  ``embed=True`` also shows
        it in the page; ``embed=False`` (the figure repeats an interactive view) only links the file."""
        if not embed and not _LINKED.get():
            pyplot().close(fig)
            return self
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        data = buf.getvalue()
        fname = f"{name}.png"
        self.images[fname] = data
        if embed:
            b64 = base64.b64encode(data).decode()
            cap = f"<figcaption class=note>{_esc(caption)}</figcaption>" if caption else ""
            self.parts.append(
                f"<figure><img class='wl' alt='{_esc(name)}' src='data:image/png;base64,{b64}'>{cap}</figure>"
            )
        else:
            self.parts.append(
                f"<p class='note wl-png'>PNG of this view: <a href='{_esc(quote(fname))}'>"
                f"{_esc(fname)}</a>{f' ({_esc(caption)})' if caption else ''}</p>"
            )
        pyplot().close(fig)
        return self

    def render(self) -> str:
        assets = resources.files("walklens.reports").joinpath("assets")
        js = "\n".join(assets.joinpath(f).read_text(encoding="utf-8") for f in ("plots.js", "results.js"))
        return displayable(
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{_esc(self.title)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(self.parts)
            + f"<script>{js}</script></body></html>"
        )

    def save(self, out_dir: str | Path, name: str = "index.html") -> Path:
        """Write the PNGs, the attached files and then ``name`` into ``out_dir`` (rules of
        :mod:`walklens.base.outputs`); returns the HTML path."""
        out = Path(out_dir)
        make_dir(out, "report folder")
        for fname, data in {**self.images, **self.files}.items():
            write_atomic(out / fname, displayable(data) if isinstance(data, str) else data)
        return write_atomic(out / name, self.render())
