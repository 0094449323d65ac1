"""F = W_V W_O, the value-output matrix of a layer, kept as thin factors (seed 000, sec. 2.2.1 and A.3; seed 002).

Vectors are rows (seed 000, A.3): head h adds ``A_h X W_v,h W_o,h`` to the residual stream.

- **F of a layer** = ``sum_h W_v,kv(h) W_o,h`` (with grouped-query attention ``W_v,kv(h)`` is the value matrix
  of h's key/value head).  F = A B with the thin factors ``A = [W_v,kv(0) | ... | W_v,kv(H-1)]`` ([D, H d])
  and ``B = [W_o,0; ...; W_o,H-1]`` ([H d, D]); :func:`ov_factors` with ``grouped=True`` merges the query heads
  of one key/value head (same F, smaller factors).  Per head: ``W_vo,h = W_v,kv(h) W_o,h``.
- **Eigen-structure through the small product** (Sylvester): the nonzero eigenvalues of F = A B are those of
  ``B A`` ([H d, H d]); a left eigenvector y of B A gives F's left eigenvector ``y B`` and a right one z gives
  ``A z`` (:func:`eigen_factored`).  The principal *left* eigenvector v1 (``v1 F = lambda1 v1``) is where the
  power step ``x <- x F / |x F|`` converges (:mod:`walklens.analyses.power`).  When lambda1 is one of a
  complex-conjugate pair the iteration converges to the real plane spanned by Re and Im of the eigenvector:
  ``basis`` then holds 2 orthonormal rows and the gap is ``|lambda3| / |lambda1|``.
- :class:`FactoredMatrix` does the same for any ``A @ B``: norms, SVD and eigenvalues from r x r products,
  never from the dense m x n matrix (TransformerLens-style).

Everything here is float64 on the CPU, whatever the model's dtype (a bfloat16 or float16 weight converts to
float64 exactly, so eigenvalues of a bfloat16 model are float64 computations from its own weights), except
:class:`FactoredMatrix`, which keeps its factors' dtype, raised to float32 at least for SVDs and eigenvalues.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..base.errors import InputError
from ..models.base import HeadWeights

if TYPE_CHECKING:
    from ..core.loading import LoadedModel

#: An eigenvalue is complex when ``|Im| > REL_IMAG * |lambda|``.
REL_IMAG = 1e-9


# ---- factored matrices ---------------------------------------------------------------------------------------


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is a 16-bit float (LAPACK has no bfloat16/float16 kernels), else unchanged."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


@dataclass(frozen=True)
class FactoredMatrix:
    """A matrix ``M = A @ B`` kept as thin factors ``A`` [..., m, r] and ``B`` [..., r, n] (r small).

    Leading batch dimensions are allowed (e.g. one matrix per head).  Nothing of size m x n is formed unless
    :meth:`dense` is called: the Frobenius norm uses ``tr((A^T A)(B B^T))``, the SVD the QR factors of A and
    B^T, the eigenvalues (square M) the small r x r product ``B @ A``, whose non-zero eigenvalues are exactly
    those of ``A @ B`` (Sylvester); the remaining m - r eigenvalues of M are zero.
    """

    A: torch.Tensor
    B: torch.Tensor

    def __post_init__(self) -> None:
        if self.A.dim() < 2 or self.B.dim() < 2 or self.A.shape[-1] != self.B.shape[-2]:
            raise ValueError(f"factors do not chain: A {tuple(self.A.shape)} @ B {tuple(self.B.shape)}")

    @property
    def shape(self) -> tuple[int, ...]:
        return (*torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2]), self.A.shape[-2], self.B.shape[-1])

    @property
    def inner_dim(self) -> int:
        """r, the width of the factors (an upper bound on the rank)."""
        return self.A.shape[-1]

    def dense(self) -> torch.Tensor:
        """The full matrix ``A @ B``."""
        return self.A @ self.B

    @property
    def T(self) -> FactoredMatrix:
        return FactoredMatrix(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    def __getitem__(self, idx: int | slice) -> FactoredMatrix:
        """Index the leading (batch) dimension, e.g. one head of a stack of heads."""
        return FactoredMatrix(self.A[idx], self.B[idx])

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ M`` for row vectors x [..., m], computed through the factors (the 'filter' of sec. 2.2)."""
        return (x @ self.A) @ self.B

    def norm(self, kind: str = "fro") -> torch.Tensor:
        """Frobenius (``"fro"``), spectral (``"spectral"``) or nuclear (``"nuclear"``) norm, from the factors."""
        if kind == "fro":
            gram = (self.A.transpose(-1, -2) @ self.A) * (self.B @ self.B.transpose(-1, -2))
            return gram.sum((-1, -2)).clamp_min(0).sqrt()
        s = self.singular_values()
        if kind == "spectral":
            return s[..., 0]
        if kind == "nuclear":
            return s.sum(-1)
        raise ValueError(f"unknown norm {kind!r}; use 'fro', 'spectral' or 'nuclear'")

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Thin SVD ``M = U diag(S) Vh`` with U [..., m, r], S [..., r], Vh [..., r, n].

        With ``A = Q_a R_a`` and ``B^T = Q_b R_b``: ``M = Q_a (R_a R_b^T) Q_b^T``; the SVD of the r x r core
        ``R_a R_b^T = U_c S V_c^T`` gives ``U = Q_a U_c`` and ``Vh = V_c^T Q_b^T``.
        """
        A, B = _wide(self.A), _wide(self.B)
        qa, ra = torch.linalg.qr(A)
        qb, rb = torch.linalg.qr(B.transpose(-1, -2))
        uc, s, vch = torch.linalg.svd(ra @ rb.transpose(-1, -2))
        return qa @ uc, s, vch @ qb.transpose(-1, -2)

    def singular_values(self) -> torch.Tensor:
        """The r largest singular values, descending (the rest are zero)."""
        return self.svd()[1]

    def eigenvalues(self, pad_zeros: bool = False) -> torch.Tensor:
        """Eigenvalues (complex) of the square matrix ``A @ B`` via the r x r product ``B @ A``.

        ``pad_zeros`` appends the m - r zero eigenvalues so the result has one entry per dimension.
        """
        m, n = self.A.shape[-2], self.B.shape[-1]
        if m != n:
            raise ValueError(f"eigenvalues need a square matrix, got {m} x {n}")
        ev = torch.linalg.eigvals(_wide(self.B) @ _wide(self.A))
        if pad_zeros and m > ev.shape[-1]:
            zeros = torch.zeros(*ev.shape[:-1], m - ev.shape[-1], dtype=ev.dtype, device=ev.device)
            ev = torch.cat([ev, zeros], -1)
        return ev

    def copying_score(self) -> Any:
        """``sum Re(lambda) / sum |lambda|`` over the eigenvalues: +1 when the filter maps vectors onto
        themselves (copies), -1 when it reverses them; a one-number summary of the W_vo filter.  A Python float
        for one matrix; a tensor of the batch's shape (one per head) for a batch."""
        ev = self.eigenvalues()
        score = ev.real.sum(-1) / ev.abs().sum(-1).clamp_min(1e-30)
        return float(score) if score.dim() == 0 else score


# ---- F of one layer ------------------------------------------------------------------------------------------


def ov_factors(
    lm: LoadedModel, layer: int, head: int | None = None, hw: HeadWeights | None = None, grouped: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The thin factors (A [D, n d], B [n d, D]) of F = A B for one layer (``head=None``: all heads), float64.

    Row convention (seed 000, A.3): ``x F = sum_h (x W_v,kv(h)) W_o,h``.  ``grouped``: with grouped-query
    attention, one block per key/value head, ``F = sum_g W_v,g (sum_{h in g} W_o,h)`` (same F, smaller factors)."""
    if hw is None:
        hw = lm.head_weights(layer)
    if head is not None and not 0 <= head < hw.n_heads:
        raise InputError(f"layer {layer} has {hw.n_heads} heads; no head {head}")
    heads = list(range(hw.n_heads)) if head is None else [head]
    if grouped and head is None:
        groups = sorted(set(hw.kv_head))
        A = torch.cat([hw.w_v[g] for g in groups], dim=1).detach().double().cpu()
        B = torch.cat(
            [
                functools.reduce(operator.add, [hw.w_o[h].detach().double() for h in heads if hw.kv_head[h] == g])
                for g in groups
            ],
            dim=0,
        ).cpu()
        return A, B
    A = torch.cat([hw.w_v[hw.kv_head[h]] for h in heads], dim=1).detach().double().cpu()
    B = torch.cat([hw.w_o[h] for h in heads], dim=0).detach().double().cpu()
    return A, B


def ov_matrix(lm: LoadedModel, layer: int, head: int | None = None) -> torch.Tensor:
    """The dense F = W_V W_O [D, D] of one layer (or head), float64, row convention (for checks)."""
    A, B = ov_factors(lm, layer, head, grouped=True)
    return A @ B


def value_projection(A: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z, w)`` with ``z = A^+ u`` and ``w = A z = P u``, the orthogonal projection of u on the value space
    col(A): the part of a direction u that a layer with value factor A can read (``|w|`` is its *reach*)."""
    z = torch.linalg.pinv(A) @ u
    return z, A @ z


# ---- eigen-structure -----------------------------------------------------------------------------------------


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


def real_basis(vec: torch.Tensor, pair: bool) -> torch.Tensor:
    """Orthonormal real rows spanning Re/Im of a complex eigenvector (1 row when the eigenvalue is real)."""
    if not pair:
        v = vec.real if vec.is_complex() else vec
        if v.norm() == 0:  # a real eigenvalue may come with a globally phased complex vector
            v = vec.imag
        return (v / v.norm().clamp_min(1e-300)).unsqueeze(0)
    m = torch.stack([vec.real, vec.imag], dim=1)  # [D, 2]
    q, _ = torch.linalg.qr(m)
    return q.T.contiguous()


def phase_fix(vec: torch.Tensor) -> torch.Tensor:
    """Rotate a complex vector so its largest entry is real (a real eigenvector then has zero imaginary part)."""
    if not vec.is_complex():
        return vec
    i = int(vec.abs().argmax())
    return vec * (vec[i].conj() / vec[i].abs().clamp_min(1e-300))


def is_complex_pair(lam: torch.Tensor) -> bool:
    """Whether the eigenvalue ``lam`` has a nonzero imaginary part (then its conjugate is an eigenvalue too)."""
    return bool(abs(lam.imag) > REL_IMAG * max(float(abs(lam)), 1e-300))


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run LAPACK's non-symmetric eigensolver on one thread: for these small matrices threads only add
    contention, and on a machine whose other cores are busy each of its many short parallel regions waits for a
    thread that is not running (:mod:`walklens.base.threads`)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def eig(M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eig`` on one thread (see :func:`_one_thread`)."""
    with _one_thread():
        return torch.linalg.eig(M)


def eigen_factored(A: torch.Tensor, B: torch.Tensor) -> Eigen:
    """Principal eigen-structure of F = A B from the small M = B A (seed 002; TransformerLens-style factoring).

    Left: ``y M = lambda y`` gives ``v = y B`` with ``v F = lambda v``.  Right: ``M z = lambda z`` gives
    ``u = A z`` with ``F u = lambda u``."""
    A, B = A.double(), B.double()
    M = B @ A
    ev_l, Y = eig(M.T)  # columns y with M^T y = lambda y  <=>  y^T M = lambda y^T
    order = torch.argsort(ev_l.abs(), descending=True, stable=True)
    ev_l, Y = ev_l[order], Y[:, order]
    lam1 = ev_l[0]
    pair = is_complex_pair(lam1)
    v = phase_fix(Y[:, 0] @ B.to(Y.dtype))
    basis = real_basis(v, pair)
    ev_r, Z = eig(M)
    j = int(torch.argmin((ev_r - lam1).abs()))
    r = phase_fix(A.to(Z.dtype) @ Z[:, j])
    right = real_basis(r, pair)[0]
    mods = ev_l.abs()
    nxt = 2 if pair else 1
    gap = float(mods[nxt] / mods[0]) if len(mods) > nxt and mods[0] > 0 else float("nan")
    return Eigen(eigenvalues=ev_l, v1=basis[0].clone(), basis=basis, v1_right=right, complex_pair=pair, gap=gap)


def residual_gap(eigenvalues: torch.Tensor, d_model: int) -> float:
    """|mu_next| / |mu1| for I + F: eigenvalues 1 + lambda_i, plus 1 on F's null space (D - len(lambda) of
    them); when mu1 is one of a complex-conjugate pair, mu_next is the next after its conjugate."""
    mu = 1 + eigenvalues.to(torch.complex128)
    if d_model > len(eigenvalues):
        mu = torch.cat([mu, torch.ones(1, dtype=mu.dtype)])
    mu = mu[torch.argsort(mu.abs(), descending=True, stable=True)]
    if len(mu) < 2 or mu[0].abs() == 0:
        return float("nan")
    nxt = 2 if is_complex_pair(mu[0]) else 1
    return float(mu[nxt].abs() / mu[0].abs()) if len(mu) > nxt else float("nan")


__all__ = ["FactoredMatrix", "Eigen", "ov_factors", "ov_matrix", "value_projection", "eigen_factored", "residual_gap"]
