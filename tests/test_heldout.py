"""The held-out best's statistics (walklens.lab.experiments.heldout) against independent oracles: a brute-force
enumeration of the sign test, scipy's exact binomial interval, the k-fold estimate itself, and a bootstrap that
physically resamples items."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

from walklens.lab.experiments.heldout import (
    _replicate_scores,
    _weights,
    bootstrap_heldout,
    candidates,
    corrected,
    corrected_interval,
    kfold_picks,
    paired_test,
    sign_test_p,
)
from walklens.lab.experiments.stats import kfold_from
from walklens.lab.hellaswag.store.counts import Cells, cell_counts


def _brute_p(b: int, c: int) -> float:
    """Two-sided sign test by enumerating every sign assignment of the b + c discordant pairs."""
    m = b + c
    if m == 0:
        return 1.0
    obs = min(b, c)
    tail = sum(1 for s in itertools.product((0, 1), repeat=m) if sum(s) <= obs)
    return float(min(Fraction(1), 2 * Fraction(tail, 2**m)))


@pytest.mark.parametrize("b,c", [(b, c) for b in range(7) for c in range(7)])
def test_sign_test_matches_enumeration(b: int, c: int) -> None:
    assert sign_test_p(b, c) == pytest.approx(_brute_p(b, c), abs=1e-12)


def test_paired_interval_is_scipy_exact_and_agrees_with_p() -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(5, 300))
        a, z = rng.random(n) < rng.random(), rng.random(n) < rng.random()
        r = paired_test(a, z)
        b, c = int((a & ~z).sum()), int((~a & z).sum())
        assert (r.only_best, r.only_base, r.n) == (b, c, n)
        assert r.diff == pytest.approx(a.mean() - z.mean())
        if b + c:
            ci = binomtest(b, b + c).proportion_ci(method="exact")
            assert r.lo == pytest.approx((2 * ci.low - 1) * (b + c) / n, abs=1e-9)
            assert r.hi == pytest.approx((2 * ci.high - 1) * (b + c) / n, abs=1e-9)
            assert (r.lo > 0 or r.hi < 0) == (r.p < 0.05)  # the interval and the test say the same
        assert r.lo <= r.diff <= r.hi


def _grid(S: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    skill = rng.uniform(0.2, 0.5, S)
    return rng.random((S, n)) < skill[:, None], rng.random(n) < 0.4


def test_kfold_picks_reproduce_the_kfold_estimate() -> None:
    correct, _ = _grid(40, 97, 0)
    counts = cell_counts(correct, Cells.build(97, 5, seed=2))
    picks = kfold_picks(counts, {i: correct[i] for i in range(40)})
    assert picks.mean() == pytest.approx(kfold_from(counts, [str(i) for i in range(40)]).acc)


def _brute_replicate(correct: np.ndarray, w: np.ndarray, fold: np.ndarray, k: int) -> float:
    idx = np.repeat(np.arange(correct.shape[1]), w)  # the resampled items, physically
    x, f_of = correct[:, idx], fold[idx]
    hits = 0
    for f in range(k):
        train = x[:, f_of != f].sum(axis=1)
        i = int(np.argmax(train))
        hits += int(x[i, f_of == f].sum())
    return hits


def test_bootstrap_replicates_match_physical_resampling() -> None:
    correct, _ = _grid(30, 61, 1)
    w, fold = _weights(61, 4, 25, np.random.default_rng(9))
    assert (w.sum(axis=1) == 61).all()
    fast = _replicate_scores(correct, w, fold, 4, batch=7)
    slow = [_brute_replicate(correct, w[r], fold[r], 4) for r in range(25)]
    np.testing.assert_array_equal(fast, slow)


def test_bootstrap_is_seeded_and_carries_the_baseline() -> None:
    correct, base = _grid(50, 200, 4)
    a = bootstrap_heldout(correct, base, k=5, replicates=60, seed=1)
    assert a == bootstrap_heldout(correct, base, k=5, replicates=60, seed=1)
    assert a.acc_lo < a.acc_hi and a.diff_lo < a.diff_hi
    assert a.norm_lo is not None and a.norm_hi is not None and a.norm_lo < a.norm_hi
    # a planted scheme right on 95% of the items is found in every replicate and beats the baseline
    correct[7] = np.random.default_rng(0).random(200) < 0.95
    b = bootstrap_heldout(correct, base, k=5, replicates=60, seed=1)
    assert b.diff_lo > 0.3 and b.share_below_baseline == 0.0
    counts = cell_counts(correct, Cells.build(200, 5))
    assert 7 in candidates(counts, 3)
    p = paired_test(kfold_picks(counts, {i: correct[i] for i in range(50)}), base)
    assert p.p < 1e-10 and p.lo > 0.3


def test_the_chance_corrected_ratio_is_zero_at_chance_and_its_intervals_hold_it() -> None:
    """(acc - 0.25) / (baseline - 0.25): a scorer at chance keeps 0 of a baseline of 0.33 (the raw ratio: 0.76);
    the paired bootstrap and the procedure's bootstrap give intervals holding the point (issue 54)."""
    assert corrected(0.25, 0.33) == 0.0 and corrected(0.33, 0.33) == 1.0 and 0.25 / 0.33 > 0.75
    assert math.isnan(corrected(0.3, 0.25))
    rng = np.random.default_rng(3)
    run, base = rng.random(400) < 0.3, rng.random(400) < 0.4
    lo, hi = corrected_interval(run, base)
    assert lo < corrected(run.mean(), base.mean()) < hi
    correct, b = _grid(30, 200, 2)
    boot = bootstrap_heldout(correct, b, k=5, replicates=60, seed=1)
    assert boot.corrected_lo is not None and boot.corrected_hi is not None
    assert boot.corrected_lo < boot.corrected_hi
    acc_mid, base_mid = (boot.acc_lo + boot.acc_hi) / 2, b.mean()
    assert boot.corrected_lo < corrected(acc_mid, base_mid) < boot.corrected_hi


def test_the_report_carries_the_procedure_statistics(tmp_path: Path) -> None:
    """summarise_db streams the chosen rows back (SweepStore.load_rows) and gives the paired test and the
    bootstrap the dense predictions give; the difference is the k-fold accuracy minus the baseline's."""
    from walklens.base.outputs import jsonable
    from walklens.lab.experiments.summary import summarise_db, summarise_run
    from walklens.lab.hellaswag.store import SweepRun, SweepStore
    from walklens.lab.reports.sweep import build

    n, rng = 60, np.random.default_rng(5)
    labels = rng.integers(0, 4, n).astype(np.uint8)
    base = np.where(rng.random((2, n)) < 0.4, labels, (labels + 1) % 4).astype(np.uint8)
    db = tmp_path / "r.sqlite"
    with SweepStore(db) as st:
        run = SweepRun("m", "d", "validation", 0, 1, labels, range(n), "decoder", 4)
        rid = st.run_id(run)
        st.set_baseline(rid, float((base[0] == labels).mean()), float((base[1] == labels).mean()), base)
        for g in range(4):
            ctx = f"enc=concat_each_example,layer={g},word=mean,norm=None,seg=mean,ex=mean"
            st.put_groups(
                rid, [(ctx, [""], rng.integers(0, 4, (2, 1, n)).astype(np.uint8))], ["acc", "acc_norm"], labels, 0.0
            )
    (s,) = summarise_db(db, k=5, replicates=40)
    with SweepStore(db, readonly=True) as st:
        dense = summarise_run(st.load(rid), k=5, replicates=40)
    assert jsonable(dense) == jsonable(s)
    for i, m in enumerate(s.metrics.values()):
        assert m.paired is not None and m.bootstrap is not None and m.bootstrap.replicates == 40
        assert m.paired.diff == pytest.approx(m.kfold.acc - (base[i] == labels).mean())
        assert m.bootstrap.candidates == 4 and m.bootstrap.acc_lo <= m.bootstrap.acc_hi
    md, pa = str(build([s]).files["heldout.md"]), s.metrics["acc"].paired
    assert pa is not None and "McNemar p" in md and f"{pa.p:.3g}" in md
    bo, m = s.metrics["acc"].bootstrap, s.metrics["acc"]
    assert bo is not None  # a replicate whose baseline is not above chance leaves the interval open ("-")
    assert (f"[{bo.corrected_lo:.2f}, {bo.corrected_hi:.2f}]" if bo.corrected_lo is not None else "[-, -]") in md
    assert f"| {corrected(m.kfold.acc, m.baseline):.2f} |" in str(build([s]).files["summary.md"])


def test_expected_share_above_the_chance_band_by_enumeration() -> None:
    from walklens.lab.experiments.stats import distribution

    for n in (7, 40, 200):
        d = distribution(np.array([0.1, 0.5]), n)
        brute = sum(math.comb(n, j) * 0.25**j * 0.75 ** (n - j) for j in range(n + 1) if j / n > d["chance_upper95"])
        assert d["expected_above_chance_ci"] == pytest.approx(brute, rel=1e-9)
        assert 0 < d["expected_above_chance_ci"] < 0.05  # one side of a two-sided 95% band, discrete
