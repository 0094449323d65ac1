"""Test 1 positions/s in bfloat16 against float32 (issue 14, target >= 3x): measured in one run, printed, never
asserted.

    .venv/bin/python benchmarks/bench_test1_dtype.py [--n 20] [--model smollm2-135m] [--threads 2]
        [--grid docs/results/test1_grid.toml] [--repeats 2] [--profile] [--json FILE]

Both dtypes run the sweep's own Test 1 path (:func:`walklens.lab.experiments.sweep.run_sweep`, ``test=1``: concept
sequences composed from the bank, identical sequences once, :func:`~walklens.core.scoring.packing.packed_logliks`
scoring the endings after them) on the same items (the first N of the bundled validation set, zero-shot) with
the same threads, for two scheme sets: Test 1's standard scheme and a grid slice (``--grid``; default the
80 schemes of ``docs/results/test1_grid.toml``, inside every Test 1 grid of docs/sweep.md).  A warm-up run of
the standard scheme in each dtype comes first; each repeat then alternates the dtypes on a fresh database.
The segment vectors go to a cache (``--cache DIR``, reused by later runs; default a temporary folder), and
building them is not part of the timed scoring.  Printed per scheme set:

- token positions scored (concept vectors + the endings' input tokens, each request's packed row) and
  positions/s of the scoring calls (CPU time of this process inside ``packed_logliks``, fastest repeat), in
  each dtype, and the bfloat16 / float32 ratio (target >= 3; wall-time ratio too);
- whether the picks agree: the bfloat16 sweep against the float32 one, per metric, through
  :func:`walklens.lab.experiments.agreement.compare_sweeps` (share of identical picks, schemes whose accuracy moved).
``--profile``: one more bfloat16 run of the grid slice under ``torch.profiler``, printing the operators that take the
most CPU time.  Each timed run is logged to stderr as it ends.  CPU time (``time.process_time``) counts every thread
of the process, so with 2 threads positions/s is per 2 cores' worth of CPU time; wall-time ratios are printed too.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from walklens.cli.common import write_json


@contextlib.contextmanager
def counting(tally: dict[str, float]) -> Iterator[None]:
    """Count the positions and the CPU/wall time of every Test 1 scoring call of the sweep (the real scorer runs)."""
    from walklens.lab.experiments.sweep import batched

    real = batched.packed_logliks

    def scored(lm: Any, reqs: Any, **kw: Any) -> Any:
        c0, w0 = time.process_time(), time.perf_counter()
        out = real(lm, reqs, **kw)
        tally["cpu"] += time.process_time() - c0
        tally["wall"] += time.perf_counter() - w0
        tally["positions"] += sum(r.row_len for r in reqs)
        tally["requests"] += len(reqs)
        return out

    batched.packed_logliks = scored
    try:
        yield
    finally:
        batched.packed_logliks = real


def sweep_once(lm: Any, items: list[Any], schemes: list[Any], db: Path, cache: Path) -> dict[str, float]:
    """One Test 1 sweep of ``schemes``; the tally of its scoring calls."""
    from walklens.analyses.concepts.cache import ConceptCache
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.experiments.sweep import SweepSpec, run_sweep
    from walklens.lab.hellaswag.store import ResultStore

    tally = {"cpu": 0.0, "wall": 0.0, "positions": 0.0, "requests": 0.0}
    with counting(tally), ResultStore(db) as store, ConceptCache(cache) as concepts:
        run_sweep(lm, items, SweepSpec(1, schemes), RunSetup(data="bench", store=store, cache=concepts, progress=False))
    return tally


def profile(lm: Any, items: list[Any], schemes: list[Any], db: Path, cache: Path, rows: int = 18) -> str:
    """The operators taking the most CPU time in one Test 1 sweep (self time, torch.profiler)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CPU]) as p:
        sweep_once(lm, items, schemes, db, cache)
    return p.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20, help="the first N items of the bundled validation set")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--grid", default="docs/results/test1_grid.toml", help="the grid slice (a TOML grid file)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cache", default=None, help="keep the segment vectors here (default: a temporary folder)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import walklens
    from walklens.core.scoring.encode import arch_of
    from walklens.lab.experiments.agreement import Ranking, Scope, compare_sweeps
    from walklens.lab.experiments.grid import GridSpec
    from walklens.lab.hellaswag.data import load_hellaswag
    from walklens.lab.hellaswag.store import SweepStore

    items = load_hellaswag(limit=args.n)
    models = {name: walklens.load_model(args.model, dtype=name) for name in ("float32", "bfloat16")}
    arch = arch_of(models["float32"])
    sets = {
        "standard": GridSpec.resolve("standard", 1, arch, None).enumerate(arch)[0],
        "grid": GridSpec.resolve(args.grid, 1, arch, None).enumerate(arch)[0],
    }
    best: dict[tuple[str, str], dict[str, float]] = {}
    agree: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        cache = Path(args.cache) if args.cache else tmp / "cache"
        for lm in models.values():  # warm-up
            sweep_once(lm, items, sets["standard"], tmp / "warm-up.sqlite", cache)
        for r in range(1, args.repeats + 1):
            for set_name, schemes in sets.items():
                db = tmp / f"{set_name}{r}.sqlite"
                for dt, lm in models.items():
                    t = sweep_once(lm, items, schemes, db, cache)
                    sys.stderr.write(
                        f"repeat {r} {set_name} {dt}: {int(t['positions'])} positions, "
                        f"{t['cpu']:.1f} s CPU, {t['wall']:.1f} s wall\n"
                    )
                    if t["cpu"] < best.get((set_name, dt), {"cpu": float("inf")})["cpu"]:
                        best[(set_name, dt)] = t
                if r == args.repeats:
                    with SweepStore(db, readonly=True) as st:
                        agree[set_name] = compare_sweeps(
                            st,
                            models["float32"].name,
                            models["bfloat16"].name,
                            1,
                            Scope("bench"),
                            ranking=Ranking(ks=(1, 5)),
                        )
        prof = (
            {"bfloat16": profile(models["bfloat16"], items, sets["grid"], tmp / "profile.sqlite", cache)}
            if args.profile
            else {}
        )

    print(
        f"{args.model}, Test 1, {len(items)} items, 0-shot, {torch.get_num_threads()} thread(s), fastest of "
        f"{args.repeats} runs (CPU time of the scoring calls)"
    )
    out: dict[str, Any] = {"model": args.model, "n": len(items), "threads": torch.get_num_threads(), "sets": {}}
    for set_name, schemes in sets.items():
        f, b = best[(set_name, "float32")], best[(set_name, "bfloat16")]
        rate = {dt: t["positions"] / t["cpu"] for dt, t in (("float32", f), ("bfloat16", b))}
        ratio, wall_ratio = rate["bfloat16"] / rate["float32"], f["wall"] / b["wall"]
        g = agree[set_name]
        same = ", ".join(
            f"{m.metric} {m.same_picks:.1%} same picks, {m.moved} of {m.n_schemes} schemes moved (max {m.max_move:.3f})"
            for m in g.metrics
        )
        print(
            f"  {set_name} ({len(schemes)} schemes): {int(f['positions'])} positions in {int(f['requests'])} "
            f"requests (bfloat16: {int(b['positions'])}); float32 {rate['float32']:.0f} positions/s, "
            f"bfloat16 {rate['bfloat16']:.0f} positions/s"
        )
        print(f"  {set_name}: bf16/fp32 positions/s {ratio:.2f} (target >= 3; wall time {wall_ratio:.2f}); {same}")
        out["sets"][set_name] = {
            "schemes": len(schemes),
            "float32": f,
            "bfloat16": b,
            "positions_per_s": rate,
            "ratio": ratio,
            "wall_ratio": wall_ratio,
            "agreement": g,
        }
    for dt, table in prof.items():
        print(f"\nprofile, {dt}, grid slice (self CPU time):\n{table}")
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
