"""The sizes the cost model counts files and their building in, each derived from what writes them, never
measured by hand: bytes per number from the writers' own formats (the ``--json`` writer, a report's heatmap spec),
a number held in Python from CPython's object sizes, a report page's fixed part from the page itself rendered
empty, a figure's canvas from its size in pixels.

The numbers a format is applied to are fixed samples of what the analyses write (Gaussian scores as float32, the
probabilities of causal attention rows, similarities rounded as the similarity report rounds them): the sizes
follow the writers when a format changes, and never depend on the machine.
"""

from __future__ import annotations

import html
import json
import math
import random
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..base.outputs import json_text
from ..reports.html import DIGITS, Report
from ..reports.walk import TOP_HOVER

_SAMPLE = 2048  # numbers in each sample a format is measured on


def _f32(x: float) -> float:
    """``x`` rounded to float32, as a float32 tensor's ``tolist()`` gives it."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _scores() -> list[float]:
    """Float32 scores of unit scale (dot products, cosines, logits, activations)."""
    rng = random.Random(0)
    return [_f32(rng.gauss(0.0, 1.0)) for _ in range(_SAMPLE)]


def _probabilities() -> list[float]:
    """The probabilities on and below the diagonal of causal attention rows of 1 to 64 keys (softmax of Gaussian
    scores), as float32."""
    rng = random.Random(1)
    out: list[float] = []
    n = 1
    while len(out) < _SAMPLE:
        e = [math.exp(rng.gauss(0.0, 1.0)) for _ in range(n)]
        out += [_f32(v / sum(e)) for v in e]
        n = n % 64 + 1
    return out[:_SAMPLE]


def per_number(values: Sequence[Any], dumps: Callable[[list[Any]], str]) -> float:
    """Bytes per value of ``values`` written as a JSON list by ``dumps``, each with its separator."""
    sep = len(dumps([0, 0])) - len(dumps([0])) - 1  # "," or ", "
    return (len(dumps(list(values)).encode()) - len(dumps([]).encode()) + sep) / len(values)


def _spec(values: list[Any]) -> str:
    """A heatmap's cells as the report writes them into the page (:meth:`walklens.reports.html.Report.heatmap`:
    JSON with the default separators, HTML-escaped into an attribute)."""
    return html.escape(json.dumps(values))


#: a float32 written by the ``--json`` writer (:func:`walklens.base.outputs.json_text`): ``0.12345678359270096,``
JSON_FLOAT = per_number(_scores(), json_text)
#: an attention probability in the ``--json`` file: ``0.0,`` above the diagonal of a causal map, a float32 below
JSON_ATTN = (per_number([0.0] * 8, json_text) + per_number(_probabilities(), json_text)) / 2
#: a similarity-map cell in the report, rounded to 3 significant digits as the report rounds it: ``-12.3, ``
HTML_MAP_CELL = per_number([float(f"{10 * v:.3g}") for v in _scores()], _spec)
#: an attention-map cell in the report, rounded to the report's DIGITS decimals; half of a causal map is zeros
HTML_ATTN_CELL = (per_number([0.0] * 8, _spec) + per_number([round(v, DIGITS) for v in _probabilities()], _spec)) / 2
#: a number held in a Python list while JSON or HTML is built: the float object and its list slot, plus a quarter
#: for the lists' over-allocation and the row lists' own headers
PY_NUMBER = (sys.getsizeof(0.5) + struct.calcsize("P")) * 1.25
#: the largest figure a report draws (the walk's rank map: at most 18 x 14 inches) at the 110 dpi reports save at
FIGURE_PIXELS = (18 * 110) * (14 * 110)
#: drawing one figure: its RGBA canvas, the copy the PNG encoder works on, and the PNG (at most a byte a pixel)
FIGURE_MEMORY = FIGURE_PIXELS * (4 + 4 + 1)


def json_int(vocab: int) -> float:
    """A token id (or a rank) of a vocabulary of ``vocab`` tokens in the ``--json`` file: its largest, ``49151,``."""
    return per_number([max(vocab - 1, 0)], json_text)


#: the fixed part of a report page: the page rendered empty (its styles and scripts), and twice that for the
#: headings, notes, tables and embedded figures every report has (a command's report of a short text on a tiny
#: model is one to six empty pages)
HTML_FIXED = 3.0 * len(Report("").render().encode())


def _walk_cell(label: str = "token", rank: int = 1234) -> float:
    """One (position, point) of the walk report (:mod:`walklens.reports.walk`): in the walk's rank-map document
    (one per walk, drawn by results.js's ``rankMap``, both maps from it) a cell, ``log10(1 + rank)`` at DIGITS
    decimals, with its ranks and the TOP_HOVER nearest tokens once; in the nearest-token grid a coloured cell."""
    hover = f"rank of w_t {rank}, of w_t+1 {rank}\nnearest: " + ", ".join([repr(label)] * TOP_HOVER)
    cell = per_number([round(math.log10(1 + rank), DIGITS)], _spec) + per_number([hover], _spec)
    grid = len(f"<td style='background:#c8f0c8'>{html.escape(label)}</td>")
    return cell + grid


#: a (position, point) of the walk report
WALK_HTML_CELL = _walk_cell()

__all__ = [
    "JSON_FLOAT",
    "JSON_ATTN",
    "HTML_MAP_CELL",
    "HTML_ATTN_CELL",
    "PY_NUMBER",
    "FIGURE_PIXELS",
    "FIGURE_MEMORY",
    "WALK_HTML_CELL",
    "HTML_FIXED",
    "json_int",
    "per_number",
]
