"""``walklens sweep --test 1|2 --grid full|standard|small|FILE``: run every composition scheme of a grid (seed
000, A.6) over HellaSwag items, one forward pass per distinct segment text serving every scheme.

Prints how many schemes the grid holds (and how many combinations were refused, with the reason), then runs
them; results stream into the SQLite results database (the same file as ``walklens hellaswag``, named with how
it was chosen), so killing the command and running it again continues where it stopped.  At the end it prints
the baseline with its Wilson interval and the best schemes with their held-out scores (the k-fold held-out best,
each fold's scheme chosen on the other folds, and the paired p against the baseline); ``walklens report --db
PATH --out DIR`` draws the paper-style report.  Its name is ``walklens hellaswag sweep``; ``walklens sweep`` is
an alias of it: one command (one parser's options, one function), listed under both names, each help saying so.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from .backend import add_backend_args, backend_from_args
from .common import add_hellaswag_args, check_db, check_outputs, db_origin, load, write_json
from .terminal import Col, console, print_table, say

HELP = "run a whole grid of composition schemes (Test 1 or 2) on HellaSwag"
DESCRIPTION = (
    "Run every composition scheme of a grid (seed 000, A.6) over HellaSwag items, one forward pass per distinct "
    "segment text serving every scheme. `walklens hellaswag sweep` and `walklens sweep` (its alias) are the same "
    "command: the same options, the same run."
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``walklens sweep``: the alias of ``walklens hellaswag sweep``, said so in its help."""
    _add(sub, "alias of `walklens hellaswag sweep` (the same command): " + HELP)


def register_hellaswag(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``walklens hellaswag sweep``: the command's name."""
    _add(sub, HELP + " (also `walklens sweep`)")


def _add(sub: argparse._SubParsersAction[argparse.ArgumentParser], summary: str) -> None:
    p = sub.add_parser("sweep", help=summary, description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--test",
        type=int,
        required=True,
        choices=(1, 2),
        help="1: pyramidal generation, 2: concept similarity (sec. 5.1.1, 5.1.2)",
    )
    p.add_argument(
        "--grid",
        default="full",
        metavar="full|standard|small|FILE",
        help="full: the cartesian product of the A.6 values; standard: the paper's standard scheme; small: a "
        "first sweep (8 Test 1 / 32 Test 2 schemes); FILE: a TOML grid (see docs/sweep.md)",
    )
    p.add_argument(
        "--layers",
        default=None,
        metavar="L,L,...",
        help="layer set for ENCODING_LAYER and OUT_ENCODING_LAYER (default E,0,middle,-2,-1); with "
        "--grid standard, the standard scheme at each of these layers",
    )
    add_hellaswag_args(p, "write counts, timings and the baseline here")
    p.add_argument(
        "--cache",
        metavar="DIR",
        default=None,
        help="also keep the word-aggregated segment vectors here (safetensors), reused by later runs",
    )
    p.add_argument("--dry-run", action="store_true", help="only print how many schemes the grid holds")
    add_backend_args(p)


def run(args: argparse.Namespace) -> int:
    """Check every input (options, grid, output paths, database, data) before the model loads; then the grid's
    layers against the model, then the sweep."""
    from ..analyses.concepts.schemes import resolve_layer
    from ..core.scoring.encode import arch_of
    from ..lab.experiments.grid import GridSpec
    from ..lab.hellaswag.data import fewshot_pool, load_hellaswag

    check_outputs(args)
    chosen = _chosen_layers(args)
    GridSpec.resolve(args.grid, args.test, "decoder", chosen)  # a bad grid fails before anything loads
    backend = backend_from_args(args)  # local, or Ray actors (docs/scale.md)
    items: Any = None
    db: Path | None = None
    pool: Any = None
    if not args.dry_run:
        db = check_db(args.db)
        items = load_hellaswag(args.data, limit=args.limit)
        pool = fewshot_pool(args.data, items, args.shots, args.limit)
    lm = (
        load(args)
        if backend.name == "local"
        else backend.driver_model(args.model, dtype=args.dtype, device=args.device)
    )
    arch = arch_of(lm)
    grid = GridSpec.resolve(args.grid, args.test, arch, chosen)
    for l in grid.layers():
        resolve_layer(l, lm.n_layers)  # refuses a layer the model does not have, before any work
    schemes, refused = grid.enumerate(arch)
    con = console(args)
    say(
        con,
        f"grid {grid.name}: {grid.product_size()} combinations, {sum(refused.values())} refused, "
        f"{len(schemes)} schemes to run (Test {args.test}, {lm.name}, {args.shots}-shot)",
    )
    for reason, n in refused.items():
        say(con, f"  refused {n}: {reason}")
    if args.dry_run:
        return 0
    assert db is not None  # set above unless a dry run, which has returned
    if not schemes:
        raise InputError("the grid holds no valid scheme")
    t0 = time.perf_counter()
    out = _sweep(args, lm, items, pool, db, schemes, backend)
    wall = time.perf_counter() - t0
    _print_done(con, out, wall, db, args, len(items))
    _print_best(con, db, out.run_id)
    if args.json:
        _write_result(args, lm, items, out, refused, wall, db)
    return 0


def _chosen_layers(args: argparse.Namespace) -> tuple[Any, ...] | None:
    """The layers --layers chooses, each in its canonical form (None without the option: the grid's own)."""
    from ..analyses.concepts.schemes import canonical_layer
    from ..lab.experiments.grid import DEFAULT_LAYERS

    layers = DEFAULT_LAYERS
    if args.layers:
        layers = tuple(canonical_layer(x) for x in args.layers.split(",") if x.strip())
        if not layers:
            raise InputError("--layers is empty")
    return layers if args.layers else None


def _sweep(args: argparse.Namespace, lm: Any, items: Any, pool: Any, db: Path, schemes: list[Any], backend: Any) -> Any:
    """The sweep of ``schemes`` over ``items`` on the backend's workers, stored in the database ``db`` (the
    concept cache --cache kept open meanwhile)."""
    from ..analyses.concepts.cache import open_cache
    from ..lab.experiments.runsetup import RunSetup
    from ..lab.experiments.sweep import SweepSpec, run_sweep
    from ..lab.hellaswag.data import data_id
    from ..lab.hellaswag.store import ResultStore

    cache = open_cache(args.cache)
    try:
        with ResultStore(db) as store, backend.workers(lm) as workers:
            setup = RunSetup(
                shots=args.shots,
                pool=pool,
                fewshot_seed=args.seed,
                data=data_id(args.data),
                store=store,
                cache=cache,
                workers=workers,
                progress=not args.no_progress,
            )
            out = run_sweep(
                lm,
                items,
                SweepSpec(test=args.test, schemes=schemes),
                setup,
                log=lambda m: say(console(args, stderr=True), m),
            )
    finally:
        if cache is not None:
            cache.close()
    return out


def _print_done(con: Any, out: Any, wall: float, db: Any, args: argparse.Namespace, n: int) -> None:
    """What the sweep computed and what it read back (from which database, chosen how), its seconds and its
    baseline with the Wilson 95% interval."""
    from ..analyses.chance import wilson

    say(
        con,
        f"done: {out.groups_computed} groups computed now, {out.groups_stored_before} reused from the results "
        f"database {db} ({db_origin(args.db)}); {out.n_texts} distinct texts (run {out.run_id})",
    )
    print_table(
        con,
        "seconds",
        [Col(h, justify="right") for h in ("baseline", "forward passes", "schemes", "wall")],
        [[f"{x:.1f}" for x in (out.seconds_baseline, out.seconds_forward, out.seconds_eval, wall)]],
        keys=0,
    )

    def cell(x: float | None) -> str:
        if x is None:
            return "-"
        lo, hi = wilson(round(x * n), n)
        return f"{x:.4f} [{lo:.3f}, {hi:.3f}]"

    print_table(
        con,
        f"baseline ({n} items)",
        [Col("acc [95% Wilson]", justify="right"), Col("acc_norm [95% Wilson]", justify="right")],
        [[cell(x) for x in (out.baseline_acc, out.baseline_acc_norm)]],
        keys=0,
    )


def _print_best(con: Any, db: Any, run_id: int) -> None:
    """Per metric, the best schemes with their held-out scores: the k-fold held-out best (Wilson 95%), its paired
    p against the baseline on the same items, and each fold's scheme (chosen on the other folds) with its score
    on that fold; then the report's command."""
    from ..lab.experiments.summary import summarise_stored

    s = summarise_stored(db, run_id)
    for metric, m in (s.metrics if s is not None else {}).items():
        kf = m.kfold
        p = "-" if m.paired is None else f"{m.paired.p:.2g}"
        base = "-" if m.baseline is None else f"{m.baseline:.4f}"
        say(
            con,
            f"{metric}: {kf.k}-fold held-out best {kf.acc:.4f} [{kf.lo:.3f}, {kf.hi:.3f}] over {kf.n} items "
            f"(baseline {base}; paired p {p}, exact McNemar on the same items)",
        )
        rows = [[str(i + 1), escape(sc), f"{a:.4f}"] for i, (sc, a) in enumerate(zip(kf.fold_schemes, kf.fold_acc))]
        print_table(
            con,
            f"{metric}: best scheme of each fold (chosen on the other folds) and its held-out score",
            [Col("fold", justify="right"), Col("scheme", wrap=True), Col("held-out acc", justify="right")],
            rows,
            keys=1,
        )
    say(con, f"report: walklens report --db {db} --out DIR")


def _write_result(args: argparse.Namespace, lm: Any, items: Any, out: Any, refused: Any, wall: float, db: Any) -> None:
    """The sweep's summary as JSON at ``--json``."""
    write_json(
        args.json,
        {
            "model": lm.name,
            "test": args.test,
            "shots": args.shots,
            "grid": args.grid,
            "n_items": len(items),
            "n_schemes": out.n_schemes,
            "n_groups": out.n_groups,
            "refused": refused,
            "groups_computed": out.groups_computed,
            "groups_stored_before": out.groups_stored_before,
            "n_texts": out.n_texts,
            "seconds": {
                "baseline": out.seconds_baseline,
                "forward": out.seconds_forward,
                "schemes": out.seconds_eval,
                "wall": wall,
            },
            "baseline": {"acc": out.baseline_acc, "acc_norm": out.baseline_acc_norm},
            "db": str(db),
            "run_id": out.run_id,
            "held_out": _held_out(db, out.run_id),
        },
    )


def _held_out(db: Any, run_id: int) -> dict[str, Any] | None:
    """Per metric the 5-fold held-out best with its Wilson interval, the bootstrap of the whole select-then-score
    procedure and the paired test against the baseline on the same items (what ``walklens report`` shows)."""
    from dataclasses import asdict

    from ..lab.experiments.summary import summarise_stored

    s = summarise_stored(db, run_id)
    if s is None:
        return None
    return {
        metric: {
            "baseline": m.baseline,
            "kfold": {k: v for k, v in asdict(m.kfold).items() if k not in ("fold_schemes", "fold_acc")},
            "bootstrap": m.bootstrap and asdict(m.bootstrap),
            "paired": m.paired and asdict(m.paired),
        }
        for metric, m in s.metrics.items()
    }
