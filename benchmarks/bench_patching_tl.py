"""Activation patching beside TransformerLens (issue 55): the full resid_pre layer x position grid of the same GPT-2
shaped model (random weights, GPT-2 small's shape: 12 layers, d 768, 12 heads; the tiny tokenizer's vocabulary), the
same token ids and metric, in walklens and in TransformerLens's ``patching.get_act_patch_resid_pre``.

TransformerLens runs in its own virtual environment with a CPU torch (it is no dependency of walklens):

    python3 -m venv /tmp/tlvenv
    /tmp/tlvenv/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch
    /tmp/tlvenv/bin/pip install transformer_lens
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/bench_patching_tl.py save /tmp/tl_bench
    OMP_NUM_THREADS=1 /tmp/tlvenv/bin/python benchmarks/bench_patching_tl.py tl /tmp/tl_bench
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/bench_patching_tl.py walklens /tmp/tl_bench \\
        --json docs/results/bench_patching_tl.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

CLEAN = [7, 40, 11, 33, 21, 50, 9, 60, 12, 45, 18, 30]  # token ids of the tiny tokenizer
CORRUPT = [7, 40, 11, 34, 21, 50, 9, 60, 12, 45, 18, 30]  # one token differs (position 3)
A, B = 44, 52  # the metric: logit[A] - logit[B] at the last position


def save(folder: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from walklens.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=768, n_layer=12, n_head=12)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # weights of std 0.1 instead of 0.02: logits far from uniform, a metric gap worth measuring
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(5.0)
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")


def tl(folder: Path) -> None:
    """TransformerLens 4's bridge over the same Hugging Face model (eager attention, raw weights: HF's numerics) and its
    ``patching.get_act_patch_resid_pre``."""
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer, GPT2LMHeadModel

    torch.set_num_threads(1)
    hf = GPT2LMHeadModel.from_pretrained(folder / "model", attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(folder / "model")
    model = TransformerBridge.boot_transformers(str(folder / "model"), hf_model=hf, tokenizer=tok, device="cpu")
    model.eval()
    clean, corrupt = torch.tensor([CLEAN]), torch.tensor([CORRUPT])
    _, cache = model.run_with_cache(clean)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, A] - logits[0, -1, B]

    with torch.no_grad():
        t = time.perf_counter()
        grid = patching.get_act_patch_resid_pre(model, corrupt, cache, metric)
        seconds = time.perf_counter() - t
    out = {"grid": grid.tolist(), "seconds": seconds, "version": _version("transformer_lens")}
    (folder / "tl.json").write_text(json.dumps(out))
    print(json.dumps({k: v for k, v in out.items() if k != "grid"}))


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def walk(folder: Path, json_out: str | None) -> None:
    import numpy as np

    import walklens

    torch.set_num_threads(1)
    lm = walklens.load_model(str(folder / "model"))
    metric = lambda logits: logits[A] - logits[B]  # noqa: E731
    runs = {}
    for name, kw in (("batched_incremental", {}), ("one_pass_per_cell", {"batch": 1, "incremental": False})):
        t = time.perf_counter()
        r = walklens.patch(lm, CLEAN, CORRUPT, points="resid_pre", metric=metric, **kw)
        runs[name] = (r, time.perf_counter() - t)
    ref = json.loads((folder / "tl.json").read_text())
    tl_grid = np.array(ref["grid"])
    r, t_wl = runs["batched_incremental"]
    out = {
        "model": "GPT-2 small's shape, random weights of std 0.1 (12 layers, d 768, 12 heads), float32",
        "tokens": len(CLEAN),
        "cells": int(r.raw.size),
        "transformer_lens": ref["version"],
        "walklens_batched_incremental_s": t_wl,
        "walklens_one_pass_per_cell_s": runs["one_pass_per_cell"][1],
        "transformer_lens_s": ref["seconds"],
        "speedup_over_transformer_lens": ref["seconds"] / t_wl,
        "max_abs_diff_vs_transformer_lens": float(np.abs(r.raw - tl_grid).max()),
        "max_abs_diff_one_pass_vs_transformer_lens": float(np.abs(runs["one_pass_per_cell"][0].raw - tl_grid).max()),
        "metric_gap": abs(r.clean_metric - r.corrupted_metric),
        "threads": 1,
    }
    print(json.dumps(out, indent=1))
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    step, folder = sys.argv[1], Path(sys.argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    if step == "save":
        save(folder)
    elif step == "tl":
        tl(folder)
    else:
        walk(folder, sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--json" else None)
