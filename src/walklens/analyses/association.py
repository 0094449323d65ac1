"""The associative organisation of embedding space, measured (seed 000, sec. 2.2 "Similarity, Co-Occurrence and
Angular Distance in Embedding Space", Result 4; the similarity maps of Figs. 3, 11, 12).

- :func:`token_classes` and :func:`block_contrast`: the blocks of a similarity map.  Each token is put in a class
  by a stated rule on its decoded text (:data:`CLASS_RULES`); per class, the mean similarity within the class
  against the mean between the class and every other token (the diagonal left out), with a permutation test
  (class labels shuffled over positions) and a bootstrap interval (positions resampled within each class).
- :func:`cooccurrence`: Result 4's three-way correspondence on token vectors: over token pairs that co-occur in a
  corpus, the Spearman correlation of their co-occurrence (PMI within a window) with their inner product and
  their cosine, and of inner product with cosine; a jackknife over groups of clusters of documents; two frequency
  controls (a partial correlation given both tokens' log frequencies, and each pair's partner swapped for a
  token of matched frequency).

Plain dataclasses: nothing here loads a model or draws.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import sparse
from scipy.stats import rankdata

from ..base.display import Shown
from ..base.errors import InputError, find
from ..base.frames import DataFrame, attribute_table, frame, record_table

_BRACKETS = "()[]{}"
_PUNCT = "".join(c for c in string.punctuation if c not in _BRACKETS)
_RULES = "#*-=_|~"  # the characters of section rules and headers

#: the rule of each class, on a token's decoded text with surrounding whitespace stripped (``s``); a token fits
#: at most one class, tried in this order; a token fitting none (mixed text) is in no class
CLASS_RULES: dict[str, str] = {
    "number": "s is digits, optionally with one decimal point or comma inside (5, 0, 5.0)",
    "bracket": f"s is made only of brackets {_BRACKETS}",
    "separator": "s is empty (whitespace, newlines) or two or more of # * - = _ | ~ (###, **, ---)",
    "punctuation": "s is made only of punctuation other than brackets (: , . ? = +)",
    "word": "s is made only of letters, optionally with apostrophes or hyphens inside",
}
MAX_MATCHED = 100  #: the most draws of frequency-matched partners (each costs a correlation per replicate)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")


def token_class(token: str) -> str:
    """The class of one decoded token by :data:`CLASS_RULES` ("" for none)."""
    s = token.strip()
    if _NUMBER.fullmatch(s):
        return "number"
    if s and all(c in _BRACKETS for c in s):
        return "bracket"
    if not s or (len(s) >= 2 and all(c in _RULES for c in s)):
        return "separator"
    if all(c in _PUNCT for c in s):
        return "punctuation"
    return "word" if _WORD.fullmatch(s) else ""


def token_classes(tokens: Sequence[str]) -> list[str]:
    """The class of each decoded token (:func:`token_class`)."""
    return [token_class(t) for t in tokens]


# ---- the blocks of a similarity map ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassContrast:
    """One class of one map: ``n`` tokens; mean similarity ``within`` the class and ``between`` it and every other
    token; ``contrast`` = within - between with its bootstrap interval [``lo``, ``hi``]; the permutation test's
    ``p_above`` (share of label shuffles with a contrast at least as large) and ``null_hi`` (its 95th
    percentile)."""

    cls: str
    n: int
    within: float
    between: float
    contrast: float
    lo: float
    hi: float
    p_above: float
    null_hi: float


@dataclass(frozen=True)
class BlockContrast(Shown, view="blocks"):
    """The block structure of one similarity map (seed 000, Figs. 3, 11, 12): ``classes`` (one
    :class:`ClassContrast` per class with at least two tokens), the map's ``name``, its ``off_mean`` (mean off the
    diagonal), ``n_tokens``, ``n_perm`` / ``n_boot`` and ``seed``; ``distinct``: pairs of two copies of one token
    left out."""

    name: str
    model_name: str
    n_tokens: int
    off_mean: float
    classes: tuple[ClassContrast, ...]
    n_perm: int
    n_boot: int
    seed: int
    distinct: bool

    def of(self, cls: str) -> ClassContrast:
        """The contrast of class ``cls``."""
        missing = f"no class {cls!r} in this map; classes: {', '.join(c.cls for c in self.classes)}"
        return find(self.classes, lambda c: c.cls == cls, missing)

    def _headline(self) -> str:
        return f"{self.model_name + ' · ' if self.model_name else ''}{self.name}"

    def to_pandas(self) -> DataFrame:
        """One row per class: its tokens, within and between means, the contrast with its interval and the
        permutation test (pandas; docs/notebooks.md, "Tables"); the map's scalars as ``attrs``."""
        names = ("cls", "n", "within", "between", "contrast", "lo", "hi", "p_above", "null_hi")
        attrs = {"map": self.name, "model": self.model_name, "n_tokens": self.n_tokens, "off_mean": self.off_mean}
        return frame(attribute_table(self.classes, names), attrs)


def _contrasts(
    m: torch.Tensor, mask: torch.Tensor, x: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Within and between means per class of a [T, T] map ``m`` over the pairs ``mask`` counts (1: counted, 0:
    left out), for a batch of weighted class memberships ``x`` [B, T, K] (a position's weight in its class) and
    position weights ``w`` [B, T]: returns two [B, K] tensors."""
    mm = m * mask
    s_in = torch.einsum("bik,ij,bjk->bk", x, mm, x)
    n_in = torch.einsum("bik,ij,bjk->bk", x, mask, x)
    s_row = torch.einsum("bik,ij,bj->bk", x, mm, w)
    n_row = torch.einsum("bik,ij,bj->bk", x, mask, w)
    return s_in / n_in.clamp_min(1e-12), (s_row - s_in) / (n_row - n_in).clamp_min(1e-12)


def block_contrast(
    sim: torch.Tensor,
    classes: Sequence[str],
    *,
    same: Sequence[object] | None = None,
    name: str = "",
    model_name: str = "",
    n_perm: int = 2000,
    n_boot: int = 1000,
    seed: int = 0,
) -> BlockContrast:
    """Within- against between-class similarity of a [T, T] map per class of ``classes`` (one label per position,
    "" for none; :func:`token_classes`): the contrast, a permutation test (labels shuffled over all positions,
    ``n_perm`` times) and a bootstrap interval (positions resampled with replacement within each class,
    ``n_boot`` times).  Pairs of a position with itself never count; nor, with ``same`` (one key per position,
    e.g. token ids), pairs of two positions with equal keys: two copies of one token are not two alike tokens."""
    T = sim.shape[0]
    if sim.shape != (T, T) or len(classes) != T or (same is not None and len(same) != T):
        raise InputError(f"a [T, T] map and T labels are needed; got {tuple(sim.shape)} and {len(classes)} labels")
    names = sorted(c for c in set(classes) if c and list(classes).count(c) >= 2)
    m = sim.detach().double().cpu()
    first: dict[object, int] = {}
    codes = torch.tensor([first.setdefault(k, i) for i, k in enumerate(range(T) if same is None else same)])
    mask = (codes[:, None] != codes[None, :]).double()
    off = float(m[~torch.eye(T, dtype=torch.bool)].mean()) if T > 1 else float("nan")
    lab = torch.tensor([names.index(c) if c in names else -1 for c in classes])
    oh = (lab[:, None] == torch.arange(len(names))[None]).double()
    ones = torch.ones(1, T, dtype=torch.float64)
    within, between = _contrasts(m, mask, oh[None], ones)
    obs = (within - between)[0]
    g = torch.Generator().manual_seed(seed)
    null = []
    for i in range(0, n_perm, 200):
        idx = torch.argsort(torch.rand(min(200, n_perm - i), T, generator=g), dim=1)
        wi, be = _contrasts(m, mask, oh[idx], ones.expand(len(idx), T))
        null.append(wi - be)
    nl = torch.cat(null) if null else torch.zeros(0, len(names), dtype=torch.float64)
    boot = _bootstrap(m, mask, lab, len(names), n_boot, g)
    out = []
    for k, c in enumerate(names):
        lo, hi = _quantiles(boot[:, k], 0.025, 0.975)
        p = (1 + int((nl[:, k] >= obs[k] - 1e-12).sum())) / (1 + n_perm)
        out.append(ClassContrast(c, int((lab == k).sum()), float(within[0, k]), float(between[0, k]),
                                 float(obs[k]), lo, hi, p, _quantiles(nl[:, k], 0.95)[0]))  # fmt: skip
    return BlockContrast(name, model_name, T, off, tuple(out), n_perm, n_boot, seed, same is not None)


def _quantiles(x: torch.Tensor, *q: float) -> list[float]:
    if not len(x):
        return [float("nan")] * len(q)
    return [float(v) for v in torch.quantile(x, torch.tensor(q, dtype=x.dtype))]


def _bootstrap(
    m: torch.Tensor, mask: torch.Tensor, lab: torch.Tensor, k: int, n_boot: int, g: torch.Generator
) -> torch.Tensor:
    """[n_boot, k] contrasts of position resamples, each class resampled within itself (its size kept), as
    weights: a position drawn w times counts w times (a pair of one position with itself still never counts)."""
    T, out = m.shape[0], []
    groups = [gr for gr in (torch.nonzero(lab == c).flatten() for c in range(-1, k)) if len(gr)]
    oh = (lab[:, None] == torch.arange(k)[None]).double()
    for start in range(0, n_boot, 100):
        b = min(100, n_boot - start)
        w = torch.zeros(b, T, dtype=torch.float64)
        for gr in groups:
            w.scatter_add_(1, gr[torch.randint(len(gr), (b, len(gr)), generator=g)], torch.ones(b, len(gr)).double())
        wi, be = _contrasts(m, mask, w[:, :, None] * oh[None], w)
        out.append(wi - be)
    return torch.cat(out) if out else torch.zeros(0, k, dtype=torch.float64)


# ---- co-occurrence against similarity (Result 4) -----------------------------------------------------------------


@dataclass(frozen=True)
class Correlation:
    """A Spearman correlation ``rho`` with its 95 % interval [``lo``, ``hi``] (jackknife; see :class:`Cooccurrence`)."""

    rho: float
    lo: float
    hi: float


@dataclass(frozen=True)
class Cooccurrence(Shown, view="cooccurrence"):
    """Result 4 on token vectors (seed 000, sec. 2.2): over ``n_pairs`` token pairs co-occurring at least
    ``min_count`` times within ``window`` tokens in ``n_docs`` documents (``n_tokens`` tokens in ``n_clusters``
    clusters of documents), Spearman correlations of PMI with the inner product
    (``pmi_dot``) and with the cosine (``pmi_cos``), of the inner product with the cosine (``dot_cos``); the same
    given both tokens' log frequencies (``partial_dot``, ``partial_cos``), and with each pair's second token
    swapped for one of matched frequency (``matched_dot``, ``matched_cos``: the mean over ``n_matched`` draws;
    the same draws in every replicate); ``excess_cos`` = pmi_cos - matched_cos, paired within each replicate.
    Intervals: 95 % delete-a-group jackknife over ``n_groups`` random groups of the clusters (the whole procedure,
    pair selection by ``min_count`` included, without each group in turn; t with G - 1 degrees of freedom)."""

    model_name: str
    n_docs: int
    n_clusters: int
    n_tokens: int
    n_pairs: int
    window: int
    min_count: int
    pmi_dot: Correlation
    pmi_cos: Correlation
    dot_cos: Correlation
    partial_dot: Correlation
    partial_cos: Correlation
    matched_dot: Correlation
    matched_cos: Correlation
    excess_cos: Correlation
    n_groups: int
    n_matched: int
    seed: int

    def _headline(self) -> str:
        return f"{self.model_name + ' · ' if self.model_name else ''}{self.n_pairs:,} pairs"

    def to_pandas(self) -> DataFrame:
        """One row per correlation (``pmi_dot`` ... ``excess_cos``) with its jackknife interval (pandas;
        docs/notebooks.md, "Tables"); the counts as ``attrs``."""
        stats = ("pmi_dot", "pmi_cos", "dot_cos", "partial_dot", "partial_cos", "matched_dot", "matched_cos")
        rows = [{"statistic": k, **vars(getattr(self, k))} for k in (*stats, "excess_cos")]
        counts = ("n_docs", "n_clusters", "n_tokens", "n_pairs", "window", "min_count", "n_groups", "n_matched")
        return frame(record_table(rows), {"model": self.model_name, **{k: getattr(self, k) for k in counts}})


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    return _pearson(rankdata(x), rankdata(y))


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else float("nan")


def partial_spearman(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> float:
    """Spearman correlation of ``x`` and ``y`` given covariates ``z`` [n, k]: the ranks of x and y, each with its
    least-squares fit on the ranks of z (and a constant) removed, then correlated."""
    rx, ry = rankdata(x), rankdata(y)
    zz = np.column_stack([np.ones(len(x))] + [rankdata(z[:, j]) for j in range(z.shape[1])])
    res = [r - zz @ np.linalg.lstsq(zz, r, rcond=None)[0] for r in (rx, ry)]
    return _pearson(res[0], res[1])


def pair_counts(
    docs: Sequence[Sequence[int]], clusters: Sequence[int], window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unordered pairs of distinct tokens at most ``window`` positions apart within a document, counted per cluster
    of documents: returns (cluster, a, b, count) arrays with a < b."""
    if len(docs) != len(clusters):
        raise InputError(f"{len(docs)} documents but {len(clusters)} cluster labels")
    ids = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs]) if docs else np.zeros(0, np.int64)
    doc = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    cl = np.asarray(clusters, dtype=np.int64)[doc]
    keys = []
    for k in range(1, min(window, max((len(d) for d in docs), default=1) - 1) + 1):  # no pair farther apart
        same = doc[:-k] == doc[k:]
        a, b = ids[:-k][same], ids[k:][same]
        keep = a != b
        keys.append(np.stack([cl[:-k][same][keep], np.minimum(a, b)[keep], np.maximum(a, b)[keep]], 1))
    allk = np.concatenate(keys) if keys else np.zeros((0, 3), np.int64)
    uniq, count = np.unique(allk, axis=0, return_counts=True)
    return uniq[:, 0], uniq[:, 1], uniq[:, 2], count


def _pmi(c: np.ndarray, ma: np.ndarray, mb: np.ndarray, z: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = np.log(c) + np.log(z) - np.log(ma) - np.log(mb)
    return out


def _jackknife(point: float, reps: np.ndarray) -> Correlation:
    """A delete-a-group jackknife interval: point +- t(G-1, 0.975) x the jackknife standard error of G reps."""
    from scipy.stats import t as student

    G = len(reps)
    if G < 2 or not np.isfinite(reps).all():
        return Correlation(point, float("nan"), float("nan"))
    se = float(np.sqrt((G - 1) / G * ((reps - reps.mean()) ** 2).sum()))
    half = float(student.ppf(0.975, G - 1)) * se
    return Correlation(point, point - half, point + half)


_STATS = ("pmi_dot", "pmi_cos", "dot_cos", "partial_dot", "partial_cos", "matched_dot", "matched_cos")


def _stats(pmi: np.ndarray, dot: np.ndarray, cos: np.ndarray, z: np.ndarray, draws: Sequence[np.ndarray]) -> np.ndarray:
    """The correlations of :data:`_STATS`, in order; ``draws``: [2, n] dot and cosine of each draw of matched
    partners (the matched correlations are means over the draws)."""
    ctrl = np.mean([[spearman(pmi, d[0]), spearman(pmi, d[1])] for d in draws], axis=0)
    return np.array([spearman(pmi, dot), spearman(pmi, cos), spearman(dot, cos), partial_spearman(pmi, dot, z),
                     partial_spearman(pmi, cos, z), ctrl[0], ctrl[1]])  # fmt: skip


def _covariates(ma: np.ndarray, mb: np.ndarray) -> np.ndarray:
    la, lb = np.log(ma), np.log(mb)
    return np.column_stack([la + lb, np.abs(la - lb)])


def _matched(a: np.ndarray, b: np.ndarray, freq: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Each pair's ``b`` swapped for a token drawn from the ``k + 1`` tokens (of those in any pair) nearest to it in
    frequency, never ``a`` or ``b`` itself (redrawn up to 20 times; a pair left without one keeps ``b``)."""
    order = np.unique(np.concatenate([a, b]))
    order = order[np.argsort(freq[order], kind="stable")]
    rank = np.full(int(order.max()) + 1, -1)
    rank[order] = np.arange(len(order))
    width = min(k + 1, len(order))
    lo = np.clip(rank[b] - width // 2, 0, len(order) - width)
    out = b.copy()
    todo = np.ones(len(b), dtype=bool)
    for _ in range(20):
        pick = order[lo + rng.integers(width, size=len(b))]
        good = todo & (pick != a) & (pick != b)
        out[good] = pick[good]
        todo &= ~good
        if not todo.any():
            break
    return out


def cooccurrence(
    docs: Sequence[Sequence[int]],
    vectors: torch.Tensor,
    *,
    clusters: Sequence[int] | None = None,
    window: int = 5,
    min_count: int = 5,
    n_groups: int = 20,
    n_matched: int = 5,
    seed: int = 0,
    model_name: str = "",
) -> Cooccurrence:
    """Result 4 on token vectors (seed 000, sec. 2.2): co-occurrence (PMI of pairs at most ``window`` tokens apart
    within a document, pairs seen at least ``min_count`` times) against similarity of the tokens' ``vectors``
    [V, D] rows (inner product and cosine), with a jackknife over ``n_groups`` groups of ``clusters`` of
    documents (default: each document its own cluster) and two frequency controls (see :class:`Cooccurrence`)."""
    if window < 1 or min_count < 1 or n_groups < 2 or not 1 <= n_matched <= MAX_MATCHED:
        raise InputError(f"window and min_count must be >= 1, n_groups >= 2, n_matched from 1 to {MAX_MATCHED}")
    clusters = list(range(len(docs))) if clusters is None else list(clusters)
    cl, a, b, cnt = pair_counts(docs, clusters, window)
    V = int(vectors.shape[0])
    if len(a) and int(max(a.max(), b.max())) >= V:
        raise InputError(f"a token id {int(max(a.max(), b.max()))} is outside the {V} vectors")
    t = _pair_table(cl, a, b, cnt, V, min_count)
    pa, pb, m = t.pa, t.pb, t.m
    sims = _similarities(vectors, pa, pb)
    dot, cos = sims(pa, pb)
    rng = np.random.default_rng(seed)
    draws = [np.stack(sims(pa, _matched(pa, pb, m, 10, rng))) for _ in range(n_matched)]
    pmi = _pmi(t.total, m[pa], m[pb], np.array(t.zc.sum()))
    point = _stats(pmi, dot, cos, _covariates(m[pa], m[pb]), draws)
    G = min(n_groups, t.n_cl) if t.n_cl >= 2 else 0  # one cluster: no interval
    group = rng.permutation(t.n_cl) % max(G, 1)
    rp = _replicates(t, G, group, min_count, dot, cos, draws)
    rs = {k: _jackknife(float(point[j]), rp[:, j]) for j, k in enumerate(_STATS)}
    ex = _jackknife(float(point[1] - point[6]), rp[:, 1] - rp[:, 6])
    return Cooccurrence(model_name=model_name, n_docs=len(docs), n_clusters=t.n_cl, n_tokens=sum(len(d) for d in docs),
                        n_pairs=len(pa), window=window, min_count=min_count, **rs, excess_cos=ex, n_groups=len(rp),
                        n_matched=n_matched, seed=seed)  # fmt: skip


@dataclass(frozen=True)
class _PairTable:
    """The counts :func:`cooccurrence` correlates: the pairs seen at least ``min_count`` times (token ids ``pa``,
    ``pb``) with their ``total`` counts; per cluster of documents, the tokens' marginal counts ``marg``
    [clusters, V] and the kept pairs' counts ``dcl`` [clusters, pairs]; ``zc`` the marginals' sum per cluster and
    ``m`` the tokens' marginal counts over every cluster (what each jackknife replicate reweights)."""

    n_cl: int
    pa: np.ndarray
    pb: np.ndarray
    total: np.ndarray
    marg: sparse.csr_matrix
    dcl: sparse.csr_matrix
    zc: np.ndarray
    m: np.ndarray


def _pair_table(cl: np.ndarray, a: np.ndarray, b: np.ndarray, cnt: np.ndarray, V: int, min_count: int) -> _PairTable:
    """The :class:`_PairTable` of the pair counts ``cnt`` of tokens ``a``, ``b`` in clusters ``cl``
    (:func:`pair_counts`)."""
    _, cl = np.unique(cl, return_inverse=True)
    n_cl = int(cl.max()) + 1 if len(cl) else 0
    key, pair = np.unique(a * V + b, return_inverse=True)
    total = np.bincount(pair, weights=cnt)
    keep = np.nonzero(total >= min_count)[0]
    if len(keep) < 3:
        raise InputError(f"only {len(keep)} token pairs co-occur at least {min_count} times; give more text")
    pa, pb = key[keep] // V, key[keep] % V
    marg = sparse.csr_matrix((np.concatenate([cnt, cnt]), (np.concatenate([cl, cl]), np.concatenate([a, b]))),
                             shape=(n_cl, V)).astype(np.float64)  # fmt: skip
    zc = 2.0 * np.bincount(cl, weights=cnt, minlength=n_cl)
    remap = np.full(len(key), -1)
    remap[keep] = np.arange(len(keep))
    sel = remap[pair] >= 0
    dcl = sparse.csr_matrix((cnt[sel], (cl[sel], remap[pair][sel])), shape=(n_cl, len(keep))).astype(np.float64)
    m = np.asarray(marg.sum(0)).ravel()
    return _PairTable(n_cl, pa, pb, total[keep], marg, dcl, zc, m)


def _similarities(
    vectors: torch.Tensor, pa: np.ndarray, pb: np.ndarray
) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``sims(x, y)``: the inner products and cosines of the rows of ``vectors`` of the token pairs (x, y), read in
    float64 from the rows of the tokens in a pair (``pa``, ``pb``) only."""
    toks = np.unique(np.concatenate([pa, pb]))  # only the rows of tokens in a pair, in float64
    E = vectors.detach()[torch.as_tensor(toks)].double().cpu().numpy()
    norms = np.linalg.norm(E, axis=1).clip(1e-12)

    def sims(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i, j = np.searchsorted(toks, x), np.searchsorted(toks, y)
        d = np.einsum("ij,ij->i", E[i], E[j])
        return d, d / (norms[i] * norms[j])

    return sims


def _replicates(
    t: _PairTable,
    G: int,
    group: np.ndarray,
    min_count: int,
    dot: np.ndarray,
    cos: np.ndarray,
    draws: Sequence[np.ndarray],
) -> np.ndarray:
    """The jackknife replicates [G, stats] of :data:`_STATS`: the whole procedure without one ``group`` of
    clusters at a time (NaN where fewer than 3 pairs are left)."""
    reps = []
    for gi in range(G):  # the whole procedure without one group of clusters
        w = (group != gi).astype(np.float64)
        c, mm = t.dcl.T @ w, t.marg.T @ w
        ok = c >= min_count
        if ok.sum() < 3:
            reps.append(np.full(len(_STATS), np.nan))
            continue
        pa, pb = t.pa, t.pb
        pm = _pmi(c[ok], mm[pa[ok]], mm[pb[ok]], np.array(t.zc @ w))
        reps.append(_stats(pm, dot[ok], cos[ok], _covariates(mm[pa[ok]], mm[pb[ok]]), [d[:, ok] for d in draws]))
    return np.array(reps).reshape(-1, len(_STATS))


__all__ = [
    "CLASS_RULES",
    "BlockContrast",
    "ClassContrast",
    "Cooccurrence",
    "Correlation",
    "block_contrast",
    "cooccurrence",
    "pair_counts",
    "partial_spearman",
    "spearman",
    "token_class",
    "token_classes",
]
