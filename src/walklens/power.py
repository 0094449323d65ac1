"""The power-method view of a layer (seed 002, Li & Altafini, "Analogies between Transformer Layers and Power
Method"): eigen-analysis of F = W_V W_O (:mod:`walklens.ov`) and alignment of tokens with F's principal
eigenvector through depth; the idealised (feed-forward-free) dynamics and shared-weight models are in
:mod:`walklens.idealised`, steering in :mod:`walklens.steering`.

Only the seed's abstract is available, so the definitions used here are walklens' own, stated once:

- **F of a layer** (seed 000, sec. 2.2.1 and A.3): ``F = sum_h W_v,h W_o,h`` in the row convention, computed
  through its thin factors (:func:`~walklens.ov.ov_factors`, :func:`~walklens.ov.eigen_factored`).
- **Power step** (the seed's simplified layer reduced to its linear core): ``x <- x F / |x F|``.  In the row
  convention it converges to F's principal *left* eigenvector v1 (``v1 F = lambda1 v1``), which is the
  principal (right) eigenvector of ``F^T = W_O^T W_V^T``, i.e. of the seed's "output times value" matrix
  in the column convention.  walklens' ``v1`` is this vector; ``v1_right`` (``F v = lambda1 v``) is kept too.
  If lambda1 is one of a complex-conjugate pair, the iteration converges to a real 2-D invariant subspace
  (the plane spanned by Re and Im of the eigenvector): ``basis`` then holds 2 orthonormal rows, alignment is
  measured against the plane, and the gap is ``|lambda3| / |lambda1|``.
- **Convergence rate**: ``tan theta_l = tan theta_0 * rho^l`` with ``rho = |lambda2| / |lambda1|`` (the spectral
  gap; the next distinct modulus for a complex pair), which is exact when x_0 has two eigen-components and the
  asymptotic rate otherwise.  For the residual form ``x <- Norm(x + x F)`` (post-norm, no feed-forward) the
  same holds for ``I + F``: eigenvalues ``1 + lambda_i`` (and 1 on F's null space).
- **Alignment** of a token x with layer l: ``|cos(x, v1(F_l))|`` (the norm of x's projection on the plane,
  over |x|, for a complex pair), at layer l's input, mid-residual and output.

Precision: whatever the model's dtype, F's factors, eigenvalues and eigenvectors are float64 computations from
the model's own weights (:mod:`walklens.ov`; a bfloat16 weight converts exactly), and alignment reads vectors
recorded in float32 (:func:`~walklens.capture.capture`) in float64.  Results record the model's dtype
(``model_dtype``).

Analyses return plain dataclasses and never draw (:mod:`walklens.reports.power` draws).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .capture import capture
from .display import Shown
from .errors import EmptyTextError, InputError
from .frames import Columns, DataFrame, concat_columns, frame, long_table, pick, point_kind, record_table
from .ov import Eigen, eigen_factored, ov_factors, residual_gap
from .precision import dtype_name

if TYPE_CHECKING:
    from .loading import LoadedModel


# ---- spectra --------------------------------------------------------------------------------------------------


@dataclass
class HeadSpectrum:
    """One head's W_vo,h = W_v,h W_o,h (seed 000, A.3): eigenvalues via the d x d product W_o,h W_v,h."""

    head: int
    eigenvalues: torch.Tensor
    v1: torch.Tensor
    complex_pair: bool
    gap: float


@dataclass
class LayerSpectrum(Eigen):
    """Spectrum of one layer's F = sum_h W_vo,h (seed 002): the :class:`Eigen` fields plus what follows.

    ``nearest``/``nearest_cos``: tokens of V closest (cosine) to +v1 (v1's sign is fixed so that the
    closest token by |cos| has positive cosine); ``opposite``: closest to -v1.  For a complex pair, tokens by
    alignment with the plane (``opposite`` empty).  ``residual_gap``: the gap of I + F."""

    layer: int
    residual_gap: float
    nearest: list[str] = field(default_factory=list)
    nearest_cos: list[float] = field(default_factory=list)
    opposite: list[str] = field(default_factory=list)
    opposite_cos: list[float] = field(default_factory=list)
    heads: list[HeadSpectrum] = field(default_factory=list)

    @property
    def lambda1(self) -> complex:
        return complex(self.eigenvalues[0])


@dataclass
class PowerSpectra(Shown, view="spectra"):
    """Per-layer spectra of a model (``layers[i].layer`` is the layer index)."""

    model_name: str
    d_model: int
    layers: list[LayerSpectrum]
    shared: bool = False
    model_dtype: str = "float32"

    def __getitem__(self, layer: int) -> LayerSpectrum:
        for s in self.layers:
            if s.layer == layer:
                return s
        raise InputError(f"no spectrum for layer {layer}")

    def __len__(self) -> int:
        return len(self.layers)

    def _columns(self, table: str = "layers") -> Columns:
        """The plain columns of :meth:`to_pandas`."""

        def lead(s: HeadSpectrum | LayerSpectrum) -> dict[str, object]:
            lam = complex(s.eigenvalues[0]) if len(s.eigenvalues) else 0j
            return {
                "lambda1_re": lam.real,
                "lambda1_im": lam.imag,
                "lambda1_abs": abs(lam),
                "complex_pair": s.complex_pair,
                "gap": s.gap,
            }

        def eigenvalues() -> Columns:
            parts = []
            for s in self.layers:
                for head, ev in [(None, s.eigenvalues), *((h.head, h.eigenvalues) for h in s.heads)]:
                    parts.append(
                        long_table(
                            [("index", range(len(ev)))],
                            {"re": ev.real.double(), "im": ev.imag.double(), "abs": ev.abs().double()},
                            constants={"layer": s.layer, "head": head},
                        )
                    )
            return concat_columns(parts)

        def vectors() -> Columns:
            parts = []
            for s in self.layers:
                named = [
                    (None, "v1", s.v1),
                    *((None, f"basis_{i}", b) for i, b in enumerate(s.basis)),
                    (None, "v1_right", s.v1_right),
                    *((h.head, "v1", h.v1) for h in s.heads),
                ]
                for head, name, v in named:
                    parts.append(
                        long_table(
                            [("dim", range(len(v)))],
                            {"value": v.double()},
                            constants={"layer": s.layer, "head": head, "vector": name},
                        )
                    )
            return concat_columns(parts)

        def tokens() -> Columns:
            return record_table(
                [
                    {"layer": s.layer, "side": side, "rank": r, "token": t, "cos": c}
                    for s in self.layers
                    for side, toks, cos in (
                        ("nearest", s.nearest, s.nearest_cos),
                        ("opposite", s.opposite, s.opposite_cos),
                    )
                    for r, (t, c) in enumerate(zip(toks, cos))
                ],
                ["layer", "side", "rank", "token", "cos"],
            )

        return pick(
            table,
            {
                "layers": lambda: record_table(
                    [{"layer": s.layer, **lead(s), "residual_gap": s.residual_gap} for s in self.layers]
                ),
                "heads": lambda: record_table(
                    [{"layer": s.layer, "head": h.head, **lead(h)} for s in self.layers for h in s.heads],
                    ["layer", "head", "lambda1_re", "lambda1_im", "lambda1_abs", "complex_pair", "gap"],
                ),
                "eigenvalues": eigenvalues,
                "vectors": vectors,
                "tokens": tokens,
            },
            "PowerSpectra",
        )

    def to_pandas(self, table: str = "layers") -> DataFrame:
        """The spectra as tables (pandas; docs/notebooks.md, "Tables"): ``layers`` one row per layer (lambda1 of
        F = W_V W_O, gaps); ``heads`` the same per (layer, head); ``eigenvalues`` every eigenvalue per (layer,
        head, index) (``head`` missing: the layer's F); ``vectors`` v1, the basis rows and v1_right per (layer,
        head, vector, dim); ``tokens`` v1's nearest and opposite tokens per (layer, side, rank)."""
        return frame(
            self._columns(table),
            {"model": self.model_name, "d_model": self.d_model, "shared": self.shared, "model_dtype": self.model_dtype},
        )


def _unit_rows(lm: LoadedModel) -> torch.Tensor:
    V = lm.embedding_matrix().detach().float().cpu()
    return V / V.norm(dim=1, keepdim=True).clamp_min(1e-12)


def _nearest_tokens(
    lm: LoadedModel, basis: torch.Tensor, k: int, Vn: torch.Tensor | None
) -> tuple[torch.Tensor, list[str], list[float], list[str], list[float]]:
    if Vn is None or Vn.shape[1] != basis.shape[1] or k <= 0:
        return basis, [], [], [], []  # e.g. ALBERT: V lives in E-space, not D-space
    basis_f = basis.float()
    if basis.shape[0] == 1:
        cos = Vn @ basis_f[0]
        if cos.abs().max() == -cos.min():  # fix the sign: the closest token has positive cosine
            basis, cos = -basis, -cos
        top = torch.topk(cos, k)
        bot = torch.topk(-cos, k)
        return (
            basis,
            lm.token_strings(top.indices.tolist()),
            top.values.tolist(),
            lm.token_strings(bot.indices.tolist()),
            (-bot.values).tolist(),
        )
    proj = (Vn @ basis_f.T).norm(dim=1)
    top = torch.topk(proj, k)
    return basis, lm.token_strings(top.indices.tolist()), top.values.tolist(), [], []


def _layer_spectrum(lm: LoadedModel, layer: int, heads: bool, nearest: int, Vn: torch.Tensor | None) -> LayerSpectrum:
    hw = lm.adapter.head_weights(lm.model, layer)
    A, B = ov_factors(lm, layer, hw=hw, grouped=True)
    e = eigen_factored(A, B)
    basis, near, near_c, opp, opp_c = _nearest_tokens(lm, e.basis, nearest, Vn)
    v1 = basis[0].clone()
    hs: list[HeadSpectrum] = []
    if heads:
        for h in range(hw.n_heads):
            eh = eigen_factored(*ov_factors(lm, layer, h, hw=hw))
            hs.append(HeadSpectrum(h, eh.eigenvalues, eh.v1, eh.complex_pair, eh.gap))
    return LayerSpectrum(
        layer=layer,
        eigenvalues=e.eigenvalues,
        v1=v1,
        basis=basis,
        v1_right=e.v1_right,
        complex_pair=e.complex_pair,
        gap=e.gap,
        residual_gap=residual_gap(e.eigenvalues, A.shape[0]),
        nearest=near,
        nearest_cos=near_c,
        opposite=opp,
        opposite_cos=opp_c,
        heads=hs,
    )


def _is_shared(lm: LoadedModel) -> bool:
    mods = lm.adapter.layer_modules(lm.model)
    return len({id(m) for m in mods}) < len(mods)


@torch.no_grad()
def power_spectra(
    lm: LoadedModel,
    *,
    layers: Sequence[int] | None = None,
    heads: bool = True,
    nearest: int = 8,
    progress: bool = False,
) -> PowerSpectra:
    """Eigenvalues, principal eigenvector v1, spectral gap and v1's nearest tokens of F = W_V W_O for every
    layer (and head) of ``lm`` (seed 002; F from seed 000, sec. 2.2.1).  Computed through the small factored
    product; a shared-weight stack (ALBERT) is decomposed once and reported at every depth."""
    from tqdm.auto import tqdm

    n = lm.n_layers
    idx = list(range(n)) if layers is None else [l + n if l < 0 else l for l in layers]
    for l in idx:
        if not 0 <= l < n:
            raise InputError(f"layer {l} out of range: the model has {n} layers")
    mods = lm.adapter.layer_modules(lm.model)
    done: dict[int, LayerSpectrum] = {}
    out: list[LayerSpectrum] = []
    Vn = _unit_rows(lm) if nearest > 0 else None
    for l in tqdm(idx, desc="spectra", disable=not progress, leave=False):
        key = id(mods[l])
        if key in done:
            s = done[key]
            out.append(LayerSpectrum(**{**s.__dict__, "layer": l}))
            continue
        s = _layer_spectrum(lm, l, heads, nearest, Vn)
        done[key] = s
        out.append(s)
    return PowerSpectra(
        model_name=lm.name,
        d_model=lm.d_model if out and out[0].v1.shape[0] == lm.d_model else (out[0].v1.shape[0] if out else 0),
        layers=out,
        shared=_is_shared(lm),
        model_dtype=dtype_name(lm.dtype),
    )


# ---- alignment through depth ------------------------------------------------------------------------------------


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
    if not all_layers:
        raise EmptyTextError("no tokens left to measure")
    C = torch.cat(all_layers, dim=2)  # [L, P, N]
    R = torch.cat(all_rand, dim=2)  # [P, Rn, N]
    own = C[li, torch.arange(P)]  # [P, N]
    r_mean, r_lo, r_hi = _band(R.mean(2), dim=1)
    other_means = C.mean(2)  # [L, P]
    o_mean, o_lo, o_hi = _other_layers_band(other_means, li)
    sh = torch.stack([other_means[torch.tensor([perm[int(i)] for i in li]), torch.arange(P)] for perm in perms])
    s_mean, s_lo, s_hi = _band(sh, dim=0)
    return Alignment(
        model_name=model_name,
        points=list(points),
        layer_of=list(layer_of),
        mean=own.mean(1).tolist(),
        std=own.std(1, unbiased=False).tolist(),
        random_mean=r_mean,
        random_lo=r_lo,
        random_hi=r_hi,
        other_mean=o_mean,
        other_lo=o_lo,
        other_hi=o_hi,
        shuffled_mean=s_mean,
        shuffled_lo=s_lo,
        shuffled_hi=s_hi,
        per_token=per_token,
        tokens=[list(t) for t in (tokens or [])],
        n_tokens=int(own.shape[1]),
        skip_first=skip_first,
        model_dtype=model_dtype,
    )


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


# ---- analytic power method -----------------------------------------------------------------------------------


def power_iterate(F: torch.Tensor, x0: torch.Tensor, steps: int, residual: bool = False) -> torch.Tensor:
    """The power method in the row convention: ``x_{l+1} = x_l M / |x_l M| * |x_0|`` with M = F (or I + F when
    ``residual``), for rows ``x0`` [N, D]; returns [steps + 1, N, D] (index 0 is x0)."""
    M = F.double() + (torch.eye(F.shape[0], dtype=torch.float64) if residual else 0)
    x = x0.double()
    scale = x.norm(dim=-1, keepdim=True)
    out = [x]
    for _ in range(steps):
        y = x @ M
        x = y / y.norm(dim=-1, keepdim=True).clamp_min(1e-300) * scale
        out.append(x)
    return torch.stack(out)


def predicted_alignment(cos0: torch.Tensor, rho: float, steps: int) -> torch.Tensor:
    """Analytic power-method prediction: from |cos theta_0| per token and rate rho, the mean over tokens of
    |cos theta_l| with ``tan theta_l = tan theta_0 * rho^l``, for l = 0..steps ([steps + 1])."""
    c0 = cos0.double().clamp(1e-12, 1.0)
    tan0 = (1 - c0**2).clamp_min(0).sqrt() / c0
    l = torch.arange(steps + 1, dtype=torch.float64).view(-1, 1)
    tan_l = tan0.view(1, -1) * (rho**l)
    return (1 / (1 + tan_l**2).sqrt()).mean(1)


def fitted_rate(cos: Sequence[float] | torch.Tensor, start: int = 0, floor: float = 1e-6) -> float:
    """Rate rho fitted to an alignment curve: slope of log tan(theta_l) against l (least squares) from
    ``start``, using only points where tan theta >= ``floor`` (below it, tan from cos loses float64 precision)."""
    c = torch.as_tensor(cos, dtype=torch.float64).clamp(1e-12, 1.0)
    tan = (1 - c**2).clamp_min(0).sqrt() / c
    l = torch.arange(len(c), dtype=torch.float64)
    keep = (l >= start) & (tan > floor)
    if int(keep.sum()) < 2:
        return float("nan")
    x, y = l[keep], tan[keep].log()
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return float(slope.exp())


__all__ = [
    "power_spectra",
    "alignment",
    "alignment_from_states",
    "PowerSpectra",
    "LayerSpectrum",
    "HeadSpectrum",
    "Alignment",
    "power_iterate",
    "predicted_alignment",
    "fitted_rate",
]
