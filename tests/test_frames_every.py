"""Every tabular result has ``to_pandas()`` (issue 56, "results alike everywhere"; docs/notebooks.md, "Tables"): each
result class shown in a notebook either has one or is named below with why it is no table, and the new frames
hold the result's numbers."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest
import torch

import walklens
from walklens.analyses.association import BlockContrast, ClassContrast, Cooccurrence, Correlation
from walklens.analyses.encoderself import SelfRank
from walklens.analyses.selfbias import SelfBiasCount
from walklens.base.display import Shown
from walklens.lab.concepteval import Comparison, ConceptEval

pd = pytest.importorskip("pandas")

#: results that are no table, and why
NOT_TABLES = {
    "ControlVector": "one direction per layer (a vector file's content: walklens.analyses.controlvectors.save)",
    "SteerResult": "the one direction an intervention applied; its numbers are the SteeringSweep's table",
}


def _results() -> set[type]:
    for m in pkgutil.walk_packages(walklens.__path__, "walklens."):
        if not m.name.startswith(("walklens.server", "walklens.cli", "walklens.__main__")):
            importlib.import_module(m.name)
    out: set[type] = set()
    todo = list(Shown.__subclasses__())
    while todo:
        c = todo.pop()
        out.add(c)
        todo += c.__subclasses__()
    return out


def test_every_result_shown_is_a_table_or_says_why_not() -> None:
    results = _results()
    assert len(results) >= 25
    missing = sorted(c.__name__ for c in results if not hasattr(c, "to_pandas") and c.__name__ not in NOT_TABLES)
    assert missing == []
    assert set(NOT_TABLES) <= {c.__name__ for c in results}  # a class renamed or given a table leaves the list


def _cc(cls: str, x: float) -> ClassContrast:
    return ClassContrast(cls, 3, x, x / 2, x / 2, x / 4, x, 0.01, 0.2)


def test_block_contrast_and_cooccurrence_frames() -> None:
    b = BlockContrast("cosine", "m", 9, 0.1, (_cc("word", 0.5), _cc("punct", 0.3)), 100, 100, 0, True)
    df = b.to_pandas()
    assert list(df["cls"]) == ["word", "punct"] and list(df["within"]) == [0.5, 0.3] and df.attrs["n_tokens"] == 9
    c = {
        k: Correlation(i / 10, i / 10 - 0.05, i / 10 + 0.05)
        for i, k in enumerate(
            ("pmi_dot", "pmi_cos", "dot_cos", "partial_dot", "partial_cos", "matched_dot", "matched_cos", "excess_cos")
        )
    }
    co = Cooccurrence("m", 10, 5, 1000, 40, 5, 2, **c, n_groups=5, n_matched=3, seed=0)  # type: ignore[arg-type]
    df = co.to_pandas()
    assert df.set_index("statistic")["rho"].to_dict() == {k: v.rho for k, v in c.items()}
    assert df.attrs["n_pairs"] == 40


def test_self_rank_self_bias_and_concept_eval_frames() -> None:
    r = SelfRank("m", "encoder", 50, [3, 4], [4, 3], torch.tensor([0, 7]), torch.tensor([2, 1]),
                 torch.tensor([0.9, 0.2]), torch.tensor([0.1, 0.3]), 0.5, 0.1, 0.9, 1.0, [" a", " b"])  # fmt: skip
    df = r.to_pandas()
    assert list(df["rank_own"]) == [0, 7] and list(df["control_id"]) == [4, 3] and df.attrs["stack"] == "encoder"
    assert list(df["token"]) == [" a", " b"] and list(df["control_token"]) == [" b", " a"]  # strings beside the ids
    gap = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    s = SelfBiasCount("m", "", 6, 10, 0.1, 0.05, 2, 1, 0.3, 0.26, True, gap, -gap)
    df = s.to_pandas()
    assert len(df) == 6 and list(df["gap"]) == gap.flatten().tolist() and list(df["head"])[:3] == [0, 1, 2]
    t = torch.tensor
    comp: dict[str, Any] = {"own_vs_offtopic": Comparison(3, 4, 0.75, 0.3, 0.95, 0.6)}
    e = ConceptEval("m", 2, 8, 0, "middle", "mean", ["a b", "c d"], t([0.5, 0.6]), t([0.1, 0.2]), t([0.1, 0.3]),
                    t([0.2, 0.2]), t([0.4, 0.1]), t([[0.1, 0.2, 0.3], [0.3, 0.2, 0.1]]), comp)  # fmt: skip
    items = e.to_pandas()
    assert list(items["continuation"]) == ["a b", "c d"] and list(items["distractor_2"]) == pytest.approx([0.3, 0.1])
    assert e.to_pandas("comparisons")["share"].tolist() == [0.75]
