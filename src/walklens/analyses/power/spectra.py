"""The spectra of F = W_V W_O (seed 002; F from seed 000, sec. 2.2.1 and A.3): per layer and head, the
eigenvalues, the principal eigenvector v1 (or the plane of a complex pair), the spectral gap and v1's nearest
tokens, computed through the small factored product (:mod:`walklens.core.ov`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ...base.display import Shown
from ...base.errors import InputError, find
from ...base.frames import Columns, DataFrame, concat_columns, frame, long_table, pick, record_table
from ...base.precision import dtype_name
from ...core.ov import Eigen, eigen_factored, ov_factors, residual_gap

if TYPE_CHECKING:
    from ...core.loading import LoadedModel


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
        return find(self.layers, lambda s: s.layer == layer, f"no spectrum for layer {layer}")

    def __len__(self) -> int:
        return len(self.layers)

    def _columns(self, table: str = "layers") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        return pick(
            table,
            {
                "layers": lambda: record_table(
                    [{"layer": s.layer, **_lead(s), "residual_gap": s.residual_gap} for s in self.layers]
                ),
                "heads": lambda: record_table(
                    [{"layer": s.layer, "head": h.head, **_lead(h)} for s in self.layers for h in s.heads],
                    ["layer", "head", "lambda1_re", "lambda1_im", "lambda1_abs", "complex_pair", "gap"],
                ),
                "eigenvalues": lambda: _eigenvalue_columns(self.layers),
                "vectors": lambda: _vector_columns(self.layers),
                "tokens": lambda: _token_columns(self.layers),
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


def _lead(s: HeadSpectrum | LayerSpectrum) -> dict[str, object]:
    """The leading eigenvalue lambda1 of a layer's F or of a head's W_vo,h, whether it is one of a complex pair,
    and the spectral gap: the columns of the ``layers`` and ``heads`` tables."""
    lam = complex(s.eigenvalues[0]) if len(s.eigenvalues) else 0j
    return {
        "lambda1_re": lam.real,
        "lambda1_im": lam.imag,
        "lambda1_abs": abs(lam),
        "complex_pair": s.complex_pair,
        "gap": s.gap,
    }


def _eigenvalue_columns(layers: list[LayerSpectrum]) -> Columns:
    """The ``eigenvalues`` table: every eigenvalue per (layer, head, index); ``head`` None: the layer's F."""
    parts = []
    for s in layers:
        for head, ev in [(None, s.eigenvalues), *((h.head, h.eigenvalues) for h in s.heads)]:
            parts.append(
                long_table(
                    [("index", range(len(ev)))],
                    {"re": ev.real.double(), "im": ev.imag.double(), "abs": ev.abs().double()},
                    constants={"layer": s.layer, "head": head},
                )
            )
    return concat_columns(parts)


def _vector_columns(layers: list[LayerSpectrum]) -> Columns:
    """The ``vectors`` table: v1, the basis rows and v1_right of every layer, and each head's v1, per dimension."""
    parts = []
    for s in layers:
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


def _token_columns(layers: list[LayerSpectrum]) -> Columns:
    """The ``tokens`` table: v1's nearest and opposite tokens per (layer, side, rank)."""
    return record_table(
        [
            {"layer": s.layer, "side": side, "rank": r, "token": t, "cos": c}
            for s in layers
            for side, toks, cos in (
                ("nearest", s.nearest, s.nearest_cos),
                ("opposite", s.opposite, s.opposite_cos),
            )
            for r, (t, c) in enumerate(zip(toks, cos))
        ],
        ["layer", "side", "rank", "token", "cos"],
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
    hw = lm.head_weights(layer)
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
