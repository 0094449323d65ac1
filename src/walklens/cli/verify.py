"""``walklens verify MODEL``: the parity card (every recomputation against the model itself), and
``walklens adapter MODEL --write``: the adapter derived for a family with no adapter file, as a file."""

from __future__ import annotations

import argparse
import sys

from ..errors import InputError
from ..reports import parity as parity_report
from .common import add_output_args, command_inputs, load, write_json
from .terminal import Col, ParagraphHelp, console, print_table, say

DESCRIPTION = """\
The parity card of one model in one dtype: logits recomputed from `final`, the captured points against
output_hidden_states, each layer's residual bookkeeping, the A.3 identity, per-head attention scores rebuilt
from W_q/W_k, the decoding walk against generate, and the MLP activation, each against the model itself
with a tolerance per dtype. Exit 0 when every check passes, 1 when one fails."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="the parity card: every recomputation checked against the model itself",
        description=DESCRIPTION,
        formatter_class=ParagraphHelp,
    )
    _model_args(p)
    p.add_argument("--quick", action="store_true", help="only the checks a derived adapter is accepted on")
    add_output_args(p)
    p.set_defaults(func=run)
    a = sub.add_parser(
        "adapter",
        help="the adapter walklens uses for a model (derived ones can be written out)",
        formatter_class=ParagraphHelp,
        description="Show the adapter of a model; --write FILE writes a derived adapter as a "
        "reviewable file for src/walklens/models/.",
    )
    _model_args(a)
    a.add_argument("--write", metavar="FILE", help="write the derived adapter's roles as a Python file")
    a.set_defaults(func=run_adapter)


def _model_args(p: argparse.ArgumentParser) -> None:
    from ..precision import DEVICES, DTYPES

    p.add_argument("model", help="short name, .gguf path, local directory or hub id")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="the dtype (default float32)")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="where the model runs (default: cpu)")


def run(args: argparse.Namespace) -> int:
    from ..parity import verify

    card = verify(load(args), quick=args.quick)
    if args.json:
        write_json(args.json, parity_report.document(card))
    con = console(args)
    cols = [
        Col("check"),
        Col("error", justify="right"),
        Col("tolerance", justify="right"),
        Col("verdict"),
        Col("what is compared", wrap=True),
    ]
    from rich.markup import escape

    print_table(
        con,
        f"{card.model_name}: parity card ({card.family}, {card.dtype})",
        cols,
        [[escape(str(x)) for x in r] for r in parity_report.rows(card)],
        keys=1,
        short="parity card",
    )
    for k, v in card.limits.items():
        say(con, f"breaks {escape(k)}: {escape(v)}")
    say(con, "every check passes" if card.passed else f"FAILED: {', '.join(card.failed())}")
    if args.out:
        path = parity_report.build(card).save(args.out)
        sys.stderr.write(f"walklens: report written to {path!s}\n")
    return 0 if card.passed else 1


def run_adapter(args: argparse.Namespace) -> int:
    from ..models.derive import derive_roles
    from ..models.roles import render

    if args.write:
        from ..outputs import check_file, check_not_inputs

        check_file(args.write, "--write")
        check_not_inputs(args.write, "--write", command_inputs(args))  # never over the model's own files
    lm = load(args)
    con = console(args)
    if not lm.adapter.family.startswith("derived:"):
        if args.write:
            raise InputError(
                f"{lm.config.model_type!r} has an adapter file already "
                f"(src/walklens/models/, family {lm.adapter.family}); nothing to write"
            )
        say(con, f"{lm.name}: adapter file of family {lm.adapter.family}")
        return 0
    text = render(derive_roles(lm.model))
    if args.write:
        from ..outputs import write_atomic

        path = write_atomic(args.write, text, "--write")
        sys.stderr.write(f"walklens: derived adapter written to {path!s}\n")
    else:
        sys.stdout.write(text)
    return 0
