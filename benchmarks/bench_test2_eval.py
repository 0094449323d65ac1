"""Test 2 sweep evaluation (issue 12): bundles of one NORM computed together against the evaluation before
(each bundle alone, re-reading and re-normalising whole bank rows), on a synthetic bank of the real shape.
Measured in one run; printed, never asserted.

    .venv/bin/python benchmarks/bench_test2_eval.py [--n 200] [--bundles 12] [--norms L2,varNorm] [--threads 1]
        [--repeats 1] [--json FILE]

The bank is smollm2-135m's for the full grid: 5 layers (``E`` and hidden state 0 bit-identical, as in Llama),
the 11 word aggregations, D = 576, float32.  Items are cut like the bundled validation set under
``sentence_level_segmentation`` in zero-shot: one example of 2-9 sentences (the set's own distribution,
padded to 9) and 4 endings, each a distinct bank row.  Each NORM gets ``--bundles`` bundles of 55 context
groups x 55 choice encodings (the full grid's), with different (seg, ex, sim); the full grid has 12 such
bundles per NORM and encoding.

* old: ``tests/oracles.test2_bundle_v1``, the evaluation before (walklens 12e298f), one call per bundle;
* new: :func:`walklens.lab.experiments.sweep.batched.test2_bundles_batched`, one call per NORM (a batch, as
  :func:`~walklens.lab.experiments.sweep.shards.test2_batch` runs it).

Each repeat runs old then new; printed: the fastest CPU seconds (``time.process_time``, robust to other
processes on shared cores) and wall seconds of each, per bundle and 1,000 items, the old / new ratio, and
whether every pick of every group and item is identical.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from walklens.cli.common import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference lives with the tests

#: sentences per context in the bundled validation set (10,042 items), ``split_sentences`` of each ctx
SENTENCES = {2: 1677, 3: 1391, 4: 6683, 5: 222, 6: 47, 7: 14, 8: 5, 9: 3}
#: (seg, ex, sim) of the bundles of one NORM, in the order they are taken
COMBOS = [
    ("mean", "mean", "cosine"),
    (None, None, "dot"),
    (None, "soft_cluster", "cosine"),
    ("mean", "soft_cluster", "dot"),
    ("mean", None, "cosine"),
    (None, "mean", "dot"),
    ("mean", "mean", "dot"),
    (None, None, "cosine"),
    (None, "soft_cluster", "dot"),
    ("mean", "soft_cluster", "cosine"),
    ("mean", None, "dot"),
    (None, "mean", "cosine"),
]


def synthetic(n: int, seed: int = 0) -> tuple[object, object]:
    """A bank ``[texts, 5, 11, 576]`` and the ``sentence_level_segmentation`` layout of ``n`` zero-shot items."""
    from walklens.analyses.concepts.schemes import WORD_AGG_SCHEMES
    from walklens.analyses.concepts.vectors import VectorBank
    from walklens.lab.experiments.sweep import EncLayout

    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    counts = rng.choice(list(SENTENCES), size=n, p=np.array(list(SENTENCES.values())) / sum(SENTENCES.values()))
    S = max(SENTENCES)
    texts = int(counts.sum()) + 4 * n
    vec = torch.randn(texts, 5, len(WORD_AGG_SCHEMES), 576, generator=g)
    vec[:, 1] = vec[:, 0]  # E = hidden state 0 (no absolute positions): aliased
    seg = torch.zeros(n, 1, S, dtype=torch.long)
    smask = torch.zeros(n, 1, S, dtype=torch.bool)
    row = 0
    for i, c in enumerate(counts):
        seg[i, 0, :c] = torch.arange(row, row + c)
        smask[i, 0, :c] = True
        row += int(c)
    end = torch.arange(row, row + 4 * n).reshape(n, 4)
    bank = VectorBank(layers=("E", "0", "15", "29", "30"), words=tuple(WORD_AGG_SCHEMES), index={}, vectors=vec)
    return bank, EncLayout(seg=seg, smask=smask, emask=smask.any(-1), end=end)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--bundles", type=int, default=12, help="bundles per NORM (1-12; 12: a real batch)")
    ap.add_argument("--norms", default="L2,varNorm")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not 1 <= args.bundles <= len(COMBOS):
        ap.error(f"--bundles must be 1..{len(COMBOS)}")

    import oracles
    from walklens.analyses.concepts.schemes import WORD_AGG_SCHEMES, Scheme
    from walklens.lab.experiments.sweep.batched import test2_bundles_batched
    from walklens.lab.experiments.sweep.shards import TEST2_CHUNK

    torch.set_num_threads(args.threads)
    enc = "sentence_level_segmentation"
    lk = {"E": "E", "0": "0", "middle": "15", "-2": "29", "-1": "30"}
    bank, layout = synthetic(args.n)
    norms = [None if x == "None" else x for x in args.norms.split(",")]
    outs = [(l, w) for l in lk for w in WORD_AGG_SCHEMES]
    batches = {
        norm: [
            (
                enc,
                [
                    [
                        Scheme(enc=enc, layer=l, word=w, norm=norm, seg=seg, ex=ex, sim=sim, out_layer=ol, out_word=ow)
                        for ol, ow in outs
                    ]
                    for l in lk
                    for w in WORD_AGG_SCHEMES
                ],
            )
            for seg, ex, sim in COMBOS[: args.bundles]
        ]
        for norm in norms
    }
    alias = bank.layer_alias()
    n_bundles = sum(map(len, batches.values()))
    print(
        f"bank {tuple(bank.vectors.shape)} float32 ({bank.vectors.nbytes / 2**20:.0f} MiB), {args.n} items, "
        f"{len(norms)} NORMs x {args.bundles} bundles of {len(lk) * len(WORD_AGG_SCHEMES)} groups x {len(outs)} "
        f"choice encodings, chunks of {TEST2_CHUNK} items, {args.threads} thread(s)",
        flush=True,
    )

    best: dict[str, tuple[float, float]] = {}
    identical = True
    for rep in range(args.repeats):
        res = {}
        for name in ("old", "new"):
            c0, w0 = time.process_time(), time.perf_counter()
            if name == "old":
                res[name] = [
                    oracles.test2_bundle_v1(bank, norm, layout, groups, lk, chunk=TEST2_CHUNK, alias=alias)
                    for norm, b in batches.items()
                    for _, groups in b
                ]
            else:
                res[name] = [
                    p
                    for norm, b in batches.items()
                    for p in test2_bundles_batched(bank, norm, {enc: layout}, b, lk, chunk=TEST2_CHUNK, alias=alias)
                ]
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            print(f"  repeat {rep + 1}: {name} {cpu:.2f} s CPU, {wall:.2f} s wall", file=sys.stderr, flush=True)
            best[name] = min(best.get(name, (cpu, wall)), (cpu, wall))
        identical &= len(res["old"]) == len(res["new"]) and all(
            np.array_equal(a, b) for a, b in zip(res["old"], res["new"])
        )
    per = 1000 / (n_bundles * args.n)
    for name, label in (("old", "old (one call per bundle)"), ("new", "new (one call per NORM)")):
        cpu, wall = best[name]
        print(f"{label:28s} {cpu:8.2f} s CPU {wall:8.2f} s wall  = {cpu * per:6.2f} s CPU per bundle and 1,000 items")
    ratio = best["old"][0] / best["new"][0]
    print(
        f"old / new: {ratio:.2f}x CPU, {best['old'][1] / best['new'][1]:.2f}x wall; picks identical "
        f"({n_bundles} bundles x {len(lk) * len(WORD_AGG_SCHEMES)} groups x {len(outs)} x {args.n} items): "
        f"{identical}"
    )
    if args.json:
        write_json(
            args.json,
            {
                "n": args.n,
                "bundles_per_norm": args.bundles,
                "norms": args.norms,
                "threads": args.threads,
                "old_cpu_s": best["old"][0],
                "new_cpu_s": best["new"][0],
                "old_wall_s": best["old"][1],
                "new_wall_s": best["new"][1],
                "ratio_cpu": ratio,
                "identical": identical,
            },
        )


if __name__ == "__main__":
    main()
