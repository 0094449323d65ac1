"""Two ways tried to speed up the bfloat16 HellaSwag baseline (issue 14; docs/dtype.md): a larger packed batch
and ``torch.compile`` of the model's elementwise-heavy modules.

* ``--max-tokens 512,1024,2048,4096``: items/s of the baseline's packed scoring (``packing.packed_logliks`` of
  the items' ``baseline_request``s) at each batch budget (rows x row length; the default is ``packing.MAX_TOKENS``),
  alternating the budgets over ``--repeats`` rounds, fastest CPU time of each.
* ``--compile mlp,input_layernorm,post_attention_layernorm``: the same, before and after
  ``nn.Module.compile(dynamic=True)`` of those submodules of every decoder layer and of the final norm
  (inductor fuses RMSNorm's float32 round trip and the MLP's SiLU x up-projection); reports the first call's
  compile time, the largest log-likelihood difference and the picks kept against the eager run.

The model is changed in place (compiled modules), so this is a benchmark, not a library option.  Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_bf16_options.py --n 128 --max-tokens 512,1024,2048,4096
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_bf16_options.py --n 128 --max-tokens '' --compile
    mlp,input_layernorm,post_attention_layernorm
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import walklens
from walklens.core.scoring import packing
from walklens.lab.hellaswag.baseline import baseline_items, baseline_request
from walklens.lab.hellaswag.data import load_hellaswag


def fastest(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Fastest CPU time of ``repeats`` calls of ``fn`` and the last call's result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=128, help="items (the first n of the bundled validation set)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--max-tokens", default="512,1024,2048,4096", help="comma-separated batch budgets to compare ('' for none)"
    )
    ap.add_argument("--compile", default="", help="comma-separated decoder-layer submodules to compile")
    args = ap.parse_args()
    lm = walklens.load_model(args.model, dtype="bfloat16")
    items = load_hellaswag(limit=args.n)
    baseline_items(lm, items[:8])  # warm-up
    if args.max_tokens:
        budgets = [int(b) for b in args.max_tokens.split(",")]
        requests = [baseline_request(lm, it) for it in items]
        times = {b: float("inf") for b in budgets}
        for _ in range(args.repeats):  # alternate, so that the machine's load falls on every budget alike
            for b in budgets:
                t, _ = fastest(lambda b=b: packing.packed_logliks(lm, requests, max_tokens=b), 1)
                times[b] = min(times[b], t)
        for b in budgets:
            print(f"max_tokens {b:5d}: {args.n / times[b]:6.2f} items/s (CPU time, fastest of {args.repeats})")
    if args.compile:
        t_eager, ref = fastest(lambda: baseline_items(lm, items), args.repeats)
        t0 = time.time()
        for layer in lm.model.model.layers:
            for name in args.compile.split(","):
                getattr(layer, name).compile(dynamic=True)
        lm.model.model.norm.compile(dynamic=True)
        baseline_items(lm, items[:8])
        t_first = time.time() - t0
        t_comp, res = fastest(lambda: baseline_items(lm, items), args.repeats)
        d = max(abs(a - b) for x, y in zip(ref, res) for a, b in zip(x.scores, y.scores))
        same = (
            sum(x.pred == y.pred for x, y in zip(ref, res)),
            sum(x.pred_norm == y.pred_norm for x, y in zip(ref, res)),
        )
        print(
            f"eager {args.n / t_eager:.2f} items/s, compiled ({args.compile}) {args.n / t_comp:.2f} items/s: "
            f"ratio {t_eager / t_comp:.3f}; first compiled call {t_first:.1f} s; max |d loglik| {d:.3f}; "
            f"same picks acc {same[0]}/{args.n}, acc_norm {same[1]}/{args.n}"
        )


if __name__ == "__main__":
    main()
