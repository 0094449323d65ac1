"""Activation patching's cost and exactness on a real model (issue 55): the full resid_pre layer x position grid as
one plain forward pass per cell, as batched-and-incremental passes, and attribution patching with its parity card.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/bench_patching.py \\
        --json docs/results/bench_patching.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings

import numpy as np
import torch

import walklens
from walklens.analyses.patching import attribute, patch
from walklens.core.patching import record, run_logits

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
METRIC = 'logitdiff:" Paris"," Rome"'


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def median_interleaved(fns, reps: int = 7) -> list[float]:
    """Each function's median time over ``reps`` rounds, the functions taking turns (a noisy machine's drift falls on
    all of them alike)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for k, fn in enumerate(fns):
            times[k].append(timed(fn)[1])
    return [float(np.median(t)) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    lm = walklens.load_model(args.model)
    ids = lm.tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    cids = lm.tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    kw = dict(points="resid_pre", metric=METRIC)
    if ids.shape[1] != cids.shape[1]:
        raise SystemExit(f"token counts differ: {cids.shape[1]} and {ids.shape[1]}")

    def forward() -> None:
        with torch.no_grad():
            run_logits(lm, ids, -1)

    single, t_single = timed(lambda: patch(lm, CLEAN, CORRUPT, batch=1, incremental=False, **kw))
    incr1, t_incr1 = timed(lambda: patch(lm, CLEAN, CORRUPT, batch=1, incremental=True, **kw))
    batched, t_batched = timed(lambda: patch(lm, CLEAN, CORRUPT, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forward()
        t_fwd, t_attr = median_interleaved([forward, lambda: attribute(lm, CLEAN, CORRUPT, parity=False, **kw)])
        card = attribute(lm, CLEAN, CORRUPT, **kw).parity
    _, t_rec = timed(lambda: record(lm, ids, [], -1))
    scale = abs(single.clean_metric - single.corrupted_metric)
    out = {
        "model": lm.name,
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "tokens": int(ids.shape[1]),
        "layers": lm.n_layers,
        "cells": int(single.values.size),
        "forward_s": t_fwd,
        "timing": "forward and attribution: medians of 7 interleaved rounds",
        "single_patch_s": t_single,
        "incremental_batch1_s": t_incr1,
        "batched_incremental_s": t_batched,
        "speedup_batched_over_single": t_single / t_batched,
        "attribution_s": t_attr,
        "attribution_forward_equivalents": t_attr / t_fwd,
        "incremental_batch1_equal_bits": bool(np.array_equal(incr1.raw, single.raw)),
        "batched_max_abs_diff_normalised": float(np.abs(batched.raw - single.raw).max() / scale),
        "clean_metric": single.clean_metric,
        "corrupted_metric": single.corrupted_metric,
        "parity": None if card is None else {"spearman": card.spearman, "topk_overlap": card.topk_overlap, "k": card.k},
        "record_pass_s": t_rec,
        "grid_L0_best_position": int(np.argmax(single.values[0])),
        "grid": single.values.round(4).tolist(),
        "tokens_text": single.tokens,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
