"""One instance of every public result type, built on a tiny random model (the notebook-view tests share it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import walklens
from walklens.core.loading import LoadedModel

#: a text whose tokens (each character of the tiny tokenizer) include markup
TEXT = "the cat and the dog walk to the house"


def every_result(lm: LoadedModel, tmp: Path) -> dict[str, Any]:
    """Type name -> one result of that type (``summary.RunSummary`` from a small results database)."""
    from test_frames import _database, _items
    from walklens.analyses.compaction import explain
    from walklens.analyses.parity import verify
    from walklens.lab.experiments.curves import CurvePoint, CurveSet
    from walklens.lab.experiments.runner import baseline_scorer, run_test
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.experiments.summary import summarise_db

    ident = walklens.attention_identity(lm, TEXT)
    tr = walklens.capture(lm, TEXT, attentions=True)
    hm = walklens.head_matrices(lm, 1)
    spectra = walklens.power_spectra(lm, nearest=3)
    out: dict[str, Any] = {
        "Trace": tr,
        "EncodingWalk": walklens.encoding_walk(tr, k=3, progress=False),
        "TargetAnswer": walklens.encoding_walk(tr, k=3, norm="final", target=5, progress=False).first_top(5),
        "SimilarityMap": walklens.similarity_map(tr, "final"),
        "SimilarityPair": walklens.analyses.compare_maps(
            walklens.similarity_map(tr, "final"), walklens.similarity_map(walklens.capture(lm, "a dog ran"), "final")
        ),
        "DecodingWalk": walklens.decoding_walk(lm, "the dog", max_new_tokens=2),
        "HeadMatrices": hm,
        "IdentityResult": ident,
        "ClusterView": walklens.analyses.cluster_view(ident.trace, hm, 0, 3),
        "SelfMass": walklens.analyses.self_mass(tr),
        "HeadStats": walklens.analyses.head_stats(lm),
        "PositionKernels": walklens.position_kernels(lm, max_distance=4, progress=False),
        "PowerSpectra": spectra,
        "Alignment": walklens.alignment(lm, [TEXT], spectra=spectra, n_random=4, n_shuffles=2),
        "Dynamics": walklens.analyses.dynamics(lm, [TEXT]),
        "SharedWeights": walklens.analyses.shared_weights(lm, [TEXT], layer=0, n_layers=3),
        "SteeringSweep": walklens.analyses.steering_sweep(
            lm, ["the dog"], " cat", [[1]], alphas=[0.0, 4.0], add_alphas=[2.0], max_new_tokens=2
        ),
        "ParityCard": verify(lm, texts=("the cat sat",), quick=True),
        "CompactionReport": explain(lm, TEXT + " . the king runs", continuation=" and the", budget=3, top=3),
        "ControlVector": walklens.analyses.ControlVector(
            {1: torch.ones(8), 2: -torch.ones(8)}, "llama", "add", 2.0, "cat"
        ),
        "BlockContrast": walklens.analyses.block_contrast(
            torch.eye(4) + 0.5, ["number", "number", "word", "word"], name="V/dot", n_perm=20, n_boot=20
        ),
        "Cooccurrence": walklens.analyses.cooccurrence(
            [[1, 2, 3, 1, 2, 4, 5, 1, 3] * 3] * 6, torch.randn(8, 4), n_groups=3, min_count=2, n_matched=2
        ),
    }
    out["PatchResult"] = walklens.patch(lm, "the dog runs", "the cat runs", points="L1.resid_pre", metric="kl")
    out["WalkBeside"] = walklens.analyses.walk_beside_patch(lm, "the cat runs", "the dog runs", " runs", " cat")
    with walklens.steer(lm, " cat", [1], 2.0) as res:
        out["SteerResult"] = res
    out["Compacted"] = out["CompactionReport"].compacted
    point = {"acc_ci": (0.2, 0.4), "acc_norm_ci": (0.2, 0.4), "kept_acc": 0.9, "kept_acc_ci": (0.8, 1.0)}
    out["CurveSet"] = CurveSet(
        model="m",
        n_items=20,
        n_tune=0,
        tuned={},
        points=[
            CurvePoint(
                shots=0,
                what="examples",
                strategy="chunk",
                ratio=r,
                spec=f"chunk:{r}",
                n=20,
                acc=0.3,
                acc_norm=0.3,
                kept_acc_norm=0.9,
                kept_acc_norm_ci=(0.8, 1.0),
                tokens_per_vector=r,
                inputs=100 / r,
                inputs_full=100.0,
                **point,
            )
            for r in (2.0, 4.0)
        ],
    )
    out["runner.RunSummary"] = run_test(lm, _items(), baseline_scorer(), RunSetup(data="toy", progress=False))
    from test_steering_card import write_set

    out["SteeringCard"] = walklens.lab.steering_card(
        lm, write_set(tmp / "set.jsonl"), layers=[1], doses=[0.5], methods=["add"], max_new_tokens=2, n_boot=20, limit=1
    )
    db = tmp / "results.sqlite"
    _database(db)
    out["summary.RunSummary"] = summarise_db(db)[0]
    return out
