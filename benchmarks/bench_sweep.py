"""Test 2 full grid vs one scheme (issue 7): the whole A.6 product (~7x10^5 schemes with the default layer set)
over N items, divided by the single standard scheme over the same items through the single-scheme runner.
Target <= 1.5.  Measured in one run; printed, never asserted.

    .venv/bin/python benchmarks/bench_sweep.py [--n 50] [--model smollm2-135m] [--json FILE]

The grid's time is enumeration + forward passes of every distinct segment text + evaluation of every scheme
(the baseline, needed by both for normalised scores, is timed apart).  The standard scheme's predictions in
the sweep are checked against the single run's.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from walklens.cli.common import write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import walklens
    from walklens.analyses.concepts.schemes import Scheme
    from walklens.core.scoring.encode import arch_of
    from walklens.lab.experiments.grid import GridSpec
    from walklens.lab.experiments.runner import run_test, scorer
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.experiments.sweep import SweepSpec, run_sweep
    from walklens.lab.hellaswag.data import load_hellaswag
    from walklens.lab.hellaswag.store import ResultStore, SweepStore

    items = load_hellaswag(limit=args.n)
    lm = walklens.load_model(args.model)
    arch = arch_of(lm)
    std = Scheme.standard(2, arch)
    quiet = RunSetup(progress=False)
    run_test(lm, items[:2], scorer(lm, "test2", std), quiet)  # warm-up
    t0 = time.perf_counter()
    single = run_test(lm, items, scorer(lm, "test2", std), quiet)
    t_single = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as td:
        t1 = time.perf_counter()
        schemes, _ = GridSpec.full(2).enumerate(arch)
        t_enum = time.perf_counter() - t1
        with ResultStore(Path(td) / "bench.sqlite") as store:
            out = run_sweep(lm, items, SweepSpec(2, schemes), RunSetup(data="bench", store=store, progress=False))
        with SweepStore(Path(td) / "bench.sqlite") as st:
            res = st.load(out.run_id)
    t_grid = t_enum + out.seconds_forward + out.seconds_eval
    i = res.schemes.index(str(std))
    same = bool(np.array_equal(res.preds[0, i], np.array([r.pred for r in single.results])))
    ratio = t_grid / t_single
    result = {
        "model": lm.name,
        "n_items": len(items),
        "n_schemes": len(schemes),
        "n_groups": out.n_groups,
        "n_texts": out.n_texts,
        "seconds_single_standard": t_single,
        "seconds_grid_enumerate": t_enum,
        "seconds_grid_forward": out.seconds_forward,
        "seconds_grid_schemes": out.seconds_eval,
        "seconds_grid": t_grid,
        "seconds_baseline": out.seconds_baseline,
        "ratio": ratio,
        "standard_scheme_predictions_identical": same,
        "torch_threads": torch.get_num_threads(),
    }
    print(f"single standard scheme, {len(items)} items: {t_single:.1f} s")
    print(
        f"full Test 2 grid, {len(schemes)} schemes ({out.n_groups} context groups, {out.n_texts} distinct texts): "
        f"enumerate {t_enum:.1f} s + forward {out.seconds_forward:.1f} s + schemes {out.seconds_eval:.1f} s "
        f"= {t_grid:.1f} s  (baseline for normalisation: {out.seconds_baseline:.1f} s)"
    )
    print(
        f"ratio full grid / one scheme = {ratio:.2f} (target <= 1.5); "
        f"{len(schemes) * len(items) / t_grid:,.0f} scheme-items/s; standard scheme identical: {same}"
    )
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
