"""A sweep (Test 2's full grid, a Test 1 grid) stored in both dtypes over the same items, streamed one group of
schemes at a time: per metric the schemes whose accuracy moves, identical picks, the best-k sets, the rank
correlations and the reference's best schemes."""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....analyses.concepts.schemes import Scheme
from ....base.errors import InputError
from ...hellaswag.store import SweepStore
from .paired import PairedDifference, paired_difference

#: Sizes of the best-scheme sets compared between the dtypes.
TOP_KS = (1, 5, 20)
_BASELINE_SCHEME = "enc=cross_encoding,"  # Test 1's scheme that is the baseline itself (kept out of grids)


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
    """One metric of a sweep in both dtypes (:mod:`walklens.lab.experiments.agreement`)."""

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
    """:meth:`~walklens.lab.hellaswag.store.SweepStore.iter_groups` with each group's context, checked to come in
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
    """Which stored runs are compared: the data key (:func:`~walklens.lab.hellaswag.data.data_id`), the shot count,
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
