"""The dtype agreement study (issue 14, docs/dtype.md "Agreement study"): the paired interval against published
values, every figure on synthetic databases built with the store API where the answer is known by construction,
missing runs as one-line errors, and a tiny model run in float32 and bfloat16 end to end (CLI, then the
benchmark script, then the shell script that produces the study's runs)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from _toy import write_items
from walklens.analyses.concepts.schemes import Scheme
from walklens.base.errors import InputError
from walklens.lab.experiments.agreement import (
    Ranking,
    Scope,
    agreement_study,
    compare_runs,
    compare_sweeps,
    paired_difference,
)
from walklens.lab.hellaswag.store import ItemResult, ResultStore, RunKey, SweepRun, SweepStore

ROOT = Path(__file__).resolve().parents[1]
REF, BF = "m", "m@bfloat16"


def _script():
    spec = importlib.util.spec_from_file_location("agreement_bf16", ROOT / "benchmarks" / "agreement_bf16.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- the paired difference --------------------------------------------------------------------------------------


def test_newcombe_paired_interval_published_values() -> None:
    # Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables" (2017), ch. 8, Cavo et al. (2012):
    # table [[59, 6], [16, 80]]: Newcombe square-and-add -0.0621 (95% CI -0.1186 to -0.0046)
    d = paired_difference(both=59, only_reference=16, only_other=6, neither=80)
    assert (round(d.diff, 4), round(d.lo, 4), round(d.hi, 4)) == (-0.0621, -0.1186, -0.0046)
    assert (d.reference, d.other, d.n) == (75 / 161, 65 / 161, 161)
    # McNemar's exact test by hand: 2 P(X <= 6), X ~ Bin(22, 1/2)
    assert d.mcnemar_p == pytest.approx(2 * sum(math.comb(22, j) for j in range(7)) / 2**22, rel=1e-12)
    none = paired_difference(5, 0, 0, 5)
    assert (none.diff, none.mcnemar_p) == (0.0, 1.0) and none.lo < 0 < none.hi


def test_newcombe_equals_wald_for_large_samples() -> None:
    """At n = 10^6 the score interval is the Wald interval of a paired difference, sqrt((b + c)/n - d^2)/sqrt(n)."""
    both, b, c, nei = 400_000, 30_000, 20_000, 550_000
    n = both + b + c + nei
    d = paired_difference(both, b, c, nei)
    est = (c - b) / n
    half = 1.959963984540054 * math.sqrt((b + c) / n - est**2) / math.sqrt(n)
    assert d.diff == est
    assert d.lo == pytest.approx(est - half, rel=2e-3) and d.hi == pytest.approx(est + half, rel=2e-3)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(hst.integers(0, 60), hst.integers(0, 60), hst.integers(0, 60), hst.integers(0, 60))
def test_newcombe_interval_properties(a: int, b: int, c: int, d: int) -> None:
    if a + b + c + d == 0:
        assert math.isnan(paired_difference(a, b, c, d).diff)
        return
    p, q = paired_difference(a, b, c, d), paired_difference(a, c, b, d)
    assert -1 - 1e-12 <= p.lo <= p.diff <= p.hi <= 1 + 1e-12
    assert (q.lo, q.hi) == pytest.approx((-p.hi, -p.lo), abs=1e-12)  # swapping the dtypes negates the interval
    assert q.mcnemar_p == pytest.approx(p.mcnemar_p)


# ---- single runs on a synthetic database --------------------------------------------------------------------


def _key(model: str, test: str = "baseline", scheme: str = "baseline") -> RunKey:
    return RunKey(model=model, data="toy", split="validation", shots=0, test=test, scheme=scheme)


def _scores(pick: int, top: float = -1.0) -> tuple[float, ...]:
    return tuple(top if j == pick else -10.0 for j in range(4))


# 8 items, gold 0: float32 right on items 0-4; bfloat16 wrong on item 4, right on item 5, another wrong pick on 6
REF_PICKS = [0, 0, 0, 0, 0, 1, 1, 1]
BF_PICKS = [0, 0, 0, 0, 2, 0, 3, 1]
REF_NORM = [0, 0, 0, 1, 1, 1, 1, 1]
BF_NORM = [0, 0, 0, 1, 1, 1, 1, 0]


def _fill_runs(db: Path, n_bf: int = 8, test: str = "baseline", scheme: str = "baseline") -> None:
    with ResultStore(db) as st:
        for model, picks, norm, top in ((REF, REF_PICKS, REF_NORM, -1.0), (BF, BF_PICKS, BF_NORM, -1.25)):
            k = _key(model, test, scheme)
            rows = [ItemResult(i, 0, p, q, _scores(p, top)) for i, (p, q) in enumerate(zip(picks, norm))]
            st.add_results(k, rows[:n_bf] if model == BF else rows)
            st.record_run(k, len(rows), None, None)


def test_run_agreement_figures_known_by_construction(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    _fill_runs(db)
    with ResultStore(db, readonly=True) as st:
        r = compare_runs(st, _key(REF), _key(BF))
    acc, norm = r.picks
    assert (r.n, r.only_reference, r.only_other, acc.metric, norm.metric) == (8, 0, 0, "acc", "acc_norm")
    assert (acc.same, acc.share) == (5, 5 / 8)
    d = acc.difference
    assert (d.both, d.only_reference, d.only_other, d.neither) == (4, 1, 1, 2)
    assert (d.reference, d.other, d.diff) == (5 / 8, 5 / 8, 0.0)
    assert (d.lo, d.hi) == (paired_difference(4, 1, 1, 2).lo, paired_difference(4, 1, 1, 2).hi)
    assert (norm.same, norm.difference.reference, norm.difference.other) == (7, 3 / 8, 4 / 8)
    assert (norm.difference.only_reference, norm.difference.only_other) == (0, 1)
    s = r.scores
    # per ending: the picked ending moved from -1 (float32) to -1.25; where the pick changed, the float32 pick
    # fell from -1 to -10 (-9) and the bfloat16 pick rose from -10 to -1.25 (+8.75)
    assert (s.n_items, s.n_endings, s.max_abs) == (8, 32, 9.0)
    assert s.max_abs_item == 4 and s.n_flips == 3 and s.flip_gap_max == 9.0
    assert s.quantiles["q0"] == -9.0 and s.quantiles["q100"] == 8.75 and s.quantiles["q50"] == 0.0
    assert s.mean == pytest.approx((5 * -0.25 + 3 * (8.75 - 9.0)) / 32) and s.abs_quantiles["q100"] == 9.0


def test_items_limit_and_missing_runs_are_one_line_errors(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    _fill_runs(db, n_bf=6)
    with ResultStore(db, readonly=True) as st:
        r = compare_runs(st, _key(REF), _key(BF))  # the items both hold
        assert (r.n, r.only_reference, r.only_other) == (6, 2, 0)
        assert compare_runs(st, _key(REF), _key(BF), items=5).n == 5
        with pytest.raises(InputError, match=r"holds 6 of the first 8 items; run: X"):
            compare_runs(st, _key(REF), _key(BF), items=8, hints=("", "; run: X"))
        with pytest.raises(InputError, match=r"no stored test1 run of m \(0-shot, scheme s, data toy\)"):
            compare_runs(st, _key(REF, "test1", "s"), _key(BF, "test1", "s"))
    with pytest.raises(
        InputError,
        match=r"no stored baseline run of m@float16 .*walklens hellaswag baseline "
        r"--model m --dtype float16",
    ):
        agreement_study(db, "m", Scope("toy"), other="float16", parts=["baseline"])
    with pytest.raises(InputError, match="no such database"):
        agreement_study(tmp_path / "none.sqlite", "m", Scope("toy"))
    with pytest.raises(InputError, match="unknown part"):
        agreement_study(db, "m", Scope("toy"), parts=["baseline", "test3"])
    with pytest.raises(InputError, match="without a dtype"):
        agreement_study(db, "m@bfloat16", Scope("toy"))
    with pytest.raises(InputError, match="no Test 2 sweep of m "):
        agreement_study(db, "m", Scope("toy"), parts=["test2-grid"])
    ok = agreement_study(db, "m", Scope("toy", items=6), parts=["baseline"])
    assert ok.baseline.n == 6 and ok.test2_grid is None
    sc = _script()
    assert sc.main(["--db", str(db), "--model", "m", "--data", str(ROOT / "README.md"), "--parts", "baseline"]) == 2


# ---- sweeps on a synthetic database ---------------------------------------------------------------------------

N_ITEMS = 20
LABELS = np.zeros(N_ITEMS, np.uint8)


def _preds(hits: int, extra: int = 0) -> np.ndarray:
    """Right (pick 0) on the first ``hits`` items, wrong (pick 1, or 2 after ``extra`` more items) elsewhere."""
    p = np.ones(N_ITEMS, np.uint8)
    p[:hits] = 0
    p[hits : hits + extra] = 2
    return p


def _sweep_db(db: Path, test: int, ref_preds: dict[str, np.ndarray], bf_preds: dict[str, np.ndarray]) -> None:
    """Two sweep runs over the same items; a scheme's predictions ``[metrics, items]`` under its name."""
    with SweepStore(db) as st:
        for model, preds in ((REF, ref_preds), (BF, bf_preds)):
            run = SweepRun(
                model=model,
                data="toy",
                split="validation",
                shots=0,
                test=test,
                labels=LABELS,
                item_index=range(N_ITEMS),
                arch="decoder",
                n_layers=2,
            )
            rid = st.run_id(run)
            groups: dict[str, list[tuple[str, np.ndarray]]] = {}
            for name, p in preds.items():
                s = Scheme.parse(name)
                groups.setdefault(s.context_part(), []).append((s.out_part(), p))
            for ctx, members in groups.items():
                st.put_groups(
                    rid,
                    [(ctx, [o for o, _ in members], np.stack([p for _, p in members], axis=1))],
                    ["acc"] if test == 2 else ["acc", "acc_norm"],
                    LABELS,
                    0.0,
                )


def _test2_names() -> list[str]:
    """Ten Test 2 schemes (5 contexts x 2 choice encodings) in the order the store keeps them (by context)."""
    std = Scheme.standard(2, "decoder")
    layers = sorted(["-1", "0", "E", "middle", "-2"], key=lambda l: replace(std, layer=l).context_part())
    return [str(replace(std, layer=l, out_layer=o)) for l in layers for o in ("-1", "0")]


def test_grid_agreement_figures_known_by_construction(tmp_path: Path) -> None:
    names = _test2_names()
    hits = [19, 17, 15, 13, 11, 9, 7, 5, 3, 1]
    ref = {n: _preds(h)[None] for n, h in zip(names, hits)}
    bf = dict(ref)
    bf[names[0]] = _preds(14)[None]  # the best scheme loses 5 items: third in bfloat16
    bf[names[9]] = _preds(2)[None]  # the worst gains one
    extra = str(replace(Scheme.parse(names[0]), sim="cosine"))
    ref[extra] = _preds(20)[None]  # a group stored for float32 only (a sweep still running): left out
    db = tmp_path / "s.sqlite"
    _sweep_db(db, 2, ref, bf)
    with SweepStore(db, readonly=True) as st:
        g = compare_sweeps(st, REF, BF, 2, Scope("toy", shots=0), ranking=Ranking(best=3))
    assert (g.n_items, g.n_schemes, g.only_reference, g.only_other) == (20, 10, 1, 0)
    (m,) = g.metrics
    assert (m.metric, m.moved, m.share_moved) == ("acc", 2, 0.2)
    assert m.max_move == pytest.approx(0.25) and m.mean_abs_move == pytest.approx(0.03)
    assert m.same_picks == pytest.approx((15 + 19 + 8 * 20) / 200) and m.min_same_picks == 0.75
    assert m.spearman == pytest.approx(1 - 6 * 6 / (10 * 99))  # rank differences 2, 1, 1
    assert m.kendall == pytest.approx((43 - 2) / 45)  # 2 discordant pairs of 45
    top = {t.k: t for t in m.top_k}
    assert set(top) == {1, 5} and not top[1].same_set and not top[1].same_up_to_ties and top[1].overlap == 0
    assert top[5].same_set and top[5].distinct_reference == 5
    assert [s.scheme for s in m.best] == names[:3]
    b0 = m.best[0]
    assert (b0.reference, b0.other, b0.rank_reference, b0.rank_other, b0.same_picks) == (0.95, 0.7, 1, 3, 0.75)
    assert (b0.difference.both, b0.difference.only_reference, b0.difference.only_other) == (14, 5, 0)
    assert (m.best_other.scheme, m.best_other.rank_reference, m.best_other.rank_other) == (names[1], 2, 1)


def test_grid_ties_and_test1_metrics(tmp_path: Path) -> None:
    """Tied schemes: the best 3 differ by stored order but not up to ties; identical schemes count once;
    Test 1's cross_encoding (the baseline) is left out; both metrics are compared."""
    std = Scheme.standard(1, "decoder")
    names = sorted(str(replace(std, layer=l)) for l in ("-1", "-2", "0", "E"))
    base = "enc=cross_encoding,layer=E,word=last,norm=None,seg=None,ex=None"
    ref_h, bf_h = [10, 10, 9, 9], [10, 10, 8, 9]
    ref = {n: np.stack([_preds(h), _preds(h)]) for n, h in zip(names, ref_h)}
    bf = {n: np.stack([_preds(h), _preds(h, extra=1)]) for n, h in zip(names, bf_h)}
    ref[base] = bf[base] = np.stack([_preds(20), _preds(20)])
    db = tmp_path / "s.sqlite"
    _sweep_db(db, 1, ref, bf)
    with SweepStore(db, readonly=True) as st:
        g = compare_sweeps(st, REF, BF, 1, Scope("toy", shots=0), ranking=Ranking(ks=(1, 3)))
    assert g.n_schemes == 4 and [m.metric for m in g.metrics] == ["acc", "acc_norm"]
    for m in g.metrics:
        t1, t3 = m.top_k
        assert t1.same_set and t1.same_up_to_ties and t1.distinct_reference == 1
        assert not t3.same_set and t3.overlap == 2 and t3.same_up_to_ties and t3.distinct_reference == 2
    acc, norm = g.metrics
    assert acc.same_picks == pytest.approx(1 - 1 / 80)  # one pick of one scheme changed
    assert norm.same_picks == pytest.approx(1 - 4 / 80) and norm.moved == acc.moved == 1  # + 3 wrong picks


# ---- end to end: a tiny model in float32 and bfloat16 ---------------------------------------------------------


ITEMS = [
    ("the man runs to the city", ["the king eats.", "a dog walks.", "she ran to the river.", "they walk."], 2),
    ("the queen walks to the river", ["and the king ran.", "the dog eats.", "paris.", "a man runs."], 0),
    ("a dog eats the", ["city.", "river and the king.", "man runs.", "queen walks to paris."], 1),
    ("the boy ran to paris", ["the city.", "and she walks.", "a king eats the dog.", "the river."], 3),
    ("she walks and the man", ["runs.", "eats the dog.", "ran to the city of paris.", "walks."], 0),
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> tuple[Path, Path]:
    from walklens.testing import tiny_model

    d = tmp_path_factory.mktemp("agree")
    lm = tiny_model("llama")
    lm.model.save_pretrained(d / "tiny")
    lm.tokenizer.save_pretrained(d / "tiny")
    write_items(d / "items.jsonl", [("walks", ctx, "", endings, label) for ctx, endings, label in ITEMS])
    (d / "t1.toml").write_text(
        'layers = ["E", "-1"]\nword = ["last", "w1mean"]\nnorm = ["None"]\nseg = ["mean"]\nex = ["mean"]\n',
        encoding="utf-8",
    )
    (d / "t2.toml").write_text(
        'layers = ["E", "-1"]\nword = ["mean", "last"]\nnorm = ["None"]\nout_word = ["mean"]\n'
        'seg = ["mean"]\nex = ["mean"]\n',
        encoding="utf-8",
    )
    return d / "tiny", d


def test_tiny_model_end_to_end(tiny_dir: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from walklens.cli import main
    from walklens.lab.experiments.grid import GridSpec
    from walklens.lab.hellaswag.data import data_id

    model, d = tiny_dir
    db = tmp_path / "a.sqlite"
    for dtype in ("float32", "bfloat16"):
        common = [
            "--model",
            str(model),
            "--dtype",
            dtype,
            "--data",
            str(d / "items.jsonl"),
            "--limit",
            "5",
            "--db",
            str(db),
            "--no-progress",
        ]
        assert main(["hellaswag", "baseline", *common]) == 0
        assert main(["hellaswag", "test1", *common]) == 0
        assert main(["sweep", "--test", "2", "--grid", str(d / "t2.toml"), *common]) == 0
        assert main(["sweep", "--test", "1", "--grid", str(d / "t1.toml"), *common]) == 0
    capsys.readouterr()
    out = tmp_path / "agree.json"
    sc = _script()
    assert (
        sc.main(
            [
                "--db",
                str(db),
                "--model",
                str(model),
                "--data",
                str(d / "items.jsonl"),
                "--limit",
                "5",
                "--json",
                str(out),
                "--out",
                str(tmp_path / "agree.md"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "### Baseline" in text and "### Test 2 sweep" in text and "### Test 1 sweep" in text
    (s,) = json.loads(out.read_text())["studies"]
    assert s["other"] == f"{model}@bfloat16" and s["items"] == 5
    # the figures are the stored runs' own
    did = data_id(str(d / "items.jsonl"))
    with ResultStore(db, readonly=True) as st:
        f32 = st.results(RunKey(str(model), did, "validation", 0, "baseline", "baseline"))
        b16 = st.results(RunKey(f"{model}@bfloat16", did, "validation", 0, "baseline", "baseline"))
    same = sum(f32[i].pred == b16[i].pred for i in range(5))
    diffs = np.array([np.subtract(b16[i].scores, f32[i].scores) for i in range(5)])
    assert s["baseline"]["picks"][0]["same"] == same
    assert s["baseline"]["scores"]["max_abs"] == pytest.approx(float(np.abs(diffs).max()), rel=1e-12)
    assert 0 < s["baseline"]["scores"]["max_abs"] < 1.0  # bfloat16 really ran, and stayed close
    assert s["test1_standard"]["scheme"] == str(Scheme.standard(1, "decoder"))
    for test, part in ((2, "test2_grid"), (1, "test1_grid")):
        schemes, _ = GridSpec.from_toml(d / f"t{test}.toml", test, "decoder").enumerate("decoder")
        assert s[part]["n_schemes"] == len([x for x in schemes if x.enc != "cross_encoding"]) > 10
    assert (tmp_path / "agree.md").read_text().strip() == text.strip()
    # a missing dtype, a bad output path: one line each, exit 2
    assert (
        sc.main(["--db", str(db), "--model", str(model), "--data", str(d / "items.jsonl"), "--other", "float16"]) == 2
    )
    assert sc.main(["--db", str(db), "--model", str(model), "--out", str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as e:
        sc.main(["--db", str(db), "--limit", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("walklens: error: ") for line in err)
    assert "no stored baseline run of" in err[0] and "--dtype float16" in err[0]


@pytest.mark.slow
def test_shell_script_runs_the_study_and_resumes(tiny_dir: tuple[Path, Path], tmp_path: Path) -> None:
    model, d = tiny_dir
    env = {
        **os.environ,
        "N": "4",
        "MODELS": str(model),
        "DB": str(tmp_path / "s.sqlite"),
        "DATA": str(d / "items.jsonl"),
        "T1_GRID": str(d / "t1.toml"),
        "T2_GRID": str(d / "t2.toml"),
        "OUT": str(tmp_path / "s.md"),
        "JSON": str(tmp_path / "s.json"),
        "EXTRA": "--no-progress",
        "WALKLENS": f"{sys.executable} -m walklens",
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    script = ROOT / "benchmarks" / "agreement_bf16.sh"
    first = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-2000:]
    (s,) = json.loads((tmp_path / "s.json").read_text())["studies"]
    assert s["items"] == 4 and s["baseline"]["n"] == 4 and s["test1_grid"]["n_items"] == 4
    again = subprocess.run(
        ["bash", str(script)],
        env={**env, "STEPS": "test2-grid"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert again.returncode == 0 and again.stdout.count("0 groups computed now") == 2  # resumed: nothing new
    assert json.loads((tmp_path / "s.json").read_text())["studies"][0]["baseline"] is None  # only the steps run
    bad = subprocess.run(
        ["bash", str(script)], env={**env, "STEPS": "test3"}, capture_output=True, text=True, timeout=900
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("walklens: error: unknown step")
