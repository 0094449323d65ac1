"""The steering card's report (``walklens steer --card SET``; seed 002) and its JSON document: dose-response
curves with their bootstrap intervals (effect, wrong-way share, log perplexity, KL on neutral text) per kind of
target and method, the Pareto front of effect against coherence, the layer and dose chosen on ``choose`` with
their ``heldout`` numbers, and example continuations per dose.  It draws a
:class:`~walklens.lab.steeringcard.SteeringCard`; it never loads a model.

One builder, two renderings: :func:`_fill` writes the card's headings, notes, charts and tables into a
:data:`Sink`, which is the HTML :class:`~walklens.reports.html.Report` (:func:`build`) or the list of parts the
explorer's cards view draws with the reports' own script (:func:`view`; ``assets/results.js``, ``parts``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ...base.outputs import jsonable
from ...reports.html import Charts, Report, fields_of

if TYPE_CHECKING:
    from ..steeringcard import CardCell, SteeringCard

#: the dose-response curves: (CardCell field, label)
CURVES = (
    ("effect", "effect (steered - unsteered score)"),
    ("wrong_way", "share of prompts moved the wrong way"),
    ("log_ppl", "log perplexity of the continuation (unsteered model)"),
    ("kl", "KL(unsteered || steered) on neutral text"),
)
NAMES = {
    "eigen": "Eigen-steering",
    "add": "Activation addition (token direction)",
    "meandiff": "Mean-difference steering",
    "ablate": "Projection ablation (control)",
    "none": "Unsteered",
}
SCORES = {
    "token": "the target token's next-token log-prob under the steered model",
    "topic": "the mean log-prob of the topic's words after the continuation, under the unsteered model",
    "sentiment": "mean log-prob of the positive minus the negative words after the continuation, unsteered model",
}


def document(card: SteeringCard) -> dict[str, Any]:
    """The ``--json`` document: every field of the card (cells with their intervals, choices, examples)."""
    return fields_of(card)


class Parts(Charts):
    """A :data:`Sink` that keeps each part as plain data (``{"part": "h2" | "p" | "table" | "lines", ...}``),
    for the explorer's page to draw with ``walklensResults.draw.parts`` (strings as text, never markup)."""

    def __init__(self) -> None:
        self.parts: list[dict[str, Any]] = []

    def h2(self, text: str) -> Parts:
        self.parts.append({"part": "h2", "text": text})
        return self

    def p(self, text: str, note: bool = False) -> Parts:
        self.parts.append({"part": "p", "text": text, "note": note})
        return self

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str = "{:.4g}") -> Parts:
        cells = [[fmt.format(v) if isinstance(v, float) else v for v in r] for r in rows]
        self.parts.append({"part": "table", "headers": list(headers), "rows": jsonable(cells)})
        return self

    def _widget(self, kind: str, spec: dict[str, Any], title: str) -> Self:
        self.parts.append({"part": kind, "title": title, "spec": spec})
        return self


#: what the card's builder writes into: the HTML report or the explorer's parts
Sink = Report | Parts
S = TypeVar("S", Report, Parts)


def _label(c: CardCell) -> str:
    """A cell's short name: method, layer, dose."""
    if c.method == "none":
        return "unsteered"
    dose = f"realised dose {c.realised_dose:.2f}" if math.isnan(c.dose) else f"dose {c.dose:g}"
    return f"{c.method} L{c.layer} {dose}"


def _num(v: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if v is None or not math.isfinite(v) else fmt.format(v)


def _iv(c: CardCell, name: str) -> str:
    iv = getattr(c, name)
    return "-" if iv is None else f"{_num(iv.value)} [{_num(iv.lo)}, {_num(iv.hi)}]"


def _curves(r: Sink, card: SteeringCard, kind: str) -> None:
    """Dose-response curves (heldout) of each dosed method: one chart per :data:`CURVES` entry, a series with its
    band per method and layer."""
    cells = card.select("heldout", kind)
    doses = card.doses
    for name, label in CURVES:
        series = []
        for m in card.methods:
            if m == "ablate":
                continue
            for l in card.layers:
                got = {c.dose: getattr(c, name) for c in cells if c.method == m and c.layer == l}
                if not got:
                    continue
                ys = [got[d].value if d in got else None for d in doses]
                band = [
                    [got[d].lo if d in got else None for d in doses],
                    [got[d].hi if d in got else None for d in doses],
                ]
                series.append({"name": f"{m} L{l}", "y": ys, "band": band})
        r.lines(
            [f"{d:g}" for d in doses],
            series,
            title=f"{kind}: {label} (heldout, 95% bootstrap band)",
            xlabel="dose",
            height=260,
        )


def _tables(r: Sink, card: SteeringCard, kind: str) -> None:
    heads = ["cell", "effect", "wrong way", "log ppl", "KL neutral", "repetition", "rank (median)", "n"]
    front = sorted((c for c in card.select("heldout", kind) if c.on_front), key=lambda c: c.log_ppl.value)
    base = [c for c in card.select("heldout", kind) if c.method == "none"]
    rows = [
        [_label(c), *(_iv(c, k) for k in ("effect", "wrong_way", "log_ppl", "kl", "repetition", "rank")), c.effect.n]
        for c in base + front
    ]
    r.h2(f"{kind}: Pareto front of effect against log perplexity (heldout)")
    r.table(heads, rows)
    r.h2(f"{kind}: layer and dose chosen on 'choose', reported on 'heldout'")
    ch = []
    for x in card.choices:
        if x.kind != kind:
            continue
        c = x.heldout
        where = "none within budget" if c is None else _label(c)
        nums = (
            ["-"] * 6
            if c is None
            else [_iv(c, k) for k in ("effect", "wrong_way", "log_ppl", "kl", "repetition", "rank")]
        )
        ch.append([NAMES.get(x.method, x.method), where, *nums])
    r.table(["method", "chosen on choose", *heads[1:-1]], ch)


def build(card: SteeringCard, title: str = "") -> Report:
    """The steering card's report (module docstring)."""
    r = Report(
        title or f"Steering card: {card.model_name} on {card.set_name}",
        "Eigen-steering (seed 002: rank-one W_O edit) next to activation addition, mean-difference steering and "
        "projection ablation, on one dose scale: the norm of the change added to the residual stream at the layer "
        "over the mean residual norm there.",
    )
    _fill(r, card)
    return r


def view(card: SteeringCard) -> list[dict[str, Any]]:
    """The report's parts as data (:class:`Parts`): what the explorer's cards view draws."""
    return _fill(Parts(), card).parts


def _fill(r: S, card: SteeringCard) -> S:
    """Every part of the card's report, written into ``r`` (a :data:`Sink`); returns ``r``."""
    r.p(
        f"set {card.set_name} ({card.set_id}); layers {card.layers}; doses {card.doses}; {card.max_new_tokens}-token "
        f"greedy continuations; {card.n_boot} bootstrap resamples (seed {card.seed}); the choice on 'choose' keeps "
        f"a mean log perplexity within log({card.ppl_ratio:g}) of the unsteered continuations'.",
        note=True,
    )
    for kind in dict.fromkeys(c.kind for c in card.cells):
        r.h2(f"{kind} targets: effect = change of {SCORES.get(kind, 'the score')}")
        _curves(r, card, kind)
        _tables(r, card, kind)
    r.h2("Example continuations (first heldout prompt of each target)")
    r.table(
        ["target", "cell", "prompt", "continuation"],
        [
            [
                e.target,
                "unsteered" if e.method == "none" else f"{e.method} L{e.layer} dose {_num(e.dose, '{:g}')}",
                e.prompt,
                e.text,
            ]
            for e in card.examples
        ],
    )
    return r


__all__ = ["CURVES", "Parts", "Sink", "build", "document", "view"]
