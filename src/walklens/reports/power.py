"""The power-method report (``walklens power``; seed 002) and its JSON document: spectra of F = W_V W_O,
alignment through depth with chance bands, idealised dynamics and shared-weight convergence.  They draw the
dataclasses of :mod:`walklens.power` and :mod:`walklens.idealised`; they never load models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from .html import Report, pyplot

if TYPE_CHECKING:
    from ..idealised import Dynamics, SharedWeights
    from ..power import Alignment, PowerSpectra


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
    for i, s in enumerate(spectra.layers):
        if s.complex_pair:
            cx.plot([s.layer], [s.gap], "x", color="C3")
    bx.set_title("principal eigenvalue and gap (red x: complex pair)")
    fig.tight_layout()
    return fig


def alignment_figure(align: Alignment, kinds: tuple[str, ...] = ("resid_pre", "resid_mid", "resid_post")) -> Any:
    """Alignment through depth with the three chance bands, one panel per kind of point."""
    plt = pyplot()
    kinds = tuple(k for k in kinds if any(p.endswith("." + k) for p in align.points))
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.4 * len(kinds), 3.6), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        sel = [i for i, p in enumerate(align.points) if p.endswith("." + kind)]
        x = [align.layer_of[i] for i in sel]
        pick = lambda xs: [xs[i] for i in sel]  # noqa: E731
        for name, m, lo, hi, c in (("random directions", align.random_mean, align.random_lo, align.random_hi, "C7"),
                                   ("other layers' v1", align.other_mean, align.other_lo, align.other_hi, "C1"),
                                   ("shuffled layers", align.shuffled_mean, align.shuffled_lo, align.shuffled_hi, "C2")):
            ax.fill_between(x, pick(lo), pick(hi), color=c, alpha=0.18)
            ax.plot(x, pick(m), "--", color=c, lw=1, label=name)
        ax.plot(x, pick(align.mean), "o-", color="C0", ms=3, label="own layer's v1")
        ax.set_title(kind)
        ax.set_xlabel("layer")
    axes[0][0].set_ylabel("mean |cos(x, v1(F_l))|")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"{align.model_name}: alignment with v1 of F = W_V W_O ({align.n_tokens} tokens; bands 5-95 %)")
    fig.tight_layout()
    return fig


def dynamics_figure(dyn: Dynamics) -> Any:
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


def shared_figure(sw: SharedWeights) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    x = list(range(sw.n_layers + 1))
    ax.fill_between(x, sw.measured_lo, sw.measured_hi, color="C0", alpha=0.15)
    ax.plot(x, sw.measured, "o-", ms=3, color="C0", label="tied model (measured, 5-95 % band)")
    ax.plot(x, sw.power, "-", color="C1", label="power method x F")
    ax.plot(x, sw.predicted, "--", color="C1", label=f"analytic, slowest mode only: rho = |λ2/λ1| = {sw.rate:.3f}")
    ax.plot(x, sw.residual, "-", color="C2", label="x (I + F)")
    ax.plot(x, sw.predicted_residual, "--", color="C2", label=f"analytic, slowest mode only, I+F: rho = {sw.rate_residual:.4f}")
    ax.axhline(sw.random_mean, color="C7", ls=":", label="random direction")
    ax.set_xlabel("depth l (applications of the layer)")
    ax.set_ylabel("mean |cos(x_l, v1(F_k))|")
    ax.set_title(f"{sw.model_name}: layer {sw.layer} applied {sw.n_layers} times")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def document(spectra: PowerSpectra, align: Alignment, dyn: Dynamics | None, shared: SharedWeights | None,
             texts: Sequence[str]) -> dict[str, Any]:
    """The ``--json`` document: every field of each result (complex numbers as ``[re, im]``)."""
    return {"model": spectra.model_name, "texts": list(texts), "spectra": spectra, "alignment": align,
            "dynamics": dyn, "shared_weights": shared}


def build(spectra: PowerSpectra, align: Alignment, dyn: Dynamics | None = None, shared: SharedWeights | None = None,
          title: str = "") -> Report:
    """The ``walklens power`` report."""
    r = Report(title or f"Power-method view of {spectra.model_name}",
               "Seed 002 (Li & Altafini): a layer's projections and normalisation as a power-method step on "
               "F = W_V W_O; tokens tilt toward F's principal eigenvector v1. Definitions: docs/power.md.")
    r.h2("Spectra of F = W_V W_O")
    r.figure(spectra_figure(spectra), "spectra", "eigenvalues from the factored B A (row convention); "
             "v1 is the principal left eigenvector (x F = λ x)")
    rows = []
    for s in spectra.layers:
        lam = s.lambda1
        rows.append([s.layer, abs(lam), f"{lam.real:.4g}{lam.imag:+.4g}i" if s.complex_pair else f"{lam.real:.4g}",
                     s.gap, s.residual_gap, " ".join(repr(t) for t in s.nearest[:6]),
                     " ".join(repr(t) for t in s.opposite[:4])])
    r.table(["layer", "|λ1|", "λ1", "gap |λ2/λ1|", "gap of I+F", "nearest tokens to +v1", "nearest to -v1"], rows)
    if any(s.heads for s in spectra.layers):
        hz = [[abs(complex(h.eigenvalues[0])) for h in s.heads] for s in spectra.layers]
        r.heatmap(hz, row_labels=[f"L{s.layer}" for s in spectra.layers],
                  col_labels=[f"h{h.head}" for h in spectra.layers[0].heads], title="|λ1| of each head's W_v,h W_o,h")

    r.h2("Alignment through depth")
    r.p(f"Mean |cos(x, v1(F_l))| over {align.n_tokens} tokens at each point of layer l, with chance bands "
        "(5-95 %): random directions of equal dimension, v1 of the other layers, and the layers' v1 shuffled."
        + (" First positions left out." if align.skip_first else ""), note=True)
    for kind in ("resid_pre", "resid_mid", "resid_post"):
        sel = [i for i, p in enumerate(align.points) if p.endswith("." + kind)]
        if not sel:
            continue
        pick = lambda xs: [xs[i] for i in sel]  # noqa: E731
        r.lines([align.layer_of[i] for i in sel], [
            {"name": "own layer's v1", "y": pick(align.mean)},
            {"name": "random directions", "y": pick(align.random_mean),
             "band": [pick(align.random_lo), pick(align.random_hi)], "dash": True},
            {"name": "other layers' v1", "y": pick(align.other_mean),
             "band": [pick(align.other_lo), pick(align.other_hi)], "dash": True},
            {"name": "shuffled layers", "y": pick(align.shuffled_mean),
             "band": [pick(align.shuffled_lo), pick(align.shuffled_hi)], "dash": True},
        ], title=f"at {kind}", xlabel="layer")
    r.figure(alignment_figure(align), "alignment", embed=False)  # the charts above, as one PNG
    if align.per_token and align.tokens:
        sel = [i for i, p in enumerate(align.points) if p.endswith(".resid_post")]
        z = align.per_token[0][sel].T.tolist()
        r.heatmap(z, row_labels=align.tokens[0], col_labels=[f"L{align.layer_of[i]}" for i in sel],
                  title="per token (first text), at each layer's output", vmin=0.0)

    if dyn is not None:
        r.h2("Idealised dynamics")
        r.p("real: the model; mlp_ablated: every feed-forward output zeroed; linear: the seed's simplified layer "
            "from the real weights (normalisation and value/output projection, token attends to itself, no "
            "feed-forward); power: x <- x F_l / |x F_l|. All start from the real input of layer 0.", note=True)
        r.lines(dyn.layers, [{"name": m, "y": dyn.alignment[m]} for m in dyn.modes]
                + [{"name": "random", "y": [dyn.random_mean] * len(dyn.layers), "dash": True}],
                title="mean |cos(x, v1(F_l))| at each layer's output", xlabel="layer")
        r.lines(dyn.layers, [{"name": m, "y": dyn.agreement[m]} for m in dyn.modes if m != "real"],
                title="agreement with the real trajectory: mean cos(x_mode, x_real)", xlabel="layer")
        r.figure(dynamics_figure(dyn), "dynamics", embed=False)  # repeats the two charts above

    if shared is not None:
        r.h2("Shared weights")
        r.p(f"Layer {shared.layer} applied {shared.n_layers} times. λ1 = {shared.lambda1:.4g}, λ2 = "
            f"{shared.lambda2:.4g}; analytic rate |λ2/λ1| = {shared.rate:.4f} (I + F: {shared.rate_residual:.4f}); "
            f"fitted on the power method: {shared.fitted_power:.4f}, on the tied model: {shared.fitted_measured:.4f}. "
            f"v1 ≈ {' '.join(repr(t) for t in shared.nearest[:5])}.", note=True)
        x = list(range(shared.n_layers + 1))
        r.lines(x, [
            {"name": "tied model (measured)", "y": shared.measured, "band": [shared.measured_lo, shared.measured_hi]},
            {"name": "power method x F", "y": shared.power},
            {"name": "analytic tanθ0·ρ^l", "y": shared.predicted, "dash": True},
            {"name": "x (I+F)", "y": shared.residual},
            {"name": "analytic, I+F", "y": shared.predicted_residual, "dash": True},
            {"name": "random", "y": [shared.random_mean] * len(x), "dash": True},
        ], title="mean |cos(x_l, v1(F_k))| against depth", xlabel="depth l")
        r.figure(shared_figure(shared), "shared_weights", embed=False)  # repeats the chart above
    return r


__all__ = ["alignment_figure", "build", "document", "dynamics_figure", "shared_figure", "spectra_figure"]
