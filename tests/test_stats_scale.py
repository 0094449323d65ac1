"""Sweep statistics at the scale of the whole HellaSwag validation set (10,042 items): chance_max and Wilson
intervals without overflow (checked against the exact formula, Monte Carlo and scipy), the streamed report
path equal to the dense statistics, its memory bounded, and the report's k-fold label."""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

from walklens.lab.experiments import stats
from walklens.lab.hellaswag.store import SweepRun, SweepStore, counts

N_HELLASWAG = 10_042


# ---- chance_max and wilson -----------------------------------------------------------------------------------


def _chance_max_exact(S: int, n: int, p: float) -> float:
    """The previous closed form with exact binomial coefficients (overflows a float past n ~ 1,100)."""
    pmf = [math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(n + 1)]
    cdf, e = 0.0, 0.0
    for kk in range(1, n + 1):
        cdf += pmf[kk - 1]
        e += 1.0 - min(cdf, 1.0) ** S
    return e / n


@pytest.mark.parametrize("n", [1, 7, 100, 500])
@pytest.mark.parametrize("S", [1, 10, 4000, 726_000])
@pytest.mark.parametrize("p", [0.25, 0.5])
def test_chance_max_equals_the_exact_formula_where_it_does_not_overflow(n: int, S: int, p: float) -> None:
    assert stats.chance_max(S, n, p) == pytest.approx(_chance_max_exact(S, n, p), rel=1e-9, abs=1e-12)


def test_chance_max_at_full_hellaswag_scale() -> None:
    n, p = N_HELLASWAG, 0.25
    with pytest.raises(OverflowError):  # what `walklens report` died of
        _chance_max_exact(10, n, p)
    assert stats.chance_max(1, n, p) == pytest.approx(p, abs=1e-12)  # one scheme: E[X/n] = p exactly
    values = [stats.chance_max(S, n, p) for S in (10, 1000, 726_000, 10**9)]
    assert all(p < v < 1 for v in values) and values == sorted(values)  # between p and 1, growing with S
    assert stats.chance_max(726_000, 10**7, p) == pytest.approx(p, abs=0.002)  # far beyond: still finite
    rng = np.random.default_rng(0)
    for S, R in ((2000, 300), (726_000, 12)):
        # Monte Carlo: R draws of the best of S independent Binomial(n, p) accuracies; tolerance 5 standard
        # errors of the mean of the R draws plus one item (1/n).
        best = np.array([rng.binomial(n, p, size=S).max() for _ in range(R)]) / n
        tol = 5 * best.std(ddof=1) / math.sqrt(R) + 1 / n
        assert abs(stats.chance_max(S, n, p) - best.mean()) < tol, (S, best.mean(), tol)


@pytest.mark.parametrize("n", [N_HELLASWAG, 726_000 * 10, 10**12])
def test_wilson_at_large_n_equals_scipy(n: int) -> None:
    for k in (0, 1, n // 4, n // 2, n - 1, n):
        ci = binomtest(k, n).proportion_ci(method="wilson")
        lo, hi = stats.wilson(k, n)
        assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12), (k, n)


# ---- the streamed report path equals the dense statistics -----------------------------------------------------


def _oracle(correct: np.ndarray, names: list[str], k: int, seed: int) -> dict:
    """The dense statistics, straight from their definitions (the previous implementation)."""
    n = correct.shape[1]
    sums = correct.sum(1)
    i = int(np.argmax(sums))
    a, b = counts.split_items(n, seed)
    split = []
    for sel, ev in ((a, b), (b, a)):
        j = int(np.argmax(correct[:, sel].sum(1)))
        split.append((names[j], int(correct[j, ev].sum()) / len(ev)))
    hits, chosen = 0, []
    for f in counts.kfold_folds(n, k, seed):
        j = int(np.argmax(sums - correct[:, f].sum(1)))
        hits += int(correct[j, f].sum())
        chosen.append(names[j])
    return {"in_sample": (names[i], sums[i] / n), "split": split, "kfold": (hits / n, chosen), "acc": sums / n}


def _store(
    path: Path, n: int, groups: int, outs: int, metrics: list[str], seed: int = 0, plant: bool = True
) -> tuple[int, np.ndarray]:
    """A synthetic sweep database: random predictions (one scheme perfect when ``plant``)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n).astype(np.uint8)
    test = 1 if len(metrics) == 2 else 2
    with SweepStore(path) as st:
        run = SweepRun(
            model="m",
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
        st.set_baseline(rid, 0.3, 0.3, np.zeros((2, n), np.uint8))
        for g in range(groups):
            preds = rng.integers(0, 4, (len(metrics), outs, n)).astype(np.uint8)
            if plant and g == groups // 2:
                preds[:, 0] = labels  # the first scheme of the middle group
            ctx = (
                "enc=cross_encoding,layer=E,word=last,norm=None,seg=None,ex=None"
                if test == 1 and g == 0
                else f"enc=concat_each_example,layer={g},word=mean,norm=None,seg=mean,ex=mean"
                + (",sim=dot" if test == 2 else "")
            )
            names = [f"out_layer={o},out_word=mean" for o in range(outs)] if test == 2 else [""]
            st.put_groups(rid, [(ctx, names, preds)], metrics, labels, 0.0)
    return rid, labels


@pytest.mark.parametrize(
    "n,k,seed,metrics,outs",
    [(103, 5, 0, ["acc"], 7), (37, 3, 4, ["acc", "acc_norm"], 1), (10, 10, 1, ["acc"], 3), (4, 5, 2, ["acc"], 2)],
)
def test_streamed_statistics_equal_the_dense_ones(
    tmp_path: Path, n: int, k: int, seed: int, metrics: list[str], outs: int
) -> None:
    from walklens.base.outputs import jsonable
    from walklens.lab.experiments.summary import summarise_run

    rid, labels = _store(tmp_path / "s.sqlite", n, 40, outs, metrics, seed=seed)
    with SweepStore(tmp_path / "s.sqlite", readonly=True) as st:
        dense = st.load(rid)
        streamed = [st.load_counts(rid, k=k, seed=seed, chunk=c) for c in (1, 5, None)]
    ref = jsonable(summarise_run(dense, k=k, seed=seed))
    for res in streamed:  # any chunking: the very same summary (floats included)
        assert res.preds is None and res.hits.shape == (len(metrics), len(dense.schemes), 2 * min(k, n))
        assert json.dumps(jsonable(summarise_run(res, k=k, seed=seed))) == json.dumps(ref)
    keep = [i for i, s in enumerate(dense.schemes) if not s.startswith("enc=cross_encoding,")]
    names = [dense.schemes[i] for i in keep]
    for metric in metrics:  # ... and it is the definition's
        o = _oracle(dense.correct(metric)[keep], names, min(k, n), seed)
        m = ref["metrics"][metric]
        assert (m["in_sample"]["scheme"], m["in_sample"]["acc"]) == o["in_sample"]
        assert [(s["scheme"], s["acc"]) for s in m["split"]] == o["split"]
        assert (m["kfold"]["acc"], list(m["kfold"]["fold_schemes"])) == o["kfold"]
        assert m["distribution"] == stats.distribution(o["acc"], n)
        lo, hi = stats.wilson(round(o["kfold"][0] * n), n)
        assert (m["kfold"]["lo"], m["kfold"]["hi"]) == (lo, hi)
        acc = dense.acc[dense.metrics.index(metric)].astype(np.float64)[keep]
        groups: dict = {}  # marginals by their definition: the schemes holding each parameter value
        for i, nm in enumerate(names):
            for part in nm.split(","):
                key, v = part.split("=", 1)
                groups.setdefault(key, {}).setdefault(v, []).append(i)
        assert {
            key: [(r["value"], r["n"], r["mean"], r["best"]) for r in rows] for key, rows in m["marginals"].items()
        } == {
            key: [(v, len(ix), float(acc[ix].mean()), float(acc[ix].max())) for v, ix in vals.items()]
            for key, vals in groups.items()
        }


@pytest.mark.slow
def test_report_on_full_width_store_has_bounded_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 schemes x 10,042 items (the dense matrix: 200 MB of predictions and 200 MB of booleans): the
    streamed statistics stay within a fraction of that, over many chunks, and are exact (every scheme's hit
    count equals the accuracy stored with its predictions; the planted perfect scheme wins every estimate)."""
    from walklens.base.outputs import jsonable
    from walklens.lab.experiments.summary import summarise_run

    n, outs, groups = N_HELLASWAG, 50, 400
    rid, labels = _store(tmp_path / "big.sqlite", n, groups, outs, ["acc"])
    from walklens.lab.hellaswag.store import sweeps

    calls = []
    monkeypatch.setattr(sweeps, "count_cells", lambda *a, **kw: calls.append(1) or counts.count_cells(*a, **kw))
    with SweepStore(tmp_path / "big.sqlite", readonly=True) as st:
        tracemalloc.start()
        res = st.load_counts(rid, k=5, chunk=200)
        summ = summarise_run(res)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    summ = jsonable(summ)
    S = groups * outs
    dense_bytes = S * n  # one byte per prediction, before any boolean or float copy
    assert len(calls) >= S // 250  # many chunks (each at least a group of 50, at least 200 schemes)
    assert peak < dense_bytes / 8, f"peak {peak / 2**20:.1f} MiB"
    totals = res.hits[0].sum(axis=1)
    assert np.array_equal((totals / n).astype(np.float32), res.acc[0])  # exact counts for all 20,000 schemes
    m = summ["metrics"]["acc"]
    g = groups // 2
    planted = (
        f"enc=concat_each_example,layer={g},word=mean,norm=None,seg=mean,ex=mean,sim=dot,out_layer=0,out_word=mean"
    )
    assert m["in_sample"]["scheme"] == planted and m["in_sample"]["acc"] == 1.0
    assert set(m["kfold"]["fold_schemes"]) == {planted} and m["kfold"]["acc"] == 1.0
    assert all(s["scheme"] == planted and s["acc"] == 1.0 for s in m["split"])
    assert abs(m["distribution"]["quantiles"]["q50"] - 0.25) < 0.01 and m["distribution"]["n_schemes"] == S


def test_report_shows_the_real_number_of_folds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from walklens.cli import main

    _store(tmp_path / "r.sqlite", 30, 6, 3, ["acc"])
    assert main(["report", "--db", str(tmp_path / "r.sqlite"), "--out", str(tmp_path / "rep"), "--folds", "3"]) == 0
    out = tmp_path / "rep"
    md, csv_head = (out / "summary.md").read_text(), (out / "summary.csv").read_text().splitlines()[0]
    html = (out / "index.html").read_text()
    assert "3-fold held-out" in md and "3-fold held-out" in csv_head and "3-fold held-out (pooled)" in html
    assert "5-fold" not in md + csv_head + html
    assert json.loads((out / "summary.json").read_text())[0]["metrics"]["acc"]["kfold"]["k"] == 3
