"""The work a Test 1 sweep needs (docs/sweep.md): distinct concept sequences per item, the token positions the
model must compute for them, and how much of that sharing concept-vector prefixes across sequences would save.

    .venv/bin/python benchmarks/test1_work.py --grid docs/results/test1_grid.toml [--model smollm2-135m]
        [--shots 0] [--n 20] [--cache DIR]

Runs the sweep's own code (`experiments.sweep.run_sweep`) with the model's scorer replaced by a counter, so it
costs only the segment texts' forward passes (none with a warm `--cache`), not Test 1's scoring.  Positions
per row are the concept vectors plus the endings' input tokens as a prefix tree (`ScoreRequest.tree`), as
`hellaswag.packing` computes them.  The prefix saving compares concept vectors bit for bit (a 128-bit hash
of their bytes).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import tempfile
from pathlib import Path
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", required=True, help="full | standard | a TOML grid file")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--n", type=int, default=20, help="items (the first N of the validation file)")
    ap.add_argument("--cache", default=None, help="the sweep's segment-vector cache (--cache of walklens sweep)")
    args = ap.parse_args()

    import walklens
    from walklens.analyses.concepts.cache import open_cache
    from walklens.core.scoring import packing
    from walklens.core.scoring.encode import arch_of
    from walklens.lab.experiments import sweep
    from walklens.lab.experiments.grid import GridSpec
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.experiments.sweep import batched
    from walklens.lab.hellaswag.data import load_hellaswag
    from walklens.lab.hellaswag.store import ResultStore

    rows: dict[tuple, list[list[bytes]]] = collections.defaultdict(list)  # item (its endings) -> concept rows
    ending_nodes: dict[tuple, int] = {}

    def count(lm: Any, reqs: list[packing.ScoreRequest], **_: Any) -> list[list[float]]:
        for r in reqs:
            if r.context_embeds is None:  # the baseline (token ids), not Test 1
                continue
            key = tuple(tuple(int(t) for t in c) for c in r.continuations)
            rows[key].append(
                [hashlib.blake2b(v.float().numpy().tobytes(), digest_size=16).digest() for v in r.context_embeds]
            )
            ending_nodes[key] = len(r.tree[0])
        return [[0.0] * len(r.continuations) for r in reqs]

    batched.packed_logliks = count  # the name the sweep's Test 1 scorer calls
    lm = walklens.load_model(args.model)
    items = load_hellaswag(limit=args.n)
    schemes, _ = GridSpec.resolve(args.grid, 1, arch_of(lm), None).enumerate(arch_of(lm))
    with tempfile.TemporaryDirectory() as td:
        concepts = open_cache(args.cache)
        try:
            with ResultStore(Path(td) / "work.sqlite") as store:
                setup = RunSetup(shots=args.shots, store=store, cache=concepts, progress=False)
                sweep.run_sweep(lm, items, sweep.SweepSpec(1, schemes), setup)
        finally:
            if concepts is not None:
                concepts.close()

    n_rows = concept = trie = ending = 0
    for key, item_rows in rows.items():
        prefixes = {tuple(row[: j + 1]) for row in item_rows for j in range(len(row))}
        n_rows += len(item_rows)
        concept += sum(len(row) for row in item_rows)
        ending += ending_nodes[key] * len(item_rows)
        trie += len(prefixes)
    total = concept + ending
    n = max(len(rows), 1)
    print(f"{args.model}, {args.shots}-shot, grid {args.grid}: {len(schemes)} schemes, {len(rows)} items")
    print(f"distinct concept sequences per item: {n_rows / n:.1f}")
    print(
        f"token positions per item: {total / n:.1f} (concept vectors {concept / n:.1f}, "
        f"endings' input tokens {ending / n:.1f})"
    )
    print(
        f"sharing concept-vector prefixes across an item's sequences would save {concept - trie} positions "
        f"= {(concept - trie) / max(total, 1):.2%} of them"
    )


if __name__ == "__main__":
    main()
