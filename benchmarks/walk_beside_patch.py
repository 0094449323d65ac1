"""The walk beside the test (issue 55): where does the answer first become the top token of the last position's walk,
and where does restoring the clean residual at the last position restore the answer?  On the real models.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/walk_beside_patch.py \\
        --json docs/results/walk_beside_patch.json
"""

from __future__ import annotations

import argparse
import json

import torch

import walklens

PAIRS = {
    "smollm2-135m": ("The Eiffel Tower is in the city of", "The Colosseum is in the city of", " Paris", " Rome"),
    "gemma3-270m": ("The Eiffel Tower is in the city of", "The Colosseum is in the city of", " Paris", " Rome"),
}


def one(model: str) -> dict:
    clean, corrupt, answer, other = PAIRS[model]
    lm = walklens.load_model(model)
    tr = walklens.capture(lm, clean)
    out: dict = {"model": model, "clean": clean, "corrupted": corrupt, "answer": answer}
    for norm in ("none", "final"):
        w = walklens.encoding_walk(tr, norm=norm, target=answer, progress=False)
        a = w.first_top(answer)
        out[f"walk_{norm}"] = {"point": a.point, "layer": a.layer, "ranks": a.ranks}
    r = walklens.patch(lm, clean, corrupt, points="resid_pre", positions=[-1], metric=f"logitdiff:{answer!r},{other!r}")
    col = [float(v) for v in r.values[:, 0]]
    out["patch_last_position"] = col
    out["patch_first_layer_half"] = next((i for i, v in enumerate(col) if v >= 0.5), None)
    out["patch_first_layer_90"] = next((i for i, v in enumerate(col) if v >= 0.9), None)
    out["clean_metric"], out["corrupted_metric"] = r.clean_metric, r.corrupted_metric
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(PAIRS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [one(m) for m in args.models.split(",")]
    text = json.dumps(rows, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
