"""The power-method view of a layer (seed 002, Li & Altafini, "Analogies between Transformer Layers and Power
Method"): eigen-analysis of F = W_V W_O, alignment of tokens with F's principal eigenvector through depth,
the idealised (feed-forward-free) dynamics and shared-weight models.

Only the seed's abstract is available, so the definitions used here are walklens' own, stated once:

- **F of a layer** (seed 000, sec. 2.2.1 and A.3): ``F = sum_h W_v,h W_o,h`` in the row convention of seed
  000 (a token is a row vector x; a head writes ``A_h X W_v,h W_o,h``).  With grouped-query attention
  ``W_v,h`` is the value matrix of h's key/value head.  F = A B with the thin factors
  ``A = [W_v,kv(0) | ... | W_v,kv(H-1)]`` ([D, H d]) and ``B = [W_o,0; ...; W_o,H-1]`` ([H d, D]).  The
  nonzero eigenvalues of F are those of the small ``B A`` ([H d, H d]); per head, of ``W_o,h W_v,h`` ([d, d]).
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

The acceptance interface is :func:`power_spectra`, :func:`alignment` and :func:`steer` (see
:mod:`walklens.steering`).  Analyses return plain dataclasses and never draw (:mod:`walklens.reports.power`
draws).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch
from torch import nn

from .errors import EmptyTextError, InputError, UnsupportedFamilyError
from .models.base import HeadWeights, get_module

if TYPE_CHECKING:
    from .loading import LoadedModel

_REL_IMAG = 1e-9  # an eigenvalue is complex when |Im| > this * |lambda|


# ---- factors of F ---------------------------------------------------------------------------------------------

def ov_factors(lm: LoadedModel, layer: int, head: int | None = None, hw: HeadWeights | None = None,
               grouped: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The thin factors (A [D, n d], B [n d, D]) of F = A B for one layer (``head=None``: all heads), float64.

    Row convention (seed 000, A.3): ``x F = sum_h (x W_v,kv(h)) W_o,h``.  ``grouped``: with grouped-query
    attention, one block per key/value head, ``F = sum_g W_v,g (sum_{h in g} W_o,h)`` (same F, smaller factors)."""
    if hw is None:
        hw = lm.adapter.head_weights(lm.model, layer)
    if head is not None and not 0 <= head < hw.n_heads:
        raise InputError(f"layer {layer} has {hw.n_heads} heads; no head {head}")
    heads = list(range(hw.n_heads)) if head is None else [head]
    if grouped and head is None:
        groups = sorted(set(hw.kv_head))
        A = torch.cat([hw.w_v[g] for g in groups], dim=1).detach().double().cpu()
        B = torch.cat([sum(hw.w_o[h].detach().double() for h in heads if hw.kv_head[h] == g) for g in groups],
                      dim=0).cpu()
        return A, B
    A = torch.cat([hw.w_v[hw.kv_head[h]] for h in heads], dim=1).detach().double().cpu()
    B = torch.cat([hw.w_o[h] for h in heads], dim=0).detach().double().cpu()
    return A, B


def ov_matrix(lm: LoadedModel, layer: int, head: int | None = None) -> torch.Tensor:
    """The dense F = W_V W_O [D, D] of one layer (or head), float64, row convention (for checks)."""
    A, B = ov_factors(lm, layer, head, grouped=True)
    return A @ B


@dataclass
class Eigen:
    """Eigen-structure of F = A B computed through the small B A (see module docstring).

    ``eigenvalues``: complex128, sorted by modulus (descending), the eigenvalues of B A (F's nonzero ones,
    padded by zeros when B A is singular).  ``v1``: unit principal left eigenvector of F (real; for a complex
    pair the first row of ``basis``).  ``basis``: [k, D] orthonormal rows, k = 2 for a complex pair.
    ``gap``: |lambda_next| / |lambda1|.  ``v1_right``: the principal right eigenvector (F v = lambda1 v)."""

    eigenvalues: torch.Tensor
    v1: torch.Tensor
    basis: torch.Tensor
    v1_right: torch.Tensor
    complex_pair: bool
    gap: float

    @property
    def lambda1(self) -> complex:
        return complex(self.eigenvalues[0]) if len(self.eigenvalues) else 0j


def _real_basis(vec: torch.Tensor, pair: bool) -> torch.Tensor:
    """Orthonormal real rows spanning Re/Im of a complex eigenvector (1 row when the eigenvalue is real)."""
    if not pair:
        v = vec.real if vec.is_complex() else vec
        if v.norm() == 0:  # a real eigenvalue may come with a globally phased complex vector
            v = vec.imag
        return (v / v.norm().clamp_min(1e-300)).unsqueeze(0)
    m = torch.stack([vec.real, vec.imag], dim=1)  # [D, 2]
    q, _ = torch.linalg.qr(m)
    return q.T.contiguous()


def _phase_fix(vec: torch.Tensor) -> torch.Tensor:
    """Rotate a complex vector so its largest entry is real (a real eigenvector then has zero imaginary part)."""
    if not vec.is_complex():
        return vec
    i = int(vec.abs().argmax())
    return vec * (vec[i].conj() / vec[i].abs().clamp_min(1e-300))


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run LAPACK's non-symmetric eigensolver on one thread: for these small matrices threads only add
    contention (measured 16 s vs 0.9 s for a 576 x 576 eig on a busy 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _eig(M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with _one_thread():
        return torch.linalg.eig(M)


def eigen_factored(A: torch.Tensor, B: torch.Tensor) -> Eigen:
    """Principal eigen-structure of F = A B from the small M = B A (seed 002; TransformerLens-style factoring).

    Left: ``y M = lambda y`` gives ``v = y B`` with ``v F = lambda v``.  Right: ``M z = lambda z`` gives
    ``u = A z`` with ``F u = lambda u``."""
    A, B = A.double(), B.double()
    M = B @ A
    ev_l, Y = _eig(M.T)  # columns y with M^T y = lambda y  <=>  y^T M = lambda y^T
    order = torch.argsort(ev_l.abs(), descending=True, stable=True)
    ev_l, Y = ev_l[order], Y[:, order]
    lam1 = ev_l[0]
    pair = bool(abs(lam1.imag) > _REL_IMAG * max(abs(lam1), 1e-300))
    v = _phase_fix(Y[:, 0] @ B.to(Y.dtype))
    basis = _real_basis(v, pair)
    ev_r, Z = _eig(M)
    j = int(torch.argmin((ev_r - lam1).abs()))
    r = _phase_fix(A.to(Z.dtype) @ Z[:, j])
    right = _real_basis(r, pair)[0]
    mods = ev_l.abs()
    nxt = 2 if pair else 1
    gap = float(mods[nxt] / mods[0]) if len(mods) > nxt and mods[0] > 0 else float("nan")
    return Eigen(eigenvalues=ev_l, v1=basis[0].clone(), basis=basis, v1_right=right, complex_pair=pair, gap=gap)


def eigen_dense(F: torch.Tensor) -> Eigen:
    """The same quantities from a dense [D, D] F (reference for checks; O(D^3))."""
    F = F.double()
    ev, Y = _eig(F.T)
    order = torch.argsort(ev.abs(), descending=True, stable=True)
    ev, Y = ev[order], Y[:, order]
    lam1 = ev[0]
    pair = bool(abs(lam1.imag) > _REL_IMAG * max(abs(lam1), 1e-300))
    basis = _real_basis(_phase_fix(Y[:, 0]), pair)
    ev_r, Z = _eig(F)
    j = int(torch.argmin((ev_r - lam1).abs()))
    right = _real_basis(_phase_fix(Z[:, j]), pair)[0]
    mods = ev.abs()
    nxt = 2 if pair else 1
    gap = float(mods[nxt] / mods[0]) if mods[0] > 0 else float("nan")
    return Eigen(eigenvalues=ev, v1=basis[0].clone(), basis=basis, v1_right=right, complex_pair=pair, gap=gap)


def residual_gap(eigenvalues: torch.Tensor, d_model: int) -> float:
    """|mu_next| / |mu1| for I + F: eigenvalues 1 + lambda_i, plus 1 on F's null space (D - len(lambda) of
    them); when mu1 is one of a complex-conjugate pair, mu_next is the next after its conjugate."""
    mu = 1 + eigenvalues.to(torch.complex128)
    if d_model > len(eigenvalues):
        mu = torch.cat([mu, torch.ones(1, dtype=mu.dtype)])
    mu = mu[torch.argsort(mu.abs(), descending=True, stable=True)]
    if len(mu) < 2 or mu[0].abs() == 0:
        return float("nan")
    pair = bool(abs(mu[0].imag) > _REL_IMAG * float(mu[0].abs()))
    nxt = 2 if pair else 1
    return float(mu[nxt].abs() / mu[0].abs()) if len(mu) > nxt else float("nan")


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
class PowerSpectra:
    """Per-layer spectra of a model (``layers[i].layer`` is the layer index)."""

    model_name: str
    d_model: int
    layers: list[LayerSpectrum]
    shared: bool = False

    def __getitem__(self, layer: int) -> LayerSpectrum:
        for s in self.layers:
            if s.layer == layer:
                return s
        raise InputError(f"no spectrum for layer {layer}")

    def __len__(self) -> int:
        return len(self.layers)


def _unit_rows(lm: LoadedModel) -> torch.Tensor:
    V = lm.embedding_matrix().detach().float().cpu()
    return V / V.norm(dim=1, keepdim=True).clamp_min(1e-12)


def _nearest_tokens(lm: LoadedModel, basis: torch.Tensor, k: int, Vn: torch.Tensor | None
                    ) -> tuple[torch.Tensor, list[str], list[float], list[str], list[float]]:
    if Vn is None or Vn.shape[1] != basis.shape[1] or k <= 0:
        return basis, [], [], [], []  # e.g. ALBERT: V lives in E-space, not D-space
    basis_f = basis.float()
    dec = lambda ids: [lm.tokenizer.decode([int(i)]) for i in ids]  # noqa: E731
    if basis.shape[0] == 1:
        cos = Vn @ basis_f[0]
        if cos.abs().max() == -cos.min():  # fix the sign: the closest token has positive cosine
            basis, cos = -basis, -cos
        top = torch.topk(cos, k)
        bot = torch.topk(-cos, k)
        return basis, dec(top.indices), top.values.tolist(), dec(bot.indices), (-bot.values).tolist()
    proj = (Vn @ basis_f.T).norm(dim=1)
    top = torch.topk(proj, k)
    return basis, dec(top.indices), top.values.tolist(), [], []


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
    return LayerSpectrum(layer=layer, eigenvalues=e.eigenvalues, v1=v1, basis=basis, v1_right=e.v1_right,
                         complex_pair=e.complex_pair, gap=e.gap, residual_gap=residual_gap(e.eigenvalues, A.shape[0]),
                         nearest=near, nearest_cos=near_c, opposite=opp, opposite_cos=opp_c, heads=hs)


def _is_shared(lm: LoadedModel) -> bool:
    mods = lm.adapter.layer_modules(lm.model)
    return len({id(m) for m in mods}) < len(mods)


@torch.no_grad()
def power_spectra(model: LoadedModel, *, layers: Sequence[int] | None = None, heads: bool = True,
                  nearest: int = 8, progress: bool = False) -> PowerSpectra:
    """Eigenvalues, principal eigenvector v1, spectral gap and v1's nearest tokens of F = W_V W_O for every
    layer (and head) of ``model`` (seed 002; F from seed 000, sec. 2.2.1).  Computed through the small factored
    product; a shared-weight stack (ALBERT) is decomposed once and reported at every depth."""
    from tqdm.auto import tqdm

    lm = model
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
    return PowerSpectra(model_name=lm.name, d_model=lm.d_model if out and out[0].v1.shape[0] == lm.d_model
                        else (out[0].v1.shape[0] if out else 0), layers=out, shared=_is_shared(lm))


# ---- alignment through depth ------------------------------------------------------------------------------------

@dataclass
class Alignment:
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

    def at(self, kind: str) -> tuple[list[int], list[float]]:
        """(layers, mean) for one kind of point (``"resid_pre"``, ``"resid_mid"``, ``"resid_post"``)."""
        sel = [i for i, p in enumerate(self.points) if p.endswith("." + kind)]
        return [self.layer_of[i] for i in sel], [self.mean[i] for i in sel]


def _cos_to_bases(X: torch.Tensor, bases: torch.Tensor, kdim: torch.Tensor) -> torch.Tensor:
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


def _random_bases(n: int, D: int, gen: torch.Generator) -> torch.Tensor:
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


def _as_texts(texts: str | Sequence[str]) -> list[str]:
    out = [texts] if isinstance(texts, str) else list(texts)
    out = [t for t in out if isinstance(t, str) and t.strip()]
    if not out:
        raise EmptyTextError("no non-empty text given")
    return out


@torch.no_grad()
def alignment_from_states(states: Sequence[torch.Tensor], points: Sequence[str], layer_of: Sequence[int],
                          spectra: PowerSpectra, *, tokens: Sequence[list[str]] | None = None,
                          n_random: int = 200, n_shuffles: int = 50, seed: int = 0, model_name: str = "",
                          skip_first: bool = False) -> Alignment:
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
    rnd = _random_bases(n_random, bases.shape[-1], gen)
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
        c = _cos_to_bases(X.reshape(P_ * T, D), bases, kdim).reshape(L, P_, T)
        all_layers.append(c)
        per_token.append(c[li, torch.arange(P)].float())
        cr1 = _cos_to_bases(X.reshape(P_ * T, D), rnd, torch.ones(n_random, dtype=torch.long)).reshape(n_random, P_, T)
        cr2 = _cos_to_bases(X.reshape(P_ * T, D), rnd, torch.full((n_random,), 2)).reshape(n_random, P_, T)
        k_of_point = kdim[li].view(1, P, 1)
        all_rand.append(torch.where(k_of_point == 2, cr2, cr1).permute(1, 0, 2))
    if not all_layers:
        raise EmptyTextError("no tokens left to measure")
    C = torch.cat(all_layers, dim=2)  # [L, P, N]
    R = torch.cat(all_rand, dim=2)  # [P, Rn, N]
    own = C[li, torch.arange(P)]  # [P, N]
    r_mean, r_lo, r_hi = _band(R.mean(2), dim=1)
    other_means = C.mean(2)  # [L, P]
    o_mean, o_lo, o_hi = [], [], []
    for p in range(P):
        keep = torch.tensor([i for i in range(L) if i != int(li[p])], dtype=torch.long)
        vals = other_means[keep, p] if len(keep) else other_means[:, p]
        m, lo, hi = _band(vals)
        o_mean.append(m), o_lo.append(lo), o_hi.append(hi)
    sh = torch.stack([other_means[torch.tensor([perm[int(i)] for i in li]), torch.arange(P)] for perm in perms])
    s_mean, s_lo, s_hi = _band(sh, dim=0)
    return Alignment(model_name=model_name, points=list(points), layer_of=list(layer_of), mean=own.mean(1).tolist(),
                     std=own.std(1, unbiased=False).tolist(), random_mean=r_mean, random_lo=r_lo, random_hi=r_hi,
                     other_mean=o_mean, other_lo=o_lo, other_hi=o_hi, shuffled_mean=s_mean, shuffled_lo=s_lo,
                     shuffled_hi=s_hi, per_token=per_token, tokens=[list(t) for t in (tokens or [])],
                     n_tokens=int(own.shape[1]), skip_first=skip_first)


_KINDS = ("resid_pre", "resid_mid", "resid_post")


@torch.no_grad()
def alignment(model: LoadedModel, texts: str | Sequence[str], *, spectra: PowerSpectra | None = None,
              kinds: Sequence[str] = _KINDS, n_random: int = 200, n_shuffles: int = 50, seed: int = 0,
              skip_first: bool = False, progress: bool = False) -> Alignment:
    """|cos(x, v1(F_l))| of every token of ``texts`` at layer l's input, mid-residual and output, averaged
    over the corpus, next to random-direction, other-layer and shuffled-layer baselines (seed 002: "passing
    through a layer the tokens tend to be tilted towards the principal eigenvector" of F_l).
    ``skip_first`` drops each text's first position (often an attention sink with outsized norm)."""
    from tqdm.auto import tqdm

    from .capture import capture

    lm = model
    texts = _as_texts(texts)
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
    return alignment_from_states(states, points, layer_of, spectra, tokens=toks, n_random=n_random,
                                 n_shuffles=n_shuffles, seed=seed, model_name=lm.name, skip_first=skip_first)


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
    tan0 = (1 - c0 ** 2).clamp_min(0).sqrt() / c0
    l = torch.arange(steps + 1, dtype=torch.float64).view(-1, 1)
    tan_l = tan0.view(1, -1) * (rho ** l)
    return (1 / (1 + tan_l ** 2).sqrt()).mean(1)


def fitted_rate(cos: Sequence[float] | torch.Tensor, start: int = 0, floor: float = 1e-6) -> float:
    """Rate rho fitted to an alignment curve: slope of log tan(theta_l) against l (least squares) from
    ``start``, using only points where tan theta >= ``floor`` (below it, tan from cos loses float64 precision)."""
    c = torch.as_tensor(cos, dtype=torch.float64).clamp(1e-12, 1.0)
    tan = (1 - c ** 2).clamp_min(0).sqrt() / c
    l = torch.arange(len(c), dtype=torch.float64)
    keep = (l >= start) & (tan > floor)
    if int(keep.sum()) < 2:
        return float("nan")
    x, y = l[keep], tan[keep].log()
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return float(slope.exp())


# ---- idealised dynamics ----------------------------------------------------------------------------------------

@contextmanager
def ablate_mlps(model: LoadedModel) -> Iterator[None]:
    """Zero every layer's feed-forward contribution (the ``mlp_out`` module's output) via forward hooks;
    hooks are removed on exit, even on error."""
    lm = model
    spec = lm.adapter.stack()
    handles = []

    def zero(_m: nn.Module, _inp: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            return (torch.zeros_like(output[0]),) + tuple(output[1:])
        return torch.zeros_like(output)

    seen: set[int] = set()
    try:
        for layer in lm.adapter.layer_modules(lm.model):
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            handles.append(get_module(layer, spec.mlp_out).register_forward_hook(zero))
        yield
    finally:
        for h in handles:
            h.remove()


def _linear_layer_fn(lm: LoadedModel, layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The seed's simplified layer, position-wise: attention replaced by each token attending to itself, so
    the attention sublayer is ``norm(x) F + b`` (b = the value and output biases); the feed-forward removed.
    pre-norm: ``x + post(norm(x) F + b)``; parallel: ``x + norm(x) F + b``; post-norm: ``Norm(x + x F + b)``."""
    spec = lm.adapter.stack()
    residual = lm.adapter.residual_kind(lm.model.config)
    mod = lm.adapter.layer_modules(lm.model)[layer]
    hw = lm.adapter.head_weights(lm.model, layer)
    A, B = ov_factors(lm, layer, hw=hw, grouped=True)
    F = (A @ B).float()
    b = (sum(hw.b_v[hw.kv_head[h]].double().cpu() @ hw.w_o[h].double().cpu() for h in range(hw.n_heads))
         + hw.b_o.double().cpu()).float()
    norm = spec.norm_module(mod, "attn")
    if norm is None:
        raise UnsupportedFamilyError(f"{lm.adapter.family}: no attention norm found; the linear dynamics need it")
    post = spec.norm_module(mod, "attn_post")
    dev = lm.device

    def step(x: torch.Tensor) -> torch.Tensor:
        xd = x.to(dev)
        if residual == "post_norm":
            return norm(xd + (xd @ F.to(dev)) + b.to(dev)).cpu()
        a = norm(xd) @ F.to(dev) + b.to(dev)
        if post is not None:
            a = post(a)
        return (xd + a).cpu()

    return step


@dataclass
class Dynamics:
    """Trajectories of the same tokens under several dynamics (seed 002's simplified layer and its variants).

    ``modes``: ``real`` (the model), ``mlp_ablated`` (the model with every feed-forward output zeroed),
    ``linear`` (the seed's simplified layer from the real weights: normalisation + value/output projection,
    no attention mixing, no feed-forward), ``power`` (pure power step x <- x F_l / |x F_l|).  All start from
    the real input of layer 0.  ``alignment[mode][l]``: mean |cos(x, v1(F_l))| at layer l's output;
    ``agreement[mode][l]``: mean cos between the mode's and the real model's state at layer l's output;
    ``random_mean``: the random-direction baseline."""

    model_name: str
    layers: list[int]
    modes: list[str]
    alignment: dict[str, list[float]]
    agreement: dict[str, list[float]]
    random_mean: float
    n_tokens: int
    notes: list[str] = field(default_factory=list)


@torch.no_grad()
def dynamics(model: LoadedModel, texts: str | Sequence[str], *, spectra: PowerSpectra | None = None,
             modes: Sequence[str] = ("real", "mlp_ablated", "linear", "power"), skip_first: bool = False,
             seed: int = 0, progress: bool = False) -> Dynamics:
    """Compare the real model's trajectory and alignment with the seed's idealised layer (seed 002: "projections
    and layer normalizations, disregarding the feedforward neural network"), the pure power step, and the
    real model with its MLPs ablated."""
    from tqdm.auto import tqdm

    from .capture import capture

    lm = model
    texts = _as_texts(texts)
    bad = [m for m in modes if m not in ("real", "mlp_ablated", "linear", "power")]
    if bad:
        raise InputError(f"unknown dynamics mode(s) {bad}; choose from real, mlp_ablated, linear, power")
    spectra = spectra or power_spectra(lm, heads=False, nearest=0)
    L = lm.n_layers
    pts = [f"L{l}.resid_post" for l in range(L)]
    states: dict[str, list[torch.Tensor]] = {m: [] for m in modes}
    reals: list[torch.Tensor] = []
    Fs = [ov_matrix(lm, l) for l in range(L)] if "power" in modes else []
    notes: list[str] = []
    steps = []
    if "linear" in modes:
        try:
            steps = [_linear_layer_fn(lm, l) for l in range(L)]
        except UnsupportedFamilyError as e:
            modes = [m for m in modes if m != "linear"]
            states.pop("linear", None)
            notes.append(f"linear mode left out: {e}")
    for t in tqdm(texts, desc="dynamics", disable=not progress, leave=False):
        tr = capture(lm, t, points=["L0.resid_pre", "L*.resid_post"])
        real = torch.stack([tr[p] for p in pts]).float()
        x0 = tr["L0.resid_pre"].float()
        sl = slice(1, None) if skip_first else slice(None)
        reals.append(real[:, sl])
        for m in modes:
            if m == "real":
                s = real
            elif m == "mlp_ablated":
                with ablate_mlps(lm):
                    ta = capture(lm, t, points=["L*.resid_post"])
                s = torch.stack([ta[p] for p in pts]).float()
            elif m == "linear":
                xs, x = [], x0
                for l in range(L):
                    x = steps[l](x)
                    xs.append(x)
                s = torch.stack(xs)
            else:
                xs, x = [], x0.double()
                for l in range(L):
                    y = x @ Fs[l]
                    x = y / y.norm(dim=-1, keepdim=True).clamp_min(1e-300) * x.norm(dim=-1, keepdim=True)
                    xs.append(x.float())
                s = torch.stack(xs)
            states[m].append(s[:, sl])
    layer_of = list(range(L))
    al: dict[str, list[float]] = {}
    ag: dict[str, list[float]] = {}
    rnd = float("nan")
    for m in modes:
        a = alignment_from_states(states[m], pts, layer_of, spectra, n_random=50, n_shuffles=2, seed=seed,
                                  model_name=lm.name)
        al[m] = a.mean
        rnd = float(sum(a.random_mean) / len(a.random_mean))
        cs = [torch.nn.functional.cosine_similarity(s.double(), r.double(), dim=-1) for s, r in zip(states[m], reals)]
        ag[m] = torch.cat(cs, dim=1).mean(1).tolist()
    return Dynamics(model_name=lm.name, layers=layer_of, modes=list(modes), alignment=al, agreement=ag,
                    random_mean=rnd, n_tokens=sum(int(r.shape[1]) for r in reals), notes=notes)


# ---- shared weights ----------------------------------------------------------------------------------------------

@contextmanager
def tied_layers(model: LoadedModel, layer: int, n_layers: int) -> Iterator[LoadedModel]:
    """Temporarily turn the model into a weight-tied one: layer ``layer``'s module applied ``n_layers`` times
    (seed 002's shared-weight case).  For an already shared stack (ALBERT) only the depth changes.  The layer
    list and config are restored on exit, even on error; no weight is copied or changed."""
    lm = model
    spec = lm.adapter.stack()
    cfg = lm.model.config
    L = lm.n_layers
    layer = layer + L if layer < 0 else layer
    if not 0 <= layer < L:
        raise InputError(f"layer {layer} out of range: the model has {L} layers")
    if n_layers < 1:
        raise InputError("n_layers must be at least 1")
    if lm.adapter.auto_class == "seq2seq":
        raise UnsupportedFamilyError("weight-tied variants of encoder-decoder models are not supported")
    saved_n = cfg.num_hidden_layers
    saved_types = getattr(cfg, "layer_types", None)
    parent_path, _, attr = spec.layers.rpartition(".")
    parent = get_module(lm.model, parent_path) if parent_path else lm.model
    old_list = getattr(parent, attr)
    try:
        if not spec.shared_layer:
            setattr(parent, attr, nn.ModuleList([old_list[layer]] * n_layers))
            if isinstance(saved_types, list):
                cfg.layer_types = [saved_types[layer]] * n_layers
        cfg.num_hidden_layers = n_layers
        yield lm
    finally:
        setattr(parent, attr, old_list)
        cfg.num_hidden_layers = saved_n
        if isinstance(saved_types, list):
            cfg.layer_types = saved_types


@dataclass
class SharedWeights:
    """One layer k applied L times (seed 002: "with shared weights ... the alignment ... can be shown
    analytically").  Depth index l = 0..L (0 = the input).  ``measured``: mean |cos(x_l, v1(F_k))| of the
    real tied model at each depth; ``power``: the pure power method x <- x F_k from the same inputs;
    ``residual``: the linear residual form x <- x (I + F_k) (normalised); ``predicted`` and
    ``predicted_residual``: the analytic two-component curves tan theta_l = tan theta_1 rho^(l-1) with
    rho = ``rate`` (gap of F_k) and ``rate_residual`` (gap of I + F_k), started after the first step (which
    removes F's null space, where most of a token's mass lies when rank F < D); ``fitted_*``: rates fitted to the measured curves; ``random_mean``:
    the random-direction baseline."""

    model_name: str
    layer: int
    n_layers: int
    lambda1: complex
    lambda2: complex
    complex_pair: bool
    rate: float
    rate_residual: float
    measured: list[float]
    measured_lo: list[float]
    measured_hi: list[float]
    power: list[float]
    residual: list[float]
    predicted: list[float]
    predicted_residual: list[float]
    fitted_measured: float
    fitted_power: float
    random_mean: float
    n_tokens: int
    nearest: list[str] = field(default_factory=list)


@torch.no_grad()
def shared_weights(model: LoadedModel, texts: str | Sequence[str], *, layer: int = 0, n_layers: int | None = None,
                   skip_first: bool = False, seed: int = 0, progress: bool = False) -> SharedWeights:
    """The shared-weight experiment: layer ``layer`` of ``model`` repeated ``n_layers`` times (default: the
    model's depth), its measured alignment with v1(F_k) per depth next to the power method's analytic
    prediction (convergence at rate |lambda2/lambda1|).  Works on ALBERT (truly shared) and on any
    decoder (a weight-tied variant built by :func:`tied_layers`)."""
    from tqdm.auto import tqdm

    from .capture import capture

    lm = model
    texts = _as_texts(texts)
    L = n_layers or lm.n_layers
    k = layer + lm.n_layers if layer < 0 else layer
    spec_k = power_spectra(lm, layers=[k], heads=False, nearest=8).layers[0]
    A, B = ov_factors(lm, k, grouped=True)
    F = A @ B
    basis = spec_k.basis
    pts = ["L0.resid_pre"] + [f"L{l}.resid_post" for l in range(L)]
    meas, x0s = [], []
    with tied_layers(lm, k, L):
        for t in tqdm(texts, desc="shared weights", disable=not progress, leave=False):
            tr = capture(lm, t, points=["L0.resid_pre", "L*.resid_post"])
            X = torch.stack([tr[p] for p in pts]).double()
            if skip_first:
                X = X[:, 1:]
            meas.append(X)
            x0s.append(X[0])
    X = torch.cat(meas, dim=1)  # [L+1, N, D]
    kd = torch.tensor([basis.shape[0]])
    b2 = torch.zeros(1, 2, basis.shape[1], dtype=torch.float64)
    b2[0, : basis.shape[0]] = basis

    def align(S: torch.Tensor) -> torch.Tensor:  # [steps, N, D] -> [steps, N]
        return torch.stack([_cos_to_bases(s, b2, kd)[0] for s in S])

    m = align(X)
    x0 = torch.cat(x0s, dim=0)
    pw = align(power_iterate(F, x0, L))
    rs = align(power_iterate(F, x0, L, residual=True))
    rate_res = residual_gap(spec_k.eigenvalues, F.shape[0])
    gen = torch.Generator().manual_seed(seed)
    rnd = _cos_to_bases(x0, _random_bases(50, F.shape[0], gen), torch.full((50,), basis.shape[0])).mean().item()
    q = torch.quantile(m, torch.tensor([0.05, 0.95], dtype=m.dtype), dim=1)
    ev = spec_k.eigenvalues
    return SharedWeights(model_name=lm.name, layer=k, n_layers=L, lambda1=complex(ev[0]),
                         lambda2=complex(ev[2 if spec_k.complex_pair else 1]) if len(ev) > 2 else 0j,
                         complex_pair=spec_k.complex_pair, rate=spec_k.gap, rate_residual=rate_res,
                         measured=m.mean(1).tolist(), measured_lo=q[0].tolist(), measured_hi=q[1].tolist(),
                         power=pw.mean(1).tolist(), residual=rs.mean(1).tolist(),
                         predicted=[float(m[0].mean())] + predicted_alignment(pw[1], spec_k.gap, L - 1).tolist(),
                         predicted_residual=[float(m[0].mean())] + predicted_alignment(rs[1], rate_res, L - 1).tolist(),
                         fitted_measured=fitted_rate(m.mean(1)), fitted_power=fitted_rate(pw.mean(1), start=1),
                         random_mean=rnd, n_tokens=int(X.shape[1]), nearest=spec_k.nearest)


from .steering import SteerResult, activation_addition, steer, steering_sweep  # noqa: E402,F401
