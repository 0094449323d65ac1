"""Issue 2 benchmark: capture overhead, cached vs first GGUF load, peak memory of an fp16 capture.

Prints ratios measured within this one run (the machines are noisy: compare only numbers from one run).
Run: .venv/bin/python benchmarks/bench_capture.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import walklens
from walklens.core.capture import tokenize

MODEL = os.environ.get("WALKLENS_BENCH_MODEL", "smollm2-135m")
TEXT = (
    "The history of the city begins with a small settlement on the river, where traders met to exchange "
    "goods from the hills and the sea. "
) * 80


def _child(code: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **(env or {})}, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


LOAD = """
import json, time
import torch, transformers, walklens, walklens.core.loading  # imports are not part of the load
t = time.perf_counter()
lm = walklens.load_model({model!r})
print(json.dumps({{"seconds": time.perf_counter() - t}}))
"""

PEAK = """
import json, torch, walklens
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
lm = walklens.load_model({model!r})
ids_text = {text!r}
open("/proc/self/clear_refs", "w").write("5")  # reset the peak-RSS mark (VmHWM) after loading
before = status("VmRSS")
{body}
after = status("VmHWM")
print(json.dumps({{"delta_mb": after - before, "peak_mb": after, "stored_mb": stored / 2**20}}))
"""


def bench_overhead(lm: walklens.LoadedModel, n_tokens: int = 512, repeats: int = 7) -> dict:
    """Alternating runs; the ratio of the fastest runs is the least disturbed by other work on the machine."""
    ids = tokenize(lm, TEXT, truncate=True)[:, :n_tokens]
    text = lm.tokenizer.decode(ids[0])
    ids = tokenize(lm, text)[:, :n_tokens]
    plain, captured = [], []
    with torch.no_grad():
        lm.model(ids, use_cache=False)  # warm-up
        for _ in range(repeats):  # alternate so that machine noise hits both alike
            t = time.perf_counter()
            lm.model(ids, use_cache=False)
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            tr = walklens.capture(lm, text)
            captured.append(time.perf_counter() - t)
    return {
        "tokens": tr.hidden.shape[1],
        "points": tr.hidden.shape[0],
        "plain_s": min(plain),
        "capture_s": min(captured),
        "ratio": min(captured) / min(plain),
        "median_ratio": statistics.median(captured) / statistics.median(plain),
    }


def main() -> None:
    lm = walklens.load_model(MODEL)
    ov = bench_overhead(lm)
    print(
        f"capture overhead, {MODEL}, {ov['tokens']} tokens, {ov['points']} points: "
        f"plain forward {ov['plain_s']:.3f} s, forward + full capture {ov['capture_s']:.3f} s, "
        f"ratio of fastest runs {ov['ratio']:.3f} (target <= 1.10; ratio of medians {ov['median_ratio']:.3f})"
    )

    with tempfile.TemporaryDirectory() as cache:
        env = {"WALKLENS_CACHE": cache}
        first = _child(LOAD.format(model=MODEL), env)["seconds"]
        cached = _child(LOAD.format(model=MODEL), env)["seconds"]
    print(
        f"load: first GGUF load (de-quantize + cache) {first:.1f} s, cached load {cached:.1f} s, "
        f"ratio {cached / first:.3f} (target <= 0.2)"
    )

    body_plain = (
        "from walklens.core.capture import tokenize\nids = tokenize(lm, ids_text, truncate=True)[:, :2048]\n"
        "with torch.no_grad(): lm.model(ids, use_cache=False)\nstored = 0"
    )
    body_cap = (
        "from walklens.core.capture import tokenize\nids = tokenize(lm, ids_text, truncate=True)[:, :2048]\n"
        "text = lm.tokenizer.decode(ids[0])\n"
        "tr = walklens.capture(lm, text, dtype=torch.float16)\n"
        "stored = tr.hidden.numel() * tr.hidden.element_size()"
    )
    text = TEXT * 2
    plain = _child(PEAK.format(model=MODEL, text=text, body=body_plain))
    cap = _child(PEAK.format(model=MODEL, text=text, body=body_cap))
    print(
        f"peak memory (VmHWM), 2048 tokens: plain forward +{plain['delta_mb']:.0f} MB over the loaded model "
        f"(process peak {plain['peak_mb']:.0f} MB); full fp16 capture +{cap['delta_mb']:.0f} MB "
        f"(process peak {cap['peak_mb']:.0f} MB), of which the stored trace is {cap['stored_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
