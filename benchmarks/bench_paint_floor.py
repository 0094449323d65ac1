"""The explorer's two paints against their floors (issue 39), on SmolLM2-135M, one thread, in one run:

- **the exact heatmap's floor**: a plain capture of a 1,000-token text, then the exact rank maps of every walk
  point (``encoding_walk(k=0, probs=False)``, what the exact pass computes), with the seconds its float32
  products take (:meth:`walklens.core.ranking.Linear.tile`'s ``torch.mm``, timed inside the walk).  The exact
  heatmap cannot come before the capture and these products: ``(capture + products) / capture`` is a floor
  of its ratio to a capture (target <= 3);
- **the first paint's screen** of a 64-token text (the screened points, bfloat16 products): with the token
  matrix's bfloat16 rows and norms made again on every request (the kept tensors dropped first, as before
  they were kept) and kept (the default), alternating; and the logit-lens screen (``norm="final"``).

Usage: OMP_NUM_THREADS=1 python benchmarks/bench_paint_floor.py [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import walklens
from walklens.core import kept as kept_tensors
from walklens.core import ranking
from walklens.server.api_walks import screen_points
from walklens.server.traces import WALK_POINTS

sys.path.insert(0, str(Path(__file__).parent))
from bench_serve import texts


def timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def product_seconds(tr: walklens.Trace) -> tuple[float, float]:
    """Seconds of the exact rank maps of every point of ``tr``, and of their float32 products alone."""
    spent = [0.0]
    real = ranking.Linear.tile

    def tile(self, v0, v1):
        t0 = time.perf_counter()
        out = real(self, v0, v1)
        spent[0] += time.perf_counter() - t0
        return out

    ranking.Linear.tile = tile  # type: ignore[method-assign]
    try:
        total = timed(lambda: walklens.encoding_walk(tr, k=0, probs=False, progress=False))
    finally:
        ranking.Linear.tile = real  # type: ignore[method-assign]
    return total, spent[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    lm = walklens.load_model("smollm2-135m")
    text = texts(lm)
    out: dict = {"model": lm.name, "threads": 1, "repeats": args.repeats}

    long_runs = []
    for _ in range(args.repeats):
        cap = timed(lambda: walklens.capture(lm, text[1000], points=list(WALK_POINTS)))
        tr = walklens.capture(lm, text[1000], points=list(WALK_POINTS))
        exact, products = product_seconds(tr)
        long_runs.append(
            {"capture_s": cap, "exact_ranks_s": exact, "products_s": products, "floor": 1 + products / cap}
        )
        print(
            f"1000 tokens: capture {cap:.2f} s, exact rank maps {exact:.2f} s, of which float32 products "
            f"{products:.2f} s: floor (capture + products) / capture = {1 + products / cap:.2f}",
            flush=True,
        )
    out["exact_1000"] = {"runs": long_runs, "lowest_floor": min(r["floor"] for r in long_runs)}

    tr = walklens.capture(lm, text[64], points=list(WALK_POINTS))
    names = [tr.points[i] for i in screen_points(list(tr.points))]

    def screen(norm: str) -> float:
        return timed(
            lambda: walklens.encoding_walk(tr, 0, "dot", norm, points=names, probs=False, progress=False, screen=True)
        )

    short_runs = []
    screen("none")
    for _ in range(args.repeats):
        kept_tensors.forget(lm.model)  # the rows made again, as on every request before they were kept
        remade = screen("none")
        kept = screen("none")
        lens = screen("final")
        cap = timed(lambda: walklens.capture(lm, text[64], points=list(WALK_POINTS)))
        short_runs.append({"capture_s": cap, "screen_remade_s": remade, "screen_kept_s": kept, "lens_screen_s": lens})
        print(
            f"64 tokens: capture {cap:.3f} s; screen {remade:.3f} s with the rows made again, {kept:.3f} s kept "
            f"({remade / kept:.2f}x); logit-lens screen {lens:.3f} s",
            flush=True,
        )
    out["screen_64"] = {"runs": short_runs}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
