"""The power-method report (``walklens power``; seed 002) and its JSON document: spectra of F = W_V W_O,
alignment through depth with chance bands, idealised dynamics and shared-weight convergence.  They draw the
dataclasses of :mod:`walklens.analyses.power` and :mod:`walklens.analyses.idealised`; they never load models.

One document per result (:func:`spectra_document`, :func:`alignment_document`, :func:`dynamics_document`,
:func:`shared_document`; :func:`document` gathers them for ``--json``): the report's page draws them with
``assets/results.js``, the explorer's power view (``walklens serve``) gets them from its API and draws them
with the same script, and the PNGs read the same curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..analyses.chance import above_band
from .html import Report, fields_of, pyplot

if TYPE_CHECKING:
    from ..analyses.idealised import Dynamics, SharedWeights
    from ..analyses.power import Alignment, HeadSpectrum, LayerSpectrum, PowerSpectra


def spectra_figure(spectra: PowerSpectra, top: int = 40) -> Any:
    """Matplotlib figure: the top eigenvalues of every layer's F in the complex plane (colour = depth) and
    |lambda1| and the gap per layer."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    n = max(len(spectra.layers) - 1, 1)
    cmap = plt.get_cmap("viridis")
    for s in spectra.layers:
        ev = s.eigenvalues[:top]
        ax.scatter(ev.real.numpy(), ev.imag.numpy(), s=8, color=cmap(s.layer / n), alpha=0.7)
        ax.scatter([s.lambda1.real], [s.lambda1.imag], s=36, color=cmap(s.layer / n), edgecolor="k", linewidth=0.6)
    ax.axhline(0, color="#999", lw=0.5)
    ax.axvline(0, color="#999", lw=0.5)
    ax.set_xlabel("Re λ")
    ax.set_ylabel("Im λ")
    ax.set_title(f"top {top} eigenvalues of F per layer (black edge: λ1; colour: depth)")
    layers = [s.layer for s in spectra.layers]
    bx.plot(layers, [abs(s.lambda1) for s in spectra.layers], "o-", label="|λ1|")
    bx.set_xlabel("layer")
    bx.set_ylabel("|λ1|")
    cx = bx.twinx()
    cx.plot(layers, [s.gap for s in spectra.layers], "s--", color="C1", label="gap |λ2|/|λ1|")
    cx.set_ylabel("gap |λ2|/|λ1| (1 = no convergence)")
    cx.set_ylim(0, 1.05)
    for s in spectra.layers:
        if s.complex_pair:
            cx.plot([s.layer], [s.gap], "x", color="C3")
    bx.set_title("principal eigenvalue and gap (red x: complex pair)")
    fig.tight_layout()
    return fig


def _at(doc: Mapping[str, Any], key: str, sel: Sequence[int]) -> list[Any]:
    """Field ``key`` of a document at the indices ``sel`` (a number is the same at every index)."""
    v = doc[key]
    return [v[i] for i in sel] if isinstance(v, (list, tuple, torch.Tensor)) else [v] * len(sel)


def _draw_curves(ax: Any, doc: Mapping[str, Any], x: Sequence[Any], sel: Sequence[int]) -> None:
    """The curves a document names (``doc["curves"]``, as ``assets/results.js`` draws them), on one axes."""
    for k, c in enumerate(doc["curves"]):
        colour = f"C{k}"
        if "band" in c:
            ax.fill_between(x, _at(doc, c["band"][0], sel), _at(doc, c["band"][1], sel), color=colour, alpha=0.18)
        ax.plot(x, _at(doc, c["y"], sel), "--" if c.get("dash") else "o-", color=colour, ms=3, lw=1, label=c["name"])


def alignment_figure(doc: Mapping[str, Any], kinds: tuple[str, ...] = ("resid_pre", "resid_mid", "resid_post")) -> Any:
    """Alignment through depth with its chance bands (:func:`alignment_document`'s curves), one panel per kind
    of point."""
    plt = pyplot()
    points, layer_of = doc["points"], doc["layer_of"]
    kinds = tuple(k for k in kinds if any(p.endswith("." + k) for p in points))
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.4 * len(kinds), 3.6), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        sel = [i for i, p in enumerate(points) if p.endswith("." + kind)]
        _draw_curves(ax, doc, [layer_of[i] for i in sel], sel)
        ax.set_title(kind)
        ax.set_xlabel("layer")
    axes[0][0].set_ylabel("mean |cos(x, v1(F_l))|")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"{doc['model_name']}: alignment with v1 of F = W_V W_O ({doc['n_tokens']} tokens; bands 5-95 %)")
    fig.tight_layout()
    return fig


def dynamics_figure(dyn: Dynamics) -> Any:
    """Matplotlib figure of the idealised dynamics: every mode's alignment and its agreement with the real
    trajectory, per layer (what ``assets/results.js`` draws from :func:`dynamics_document`)."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.6))
    colors = {"real": "C0", "mlp_ablated": "C1", "linear": "C2", "power": "C3"}
    for m in dyn.modes:
        ax.plot(dyn.layers, dyn.alignment[m], "o-", ms=3, label=m, color=colors.get(m))
        if m != "real":
            bx.plot(dyn.layers, dyn.agreement[m], "o-", ms=3, label=m, color=colors.get(m))
    ax.axhline(dyn.random_mean, color="C7", ls="--", lw=1, label="random")
    ax.set_title("mean |cos(x, v1(F_l))| at layer output")
    bx.set_title("agreement with the real trajectory (mean cos)")
    for a in (ax, bx):
        a.set_xlabel("layer")
        a.legend(fontsize=8)
    fig.suptitle(f"{dyn.model_name}: idealised dynamics")
    fig.tight_layout()
    return fig


def shared_figure(doc: Mapping[str, Any]) -> Any:
    """The shared-weight experiment against depth (:func:`shared_document`'s curves)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    x = list(range(doc["n_layers"] + 1))
    _draw_curves(ax, doc, x, x)
    ax.set_xlabel("depth l (applications of the layer)")
    ax.set_ylabel("mean |cos(x_l, v1(F_k))|")
    ax.set_title(
        f"{doc['model_name']}: layer {doc['layer']} applied {doc['n_layers']} times "
        f"(rho = {doc['rate']:.3f}; I + F: {doc['rate_residual']:.4f})"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


#: the curves of the alignment charts (names of :class:`~walklens.analyses.power.Alignment` fields): the own layer's v1
#: and the three chance bands (5-95 %); matplotlib and ``assets/results.js`` draw them from the document
ALIGNMENT_CURVES = (
    {"name": "own layer's v1", "y": "mean"},
    {"name": "random directions", "y": "random_mean", "band": ["random_lo", "random_hi"], "dash": True},
    {"name": "other layers' v1", "y": "other_mean", "band": ["other_lo", "other_hi"], "dash": True},
    {"name": "shuffled layers", "y": "shuffled_mean", "band": ["shuffled_lo", "shuffled_hi"], "dash": True},
)
#: the curves of the shared-weight chart (names of :class:`~walklens.analyses.idealised.SharedWeights` fields)
SHARED_CURVES = (
    {"name": "tied model (measured)", "y": "measured", "band": ["measured_lo", "measured_hi"]},
    {"name": "power method x F", "y": "power"},
    {"name": "analytic tanθ0·ρ^l", "y": "predicted", "dash": True},
    {"name": "x (I+F)", "y": "residual"},
    {"name": "analytic, I+F", "y": "predicted_residual", "dash": True},
    {"name": "random", "y": "random_mean", "dash": True},
)
#: eigenvector fields (each [D] or [k, D]) the explorer and the report's page leave out (``vectors=False``)
VECTORS = ("v1", "basis", "v1_right")


def _spectrum(s: LayerSpectrum | HeadSpectrum, eigenvalues: int | None, vectors: bool) -> dict[str, Any]:
    """One layer's (or head's) spectrum: its public fields, eigenvalues cut to the leading ``eigenvalues``."""
    d = fields_of(s, () if vectors else VECTORS)
    if eigenvalues is not None:
        d["eigenvalues"] = s.eigenvalues[:eigenvalues]
    if "heads" in d:
        d["heads"] = [_spectrum(h, eigenvalues, vectors) for h in d["heads"]]
    return d


def spectra_document(spectra: PowerSpectra, *, eigenvalues: int | None = None, vectors: bool = True) -> dict[str, Any]:
    """The document of :class:`~walklens.analyses.power.PowerSpectra` (seed 002): every field of every layer's and
    head's spectrum; ``eigenvalues``: only the leading ones (None: all); ``vectors=False``: without
    :data:`VECTORS` (D numbers each)."""
    return {**fields_of(spectra, ("layers",)), "layers": [_spectrum(s, eigenvalues, vectors) for s in spectra.layers]}


def alignment_document(align: Alignment, *, per_token: bool = True) -> dict[str, Any]:
    """The document of :class:`~walklens.analyses.power.Alignment` (seed 002): every field, and ``curves``
    (:data:`ALIGNMENT_CURVES`); ``per_token=False``: without ``per_token`` and ``tokens`` (points x tokens
    numbers)."""
    return {**fields_of(align, () if per_token else ("per_token", "tokens")), "curves": ALIGNMENT_CURVES}


def dynamics_document(dyn: Dynamics) -> dict[str, Any]:
    """The document of :class:`~walklens.analyses.idealised.Dynamics` (seed 002): every field."""
    return fields_of(dyn)


def shared_document(shared: SharedWeights) -> dict[str, Any]:
    """The document of :class:`~walklens.analyses.idealised.SharedWeights` (seed 002): every field, and ``curves``
    (:data:`SHARED_CURVES`)."""
    return {**fields_of(shared), "curves": SHARED_CURVES}


def document(
    spectra: PowerSpectra,
    align: Alignment,
    dyn: Dynamics | None = None,
    shared: SharedWeights | None = None,
    texts: Sequence[str] = (),
    *,
    eigenvalues: int | None = None,
    vectors: bool = True,
    per_token: bool = True,
) -> dict[str, Any]:
    """The ``--json`` document: every field of each result (complex numbers as ``[re, im]``), from the four
    documents above; the keywords leave parts out (the explorer's reply, the report's page)."""
    return {
        "model": spectra.model_name,
        "texts": list(texts),
        "spectra": spectra_document(spectra, eigenvalues=eigenvalues, vectors=vectors),
        "alignment": alignment_document(align, per_token=per_token),
        "dynamics": dynamics_document(dyn) if dyn is not None else None,
        "shared_weights": shared_document(shared) if shared is not None else None,
    }


#: one-sided level of the 5-95 % chance bands: a null layer ends above a band's top with this probability
BAND_ALPHA = 0.05


def band_counts(align: Alignment) -> str:
    """Layers above each chance band at the layer output, each with the number expected by chance."""
    parts = []
    for band, what in (("random", "random directions"), ("other", "other layers' v1")):
        c, n = align.above(band)
        parts.append(f"above the {what} band: {above_band(c, n, BAND_ALPHA)}")
    return "At the layer output, layers " + "; ".join(parts) + " (layers are not independent: a scale, not a test)."


EIGENVALUES = 8  # leading eigenvalues of each spectrum the page holds (the PNG and --json: all of them)


def add_spectra(r: Report, spectra: PowerSpectra, doc: Mapping[str, Any] | None = None) -> Report:
    """The spectra of F = W_V W_O (seed 002): a PNG of the eigenvalues and the interactive chart."""
    r.h2("Spectra of F = W_V W_O")
    r.figure(
        spectra_figure(spectra),
        "spectra",
        "eigenvalues from the factored B A (row convention); v1 is the principal left eigenvector (x F = λ x)",
    )
    r.result("spectra", doc or spectra_document(spectra, eigenvalues=EIGENVALUES, vectors=False))
    return r


def add_alignment(r: Report, align: Alignment, doc: Mapping[str, Any] | None = None) -> Report:
    """Alignment through depth with its chance bands (seed 002: tokens tilt toward v1)."""
    doc = doc or alignment_document(align)
    r.h2("Alignment through depth")
    r.p(
        f"Mean |cos(x, v1(F_l))| over {align.n_tokens} tokens at each point of layer l, with chance bands "
        "(5-95 %): random directions of equal dimension, v1 of the other layers, and the layers' v1 shuffled."
        + (" First positions left out." if align.skip_first else ""),
        note=True,
    )
    r.p(band_counts(align), note=True)
    r.result("alignment", {**doc, "per_token": align.per_token[:1], "tokens": align.tokens[:1]})
    r.figure(alignment_figure(doc), "alignment", embed=False)  # the charts above, as one PNG
    return r


def add_dynamics(r: Report, dyn: Dynamics) -> Report:
    """The idealised dynamics next to the model's (seed 002, sec. 3)."""
    r.h2("Idealised dynamics")
    r.p(
        "real: the model; mlp_ablated: every feed-forward output zeroed; linear: the seed's simplified layer "
        "from the real weights (normalisation and value/output projection, token attends to itself, no "
        "feed-forward); power: x <- x F_l / |x F_l|. All start from the real input of layer 0.",
        note=True,
    )
    r.result("dynamics", dynamics_document(dyn))
    r.figure(dynamics_figure(dyn), "dynamics", embed=False)  # repeats the two charts above
    return r


def add_shared(r: Report, shared: SharedWeights) -> Report:
    """One layer applied n times against the power method (seed 002, shared weights)."""
    doc = shared_document(shared)
    r.h2("Shared weights")
    r.p(
        f"Layer {shared.layer} applied {shared.n_layers} times. λ1 = {shared.lambda1:.4g}, λ2 = "
        f"{shared.lambda2:.4g}; analytic rate |λ2/λ1| = {shared.rate:.4f} (I + F: {shared.rate_residual:.4f}); "
        f"fitted on the power method: {shared.fitted_power:.4f}, on the tied model: {shared.fitted_measured:.4f}. "
        f"v1 ≈ {' '.join(repr(t) for t in shared.nearest[:5])}.",
        note=True,
    )
    r.result("shared_weights", doc)
    r.figure(shared_figure(doc), "shared_weights", embed=False)  # repeats the chart above
    return r


SUBTITLE = (
    "Seed 002 (Li & Altafini): a layer's projections and normalisation as a power-method step on "
    "F = W_V W_O; tokens tilt toward F's principal eigenvector v1. Definitions: docs/power.md."
)


def build(
    spectra: PowerSpectra,
    align: Alignment,
    dyn: Dynamics | None = None,
    shared: SharedWeights | None = None,
    title: str = "",
) -> Report:
    """The ``walklens power`` report: each result drawn from its document by ``assets/results.js`` (the
    explorer's power view draws the same documents with the same script), with a PNG of each chart; each part
    is one of the ``add_*`` sections above (a notebook shows each result with its own section)."""
    doc = document(spectra, align, dyn, shared, eigenvalues=EIGENVALUES, vectors=False)
    r = Report(title or f"Power-method view of {spectra.model_name}", SUBTITLE)
    add_spectra(r, spectra, doc["spectra"])
    add_alignment(r, align, doc["alignment"])
    if dyn is not None:
        add_dynamics(r, dyn)
    if shared is not None:
        add_shared(r, shared)
    return r


__all__ = [
    "ALIGNMENT_CURVES",
    "SUBTITLE",
    "add_alignment",
    "add_dynamics",
    "add_shared",
    "add_spectra",
    "EIGENVALUES",
    "SHARED_CURVES",
    "VECTORS",
    "alignment_document",
    "alignment_figure",
    "build",
    "document",
    "dynamics_document",
    "dynamics_figure",
    "shared_document",
    "shared_figure",
    "spectra_document",
    "spectra_figure",
]
