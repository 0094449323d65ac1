"""Steering sets: the targets, prompts and neutral texts a steering card runs over (seed 002, last sentence of
the abstract: steering "towards an arbitrary desired direction").

A set is a JSONL file, one record per line, each with a ``type``:

* ``{"type": "target", "name", "kind", "words", "pairs", ...}``: a target.  ``kind`` is ``token`` (also
  ``"token"``: the one token whose next-token log-probability is the effect, e.g. ``" Paris"``), ``topic``
  (``words``: the topic's words, each scored by its first token) or ``sentiment`` (``words`` positive,
  ``negative_words`` negative).  ``pairs``: contrastive texts ``[positive, negative]`` (the mean-difference
  direction).
* ``{"type": "prompt", "target", "split", "text"}``: a prompt steered toward ``target``; ``split`` is
  ``choose`` (picks layer and dose) or ``heldout`` (what the card reports).
* ``{"type": "neutral", "text"}``: a neutral text (the KL of the next-token distribution).

The sets shipped with walklens live in ``walklens/lab/data/steering/`` (CC0; its README); a set is named by its
file's stem (``token``, ``topic``, ``sentiment``) or ``all`` (every shipped set), or given as a path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ...base.errors import DataFormatError, InputError
from ...base.numbers import show
from ...base.records import parse_json, read_text

KINDS = ("token", "topic", "sentiment")
SPLITS = ("choose", "heldout")


@dataclass
class Target:
    """One target: its ``kind``, the scored ``words`` (``negative_words`` for sentiment), the ``token`` of a
    token target and the contrastive ``pairs`` ``(positive, negative)``."""

    name: str
    kind: str
    words: list[str]
    pairs: list[tuple[str, str]]
    token: str = ""
    negative_words: list[str] = field(default_factory=list)


@dataclass
class Prompt:
    """One prompt: its id (``target/split/index``), target, split and text."""

    id: str
    target: str
    split: str
    text: str


@dataclass
class SteeringSet:
    """A steering set as read from its JSONL files: ``set_id`` is the first 12 hex digits of the sha256 of the
    files' bytes (stored generations are keyed by it)."""

    name: str
    set_id: str
    targets: dict[str, Target]
    prompts: list[Prompt]
    neutral: list[str]

    def split(self, split: str) -> list[Prompt]:
        """The prompts of one split."""
        return [p for p in self.prompts if p.split == split]


def shipped_sets() -> list[str]:
    """The names of the sets shipped with walklens (file stems in ``walklens/lab/data/steering``)."""
    root = resources.files("walklens.lab") / "data" / "steering"
    return sorted(p.name[: -len(".jsonl")] for p in root.iterdir() if p.name.endswith(".jsonl"))


def _files(name: str | Path) -> tuple[str, list[tuple[str, str]]]:
    """(set name, [(label, text)]) of a shipped name, ``all`` or a JSONL path (read as an input of the command:
    a regular UTF-8 file, its size capped, no output may replace it)."""
    text = str(name)
    shipped = shipped_sets()
    root = resources.files("walklens.lab") / "data" / "steering"
    if text in shipped or text == "all":
        names = shipped if text == "all" else [text]
        return text, [(f"{n}.jsonl", (root / f"{n}.jsonl").read_bytes().decode("utf-8")) for n in names]
    path = Path(text)
    if not path.suffix == ".jsonl" and not path.exists():
        raise InputError(f"unknown steering set {text!r}: give one of {', '.join(shipped + ['all'])} or a .jsonl file")
    if not path.exists():
        raise InputError(f"steering set {text}: no such file")
    return path.stem, [(str(path), read_text(path, "steering set"))]


def _words(rec: dict[str, Any], key: str, where: str) -> list[str]:
    v = rec.get(key, [])
    if not isinstance(v, list) or not all(isinstance(w, str) and w.strip() for w in v):
        raise DataFormatError(f"{where}: {key!r} must be a list of non-empty strings")
    return v


def _target(rec: dict[str, Any], where: str) -> Target:
    name, kind = rec.get("name"), rec.get("kind")
    if not isinstance(name, str) or not name:
        raise DataFormatError(f"{where}: a target needs a 'name'")
    if kind not in KINDS:
        raise DataFormatError(f"{where}: target kind {show(kind)} is not one of {', '.join(KINDS)}")
    pairs = rec.get("pairs", [])
    if not isinstance(pairs, list) or not pairs or not all(_is_pair(p) for p in pairs):
        raise DataFormatError(f"{where}: 'pairs' must be a non-empty list of [positive, negative] texts")
    t = Target(
        name=name,
        kind=kind,
        words=_words(rec, "words", where),
        pairs=[(p[0], p[1]) for p in pairs],
        token=_text(rec, "token", where),
        negative_words=_words(rec, "negative_words", where),
    )
    if not t.words or (kind == "token" and not t.token.strip()) or (kind == "sentiment" and not t.negative_words):
        raise DataFormatError(
            f"{where}: a {kind} target needs 'words'"
            + {"token": " and 'token'", "sentiment": " and 'negative_words'", "topic": ""}[kind]
        )
    return t


def _text(rec: dict[str, Any], key: str, where: str) -> str:
    v = rec.get(key, "")
    if not isinstance(v, str):
        raise DataFormatError(f"{where}: {key!r} must be a string")
    return v


def _is_pair(p: Any) -> bool:
    return isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) and s.strip() for s in p)


def _record(line: str, where: str) -> dict[str, Any]:
    try:
        rec = parse_json(line, where)
    except InputError as e:
        raise DataFormatError(str(e)) from None
    if not isinstance(rec, dict) or rec.get("type") not in ("target", "prompt", "neutral"):
        raise DataFormatError(f"{where}: each line needs a 'type' of target, prompt or neutral")
    return rec


def load_steering_set(name: str | Path) -> SteeringSet:
    """A steering set by shipped name (``token``, ``topic``, ``sentiment``, ``all``) or JSONL path; a bad line
    is refused with its file and line number (:class:`~walklens.base.errors.DataFormatError`)."""
    set_name, files = _files(name)
    targets: dict[str, Target] = {}
    prompts: list[Prompt] = []
    neutral: list[str] = []
    counts: dict[tuple[str, str], int] = {}
    for label, data in files:
        for n, line in enumerate(data.split("\n"), 1):  # JSON lines end at a newline only
            if not line.strip():
                continue
            where = f"steering set {label}, line {n}"
            rec = _record(line, where)
            text = rec.get("text")
            if rec["type"] != "target" and (not isinstance(text, str) or not text.strip()):
                raise DataFormatError(f"{where}: a {rec['type']} needs a non-empty 'text'")
            if rec["type"] == "target":
                t = _target(rec, where)
                if t.name in targets:
                    raise DataFormatError(f"{where}: target {show(t.name)} defined twice")
                targets[t.name] = t
            elif rec["type"] == "neutral":
                neutral.append(str(text))
            else:
                tgt, split = rec.get("target"), rec.get("split")
                if not isinstance(tgt, str) or tgt not in targets:
                    raise DataFormatError(f"{where}: prompt for unknown target {show(tgt)} (define targets first)")
                if split not in SPLITS:
                    raise DataFormatError(f"{where}: split {show(split)} is not choose or heldout")
                i = counts[(str(tgt), str(split))] = counts.get((str(tgt), str(split)), -1) + 1
                prompts.append(Prompt(id=f"{tgt}/{split}/{i}", target=str(tgt), split=str(split), text=str(text)))
    if not prompts or not neutral:
        raise DataFormatError(f"steering set {set_name}: needs at least one prompt and one neutral text")
    bare = [t for t in targets if not any(p.target == t for p in prompts)]
    if bare:
        raise DataFormatError(f"steering set {set_name}: target {show(bare[0])} has no prompt")
    digest = hashlib.sha256(b"".join(d.encode("utf-8") for _, d in files)).hexdigest()[:12]
    return SteeringSet(name=set_name, set_id=digest, targets=targets, prompts=prompts, neutral=neutral)


__all__ = ["KINDS", "SPLITS", "Target", "Prompt", "SteeringSet", "load_steering_set", "shipped_sets"]
