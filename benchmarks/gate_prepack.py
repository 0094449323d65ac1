"""The exactness gate and the speed of prepacked linear layers in packed scoring (issue 39; docs/dtype.md).

The HellaSwag baseline (``baseline_items``, bfloat16) scores the first ``--n`` items in chunks; each chunk is
scored with ``WALKLENS_PREPACK=0`` (``F.linear``, the weight reordered at every call) and ``=1``
(:func:`walklens.core.interventions.prepacked_linears`), alternating which goes first, so the machine's load falls
on both alike.  Prints and writes: identical log-likelihoods (bit for bit) and picks, the largest difference,
and the CPU-time ratio.  Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gate_prepack.py --model smollm2-135m --n 2000 \
        --json docs/results/gate_prepack_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import walklens
from walklens.lab.hellaswag.baseline import baseline_items
from walklens.lab.hellaswag.data import load_hellaswag


def scored(lm: walklens.LoadedModel, items: list[Any], prepack: bool) -> tuple[list[Any], float]:
    os.environ["WALKLENS_PREPACK"] = "1" if prepack else "0"
    t0 = time.process_time()
    out = baseline_items(lm, items)
    return out, time.process_time() - t0


def row(out: dict[str, Any]) -> str:
    """The row of docs/dtype.md's gate table for one run's JSON."""
    return (
        f"| {out['model']} | {out['n']:,} | {out['identical log-likelihoods']:.3f} | "
        f"{out['identical picks (acc and acc_norm)']:.3f} | {out['max |d loglik|']:.2g} | "
        f"{out['eager items/s']:.2f} / {out['prepacked items/s']:.2f} | {out['ratio (CPU time)']:.2f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--chunk", type=int, default=100)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    lm = walklens.load_model(args.model, dtype=args.dtype)
    items = load_hellaswag(limit=args.n)
    baseline_items(lm, items[:8])
    t = {False: 0.0, True: 0.0}
    same_scores = same_picks = 0
    max_d = 0.0
    for k in range(0, len(items), args.chunk):
        chunk = items[k : k + args.chunk]
        order = (False, True) if (k // args.chunk) % 2 == 0 else (True, False)
        res = {}
        for p in order:
            res[p], dt = scored(lm, chunk, p)
            t[p] += dt
        for a, b in zip(res[False], res[True]):
            same_scores += a.scores == b.scores
            same_picks += a.pred == b.pred and a.pred_norm == b.pred_norm
            max_d = max(max_d, max(abs(x - y) for x, y in zip(a.scores, b.scores)))
        print(f"{k + len(chunk)}/{len(items)} items: identical so far {same_scores}", file=sys.stderr, flush=True)
    out = {
        "model": args.model,
        "dtype": args.dtype,
        "n": len(items),
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
        "eager items/s": len(items) / t[False],
        "prepacked items/s": len(items) / t[True],
        "ratio (CPU time)": t[False] / t[True],
        "identical log-likelihoods": same_scores / len(items),
        "identical picks (acc and acc_norm)": same_picks / len(items),
        "max |d loglik|": max_d,
        "command": "python benchmarks/gate_prepack.py " + " ".join(sys.argv[1:]),
    }
    print(json.dumps(out, indent=1))
    print(row(out))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
