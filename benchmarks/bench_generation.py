"""Batched generation (issue 53): one batch of B prompts through ``generate_batch`` against the same prompts one at a
time, and against the model's own ``generate`` on the same left-padded batch (plain, no walk, no capture), with
capture of every point during generation, as ratios in one run.  Printed, never asserted.

    .venv/bin/python benchmarks/bench_generation.py [--model smollm2-135m] [--dtype float32] [--batch 16]
        [--new-tokens 32] [--threads 2] [--rounds 3] [--skip-alone] [--json FILE]

Every configuration generates the same greedy tokens (checked): ``max_new_tokens`` each, no end of sequence.  The
configurations run ``--rounds`` times, interleaved (each round in another order), and each keeps its least wall time
and its least CPU time of the process (on cores shared with other work the CPU time moves less than the wall time).
Targets: batched throughput >= 4 x one at a time at batch 16; capture during generation <= 1.10 x plain generate.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village",
    "In 1905, Albert Einstein published a paper on",
    "The best way to learn a new language is",
    "My favourite recipe for a rainy day",
    "The stock market fell sharply after",
    "Scientists have discovered a new species of",
    "The old lighthouse keeper",
    "To install the package, run",
    "Photosynthesis is the process by which",
    "She opened the letter and",
    "The football match ended in",
    "A good night's sleep",
    "The history of the Roman Empire",
    "When the train finally arrived",
    "Water boils at",
]


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("Model name")), "Model name: " + platform.processor())
    return line.split(":", 1)[1].strip()


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process, the result)."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t, time.process_time() - c, out


def plain_generate(lm: Any, seqs: list[list[int]], n: int) -> list[list[int]]:
    """The model's own generate on the left-padded batch, greedy, n tokens each: the baseline."""
    from transformers import GenerationConfig

    P = max(len(q) for q in seqs)
    ids = torch.zeros((len(seqs), P), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, q in enumerate(seqs):
        ids[i, P - len(q) :], mask[i, P - len(q) :] = torch.tensor(q), 1
    cfg = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=[], pad_token_id=0, use_cache=True)
    with torch.no_grad():
        out = lm.hf.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    return [row[P:] for row in out.tolist()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-alone", action="store_true", help="leave out one at a time (the overhead figures only)")
    a = ap.parse_args()
    import walklens
    from walklens.cli.common import write_json
    from walklens.core.generation import generate_batch

    torch.set_num_threads(a.threads)
    lm = walklens.load_model(a.model, dtype=a.dtype)
    prompts = (PROMPTS * (a.batch // len(PROMPTS) + 1))[: a.batch]
    seqs = [lm.tokenizer(p)["input_ids"] for p in prompts]
    n = a.new_tokens
    generate_batch(lm, prompts[:2], max_new_tokens=2, eos=[])  # warm-up
    runs: dict[str, Callable[[], list[list[int]]]] = {
        "hf_generate": lambda: plain_generate(lm, seqs, n),
        "batched": lambda: [g.token_ids for g in generate_batch(lm, prompts, max_new_tokens=n, eos=[])],
        "batched_capture": lambda: [
            g.token_ids for g in generate_batch(lm, prompts, max_new_tokens=n, eos=[], points=["*"])
        ],
        "one_at_a_time": lambda: [generate_batch(lm, [p], max_new_tokens=n, eos=[])[0].token_ids for p in prompts],
    }
    if a.skip_alone:
        del runs["one_at_a_time"]
    wall = dict.fromkeys(runs, float("inf"))
    cpu = dict.fromkeys(runs, float("inf"))
    tokens: dict[str, list[list[int]]] = {}
    names = list(runs)
    for r in range(a.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            w, c, tokens[name] = timed(runs[name])
            wall[name], cpu[name] = min(wall[name], w), min(cpu[name], c)
    res = {
        "model": lm.name,
        "dtype": a.dtype,
        "cpu": cpu_name(),
        "threads": a.threads,
        "batch": a.batch,
        "new_tokens": n,
        "rounds": a.rounds,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "batched_vs_one_at_a_time": None if a.skip_alone else {"wall": wall["one_at_a_time"] / wall["batched"],
                                                             "cpu": cpu["one_at_a_time"] / cpu["batched"]},
        "capture_over_hf_generate": {"wall": wall["batched_capture"] / wall["hf_generate"],
                                     "cpu": cpu["batched_capture"] / cpu["hf_generate"]},
        "batched_over_hf_generate": {"wall": wall["batched"] / wall["hf_generate"],
                                     "cpu": cpu["batched"] / cpu["hf_generate"]},
        "same_tokens": all(t == tokens["batched"] for t in tokens.values()),
    }  # fmt: skip
    for k, v in res.items():
        print(f"{k}: {v}")
    if a.json:
        write_json(a.json, res)


if __name__ == "__main__":
    main()
