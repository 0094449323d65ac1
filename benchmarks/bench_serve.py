"""Benchmark of `walklens serve` (issue 16) on SmolLM2-135M, in one run:

- **request to rendered heatmap**: in headless Chromium, from the page starting the encoding-walk request to
  the heatmap drawn on its canvas, for a 64-token and a 1,000-token text, as a ratio to a plain
  ``walklens.core.capture`` of the same text in the same process: the first paint (the bfloat16 screen's provisional
  ranks; target <= 1.5) and the exact heatmap that replaces it, piece by piece, up to its last piece and the whole
  walk's escape points (target <= 3), side by side.  The server's caches are
  emptied before every request, so each one captures and walks from scratch.  The time the server spends in
  the analysis itself (``capture`` of the walk's points + the ``encoding_walk`` calls of the heatmap: the rank
  maps and the reading of ``final``, timed inside the request) is given too, and the rest: what the request,
  the JSON and the drawing add;
- **payload sizes** of every view (bytes of the JSON response) for the 64-token text, and of the walk for
  1,000 tokens;
- **memory**: the resident set (VmRSS) of a real ``walklens serve`` process with two models loaded
  (smollm2-135m and smollm2-135m@bfloat16), idle after start.

Fastest of ``--repeats`` runs (a shared machine: the minimum is the least disturbed).
Usage: nice -n 5 .venv/bin/python benchmarks/bench_serve.py [--repeats 2] [--json PATH] [--paint-only]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

import walklens
from walklens.server.app import Running
from walklens.server.state import Cache, Explorer

MODEL = "smollm2-135m"
CHROMIUM = "/usr/bin/chromium"
LENGTHS = (64, 1000)


def texts(lm: walklens.LoadedModel) -> dict[int, str]:
    """Texts of exactly 64 and 1,000 tokens cut from the bundled grading example."""
    base = resources.files("walklens").joinpath("examples/grading_prompt.txt").read_text(encoding="utf-8")
    ids = lm.tokenizer(base * (1 + 2000 // len(lm.tokenizer(base)["input_ids"])))["input_ids"]
    count = lambda c: len(lm.tokenizer(lm.tokenizer.decode(ids[:c]))["input_ids"])  # noqa: E731
    out = {}
    for n in LENGTHS:
        cut = min(range(n - 8, n + 9), key=lambda c: (abs(count(c) - n), c))
        out[n] = lm.tokenizer.decode(ids[:cut])
    return out


def empty(ex: Explorer) -> None:
    ex.traces, ex.results, ex.attention = Cache(8), Cache(16), Cache(1)


def render_time(page, ex: Explorer, text: str) -> tuple[float, float]:
    """Seconds from the page's request to the first heatmap of ``text`` on its canvas (provisional), and to the
    exact one."""
    empty(ex)
    t0 = time.perf_counter()
    page.evaluate(
        "t => { const W = walklens; W.clear(W.$('walk-map')); W.$('walk-echo').textContent = ''; "
        "W.$('text').value = t; W.run(); }",
        text,
    )  # the previous heatmap is gone first
    page.wait_for_function(
        "t => document.getElementById('walk-echo').textContent.endsWith(t) && "
        "document.querySelector('#walk-map canvas') !== null",
        arg=text,
        polling="raf",
        timeout=3_600_000,
    )
    first = time.perf_counter() - t0
    page.wait_for_function(
        "() => document.getElementById('walk-map').getAttribute('data-provisional') === '0'",
        polling="raf",
        timeout=3_600_000,
    )
    return first, time.perf_counter() - t0


def plain_capture(lm: walklens.LoadedModel, text: str) -> float:
    t0 = time.perf_counter()
    walklens.capture(lm, text)
    return time.perf_counter() - t0


def timed_walks() -> dict[str, list[float]]:
    """Seconds the server spends in the walk's analysis (capture of the walk's points + encoding_walk), measured
    inside the requests by wrapping :func:`walklens.server.api_walks.get_screen` (the first paint), ``get_piece``
    (each piece of the exact pass, one request each), ``get_walk`` (the pieces joined, with the escape points) and
    ``get_point`` (the reading of ``final``): one entry per call, to be summed over the requests of one paint."""
    from walklens.server import api_walks

    spent: dict[str, list[float]] = {"screen": [], "exact": []}

    def timed(inner, into: list[float]):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            w = inner(*args, **kwargs)
            into.append(time.perf_counter() - t0)
            return w

        return call

    api_walks.get_screen = timed(api_walks.get_screen, spent["screen"])
    api_walks.get_walk = timed(api_walks.get_walk, spent["exact"])
    api_walks.get_point = timed(api_walks.get_point, spent["exact"])
    api_walks.get_piece = timed(api_walks.get_piece, spent["exact"])  # the exact pass, piece by piece
    return spent


def size_of(srv: Running, path: str, body: dict) -> int:
    """Bytes of the JSON response to one API call."""
    r = httpx.post(srv.url.split("/?")[0] + path, json=body, headers={"X-Walklens-Token": srv.token}, timeout=600)
    r.raise_for_status()
    return len(r.content)


#: the document fields the page asks for (server/static/walks.js: WALK_FIELDS, DECODE_FIELDS)
WALK_FIELDS = ["tokens", "points", "rank_of_input", "rank_of_next", "escape_point", "escape_stable"]
DECODE_FIELDS = [
    "prompt_tokens",
    "tokens",
    "ranks",
    "probs",
    "top_tokens",
    "top_probs",
    "d_norm",
    "step_length",
    "step_angle",
    "target",
    "in_neighbourhood",
    "left_path_at",
]


def payload_sizes(srv: Running, model: str, text: str) -> dict[str, int]:
    calls = {
        "walk": ("/api/walk", {"text": text, "fields": WALK_FIELDS}),
        "walk cell (k=10)": ("/api/walk/cell", {"text": text, "point": 10, "position": 5, "k": 10}),
        "decode (12 steps, k=10)": ("/api/decode", {"text": text, "max_new_tokens": 12, "fields": DECODE_FIELDS}),
        "similarity map": ("/api/simmap", {"text": text, "point": "L10.resid_post"}),
        "attention (one head)": ("/api/attention", {"text": text, "layer": 10, "head": 3}),
        "position kernels": ("/api/kernels", {}),
        "power": ("/api/power", {"text": text}),
        "steer (12 tokens)": ("/api/steer", {"text": text, "target": " Paris", "layers": [12], "alpha": 1000}),
    }
    return {name: size_of(srv, path, {"model": model, **body}) for name, (path, body) in calls.items()}


def server_rss() -> tuple[float, float]:
    """VmRSS (MB) of `walklens serve` with two models, once it printed its URL; and of one model."""
    out = []
    for models in ([MODEL], [MODEL, f"{MODEL}@bfloat16"]):
        args = [a for m in models for a in ("--model", m)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "walklens", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            line = proc.stdout.readline()
            assert line.startswith("http://127.0.0.1:"), line
            time.sleep(1.0)
            status = Path(f"/proc/{proc.pid}/status").read_text()
            out.append(int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return out[0], out[1]


def paint_run(lm: walklens.LoadedModel, page, ex: Explorer, text: str, spent: dict[str, list[float]]) -> dict:
    """One plain capture, then one request of the page: first paint and exact heatmap, and the server's time in
    the screen's and the exact analysis (each including its capture when it made it)."""
    cap = plain_capture(lm, text)
    before = {k: len(v) for k, v in spent.items()}
    first, exact = render_time(page, ex, text)
    ana = {k: sum(v[before[k] :]) for k, v in spent.items()}
    return {
        "capture_s": cap,
        "first_paint_s": first,
        "exact_s": exact,
        "screen_analysis_s": ana["screen"],
        "exact_analysis_s": ana["exact"],
        "first_ratio": first / cap,
        "exact_ratio": exact / cap,
    }


def report(n: int, runs: list[dict], size: int) -> dict[str, Any]:
    """Print one length's line: the fastest of each measure, and the ratios of each run (measured side by side)."""
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    pairs = ", ".join("({:.2f}, {:.2f})".format(r["first_ratio"], r["exact_ratio"]) for r in runs)
    ratio = {k: min(r[k] for r in runs) for k in ("first_ratio", "exact_ratio")}  # the least disturbed run's
    print(
        f"{n} tokens: plain capture {best['capture_s']:.2f} s; first (provisional) heatmap {best['first_paint_s']:.2f}"
        f" s, ratio {ratio['first_ratio']:.2f} (target <= 1.5); exact heatmap {best['exact_s']:.2f} s, ratio "
        f"{ratio['exact_ratio']:.2f} (target <= 3) (ratios: the best run's, each measured side by side); per run "
        f"(first, exact): {pairs}; server "
        f"analysis: screen {best['screen_analysis_s']:.2f} s, exact {best['exact_analysis_s']:.2f} s; walk payload "
        f"{size / 1024:.0f} KiB",
        flush=True,
    )
    return {"tokens": n, "runs": runs, "fastest": best, "best_ratios": ratio, "walk_payload_bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the measurements here")
    ap.add_argument("--paint-only", action="store_true", help="skip the payload sizes and the memory")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    lm = walklens.load_model(MODEL)
    ex = Explorer({lm.name: lm})
    by_len = texts(lm)
    spent = timed_walks()
    threads = __import__("torch").get_num_threads()
    results: list[dict[str, Any]] = []
    print(f"{MODEL}, torch threads {threads}, fastest of {args.repeats} runs")
    with Running(ex) as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(srv.url)
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_selector("#walk-map canvas", timeout=3_600_000)  # the default text: warm-up
        for text in by_len.values():
            runs = [paint_run(lm, page, ex, text, spent) for _ in range(args.repeats)]  # alternating, so that
            # machine noise hits the capture and the request alike
            size = size_of(srv, "/api/walk", {"model": lm.name, "text": text, "fields": WALK_FIELDS})  # cached
            results.append(report(len(lm.tokenizer(text)["input_ids"]), runs, size))
        browser.close()
        if args.json is not None:
            args.json.write_text(
                json.dumps({"model": MODEL, "threads": threads, "repeats": args.repeats, "lengths": results}, indent=1)
                + "\n"
            )
        if args.paint_only:
            return
        sizes = payload_sizes(srv, lm.name, by_len[64])
    print("payloads, 64 tokens: " + "; ".join(f"{k} {v / 1024:.1f} KiB" for k, v in sizes.items()))
    one, two = server_rss()
    print(
        f"walklens serve resident memory (VmRSS) after start: one model ({MODEL}) {one:.0f} MB; two models "
        f"({MODEL} + {MODEL}@bfloat16) {two:.0f} MB"
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
