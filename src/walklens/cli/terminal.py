"""Terminal tables that fit the terminal: every command prints its tables through :func:`print_table`.

Rich squeezes a table wider than the console by shrinking columns until their text collapses into ``…``.
Here the columns are measured first; when they do not fit, the table is *wrapped*: it is printed as several
tables, each repeating the first ``keys`` columns (the row labels) followed by as many further columns as
fit.  Columns of free text (``wrap=True``, e.g. lists of nearest tokens) may instead wrap onto several lines;
every other column keeps its full width, so no header or cell is ever cut.  The width is the console's
(``$COLUMNS`` when set, else the terminal's, else 80).  Lines of text are printed through the same console
(:func:`say`), which wraps them to that width.

With ``--json -`` standard output holds the JSON and nothing else: :func:`console` then prints to standard
error.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from ..base.outputs import STDOUT

WRAP_MIN = 24  # a free-text column keeps at least this many cells per line (or its header's width)
_BORDER = 3  # a column's padding (2) and its right border (1); the table's left border adds 1


@dataclass(frozen=True)
class Col:
    """One column: its header, whether its text may wrap onto several lines, its justification and style."""

    header: str
    wrap: bool = False
    justify: JustifyMethod = "left"
    style: str | None = None


ColSpec = Col | str


def console(args: argparse.Namespace | None = None, stderr: bool = False) -> Console:
    """The console every command prints to, at the terminal's width: standard output, or standard error when
    ``args`` sends the JSON to standard output (``--json -``) or ``stderr`` is set (progress messages)."""
    return Console(stderr=stderr or getattr(args, "json", None) == STDOUT)


#: control characters -> a visible escape (``\n``, ``\x00``): a path or a text with a newline stays on its line
_FLAT = {c: repr(chr(c))[1:-1] for c in (*range(0x20), *range(0x7F, 0xA0))}


def flat(text: str) -> str:
    """``text`` on one line: its newlines and other control characters escaped visibly (``\n``)."""
    return text.translate(_FLAT)


def say(con: Console, text: str) -> None:
    """Print one line of plain text (never markup; control characters escaped by :func:`flat`), wrapped to the
    console's width."""
    con.print(flat(text), markup=False, highlight=False)


def written(path: Any) -> None:
    """The success line of a report written to ``path`` (on stderr, one line whatever the path holds)."""
    sys.stderr.write(f"walklens: report written to {flat(str(path))}\n")


def cell_width(markup: str) -> int:
    """Width in terminal cells of a rich markup string (its widest line)."""
    return max((Text.from_markup(line).cell_len for line in markup.split("\n")), default=0)


def _need(col: Col, cells: Sequence[str]) -> int:
    """The width a column needs: its widest cell or header; a free-text column at most WRAP_MIN (or its
    header, which always stays on one line)."""
    head = cell_width(col.header)
    natural = max([head, *(cell_width(c) for c in cells)])
    return max(head, min(natural, WRAP_MIN)) if col.wrap else natural


def split_columns(widths: Sequence[int], keys: int, width: int) -> list[list[int]]:
    """Groups of column indices (after the ``keys`` key columns) such that each table fits ``width``.

    Greedy, in order; a column too wide to fit even alone with the keys gets a group of its own (rich then
    folds it)."""
    base = 1 + sum(w + _BORDER for w in widths[:keys])
    groups: list[list[int]] = []
    cur: list[int] = []
    used = base
    for i in range(keys, len(widths)):
        w = widths[i] + _BORDER
        if cur and used + w > width:
            groups.append(cur)
            cur, used = [], base
        cur.append(i)
        used += w
    if cur or not groups:
        groups.append(cur)
    return groups


def print_table(
    con: Console,
    title: str,
    cols: Sequence[ColSpec],
    rows: Sequence[Sequence[str]],
    *,
    keys: int = 1,
    short: str | None = None,
) -> int:
    """Print ``rows`` under ``cols`` as one table, or as several that each fit the console's width, each
    repeating the first ``keys`` columns; tables after the first are titled ``short`` (default: the title).
    Headers and cells are rich markup (escape text from a model or a user); titles are plain text.  Returns the
    number of tables printed."""
    spec = [c if isinstance(c, Col) else Col(c) for c in cols]
    keys = min(keys, len(spec))
    widths = [_need(c, [r[i] for r in rows]) for i, c in enumerate(spec)]
    groups = split_columns(widths, keys, con.width)
    for n, group in enumerate(groups, 1):
        idx = list(range(keys)) + group
        head = title if n == 1 or short is None else short
        suffix = f" ({n}/{len(groups)})" if len(groups) > 1 else ""
        table = Table(title=Text(head + suffix) if head else None)
        fits = 1 + sum(widths[i] + _BORDER for i in idx) <= con.width
        for i in idx:
            c = spec[i]
            table.add_column(
                c.header,
                justify=c.justify,
                style=c.style,
                no_wrap=not c.wrap,
                overflow="fold",
                min_width=widths[i] if fits else None,
            )
        for r in rows:
            table.add_row(*[r[i] for i in idx])
        con.print(table)
    return len(groups)


class ParagraphHelp(argparse.HelpFormatter):
    """``--help`` whose description keeps its paragraphs, each filled to the terminal's width."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
        return "\n\n".join(textwrap.fill(p, width, initial_indent=indent, subsequent_indent=indent) for p in paragraphs)


PROGRESS_DELAY = 2.0  #: seconds of work before a progress bar appears (shorter work draws none)


@contextmanager
def progress_bars(quiet: bool) -> Iterator[None]:
    """While a command runs: every ``tqdm.auto`` bar (the analyses import it when they run) drawn only after
    :data:`PROGRESS_DELAY` seconds, and none at all when ``quiet`` (``--no-progress``, or standard error not a
    terminal: no carriage returns in a log).  The class is put back on exit."""
    import tqdm.auto

    base = tqdm.auto.tqdm

    class Bar(base):  # type: ignore[misc, valid-type]  # tqdm.auto.tqdm is a variable holding a class chosen at import
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = bool(kwargs.get("disable")) or quiet
            kwargs.setdefault("delay", PROGRESS_DELAY)
            super().__init__(*args, **kwargs)

    tqdm.auto.tqdm = Bar
    try:
        yield
    finally:
        tqdm.auto.tqdm = base


def add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str, description: str
) -> argparse.ArgumentParser:
    """The parser of the command ``name``: ``summary`` in ``walklens --help``, ``description`` in its own
    ``--help``, each of its paragraphs kept (:class:`ParagraphHelp`)."""
    return sub.add_parser(name, help=summary, description=description, formatter_class=ParagraphHelp)


__all__ = [
    "PROGRESS_DELAY",
    "progress_bars",
    "ParagraphHelp",
    "add_command",
    "Col",
    "console",
    "say",
    "cell_width",
    "split_columns",
    "print_table",
    "WRAP_MIN",
]
