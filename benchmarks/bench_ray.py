"""Ray backend scaling (issue 15): the same Test 1 grid on the local backend and on 1 and 2 Ray workers (one
thread each) of a local Ray instance, as ratios in one run.  Printed, never asserted.

    .venv/bin/python benchmarks/bench_ray.py [--model smollm2-135m] [--n 16] [--shots 0]
        [--grid docs/results/test1_grid.toml] [--shard-items 8] [--data FILE] [--json FILE]

Targets: scaling efficiency ``T(1 worker) / (2 x T(2 workers)) >= 0.85`` and Ray overhead
``T(1 worker) / T(local) <= 1.10``.  ``T`` is the Test 1 scheme evaluation of a fresh database (the shards of
concept sequences, ``SweepOutcome.seconds_eval``): the workers are started and hold the model before the clock
starts, and the segment vectors come from a cache the first (local) run fills, so baseline and forward passes
(the same for every configuration) are left out.  The three databases must hold the same bits; that is checked.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch

from walklens.cli.common import write_json


def snapshot(db: Path) -> list[Any]:
    from walklens.lab.hellaswag.store import SweepStore

    with SweepStore(db, readonly=True) as st:
        return [(r["model"], r["test"], st.load(r["id"]).preds.tobytes()) for r in st.runs()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=16, help="items (the first N of --data)")
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--grid", default="docs/results/test1_grid.toml")
    ap.add_argument("--shard-items", type=int, default=8, help="items per Test 1 shard (fixed for all runs)")
    ap.add_argument("--data", default=None, help="HellaSwag file (default: the bundled validation set)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import ray

    from walklens.analyses.concepts.cache import ConceptCache
    from walklens.core.backends import LocalBackend
    from walklens.core.backends.ray_backend import RayBackend
    from walklens.core.scoring.encode import arch_of
    from walklens.lab.experiments.grid import GridSpec
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.experiments.sweep import SweepSpec, run_sweep
    from walklens.lab.hellaswag.data import load_hellaswag
    from walklens.lab.hellaswag.store import ResultStore

    torch.set_num_threads(1)  # the local backend runs with one thread, as each worker does
    lm = LocalBackend().driver_model(args.model)
    items = load_hellaswag(args.data, limit=args.n)
    pool = load_hellaswag(args.data) if args.shots else None
    schemes, _ = GridSpec.resolve(args.grid, 1, arch_of(lm)).enumerate(arch_of(lm))
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as td:
        cache = Path(td) / "cache"

        def sweep(name: str, workers: Any) -> None:
            with ResultStore(Path(td) / f"{name}.sqlite") as store, ConceptCache(cache) as concepts:
                setup = RunSetup(
                    shots=args.shots,
                    pool=pool,
                    data="bench",
                    store=store,
                    cache=concepts,
                    workers=workers,
                    progress=False,
                )
                out = run_sweep(lm, items, SweepSpec(1, schemes, test1_shard_items=args.shard_items), setup)
            seconds[name] = out.seconds_eval
            print(
                f"{name}: {out.seconds_eval:.1f} s Test 1 evaluation ({out.shards_computed.get('test1', 0)} "
                f"shards, {out.n_schemes} schemes, {len(items)} items)",
                flush=True,
            )

        sweep("local", LocalBackend().workers(lm))
        for n in (1, 2):
            with RayBackend(workers=n).workers(lm) as w:
                sweep(f"ray{n}", w)
        same = (
            snapshot(Path(td) / "local.sqlite")
            == snapshot(Path(td) / "ray1.sqlite")
            == snapshot(Path(td) / "ray2.sqlite")
        )
    ray.shutdown()
    eff = seconds["ray1"] / (2 * seconds["ray2"])
    over = seconds["ray1"] / seconds["local"]
    print(f"scaling efficiency 1 -> 2 workers: {eff:.2f} (target >= 0.85: {'met' if eff >= 0.85 else 'NOT met'})")
    print(f"Ray overhead, 1 worker / local: {over:.2f} (target <= 1.10: {'met' if over <= 1.10 else 'NOT met'})")
    print(f"identical stored picks (local, 1 worker, 2 workers): {same}")
    if args.json:
        write_json(
            args.json,
            {
                "model": lm.name,
                "n_items": len(items),
                "shots": args.shots,
                "grid": args.grid,
                "n_schemes": len(schemes),
                "shard_items": args.shard_items,
                "seconds": seconds,
                "efficiency": eff,
                "overhead": over,
                "identical": same,
            },
        )


if __name__ == "__main__":
    main()
