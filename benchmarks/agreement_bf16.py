"""The bfloat16 / float32 agreement study (issue 14; docs/dtype.md, "Agreement study") from a results database.

    .venv/bin/python benchmarks/agreement_bf16.py --db agreement.sqlite --model smollm2-135m [--model gemma3-270m]
        [--limit 2000] [--shots 0] [--data PATH] [--other bfloat16] [--reference float32]
        [--parts baseline,test1,test2-grid,test1-grid] [--best 20] [--json FILE] [--out FILE.md]

Reads the runs that ``benchmarks/agreement_bf16.sh`` (or any ``walklens hellaswag`` / ``walklens sweep``
commands with ``--dtype``) stored, compares each model's reference and other dtype
(:func:`walklens.lab.experiments.agreement.agreement_study`) and prints Markdown tables
(:func:`walklens.lab.reports.agreement.agreement_markdown`); ``--json`` writes every number, ``--out`` the Markdown.
Nothing is computed with a model.  A missing run, database or bad option is one line
``walklens: error: ...`` and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as the walklens command line
        sys.stderr.write(f"walklens: error: {message}\n")
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    from walklens.base.precision import DTYPES
    from walklens.cli.common import count_arg, positive_arg
    from walklens.lab.experiments.agreement import PARTS

    ap = _Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True, metavar="PATH", help="the results database holding both dtypes' runs")
    ap.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="model name without a dtype (repeat for several; default smollm2-135m)",
    )
    ap.add_argument(
        "--limit",
        type=positive_arg,
        default=None,
        metavar="N",
        help="compare the first N items (every run must hold them); default: the items both hold",
    )
    ap.add_argument("--shots", type=count_arg, default=0, metavar="K")
    ap.add_argument("--data", default=None, metavar="PATH", help="the data the runs used (default: bundled)")
    ap.add_argument("--reference", choices=tuple(DTYPES), default="float32")
    ap.add_argument("--other", choices=tuple(DTYPES), default="bfloat16")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, any of {', '.join(PARTS)}")
    ap.add_argument(
        "--best",
        type=positive_arg,
        default=20,
        metavar="N",
        help="the reference's best N schemes of each sweep, listed (default 20)",
    )
    ap.add_argument("--json", metavar="FILE", help="write every number here")
    ap.add_argument("--out", metavar="FILE", help="write the Markdown here too")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    from walklens.base.errors import WalklensError
    from walklens.cli import one_line
    from walklens.cli.common import write_json

    args = parser().parse_args(argv)
    try:
        from walklens.base.outputs import check_file, write_atomic
        from walklens.lab.experiments.agreement import Ranking, Scope, agreement_study
        from walklens.lab.hellaswag.data import data_id
        from walklens.lab.reports.agreement import agreement_markdown

        if args.json and args.json != "-":
            check_file(args.json, "--json")
        if args.out:
            check_file(args.out, "--out")  # the Markdown is printed anyway: '-' is refused
        parts = [p.strip() for p in args.parts.split(",") if p.strip()]
        did = data_id(args.data)
        scope = Scope(did, shots=args.shots, items=args.limit)
        studies = [
            agreement_study(
                args.db,
                m,
                scope,
                other=args.other,
                reference=args.reference,
                parts=parts,
                ranking=Ranking(best=args.best),
            )
            for m in (args.model or ["smollm2-135m"])
        ]
        text = "\n".join(agreement_markdown(s, args.best) for s in studies)
        print(text)
        if args.out:
            write_atomic(args.out, text + "\n", "--out")
        if args.json:
            write_json(args.json, {"studies": studies})
    except WalklensError as e:
        sys.stderr.write(f"walklens: error: {one_line(str(e))}\n")
        return e.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
