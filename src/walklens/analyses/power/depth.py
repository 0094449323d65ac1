"""Alignment of tokens with F's principal eigenvector through depth (seed 002): |cos(x, v1(F_l))| at layer l's
input, mid-residual and output, next to random-direction, other-layer and shuffled-layer baselines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...base.display import Shown
from ...base.errors import EmptyTextError, InputError
from ...base.frames import Columns, DataFrame, concat_columns, frame, long_table, pick, point_kind
from ...base.precision import dtype_name
from ...core.capture import capture
from .spectra import PowerSpectra, power_spectra

if TYPE_CHECKING:
    from ...core.loading import LoadedModel


@dataclass
class Alignment(Shown, view="alignment"):
    """Mean |cos(x, v1(F_l))| of every token at each point of layer l, with chance baselines (seed 002).

    Per point (``points[i]``, on layer ``layer_of[i]``): ``mean``/``std`` over all tokens of all texts;
    ``random_*``: isotropic random directions (planes for a complex pair) of equal dimension, mean and 5-95 %
    band over directions of the corpus mean; ``other_*``: v1 of every other layer (band over layers);
    ``shuffled_*``: the whole curve with the layers' v1 assigned by a random derangement (band over
    derangements).  ``per_token[j]`` [points, tokens] holds text j's values; ``tokens[j]`` its tokens."""

    model_name: str
    points: list[str]
    layer_of: list[int]
    mean: list[float]
    std: list[float]
    random_mean: list[float]
    random_lo: list[float]
    random_hi: list[float]
    other_mean: list[float]
    other_lo: list[float]
    other_hi: list[float]
    shuffled_mean: list[float]
    shuffled_lo: list[float]
    shuffled_hi: list[float]
    per_token: list[torch.Tensor]
    tokens: list[list[str]]
    n_tokens: int
    skip_first: bool = False
    model_dtype: str = "float32"

    def at(self, kind: str) -> tuple[list[int], list[float]]:
        """(layers, mean) for one kind of point (``"resid_pre"``, ``"resid_mid"``, ``"resid_post"``)."""
        sel = [i for i, p in enumerate(self.points) if p.endswith("." + kind)]
        return [self.layer_of[i] for i in sel], [self.mean[i] for i in sel]

    def above(self, band: str, kind: str = "resid_post") -> tuple[int, int]:
        """(layers whose mean alignment at ``kind`` is above the top of chance band ``band`` (``"random"``,
        ``"other"``, ``"shuffled"``: the 95th percentile, so 5 % of null layers cross it), layers)."""
        top = {"random": self.random_hi, "other": self.other_hi, "shuffled": self.shuffled_hi}[band]
        sel = [i for i, p in enumerate(self.points) if p.endswith("." + kind)]
        return sum(1 for i in sel if self.mean[i] > top[i]), len(sel)

    def _columns(self, table: str = "points") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        stats = (
            "mean",
            "std",
            "random_mean",
            "random_lo",
            "random_hi",
            "other_mean",
            "other_lo",
            "other_hi",
            "shuffled_mean",
            "shuffled_lo",
            "shuffled_hi",
        )

        def points() -> Columns:
            return long_table(
                [("point", list(self.points))],
                {k: list(getattr(self, k)) for k in stats},
                by_axis={"point": {"layer": list(self.layer_of), "kind": [point_kind(p) for p in self.points]}},
            )

        def tokens() -> Columns:
            first = 1 if self.skip_first else 0
            return concat_columns(
                [
                    long_table(
                        [("point", list(self.points)), ("position", range(first, first + v.shape[1]))],
                        {"alignment": v.double()},
                        constants={"text": j},
                        by_axis={"point": {"layer": list(self.layer_of)}, "position": {"token": list(toks)}},
                    )
                    for j, (v, toks) in enumerate(zip(self.per_token, self.tokens))
                ]
            )

        return pick(table, {"points": points, "tokens": tokens}, "an Alignment")

    def to_pandas(self, table: str = "points") -> DataFrame:
        """The alignment as tables (pandas; docs/notebooks.md, "Tables"): ``points`` one row per point (mean
        |cos(x, v1(F_l))| and the chance baselines); ``tokens`` one row per (text, point, position)."""
        return frame(
            self._columns(table),
            {
                "model": self.model_name,
                "n_tokens": self.n_tokens,
                "skip_first": self.skip_first,
                "model_dtype": self.model_dtype,
            },
        )


def cos_to_bases(X: torch.Tensor, bases: torch.Tensor, kdim: torch.Tensor) -> torch.Tensor:
    """|projection| / |x| of rows X [N, D] on each basis [L, 2, D] (second row ignored where kdim == 1)."""
    Xn = X / X.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    c = torch.einsum("nd,lkd->lnk", Xn, bases)  # [L, N, 2]
    c2 = c[..., 0] ** 2 + (kdim.view(-1, 1) == 2) * c[..., 1] ** 2
    return c2.sqrt()


def _bases_tensor(spectra: PowerSpectra) -> tuple[torch.Tensor, torch.Tensor]:
    L, D = len(spectra.layers), spectra.layers[0].basis.shape[1]
    bases = torch.zeros(L, 2, D, dtype=torch.float64)
    kdim = torch.zeros(L, dtype=torch.long)
    for i, s in enumerate(spectra.layers):
        bases[i, : s.basis.shape[0]] = s.basis
        kdim[i] = s.basis.shape[0]
    return bases, kdim


def random_bases(n: int, D: int, gen: torch.Generator) -> torch.Tensor:
    g = torch.randn(n, D, 2, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(g)
    return q.transpose(1, 2).contiguous()  # [n, 2, D]


def _derangement(n: int, gen: torch.Generator) -> list[int]:
    if n < 2:
        return list(range(n))
    while True:
        p = torch.randperm(n, generator=gen).tolist()
        if all(p[i] != i for i in range(n)):
            return p


def _band(x: torch.Tensor, dim: int = 0) -> tuple[list[float], list[float], list[float]]:
    q = torch.quantile(x, torch.tensor([0.05, 0.95], dtype=x.dtype), dim=dim)
    return x.mean(dim).tolist(), q[0].tolist(), q[1].tolist()


def as_texts(texts: str | Sequence[str]) -> list[str]:
    out = [texts] if isinstance(texts, str) else list(texts)
    out = [t for t in out if isinstance(t, str) and t.strip()]
    if not out:
        raise EmptyTextError("no non-empty text given")
    return out


@torch.no_grad()
def _other_layers_band(other_means: torch.Tensor, li: torch.Tensor) -> tuple[list[float], list[float], list[float]]:
    """Per point p, the band of the mean alignment with every *other* layer's v1 (``other_means`` [L, P])."""
    L, P = other_means.shape
    o_mean: list[float] = []
    o_lo: list[float] = []
    o_hi: list[float] = []
    for p in range(P):
        keep = torch.tensor([i for i in range(L) if i != int(li[p])], dtype=torch.long)
        vals = other_means[keep, p] if len(keep) else other_means[:, p]
        m, lo, hi = _band(vals[:, None], dim=0)  # [n, 1] -> one-element lists
        o_mean += m
        o_lo += lo
        o_hi += hi
    return o_mean, o_lo, o_hi


def alignment_from_states(
    states: Sequence[torch.Tensor],
    points: Sequence[str],
    layer_of: Sequence[int],
    spectra: PowerSpectra,
    *,
    tokens: Sequence[list[str]] | None = None,
    n_random: int = 200,
    n_shuffles: int = 50,
    seed: int = 0,
    model_name: str = "",
    skip_first: bool = False,
    model_dtype: str = "float32",
) -> Alignment:
    """:func:`alignment` on given states: ``states[j]`` is [points, tokens, D] for text j."""
    if not states:
        raise EmptyTextError("no states given")
    bases, kdim = _bases_tensor(spectra)
    layer_pos = {s.layer: i for i, s in enumerate(spectra.layers)}
    missing = sorted({l for l in layer_of if l not in layer_pos})
    if missing:
        raise InputError(f"the spectra have no layer(s) {missing}; compute them for every layer measured")
    li = torch.tensor([layer_pos[l] for l in layer_of])
    L, P = len(spectra.layers), len(points)
    gen = torch.Generator().manual_seed(seed)
    rnd = random_bases(n_random, bases.shape[-1], gen)
    perms = [_derangement(L, gen) for _ in range(n_shuffles)]
    per_token, all_layers, all_rand = _alignments(states, bases, kdim, rnd, li, P, skip_first)
    if not all_layers:
        raise EmptyTextError("no tokens left to measure")
    C = torch.cat(all_layers, dim=2)  # [L, P, N]
    R = torch.cat(all_rand, dim=2)  # [P, Rn, N]
    own = C[li, torch.arange(P)]  # [P, N]
    return Alignment(
        model_name=model_name,
        points=list(points),
        layer_of=list(layer_of),
        mean=own.mean(1).tolist(),
        std=own.std(1, unbiased=False).tolist(),
        **_baselines(C, R, li, perms, P),
        per_token=per_token,
        tokens=[list(t) for t in (tokens or [])],
        n_tokens=int(own.shape[1]),
        skip_first=skip_first,
        model_dtype=model_dtype,
    )


def _alignments(
    states: Sequence[torch.Tensor],
    bases: torch.Tensor,
    kdim: torch.Tensor,
    rnd: torch.Tensor,
    li: torch.Tensor,
    P: int,
    skip_first: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Per text of ``states`` (texts left with no token skipped): the alignment of each point with its own layer's
    v1 [P, T_j] (float32), with every layer's v1 [L, P, T_j], and with the random bases ``rnd`` [P, R, T_j] (a
    random line where the point's layer has a real v1, a random plane where it has a complex pair)."""
    L, n_random = bases.shape[0], rnd.shape[0]
    per_token: list[torch.Tensor] = []
    all_layers: list[torch.Tensor] = []  # [L, P, T_j] alignment with every layer's v1
    all_rand: list[torch.Tensor] = []  # [P, R, T_j]
    for X in states:
        X = X.double()
        if skip_first:
            X = X[:, 1:]
        if X.shape[1] == 0:
            continue
        P_, T, D = X.shape
        c = cos_to_bases(X.reshape(P_ * T, D), bases, kdim).reshape(L, P_, T)
        all_layers.append(c)
        per_token.append(c[li, torch.arange(P)].float())
        cr1 = cos_to_bases(X.reshape(P_ * T, D), rnd, torch.ones(n_random, dtype=torch.long)).reshape(n_random, P_, T)
        cr2 = cos_to_bases(X.reshape(P_ * T, D), rnd, torch.full((n_random,), 2)).reshape(n_random, P_, T)
        k_of_point = kdim[li].view(1, P, 1)
        all_rand.append(torch.where(k_of_point == 2, cr2, cr1).permute(1, 0, 2))
    return per_token, all_layers, all_rand


def _baselines(
    C: torch.Tensor, R: torch.Tensor, li: torch.Tensor, perms: list[list[int]], P: int
) -> dict[str, list[float]]:
    """The chance baselines of :class:`Alignment` from the alignments with every layer's v1 ``C`` [L, P, N] and with
    random bases ``R`` [P, Rn, N]: random directions, every other layer's v1, and the layers shuffled by the
    derangements ``perms``; each a mean and a 5-95% band per point."""
    r_mean, r_lo, r_hi = _band(R.mean(2), dim=1)
    other_means = C.mean(2)  # [L, P]
    o_mean, o_lo, o_hi = _other_layers_band(other_means, li)
    sh = torch.stack([other_means[torch.tensor([perm[int(i)] for i in li]), torch.arange(P)] for perm in perms])
    s_mean, s_lo, s_hi = _band(sh, dim=0)
    return {
        "random_mean": r_mean,
        "random_lo": r_lo,
        "random_hi": r_hi,
        "other_mean": o_mean,
        "other_lo": o_lo,
        "other_hi": o_hi,
        "shuffled_mean": s_mean,
        "shuffled_lo": s_lo,
        "shuffled_hi": s_hi,
    }


_KINDS = ("resid_pre", "resid_mid", "resid_post")


@torch.no_grad()
def alignment(
    lm: LoadedModel,
    texts: str | Sequence[str],
    *,
    spectra: PowerSpectra | None = None,
    kinds: Sequence[str] = _KINDS,
    n_random: int = 200,
    n_shuffles: int = 50,
    seed: int = 0,
    skip_first: bool = False,
    progress: bool = False,
) -> Alignment:
    """|cos(x, v1(F_l))| of every token of ``texts`` at layer l's input, mid-residual and output, averaged
    over the corpus, next to random-direction, other-layer and shuffled-layer baselines (seed 002: "passing
    through a layer the tokens tend to be tilted towards the principal eigenvector" of F_l).
    ``skip_first`` drops each text's first position (often an attention sink with outsized norm)."""
    from tqdm.auto import tqdm

    texts = as_texts(texts)
    spectra = spectra or power_spectra(lm, heads=False, nearest=0)
    states, toks = [], []
    points: list[str] = []
    for t in tqdm(texts, desc="alignment", disable=not progress, leave=False):
        tr = capture(lm, t, points=[f"L*.{k}" for k in kinds])
        if not points:
            points = [p for p in tr.points if p != "final"]
        states.append(torch.stack([tr[p] for p in points]))
        toks.append(tr.tokens[1:] if skip_first else tr.tokens)
    layer_of = [int(p[1:].split(".")[0]) for p in points]
    return alignment_from_states(
        states,
        points,
        layer_of,
        spectra,
        tokens=toks,
        n_random=n_random,
        n_shuffles=n_shuffles,
        seed=seed,
        model_name=lm.name,
        skip_first=skip_first,
        model_dtype=dtype_name(lm.dtype),
    )
