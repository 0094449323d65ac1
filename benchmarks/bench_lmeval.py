"""Baseline throughput: walklens vs lm-evaluation-harness on the same HellaSwag items, and achieved FLOP/s.

Issue 7's benchmarks, measured in one run (ratios, never asserted on wall-clock):

* walklens baseline items/s / lm-evaluation-harness items/s on smollm2-135m, N validation items, zero-shot,
  fp32, CPU, at identical acc and acc_norm (target >= 2.5).  lm-eval runs its ``hellaswag`` scoring through a
  local task YAML (``dataset_path: json``) on a jsonl written from walklens' own loader, ``--model hf`` on the
  de-quantized safetensors copy of the model that walklens loads, in its own virtual environment (a
  benchmark-only dependency; see docs/sweep.md, "Reproducing the lm-evaluation-harness benchmark").
* achieved useful FLOP/s of the walklens baseline (2 x parameters x tokens actually needed / seconds) divided by
  the machine's fp32 matmul FLOP/s (torch 2048x2048, measured in the same run) (target >= 0.5).

With ``--dtype bfloat16`` (issue 14) both sides run in bfloat16 (walklens ``load_model(dtype=)``, lm-eval's
``HFLM(dtype="bfloat16")``), the FLOP/s ratio is taken against a bfloat16 matmul, and each side also runs once in
float32 on the same items so that its bfloat16 picks can be compared with its own float32 picks: the target is
>= 2.5x items/s at equal or better agreement (share of identical acc and acc_norm picks) than lm-eval's.

Both sides time the evaluation only, after loading the model.  Usage::

    .venv/bin/python benchmarks/bench_lmeval.py [--n 200] [--dtype float32|bfloat16]
        [--lmeval-python .lmeval-venv/bin/python] [--lmeval-batch 1,8] [--json docs/results/bench_lmeval.json]
Without an lm-eval environment the comparison is skipped (and said so); the FLOP/s ratio is still measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from walklens.cli.common import write_json

HERE = Path(__file__).resolve().parent
TASK_YAML = """task: walklens_hellaswag_local
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    validation: {jsonl}
output_type: multiple_choice
validation_split: validation
test_split: null
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "choices"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def matmul_flops(
    n: int = 2048, reps: int = 10, dtype: torch.dtype = torch.float32, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Best-of-``reps`` FLOP/s of an ``n x n`` matmul in ``dtype`` (2 n^3 flops), timed with ``clock``."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = clock()
        a @ b
        best = min(best, clock() - t0)
    return 2 * n**3 / best


def write_task(items: list, folder: Path) -> Path:
    """The items as lm-eval's hellaswag ``process_docs`` would produce them (query, choices, label) + the YAML."""
    jsonl = folder / "items.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for it in items:
            f.write(
                json.dumps({"query": it.ctx, "choices": list(it.endings), "label": it.label, "index": it.index}) + "\n"
            )
    (folder / "walklens_hellaswag_local.yaml").write_text(TASK_YAML.format(jsonl=jsonl), encoding="utf-8")
    return folder


def run_lmeval(py: Path, items: list, model_dir: Path, batch: int, dtype: str = "float32") -> dict:
    """lm-eval's scoring of ``items`` with ``batch`` sequences per forward pass in ``dtype``, in its own
    environment."""
    with tempfile.TemporaryDirectory() as td:
        folder = write_task(items, Path(td))
        res_file = Path(td) / "lmeval.json"
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        cmd = [str(py), str(HERE / "lmeval_driver.py"), str(folder), str(model_dir), str(batch), str(res_file), dtype]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"lm-eval failed (exit {proc.returncode})")
        return json.loads(res_file.read_text())


def work(lm: object, items: list) -> dict:
    """What each side must compute: walklens' packed rows (context once + the prefix tree of the endings'
    inputs; the LM head only where an ending token is predicted) against lm-eval's full sequences (context +
    ending minus its last token, four times per item; the LM head at every position).  FLOPs = 2 x weights x
    positions, split into the body and the LM head."""
    from walklens.lab.hellaswag.baseline import baseline_request

    reqs = [baseline_request(lm, it) for it in items]
    head = lm.model.get_output_embeddings().weight
    embed = lm.model.get_input_embeddings().weight
    total = sum(p.numel() for p in lm.model.parameters())
    body = total - embed.numel() - (0 if head is embed else head.numel())
    wl_rows = sum(r.row_len for r in reqs)
    wl_head = sum(r.n_needed for r in reqs)
    le_tokens = sum(r.context_len + len(c) - 1 for r in reqs for c in r.continuations)
    wl_flops = 2 * (body * wl_rows + head.numel() * wl_head)
    le_flops = 2 * (body + head.numel()) * le_tokens
    return {
        "params": total,
        "body_params": body,
        "head_params": head.numel(),
        "walklens_positions": wl_rows,
        "walklens_head_positions": wl_head,
        "lmeval_positions": le_tokens,
        "walklens_flops": wl_flops,
        "lmeval_flops": le_flops,
        "work_ratio": le_flops / wl_flops,
    }


def walklens_baseline(lm: object, items: list) -> dict:
    from walklens.lab.experiments.runner import baseline_scorer, run_test
    from walklens.lab.experiments.runsetup import RunSetup

    w = work(lm, items)
    n_params, tokens = w["params"], w["walklens_positions"]  # tokens actually needed: context + ending trees
    quiet = RunSetup(progress=False)
    run_test(lm, items[:4], baseline_scorer(), quiet)  # warm-up (allocations, kernels)
    t0 = time.perf_counter()
    res = run_test(lm, items, baseline_scorer(), quiet).results  # `walklens hellaswag baseline`'s path
    dt = time.perf_counter() - t0
    n = len(items)
    return {
        "seconds": dt,
        "n": n,
        "acc": sum(r.pred == r.gold for r in res) / n,
        "acc_norm": sum(r.pred_norm == r.gold for r in res) / n,
        "tokens": tokens,
        "params": n_params,
        "work": w,
        "predictions": [{"acc": r.pred, "acc_norm": r.pred_norm, "ll": list(r.scores)} for r in res],
    }


def agreement(picks: list[dict], reference: list[dict]) -> dict[str, float]:
    """Share of items whose ``acc`` and ``acc_norm`` picks equal the reference run's (same items, same order)."""
    n = len(reference)
    return {m: sum(a[m] == b[m] for a, b in zip(picks, reference)) / n for m in ("acc", "acc_norm")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200)
    venv_python = str(HERE.parent / ".lmeval-venv" / "bin" / "python")  # the clone's own lm-eval environment
    ap.add_argument("--lmeval-python", default=os.environ.get("LMEVAL_PYTHON", venv_python))
    ap.add_argument(
        "--lmeval-batch",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 8],
        help="lm-eval batch sizes to run, comma-separated (default 1,8: its default and a tuned one)",
    )
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the dtype both sides run in (bfloat16: also each side's float32 picks, for agreement)",
    )
    ap.add_argument(
        "--model",
        default="smollm2-135m",
        help="smollm2-135m (its de-quantized folder is what lm-eval reads) or a safetensors folder both sides read, "
        "e.g. a random-weight model of real shape (python -m walklens.testing.shapes llama-3.1-8b DIR)",
    )
    ap.add_argument(
        "--stream", action="store_true", help="walklens runs the model layer by layer (lm-eval holds it in memory)"
    )
    ap.add_argument(
        "--no-float32", action="store_true", help="with --dtype bfloat16: skip both sides' float32 reference runs"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)

    import walklens
    from walklens.core.loading import NAMED_MODELS, _gguf_cache_path
    from walklens.lab.hellaswag.data import load_hellaswag

    items = load_hellaswag(limit=args.n)
    named = args.model in NAMED_MODELS
    lm = walklens.load_model(args.model, dtype=args.dtype, stream=True if args.stream else None, progress=False)
    model_dir = _gguf_cache_path(NAMED_MODELS[args.model]()) if named else Path(args.model)
    tdtype = getattr(torch, args.dtype)
    peak = matmul_flops(dtype=tdtype)
    wl = walklens_baseline(lm, items)
    peak = max(peak, matmul_flops(dtype=tdtype))  # measured before and after; the better of the two
    useful = 2 * wl["params"] * wl["tokens"] / wl["seconds"]
    out: dict = {
        "n": len(items),
        "model": args.model,
        "model_dir": str(model_dir),
        "walklens_streamed": lm.stream is not None,
        "walklens_bytes_read": None,
        "dtype": args.dtype,
        "walklens": {k: v for k, v in wl.items() if k != "predictions"},
        f"matmul_{args.dtype}_flops": peak,
        "useful_flops": useful,
        "flops_ratio": useful / peak,
        "torch_threads": torch.get_num_threads(),
    }
    print(
        f"walklens baseline ({args.dtype}): {len(items)} items in {wl['seconds']:.1f} s = "
        f"{len(items) / wl['seconds']:.2f} items/s; acc {wl['acc']:.4f} acc_norm {wl['acc_norm']:.4f}"
    )
    print(
        f"useful FLOP/s {useful / 1e9:.2f} G / {args.dtype} 2048^2 matmul {peak / 1e9:.2f} G = ratio "
        f"{useful / peak:.3f}"
    )
    if lm.stream is not None:
        out["walklens_bytes_read"] = lm.stream.stats.bytes_read
    reduced = args.dtype != "float32" and not args.no_float32
    if reduced:  # the same items in float32: the reference for this side's agreement
        wl32 = walklens_baseline(walklens.load_model(args.model), items)
        out["walklens"]["agreement_with_float32"] = agreement(wl["predictions"], wl32["predictions"])
        out["walklens"]["float32_seconds"] = wl32["seconds"]
        print(
            f"walklens float32: {len(items) / wl32['seconds']:.2f} items/s; bf16/fp32 items/s "
            f"{wl32['seconds'] / wl['seconds']:.2f}; identical picks with float32 "
            f"{out['walklens']['agreement_with_float32']}"
        )
    w = wl["work"]
    print(
        f"work: walklens {w['walklens_positions']} positions ({w['walklens_head_positions']} through the LM head), "
        f"lm-eval {w['lmeval_positions']} (all through the LM head); lm-eval FLOPs / walklens FLOPs = "
        f"{w['work_ratio']:.2f} (the items/s ratio at equal FLOP efficiency)"
    )
    py = Path(args.lmeval_python)
    if not py.is_file():
        print(f"lm-evaluation-harness comparison skipped: no {py} (see docs/sweep.md to create it)")
    else:
        out["lmeval"] = []
        le32 = None
        if reduced:  # lm-eval's own float32 picks, at its largest batch size
            le32 = run_lmeval(py, items, model_dir, max(args.lmeval_batch), "float32")
            out["lmeval_float32"] = {k: v for k, v in le32.items() if k != "predictions"}
        for batch in args.lmeval_batch:
            le = run_lmeval(py, items, model_dir, batch, args.dtype)
            same_preds = all(
                a["acc"] == b["acc"] and a["acc_norm"] == b["acc_norm"]
                for a, b in zip(wl["predictions"], le["predictions"])
            )
            max_ll_diff = max(
                abs(x - y) for a, b in zip(wl["predictions"], le["predictions"]) for x, y in zip(a["ll"], b["ll"])
            )
            differ = {
                m: sum(a[m] != b[m] for a, b in zip(wl["predictions"], le["predictions"])) for m in ("acc", "acc_norm")
            }
            ratio = (len(items) / wl["seconds"]) / (le["n"] / le["seconds"])
            row = {k: v for k, v in le.items() if k != "predictions"}
            row.update(
                same_predictions=same_preds,
                picks_differ=differ,
                max_loglik_diff=max_ll_diff,
                items_per_s_ratio=ratio,
                identical_acc=(wl["acc"] == le["acc"] and wl["acc_norm"] == le["acc_norm"]),
            )
            if le32 is not None:
                mine, theirs = (
                    out["walklens"]["agreement_with_float32"],
                    agreement(le["predictions"], le32["predictions"]),
                )
                row.update(
                    agreement_with_float32=theirs,
                    walklens_agrees_at_least_as_well=all(mine[m] >= theirs[m] for m in mine),
                )
                print(
                    f"lm-eval (batch {batch}) identical picks with its float32: {theirs}; walklens at least as "
                    f"well: {row['walklens_agrees_at_least_as_well']}"
                )
            out["lmeval"].append(row)
            print(
                f"lm-eval (batch {batch}): {le['n']} items in {le['seconds']:.1f} s = "
                f"{le['n'] / le['seconds']:.2f} items/s; acc {le['acc']:.4f} acc_norm {le['acc_norm']:.4f}; "
                f"identical acc/acc_norm: {row['identical_acc']}; identical per-item picks: {same_preds} (items that "
                f"differ: {differ['acc']} by acc, {differ['acc_norm']} by acc_norm); "
                f"max |loglik diff| {max_ll_diff:.2e}"
            )
            print(f"items/s ratio walklens / lm-eval batch {batch} = {ratio:.2f} (target >= 2.5)")
        fastest = max(out["lmeval"], key=lambda r: r["n"] / r["seconds"])
        out["items_per_s_ratio"] = fastest["items_per_s_ratio"]
        out["identical_acc"] = all(r["identical_acc"] for r in out["lmeval"])
        print(
            f"against lm-eval's fastest batch size ({fastest['batch_size']}): ratio {fastest['items_per_s_ratio']:.2f}"
        )
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
