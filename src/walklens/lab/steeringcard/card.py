"""The steering card (seed 002, last sentence of the abstract: the power-method analogy "suggests a method to
steer the output of the transformer towards an arbitrary desired direction"): eigen-steering next to
activation addition, mean-difference steering and projection ablation, on one dose scale, over a steering
set's prompts.

For each method x layer x dose and each kind of target, on each split: the **effect** (per prompt, steered
minus unsteered ``score``, :func:`~walklens.lab.steeringcard.run.unit_rows`), the share of prompts moved the
**wrong way** (effect < 0), the target's rank (token targets), and coherence: the continuation's **log
perplexity** under the unsteered model, the **KL** of the next-token distribution on neutral texts, and
**repetition** (share of repeated 3-grams); each with a seeded percentile-bootstrap interval over prompts
(over neutral texts for KL).  Layer and dose are chosen per method on ``choose`` (the largest mean effect
whose mean log perplexity is within ``log(ppl_ratio)`` of the unsteered continuations') and reported on
``heldout``; the Pareto front of effect against log perplexity is marked per kind on ``heldout``.

Where it runs: the plan (norms, directions, calibration, the unsteered neutral passes) and every unit of work
(one method x layer x dose over one target's prompts, or over the neutral texts) are shards of
:mod:`walklens.core.backends` (``fn(lm, ctx, payload)``), run on the driver's model (local) or on Ray actors that
hold the model once each; the driver alone tokenises and writes each returned unit into the store, one
transaction each, so a stopped card resumes without repeating a stored unit on either backend.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...base.errors import ContextTooLongError, InputError, UnsupportedFamilyError
from ...base.numbers import MAX_ALPHA, Range, show
from ...core.backends.base import LocalWorkers, Workers
from ...core.capture import context_limit, tokenize
from ...core.interventions import resolve_layers
from .cells import SteeringCard, summarise
from .run import (
    METHODS,
    change_point,
    intervene,
    mean_difference,
    mean_norm,
    neutral_pass,
    neutral_rows,
    token_direction,
    unit_rows,
)
from .sets import SPLITS, Prompt, SteeringSet, load_steering_set
from .store import NEUTRAL_ROW, CardStore, Expected, row_schema

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

DOSES = (0.25, 0.5, 1.0, 2.0)
#: the largest dose: a change of 100 times the mean residual norm drowns the residual stream, beyond any steering
MAX_DOSE = 100.0
DOSE = Range(0, MAX_DOSE, open_lo=True)


@dataclass
class _Cell:
    """One planned cell: method, layer, nominal dose and, per target, the direction and alpha."""

    method: str
    layer: int | None
    dose: float
    u: dict[str, torch.Tensor] = field(default_factory=dict)
    alpha: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return "none" if self.layer is None else f"{self.method}/L{self.layer}/d{self.dose:g}"


def _fingerprint(lm: LoadedModel) -> str:
    """The model's name, dtype and a hash of a few of its weights (a changed model never reads stored rows)."""
    h = hashlib.sha256(f"{lm.name}|{lm.dtype}".encode())
    for p in list(lm.model.parameters())[:: max(1, len(list(lm.model.parameters())) // 8)]:
        h.update(p.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _check(
    lm: LoadedModel, methods: Sequence[str], doses: Sequence[float], layers: Sequence[int]
) -> tuple[list[str], list[float], list[int]]:
    if not lm.is_causal:
        raise UnsupportedFamilyError("a steering card generates text and needs a causal LM")
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise InputError(f"unknown steering method(s) {', '.join(bad) or '(none)'}; choose from {', '.join(METHODS)}")
    if not doses:
        raise InputError("give at least one dose")
    checked = [float(DOSE.check(d, "a dose")) for d in doses]
    return list(dict.fromkeys(methods)), checked, resolve_layers(lm, list(layers))


def _plan(
    lm: LoadedModel, sset: SteeringSet, methods: list[str], doses: list[float], layers: list[int]
) -> tuple[list[_Cell], dict[int, float]]:
    """Every cell with its directions and alphas (module docstring of :mod:`.run`, "Dose")."""
    norms = {l: mean_norm(lm, sset.neutral, l) for l in layers}
    tok = {name: token_direction(lm, t) for name, t in sset.targets.items()}
    cells = [_Cell("none", None, 0.0)]
    for l in layers:
        md = (
            {name: mean_difference(lm, t, l) for name, t in sset.targets.items()}
            if {"meandiff", "ablate"} & set(methods)
            else {}
        )
        for m in methods:
            u = tok if m in ("eigen", "add") else md
            if m == "ablate":
                cells.append(_Cell(m, l, math.nan, u=u, alpha=dict.fromkeys(u, 0.0)))
                continue
            unit = {name: 1.0 for name in u}
            if m == "eigen":
                pt = change_point(m)
                base = neutral_pass(lm, sset.neutral, l, pt, None)
                for name in u:
                    moved = neutral_pass(lm, sset.neutral, l, pt, intervene(lm, m, l, u[name], 1.0))
                    unit[name] = sum(r["dose"] for r in neutral_rows(base, moved, norms[l])) / len(sset.neutral)
            for d in doses:  # eigen: the dose at alpha = 1 scaled (linear); the others: alpha u, |u| = 1
                alpha = {name: _alpha(d, unit[name]) if m == "eigen" else d * norms[l] for name in u}
                cells.append(_Cell(m, l, d, u=u, alpha=alpha))
    return cells, norms


def _alpha(dose: float, unit: float) -> float:
    """Eigen-steering's alpha for ``dose`` given the dose it realises at alpha = 1 (inf when it realises none)."""
    return dose / unit if unit > 0 else math.inf


def _tokens(lm: LoadedModel, text: str, where: str) -> list[int]:
    """A text of the set as the card tokenises it; an empty or over-long one is one line naming it."""
    try:
        return [int(t) for t in tokenize(lm, text)[0].tolist()]
    except ContextTooLongError:  # capture's message offers --truncate, which the card has not: a set's text is cut
        n = len(lm.tokenizer(text)["input_ids"])  # by nobody but its author
        raise InputError(
            f"{where}: has {_n(n)}, more than the model's context of {context_limit(lm)} positions; shorten it"
        ) from None
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def _n(count: int) -> str:
    return f"{count} token{'' if count == 1 else 's'}"


def _check_target(lm: LoadedModel, sset: SteeringSet, name: str) -> None:
    """A target's token is one token, its words none the unknown token, its pair texts of 2 tokens or more."""
    tok, t = lm.tokenizer, sset.targets[name]
    here = f"steering set {sset.name}: target {show(name)}"
    unk = tok.unk_token_id
    words = [("token", t.token)] if t.kind == "token" else [("word", w) for w in t.words + t.negative_words]
    for what, w in words:
        ids = tok(w, add_special_tokens=False)["input_ids"]
        shown = f"{here}: {what} {w[:40]!r}"
        if not ids or (what == "token" and len(ids) != 1):
            need = "a token target is one token" if what == "token" else "a word is scored by its first token"
            raise InputError(f"{shown} is {_n(len(ids))} for this model's tokenizer ({need})")
        if unk is not None and ids[0] == unk:
            raise InputError(f"{shown} is the unknown token {tok.unk_token} for this model's tokenizer")
    for pair in t.pairs:
        for text in pair:
            shown = f"{here}: pair text {text[:40]!r}"
            n = len(_tokens(lm, text, shown))
            if n < 2:
                raise InputError(f"{shown} is {_n(n)}; the card reads every position but the first")


def check_set(lm: LoadedModel, sset: SteeringSet, limit: int | None) -> dict[str, list[tuple[str, list[int]]]]:
    """Refuse, before any work, a set this model cannot run (a token target of several tokens or the unknown
    token, a word of no token, a pair or neutral text of one token, a text longer than the context); the first
    ``limit`` prompts of each target in each split, tokenised (all when None)."""
    for name in sset.targets:
        _check_target(lm, sset, name)
    for i, text in enumerate(sset.neutral, 1):
        n = len(_tokens(lm, text, f"steering set {sset.name}: neutral text {i}"))
        if n < 2:
            raise InputError(
                f"steering set {sset.name}: neutral text {i} {text[:40]!r} is {_n(n)}; the dose and KL are read at "
                "every position but the first"
            )
    chosen: dict[str, list[Prompt]] = {
        t: [p for s in SPLITS for p in [p for p in sset.prompts if p.target == t and p.split == s][:limit]]
        for t in sset.targets
    }
    where = f"steering set {sset.name}: prompt"
    return {t: [(p.id, _tokens(lm, p.text, f"{where} {p.id}")) for p in ps] for t, ps in chosen.items()}


def check_new_tokens(lm: LoadedModel, longest: int, n: int, option: str = "max_new_tokens") -> None:
    """Refuse ``n`` new tokens after a ``longest``-token prompt beyond the model's context (before generating)."""
    limit = context_limit(lm)
    if limit is not None and longest + n > limit:
        raise InputError(
            f"{option}: a prompt of {longest} tokens and {n} new tokens exceed the model's context of {limit} "
            f"positions (at most {max(limit - longest, 0)} new tokens fit)"
        )


def _check_plan(sset: SteeringSet, cells: list[_Cell]) -> None:
    """Every planned direction finite and non-zero, every alpha finite and within ±MAX_ALPHA (one line)."""
    for c in cells:
        for name, u in c.u.items():
            if not bool(torch.isfinite(u).all()) or float(u.norm()) == 0.0:
                raise InputError(
                    f"steering set {sset.name}: target {show(name)}: the {c.method} direction at layer {c.layer} is "
                    "zero or not finite (its words or pairs give no direction)"
                )
        for name, a in c.alpha.items():
            if not abs(a) <= MAX_ALPHA:
                raise InputError(
                    f"dose {c.dose:g} of {c.method} at layer {c.layer} needs alpha {a:.3g} for target {show(name)}, "
                    f"beyond ±{MAX_ALPHA:g}: give smaller doses"
                )


def _vocab(lm: LoadedModel) -> int:
    """The number of next-token logits (the ranks' bound)."""
    head = lm.hf.get_output_embeddings()
    rows = int(head.weight.shape[0]) if head is not None and hasattr(head, "weight") else 0
    return max(rows, int(lm.embedding_matrix().shape[0]))


def steering_card(
    lm: LoadedModel,
    steering_set: str | Path | SteeringSet,
    *,
    layers: Sequence[int],
    doses: Sequence[float] = DOSES,
    methods: Sequence[str] = METHODS,
    max_new_tokens: int = 16,
    seed: int = 0,
    n_boot: int = 1000,
    ppl_ratio: float = 2.0,
    limit: int | None = None,
    store: str | Path | None = None,
    progress: bool = False,
    workers: Workers | None = None,
) -> SteeringCard:
    """The steering card of ``lm`` over a steering set (a shipped name, a JSONL path or a loaded
    :class:`~walklens.lab.steeringcard.sets.SteeringSet`): every method at every layer and dose (ablation once per
    layer), both splits (the first ``limit`` prompts of each target in each, all when None); generations are kept
    in ``store`` (an SQLite file; None: in memory), so a card that was stopped resumes where it was.  ``workers``
    (:meth:`walklens.core.backends.Backend.workers`, e.g. Ray actors holding the model ``lm`` was loaded from) run the
    plan and the units; None: this process, on ``lm``.  Module docstring for what is measured."""
    sset = steering_set if isinstance(steering_set, SteeringSet) else load_steering_set(steering_set)
    methods, doses, layers = _check(lm, methods, doses, layers)
    if max_new_tokens < 1 or (limit is not None and limit < 1):
        raise InputError("max_new_tokens and limit must be at least 1")
    prompts = check_set(lm, sset, limit)
    check_new_tokens(lm, max((len(q) for ps in prompts.values() for _, q in ps), default=0), max_new_tokens)
    pool = LocalWorkers(lm) if workers is None else workers
    db = CardStore(store)
    try:
        run = f"{_fingerprint(lm)}|{sset.set_id}|n{max_new_tokens}|limit{limit}"
        ((_, (cells, norms, base)),) = list(pool.map(_plan_shard, sset, [(methods, doses, layers)]))
        _check_plan(sset, cells)
        ctx = (sset, prompts, max_new_tokens, base, norms)
        rows, generated, stored = _units(pool, ctx, cells, (db, run, _vocab(lm)), progress=progress)
    finally:
        db.close()
    return summarise(
        lm.name,
        sset,
        [(c.key, c.method, c.layer, c.dose, c.alpha) for c in cells],
        rows,
        settings={
            "methods": methods,
            "layers": layers,
            "doses": doses,
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "n_boot": n_boot,
            "ppl_ratio": ppl_ratio,
            "mean_norms": norms,
            "limit": limit,
            "units_generated": generated,
            "units_stored": stored,
        },
    )


def _plan_shard(
    lm: LoadedModel, sset: SteeringSet, payload: tuple[list[str], list[float], list[int]]
) -> tuple[list[_Cell], dict[int, float], dict[tuple[int, str], Any]]:
    """The plan as a shard: every cell, the mean residual norms and the unsteered neutral passes of each
    (layer, change point) the cells read."""
    cells, norms = _plan(lm, sset, *payload)
    base = {
        (c.layer, change_point(c.method)): neutral_pass(lm, sset.neutral, c.layer, change_point(c.method), None)
        for c in cells
        if c.layer is not None
    }
    return cells, norms, base


#: What every unit shard reads: the set, each target's tokenised prompts, the continuation length, the
#: unsteered neutral passes and the mean residual norms.
UnitContext = tuple[
    SteeringSet, dict[str, list[tuple[str, list[int]]]], int, dict[tuple[int, str], Any], dict[int, float]
]


def _unit_shard(lm: LoadedModel, ctx: UnitContext, payload: tuple[_Cell, str, str]) -> list[dict[str, Any]]:
    """One unit of work as a shard (:func:`_unit`)."""
    sset, prompts, n, base, norms = ctx
    c, t, part = payload
    return _unit(lm, sset, c, t, part, prompts[t], n, (base, norms))


def _units(
    pool: Workers,
    ctx: UnitContext,
    cells: list[_Cell],
    saved: tuple[CardStore, str, int],
    *,
    progress: bool,
) -> tuple[dict[tuple[str, str, str], list[dict[str, Any]]], int, int]:
    """Every unit's rows, read from the store or run on ``pool`` and stored by this process as they come back
    (one transaction each), each checked as the store declares its rows; how many units were computed and how
    many read.  ``saved``: the store, the run's key in it and the model's vocabulary (the ranks' bound)."""
    from tqdm.auto import tqdm

    db, run, vocab = saved
    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}

    def expected(t: str, part: str) -> Expected:
        if part == "neutral":
            return Expected(NEUTRAL_ROW, count=len(ctx[0].neutral))
        ranked = ctx[0].targets[t].kind == "token"
        return Expected(row_schema(vocab, ctx[2], ranked), ids=tuple(pid for pid, _ in ctx[1][t]))

    def keep(c: _Cell, t: str, part: str, got: list[dict[str, Any]]) -> None:
        if part == "neutral":
            rows[(c.key, t, part)] = got
        else:
            for s in SPLITS:
                rows[(c.key, t, s)] = [r for r in got if r["id"].split("/")[-2] == s]

    units = [(c, t, part) for c in cells for t in ctx[0].targets for part in ("prompts", "neutral")]
    todo = []
    for c, t, part in units:
        got = db.get(run, f"{c.key}/{t}/{part}", expected(t, part))
        if got is None:
            todo.append((c, t, part))
        else:
            keep(c, t, part, got)
    # one part per layer, its context holding only that layer's unsteered neutral passes (each part's context is
    # copied once to the workers where a backend copies them); the cells are already in layer order
    sset, prompts, n, base, norms = ctx
    layers = list(dict.fromkeys(c.layer for c, _, _ in todo))
    order = [u for l in layers for u in todo if u[0].layer == l]
    parts = [
        ((sset, prompts, n, {k: v for k, v in base.items() if k[0] == l}, norms), [u for u in todo if u[0].layer == l])
        for l in layers
    ]
    done = pool.map_parts(_unit_shard, parts)
    for i, got in tqdm(done, total=len(todo), desc="steering card", disable=not progress, leave=False):
        c, t, part = order[i]
        db.put(run, f"{c.key}/{t}/{part}", got, expected(t, part))
        keep(c, t, part, got)
    return rows, len(todo), len(units) - len(todo)


def _unit(
    lm: LoadedModel,
    sset: SteeringSet,
    c: _Cell,
    t: str,
    part: str,
    prompts: list[tuple[str, list[int]]],
    n: int,
    neutral: tuple[dict[tuple[int, str], Any], dict[int, float]],
) -> list[dict[str, Any]]:
    """One unit of work: the prompts of target ``t`` (both splits), or the neutral texts (KL, realised dose);
    ``neutral``: the unsteered neutral passes and the mean residual norms."""
    base, norms = neutral
    layer = c.layer if c.layer is not None else 0
    ctx = intervene(lm, c.method, layer, c.u.get(t, torch.zeros(1)), c.alpha.get(t, 0.0))
    if part == "neutral":
        pt = change_point(c.method)
        if c.layer is None:
            return [{"kl": 0.0, "dose": 0.0} for _ in sset.neutral]
        return neutral_rows(base[(layer, pt)], neutral_pass(lm, sset.neutral, layer, pt, ctx), norms[layer])
    return unit_rows(lm, sset.targets[t], prompts, n, ctx)


__all__ = ["DOSES", "MAX_DOSE", "check_new_tokens", "check_set", "steering_card"]
