"""Where the bfloat16 model's matrix products lose against a 2048 x 2048 product (issue 39; docs/dtype.md).

Each hypothesis is measured in one run, on one thread, the model's own baseline scoring
(``hellaswag.baseline.baseline_items``, packed, SDPA) as the reference:

* **in model vs alone**: every ``aten::linear`` of a profiled baseline run (shapes and order recorded), then the
  same calls replayed alone with the model's own weights, and the same shapes each repeated (one row count,
  hot caches: how a stand-alone figure of ~1,000 GFLOP/s is usually taken).
* **weight layout**: ``F.linear(x, W)`` (W stored ``[N, K]``, as ``nn.Linear`` keeps it) against ``x @ W.T`` with
  ``W.T`` contiguous ``[K, N]`` and against oneDNN's prepacked weight (``mkldnn._reorder_linear_weight``), on
  the MLP's shape; and the whole baseline with every ``nn.Linear`` switched to the ``[K, N]`` copy.
* **primitive caching across row counts**: a row count seen before against one never seen (oneDNN creates a
  primitive per shape), and how many of a run's calls meet a row count for the first time.
* **the rest of the time**: the profiler's shares of products, attention and elementwise work.

Usage (``--md`` writes the table docs/dtype.md includes verbatim; ``--from`` renders it from a stored run)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_inmodel.py --n 100 --json docs/results/bench_inmodel.json \
        --md docs/results/bench_inmodel.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

import walklens
from walklens.lab.hellaswag.baseline import baseline_items
from walklens.lab.hellaswag.data import load_hellaswag

BF16 = torch.bfloat16
Call = tuple[tuple[int, ...], torch.Tensor]  # (input shape, the module's weight)


def gflops(flop: float, seconds: float) -> float:
    return flop / seconds / 1e9


def rows(shape: tuple[int, ...]) -> int:
    m = 1
    for d in shape[:-1]:
        m *= d
    return m


def recorded_calls(lm: walklens.LoadedModel, items: list[Any]) -> tuple[list[Call], float, dict[str, float], float]:
    """The baseline's ``nn.Linear`` calls (input shape, weight) in order, its CPU time, the profiler's shares
    and the seconds of its matrix products."""
    calls: list[Call] = []

    def hook(mod: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        calls.append((tuple(args[0].shape), mod.weight))

    handles = [m.register_forward_pre_hook(hook) for m in lm.hf.modules() if isinstance(m, torch.nn.Linear)]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.process_time()
            baseline_items(lm, items)
            total = time.process_time() - t0
    finally:
        for h in handles:
            h.remove()
    self_time: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        self_time[e.key] += e.self_cpu_time_total / 1e6
    whole = sum(self_time.values())
    groups = {
        "matrix products": ("aten::mm", "aten::addmm", "aten::bmm"),
        "attention (SDPA)": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
        "elementwise (mul, silu, add, pow, copy, to, rsqrt, mean)": (
            "aten::mul", "aten::silu", "aten::add", "aten::pow", "aten::copy_", "aten::rsqrt", "aten::mean",
            "aten::_to_copy", "aten::neg", "aten::cat",
        ),
    }  # fmt: skip
    shares = {g: sum(self_time.get(k, 0.0) for k in ks) / whole for g, ks in groups.items()}
    return calls, total, shares, sum(self_time.get(k, 0.0) for k in groups["matrix products"])


def replay(calls: list[Call], xs: dict[tuple[int, ...], torch.Tensor]) -> tuple[float, float]:
    """CPU seconds and FLOP of the calls replayed alone, in their order, with their own weights."""
    flop = sum(2.0 * rows(s) * w.shape[0] * w.shape[1] for s, w in calls)
    t0 = time.process_time()
    with torch.no_grad():
        for s, w in calls:
            torch.nn.functional.linear(xs[s], w)
    return time.process_time() - t0, flop


def repeated(calls: list[Call], xs: dict[tuple[int, ...], torch.Tensor], reps: int = 5) -> tuple[float, float]:
    """The most frequent input shape of each weight shape, each repeated ``reps`` times (hot caches)."""
    by_w: dict[tuple[int, int], dict[tuple[int, ...], int]] = defaultdict(lambda: defaultdict(int))
    ws: dict[tuple[int, int], torch.Tensor] = {}
    for s, w in calls:
        by_w[tuple(w.shape)][s] += 1  # type: ignore[index]
        ws[tuple(w.shape)] = w  # type: ignore[index]
    t = flop = 0.0
    with torch.no_grad():
        for k, counts in by_w.items():
            s = max(counts, key=lambda c: counts[c])
            n = sum(counts.values())
            torch.nn.functional.linear(xs[s], ws[k])
            t0 = time.process_time()
            for _ in range(reps):
                torch.nn.functional.linear(xs[s], ws[k])
            t += (time.process_time() - t0) / reps * n
            flop += 2.0 * rows(s) * k[0] * k[1] * n
    return t, flop


def timed(fn: Callable[[], object], rounds: int, calls: int) -> float:
    """Median seconds per call over ``rounds`` rounds of ``calls`` calls."""
    fn()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return statistics.median(out)


def layouts(m: int, k: int, n: int, rounds: int) -> dict[str, float]:
    """GFLOP/s of one ``[m, k] x [k, n]`` product by weight layout, and of seen against fresh row counts."""
    torch.manual_seed(0)
    x, w = torch.randn(m, k, dtype=BF16), torch.randn(n, k, dtype=BF16)
    wt = w.t().contiguous()
    fl = 2.0 * m * k * n
    out = {
        "F.linear, W [N, K]": gflops(fl, timed(lambda: torch.nn.functional.linear(x, w), rounds, 20)),
        "x @ W.T, [K, N] contiguous": gflops(fl, timed(lambda: x @ wt, rounds, 20)),
    }
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():  # a CPU without oneDNN's bfloat16 path has no prepacking
        packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
        out["oneDNN prepacked weight"] = gflops(
            fl, timed(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), rounds, 20)
        )
    seen = [torch.randn(r, k, dtype=BF16) for r in range(m - 64, m)]
    for s in seen:
        torch.nn.functional.linear(s, w)
    it = iter(range(10**9))
    t_seen = timed(lambda: torch.nn.functional.linear(seen[next(it) % len(seen)], w), rounds, 20)
    fresh = iter(range(m + 1, m + 400))  # row counts never used before in this process
    xf = torch.randn(m + 400, k, dtype=BF16)
    t_fresh = timed(lambda: torch.nn.functional.linear(xf[: next(fresh)], w), rounds, 20)
    out["row count seen before"] = gflops(2.0 * (m - 32) * k * n, t_seen)
    out["row count never seen"] = gflops(2.0 * (m + 10 * (rounds + 1)) * k * n, t_fresh)
    return out


@contextmanager
def kn_layout(model: torch.nn.Module) -> Iterator[None]:
    """Every ``nn.Linear`` computes ``x @ W.T`` from a contiguous ``[K, N]`` copy (a benchmark, not a library
    option: it changes the kernel and so the rounding)."""
    saved = []
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            wt, b = mod.weight.detach().t().contiguous(), mod.bias

            def fwd(x: torch.Tensor, wt: torch.Tensor = wt, b: torch.Tensor | None = b) -> torch.Tensor:
                y = x @ wt
                return y if b is None else y + b

            saved.append((mod, mod.forward))
            mod.forward = fwd  # type: ignore[method-assign]
    try:
        yield
    finally:
        for mod, f in saved:
            mod.forward = f  # type: ignore[method-assign]


def whole_model(lm: walklens.LoadedModel, items: list[Any], rounds: int) -> dict[str, float]:
    """Items/s of the baseline as it is and with the ``[K, N]`` layout, alternating; their largest
    log-likelihood difference and the picks kept."""
    t_ref, t_kn = [], []
    for _ in range(rounds):
        t0 = time.process_time()
        ref = baseline_items(lm, items)
        t_ref.append(time.process_time() - t0)
        with kn_layout(lm.hf):
            t0 = time.process_time()
            kn = baseline_items(lm, items)
            t_kn.append(time.process_time() - t0)
    d = max(abs(a - b) for x, y in zip(ref, kn) for a, b in zip(x.scores, y.scores))
    same = sum(x.pred == y.pred and x.pred_norm == y.pred_norm for x, y in zip(ref, kn))
    return {
        "eager items/s": len(items) / min(t_ref),
        "[K, N] layout items/s": len(items) / min(t_kn),
        "ratio": min(t_ref) / min(t_kn),
        "max |d loglik|": d,
        "same picks": same / len(items),
    }


def table(out: dict[str, Any]) -> str:
    """The markdown table of one run (docs/dtype.md)."""
    lay, whole = out["MLP product [1000 x 576] x [576 x 1536] GFLOP/s"], out["whole baseline, [K, N] layout"]
    sh = out["shares of the run"]
    rows = [
        ("2048 x 2048 product alone", f"{out['matmul 2048^2 GFLOP/s']:.0f} GFLOP/s"),
        ("the baseline's linear products inside the model (profiler)",
         f"{out['in-model products GFLOP/s (profiler' + chr(39) + 's time of aten::mm)']:.0f} GFLOP/s"),
        ("the same calls replayed alone, in order, with the model's weights",
         f"{out['same calls replayed alone GFLOP/s']:.0f} GFLOP/s"),
        ("the same shapes each repeated (one row count, hot caches)",
         f"{out['same shapes repeated, hot GFLOP/s']:.0f} GFLOP/s"),
        ("linear FLOP/s of the whole run / 2048 x 2048 product",
         f"{out['linear FLOP/s of the whole run / 2048^2 matmul']:.2f}"),
        ("shares of the run: products / SDPA / elementwise",
         " / ".join(f"{v:.2f}" for v in sh.values())),
        ("calls meeting a row count for the first time", f"{out['calls with a row count met for the first time']:.3f}"),
        *((f"MLP product: {k}", f"{v:.0f} GFLOP/s") for k, v in lay.items()),
        ("whole baseline, every linear from a [K, N] copy: speed ratio", f"{whole['ratio']:.2f}"),
        ("... its largest log-likelihood change / identical picks",
         f"{whole['max |d loglik|']:.2f} nats / {whole['same picks']:.2f}"),
    ]  # fmt: skip
    head = f"| {out['model']}, bfloat16, {out['n']} items, {out['threads']} thread | measured |\n| --- | --- |\n"
    return head + "\n".join(f"| {a} | {b} |" for a, b in rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=100, help="items (the first n of the bundled validation set)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--md", default="", help="write the markdown table here")
    ap.add_argument("--from", dest="source", default="", help="only render --md from this stored --json")
    args = ap.parse_args()
    if args.source:
        with open(args.source, encoding="utf-8") as f, open(args.md, "w", encoding="utf-8") as g:
            g.write(table(json.load(f)))
        return
    random.seed(0)
    os.environ["WALKLENS_PREPACK"] = "0"  # the model's own F.linear products (gate_prepack.py measures the switch)
    lm = walklens.load_model(args.model, dtype="bfloat16")
    items = load_hellaswag(limit=args.n)
    baseline_items(lm, items[:8])  # warm-up
    calls, total, shares, mm_seconds = recorded_calls(lm, items)
    xs = {s: torch.randn(s, dtype=BF16) for s in {s for s, _ in calls}}
    in_model = sum(2.0 * rows(s) * w.shape[0] * w.shape[1] for s, w in calls)
    t_rep, _ = replay(calls, xs)
    t_hot, _ = repeated(calls, xs)
    a = torch.randn(2048, 2048, dtype=BF16)
    big = gflops(2.0 * 2048**3, timed(lambda: a @ a, args.rounds, 5))
    first: dict[tuple[int, int, int], int] = {}
    for s, w in calls:
        first.setdefault((rows(s), w.shape[0], w.shape[1]), 1)
    out: dict[str, Any] = {
        "model": args.model,
        "n": args.n,
        "threads": torch.get_num_threads(),
        "baseline items/s (profiled run)": args.n / total,
        "matmul 2048^2 GFLOP/s": big,
        "linear calls": len(calls),
        "calls with a row count met for the first time": len(first) / len(calls),
        "in-model products GFLOP/s (profiler's time of aten::mm)": gflops(in_model, mm_seconds),
        "same calls replayed alone GFLOP/s": gflops(in_model, t_rep),
        "same shapes repeated, hot GFLOP/s": gflops(in_model, t_hot),
        "linear FLOP/s of the whole run / 2048^2 matmul": gflops(in_model, total) / big,
        "shares of the run": shares,
        "MLP product [1000 x 576] x [576 x 1536] GFLOP/s": layouts(1000, 576, 1536, args.rounds),
        "whole baseline, [K, N] layout": whole_model(lm, items, args.rounds),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(table(out))


if __name__ == "__main__":
    main()
