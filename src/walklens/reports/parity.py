"""The parity card (``walklens verify``): one table of every check with its error, tolerance and verdict, and
the identities the family breaks.  Draws a :class:`~walklens.analyses.parity.ParityCard`; nothing here runs a model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .html import Report

if TYPE_CHECKING:
    from ..analyses.parity import ParityCard


def verdict(passed: bool | None) -> str:
    return "pass" if passed else "n/a" if passed is None else "FAIL"


def document(card: ParityCard) -> dict[str, Any]:
    """The ``--json`` document: the card's fields, each check's fields, and the overall verdict."""
    return {
        "model": card.model_name,
        "family": card.family,
        "derived": card.derived,
        "dtype": card.dtype,
        "passed": card.passed,
        "texts": list(card.texts),
        "limits": dict(card.limits),
        "checks": [
            {
                "name": c.name,
                "what": c.what,
                "error": c.error,
                "tolerance": c.tolerance,
                "verdict": verdict(c.passed),
                "note": c.note,
                **c.detail,
            }
            for c in card.checks
        ],
    }


def rows(card: ParityCard) -> list[list[Any]]:
    """One row per check: name, error, tolerance, verdict, what it compares (or why it is not measurable)."""
    return [
        [
            c.name,
            "-" if c.error is None else f"{c.error:.3g}",
            f"{c.tolerance:.3g}",
            verdict(c.passed),
            c.note or c.what,
        ]
        for c in card.checks
    ]


def read_by(card: ParityCard) -> str:
    """How walklens reads the card's family: ``"derived adapter"`` (found by probing, models/derive.py) or
    ``"adapter file"`` (a declarative adapter in walklens/models/)."""
    return "derived adapter" if card.derived else "adapter file"


def build(card: ParityCard, title: str | None = None) -> Report:
    """The HTML parity card; its title says whether the family is read by an adapter file or derived."""
    rep = Report(
        title or f"Parity card — {card.model_name} ({card.family}, {read_by(card)})",
        f"{card.family} ({read_by(card)}), {card.dtype}: "
        f"{'every check passes' if card.passed else 'FAILED: ' + ', '.join(card.failed())}",
    )
    rep.h2("Checks")
    rep.table(["check", "error", "tolerance", "verdict", "what is compared"], rows(card))
    rep.h2("Identities this family breaks")
    if card.limits:
        rep.table(["identity", "why"], [[k, v] for k, v in card.limits.items()])
        rep.p("Analyses that rely on one of these refuse in one line naming the reason.", note=True)
    else:
        rep.p("None: every identity the analyses rely on holds for this family.")
    rep.h2("Texts")
    rep.table(["text"], [[t] for t in card.texts])
    return rep


__all__ = ["read_by", "build", "document", "rows", "verdict"]
