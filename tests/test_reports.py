"""One JSON converter, one summary of a database, one report builder per topic, one few-shot pool rule.

* :func:`walklens.base.outputs.jsonable` is the only converter of JSON (``--json``, chart specs, ``summary.json``);
* :func:`walklens.lab.experiments.summary.summarise_db` returns dataclasses; :func:`walklens.lab.reports.sweep.build`
draws
  them without the database (and says the real number of folds);
* every topic of :mod:`walklens.reports` has ``build``; no command assembles a report itself;
* :func:`walklens.lab.hellaswag.data.fewshot_pool` decides where few-shot examples come from.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from _toy import write_items
from walklens.base.outputs import jsonable
from walklens.lab.hellaswag.store import SweepRun, SweepStore

# ---- the JSON converter ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Result:
    x: torch.Tensor
    z: complex
    name: str
    _cache: int = 0


def test_jsonable_covers_every_value_the_commands_write() -> None:
    c = torch.tensor([1 + 2j, -0.5 + 0j], dtype=torch.complex64)
    got = jsonable(
        {
            "t": torch.tensor([1.0, math.nan, math.inf]),
            "c": c,
            "n": np.arange(3),
            "i": np.int64(7),
            "f": np.float32(0.5),
            3: (1, 2),
            "d": _Result(torch.tensor([[1, 2]]), 1j, "a"),
        }
    )
    assert got == {
        "t": [1.0, None, None],
        "c": [[1.0, 2.0], [-0.5, 0.0]],
        "n": [0, 1, 2],
        "i": 7,
        "f": 0.5,
        "3": [1, 2],
        "d": {"x": [[1, 2]], "z": [0.0, 1.0], "name": "a"},
    }  # private fields left out
    assert got["c"] == torch.stack([c.real, c.imag], dim=-1).tolist()  # as the power command wrote them
    json.dumps(got, allow_nan=False)  # valid JSON: no NaN, no Infinity
    assert jsonable([1 / 3, torch.tensor(2 / 3), 5], digits=6) == [0.333333, 0.666667, 5]  # chart specs
    assert jsonable(_Result) is _Result  # a class is not an instance


def test_there_is_one_json_converter() -> None:
    """The three converters (cli.common._jsonable, cli.power.plain, reports.html._num) are gone."""
    import walklens.cli.common as common
    import walklens.cli.power as power
    import walklens.reports.html as html

    assert not hasattr(common, "_jsonable") and not hasattr(power, "plain") and not hasattr(html, "_num")


# ---- the summary of a database and the sweep report ------------------------------------------------------------


def _db(path: Path, n: int = 24) -> None:
    """A sweep database of two runs (Test 2: 3 groups x 4 schemes; Test 1: 3 schemes, two metrics)."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 4, n).astype(np.uint8)
    with SweepStore(path) as st:
        for test, metrics in ((2, ["acc"]), (1, ["acc", "acc_norm"])):
            run = SweepRun(
                model="org/tiny-model",
                data="d",
                split="validation",
                shots=0,
                test=test,
                labels=labels,
                item_index=range(n),
                arch="decoder",
                n_layers=4,
            )
            rid = st.run_id(run)
            st.set_baseline(rid, 0.3, 0.35, np.zeros((2, n), np.uint8))
            for g in range(3):
                ctx = f"enc=concat_each_example,layer={g},word=mean,norm=None,seg=mean,ex=mean"
                if test == 2:
                    names = [f"out_layer={o},out_word=mean" for o in range(4)]
                    st.put_groups(
                        rid,
                        [(ctx + ",sim=dot", names, rng.integers(0, 4, (1, 4, n)).astype(np.uint8))],
                        metrics,
                        labels,
                        0.0,
                    )
                else:
                    st.put_groups(
                        rid, [(ctx, [""], rng.integers(0, 4, (2, 1, n)).astype(np.uint8))], metrics, labels, 0.0
                    )


def test_summary_of_a_database_is_dataclasses_and_the_report_draws_them(tmp_path: Path) -> None:
    from walklens.lab.experiments.heldout import REPLICATES
    from walklens.lab.experiments.summary import MetricSummary, RunSummary, summarise_db, summarise_run
    from walklens.lab.reports import sweep

    db = tmp_path / "r.sqlite"
    _db(db)
    summaries = summarise_db(db, k=4, seed=1)
    assert [type(s) for s in summaries] == [RunSummary, RunSummary]
    assert [(s.test, s.n_schemes, list(s.metrics)) for s in summaries] == [
        (2, 12, ["acc"]),
        (1, 3, ["acc", "acc_norm"]),
    ]
    for s in summaries:
        assert s.k == 4
        for m in s.metrics.values():
            assert isinstance(m, MetricSummary) and dataclasses.is_dataclass(m.kfold)
            assert m.kfold.k == 4 and len(m.kfold.fold_schemes) == 4 and len(m.top10) == min(10, s.n_schemes)
            assert [t.rank for t in m.top10] == list(range(1, len(m.top10) + 1))
            assert all(a.acc >= b.acc for a, b in zip(m.top10, m.top10[1:]))
    with SweepStore(db, readonly=True) as st:  # the same numbers as the dense predictions give
        dense = [summarise_run(st.load(r["id"]), k=4, seed=1, replicates=REPLICATES) for r in st.runs()]
    assert jsonable(dense) == jsonable(summaries)
    db.unlink()  # the builder needs the dataclasses only
    rep = sweep.build(summaries, source="r.sqlite")
    assert {"summary.csv", "summary.md", "summary.json"} <= set(rep.files)
    assert len([f for f in rep.files if f.startswith("top10_")]) == 3  # per run and metric
    assert len([f for f in rep.files if f.startswith("marginals_")]) == 3
    page = rep.render()
    assert "4-fold held-out" in page and "5-fold" not in page
    assert "4-fold held-out" in rep.files["summary.md"] and "4-fold held-out" in str(rep.files["summary.csv"])
    assert json.loads(rep.files["summary.json"]) == jsonable(summaries)
    out = tmp_path / "rep"
    rep.save(out)
    assert sorted(p.name for p in out.iterdir()) == sorted([*rep.files, *rep.images, "index.html"])
    # Fig. 10's bar labels put a stored dtype (name@dtype) on the second line, so neighbouring labels do not collide
    bf16 = dataclasses.replace(summaries[1], model="models/m@bfloat16")
    fig = sweep.bar_chart([summaries[1], bf16], test=1)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert sorted(labels) == [
        f"m\nbfloat16\n0-shot, {summaries[1].n_items} items",
        f"{Path(summaries[1].model).name}\n0-shot, {summaries[1].n_items} items",
    ]


def test_empty_report_and_attachment_names(tmp_path: Path) -> None:
    from walklens.lab.reports import sweep
    from walklens.reports.html import Report

    rep = sweep.build([])
    assert "No sweep results" in rep.render() and not rep.files
    with pytest.raises(ValueError):
        Report("t").attach("../escape.csv", "x")


# ---- one builder per topic; commands only parse, call and render -----------------------------------------------

#: each topic's report module: the instrument's in walklens.reports, the lab's in walklens.lab.reports
TOPICS = ("walk", "generate", "simmap", "heads", "kernels", "power", "steer", "lab.reports.sweep")


def report_module(topic: str) -> str:
    return f"walklens.{topic}" if "." in topic else f"walklens.reports.{topic}"


def test_every_topic_has_one_builder_and_no_command_assembles_a_report() -> None:
    import importlib

    import walklens.cli as cli

    for topic in TOPICS:
        assert callable(importlib.import_module(report_module(topic)).build), topic
    for path in Path(cli.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "reports" in node.module:
                names = [a.name for a in node.names]
                assert not [n for n in names if n == "Report" or n.startswith("add_")], (path.name, names)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "Report", path.name


# ---- the few-shot pool ----------------------------------------------------------------------------------------


def test_fewshot_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Few-shot examples come from the whole file even when only the first items are evaluated, from the hub's
    train split for hf:..., and nothing is loaded without shots."""
    import walklens.lab.hellaswag.data as data

    p = write_items(
        tmp_path / "items.jsonl", [(f"item {i} runs", "", ["a.", "b.", "c.", "d."], i % 4) for i in range(6)]
    )
    first = data.load_hellaswag(p, limit=2)
    assert [it.index for it in data.fewshot_pool(p, first, shots=1, limit=2)] == list(range(6))
    assert data.fewshot_pool(p, first, shots=0, limit=2) == first
    every = data.load_hellaswag(p)
    assert data.fewshot_pool(p, every, shots=3) == every
    calls = []
    monkeypatch.setattr(
        data, "load_hellaswag", lambda path, limit=None, split="validation": calls.append((path, limit, split)) or first
    )
    assert data.fewshot_pool("hf:Rowan/hellaswag", every, shots=2, limit=4) == first
    assert calls == [("hf:Rowan/hellaswag", None, "train")]
    assert data.fewshot_pool("hf:Rowan/hellaswag", every, shots=0) == every and len(calls) == 1
