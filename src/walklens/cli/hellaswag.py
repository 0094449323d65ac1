"""``walklens hellaswag baseline|test1|test2|export``: the concept-space experiments of seed 000 (sec. 5.1,
A.6) on HellaSwag, with results stored in an SQLite database (resumable) and an optional JSON summary.

Other modules can add ``walklens hellaswag`` sub-commands: any module of ``walklens.cli`` that defines
``register_hellaswag(subparsers)`` is called with this command's sub-parsers (e.g. ``walklens hellaswag sweep``).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Any

from ..errors import InputError
from .common import add_model_args, check_outputs, load, write_json


def _add_common(p: argparse.ArgumentParser, scheme: bool) -> None:
    add_model_args(p)
    p.add_argument("--data", metavar="PATH", default=None,
                   help="HellaSwag .jsonl (rowanz), .txt/.txt.bz2 (6 lines per item) or hf:Rowan/hellaswag "
                        "(default: $WALKLENS_HELLASWAG, else the bundled validation set)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N items")
    p.add_argument("--shots", type=int, default=0, metavar="K", help="few-shot examples per item (default 0)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="few-shot sampling seed (default 1234)")
    if scheme:
        p.add_argument("--scheme", default="standard", metavar="S",
                       help="'standard' (sec. 5.1) or key=value,... e.g. "
                            "enc=concat_each_example,layer=-1,word=w1mean,norm=None,seg=mean,ex=mean")
    p.add_argument("--db", metavar="PATH", default=None,
                   help="results database (default: $WALKLENS_DB or the user data dir's walklens/results.sqlite)")
    p.add_argument("--no-db", action="store_true", help="do not read or write the results database")
    p.add_argument("--json", metavar="FILE", help="write n, acc, acc_norm, baseline, normalised, predictions here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hellaswag", help="HellaSwag baseline and concept-space Tests 1 and 2 (seed 000, sec. 5)")
    hs = p.add_subparsers(dest="hellaswag_command", metavar="COMMAND", parser_class=type(p))
    b = hs.add_parser("baseline", help="the ordinary score, as lm-evaluation-harness computes it")
    _add_common(b, scheme=False)
    b.set_defaults(func=run, test="baseline")
    t1 = hs.add_parser("test1", help="Test 1, pyramidal generation: endings scored after concept vectors")
    _add_common(t1, scheme=True)
    t1.set_defaults(func=run, test="test1")
    t2 = hs.add_parser("test2", help="Test 2, concept similarity: context vector(s) vs each ending's vector")
    _add_common(t2, scheme=True)
    t2.set_defaults(func=run, test="test2")
    ex = hs.add_parser("export", help="export stored runs or per-item results to .csv or .parquet")
    ex.add_argument("out", help="output file (.csv or .parquet)")
    ex.add_argument("--table", choices=("results", "runs"), default="results")
    ex.add_argument("--db", metavar="PATH", default=None)
    for k in ("model", "data", "split", "test", "scheme"):
        ex.add_argument(f"--{k}", dest=f"f_{k}", default=None, help=f"only rows with this {k}")
    ex.add_argument("--shots", dest="f_shots", type=int, default=None)
    ex.set_defaults(func=run_export)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
    from .. import cli as cli_pkg

    for info in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in ("common", "hellaswag"):
            continue
        mod = importlib.import_module(f"{cli_pkg.__name__}.{info.name}")
        if hasattr(mod, "register_hellaswag"):
            mod.register_hellaswag(hs)


def _pool(args: argparse.Namespace, items: list[Any]) -> list[Any] | None:
    """Few-shot pool: the hub's train split when loading from the hub, else every item of the file."""
    from ..concepts.data import HF_PREFIX, load_hellaswag

    if not args.shots:
        return None
    if args.data and str(args.data).startswith(HF_PREFIX):
        return load_hellaswag(args.data, split="train")
    return load_hellaswag(args.data) if args.limit is not None else items


def run(args: argparse.Namespace) -> int:
    from ..concepts.data import FEWSHOT_SEED, data_id, load_hellaswag
    from ..concepts.encode import arch_of
    from ..concepts.runner import normalised, run_test
    from ..concepts.schemes import Scheme
    from ..concepts.store import ResultStore

    if args.limit is not None and args.limit <= 0:
        raise InputError(f"--limit must be positive, got {args.limit}")
    if args.shots < 0:
        raise InputError(f"--shots must be >= 0, got {args.shots}")
    if args.test != "baseline" and args.scheme != "standard":
        Scheme.parse(args.scheme)  # a malformed (or empty) --scheme fails before any data or model loads
    check_outputs(args)
    items = load_hellaswag(args.data, limit=args.limit)
    pool = _pool(args, items)
    did = data_id(args.data)
    seed = FEWSHOT_SEED if args.seed is None else args.seed
    lm = load(args)
    scheme = None
    if args.test != "baseline":
        scheme = Scheme.from_spec(args.scheme, 1 if args.test == "test1" else 2, arch_of(lm))
    store = None if args.no_db else ResultStore(args.db)
    try:
        common = dict(shots=args.shots, pool=pool, data=did, store=store, fewshot_seed=seed,
                      progress=not args.no_progress)
        if arch_of(lm) == "encoder" and args.test != "baseline":
            base = None  # a masked LM has no HellaSwag likelihood baseline: Test 2 is reported unnormalised
        else:
            base = run_test(lm, items, test="baseline", desc=f"{lm.name} baseline", **common)
        summ = base if args.test == "baseline" else run_test(lm, items, test=args.test, scheme=scheme,
                                                             desc=f"{lm.name} {args.test}", **common)
    finally:
        if store is not None:
            store.close()
    out = {
        "model": lm.name, "data": did, "split": summ.key.split, "shots": args.shots, "test": args.test,
        "scheme": None if scheme is None else str(scheme), "n": summ.n, "acc": summ.acc, "acc_norm": summ.acc_norm,
        "baseline": {"acc": base.acc if base else None, "acc_norm": base.acc_norm if base else None},
        "normalised": {"acc": normalised(summ.acc, base.acc) if base else None,
                       "acc_norm": normalised(summ.acc_norm, base.acc_norm) if base else None},
        "computed": summ.computed, "db": None if store is None else str(store.path),
        "command": "walklens " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("walklens") else None,
        "predictions": summ.predictions,
    }
    _print(out)
    if args.json:
        write_json(args.json, out)
    return 0


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _print(out: dict[str, Any]) -> None:
    line = (f"{out['model']} {out['test']} n={out['n']} shots={out['shots']}: acc={_fmt(out['acc'])} "
            f"acc_norm={_fmt(out['acc_norm'])}")
    if out["test"] != "baseline":
        line += (f" | baseline acc={_fmt(out['baseline']['acc'])} acc_norm={_fmt(out['baseline']['acc_norm'])}"
                 f" | normalised acc={_fmt(out['normalised']['acc'])} acc_norm={_fmt(out['normalised']['acc_norm'])}"
                 f" | scheme {out['scheme']}")
    print(line)


def run_export(args: argparse.Namespace) -> int:
    from ..concepts.store import ResultStore

    filters = {k[2:]: v for k, v in vars(args).items() if k.startswith("f_") and v is not None}
    with ResultStore(args.db, readonly=True) as store:  # a reading command: a missing database is refused
        path = store.export(args.out, table=args.table, **filters)
    print(f"wrote {path}")
    return 0
