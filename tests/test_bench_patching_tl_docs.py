"""docs/patching.md's table of the patching benchmark beside TransformerLens is its committed result files
(benchmarks/bench_patching_tl.py); an edited number is caught."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "patching.md").read_text(encoding="utf-8")
FILES = {"bench_patching_tl.json", "bench_patching_tl_gpt2small.json", "bench_patching_tl_smollm2.json"}


def _e(x: float) -> str:
    return "0" if x == 0 else f"{x:.0e}".replace("e-0", "e-")


def _rows() -> list[list[str]]:
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in DOC.splitlines() if "`bench_patching_tl" in ln]


def test_the_transformer_lens_table_is_its_files() -> None:
    rows = _rows()
    assert {r[-1].strip("`") for r in rows} == FILES and len(rows) == 5
    for r in rows:
        d = json.loads((ROOT / "docs" / "results" / r[-1].strip("`")).read_text())
        booted = r[1].startswith("as booted") and d["transformer_lens_config"] != "as_booted"
        tl_s = d["transformer_lens_as_booted_s" if booted else "transformer_lens_s"]
        speedup = d["speedup_over_transformer_lens_as_booted" if booted else "speedup_over_transformer_lens"]
        diff = d["max_abs_diff_vs_transformer_lens_as_booted" if booted else "max_abs_diff_vs_transformer_lens"]
        loads = [*d["load_1min_before"]["walklens"]]
        loads += [x for v in d["load_1min_before"]["transformer_lens"].values() for x in v]
        want = [
            str(d["cells"]),
            f"{tl_s:.3g} s",
            f"{d['walklens_batched_incremental_s']:.3g} s",
            f"{speedup:.1f} x",
            f"{_e(diff['raw'])}, {_e(diff['normalised'])}",
            f"{min(loads):.1f}-{max(loads):.1f}",
        ]
        assert r[2:8] == want, r
        assert d["threads"] == 1 and d["transformer_lens_threads"] == 1 and d["dtype"] == "float32"


def test_the_like_for_like_grids_meet_the_bar() -> None:
    """Against TransformerLens on HF's norms the raw and normalised grids agree within 1e-5 on the two models the
    bar names (the tiny GPT-2 and SmolLM2), and walklens is at least 3 x faster on both."""
    for name in ("bench_patching_tl.json", "bench_patching_tl_smollm2.json"):
        d = json.loads((ROOT / "docs" / "results" / name).read_text())
        diff = d["max_abs_diff_vs_transformer_lens"]
        assert diff["raw"] <= 1e-5 and diff["normalised"] <= 1e-5, (name, diff)
        assert d["speedup_over_transformer_lens"] >= 3, (name, d["speedup_over_transformer_lens"])
        assert d["transformer_lens_logits_vs_hf_eager"][d["transformer_lens_config"]] == 0  # its forward is HF's
        assert d["grids_same_every_round"]


def _f(x: float) -> str:
    return f"{x:.1e}".replace("e-0", "e-")


def test_the_explanation_is_its_files() -> None:
    """The prose under the table: the as-booted difference, the unembedding's rounding, the references."""
    tiny, small, smol = (
        json.loads((ROOT / "docs" / "results" / n).read_text())
        for n in ("bench_patching_tl.json", "bench_patching_tl_gpt2small.json", "bench_patching_tl_smollm2.json")
    )
    text = " ".join(DOC.split())
    b1 = [_f(d["max_abs_diff_raw_other_batches"]["1"]) for d in (tiny, small, smol)]
    (rw, _), (rt, _) = small["references"]["walklens"], small["references"]["transformer_lens"]
    for want in (
        f"Why the grids differed ({_f(small['max_abs_diff_vs_transformer_lens_as_booted']['raw'])} raw",
        f"({_f(small['transformer_lens_logits_vs_hf_eager']['as_booted'])} apart on the GPT-2-small shape",
        f"one cell a pass they part by {b1[0]}, {b1[1]} and {b1[2]} (tiny GPT-2",
        f"clean {rw:.7f} against TransformerLens's {rt:.7f}",
        f"gap of {small['metric_gap']:.2f} this is {_e(small['max_abs_diff_vs_transformer_lens']['normalised'])},",
        f"walklens is {tiny['speedup_over_transformer_lens']:.1f} x and {smol['speedup_over_transformer_lens']:.1f} x",
        f"{tiny['speedup_of_medians']:.1f} x and {smol['speedup_of_medians']:.1f} x, `speedup_of_medians`",
    ):
        assert want in text, want
    for d in (tiny, small, smol):
        every = d["every_position_unembedded_batch_1"]
        assert every["max_abs_diff_raw"] == 0 and every["references_minus_transformer_lens"] == [0, 0]
