"""Agreement of one model's HellaSwag results in two dtypes (docs/dtype.md, "Agreement study").

The same items run in a reference dtype (float32, which equals lm-evaluation-harness) and in another one
(bfloat16) are read back from one results database, keyed by the model's name (``smollm2-135m`` and
``smollm2-135m@bfloat16``, :func:`walklens.precision.model_label`), and compared:

* a single run (the baseline, a Test 1 or Test 2 scheme; :class:`RunAgreement`): per metric the share of items
  whose pick is the same (Wilson 95% interval), the difference of the accuracies with a 95% interval for a
  *paired* difference (:func:`paired_difference`: Newcombe 1998, method 10) and McNemar's exact test, and the
  distribution of the per-ending score differences (log-likelihoods for the baseline and Test 1);
* a sweep (Test 2's full grid, a Test 1 grid; :class:`GridAgreement`): per metric the share of schemes whose
  accuracy moves, the largest move, the share of identical picks, whether the best k schemes are the same
  set (k = 1, 5, 20), the rank correlation of the schemes' accuracies (Spearman's rho and Kendall's tau-b,
  scipy) and the reference's best schemes (default 20) with their accuracy, rank and difference in both.
  Sweeps store 2-bit picks only, so grids have no score differences.  Test 1's ``enc=cross_encoding`` scheme
  (the baseline itself) is left out of the schemes, as in the report.

Both stores are opened read-only; a run missing in either dtype is one :class:`~walklens.errors.InputError`
line naming it and the command that produces it.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..concepts.schemes import Scheme
from ..errors import InputError
from ..hellaswag.store import KEY_COLUMNS, ResultStore, RunKey, SweepStore
from ..precision import dtype_name, model_label, parse_dtype
from .stats import Z95, wilson

#: What :func:`agreement_study` compares (all by default).
PARTS = ("baseline", "test1", "test2-grid", "test1-grid")
#: Sizes of the best-scheme sets compared between the dtypes.
TOP_KS = (1, 5, 20)
SCORE_QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)
ABS_QUANTILES = (0.5, 0.9, 0.99, 1.0)
NEWCOMBE = "Newcombe (1998) method 10: Wilson score intervals of both accuracies, continuity-corrected phi"
_BASELINE_SCHEME = "enc=cross_encoding,"  # Test 1's scheme that is the baseline itself (kept out of grids)


# ---- the paired difference of two accuracies ------------------------------------------------------------------


@dataclass(frozen=True)
class PairedDifference:
    """``other - reference`` accuracy on the same ``n`` items, from the paired 2x2 table of right/wrong."""

    n: int
    both: int  # items both got right
    only_reference: int
    only_other: int
    neither: int
    reference: float
    other: float
    diff: float
    lo: float
    hi: float
    mcnemar_p: float  # exact two-sided McNemar test (binomial on the discordant items); 1.0 when there are none
    method: str = NEWCOMBE


def paired_difference(
    both: int, only_reference: int, only_other: int, neither: int, z: float = Z95
) -> PairedDifference:
    """The 95% interval (``z``) of a difference of paired proportions by Newcombe's method 10 (Stat. Med. 17,
    2635-2650, 1998): each accuracy gets a Wilson interval (:func:`~.stats.wilson`) and the two are combined
    with the correlation phi of the 2x2 table, its numerator corrected by n/2 towards 0 (as in Newcombe and
    in Fagerland et al.'s ``contingencytables``).  McNemar's exact p-value is scipy's ``binomtest``."""
    from scipy.stats import binomtest

    cells = (both, only_reference, only_other, neither)
    if min(cells) < 0:
        raise ValueError(f"negative count in {cells}")
    n = sum(cells)
    if n == 0:
        return PairedDifference(0, 0, 0, 0, 0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    p1, p2 = (both + only_other) / n, (both + only_reference) / n  # other, reference
    l1, u1 = wilson(both + only_other, n, z)
    l2, u2 = wilson(both + only_reference, n, z)
    margins = (both + only_other) * (only_reference + neither) * (both + only_reference) * (only_other + neither)
    a = both * neither - only_other * only_reference
    if margins == 0 or 0 <= a <= n / 2:
        phi = 0.0
    else:
        phi = (a - n / 2 if a > 0 else a) / math.sqrt(margins)
    lo = p1 - p2 - math.sqrt(max((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2), 0.0))
    hi = p1 - p2 + math.sqrt(max((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1), 0.0))
    m = only_reference + only_other
    p = 1.0 if m == 0 else float(binomtest(only_other, m, 0.5).pvalue)
    return PairedDifference(
        n, both, only_reference, only_other, neither, p2, p1, (only_other - only_reference) / n, lo, hi, p
    )


def _paired(gold: np.ndarray, ref: np.ndarray, other: np.ndarray) -> PairedDifference:
    cr, co = ref == gold, other == gold
    return paired_difference(int((cr & co).sum()), int((cr & ~co).sum()), int((~cr & co).sum()), int((~cr & ~co).sum()))


# ---- one run in both dtypes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PickAgreement:
    """How often one metric's pick is the same in both dtypes, and the difference of its accuracies."""

    metric: str
    n: int
    same: int
    share: float
    share_lo: float
    share_hi: float
    difference: PairedDifference


@dataclass(frozen=True)
class ScoreDifferences:
    """Per ending, ``other - reference`` score (log-likelihood for the baseline and Test 1, similarity for Test
    2).  ``flip_gap_max``: the largest reference score gap between the two ``acc`` picks where they differ (how
    near a tie the reference was wherever the other dtype picked otherwise)."""

    n_items: int
    n_endings: int
    mean: float
    mean_abs: float
    max_abs: float
    max_abs_item: int
    quantiles: dict[str, float]
    abs_quantiles: dict[str, float]
    n_flips: int
    flip_gap_max: float | None


@dataclass(frozen=True)
class RunAgreement:
    """One stored run (baseline, Test 1 or Test 2 scheme) in both dtypes, on the items both hold."""

    test: str
    scheme: str
    reference: str
    other: str
    n: int
    only_reference: int  # items stored for one dtype only (left out)
    only_other: int
    picks: tuple[PickAgreement, ...]
    scores: ScoreDifferences


def _qname(q: float) -> str:
    return f"q{q * 100:g}"


def score_differences(items: Sequence[int], ref: np.ndarray, other: np.ndarray) -> ScoreDifferences:
    """:class:`ScoreDifferences` of scores ``[items, endings]`` in the two dtypes (``items``: their indices)."""
    d = other - ref
    flat, a = d.ravel(), np.abs(d).ravel()
    i = int(np.argmax(a))
    pr, po = ref.argmax(1), other.argmax(1)
    flips = np.flatnonzero(pr != po)
    gaps = ref[flips, pr[flips]] - ref[flips, po[flips]]
    return ScoreDifferences(
        n_items=int(d.shape[0]),
        n_endings=int(d.size),
        mean=float(flat.mean()),
        mean_abs=float(a.mean()),
        max_abs=float(a[i]),
        max_abs_item=int(items[i // d.shape[1]]),
        quantiles={_qname(q): float(v) for q, v in zip(SCORE_QUANTILES, np.quantile(flat, SCORE_QUANTILES))},
        abs_quantiles={_qname(q): float(v) for q, v in zip(ABS_QUANTILES, np.quantile(a, ABS_QUANTILES))},
        n_flips=int(flips.size),
        flip_gap_max=float(gaps.max()) if flips.size else None,
    )


def pick_agreement(metric: str, gold: np.ndarray, ref: np.ndarray, other: np.ndarray) -> PickAgreement:
    """:class:`PickAgreement` of one metric's picks ``[items]`` in the two dtypes."""
    n = int(gold.size)
    same = int((ref == other).sum())
    lo, hi = wilson(same, n)
    return PickAgreement(metric, n, same, same / n if n else math.nan, lo, hi, _paired(gold, ref, other))


def _what(key: RunKey) -> str:
    scheme = "" if key.test == "baseline" else f", scheme {key.scheme}"
    return f"{key.test} run of {key.model} ({key.shots}-shot{scheme}, data {key.data})"


def compare_runs(
    store: ResultStore, reference: RunKey, other: RunKey, items: int | None = None, hints: Sequence[str] = ("", "")
) -> RunAgreement:
    """:class:`RunAgreement` of two stored runs.  ``items``: compare the first ``items`` items (both runs must
    hold every one), else every item both hold.  ``hints``: what produces each run (added to the error)."""
    got = []
    for key, hint in zip((reference, other), hints):
        if not store.runs(**dict(zip(KEY_COLUMNS, key.values()))):
            raise InputError(f"{store.path}: no stored {_what(key)}{hint}")
        res = store.results(key)
        if items is not None and any(i not in res for i in range(items)):
            have = sum(i in res for i in range(items))
            raise InputError(f"{store.path}: the {_what(key)} holds {have} of the first {items} items{hint}")
        got.append(res)
    ref, oth = got
    common = list(range(items)) if items is not None else sorted(set(ref) & set(oth))
    if not common:
        raise InputError(f"{store.path}: the {_what(reference)} and the {_what(other)} have no item in common")
    gold = np.array([ref[i].gold for i in common])
    if not np.array_equal(gold, [oth[i].gold for i in common]):
        raise InputError(f"{store.path}: the {_what(reference)} and the {_what(other)} disagree on gold endings")
    metrics = ("acc",) if reference.test == "test2" else ("acc", "acc_norm")
    picks = []
    for metric in metrics:
        attr = "pred" if metric == "acc" else "pred_norm"
        picks.append(
            pick_agreement(
                metric,
                gold,
                np.array([getattr(ref[i], attr) for i in common]),
                np.array([getattr(oth[i], attr) for i in common]),
            )
        )
    scores = score_differences(
        common,
        np.array([ref[i].scores for i in common], np.float64),
        np.array([oth[i].scores for i in common], np.float64),
    )
    return RunAgreement(
        test=reference.test,
        scheme=reference.scheme,
        reference=reference.model,
        other=other.model,
        n=len(common),
        only_reference=len(set(ref) - set(common)),
        only_other=len(set(oth) - set(common)),
        picks=tuple(picks),
        scores=scores,
    )


# ---- a sweep in both dtypes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopK:
    """Whether the ``k`` best schemes are the same in both dtypes.  ``same_set``/``overlap``: the best ``k``
    by accuracy, ties broken by stored order; ``same_up_to_ties``: some way of breaking ties makes the best
    ``k`` the same set in both dtypes (the sets differ only among schemes tied at the k-th accuracy);
    ``distinct_reference``: distinct pick vectors among the reference's best ``k`` (schemes that compute the
    same thing count once)."""

    k: int
    same_set: bool
    overlap: int
    same_up_to_ties: bool
    distinct_reference: int


@dataclass(frozen=True)
class SchemeMove:
    """One scheme in both dtypes: accuracies, ranks (1 + schemes strictly better), identical picks."""

    scheme: str
    reference: float
    other: float
    rank_reference: int
    rank_other: int
    same_picks: float
    difference: PairedDifference


@dataclass(frozen=True)
class GridMetricAgreement:
    """One metric of a sweep in both dtypes (see the module docstring)."""

    metric: str
    n_schemes: int
    moved: int
    share_moved: float
    max_move: float
    mean_abs_move: float
    same_picks: float  # identical picks over every (scheme, item)
    min_same_picks: float  # the scheme with the fewest identical picks
    spearman: float
    kendall: float
    top_k: tuple[TopK, ...]
    best: tuple[SchemeMove, ...]  # the reference's best schemes, best first
    best_other: SchemeMove  # the other dtype's best scheme


@dataclass(frozen=True)
class GridAgreement:
    """A sweep stored in both dtypes over the same items."""

    test: int
    shots: int
    reference: str
    other: str
    n_items: int
    n_schemes: int
    only_reference: int  # schemes stored for one dtype only (a sweep still running), left out
    only_other: int
    metrics: tuple[GridMetricAgreement, ...]


def _sweep_run(
    store: SweepStore, model: str, test: int, shots: int, data: str, items: int | None, hint: str
) -> list[dict[str, Any]]:
    runs = [
        r
        for r in store.runs()
        if r["model"] == model
        and int(r["test"]) == test
        and int(r["shots"]) == shots
        and r["data"] == data
        and (items is None or int(r["n_items"]) == items)
    ]
    if not runs:
        size = "" if items is None else f" over {items} items"
        raise InputError(f"{store.path}: no Test {test} sweep of {model} ({shots}-shot, data {data}){size}{hint}")
    return runs


def _context(names: Sequence[str]) -> str:
    return Scheme.parse(names[0]).context_part()


def _in_order(store: SweepStore, run_id: int) -> Iterator[tuple[str, tuple[list[str], list[str], np.ndarray]]]:
    """:meth:`~walklens.hellaswag.store.SweepStore.iter_groups` with each group's context, checked to come in
    ascending order."""
    last = ""
    for g in store.iter_groups(run_id):
        ctx = _context(g[0])
        if ctx < last:
            raise InputError(f"{store.path}: sweep run {run_id} is not read in context order ({ctx!r} after {last!r})")
        last = ctx
        yield ctx, g


def _joined(
    store: SweepStore, rid_r: int, rid_o: int, counts: list[int]
) -> Iterator[tuple[list[str], list[str], np.ndarray, np.ndarray]]:
    """The groups of two runs walked side by side (both read in context order): per context both hold,
    (scheme names both hold, metrics, predictions ``[metrics, schemes, items]`` of each).  ``counts``
    receives the schemes stored for one run only."""
    gr, go = _in_order(store, rid_r), _in_order(store, rid_o)
    (ca, a), (cb, b) = next(gr, (None, None)), next(go, (None, None))
    while a is not None or b is not None:
        if cb is None or (ca is not None and ca < cb):
            assert a is not None  # ca is None only with a, and both are not
            counts[0] += len(a[0])
            ca, a = next(gr, (None, None))
        elif ca is None or cb < ca:
            assert b is not None  # cb is None only with b, and both are not
            counts[1] += len(b[0])
            cb, b = next(go, (None, None))
        else:
            assert a is not None and b is not None  # ca == cb: both runs hold the context
            (na, ma, pa), (nb, mb, pb) = a, b
            if ma != mb:
                raise InputError(f"{store.path}: the two sweeps store different metrics ({ma} and {mb})")
            if na == nb:
                yield na, ma, pa, pb
            else:
                pos = {n: i for i, n in enumerate(nb)}
                keep = [i for i, n in enumerate(na) if n in pos]
                counts[0] += len(na) - len(keep)
                counts[1] += len(nb) - len(keep)
                yield [na[i] for i in keep], ma, pa[:, keep], pb[:, [pos[na[i]] for i in keep]]
            (ca, a), (cb, b) = next(gr, (None, None)), next(go, (None, None))


def _ranks(hits: np.ndarray) -> np.ndarray:
    """1 + the number of schemes with strictly more hits (ties share a rank)."""
    s = np.sort(hits)
    return 1 + hits.size - np.searchsorted(s, hits, side="right")


@dataclass(frozen=True)
class Ranking:
    """How the schemes' ranks are compared: the reference's ``best`` schemes are listed, and the best-k sets are
    compared for each k of ``ks``."""

    best: int = 20
    ks: Sequence[int] = TOP_KS


@dataclass(frozen=True)
class _Columns:
    """One metric's per-scheme counts over the items: hits in each dtype, identical picks, items right in one
    dtype only, and a digest of the reference's picks (equal digests: the same picks)."""

    hr: np.ndarray
    ho: np.ndarray
    same: np.ndarray
    only_r: np.ndarray
    only_o: np.ndarray
    digest: np.ndarray


def _top_ks(cols: _Columns, order_r: np.ndarray, order_o: np.ndarray, ks: Sequence[int]) -> list[TopK]:
    """:class:`TopK` for each ``k`` of ``ks`` up to the number of schemes."""
    hr, ho = cols.hr, cols.ho
    tops = []
    for k in ks:
        if k > len(hr):
            continue
        tr, to = order_r[:k], order_o[:k]
        # a common best-k set exists iff every scheme that must be in it (strictly above the k-th in either
        # dtype) may be in it in both (at least the k-th), and there are k schemes that may be
        must = (hr > hr[tr[-1]]) | (ho > ho[to[-1]])
        may = (hr >= hr[tr[-1]]) & (ho >= ho[to[-1]])
        tops.append(
            TopK(
                k=k,
                same_set=set(tr) == set(to),
                overlap=len(set(tr) & set(to)),
                same_up_to_ties=bool(not (must & ~may).any() and must.sum() <= k <= may.sum()),
                distinct_reference=len(set(cols.digest[tr].tolist())),
            )
        )
    return tops


def _grid_metric(metric: str, names: list[str], n: int, cols: _Columns, ranking: Ranking) -> GridMetricAgreement:
    from scipy.stats import kendalltau, spearmanr

    hr, ho, same = cols.hr, cols.ho, cols.same
    S = len(names)
    ar, ao = hr / n, ho / n
    move = np.abs(ao - ar)
    order_r, order_o = np.lexsort((np.arange(S), -hr)), np.lexsort((np.arange(S), -ho))
    rank_r, rank_o = _ranks(hr), _ranks(ho)

    def scheme(i: int) -> SchemeMove:
        only_r, only_o = int(cols.only_r[i]), int(cols.only_o[i])
        both = int(hr[i] - only_r)
        return SchemeMove(
            names[i],
            float(ar[i]),
            float(ao[i]),
            int(rank_r[i]),
            int(rank_o[i]),
            float(same[i] / n),
            paired_difference(both, only_r, only_o, n - both - (only_r + only_o)),
        )

    with warnings.catch_warnings():  # a constant column (every scheme equal) gives nan, said as such
        warnings.simplefilter("ignore")
        rho = float(spearmanr(ar, ao)[0]) if S > 1 else math.nan
        tau = float(kendalltau(ar, ao)[0]) if S > 1 else math.nan
    return GridMetricAgreement(
        metric=metric,
        n_schemes=S,
        moved=int((hr != ho).sum()),
        share_moved=float((hr != ho).mean()),
        max_move=float(move.max()),
        mean_abs_move=float(move.mean()),
        same_picks=float(same.sum() / (S * n)),
        min_same_picks=float(same.min() / n),
        spearman=rho,
        kendall=tau,
        top_k=tuple(_top_ks(cols, order_r, order_o, ranking.ks)),
        best=tuple(scheme(int(i)) for i in order_r[: ranking.best]),
        best_other=scheme(int(order_o[0])),
    )


@dataclass(frozen=True)
class Scope:
    """Which stored runs are compared: the data key (:func:`~walklens.hellaswag.data.data_id`), the shot count,
    the first ``items`` items (None: the items both hold; for sweeps, the largest item set both swept) and the
    split of single runs."""

    data: str
    shots: int = 0
    items: int | None = None
    split: str = "validation"


def _grid_columns(
    store: SweepStore, run_r: dict[str, Any], run_o: dict[str, Any], counts: list[int]
) -> tuple[list[str], list[str], dict[str, list[list[np.ndarray]]]]:
    """The scheme names both runs hold (Test 1's baseline scheme left out), the metrics, and per metric the
    :class:`_Columns` pieces group by group (``counts``: schemes stored for one run only)."""
    labels = run_r["labels"]
    names: list[str] = []
    acc: dict[str, list[list[np.ndarray]]] = {}
    metrics: list[str] = []
    for group, mets, pr, po in _joined(store, run_r["id"], run_o["id"], counts):
        keep = [i for i, s in enumerate(group) if not s.startswith(_BASELINE_SCHEME)]
        if not keep:
            continue
        if metrics and mets != metrics:
            raise InputError(f"{store.path}: the Test {run_r['test']} sweeps mix metrics {metrics} and {mets}")
        metrics = mets
        names += [group[i] for i in keep]
        pr, po = pr[:, keep], po[:, keep]
        cr, co = pr == labels, po == labels
        cols = (
            cr.sum(-1),
            co.sum(-1),
            (pr == po).sum(-1),
            (cr & ~co).sum(-1),
            (~cr & co).sum(-1),
            np.array(
                [
                    [int.from_bytes(hashlib.blake2b(p.tobytes(), digest_size=8).digest(), "little") for p in m]
                    for m in pr
                ],
                dtype=np.uint64,
            ),
        )
        for m, metric in enumerate(metrics):
            for slot, c in zip(acc.setdefault(metric, [[] for _ in cols]), cols):
                slot.append(c[m])
    return names, metrics, acc


def compare_sweeps(
    store: SweepStore,
    reference: str,
    other: str,
    test: int,
    scope: Scope,
    *,
    ranking: Ranking = Ranking(),
    hints: Sequence[str] = ("", ""),
) -> GridAgreement:
    """:class:`GridAgreement` of the Test ``test`` sweeps of models ``reference`` and ``other`` (stored names)
    over the same items (``scope.items``: over exactly that many; else the largest item set both swept),
    streamed one group at a time (memory O(schemes), not O(schemes x items))."""
    shots, data, items = scope.shots, scope.data, scope.items
    runs_r = _sweep_run(store, reference, test, shots, data, items, hints[0])
    runs_o = _sweep_run(store, other, test, shots, data, items, hints[1])
    pairs = [(r, o) for r in runs_r for o in runs_o if r["items_hash"] == o["items_hash"]]
    if not pairs:
        raise InputError(f"{store.path}: the Test {test} sweeps of {reference} and {other} cover different items")
    run_r, run_o = max(pairs, key=lambda p: (int(p[0]["n_items"]), p[0]["id"], p[1]["id"]))
    n = int(run_r["n_items"])
    counts = [0, 0]
    names, metrics, acc = _grid_columns(store, run_r, run_o, counts)
    if not names:
        raise InputError(f"{store.path}: the Test {test} sweeps of {reference} and {other} have no scheme in common")
    out = [
        _grid_metric(metric, names, n, _Columns(*(np.concatenate(c) for c in acc[metric])), ranking)
        for metric in metrics
    ]
    return GridAgreement(
        test=test,
        shots=shots,
        reference=reference,
        other=other,
        n_items=n,
        n_schemes=len(names),
        only_reference=counts[0],
        only_other=counts[1],
        metrics=tuple(out),
    )


# ---- the whole study ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgreementStudy:
    """Every part of the study (:data:`PARTS`) for one model; a part not asked for is None."""

    model: str
    reference_dtype: str
    other_dtype: str
    reference: str  # the runs' model names (the model's name with its dtype)
    other: str
    data: str
    shots: int
    items: int | None
    baseline: RunAgreement | None
    test1_standard: RunAgreement | None
    test2_grid: GridAgreement | None
    test1_grid: GridAgreement | None


def agreement_study(
    db: str | Path,
    model: str,
    scope: Scope,
    *,
    other: str = "bfloat16",
    reference: str = "float32",
    parts: Sequence[str] = PARTS,
    ranking: Ranking = Ranking(),
) -> AgreementStudy:
    """Compare ``model`` (its name without a dtype) run in ``reference`` and in ``other`` dtype, from the
    database ``db``: the baseline, Test 1's standard scheme (single runs, ``walklens hellaswag``), Test 2's and
    Test 1's sweeps (``walklens sweep``), within ``scope`` (data key, shots, the first ``scope.items`` items, else
    the items both hold).  Test 1's standard scheme is the decoder-only one (word ``w1mean``)."""
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise InputError(f"unknown part(s) {bad or parts}; use any of {', '.join(PARTS)}")
    if "@" in model:
        raise InputError(
            f"give the model's name without a dtype (not {model!r}): its runs are found by --reference and --other"
        )
    dts = (parse_dtype(reference), parse_dtype(other))
    if dts[0] == dts[1]:
        raise InputError(f"the reference and the other dtype are both {dtype_name(dts[0])}")
    labels = [model_label(model, dt) for dt in dts]
    limit = f" --limit {scope.items}" if scope.items is not None else ""

    def hints(cmd: str) -> tuple[str, str]:
        ref, oth = (
            f"; run: walklens {cmd} --model {model} --dtype {dtype_name(dt)} --shots {scope.shots}{limit} --db {db}"
            for dt in dts
        )
        return ref, oth

    found: dict[str, Any] = {}
    if {"baseline", "test1"} & set(parts):
        with ResultStore(db, readonly=True) as rs:
            for part, test in (("baseline", "baseline"), ("test1", "test1")):
                if part not in parts:
                    continue
                scheme = "baseline" if test == "baseline" else str(Scheme.standard(1, "decoder"))
                ref, oth = (RunKey(lab, scope.data, scope.split, scope.shots, test, scheme) for lab in labels)
                found[part] = compare_runs(rs, ref, oth, items=scope.items, hints=hints(f"hellaswag {test}"))
    for part, t in (("test2-grid", 2), ("test1-grid", 1)):
        if part in parts:
            with SweepStore(db, readonly=True) as ss:
                found[part] = compare_sweeps(
                    ss, labels[0], labels[1], t, scope, ranking=ranking, hints=hints(f"sweep --test {t} --grid GRID")
                )
    return AgreementStudy(
        model=model,
        reference_dtype=dtype_name(dts[0]),
        other_dtype=dtype_name(dts[1]),
        reference=labels[0],
        other=labels[1],
        data=scope.data,
        shots=scope.shots,
        items=scope.items,
        baseline=found.get("baseline"),
        test1_standard=found.get("test1"),
        test2_grid=found.get("test2-grid"),
        test1_grid=found.get("test1-grid"),
    )


__all__ = [
    "PARTS",
    "TOP_KS",
    "AgreementStudy",
    "GridAgreement",
    "GridMetricAgreement",
    "PairedDifference",
    "PickAgreement",
    "Ranking",
    "RunAgreement",
    "SchemeMove",
    "Scope",
    "ScoreDifferences",
    "TopK",
    "agreement_study",
    "compare_runs",
    "compare_sweeps",
    "paired_difference",
    "pick_agreement",
    "score_differences",
]
