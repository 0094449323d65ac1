"""The walk beside the test (issue 55): where does the answer first become the top token of the last position's walk,
and where does restoring the clean residual at the last position restore the answer?  On the real models; one
document per model (``walklens.analyses.walk_beside_patch``), the full ``resid_pre`` grid included.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/walk_beside_patch.py \\
        --json docs/results/walk_beside_patch.json

The view of the committed documents (the same page as the notebook view and the explorer's ``--patch``):

    PYTHONPATH=src .venv/bin/python benchmarks/walk_beside_patch.py --view docs/results/walk_beside_patch.json \\
        --out beside/
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

import walklens
from walklens.analyses import walk_beside_patch
from walklens.base.outputs import jsonable

PAIRS = {
    "smollm2-135m": ("The Eiffel Tower is in the city of", "The Colosseum is in the city of", " Paris", " Rome"),
    "gemma3-270m": ("The Eiffel Tower is in the city of", "The Colosseum is in the city of", " Paris", " Rome"),
}


def one(model: str) -> dict[str, Any]:
    """The walk beside the test of ``model``'s pair, as its JSON document."""
    clean, corrupt, answer, other = PAIRS[model]
    r = walk_beside_patch(walklens.load_model(model), clean, corrupt, answer, other)
    return jsonable(r.document())


def view(path: str, out: str) -> None:
    """The page of the documents in ``path`` (one section per model) written to ``out``."""
    from walklens.reports.patching import build_beside, checked

    with open(path, encoding="utf-8") as f:
        docs = checked(json.load(f), path)
    print(build_beside(docs).save(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(PAIRS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--view", default=None, metavar="FILE", help="draw the documents of FILE instead of running")
    ap.add_argument("--out", default="walk_beside", help="the folder of --view's page")
    args = ap.parse_args()
    if args.view:
        view(args.view, args.out)
        return
    torch.set_num_threads(1)
    rows = [one(m) for m in args.models.split(",")]
    for d in rows:
        lv = {x["level"]: x["layer"] for x in d["levels"]}
        walks = ", ".join(f"{r['name']} {r['point']}" for r in d["readings"])
        print(f"{d['model']}: walk top-1 from {walks}; restored >= 0.5 from L{lv[0.5]}, >= 0.9 from L{lv[0.9]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
