"""``walklens hellaswag baseline|test1|test2|export``: the concept-space experiments of seed 000 (sec. 5.1,
A.6) on HellaSwag, with results stored in an SQLite database (resumable) and an optional JSON summary.

Other command modules can add ``walklens hellaswag`` sub-commands: :func:`register` returns this command's
sub-parsers, and :func:`walklens.cli.build_parser` calls ``register_hellaswag(subparsers)`` of every command
module that defines it (e.g. ``walklens hellaswag sweep``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from .common import (
    add_hellaswag_args,
    add_model_args,
    add_pool_arg,
    add_summary_args,
    check_db,
    check_outputs,
    count_arg,
    db_origin,
    load,
    positive_arg,
    seed_arg,
    write_json,
)
from .terminal import Col, console, print_table, say

CONTROLS = ("ending", "shuffled", "random")  # walklens.lab.concepts.controls.CONTROLS (checked by a test)


def _add_common(p: argparse.ArgumentParser, scheme: bool) -> None:
    add_hellaswag_args(
        p, "write n, acc, acc_norm, baseline, normalised, predictions (with gold and the baseline's) here"
    )
    if scheme:
        p.add_argument(
            "--scheme",
            default="standard",
            metavar="S",
            help="'standard' (sec. 5.1) or key=value,... e.g. "
            "enc=concat_each_example,layer=-1,word=w1mean,norm=None,seg=mean,ex=mean",
        )
        p.add_argument(
            "--control",
            choices=CONTROLS,
            default=None,
            help="score a control on the same items: ending (a neutral context), shuffled (another item's "
            "context), random (random directions of the same norms); docs/claims.md",
        )
    add_pool_arg(p)
    p.add_argument("--no-db", action="store_true", help="do not read or write the results database")
    p.add_argument(
        "--skip",
        type=count_arg,
        default=0,
        metavar="N",
        help="leave out the first N items (e.g. those a scheme was chosen on), then --limit",
    )


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add ``walklens hellaswag`` and its sub-commands; returns its sub-parsers (for ``register_hellaswag``)."""
    p = sub.add_parser("hellaswag", help="HellaSwag baseline and concept-space Tests 1 and 2 (seed 000, sec. 5)")
    hs = p.add_subparsers(dest="hellaswag_command", metavar="COMMAND", parser_class=type(p))
    b = hs.add_parser("baseline", help="the ordinary score, as lm-evaluation-harness computes it")
    _add_common(b, scheme=False)
    b.add_argument(
        "--compact",
        metavar="SPEC",
        default=None,
        help="score the endings after a compacted context, e.g. what=examples,ratio=4 (docs/compaction.md)",
    )
    b.set_defaults(func=run, test="baseline")
    t1 = hs.add_parser("test1", help="Test 1, pyramidal generation: endings scored after concept vectors")
    _add_common(t1, scheme=True)
    t1.set_defaults(func=run, test="test1")
    for q in (b, t1):
        q.add_argument(
            "--cache",
            metavar="DIR",
            default=None,
            help="concept cache folder: segment vectors shared with the sweep and compaction",
        )
    t2 = hs.add_parser("test2", help="Test 2, concept similarity: context vector(s) vs each ending's vector")
    _add_common(t2, scheme=True)
    t2.set_defaults(func=run, test="test2")
    ce = hs.add_parser(
        "concept-eval",
        help="footnote 12: the concept-level score of a continuation, checked on own vs off-topic, shuffled and "
        "true vs distractor endings, with a chance control",
    )
    add_model_args(ce)
    ce.add_argument("--data", metavar="PATH", default=None, help="HellaSwag file (default: the bundled set)")
    ce.add_argument("--limit", type=positive_arg, default=200, metavar="N", help="the first N items (default 200)")
    ce.add_argument("--max-new-tokens", type=positive_arg, default=16, help="greedy tokens generated (default 16)")
    ce.add_argument("--seed", type=seed_arg, default=0, help="seed of the off-topic pairing and the shuffles")
    ce.add_argument("--json", metavar="FILE", help="write every score and comparison here")
    ce.set_defaults(func=run_concept_eval)
    _add_folds(hs)
    pl = hs.add_parser("pools", help="the few-shot baseline on the same items with both few-shot pools, compared")
    add_hellaswag_args(pl, "write both runs' picks and the paired difference (reserved - validation)")
    pl.set_defaults(func=run_pools)
    ex = hs.add_parser("export", help="export stored runs or per-item results to .csv or .parquet")
    ex.add_argument("out", help="output file (.csv or .parquet)")
    ex.add_argument("--table", choices=("results", "runs"), default="results")
    ex.add_argument("--db", metavar="PATH", default=None)
    for k in ("model", "data", "split", "test", "scheme"):
        ex.add_argument(f"--{k}", dest=f"f_{k}", default=None, help=f"only rows with this {k}")
    ex.add_argument("--shots", dest="f_shots", type=int, default=None)
    ex.set_defaults(func=run_export)

    def usage(a: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)
    return hs


def _add_folds(hs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    f = hs.add_parser(
        "folds",
        help="a committed sweep's k-fold held-out best item by item, beside the baseline and the controls "
        "(docs/claims.md, paired evidence)",
    )
    add_hellaswag_args(f, "write the picks (one digit per item) of the baseline, the held-out best and each control")
    add_summary_args(f)
    f.add_argument("--controls", default=",".join(CONTROLS), metavar="C,C", help="controls (default: all three)")
    f.add_argument("--metrics", default="acc", metavar="M,M", help="acc (the seed's, default) and/or acc_norm")
    f.add_argument("--cache", metavar="DIR", default=None, help="concept cache folder")
    f.set_defaults(func=run_folds)


def run_folds(args: argparse.Namespace) -> int:
    """``walklens hellaswag folds``: :func:`walklens.lab.experiments.folds.run_folds` on the run of ``--summary``
    with this model, test and shots over the first ``--limit`` items, its picks written to ``--json``."""
    from ..analyses.concepts.cache import open_cache
    from ..base.records import read_json
    from ..lab.concepts.controls import make_control
    from ..lab.experiments.folds import picks_document, plan_from_summary
    from ..lab.experiments.folds import run_folds as score
    from ..lab.experiments.runsetup import RunSetup
    from ..lab.hellaswag.data import data_id, fewshot_pool, load_hellaswag
    from ..lab.hellaswag.store import ResultStore

    names = [c for c in args.controls.split(",") if c]
    if any(c not in CONTROLS for c in names):
        raise InputError(f"--controls: use some of {', '.join(CONTROLS)}, not {args.controls!r}")
    wanted = [m for m in args.metrics.split(",") if m]
    if not wanted or any(m not in ("acc", "acc_norm") for m in wanted):
        raise InputError(f"--metrics: use acc and/or acc_norm, not {args.metrics!r}")
    check_outputs(args)  # before anything is read: no output may be the summary, the data or the database
    doc = read_json(args.summary, "--summary")
    model = args.summary_model or args.model
    plan, metrics = plan_from_summary(doc, model, args.test, args.shots, args.limit or 0, wanted)
    db, cache = check_db(args.db), open_cache(args.cache)
    everything = load_hellaswag(args.data)
    items = everything[: plan.n]
    pool = fewshot_pool(args.data, items, args.shots, plan.n)
    lm = load(args)
    store = ResultStore(db)
    try:
        setup = RunSetup(shots=args.shots, pool=pool, fewshot_seed=args.seed, data=data_id(args.data), store=store,
                         cache=cache, progress=not args.no_progress)  # fmt: skip
        controls = [make_control(c, everything, lambda it: setup.examples([it])[0]) for c in names]
        picks = score(lm, items, args.test, plan, setup, controls)
    finally:
        store.close()
        if cache is not None:
            cache.close()
    command = "walklens " + " ".join(sys.argv[1:])
    head = {"model": lm.name, "summary_model": model, "test": args.test, "shots": args.shots,
            "data": data_id(args.data), "pool": "validation", "command": command}  # fmt: skip
    out = picks_document(picks, plan, head, metrics)
    _print_folds(console(args), lm.name, picks, out)
    if args.json:
        write_json(args.json, out)
    return 0


def _print_folds(con: Any, model: str, picks: Any, out: dict[str, Any]) -> None:
    """Per metric the k-fold held-out best and each control beside the baseline on the same items, every accuracy
    with its Wilson 95% interval and the paired p against the baseline (exact McNemar)."""
    import numpy as np

    from ..analyses.chance import wilson
    from ..lab.experiments.heldout import paired_test

    gold = np.asarray(picks.gold)

    def acc(ok: Any) -> str:
        lo, hi = wilson(int(ok.sum()), ok.size)
        return f"{ok.mean():.4f} [{lo:.3f}, {hi:.3f}]"

    for m, held in picks.heldout.items():
        base = np.asarray(picks.baseline[m]) == gold
        rows = [("k-fold held-out", np.asarray(held) == gold)]
        rows += [(f"control {c}", np.asarray(per[m]) == gold) for c, per in picks.controls.items() if m in per]
        parts = [f"{name} {acc(ok)}, paired p {paired_test(ok, base).p:.2g}" for name, ok in rows]
        report = out["kfold_acc_report"].get(m)
        say(con, f"{model} {m}: baseline {acc(base)}; " + "; ".join(parts) + f" (the report's k-fold: {report})")


def run_pools(args: argparse.Namespace) -> int:
    """``walklens hellaswag pools``: the baseline over the first ``--limit`` items outside the reserved pool, its
    few-shot examples drawn from the whole file (``validation``, as before) and from the reserved pool, in one
    store; the paired difference of the two on the same items (docs/hellaswag.md, "Few-shot pool")."""
    import numpy as np

    from ..lab.experiments.heldout import paired_test
    from ..lab.experiments.runner import baseline_scorer, run_test
    from ..lab.experiments.runsetup import RunSetup
    from ..lab.hellaswag.data import data_id, fewshot_pool, load_hellaswag, scored_items
    from ..lab.hellaswag.store import ResultStore

    if not args.shots:
        raise InputError("pools compares few-shot examples: give --shots > 0")
    check_outputs(args)
    db = check_db(args.db)
    everything = load_hellaswag(args.data)
    items = scored_items(everything[: args.limit], args.shots, "reserved")
    lm = load(args)
    runs: dict[str, Any] = {}
    with ResultStore(db) as store:
        for kind in ("validation", "reserved"):
            pool = fewshot_pool(args.data, everything, args.shots, len(everything), kind)
            setup = RunSetup(shots=args.shots, pool=pool, fewshot_seed=args.seed, data=data_id(args.data),
                             store=store, progress=not args.no_progress, pool_kind=kind)  # fmt: skip
            runs[kind] = run_test(lm, items, baseline_scorer(), setup, desc=f"{lm.name} baseline, {kind} pool")
    gold = [r.gold for r in runs["validation"].results]
    out: dict[str, Any] = {"model": lm.name, "shots": args.shots, "n": len(items), "items": [it.index for it in items],
                           "gold": gold, "command": "walklens " + " ".join(sys.argv[1:])}  # fmt: skip
    for metric, field in (("acc", "pred"), ("acc_norm", "pred_norm")):
        ok = {k: np.array([getattr(r, field) == g for r, g in zip(v.results, gold)]) for k, v in runs.items()}
        t = paired_test(ok["reserved"], ok["validation"])
        out[metric] = {"validation": float(ok["validation"].mean()), "reserved": float(ok["reserved"].mean()),
                       "diff": t.diff, "lo": t.lo, "hi": t.hi, "p": t.p}  # fmt: skip
        m = out[metric]
        say(console(args), f"{metric}: validation pool {m['validation']:.4f}, reserved pool {m['reserved']:.4f}, "
            f"reserved - validation {t.diff:+.4f} [{t.lo:+.4f}, {t.hi:+.4f}], p={t.p:.2g}")  # fmt: skip
    out["picks"] = {k: [{"acc": r.pred, "acc_norm": r.pred_norm} for r in v.results] for k, v in runs.items()}
    if args.json:
        write_json(args.json, out)
    return 0


def run_concept_eval(args: argparse.Namespace) -> int:
    """``walklens hellaswag concept-eval``: :func:`walklens.lab.concepteval.concept_eval`, one line per comparison."""
    from ..lab.concepteval import concept_eval
    from ..lab.hellaswag.data import load_hellaswag

    check_outputs(args)
    items = load_hellaswag(args.data, limit=args.limit)
    lm = load(args)
    ev = concept_eval(lm, items, max_new_tokens=args.max_new_tokens, seed=args.seed)
    con = console(args)
    con.print(f"{lm.name}, {ev.n_items} items, {ev.max_new_tokens} greedy tokens, seed {ev.seed}:", markup=False)
    for name, c in ev.comparisons.items():
        con.print(
            f"  {name}: {c.wins}/{c.n} = {c.share:.3f} [{c.lo:.3f}, {c.hi:.3f}] (chance {c.chance:g}, p={c.p:.2g})",
            markup=False,
        )
    if args.json:
        write_json(args.json, {"model": lm.name, **vars(ev)})
    return 0


def run(args: argparse.Namespace) -> int:
    from ..analyses.concepts.schemes import Scheme
    from ..core.scoring.encode import arch_of
    from ..lab.experiments.runsetup import RunSetup
    from ..lab.hellaswag.data import data_id
    from ..lab.hellaswag.store import ResultStore

    if args.test != "baseline" and args.scheme != "standard":
        Scheme.parse(args.scheme)  # a malformed (or empty) --scheme fails before any data or model loads
    spec = _compact_spec(args)
    check_outputs(args)
    db = None if args.no_db else check_db(args.db)
    from ..analyses.concepts.cache import open_cache

    cache = open_cache(getattr(args, "cache", None))  # a bad cache folder fails before the model loads
    items, pool = _items(args)
    did = data_id(args.data)
    lm = load(args)
    scheme = None
    if args.test != "baseline":
        scheme = Scheme.from_spec(args.scheme, 1 if args.test == "test1" else 2, arch_of(lm))
    store = None if db is None else ResultStore(db)
    try:
        setup = RunSetup(
            shots=args.shots,
            pool=pool,
            fewshot_seed=args.seed,
            data=did,
            store=store,
            cache=cache,
            progress=not args.no_progress,
            pool_kind=args.pool,
        )
        summ, base = _scored(lm, items, args, spec, scheme, _control(args, setup))
    finally:
        if store is not None:
            store.close()
        if cache is not None:
            cache.close()
    out = _document(args, lm.name, summ.key.data, spec, scheme, summ, base, store)
    _print(out, args)
    _print_reuse(args, db, summ, base)
    if args.json:
        write_json(args.json, out)
    return 0


def _control(args: argparse.Namespace, setup: Any) -> tuple[Any, Any]:
    """The run's setup and its ``--control`` (None without), whose donors are every item of the file."""
    if getattr(args, "control", None) is None:
        return setup, None
    from ..lab.concepts.controls import make_control
    from ..lab.hellaswag.data import load_hellaswag

    everything = load_hellaswag(args.data)
    return setup, make_control(args.control, everything, lambda it: setup.examples([it])[0])


def _scored(
    lm: Any, items: list[Any], args: argparse.Namespace, spec: Any, scheme: Any, setup_control: tuple[Any, Any]
) -> tuple[Any, Any]:
    """The run of ``args.test`` (or of the compacted context ``spec``, or of a control) over ``items`` and the
    baseline beside it (None for a masked LM off the baseline test: it has no HellaSwag likelihood baseline)."""
    from ..core.scoring.encode import arch_of
    from ..lab.experiments.runner import baseline_scorer, run_test, scorer

    setup, control = setup_control
    if arch_of(lm) == "encoder" and args.test != "baseline":
        base = None  # a masked LM has no HellaSwag likelihood baseline: Test 2 is reported unnormalised
    else:
        base = run_test(lm, items, baseline_scorer(), setup, desc=f"{lm.name} baseline")
    if spec is not None:
        from ..lab.experiments.compaction import compact_run

        summ = compact_run(lm, items, spec, setup)
    else:
        if args.test == "baseline":
            assert base is not None  # only an encoder's base is None, and only off the baseline test
            summ = base
        else:
            desc = f"{lm.name} {args.test}" + (f" control={control.name}" if control else "")
            summ = run_test(lm, items, scorer(lm, args.test, scheme, control), setup, desc=desc)
    return summ, base


def _document(
    args: argparse.Namespace, model: str, did: str, spec: Any, scheme: Any, summ: Any, base: Any, store: Any
) -> dict[str, Any]:
    """The run's document (its ``--json``): the accuracies, the baseline's, the normalised scores, the picks."""
    from ..lab.experiments.runner import normalised

    return {
        "model": model,
        "data": did,
        "split": summ.key.split,
        "shots": args.shots,
        "test": "compact" if spec is not None else args.test,
        "compact": None if spec is None else str(spec),
        "scheme": None if scheme is None else summ.key.scheme,  # a control's: control=C;SCHEME
        "n": summ.n,
        "acc": summ.acc,
        "acc_norm": summ.acc_norm,
        "baseline": {"acc": base.acc if base else None, "acc_norm": base.acc_norm if base else None},
        "normalised": {
            "acc": normalised(summ.acc, base.acc) if base else None,
            "acc_norm": normalised(summ.acc_norm, base.acc_norm) if base else None,
        },
        "computed": summ.computed,
        "db": None if store is None else str(store.path),
        "command": "walklens " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("walklens") else None,
        "skip": args.skip,
        **_per_item(summ, base),
    }


def _items(args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """The items scored (``--skip``, then ``--limit``) and the pool their few-shot examples come from (the whole
    file when only some of its items are scored)."""
    from ..lab.hellaswag.data import fewshot_pool, load_hellaswag, scored_items

    items = load_hellaswag(args.data, limit=None if args.limit is None else args.skip + args.limit)
    if args.skip >= len(items):
        raise InputError(f"--skip {args.skip} leaves no item (the data has {len(items)})")
    limit = None if args.limit is None and not args.skip else len(items)
    pool = fewshot_pool(args.data, items, args.shots, limit, args.pool)
    return scored_items(items[args.skip :], args.shots, args.pool), pool


def _per_item(summ: Any, base: Any) -> dict[str, Any]:
    """The run's picks and gold per item; beside the baseline, the baseline's picks on the same items and the
    paired test of the run against them (:func:`walklens.lab.experiments.heldout.paired_against`)."""
    from ..lab.experiments.heldout import paired_against

    paired = base is not None and base is not summ
    return {
        "predictions": summ.predictions,
        "gold": [r.gold for r in summ.results],
        "baseline_predictions": base.predictions if paired else None,
        "paired": paired_against(summ, base) if paired else None,
    }


def _compact_spec(args: argparse.Namespace) -> Any:
    """The parsed ``--compact`` SPEC (None without one); a bad SPEC fails before any data or model loads."""
    if getattr(args, "compact", None) is None:
        return None
    from ..analyses.compaction import CompactSpec
    from ..base.errors import InputError

    spec = CompactSpec.parse(args.compact)
    if spec.what == "examples" and not args.shots:
        raise InputError("--compact what=examples compacts the few-shot examples: give --shots > 0")
    return spec


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _acc(x: float | None, lo: float | None, hi: float | None) -> str:
    """An accuracy with its interval, as the table shows it."""
    return "-" if x is None else f"{x:.4f}" + ("" if lo is None or hi is None else f" [{lo:.3f}, {hi:.3f}]")


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.2g}"


def _rows(out: dict[str, Any]) -> list[list[str]]:
    """The table's rows: every accuracy with its Wilson 95% interval and, for a run beside the baseline, the
    paired p against it (exact McNemar on the same items); the normalised score with its bootstrap interval."""
    from ..analyses.chance import wilson

    pd = out.get("paired")
    cells = {}
    for m in ("acc", "acc_norm"):
        if pd is not None:
            cells[m] = (pd[m], pd[m]["paired"]["p"])
        else:
            k = sum(p[m] == g for p, g in zip(out["predictions"], out["gold"]))
            lo, hi = wilson(k, out["n"]) if out["n"] else (None, None)
            cells[m] = ({"acc": out[m], "lo": lo, "hi": hi}, None)
    rows = [[escape(out["test"]), *(x for m in ("acc", "acc_norm") for x in (_acc(cells[m][0]["acc"],
            cells[m][0]["lo"], cells[m][0]["hi"]), _p(cells[m][1])))]]  # fmt: skip
    if out["test"] != "baseline":
        b = [(out["baseline"][m], (pd or {}).get(m, {})) for m in ("acc", "acc_norm")]
        rows.append(["baseline", *(x for v, d in b for x in (_acc(v, d.get("baseline_lo"), d.get("baseline_hi")),
                     "ref" if d else "-"))])  # fmt: skip
        n = [(out["normalised"][m], (pd or {}).get(m, {})) for m in ("acc", "acc_norm")]
        rows.append(["normalised", *(x for v, d in n for x in (_acc(v, d.get("norm_lo"), d.get("norm_hi")), "-"))])
    return rows


def _print(out: dict[str, Any], args: argparse.Namespace) -> None:
    """What was run, the scores as a table (each accuracy with its Wilson 95% interval and the paired p against
    the baseline), and the scheme (lines wrapped, so everything fits the terminal)."""
    con = console(args)
    say(con, f"{out['model']}: HellaSwag {out['test']}, {out['n']} items, {out['shots']}-shot")
    heads: list[Col | str] = ["score", Col("acc [95% Wilson]", justify="right"), Col("p (acc)", justify="right"),
             Col("acc_norm [95% Wilson]", justify="right"), Col("p (acc_norm)", justify="right")]  # fmt: skip
    print_table(con, "", heads, _rows(out))
    if out["test"] != "baseline" and out.get("paired"):
        say(con, "p: the exact McNemar test against the baseline's picks on the same items; normalised: bootstrap 95%")
    if out["scheme"] is not None:
        say(con, f"scheme: {out['scheme']}")
    if out.get("compact") is not None:
        say(con, f"compact: {out['compact']}")


def _print_reuse(args: argparse.Namespace, db: Any, summ: Any, base: Any) -> None:
    """Where the results are stored and, per run, how many items were computed now and how many read back from
    that database (never a silent reuse)."""
    runs = [("run", summ)] if base is None or base is summ else [(args.test, summ), ("baseline", base)]
    counts = "; ".join(f"{name}: {r.computed} computed, {r.n - r.computed} reused" for name, r in runs)
    where = "not stored (--no-db)" if db is None else f"{escape(str(db))} ({db_origin(args.db)})"
    say(console(args), f"results: {where}; {counts}")


def run_export(args: argparse.Namespace) -> int:
    from ..lab.hellaswag.store import ResultStore

    filters = {k[2:]: v for k, v in vars(args).items() if k.startswith("f_") and v is not None}
    check_outputs(args, out_file=True)  # the database is never the export file
    with ResultStore(args.db, readonly=True) as store:  # a reading command: a missing database is refused
        path = store.export(args.out, table=args.table, **filters)
    say(console(), f"wrote {path}")
    return 0
