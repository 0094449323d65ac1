"""How much the pick matters (walklens.lab.experiments.selection, `walklens hellaswag selection`; docs/claims.md): the
top schemes of a committed sweep, each held out item by item beside the baseline, and the rule its rows read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from _toy import ROWS, cli_runner, write_items, write_toy
from walklens.analyses.concepts.schemes import Scheme
from walklens.lab.claims.base import Claim
from walklens.lab.claims.pairs import holm
from walklens.lab.claims.table import assess
from walklens.lab.experiments.runner import run_test, scorer
from walklens.lab.experiments.runsetup import RunSetup
from walklens.lab.hellaswag.data import load_hellaswag

T1 = [
    "enc=concat_all_examples,layer=-1,word=w1mean,norm=None,seg=None,ex=None",
    "enc=concat_all_examples,layer=0,word=last,norm=None,seg=None,ex=None",
    "enc=sentence_level_segmentation,layer=-1,word=mean,norm=None,seg=mean,ex=None",
]
T2 = [
    "enc=concat_all_examples,layer=-1,word=mean,norm=None,seg=None,ex=None,sim=cosine,out_layer=-1,out_word=mean",
    "enc=concat_all_examples,layer=0,word=last,norm=None,seg=None,ex=None,sim=dot,out_layer=-1,out_word=last",
]
CHOSEN = 4  # the toy "sweep" chose its schemes on the first 4 items


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("selection")
    t = write_toy(d)
    write_items(d / "ten.jsonl", [*ROWS, *ROWS[:4]])
    t.ten = str(d / "ten.jsonl")
    runs = [
        {"model": "toy", "test": test, "shots": 0, "n_items": CHOSEN,
         "metrics": {"acc": {"top10": [{"rank": i + 1, "scheme": s, "acc": 0.5 - i / 100, "norm": 1.0}
                                       for i, s in enumerate(schemes)]}}}
        for test, schemes in ((1, T1), (2, T2))
    ]  # fmt: skip
    (d / "summary.json").write_text(json.dumps({"runs": runs}))
    t.summary = str(d / "summary.json")
    return t


@pytest.mark.parametrize(("test", "schemes"), [(1, T1), (2, T2)])
def test_each_scheme_held_out_equals_its_single_run(toy, capsys, test: int, schemes: list[str]) -> None:
    """The selection's sweep gives each scheme's picks on the held-out items exactly as `walklens hellaswag test1|2`
    scores that scheme alone (the runner: another code path), and the baseline's as the baseline's."""
    run = cli_runner(capsys)
    d = toy.dir
    out = d / f"sel{test}.json"
    db = d / f"sel{test}.sqlite"
    r = run("hellaswag", "selection", "--summary", toy.summary, "--summary-model", "toy", "--test", str(test),
            "--model", toy.model, "--data", toy.ten, "--chosen-on", str(CHOSEN), "--top", str(len(schemes)),
            "--db", str(db), "--no-progress", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    items = load_hellaswag(toy.ten)[CHOSEN:]
    assert doc["n"] == len(items) == 6 and doc["items"] == [it.index for it in items] and doc["skip"] == CHOSEN
    assert [s["scheme"] for s in doc["schemes"]] == schemes and [s["rank"] for s in doc["schemes"]] == [1, 2, 3][
        : len(schemes)
    ]
    setup = RunSetup()
    base = run_test(toy.lm, items, scorer(toy.lm, "baseline"), setup)
    assert doc["gold"] == "".join(str(r.gold) for r in base.results)
    assert doc["baseline"]["acc"] == "".join(str(r.pred) for r in base.results)
    name = "test1" if test == 1 else "test2"
    for s in doc["schemes"]:
        alone = run_test(toy.lm, items, scorer(toy.lm, name, Scheme.from_spec(s["scheme"], test, "decoder")), setup)
        assert s["picks"]["acc"] == "".join(str(r.pred) for r in alone.results), s["scheme"]
        assert s["picks"]["acc_norm"] == "".join(str(r.pred_norm) for r in alone.results), s["scheme"]
        assert s["heldout"]["acc"] == pytest.approx(alone.acc)
    # a second run reads everything back from the database: the same document
    again = run("hellaswag", "selection", "--summary", toy.summary, "--summary-model", "toy", "--test", str(test),
                "--model", toy.model, "--data", toy.ten, "--chosen-on", str(CHOSEN), "--top", str(len(schemes)),
                "--db", str(db), "--no-progress", "--json", str(d / "again.json"))  # fmt: skip
    assert again.returncode == 0, again.stderr
    second = json.loads((d / "again.json").read_text())
    assert {k: v for k, v in second.items() if k != "command"} == {k: v for k, v in doc.items() if k != "command"}


def test_bad_input_is_one_line(toy, capsys) -> None:
    run = cli_runner(capsys)
    common = ["--summary", toy.summary, "--summary-model", "toy", "--model", toy.model, "--data", toy.ten,
              "--chosen-on", str(CHOSEN), "--no-progress", "--db", str(toy.dir / "bad.sqlite")]  # fmt: skip
    cases = [
        (["--test", "1", "--skip", "2"], "would score items the schemes were chosen on (the first 4)"),
        (["--test", "1", "--top", "4"], "ranking holds 3 schemes, not 4"),
        (["--test", "1", "--shots", "5"], "the summary holds 0 runs of toy, Test 1, 5-shot, 4 items"),
        (["--test", "1", "--top", "11"], "use 1 to 10"),
        (["--test", "1", "--json", toy.summary], "--json"),
    ]
    for extra, said in cases:
        r = run("hellaswag", "selection", *common, *extra)
        assert r.returncode == 2, (extra, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("walklens: error: ") and said in lines[0], (extra, lines)
    assert json.loads(Path(toy.summary).read_text())["runs"]  # the summary was not replaced


def test_holm_adjusts_step_down() -> None:
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm([0.4, 0.4, 0.4]) == pytest.approx([1.0, 1.0, 1.0])


def _doc(tmp_path: Path, rights: list[int], base_right: int, n: int = 400) -> Path:
    """A selection document on ``n`` items whose baseline is right on ``base_right`` of them and scheme ``j`` on
    ``rights[j]`` (the baseline's right items first, so the discordant pairs are exactly the difference)."""
    gold = np.zeros(n, np.int64)

    def picks(k: int) -> str:
        return "".join("0" if i < k else "1" for i in range(n))

    schemes = [{"rank": j + 1, "scheme": f"s{j}", "in_sample": 0.5, "heldout": {"acc": k / n},
                "picks": {"acc": picks(k), "acc_norm": picks(k)}} for j, k in enumerate(rights)]  # fmt: skip
    doc = {"model": "m", "summary_model": "m", "test": 1, "shots": 0, "data": "d", "pool": "validation",
           "metric": "acc", "command": "c", "chosen_on": 200, "skip": 200, "n": n, "items": list(range(n)),
           "gold": "".join(map(str, gold)), "baseline": {"acc": picks(base_right), "acc_norm": picks(base_right)},
           "schemes": schemes}  # fmt: skip
    p = tmp_path / "sel.json"
    p.write_text(json.dumps(doc))
    return p


def _verdict(tmp_path: Path) -> tuple[str, str]:
    c = Claim("x", "000", "says", "cmd", "sel.json", "selection_picks", {}, "selection_below")
    m, verdict = assess(c, tmp_path)
    assert m is not None
    return verdict, m.text


def test_the_rule_needs_every_scheme_below_after_holm(tmp_path: Path) -> None:
    _doc(tmp_path, [100, 110, 120], 160)  # every scheme far below: reproduced
    verdict, text = _verdict(tmp_path)
    assert verdict.startswith("reproduced: all 3 best schemes stay below"), verdict
    assert "acc 0.250 to 0.300" in text and "the in-sample best ranks 3 of 3 held out" in text
    _doc(tmp_path, [100, 110, 200], 160)  # one above: not reproduced
    assert _verdict(tmp_path)[0].startswith("not reproduced: 1 of the 3 best schemes score above")
    # each alone below at p < 0.05 (8 with 10 discordant pairs all against, p = 0.002; 2 with 6, p = 0.031) but
    # the two weak ones not after Holm's correction over the ten (0.031 x 2 = 0.0625)
    _doc(tmp_path, [150] * 8 + [154] * 2, 160)
    verdict, _ = _verdict(tmp_path)
    assert verdict.startswith("not decided: 8 of the 10 best schemes below"), verdict
