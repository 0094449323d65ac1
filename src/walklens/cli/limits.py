"""Size limits of the commands: the options, and what a command does when an estimate of
:mod:`walklens.costs` exceeds one.  Memory, output size and work are estimated from the model's shape and the
input's size *before* anything is computed, then either a command reduces what it computes (fewer points,
fewer or averaged heatmaps) with a one-line note on stderr, or it refuses with one line
``walklens: error: ...`` that says what it would need and which option reduces it.

Every command takes ``--max-memory GB``, ``--max-output MB`` and ``--max-work TFLOP`` (defaults in
:mod:`walklens.costs`, whose estimates and refusal rule the explorer's bounds use too).  ``--max-memory`` is the
budget of the whole process, the model's weights included (default: the memory free when the command starts):
:func:`walklens.cli.common.load` refuses a model the budget cannot hold before loading it (or loads it layer by layer
when its weights do not fit), and the commands' estimates are checked against what the loaded model leaves.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .. import costs
from ..base.errors import InputError
from ..base.numbers import POSITIVE
from ..costs import MAX_OUTPUT_MB, MAX_WORK_TFLOP, LimitValues, Need, refusal

if TYPE_CHECKING:
    from ..core.loading import LoadedModel

HEATMAP_CELLS = 250_000  # most cells one heatmap of a report holds (500 x 500); larger maps show block means


class LimitError(InputError):
    """A computation or an output file would exceed a size limit (--max-memory, --max-output, --max-work)."""


_positive = POSITIVE.arg()  # a finite number > 0 (the shared range of walklens.base.numbers)


def add_limit_args(p: argparse.ArgumentParser, files: bool = True) -> None:
    """``--max-memory GB``, ``--max-work TFLOP`` and, for a command that writes files (``files``),
    ``--max-output MB`` (checked before computing)."""
    g = p.add_argument_group("size limits (estimated before anything is computed)")
    g.add_argument(
        "--max-memory",
        type=_positive,
        default=None,
        metavar="GB",
        help="the memory budget of the whole process, the model's weights included; a model whose weights do not "
        "fit runs layer by layer (default: the memory free when the command starts)",
    )
    p.set_defaults(model_bytes=0.0)  # what the loaded model holds of the budget (set by common.load)
    if files:
        g.add_argument(
            "--max-output",
            type=_positive,
            default=MAX_OUTPUT_MB,
            metavar="MB",
            help=f"size of each file written, the --json file and the report's index.html (default {MAX_OUTPUT_MB:g})",
        )
    g.add_argument(
        "--max-work",
        type=_positive,
        default=MAX_WORK_TFLOP,
        metavar="TFLOP",
        help=f"floating-point work; one CPU core does 0.03-0.1 TFLOP/s, walklens calibrate measures this machine's "
        f"(default {MAX_WORK_TFLOP:g})",
    )


def note(message: str) -> None:
    """One line on stderr: what a command reduced, and how to get the rest."""
    sys.stderr.write(f"walklens: note: {message}\n")


def check(need: Need, args: LimitValues, what: str, hint: str) -> None:
    """Refuse with one line when ``need`` exceeds a limit: what it would need, and what reduces it
    (:func:`walklens.costs.refusal`, the explorer's rule too)."""
    message = refusal(need, args, what, hint)
    if message:
        raise LimitError(message)


def text_tokens(lm: LoadedModel, text: str, truncate: bool) -> int:
    """Tokens the analyses will see (the same tokenisation, and the same errors, as capture)."""
    from ..core.capture import tokenize

    return int(tokenize(lm, text, truncate=truncate).shape[1])


def check_context(lm: LoadedModel, prompt: int, steps: int, option: str) -> None:
    """Refuse, before generating, ``steps`` new tokens after a ``prompt``-token prompt beyond the model's
    context window (models with relative positions have none: the work limit bounds them)."""
    from ..core.capture import context_limit

    limit = context_limit(lm)
    if limit is not None and prompt + steps > limit:
        raise InputError(
            f"{option}: a prompt of {prompt} tokens and {steps} new tokens exceed the model's context "
            f"of {limit} positions (at most {max(limit - prompt, 0)} new tokens fit)"
        )


# ---- heatmaps: block means ---------------------------------------------------------------------------------------


def block_size(rows: int, cols: int, cells: int = HEATMAP_CELLS, per_col: int = 1) -> int:
    """The smallest block b such that a [rows, cols] map averaged over b x b blocks has at most ``cells``
    cells (``per_col`` maps side by side, as the heads of an attention map, each with a separator column): the
    cost model's one rule, :func:`walklens.costs.block_for`."""
    return costs.block_for(rows, cols, cells, square=True, per_col=per_col, gap=1)


def spread(n: int, k: int) -> list[int]:
    """k indices out of range(n), evenly spaced, always with the first and the last."""
    if k >= n:
        return list(range(n))
    if k <= 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


__all__ = [
    "HEATMAP_CELLS",
    "LimitError",
    "add_limit_args",
    "note",
    "check",
    "text_tokens",
    "check_context",
    "block_size",
    "spread",
]
