"""The steering card batched against the same card one prompt at a time (issue 53): the same cells, the same
prompts, in one run, as a ratio.  Printed, never asserted.

    .venv/bin/python benchmarks/bench_card.py [--model smollm2-135m] [--set sentiment] [--layer 15] [--dose 0.3]
        [--threads 1] [--json FILE]

Both cards run every method (eigen, add, meandiff at one layer and one dose, ablate at that layer) and the unsteered
model over every prompt of the set (24 choosing and 46 held-out per kind) and the neutral texts, 16 new tokens,
in memory (no store).  "Batched" is the shipped card (continuations in batches of ``GEN_BATCH``, scoring in batches
of ``SCORE_BATCH``); "one at a time" sets both to 1, the card as it was before generation was batched.  The order
is batched, one at a time, batched again (the batched time is the lesser).  The cards must agree: every interval
within 1e-4 (the first logits of a row come from kernels of another batch shape) and every example continuation the
same text.  Target: the batched card in at most 1/5 of the one-at-a-time card's time.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import torch

from bench_generation import cpu_name


def card_time(lm: Any, args: argparse.Namespace, gen: int, score: int) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds, the card) with continuations in batches of ``gen`` and scoring in ``score``."""
    from walklens.lab.steeringcard import run, steering_card

    saved = run.GEN_BATCH, run.SCORE_BATCH
    run.GEN_BATCH, run.SCORE_BATCH = gen, score
    try:
        t, c = time.perf_counter(), time.process_time()
        card = steering_card(lm, args.set, layers=[args.layer], doses=[args.dose], max_new_tokens=args.new_tokens)
        return time.perf_counter() - t, time.process_time() - c, card
    finally:
        run.GEN_BATCH, run.SCORE_BATCH = saved


def largest_difference(a: Any, b: Any) -> float:
    """The largest difference between the two cards' interval bounds (cells in the same order)."""
    worst = 0.0
    for x, y in zip(a.cells, b.cells, strict=True):
        for k in ("effect", "wrong_way", "log_ppl", "kl", "repetition"):
            for part in ("value", "lo", "hi"):
                u, v = getattr(getattr(x, k), part), getattr(getattr(y, k), part)
                if not (math.isnan(u) and math.isnan(v)):
                    worst = max(worst, abs(u - v))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--set", default="sentiment")
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--dose", type=float, default=0.3)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import walklens

    lm = walklens.load_model(args.model)
    w1, c1, batched = card_time(lm, args, 32, 8)
    w0, c0, alone = card_time(lm, args, 1, 1)
    w2, c2, _ = card_time(lm, args, 32, 8)
    wall, cpu = {"batched": min(w1, w2), "one_at_a_time": w0}, {"batched": min(c1, c2), "one_at_a_time": c0}
    same_text = [(e.prompt, e.text) for e in batched.examples] == [(e.prompt, e.text) for e in alone.examples]
    out = {
        "model": args.model, "cpu": cpu_name(), "threads": args.threads, "set": args.set, "layer": args.layer,
        "dose": args.dose, "new_tokens": args.new_tokens, "cells": len(batched.cells),
        "units": batched.units_generated, "wall_seconds": wall, "cpu_seconds": cpu,
        "batched_over_one_at_a_time": {"wall": wall["batched"] / wall["one_at_a_time"],
                                       "cpu": cpu["batched"] / cpu["one_at_a_time"]},
        "largest_difference": largest_difference(batched, alone), "same_examples": same_text,
    }  # fmt: skip
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
