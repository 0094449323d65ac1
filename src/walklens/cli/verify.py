"""``walklens verify MODEL``: the parity card (every recomputation against the model itself)."""

from __future__ import annotations

import argparse
import sys

from ..reports import parity as parity_report
from .common import add_model_arg, add_output_args, load, write_json
from .terminal import Col, add_command, console, print_table, say

DESCRIPTION = """\
The parity card of one model in one dtype: logits recomputed from `final`, the captured points against
output_hidden_states, each layer's residual bookkeeping, the A.3 identity, per-head attention scores rebuilt
from W_q/W_k, the decoding walk against generate, and the MLP activation, each against the model itself
with a tolerance per dtype. Exit 0 when every check passes, 1 when one fails."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "verify", "the parity card: every recomputation checked against the model itself", DESCRIPTION)
    add_model_arg(p)
    p.add_argument("--quick", action="store_true", help="only the checks a derived adapter is accepted on")
    add_output_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..analyses.parity import verify

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
        f"{card.model_name}: parity card ({card.family}, {parity_report.read_by(card)}, {card.dtype})",
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
