"""``walklens hellaswag``: JSON output, stored results reused, one-line errors; and, on the real SmolLM2, the
baseline's picks against full-sequence scoring and Test 1's token-level reproduction."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _ties import assert_picks_match
from _toy import cli_runner, write_toy
from oracles import reference_logliks
from walklens.analyses.concepts.schemes import Scheme
from walklens.lab.concepts import generation as t1
from walklens.lab.hellaswag.baseline import baseline_scores, item_tokens
from walklens.lab.hellaswag.data import fewshot_examples, load_hellaswag


@pytest.fixture
def run(capsys):
    return cli_runner(capsys)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    t = write_toy(tmp_path_factory.mktemp("hs"), rows=4)
    return t.dir, t.lm, t.dir / "toy.jsonl"


def test_baseline_test1_test2_json(toy, run):
    d, lm, data = toy
    db = d / "r.sqlite"
    common = ["--model", str(d / "model"), "--data", str(data), "--db", str(db), "--no-progress"]
    r = run("hellaswag", "baseline", *common, "--json", str(d / "b.json"))
    assert r.returncode == 0, r.stderr
    b = json.loads((d / "b.json").read_text())
    assert b["n"] == 4 and len(b["predictions"]) == 4 and set(b["predictions"][0]) == {"acc", "acc_norm"}
    items = load_hellaswag(data)
    chars = np.array([[len(e) for e in it.endings] for it in items], np.float64)
    ll = np.array([baseline_scores(lm, it) for it in items])
    got = [(p["acc"], p["acc_norm"]) for p in b["predictions"]]
    # the packed run's picks are per-item scoring's, but for float near-ties (tests/_ties.py)
    assert_picks_match([p[0] for p in got], ll, "baseline acc")
    assert_picks_match([p[1] for p in got], ll / chars, "baseline acc_norm")
    gold = [it.label for it in items]
    assert b["acc"] == sum(p[0] == g for p, g in zip(got, gold)) / 4
    assert b["acc_norm"] == sum(p[1] == g for p, g in zip(got, gold)) / 4

    r = run(
        "hellaswag",
        "test1",
        *common,
        "--limit",
        "3",
        "--shots",
        "1",
        "--json",
        str(d / "t1.json"),
        "--scheme",
        "enc=token_level,layer=E,word=last,norm=None,seg=None,ex=None",
    )
    assert r.returncode == 0, r.stderr
    t = json.loads((d / "t1.json").read_text())
    # token-level Test 1 is the baseline: its picks are the 1-shot baseline's (but for float near-ties), so
    # its accuracies are the baseline's and the normalised scores 1 (when the baseline is not 0)
    ll1 = np.array(
        [baseline_scores(lm, it, fewshot_examples(items, 1, it.index, query_split=it.split)) for it in items[:3]]
    )
    ties = assert_picks_match([p["acc"] for p in t["predictions"]], ll1, "token-level Test 1 acc") + assert_picks_match(
        [p["acc_norm"] for p in t["predictions"]], ll1 / chars[:3], "... acc_norm"
    )
    assert t["n"] == 3
    if not ties:
        assert t["acc"] == t["baseline"]["acc"] and t["acc_norm"] == t["baseline"]["acc_norm"]
    if t["baseline"]["acc"]:
        assert t["normalised"]["acc"] == pytest.approx(t["acc"] / t["baseline"]["acc"])

    r = run("hellaswag", "test2", *common, "--json", str(d / "t2.json"))
    assert r.returncode == 0, r.stderr
    t2 = json.loads((d / "t2.json").read_text())
    assert t2["scheme"] == str(Scheme.standard(2, "decoder")) and t2["computed"] == 4
    assert t2["baseline"] == {"acc": b["acc"], "acc_norm": b["acc_norm"]}
    r = run("hellaswag", "export", str(d / "all.csv"), "--db", str(db), "--test", "test2")
    assert r.returncode == 0 and len((d / "all.csv").read_text().splitlines()) == 1 + 4


def test_skip_and_the_paired_test(toy, run):
    """``--skip N`` scores items N.. (their stored results reused, under the same key), and the paired block is
    the McNemar count of the JSON's own picks against the baseline's on the same items."""
    d, _, data = toy
    common = ["--model", str(d / "model"), "--data", str(data), "--db", str(d / "skip.sqlite"), "--no-progress"]
    scheme = ["--scheme", "enc=concat_all_examples,layer=-1,word=mean,norm=None,seg=None,ex=None"]
    assert run("hellaswag", "test1", *common, *scheme, "--json", str(d / "all.json")).returncode == 0
    r = run("hellaswag", "test1", *common, *scheme, "--skip", "1", "--limit", "2", "--json", str(d / "s.json"))
    assert r.returncode == 0, r.stderr
    whole, part = (json.loads((d / f).read_text()) for f in ("all.json", "s.json"))
    assert part["n"] == 2 and part["computed"] == 0 and part["skip"] == 1
    assert part["predictions"] == whole["predictions"][1:3] and part["gold"] == whole["gold"][1:3]
    for metric in ("acc", "acc_norm"):
        got = [p[metric] == g for p, g in zip(part["predictions"], part["gold"])]
        base = [p[metric] == g for p, g in zip(part["baseline_predictions"], part["gold"])]
        pair = part["paired"][metric]
        assert pair["acc"] == part[metric] == sum(got) / 2 and pair["baseline"] == sum(base) / 2
        assert pair["paired"]["only_best"] == sum(a and not b for a, b in zip(got, base))
        assert pair["paired"]["only_base"] == sum(b and not a for a, b in zip(got, base))
    # the claims registry reads such a file as a scheme chosen elsewhere, scored on these items
    from walklens.lab.claims import Claim, assess

    c = Claim("x", "000", "says", "cmd", "s.json", "scheme_picks", {"metric": "acc_norm"}, "below_baseline")
    m, verdict = assess(c, d)
    pair = part["paired"]["acc_norm"]
    assert m is not None and (m.value, m.lo, m.hi, m.n) == (pair["acc"], pair["lo"], pair["hi"], 2)
    assert m.facts["paired_p"] == pair["paired"]["p"] and m.facts["baseline"] == pair["baseline"]
    assert verdict.startswith("not decided: the paired interval holds 0") or pair["paired"]["p"] < 0.05
    r = run("hellaswag", "test1", *common, "--skip", "4")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "leaves no item" in r.stderr


def test_a_run_split_by_item_ranges_stores_what_one_run_stores(toy, run):
    """A few-shot run split into ``--limit N`` and ``--skip N`` (two processes on one database, as the full-set
    Test 2 runs were made) stores each item's scores exactly as one run does: each item's examples are drawn from
    the whole file with a generator seeded by its own index, whichever items a run scores."""
    import sqlite3

    d, _, data = toy
    base = ["test2", "--model", str(d / "model"), "--data", str(data), "--shots", "2", "--no-progress"]
    assert run("hellaswag", *base, "--db", str(d / "whole.sqlite")).returncode == 0
    for part in (["--limit", "2"], ["--skip", "2"]):
        r = run("hellaswag", *base, "--db", str(d / "split.sqlite"), *part)
        assert r.returncode == 0, r.stderr

    def rows(db: str) -> list[tuple[object, ...]]:
        with sqlite3.connect(d / db) as c:
            return c.execute("SELECT test, item, pred, pred_norm, scores FROM results ORDER BY test, item").fetchall()

    whole = rows("whole.sqlite")
    assert len(whole) == 2 * 4 and rows("split.sqlite") == whole


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["test1", "--scheme", "enc=concat_each_example,layer=-1,word=mean,sim=dot"], "belong to Test 2"),
        (["test2", "--scheme", "enc=nope,layer=1,word=mean"], "invalid enc"),
        (["baseline", "--data", "BADFILE"], "bad.txt:2:"),
        (["baseline", "--data", "/no/such.jsonl"], "no such file"),
    ],
)
def test_errors_are_one_line(toy, run, extra, msg):
    d, _, _ = toy
    (d / "bad.txt").write_text("a: b\nx\ne\ne\ne\ne\n")
    extra = [str(d / "bad.txt") if x == "BADFILE" else x for x in extra]
    r = run("hellaswag", *extra[:1], "--model", str(d / "model"), *extra[1:], "--no-db", "--no-progress")
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("walklens:")]
    assert len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr


@pytest.mark.real
def test_real_baseline_and_token_level(smollm2):
    items = load_hellaswag(limit=2)
    for it in items:
        ctx, conts = item_tokens(smollm2, it, [])
        fast = baseline_scores(smollm2, it, [])
        assert fast == pytest.approx(reference_logliks(smollm2, ctx, conts), abs=1e-3, rel=1e-5)
        tok = Scheme(enc="token_level", layer="E", word="last", norm=None, seg=None, ex=None)
        assert t1.test1_scores(smollm2, it, [], tok) == pytest.approx(fast, abs=1e-3, rel=1e-5)


def test_other_modules_can_add_hellaswag_subcommands(monkeypatch):
    import pkgutil
    import sys
    import types

    from walklens.cli import build_parser, command_modules

    fake = types.ModuleType("walklens.cli.zz_fake")
    fake.register_hellaswag = lambda hs: hs.add_parser("fake").set_defaults(func=lambda a: 7)
    monkeypatch.setitem(sys.modules, "walklens.cli.zz_fake", fake)
    real = pkgutil.iter_modules
    monkeypatch.setattr(
        pkgutil,
        "iter_modules",
        lambda path=None, prefix="": list(real(path, prefix)) + [pkgutil.ModuleInfo(None, "zz_fake", False)],
    )
    command_modules.cache_clear()  # the command modules are found once per process: find them again
    try:
        args = build_parser().parse_args(["hellaswag", "fake"])
        assert args.func(args) == 7
    finally:
        command_modules.cache_clear()
