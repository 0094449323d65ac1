"""The power view: spectra of F = W_V W_O per layer and the alignment of a text's tokens with F's principal
eigenvector through depth, next to chance bands (seed 002); and the steering playground: eigen-steering or
activation addition toward a target, the steered continuation next to the unsteered one (alpha = 0).

Spectra are computed once per model (from the weights); the playground runs
:func:`walklens.steering.steering_sweep` with the alphas ``[0, alpha]``, so both continuations come from the
same code path and the model is restored bit for bit after each (:mod:`walklens.interventions`).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from ..power import alignment, power_spectra
from ..reports.html import show
from ..steering import steering_sweep
from .bounds import MAX_ALPHA, MAX_STEER_TOKENS, MAX_TOKENS, choice_arg, float_arg, int_arg, layers_arg, text_arg
from .routing import api
from .state import Explorer, Job, run_job
from .traces import n_tokens

EIGENVALUES = 8  # |lambda| per layer in a response
N_RANDOM, N_SHUFFLES = 200, 50  # alignment's chance baselines (its defaults)


@api(exact=True)
async def power(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text}`` -> per layer the leading |eigenvalues| of F, its gap, v1's nearest tokens; the mean
    |cos(x, v1(F_l))| of the text's tokens at each point with random-direction, other-layer and
    shuffled-layer bands (5-95 %)."""
    model = body.get("model")
    lm = ex.model(model)
    text = text_arg(body)

    def compute(job: Job) -> dict[str, Any]:
        n_tokens(ex, model, text, MAX_TOKENS, "power")
        spectra = ex.results.get((model, "spectra"), lambda: power_spectra(lm, heads=False, nearest=8))
        job.check()
        al = ex.results.get((model, "alignment", text),
                            lambda: alignment(lm, text, spectra=spectra, n_random=N_RANDOM, n_shuffles=N_SHUFFLES))
        return {"model": model,
                "spectra": [{"layer": s.layer, "eig_abs": s.eigenvalues[:EIGENVALUES].abs(), "gap": s.gap,
                             "residual_gap": s.residual_gap, "complex_pair": s.complex_pair,
                             "nearest": [show(t) for t in s.nearest], "nearest_cos": s.nearest_cos,
                             "opposite": [show(t) for t in s.opposite]} for s in spectra.layers],
                "alignment": {"points": al.points, "layer_of": al.layer_of, "mean": al.mean, "std": al.std,
                              "random_mean": al.random_mean, "random_lo": al.random_lo, "random_hi": al.random_hi,
                              "other_mean": al.other_mean, "other_lo": al.other_lo, "other_hi": al.other_hi,
                              "shuffled_mean": al.shuffled_mean, "shuffled_lo": al.shuffled_lo,
                              "shuffled_hi": al.shuffled_hi, "n_tokens": al.n_tokens}}

    return await run_job(request, ex, model, compute)


@api(exact=True)
async def steer(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, target, layers, alpha, method: eigen|add, max_new_tokens}`` -> the unsteered (alpha 0)
    and the steered greedy continuation of the prompt, with the target's next-token probability and rank,
    the continuation's perplexity under the unsteered model, the push along u and each layer's reach."""
    model = body.get("model")
    lm = ex.model(model)
    prompt = text_arg(body)
    target = text_arg(body, "target")
    layers = layers_arg(body, "layers", lm.n_layers)
    alpha = float_arg(body, "alpha", 0.0, MAX_ALPHA)
    method = choice_arg(body, "method", "eigen", ("eigen", "add"))
    steps = int_arg(body, "max_new_tokens", 12, 1, MAX_STEER_TOKENS)

    def compute(job: Job) -> dict[str, Any]:
        n_tokens(ex, model, prompt, MAX_TOKENS, "steering")
        n_tokens(ex, model, target, MAX_TOKENS, "steering target")
        sw = steering_sweep(lm, prompt, target, [layers], [0.0, alpha] if alpha else [0.0], methods=[method],
                            max_new_tokens=steps)
        rows = [{"alpha": r.alpha, "text": r.text, "target_prob": r.target_prob, "target_rank": r.target_rank,
                 "top_token": show(r.top_token), "perplexity": r.perplexity, "push": r.push,
                 "injection": r.injection} for r in sw.rows]
        return {"model": model, "method": method, "layers": layers, "target_token": show(sw.target_token),
                "reach": sw.reach, "unsteered": rows[0], "steered": rows[-1]}

    return await run_job(request, ex, model, compute)
