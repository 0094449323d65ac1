"""The whole agreement study of one model (docs/dtype.md, "Agreement study"): the baseline, Test 1's standard
scheme, Test 2's and Test 1's sweeps, each compared in two dtypes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ....analyses.concepts.schemes import Scheme
from ....base.errors import InputError
from ....base.precision import dtype_name, model_label, parse_dtype
from ...hellaswag.store import ResultStore, RunKey, SweepStore
from .runs import RunAgreement, compare_runs
from .sweeps import GridAgreement, Ranking, Scope, compare_sweeps

#: What :func:`agreement_study` compares (all by default).
PARTS = ("baseline", "test1", "test2-grid", "test1-grid")
#: what produces a missing run of each dtype, given the command (added to the error)
Hints = Callable[[str], tuple[str, str]]


@dataclass(frozen=True)
class AgreementStudy:
    """Every part of the study (:data:`PARTS`) for one model; a part not asked for is None."""

    model: str
    reference_dtype: str
    other_dtype: str
    reference: str  # the runs' model names (the model's name with its dtype)
    other: str
    data: str
    shots: int
    items: int | None
    baseline: RunAgreement | None
    test1_standard: RunAgreement | None
    test2_grid: GridAgreement | None
    test1_grid: GridAgreement | None


def agreement_study(
    db: str | Path,
    model: str,
    scope: Scope,
    *,
    other: str = "bfloat16",
    reference: str = "float32",
    parts: Sequence[str] = PARTS,
    ranking: Ranking = Ranking(),  # noqa: B008  # a frozen dataclass: a shared default is safe
) -> AgreementStudy:
    """Compare ``model`` (its name without a dtype) run in ``reference`` and in ``other`` dtype, from the
    database ``db``: the baseline, Test 1's standard scheme (single runs, ``walklens hellaswag``), Test 2's and
    Test 1's sweeps (``walklens sweep``), within ``scope`` (data key, shots, the first ``scope.items`` items, else
    the items both hold).  Test 1's standard scheme is the decoder-only one (word ``w1mean``)."""
    dts = _dtypes(model, parts, reference, other)
    labels = [model_label(model, dt) for dt in dts]
    hints = _hints(db, model, dts, scope)
    found: dict[str, Any] = {}
    if {"baseline", "test1"} & set(parts):
        found.update(_single_runs(db, labels, scope, parts, hints))
    for part, t in (("test2-grid", 2), ("test1-grid", 1)):
        if part in parts:
            with SweepStore(db, readonly=True) as ss:
                found[part] = compare_sweeps(
                    ss, labels[0], labels[1], t, scope, ranking=ranking, hints=hints(f"sweep --test {t} --grid GRID")
                )
    return AgreementStudy(
        model=model,
        reference_dtype=dtype_name(dts[0]),
        other_dtype=dtype_name(dts[1]),
        reference=labels[0],
        other=labels[1],
        data=scope.data,
        shots=scope.shots,
        items=scope.items,
        baseline=found.get("baseline"),
        test1_standard=found.get("test1"),
        test2_grid=found.get("test2-grid"),
        test1_grid=found.get("test1-grid"),
    )


def _dtypes(model: str, parts: Sequence[str], reference: str, other: str) -> tuple[torch.dtype, torch.dtype]:
    """The reference and the other dtype, once the parts asked for and the model's name are checked."""
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise InputError(f"unknown part(s) {bad or parts}; use any of {', '.join(PARTS)}")
    if "@" in model:
        raise InputError(
            f"give the model's name without a dtype (not {model!r}): its runs are found by --reference and --other"
        )
    dts = (parse_dtype(reference), parse_dtype(other))
    if dts[0] == dts[1]:
        raise InputError(f"the reference and the other dtype are both {dtype_name(dts[0])}")
    return dts


def _hints(db: str | Path, model: str, dts: tuple[torch.dtype, torch.dtype], scope: Scope) -> Hints:
    """What produces a missing run: ``hints(command)`` is the line added to the error for each dtype's run."""
    limit = f" --limit {scope.items}" if scope.items is not None else ""

    def hints(cmd: str) -> tuple[str, str]:
        ref, oth = (
            f"; run: walklens {cmd} --model {model} --dtype {dtype_name(dt)} --shots {scope.shots}{limit} --db {db}"
            for dt in dts
        )
        return ref, oth

    return hints


def _single_runs(
    db: str | Path, labels: list[str], scope: Scope, parts: Sequence[str], hints: Hints
) -> dict[str, RunAgreement]:
    """The single runs among ``parts`` (the baseline, Test 1's standard scheme) compared in both dtypes."""
    found: dict[str, RunAgreement] = {}
    with ResultStore(db, readonly=True) as rs:
        for part, test in (("baseline", "baseline"), ("test1", "test1")):
            if part not in parts:
                continue
            scheme = "baseline" if test == "baseline" else str(Scheme.standard(1, "decoder"))
            ref, oth = (RunKey(lab, scope.data, scope.split, scope.shots, test, scheme) for lab in labels)
            found[part] = compare_runs(rs, ref, oth, items=scope.items, hints=hints(f"hellaswag {test}"))
    return found
