"""The controls of Tests 1 and 2 (walklens.lab.concepts.controls; docs/claims.md, "Controls") and `walklens hellaswag
folds`, the k-fold held-out best of a committed sweep item by item beside the baseline and the controls."""

from __future__ import annotations

import json

import pytest
import torch

from _toy import ROWS, cli_runner, write_items, write_toy
from walklens.analyses.concepts.schemes import Scheme
from walklens.cli import hellaswag as cli
from walklens.lab.concepts import controls as ctl
from walklens.lab.concepts.generation import concept_sequence
from walklens.lab.hellaswag.data import load_hellaswag
from walklens.lab.hellaswag.store.counts import kfold_folds

T1 = "enc=concat_all_examples,layer=-1,word=w1mean,norm=None,seg=None,ex=None"
T2 = "enc=concat_all_examples,layer=-1,word=mean,norm=None,seg=None,ex=None,sim=cosine,out_layer=-1,out_word=mean"


@pytest.mark.parametrize("n", [2, 7, 200, 401, 450])
def test_the_shuffled_donor_is_another_item_of_the_same_block_and_a_permutation(n: int) -> None:
    donors = [ctl.donor_index(i, n) for i in range(n)]
    assert all(d != i for i, d in enumerate(donors))  # nobody is its own donor
    assert sorted(donors) == list(range(n))  # a bijection (401: the last item joins the block before)
    assert all(min(d // 200, 1) == min(i // 200, 1) for i, d in enumerate(donors)) if n == 401 else True
    assert all(d // 200 == i // 200 for i, d in enumerate(donors)) or n == 401
    assert donors == [ctl.donor_index(i, n) for i in range(n)]  # fixed


def test_random_directions_keep_each_vector_norm_and_follow_the_item() -> None:
    x = torch.randn(5, 16)
    r = ctl.random_like(x, 3)
    assert torch.allclose(r.norm(dim=-1), x.norm(dim=-1)) and not torch.allclose(r, x)
    assert torch.equal(r, ctl.random_like(x, 3)) and not torch.equal(r, ctl.random_like(x, 4))


def test_the_cli_offers_the_controls_the_library_has() -> None:
    assert cli.CONTROLS == ctl.CONTROLS


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("controls")
    t = write_toy(d)
    write_items(d / "ten.jsonl", [*ROWS, *ROWS[:4]])
    return t


def test_each_control_replaces_the_concept_vectors_as_documented(toy) -> None:
    items = load_hellaswag(toy.data)
    scheme = Scheme.from_spec(T1, 1, "decoder")
    own = [concept_sequence(toy.lm, it, [], scheme) for it in items[:2]]
    ending = ctl.make_control("ending", items, lambda it: [])
    neutral = [concept_sequence(toy.lm, it, [], scheme, control=ending) for it in items[:2]]
    assert torch.equal(neutral[0], neutral[1]) and not torch.equal(own[0], own[1])  # every item sees the same
    shuffled = ctl.make_control("shuffled", items, lambda it: [])
    donor = items[ctl.donor_index(0, len(items))]
    donor_own = concept_sequence(toy.lm, donor, [], scheme)
    assert donor.index != 0 and torch.equal(concept_sequence(toy.lm, items[0], [], scheme, control=shuffled), donor_own)
    rnd = concept_sequence(toy.lm, items[0], [], scheme, control=ctl.make_control("random", items, lambda it: []))
    assert torch.allclose(rnd.norm(dim=-1), own[0].norm(dim=-1), rtol=1e-5) and not torch.allclose(rnd, own[0])


def test_a_control_run_is_stored_apart_and_scores_the_same_items(toy, capsys) -> None:
    run = cli_runner(capsys)
    d = toy.dir
    common = ["--model", toy.model, "--data", toy.data, "--db", str(d / "c.sqlite"), "--no-progress"]
    for test, scheme in (("test1", T1), ("test2", T2)):
        plain = run("hellaswag", test, *common, "--scheme", scheme, "--json", str(d / "p.json"))
        shuf = run("hellaswag", test, *common, "--scheme", scheme, "--control", "shuffled", "--json", str(d / "s.json"))
        assert plain.returncode == 0 == shuf.returncode, shuf.stderr
        p, s = (json.loads((d / f).read_text()) for f in ("p.json", "s.json"))
        assert s["scheme"] == f"control=shuffled;{p['scheme']}" and p["gold"] == s["gold"]
        assert s["computed"] == len(ROWS)  # not read back from the plain run's rows: its own key
    bad = run("hellaswag", "test1", *common, "--scheme", T1, "--control", "nothing")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def _summary(path, schemes: list[str]) -> None:
    metric = {"baseline": 0.5, "kfold": {"acc": 0.0, "lo": 0.0, "hi": 0.1, "fold_schemes": schemes}}
    run = {"model": "tiny", "test": 1, "shots": 0, "n_items": 10, "n_schemes": 2, "metrics": {"acc": metric}}
    path.write_text(json.dumps([run]), encoding="utf-8")


def test_folds_rescore_each_fold_with_its_scheme_beside_the_baseline_and_the_controls(toy, capsys) -> None:
    run = cli_runner(capsys)
    d = toy.dir
    other = T1.replace("layer=-1", "layer=0")
    _summary(d / "summary.json", [T1, other, T1, T1, other])
    args = ["hellaswag", "folds", "--summary", str(d / "summary.json"), "--test", "1", "--summary-model", "tiny",
            "--model", toy.model, "--data", str(d / "ten.jsonl"), "--limit", "10", "--db", str(d / "f.sqlite"),
            "--no-progress", "--json", str(d / "folds.json")]  # fmt: skip
    r = run(*args)
    assert r.returncode == 0, r.stderr
    doc = json.loads((d / "folds.json").read_text())
    assert set(doc["controls"]) == set(ctl.CONTROLS) and len(doc["gold"]) == 10 == len(doc["heldout"]["acc"])
    one = json.loads(run("hellaswag", "test1", "--model", toy.model, "--data", str(d / "ten.jsonl"), "--scheme", other,
                         "--no-db", "--no-progress", "--json", str(d / "o.json")).returncode and "{}" or
                     (d / "o.json").read_text())  # fmt: skip
    fold1 = kfold_folds(10, 5, 0)[1]
    assert all(doc["heldout"]["acc"][i] == str(one["predictions"][i]["acc"]) for i in fold1)  # fold 1: its scheme
    again = sum(a == g for a, g in zip(doc["heldout"]["acc"], doc["gold"])) / 10
    assert doc["kfold_acc"]["acc"] == again and doc["kfold_acc_report"]["acc"] == 0.0


def test_the_reserved_pool_is_a_fixed_tenth_never_scored_in_a_run_that_draws_from_it(toy, capsys) -> None:
    """Issue 54: few-shot examples from items never scored in the same run; the baseline both ways compared."""
    from walklens.lab.hellaswag.data import fewshot_pool, reserved, scored_items

    d = toy.dir
    data = write_items(d / "twenty.jsonl", [*ROWS, *ROWS, *ROWS, *ROWS[:2]])
    items = load_hellaswag(data)
    assert [it.index for it in items if reserved(it.index)] == [9, 19]
    pool = fewshot_pool(data, items, 2, len(items), "reserved")
    assert [it.index for it in pool] == [9, 19] and fewshot_pool(data, items, 2, len(items)) == items
    assert [it.index for it in scored_items(items, 2, "reserved")] == [i for i in range(20) if i not in (9, 19)]
    assert scored_items(items, 0, "reserved") == items  # zero-shot draws nothing
    run = cli_runner(capsys)
    common = ["--model", toy.model, "--data", str(data), "--db", str(d / "pool.sqlite"), "--no-progress"]
    common += ["--shots", "2"]
    r = run("hellaswag", "baseline", *common, "--pool", "reserved", "--json", str(d / "r.json"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((d / "r.json").read_text())
    assert doc["n"] == 18 and doc["data"].endswith("#pool=reserved")
    r = run("hellaswag", "pools", *common, "--json", str(d / "pools.json"))
    assert r.returncode == 0, r.stderr
    both = json.loads((d / "pools.json").read_text())
    assert both["n"] == 18 and 9 not in both["items"] and set(both["picks"]) == {"validation", "reserved"}
    ok = {k: [p["acc"] == g for p, g in zip(v, both["gold"])] for k, v in both["picks"].items()}
    assert both["acc"]["diff"] == (sum(ok["reserved"]) - sum(ok["validation"])) / 18
    assert both["acc"]["reserved"] == sum(p["acc"] == g for p, g in zip(doc["predictions"], doc["gold"])) / 18
