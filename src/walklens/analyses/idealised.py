"""The seed's idealised layer next to the real model (seed 002): idealised dynamics and shared-weight models.

- :func:`dynamics` compares the real trajectory of tokens with the seed's simplified layer ("projections and
  layer normalizations, disregarding the feedforward neural network"), the pure power step ``x <- x F_l /
  |x F_l|`` and the real model with its feed-forward blocks ablated (:func:`~walklens.core.interventions.ablate_mlps`).
- :func:`shared_weights` applies one layer k L times (:func:`~walklens.core.interventions.tied_layers`, or ALBERT's
  truly shared layer) and sets its measured alignment with v1(F_k) beside the power method's analytic
  prediction (convergence at rate |lambda2 / lambda1|).

Definitions (F, v1, alignment, rates) are those of :mod:`walklens.analyses.power`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..base.display import Shown
from ..base.errors import InputError, UnsupportedFamilyError
from ..base.frames import Columns, DataFrame, frame, long_table, pick, record_table
from ..core.capture import capture
from ..core.interventions import ablate_mlps, tied_layers
from ..core.ov import ov_factors, ov_matrix, residual_gap
from .power import (
    PowerSpectra,
    alignment_from_states,
    as_texts,
    cos_to_bases,
    fitted_rate,
    power_iterate,
    power_spectra,
    predicted_alignment,
    random_bases,
)

if TYPE_CHECKING:
    from ..core.loading import LoadedModel


# ---- idealised dynamics ----------------------------------------------------------------------------------------


def _linear_layer_fn(lm: LoadedModel, layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The seed's simplified layer, position-wise: attention replaced by each token attending to itself, so
    the attention sublayer is ``norm(x) F + b`` (b = the value and output biases); the feed-forward removed.
    pre-norm: ``x + post(norm(x) F + b)``; parallel: ``x + norm(x) F + b``; post-norm: ``Norm(x + x F + b)``."""
    spec = lm.adapter.stack()
    residual = lm.adapter.residual_kind(lm.model.config)
    mod = lm.adapter.layer_modules(lm.model)[layer]
    hw = lm.head_weights(layer)
    A, B = ov_factors(lm, layer, hw=hw, grouped=True)
    F = (A @ B).float()
    b = (
        sum(hw.b_v[hw.kv_head[h]].double().cpu() @ hw.w_o[h].double().cpu() for h in range(hw.n_heads))
        + hw.b_o.double().cpu()
    ).float()
    norm = spec.norm_module(mod, "attn")
    if norm is None:
        raise UnsupportedFamilyError(f"{lm.adapter.family}: no attention norm found; the linear dynamics need it")
    post = spec.norm_module(mod, "attn_post")
    dev = lm.device

    def step(x: torch.Tensor) -> torch.Tensor:
        xd = x.to(dev)
        with lm.held(layer):  # the layer's norms (read from disk for a streamed model)
            if residual == "post_norm":
                return norm(xd + (xd @ F.to(dev)) + b.to(dev)).cpu()
            a = norm(xd) @ F.to(dev) + b.to(dev)
            if post is not None:
                a = post(a)
            return (xd + a).cpu()

    return step


@dataclass
class Dynamics(Shown, view="dynamics"):
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

    def _columns(self, table: str = "layers") -> Columns:
        """The plain columns of :meth:`to_pandas`."""

        def at(d: dict[str, list[float]], m: str, i: int) -> float | None:
            v = d.get(m, [])
            return v[i] if i < len(v) else None

        return pick(
            table,
            {
                "layers": lambda: record_table(
                    [
                        {
                            "mode": m,
                            "layer": layer,
                            "alignment": at(self.alignment, m, i),
                            "agreement": at(self.agreement, m, i),
                            "random_mean": self.random_mean,
                        }
                        for m in self.modes
                        for i, layer in enumerate(self.layers)
                    ],
                    ["mode", "layer", "alignment", "agreement", "random_mean"],
                )
            },
            "Dynamics",
        )

    def to_pandas(self, table: str = "layers") -> DataFrame:
        """One row per (mode, layer): alignment with v1(F_l) and agreement with the real model at layer l's
        output, next to the random-direction baseline (pandas; docs/notebooks.md, "Tables")."""
        return frame(
            self._columns(table), {"model": self.model_name, "n_tokens": self.n_tokens, "notes": list(self.notes)}
        )


@torch.no_grad()
def _linear_states(steps: Sequence[Callable[[torch.Tensor], torch.Tensor]], x0: torch.Tensor, L: int) -> torch.Tensor:
    """The idealised linear layers' trajectory from ``x0``, one state per layer."""
    xs, x = [], x0
    for l in range(L):
        x = steps[l](x)
        xs.append(x)
    return torch.stack(xs)


def _power_states(Fs: Sequence[torch.Tensor], x0: torch.Tensor, L: int) -> torch.Tensor:
    """The pure power step's trajectory from ``x0`` (norm kept), one state per layer."""
    xs, x = [], x0.double()
    for l in range(L):
        y = x @ Fs[l]
        x = y / y.norm(dim=-1, keepdim=True).clamp_min(1e-300) * x.norm(dim=-1, keepdim=True)
        xs.append(x.float())
    return torch.stack(xs)


def dynamics(
    lm: LoadedModel,
    texts: str | Sequence[str],
    *,
    spectra: PowerSpectra | None = None,
    modes: Sequence[str] = ("real", "mlp_ablated", "linear", "power"),
    skip_first: bool = False,
    seed: int = 0,
    progress: bool = False,
) -> Dynamics:
    """Compare the real model's trajectory and alignment with the seed's idealised layer (seed 002: "projections
    and layer normalizations, disregarding the feedforward neural network"), the pure power step, and the
    real model with its MLPs ablated."""
    from tqdm.auto import tqdm

    texts = as_texts(texts)
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
        real, per_mode = _trajectories(lm, t, modes, pts, steps, Fs, skip_first)
        reals.append(real)
        for m in modes:
            states[m].append(per_mode[m])
    layer_of = list(range(L))
    al, ag, rnd = _measures(lm, modes, states, reals, pts, spectra, seed)
    return Dynamics(
        model_name=lm.name,
        layers=layer_of,
        modes=list(modes),
        alignment=al,
        agreement=ag,
        random_mean=rnd,
        n_tokens=sum(int(r.shape[1]) for r in reals),
        notes=notes,
    )


def _trajectories(
    lm: LoadedModel,
    text: str,
    modes: Sequence[str],
    pts: list[str],
    steps: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    Fs: Sequence[torch.Tensor],
    skip_first: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The real states of ``text`` at every layer's output ``pts`` [L, T, D], and each mode's trajectory from the
    real input of layer 0 (:class:`Dynamics`); the first position dropped when ``skip_first``."""
    L = lm.n_layers
    tr = capture(lm, text, points=["L0.resid_pre", "L*.resid_post"])
    real = torch.stack([tr[p] for p in pts]).float()
    x0 = tr["L0.resid_pre"].float()
    sl = slice(1, None) if skip_first else slice(None)
    out: dict[str, torch.Tensor] = {}
    for m in modes:
        if m == "real":
            s = real
        elif m == "mlp_ablated":
            with ablate_mlps(lm):
                ta = capture(lm, text, points=["L*.resid_post"])
            s = torch.stack([ta[p] for p in pts]).float()
        elif m == "linear":
            s = _linear_states(steps, x0, L)
        else:
            s = _power_states(Fs, x0, L)
        out[m] = s[:, sl]
    return real[:, sl], out


def _measures(
    lm: LoadedModel,
    modes: Sequence[str],
    states: dict[str, list[torch.Tensor]],
    reals: list[torch.Tensor],
    pts: list[str],
    spectra: PowerSpectra,
    seed: int,
) -> tuple[dict[str, list[float]], dict[str, list[float]], float]:
    """Per mode, the mean alignment with v1(F_l) and the mean cosine with the real model's state at every layer's
    output, and the random-direction baseline (:class:`Dynamics`)."""
    layer_of = list(range(lm.n_layers))
    al: dict[str, list[float]] = {}
    ag: dict[str, list[float]] = {}
    rnd = float("nan")
    for m in modes:
        a = alignment_from_states(
            states[m], pts, layer_of, spectra, n_random=50, n_shuffles=2, seed=seed, model_name=lm.name
        )
        al[m] = a.mean
        rnd = float(sum(a.random_mean) / len(a.random_mean))
        cs = [torch.nn.functional.cosine_similarity(s.double(), r.double(), dim=-1) for s, r in zip(states[m], reals)]
        ag[m] = torch.cat(cs, dim=1).mean(1).tolist()
    return al, ag, rnd


# ---- shared weights ----------------------------------------------------------------------------------------------


@dataclass
class SharedWeights(Shown, view="shared_weights"):
    """One layer k applied L times (seed 002: "with shared weights ... the alignment ... can be shown
    analytically").  Depth index l = 0..L (0 = the input).  ``measured``: mean |cos(x_l, v1(F_k))| of the
    real tied model at each depth; ``power``: the pure power method x <- x F_k from the same inputs;
    ``residual``: the linear residual form x <- x (I + F_k) (normalised); ``predicted`` and
    ``predicted_residual``: the analytic two-component curves tan theta_l = tan theta_1 rho^(l-1) with
    rho = ``rate`` (gap of F_k) and ``rate_residual`` (gap of I + F_k), started after the first step (which
    removes F's null space, where most of a token's mass lies when rank F < D); ``fitted_*``: rates fitted to
    the measured curves; ``random_mean``: the random-direction baseline."""

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

    def _columns(self, table: str = "depths") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        curves = ("measured", "measured_lo", "measured_hi", "power", "residual", "predicted", "predicted_residual")

        def fit() -> Columns:
            return record_table(
                [
                    {
                        "layer": self.layer,
                        "n_layers": self.n_layers,
                        "lambda1_re": self.lambda1.real,
                        "lambda1_im": self.lambda1.imag,
                        "lambda2_re": self.lambda2.real,
                        "lambda2_im": self.lambda2.imag,
                        "complex_pair": self.complex_pair,
                        "rate": self.rate,
                        "rate_residual": self.rate_residual,
                        "fitted_measured": self.fitted_measured,
                        "fitted_power": self.fitted_power,
                        "random_mean": self.random_mean,
                        "n_tokens": self.n_tokens,
                    }
                ]
            )

        return pick(
            table,
            {
                "depths": lambda: long_table(
                    [("depth", range(len(self.measured)))], {k: list(getattr(self, k)) for k in curves}
                ),
                "fit": fit,
            },
            "SharedWeights",
        )

    def to_pandas(self, table: str = "depths") -> DataFrame:
        """Layer k applied L times as tables (pandas; docs/notebooks.md, "Tables"): ``depths`` one row per depth
        l = 0..L (measured, power-method, residual and predicted alignment curves); ``fit`` one row of the
        eigenvalues, rates and fitted rates."""
        return frame(self._columns(table), {"model": self.model_name, "nearest": list(self.nearest)})


@torch.no_grad()
def shared_weights(
    lm: LoadedModel,
    texts: str | Sequence[str],
    *,
    layer: int = 0,
    n_layers: int | None = None,
    skip_first: bool = False,
    seed: int = 0,
    progress: bool = False,
) -> SharedWeights:
    """The shared-weight experiment: layer ``layer`` of ``lm`` repeated ``n_layers`` times (default: the
    model's depth), its measured alignment with v1(F_k) per depth next to the power method's analytic
    prediction (convergence at rate |lambda2/lambda1|).  Works on ALBERT (truly shared) and on any
    decoder (a weight-tied variant built by :func:`tied_layers`)."""
    texts = as_texts(texts)
    L = n_layers or lm.n_layers
    k = layer + lm.n_layers if layer < 0 else layer
    spec_k = power_spectra(lm, layers=[k], heads=False, nearest=8).layers[0]
    A, B = ov_factors(lm, k, grouped=True)
    F = A @ B
    basis = spec_k.basis
    X, x0 = _tied_states(lm, texts, k, L, skip_first, progress)  # [L+1, N, D], [N, D]
    align = _aligner(basis)
    m = align(X)
    pw = align(power_iterate(F, x0, L))
    rs = align(power_iterate(F, x0, L, residual=True))
    rate_res = residual_gap(spec_k.eigenvalues, F.shape[0])
    gen = torch.Generator().manual_seed(seed)
    rnd = cos_to_bases(x0, random_bases(50, F.shape[0], gen), torch.full((50,), basis.shape[0])).mean().item()
    q = torch.quantile(m, torch.tensor([0.05, 0.95], dtype=m.dtype), dim=1)
    ev = spec_k.eigenvalues
    return SharedWeights(
        model_name=lm.name,
        layer=k,
        n_layers=L,
        lambda1=complex(ev[0]),
        lambda2=complex(ev[2 if spec_k.complex_pair else 1]) if len(ev) > 2 else 0j,
        complex_pair=spec_k.complex_pair,
        rate=spec_k.gap,
        rate_residual=rate_res,
        measured=m.mean(1).tolist(),
        measured_lo=q[0].tolist(),
        measured_hi=q[1].tolist(),
        power=pw.mean(1).tolist(),
        residual=rs.mean(1).tolist(),
        predicted=[float(m[0].mean())] + predicted_alignment(pw[1], spec_k.gap, L - 1).tolist(),
        predicted_residual=[float(m[0].mean())] + predicted_alignment(rs[1], rate_res, L - 1).tolist(),
        fitted_measured=fitted_rate(m.mean(1)),
        fitted_power=fitted_rate(pw.mean(1), start=1),
        random_mean=rnd,
        n_tokens=int(X.shape[1]),
        nearest=spec_k.nearest,
    )


def _tied_states(
    lm: LoadedModel, texts: list[str], k: int, L: int, skip_first: bool, progress: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The states [L+1, N, D] of every token of ``texts`` through layer ``k`` applied ``L`` times (depth 0: the
    input; :func:`~walklens.core.interventions.tied_layers`), in float64, and the inputs [N, D]."""
    from tqdm.auto import tqdm

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
    return torch.cat(meas, dim=1), torch.cat(x0s, dim=0)


def _aligner(basis: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``align(S)``: |cos| of states ``S`` [steps, N, D] with the line or plane of ``basis`` ([1 or 2, D]),
    [steps, N]."""
    kd = torch.tensor([basis.shape[0]])
    b2 = torch.zeros(1, 2, basis.shape[1], dtype=torch.float64)
    b2[0, : basis.shape[0]] = basis

    def align(S: torch.Tensor) -> torch.Tensor:  # [steps, N, D] -> [steps, N]
        return torch.stack([cos_to_bases(s, b2, kd)[0] for s in S])

    return align


__all__ = ["dynamics", "shared_weights", "Dynamics", "SharedWeights"]
