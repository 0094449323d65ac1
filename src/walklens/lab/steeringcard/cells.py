"""The steering card as plain dataclasses (seed 002's steering, measured): one :class:`CardCell` per split x
kind of target x method x layer x dose, the layer and dose each method gets on ``choose`` reported on
``heldout`` (:class:`CardChoice`), and example continuations; built from the stored rows by :func:`summarise`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import Columns, DataFrame, frame, pick, record_table
from .sets import KINDS, SPLITS, SteeringSet
from .stats import Interval, bootstrap, choose, pareto, wrong_way


@dataclass
class CardCell:
    """One method at one layer and dose over the prompts of one kind of target in one split.  ``method`` is
    ``none`` for the unsteered model (layer None); ``dose`` the nominal dose (NaN for ``ablate``, which has
    none), ``realised_dose`` the one measured on the neutral texts, ``alpha`` the mean over targets of the
    strength that gave it.  ``effect``: mean steered-minus-unsteered score; ``wrong_way``: share of prompts with
    effect < 0; ``rank``: median 0-based rank of the target token (token targets, else None); ``log_ppl``: mean
    log perplexity of the continuations under the unsteered model; ``kl``: mean KL(unsteered || steered) of
    the next-token distribution on the neutral texts; ``repetition``: mean share of repeated 3-grams.
    ``on_front``: on the Pareto front of effect against log perplexity (heldout, per kind)."""

    split: str
    kind: str
    method: str
    layer: int | None
    dose: float
    realised_dose: float
    alpha: float
    effect: Interval
    wrong_way: Interval
    rank: Interval | None
    log_ppl: Interval
    kl: Interval
    repetition: Interval
    on_front: bool = False


@dataclass
class CardChoice:
    """The layer and dose a method gets on ``choose`` for one kind (the largest mean effect whose mean log
    perplexity stays within ``budget``), and its ``heldout`` cell; layer None when no cell was within it."""

    kind: str
    method: str
    layer: int | None
    dose: float
    budget: float
    heldout: CardCell | None


@dataclass
class CardExample:
    """A continuation of the first heldout prompt of a target under one cell."""

    kind: str
    target: str
    method: str
    layer: int | None
    dose: float
    prompt: str
    text: str


@dataclass
class SteeringCard(Shown, view="steering_card"):
    """The steering card of a model over a steering set (:func:`~walklens.lab.steeringcard.steering_card`)."""

    model_name: str
    set_name: str
    set_id: str
    methods: list[str]
    layers: list[int]
    doses: list[float]
    max_new_tokens: int
    seed: int
    n_boot: int
    ppl_ratio: float
    mean_norms: dict[int, float]
    limit: int | None
    units_generated: int
    units_stored: int
    cells: list[CardCell] = field(default_factory=list)
    choices: list[CardChoice] = field(default_factory=list)
    examples: list[CardExample] = field(default_factory=list)

    @classmethod
    def from_document(cls, doc: Any) -> SteeringCard:
        """The card again from its JSON document (``walklens steer --card SET --json``: every field, NaN written
        as null); a document that is not one is a :class:`~walklens.base.errors.InputError` naming what is wrong."""
        try:
            if not isinstance(doc, dict):
                raise TypeError("not a JSON object")
            d = dict(doc)
            d["doses"] = [_num(v) for v in d["doses"]]
            d["ppl_ratio"] = _num(d["ppl_ratio"])
            d["mean_norms"] = {int(k): _num(v) for k, v in d["mean_norms"].items()}
            d["cells"] = [_cell_of(c) for c in d.get("cells", [])]
            d["choices"] = [
                CardChoice(
                    **{**c, "dose": _num(c["dose"]), "budget": _num(c["budget"]), "heldout": _cell_of(c["heldout"])}
                )
                if c["heldout"] is not None
                else CardChoice(**{**c, "dose": _num(c["dose"]), "budget": _num(c["budget"])})
                for c in d.get("choices", [])
            ]
            d["examples"] = [CardExample(**{**e, "dose": _num(e["dose"])}) for e in d.get("examples", [])]
            card = cls(**d)
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise InputError(f"not a steering card document ({e.__class__.__name__}: {str(e)[:120]})") from None
        if not all(isinstance(v, str) for v in (card.model_name, card.set_name, card.set_id)):
            raise InputError("not a steering card document (model_name, set_name and set_id must be text)")
        return card

    def select(self, split: str, kind: str, method: str | None = None) -> list[CardCell]:
        """The cells of one split and kind (and method)."""
        return [c for c in self.cells if c.split == split and c.kind == kind and method in (None, c.method)]

    def _columns(self, table: str = "cells") -> Columns:
        def flat(c: CardCell) -> dict[str, Any]:
            d: dict[str, Any] = {k: getattr(c, k) for k in ("split", "kind", "method", "layer", "dose")}
            d.update(realised_dose=c.realised_dose, alpha=c.alpha, on_front=c.on_front)
            for k in ("effect", "wrong_way", "rank", "log_ppl", "kl", "repetition"):
                iv = getattr(c, k)
                for part in ("value", "lo", "hi"):
                    d[k if part == "value" else f"{k}_{part}"] = None if iv is None else getattr(iv, part)
            d["n"] = c.effect.n
            return d

        def choice(ch: CardChoice) -> dict[str, Any]:
            d = {"kind": ch.kind, "method": ch.method, "layer": ch.layer, "dose": ch.dose, "budget": ch.budget}
            return {**d, **({} if ch.heldout is None else {k: v for k, v in flat(ch.heldout).items() if k not in d})}

        return pick(
            table,
            {
                "cells": lambda: record_table([flat(c) for c in self.cells]),
                "choices": lambda: record_table([choice(ch) for ch in self.choices]),
                "examples": lambda: record_table([vars(e) for e in self.examples]),
            },
            "a SteeringCard",
        )

    def to_pandas(self, table: str = "cells") -> DataFrame:
        """The card as tables (pandas; docs/notebooks.md, "Tables"): ``cells`` one row per split x kind x
        method x layer x dose (each interval as ``X``, ``X_lo``, ``X_hi``), ``choices`` the layer and dose
        chosen on ``choose`` with the heldout numbers, ``examples`` the example continuations."""
        return frame(self._columns(table), {"model": self.model_name, "set": self.set_name})


def _num(v: Any) -> float:
    """A number of a JSON document (null: NaN, as :func:`walklens.base.outputs.jsonable` writes it)."""
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{str(v)[:40]!r} is not a number")
    return float(v)


def _interval(d: Any) -> Interval:
    return Interval(_num(d["value"]), _num(d["lo"]), _num(d["hi"]), int(d["n"]))


def _cell_of(d: Any) -> CardCell:
    """A :class:`CardCell` from its document."""
    ivs = {k: _interval(d[k]) for k in ("effect", "wrong_way", "log_ppl", "kl", "repetition")}
    nums = {k: _num(d[k]) for k in ("dose", "realised_dose", "alpha")}
    rank = None if d["rank"] is None else _interval(d["rank"])
    return CardCell(**{**d, **ivs, **nums, "rank": rank})


Spec = tuple[str, str, "int | None", float, dict[str, float]]  # key, method, layer, dose, alpha per target


def _cell(
    spec: Spec, split: str, kind: str, targets: list[str], rows: dict[tuple[str, str, str], Any], s: dict[str, Any]
) -> CardCell:
    key, method, layer, dose, alpha = spec
    base = {r["id"]: r for t in targets for r in rows[("none", t, split)]}
    got = [r for t in targets for r in rows[(key, t, split)]]
    neutral = [r for t in targets for r in rows[(key, t, "neutral")]]
    effects = [r["score"] - base[r["id"]]["score"] for r in got]
    seed, n_boot = int(s["seed"]), int(s["n_boot"])
    return CardCell(
        split=split,
        kind=kind,
        method=method,
        layer=layer,
        dose=dose,
        realised_dose=sum(r["dose"] for r in neutral) / max(len(neutral), 1),
        alpha=sum(alpha.get(t, 0.0) for t in targets) / len(targets),
        effect=bootstrap(effects, seed=seed, n_boot=n_boot),
        wrong_way=wrong_way(effects, seed=seed, n_boot=n_boot),
        rank=bootstrap([r["rank"] for r in got], stat="median", seed=seed, n_boot=n_boot) if kind == "token" else None,
        log_ppl=bootstrap([r["log_ppl"] for r in got], seed=seed, n_boot=n_boot),
        kl=bootstrap([r["kl"] for r in neutral], seed=seed, n_boot=n_boot),
        repetition=bootstrap([r["repetition"] for r in got], seed=seed, n_boot=n_boot),
    )


def _choices(cells: list[CardCell], kind: str, methods: list[str], ratio: float) -> list[CardChoice]:
    """Per method, the layer and dose chosen on ``choose`` (class docstring of :class:`CardChoice`)."""
    ch = [c for c in cells if c.split == "choose" and c.kind == kind]
    base = next(c for c in ch if c.method == "none")
    budget = base.log_ppl.value + math.log(ratio)
    out = []
    for m in methods:
        cand = [c for c in ch if c.method == m]
        i = choose([(c.effect.value, c.log_ppl.value) for c in cand], budget)
        pick_ = None if i is None else cand[i]
        held = None
        if pick_ is not None:
            held = next(
                c
                for c in cells
                if c.split == "heldout"
                and c.kind == kind
                and (c.method, c.layer) == (m, pick_.layer)
                and (c.dose == pick_.dose or (math.isnan(c.dose) and math.isnan(pick_.dose)))
            )
        out.append(
            CardChoice(
                kind, m, None if pick_ is None else pick_.layer, math.nan if pick_ is None else pick_.dose, budget, held
            )
        )
    return out


def summarise(
    model_name: str,
    sset: SteeringSet,
    specs: Sequence[Spec],
    rows: dict[tuple[str, str, str], Any],
    *,
    settings: dict[str, Any],
) -> SteeringCard:
    """The card from every unit's rows (module docstring)."""
    card = SteeringCard(model_name=model_name, set_name=sset.name, set_id=sset.set_id, **settings)
    kinds = [k for k in KINDS if any(t.kind == k for t in sset.targets.values())]
    for split in SPLITS:
        for kind in kinds:
            targets = [n for n, t in sset.targets.items() if t.kind == kind]
            if not any(p.split == split and p.target in targets for p in sset.prompts):
                continue
            cells = [_cell(spec, split, kind, targets, rows, settings) for spec in specs]
            if split == "heldout":
                steered = [c for c in cells if c.method != "none"]
                for i in pareto([(c.effect.value, c.log_ppl.value) for c in steered]):
                    steered[i].on_front = True
            card.cells += cells
    for kind in kinds:
        if any(c.kind == kind and c.split == "choose" for c in card.cells) and any(
            c.kind == kind and c.split == "heldout" for c in card.cells
        ):
            card.choices += _choices(card.cells, kind, card.methods, card.ppl_ratio)
    texts = {p.id: p.text for p in sset.prompts}
    for key, method, layer, dose, _ in specs:
        for name, t in sset.targets.items():
            got = rows[(key, name, "heldout")]
            if got:
                card.examples.append(
                    CardExample(t.kind, name, method, layer, dose, texts[got[0]["id"]], got[0]["text"])
                )
    return card


__all__ = ["CardCell", "CardChoice", "CardExample", "SteeringCard", "summarise"]
