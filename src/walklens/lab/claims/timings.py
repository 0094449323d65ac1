"""A run's measured cost, read from the committed timings file that records it when the table is rendered (never
written in code): the file is a few sections of ``#`` lines, apart by a line holding only ``#``; a claim's
:class:`~walklens.lab.claims.base.Cost` names the file, the section (the start of its first line) and the line (its
start, as ``total``), and the first time on that line (``~4 h 14 min``) is the cost."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ...base.errors import InputError
from ...base.records import read_text
from .base import Claim, Cost

#: a time as the timings files write it: ``~1 h 50 min``, ``2 h 21 min 11 s``, ``~23 min``, ``3 min 46 s``
TIME = re.compile(r"~?\d+ h(?: \d+ min)?(?: \d+ s)?|~?\d+ min(?: \d+ s)?")
_MAX_BYTES = 2**20  # a timings file is a few kilobytes


def _sections(text: str) -> list[list[str]]:
    """The sections of a timings file: its lines without their ``#``, apart by empty ones."""
    out: list[list[str]] = [[]]
    for raw in text.splitlines():
        line = raw.lstrip("#").strip()
        if line:
            out[-1].append(line)
        elif out[-1]:
            out.append([])
    return [s for s in out if s]


def cost(c: Cost, root: Path) -> str:
    """The time ``c`` names in its timings file under ``root``; a missing file is said in the text (a table
    rendered from a folder without the committed files), a file without that section, line or time is one
    :class:`InputError` line."""
    path = root / c.timings
    if not os.path.lexists(path):
        return f"an unrecorded time ({c.timings} is missing)"
    label = f"timings {path}"
    sections = [s for s in _sections(read_text(path, "timings", _MAX_BYTES)) if s[0].startswith(c.entry)]
    if len(sections) != 1:
        raise InputError(f"{label}: {len(sections)} sections start with {c.entry[:80]!r}, not one")
    lines = [ln for ln in sections[0] if ln.startswith(c.line)]
    if len(lines) != 1:
        raise InputError(f"{label}: section {c.entry[:80]!r} has {len(lines)} lines starting {c.line[:40]!r}, not one")
    m = TIME.search(lines[0], len(c.line))
    if m is None:
        raise InputError(f"{label}: section {c.entry[:80]!r}, line {c.line[:40]!r} holds no time (as ~1 h 50 min)")
    return m.group(0)


def why(claim: Claim, root: Path) -> str:
    """Why the claim's result file is missing and what it takes, its ``{cost}`` read from its timings file."""
    return claim.why.replace("{cost}", cost(claim.cost, root)) if claim.cost else claim.why
