"""``walklens report --db PATH --out DIR``: paper-style report of every scheme sweep stored in a database
(top-10 tables like seed 000 Figs. 13-16, the Fig. 10 bar chart with in-sample and held-out best, marginal
effects, score distributions): HTML (offline), PNG and CSV.  The terminal gets the summary table."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from .common import check_outputs, seed_arg
from .terminal import Col, console, print_table, say


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="report of the scheme sweeps in a results database (HTML, PNG, CSV)")
    p.add_argument("--db", required=True, metavar="PATH", help="the SQLite results database")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (index.html, *.png, *.csv)")
    p.add_argument("--folds", type=int, default=5, help="k of the k-fold held-out best (default 5)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the item split and folds (default 0)")
    p.set_defaults(func=run)


def _fmt(x: float | None, places: int = 3) -> str:
    return "-" if x is None else f"{x:.{places}f}"


def _print(summaries: Any, path: Any) -> None:
    """Per run and metric (the key columns, repeated when the table is wrapped): the baseline, the standard
    scheme, the in-sample and the k-fold held-out best, each with its normalised score, the bootstrap interval
    of held-out / baseline and the paired difference from the baseline with its McNemar p."""
    from ..lab.reports.sweep import kfold_label

    con = console()
    if summaries:
        rows = [
            [
                escape(Path(s.model).name or s.model),
                f"T{s.test} {s.shots}-shot {metric}",
                str(s.n_items),
                f"{s.n_schemes:,}",
                _fmt(m.baseline),
                f"{_fmt(m.standard and m.standard.acc)} ({_fmt(m.standard and m.standard.norm, 2)})",
                f"{_fmt(m.in_sample.acc)} ({_fmt(m.in_sample.norm_score, 2)})",
                f"{_fmt(m.kfold.acc)} ({_fmt(m.kfold.norm, 2)})",
                f"[{_fmt(m.kfold.lo)}, {_fmt(m.kfold.hi)}]",
                "-" if m.bootstrap is None else f"[{_fmt(m.bootstrap.norm_lo, 2)}, {_fmt(m.bootstrap.norm_hi, 2)}]",
                "-" if m.paired is None else f"{m.paired.diff:+.3f} (p={m.paired.p:.2g})",
            ]
            for s in summaries
            for metric, m in s.metrics.items()
        ]
        print_table(
            con,
            "sweeps: accuracy (normalised: / baseline)",
            [
                Col("model", wrap=True),
                "run",
                Col("items", justify="right"),
                Col("schemes", justify="right"),
                "baseline",
                "standard",
                "best in-sample",
                f"{kfold_label(summaries)} held-out",
                "95% CI",
                "norm, bootstrap 95%",
                "vs baseline, paired",
            ],
            rows,
            keys=2,
            short="sweeps",
        )
    else:
        say(con, "no sweep results in this database")
    say(con, f"report: {path}")


def run(args: argparse.Namespace) -> int:
    from ..lab.experiments.summary import summarise_db
    from ..lab.reports.sweep import build

    check_outputs(args)
    if args.folds < 2:
        raise InputError("--folds must be at least 2")
    summaries = summarise_db(args.db, k=args.folds, seed=args.seed)
    path = build(summaries, source=str(args.db)).save(args.out)
    _print(summaries, path)
    return 0
