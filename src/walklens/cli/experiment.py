"""``walklens experiment run FILE``: a whole study from a TOML experiment file (models x tests x shots x seeds over
an item range; :mod:`walklens.lab.experiments.experiment`) into one database, locally or on Ray (docs/scale.md).

Every key of the file, the grids, the data and the database are checked before any model loads; each run
resumes where an interrupted one stopped, so running the same command again continues the study.
``walklens report --db PATH --out DIR`` reports every run of the database.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from ..base.records import Input
from .backend import add_backend_args, backend_from_args
from .common import check_db, check_outputs, write_json
from .terminal import console, say


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("experiment", help="run a whole study described in a TOML experiment file (docs/scale.md)")
    es = p.add_subparsers(dest="experiment_command", metavar="COMMAND", parser_class=type(p))
    r = es.add_parser("run", help="run every model, test, shot count and seed of an experiment file")
    r.add_argument("file", metavar="FILE", help="the experiment file (TOML; docs/examples/experiment.toml)")
    add_backend_args(r)
    r.add_argument("--db", metavar="PATH", default=None, help="results database (default: the file's db)")
    r.add_argument("--dry-run", action="store_true", help="only list the runs and their grids")
    r.add_argument("--json", metavar="FILE", help="write every run's counts and timings here")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.set_defaults(func=run)

    def usage(a: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def _inputs(exp: Any, db: str) -> list[Input]:
    """What a study reads besides FILE and its database: its data, model folders, grid files and the vector
    bank's cache."""
    from ..lab.experiments.sweep.study import default_cache
    from ..lab.hellaswag.data import default_path

    found = [Input("experiment data", Path(exp.data).expanduser() if exp.data else default_path())]
    for m in exp.models:
        p = Path(m.spec).expanduser()
        if p.exists():
            found.append(Input("experiment model", p, folder=p.is_dir()))
    found += [
        Input(f"experiment grid (Test {t})", Path(g).expanduser())
        for t, g in exp.grids.items()
        if os.path.isfile(os.path.expanduser(g))
    ]
    if exp.cache is not False:
        cache = exp.cache if isinstance(exp.cache, str) else default_cache(db)
        found.append(Input("experiment cache", Path(cache).expanduser(), folder=True))
    return found


def run(args: argparse.Namespace) -> int:
    from ..lab.experiments.experiment import read_experiment

    exp = read_experiment(args.file)
    args.db = args.db or exp.db
    if not args.db:
        raise InputError(f'no database: give --db PATH or db = "..." in {exp.path}')
    check_outputs(args, inputs=_inputs(exp, args.db))
    db = check_db(args.db)
    runs = exp.runs()
    con, err = console(args), console(args, stderr=True)  # with --json -, standard output holds the JSON only
    say(con, f"{exp.path}: {len(exp.models)} model(s), {len(runs)} run(s) into {db}")
    if args.dry_run:
        for m, seed, shots, test in runs:
            say(
                con,
                f"  {m.spec} ({m.dtype}, {m.device}) Test {test}, {shots}-shot"
                f"{f', seed {seed}' if shots else ''}, grid {exp.grids[test]}",
            )
        return 0
    backend = backend_from_args(args, exp.backend)
    from ..lab.experiments.sweep.study import StudyRun, run_experiment

    rows: list[dict[str, Any]] = []

    def done(r: StudyRun) -> None:
        o = r.outcome
        say(
            con,
            f"{r.model} Test {r.test} {r.shots}-shot seed {r.seed}: {o.n_schemes} schemes, "
            f"{o.groups_computed} groups computed now, {o.groups_stored_before} were stored; shards "
            f"{o.shards_computed or 'none'}; {r.seconds:.1f} s",
        )
        rows.append(
            {
                "model": r.model,
                "test": r.test,
                "shots": r.shots,
                "seed": r.seed,
                "grid": r.grid,
                "n_items": r.n_items,
                "run_id": o.run_id,
                "n_schemes": o.n_schemes,
                "groups_computed": o.groups_computed,
                "groups_stored_before": o.groups_stored_before,
                "shards_computed": o.shards_computed,
                "baseline": {"acc": o.baseline_acc, "acc_norm": o.baseline_acc_norm},
                "backend": o.backend,
                "workers": o.workers,
                "seconds": r.seconds,
            }
        )

    run_experiment(exp, backend, db=db, progress=not args.no_progress, log=lambda m: say(err, m), on_run=done)
    say(con, f"report: walklens report --db {db} --out DIR")
    if args.json:
        write_json(args.json, {"experiment": str(exp.path), "db": str(db), "runs": rows})
    return 0
