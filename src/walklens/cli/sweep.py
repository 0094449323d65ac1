"""``walklens sweep --test 1|2 --grid full|standard|FILE``: run every composition scheme of a grid (seed 000,
A.6) over HellaSwag items, one forward pass per distinct segment text serving every scheme.

Prints how many schemes the grid holds (and how many combinations were refused, with the reason), then runs
them; results stream into the SQLite results database (the same file as ``walklens hellaswag``), so killing
the command and running it again continues where it stopped.  ``walklens report --db PATH --out DIR`` draws
the paper-style report.  (Meant to be reachable as ``walklens hellaswag sweep`` too.)
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..errors import InputError
from .common import add_model_args, check_outputs, model_options, write_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a whole grid of composition schemes (Test 1 or 2) on HellaSwag")
    add_arguments(p)
    p.set_defaults(func=run)


def register_hellaswag(sub: argparse._SubParsersAction) -> None:
    """The same command as ``walklens hellaswag sweep`` (the issue's spelling)."""
    register(sub)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--test", type=int, required=True, choices=(1, 2), help="1: pyramidal generation, 2: concept "
                   "similarity (sec. 5.1.1, 5.1.2)")
    p.add_argument("--grid", default="full", metavar="full|standard|FILE",
                   help="full: the cartesian product of the A.6 values; standard: the paper's standard scheme; "
                        "FILE: a TOML grid (see docs/sweep.md)")
    p.add_argument("--layers", default=None, metavar="L,L,...",
                   help="layer set for ENCODING_LAYER and OUT_ENCODING_LAYER (default E,0,middle,-2,-1); with "
                        "--grid standard, the standard scheme at each of these layers")
    add_model_args(p)
    p.add_argument("--data", metavar="PATH", default=None,
                   help="HellaSwag .jsonl, .txt(.bz2) or hf:Rowan/hellaswag (default: $WALKLENS_HELLASWAG, else the "
                        "bundled validation set)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N items")
    p.add_argument("--shots", type=int, default=0, metavar="K", help="few-shot examples per item (default 0)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="few-shot sampling seed (default 1234)")
    p.add_argument("--db", metavar="PATH", default=None,
                   help="results database (default: $WALKLENS_DB or the user data directory)")
    p.add_argument("--cache", metavar="DIR", default=None,
                   help="also keep the word-aggregated segment vectors here (safetensors), reused by later runs")
    p.add_argument("--dry-run", action="store_true", help="only print how many schemes the grid holds")
    p.add_argument("--json", metavar="FILE", help="write counts, timings and the baseline here")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _say(msg: str) -> None:
    sys.stderr.write(msg + "\n")


def run(args: argparse.Namespace) -> int:
    from ..concepts.data import FEWSHOT_SEED, HF_PREFIX, data_id, load_hellaswag
    from ..concepts.grid import DEFAULT_LAYERS, GridSpec
    from ..concepts.schemes import canonical_layer
    from ..concepts.store import default_db_path
    from ..loading import load_model

    if args.limit is not None and args.limit <= 0:
        raise InputError(f"--limit must be positive, got {args.limit}")
    if args.shots < 0:
        raise InputError(f"--shots must be >= 0, got {args.shots}")
    check_outputs(args)
    layers = DEFAULT_LAYERS
    if args.layers:
        layers = tuple(canonical_layer(x) for x in args.layers.split(",") if x.strip())
        if not layers:
            raise InputError("--layers is empty")
    GridSpec.resolve(args.grid, args.test, "decoder", layers if args.layers else None)  # bad grid: fail fast
    lm = load_model(args.model, **model_options(args))
    from ..concepts.encode import arch_of

    arch = arch_of(lm)
    grid = GridSpec.resolve(args.grid, args.test, arch, layers if args.layers else None)
    from ..concepts.schemes import resolve_layer

    for l in grid.layers():
        resolve_layer(l, lm.n_layers)  # refuses a layer the model does not have, before any work
    schemes, refused = grid.enumerate(arch)
    n_ref = sum(refused.values())
    print(f"grid {grid.name}: {grid.product_size()} combinations, {n_ref} refused, {len(schemes)} schemes to run "
          f"(Test {args.test}, {lm.name}, {args.shots}-shot)")
    for reason, n in refused.items():
        print(f"  refused {n}: {reason}")
    if args.dry_run:
        return 0
    if not schemes:
        raise InputError("the grid holds no valid scheme")
    items = load_hellaswag(args.data, limit=args.limit)
    if args.data is not None and str(args.data).startswith(HF_PREFIX) and args.shots:
        pool: Any = load_hellaswag(args.data, split="train")
    else:
        pool = load_hellaswag(args.data) if (args.limit is not None and args.shots) else items
    db = args.db or str(default_db_path())
    seed = FEWSHOT_SEED if args.seed is None else args.seed
    from ..concepts.sweep import run_sweep

    t0 = time.perf_counter()
    out = run_sweep(lm, items, test=args.test, schemes=schemes, db=db, shots=args.shots, pool=pool,
                    data=data_id(args.data), fewshot_seed=seed, cache_dir=args.cache,
                    progress=not args.no_progress, log=_say)
    wall = time.perf_counter() - t0
    print(f"done: {out.groups_computed} groups computed now, {out.groups_stored_before} were stored; "
          f"{out.n_texts} distinct texts; baseline {out.seconds_baseline:.1f} s, forward {out.seconds_forward:.1f} s, "
          f"schemes {out.seconds_eval:.1f} s; database {db} (run {out.run_id})")
    print(f"baseline acc {out.baseline_acc} acc_norm {out.baseline_acc_norm}; report: walklens report --db {db} "
          f"--out DIR")
    if args.json:
        write_json(args.json, {"model": lm.name, "test": args.test, "shots": args.shots, "grid": args.grid,
                               "n_items": len(items), "n_schemes": out.n_schemes, "n_groups": out.n_groups,
                               "refused": refused, "groups_computed": out.groups_computed,
                               "groups_stored_before": out.groups_stored_before, "n_texts": out.n_texts,
                               "seconds": {"baseline": out.seconds_baseline, "forward": out.seconds_forward,
                                           "schemes": out.seconds_eval, "wall": wall},
                               "baseline": {"acc": out.baseline_acc, "acc_norm": out.baseline_acc_norm},
                               "db": db, "run_id": out.run_id})
    return 0
