"""bfloat16 against float32 on the HellaSwag baseline (issue 14): ratios measured in one run, printed, never asserted.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_bf16.py [--n 100] [--model smollm2-135m] [--repeats 2]
                                                                 [--eager] [--json FILE]

Both sides run the same code on the same items (the bundled validation set, first N) with the same threads:
the walklens baseline runner (:func:`walklens.lab.experiments.runner.run_test`, packed scoring with SDPA attention),
the model loaded once per dtype (``load_model(..., dtype=)``), the fastest of ``--repeats`` alternating runs
after a warm-up.  Printed:

- items/s in bfloat16 over items/s in float32 (target >= 3);
- achieved useful FLOP/s in bfloat16 over a bfloat16 2048 x 2048 matmul timed in the same run (aim >= 0.5).
  Useful FLOPs count what scoring needs, from the packed layout: every real token through every layer's
  weight matrices (2 x params), each allowed (query, key) pair of attention (4 x heads x head_dim per
  layer: q.k and the weighted sum of values), and the positions that predict an ending token through the
  head (2 x D x vocab); padding and masked pairs are not counted;
- the share of items whose pick is the same in both dtypes (acc and acc_norm) and both accuracies;
- with ``--eager``: the same runs with eager attention (what ``run_test`` did before SDPA), for comparison.

Times are the CPU time of this process (``time.process_time``), which other jobs sharing the machine inflate
less than wall time (they still share caches, memory bandwidth and, on a hyper-threaded core, the matrix
units); wall-time ratios are printed too.  Run it with one thread (``OMP_NUM_THREADS=1``) so that CPU time is
the time one core spends.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import torch

from bench_lmeval import matmul_flops  # benchmarks/ is on sys.path when a benchmark runs as a script
from walklens.cli.common import write_json


def _matmul_gflops(dtype: torch.dtype) -> float:
    """GFLOP/s of a 2048 x 2048 matmul in ``dtype``, fastest of 7 (CPU time)."""
    return matmul_flops(reps=7, dtype=dtype, clock=time.process_time) / 1e9


def useful_flops(lm: Any, requests: Sequence[Any]) -> float:
    """FLOPs that scoring ``requests`` needs (see the module docstring), from the packed layout."""
    from walklens.core.scoring.packing import _row

    cfg = lm.model.config
    inside = tuple(spec.layers + "." for spec in lm.adapter.stacks)
    layer_params = sum(p.numel() for n, p in lm.model.named_parameters() if n.startswith(inside) and p.dim() == 2)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    V, D = lm.embedding_matrix().shape
    tokens = needed = pairs = 0
    for r in requests:
        _, allowed, _ = _row(r)
        tokens += r.row_len
        needed += r.n_needed
        pairs += int(allowed.sum())
    return 2.0 * layer_params * tokens + 4.0 * heads * head_dim * pairs * lm.n_layers + 2.0 * D * V * needed


def _time(lm: Any, items: Sequence[Any], eager: bool) -> tuple[float, float, list[Any]]:
    """(CPU seconds, wall seconds, results) of the baseline runner on ``items``."""
    from walklens.core.interventions import attention_kernel
    from walklens.core.scoring import packing
    from walklens.lab.experiments.runner import baseline_scorer, run_test
    from walklens.lab.experiments.runsetup import RunSetup

    patch = contextlib.ExitStack()
    if eager:
        real = packing.attention_kernel
        packing.attention_kernel = lambda lm_, kernel: attention_kernel(lm_, "eager")
        patch.callback(setattr, packing, "attention_kernel", real)
    with patch:
        c0, w0 = time.process_time(), time.perf_counter()
        out = run_test(lm, items, baseline_scorer(), RunSetup(progress=False))
        return time.process_time() - c0, time.perf_counter() - w0, out.results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100, help="the first N items of the bundled validation set")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--eager", action="store_true", help="also time both dtypes with eager attention")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import walklens
    from walklens.base.precision import DTYPES
    from walklens.lab.hellaswag.baseline import baseline_request
    from walklens.lab.hellaswag.data import load_hellaswag

    items = load_hellaswag(limit=args.n)
    models = {name: walklens.load_model(args.model, dtype=name) for name in ("float32", "bfloat16")}
    flops = useful_flops(models["bfloat16"], [baseline_request(models["bfloat16"], it) for it in items])
    kinds = [("float32", False), ("bfloat16", False)] + ([("float32", True), ("bfloat16", True)] if args.eager else [])
    best: dict[tuple[str, bool], float] = {}
    wall: dict[tuple[str, bool], float] = {}
    results: dict[tuple[str, bool], list[Any]] = {}
    peak: dict[str, float] = {}
    for k in kinds:
        _time(models[k[0]], items[:4], k[1])  # warm-up
    for _ in range(args.repeats):
        for k in kinds:
            dt, wt, res = _time(models[k[0]], items, k[1])
            best[k] = min(best.get(k, float("inf")), dt)
            wall[k] = min(wall.get(k, float("inf")), wt)
            results[k] = res
        for name in ("float32", "bfloat16"):  # the matmuls between the runs, under the same load
            peak[name] = max(peak.get(name, 0.0), _matmul_gflops(DTYPES[name]))

    f32, b16 = results[("float32", False)], results[("bfloat16", False)]
    same_acc = sum(a.pred == b.pred for a, b in zip(f32, b16)) / len(items)
    same_norm = sum(a.pred_norm == b.pred_norm for a, b in zip(f32, b16)) / len(items)
    acc = {
        n: (
            sum(r.pred == r.gold for r in results[(n, False)]) / len(items),
            sum(r.pred_norm == r.gold for r in results[(n, False)]) / len(items),
        )
        for n in ("float32", "bfloat16")
    }
    rate = {f"{n}{' eager' if e else ''}": len(items) / t for (n, e), t in best.items()}
    achieved = {n: flops / best[(n, False)] / 1e9 for n in ("float32", "bfloat16")}
    speedup = rate["bfloat16"] / rate["float32"]
    wall_speedup = wall[("float32", False)] / wall[("bfloat16", False)]
    print(
        f"{args.model}, {len(items)} items, {torch.get_num_threads()} thread(s), fastest of {args.repeats} runs "
        f"(CPU time); "
        f"useful work {flops / len(items) / 1e9:.1f} GFLOP/item"
    )
    for name, r in rate.items():
        print(f"  {name:15s} {r:7.2f} items/s")
    print(f"  matmul 2048^2: float32 {peak['float32']:.0f} GFLOP/s, bfloat16 {peak['bfloat16']:.0f} GFLOP/s")
    print(f"bf16/fp32 items/s                          {speedup:.2f}   (target >= 3; wall time: {wall_speedup:.2f})")
    print(
        f"bf16 useful FLOP/s / bf16 matmul           {achieved['bfloat16'] / peak['bfloat16']:.2f}   "
        f"({achieved['bfloat16']:.0f} of {peak['bfloat16']:.0f} GFLOP/s; aim >= 0.5)"
    )
    print(
        f"fp32 useful FLOP/s / fp32 matmul           {achieved['float32'] / peak['float32']:.2f}   "
        f"({achieved['float32']:.0f} of {peak['float32']:.0f} GFLOP/s)"
    )
    if args.eager:
        print(
            f"SDPA / eager items/s: float32 {rate['float32'] / rate['float32 eager']:.2f}, "
            f"bfloat16 {rate['bfloat16'] / rate['bfloat16 eager']:.2f}; "
            f"bf16 eager / fp32 eager {rate['bfloat16 eager'] / rate['float32 eager']:.2f}"
        )
    print(
        f"same picks bf16 vs fp32: acc {same_acc:.1%}, acc_norm {same_norm:.1%}; "
        f"acc / acc_norm fp32 {acc['float32'][0]:.3f} / {acc['float32'][1]:.3f}, "
        f"bf16 {acc['bfloat16'][0]:.3f} / {acc['bfloat16'][1]:.3f}"
    )
    if args.json:
        write_json(
            args.json,
            {
                "model": args.model,
                "n": len(items),
                "threads": torch.get_num_threads(),
                "items_per_s": rate,
                "speedup": speedup,
                "wall_speedup": wall_speedup,
                "wall_s": {f"{n}{' eager' if e else ''}": t for (n, e), t in wall.items()},
                "matmul_gflops": peak,
                "useful_gflop_per_item": flops / len(items) / 1e9,
                "achieved_gflops": achieved,
                "same_acc": same_acc,
                "same_acc_norm": same_norm,
                "acc": acc,
            },
        )


if __name__ == "__main__":
    main()
