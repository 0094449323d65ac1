"""``walklens report --db PATH --out DIR``: paper-style report of every scheme sweep stored in a database
(top-10 tables like seed 000 Figs. 13-16, the Fig. 10 bar chart with in-sample and held-out best, marginal
effects, score distributions): HTML (offline), PNG and CSV."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError
from .common import check_outputs, seed_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="report of the scheme sweeps in a results database (HTML, PNG, CSV)")
    p.add_argument("--db", required=True, metavar="PATH", help="the SQLite results database")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (index.html, *.png, *.csv)")
    p.add_argument("--folds", type=int, default=5, help="k of the k-fold held-out best (default 5)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the item split and folds (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..reports.sweep import build_report

    check_outputs(args)
    db = Path(args.db)
    if not db.is_file():
        raise InputError(f"{db}: no such database")
    if args.folds < 2:
        raise InputError("--folds must be at least 2")
    path = build_report(db, args.out, k=args.folds, seed=args.seed)
    print(path)
    return 0
