"""The held-out summary of a stored sweep restricted to the schemes a smaller grid holds.

Used to set a larger grid beside a smaller one run earlier (issue 14: the full 4,401-scheme Test 1 grid in
bfloat16 beside the float32 1,101-scheme grid, which is the full grid with NORM = None): the same statistics
`walklens report` shows (in-sample best, split-half, 5-fold held-out, the distribution; `stats.honest_summary`)
over the schemes whose parameters match every ``--where KEY=VALUE`` (a parameter of `Scheme`, e.g.
``norm=None``; several values of one key: ``--where layer=middle,-1``). The baseline scheme
(``enc=cross_encoding``) is left out, as in the report. Usage::

    .venv/bin/python benchmarks/sweep_subset.py --db t1.sqlite --model smollm2-135m@bfloat16 --test 1 \\
        --shots 0 --where norm=None [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from walklens.analyses.concepts.schemes import Scheme
from walklens.lab.experiments.summary import summarise_run
from walklens.lab.hellaswag.store.sweeps import SweepStore


def matches(name: str, where: dict[str, set[str]]) -> bool:
    """Whether scheme ``name`` has, for each key of ``where``, one of its values (as ``str(scheme)`` writes it)."""
    fields = dict(Scheme.parse(name).pairs())
    return all(fields.get(k) in vals for k, vals in where.items())


def where_arg(text: str) -> tuple[str, set[str]]:
    key, eq, vals = text.partition("=")
    if not eq or not key or not vals:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE[,VALUE...], got {text!r}")
    return key, set(vals.split(","))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--model", required=True, help="the stored model name (with @dtype where not float32)")
    ap.add_argument("--test", type=int, choices=(1, 2), required=True)
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--where", action="append", type=where_arg, default=[], metavar="KEY=V[,V...]")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    where = dict(args.where)
    with SweepStore(args.db, readonly=True) as store:
        runs = [
            r
            for r in store.runs()
            if r["model"] == args.model and int(r["test"]) == args.test and int(r["shots"]) == args.shots
        ]
        if not runs:
            print(
                f"walklens: error: {args.db}: no Test {args.test} sweep of {args.model} ({args.shots}-shot)",
                file=sys.stderr,
            )
            sys.exit(2)
        res = store.load_counts(max(runs, key=lambda r: int(r["n_items"]))["id"])  # streamed, as the report
    keep = [i for i, s in enumerate(res.schemes) if matches(s, where)]
    sub = dataclasses.replace(
        res, schemes=[res.schemes[i] for i in keep], acc=res.acc[:, keep], hits=res.hits[:, keep]
    )  # as the explorer's filters (server/api_sweeps.py)
    summary = summarise_run(sub)  # leaves the baseline scheme (enc=cross_encoding) out
    for m, s in summary.metrics.items():
        ins, kf = s.in_sample, s.kfold
        print(
            f"{args.model} Test {args.test} {args.shots}-shot {m}, {summary.n_schemes} schemes x {summary.n_items} "
            f"items: in-sample best {ins.acc:.3f} [{ins.lo:.3f}, {ins.hi:.3f}] ({ins.scheme}); split-half mean "
            f"{s.split_mean:.3f}; 5-fold held-out {kf.acc:.3f} [{kf.lo:.3f}, {kf.hi:.3f}]; median scheme "
            f"{s.distribution.quantiles['q50']:.3f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {"where": {k: sorted(v) for k, v in where.items()}, **dataclasses.asdict(summary)},
                f,
                indent=1,
                default=str,
            )


if __name__ == "__main__":
    main()
