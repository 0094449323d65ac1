"""Run lm-evaluation-harness's HellaSwag scoring on a local jsonl, timing the evaluation only (model loaded
first).  Executed by bench_lmeval.py with the *lm-eval* virtual environment's Python (a benchmark-only
dependency; never imported by walklens):

    .lmeval-venv/bin/python benchmarks/lmeval_driver.py TASK_DIR MODEL_DIR BATCH OUT.json [DTYPE]

DTYPE is HFLM's ``dtype`` (float32, the default, or bfloat16).
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(task_dir: str, model_dir: str, batch: str, out: str, dtype: str = "float32") -> None:
    import numpy as np
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    assert not torch.version.cuda, "the lm-eval venv must use the CPU build of torch"
    t_load = time.perf_counter()
    lm = HFLM(pretrained=model_dir, dtype=dtype, device="cpu", batch_size=int(batch))
    tm = TaskManager(include_path=task_dir)
    t0 = time.perf_counter()
    res = simple_evaluate(
        model=lm, tasks=["walklens_hellaswag_local"], task_manager=tm, log_samples=True, num_fewshot=0
    )
    t1 = time.perf_counter()
    r = res["results"]["walklens_hellaswag_local"]
    samples = sorted(res["samples"]["walklens_hellaswag_local"], key=lambda s: s["doc_id"])
    picks = []
    for s in samples:
        ll = np.array([float(x[0]) for x in s["filtered_resps"]])
        lens = np.array([float(len(c)) for c in s["doc"]["choices"]])
        picks.append({"acc": int(np.argmax(ll)), "acc_norm": int(np.argmax(ll / lens)), "ll": ll.tolist()})
    json.dump(
        {
            "seconds": t1 - t0,
            "load_seconds": t0 - t_load,
            "n": len(samples),
            "acc": r["acc,none"],
            "acc_norm": r["acc_norm,none"],
            "batch_size": int(batch),
            "dtype": dtype,
            "torch": torch.__version__,
            "predictions": picks,
        },
        open(out, "w"),
        indent=1,
    )


if __name__ == "__main__":
    main(*sys.argv[1:6])
