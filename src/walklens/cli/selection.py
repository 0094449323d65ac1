"""``walklens hellaswag selection``: the ten schemes a committed 200-item sweep ranks best in sample, each scored on
the items after them beside the baseline (docs/claims.md, "The selection's variance"; seed 000, sec. 5.1.1).

One sweep of just those schemes over the held-out items (``--skip N``, at least the sweep's N; with ``--pool
reserved`` the few-shot examples come from the reserved tenth, which is never scored), resumable from its results
database; the picks are written one digit per item (:func:`walklens.lab.experiments.selection.selection_document`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from .common import (
    add_hellaswag_args,
    add_pool_arg,
    add_summary_args,
    check_db,
    check_outputs,
    count_arg,
    load,
    positive_arg,
    write_json,
)
from .terminal import Col, console, print_table


def register_hellaswag(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``walklens hellaswag selection``."""
    p = sub.add_parser(
        "selection",
        help="the ten best schemes of a committed sweep, in sample, each scored on the items after it beside the "
        "baseline: how much the pick matters (docs/claims.md)",
    )
    add_hellaswag_args(p, "write the picks (one digit per item) of the baseline and of each scheme")
    add_summary_args(p)
    p.add_argument("--chosen-on", type=positive_arg, default=200, metavar="N", help="the sweep's items (default 200)")
    p.add_argument("--top", type=int, default=10, metavar="K", help="how many of its best schemes (default 10)")
    p.add_argument("--metric", choices=("acc", "acc_norm"), default="acc", help="the ranking's metric (seed: acc)")
    p.add_argument(
        "--skip", type=count_arg, default=None, metavar="N", help="leave out the first N items (default: --chosen-on)"
    )
    add_pool_arg(p)
    p.add_argument("--cache", metavar="DIR", default=None, help="concept cache folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check every input before the model loads; then the sweep of the top schemes on the held-out items."""
    from ..analyses.concepts.cache import open_cache
    from ..base.records import read_json
    from ..lab.experiments.runsetup import RunSetup
    from ..lab.experiments.selection import run_selection, selection_document, top_schemes
    from ..lab.hellaswag.data import data_id, fewshot_pool, load_hellaswag, scored_items
    from ..lab.hellaswag.store import ResultStore

    if args.top < 1 or args.top > 10:
        raise InputError(f"--top {args.top}: the summary ranks 10 schemes; use 1 to 10")
    skip = args.chosen_on if args.skip is None else args.skip
    if skip < args.chosen_on:
        raise InputError(f"--skip {skip} would score items the schemes were chosen on (the first {args.chosen_on})")
    check_outputs(args)  # no output may be the summary, the data or the database
    doc = read_json(args.summary, "--summary")
    model = args.summary_model or args.model
    ranked = top_schemes(doc, model, args.test, args.shots, args.chosen_on, args.metric, args.top)
    db, cache = check_db(args.db), open_cache(args.cache)
    items = load_hellaswag(args.data, limit=None if args.limit is None else skip + args.limit)
    if skip >= len(items):
        raise InputError(f"--skip {skip} leaves no item (the data has {len(items)})")
    pool = fewshot_pool(args.data, items, args.shots, len(items), args.pool)  # as ``hellaswag test1 --skip``
    scored = scored_items(items[skip:], args.shots, args.pool)
    lm = load(args)
    store = ResultStore(db)
    try:
        setup = RunSetup(shots=args.shots, pool=pool, fewshot_seed=args.seed, data=data_id(args.data), store=store,
                         cache=cache, progress=not args.no_progress, pool_kind=args.pool)  # fmt: skip
        picks = run_selection(lm, scored, args.test, [r.scheme for r in ranked], setup)
    finally:
        store.close()
        if cache is not None:
            cache.close()
    head = {"model": lm.name, "summary_model": model, "test": args.test, "shots": args.shots,
            "data": setup.data_key, "pool": args.pool, "metric": args.metric, "command": _command(),
            "chosen_on": args.chosen_on, "skip": skip}  # fmt: skip
    out = selection_document(picks, ranked, head)
    _print(console(args), out)
    if args.json:
        write_json(args.json, out)
    return 0


def _command() -> str | None:
    return "walklens " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("walklens") else None


def _print(con: Any, out: dict[str, Any]) -> None:
    """Per scheme its in-sample rank and accuracy, its held-out accuracy with its Wilson interval and the paired p
    against the baseline on the same items (exact McNemar)."""
    import numpy as np

    from ..analyses.chance import wilson
    from ..lab.experiments.heldout import paired_test

    metric = out["metric"]

    def ok(picks: str) -> Any:
        return np.frombuffer(picks.encode(), np.uint8) == np.frombuffer(out["gold"].encode(), np.uint8)

    base = ok(out["baseline"][metric])
    lo, hi = wilson(int(base.sum()), base.size)
    rows = []
    for s in out["schemes"]:
        a = ok(s["picks"][metric])
        slo, shi = wilson(int(a.sum()), a.size)
        rows.append([str(s["rank"]), f"{s['in_sample']:.3f}", f"{a.mean():.4f} [{slo:.3f}, {shi:.3f}]",
                     f"{paired_test(a, base).p:.2g}", s["scheme"]])  # fmt: skip
    title = (
        f"{out['model']}, Test {out['test']}, {out['shots']}-shot, {metric}: the sweep's best in sample, held out "
        f"beside the baseline {base.mean():.4f} [{lo:.3f}, {hi:.3f}] on the same n={out['n']:,} items"
    )
    cols = [
        Col("rank"),
        Col("in sample"),
        Col(escape("held out [95% Wilson]")),
        Col("paired p"),
        Col("scheme", wrap=True),
    ]
    print_table(con, title, cols, [[escape(c) for c in r] for r in rows])
