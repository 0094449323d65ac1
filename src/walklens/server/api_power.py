"""The power view: spectra of F = W_V W_O per layer and the alignment of a text's tokens with F's principal
eigenvector through depth, next to chance bands (seed 002); and the steering playground: eigen-steering or
activation addition toward a target, the steered continuation next to the unsteered one (alpha = 0).

Each reply is the result's document, the dict the report module writes as ``--json``
(:mod:`walklens.reports.power`, :mod:`walklens.reports.steer`), and the page draws it with the reports' own
script (``reports/assets/results.js``).  Spectra are computed once per model (from the weights); the
playground runs :func:`walklens.analyses.steering.steering_sweep` with the alphas ``[0, alpha]``, so both continuations
come from the same code path and the model is restored bit for bit after each (:mod:`walklens.core.interventions`).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from ..analyses.power import alignment, power_spectra
from ..analyses.steering import steering_sweep
from ..reports import power as power_report
from ..reports import steer as steer_report
from .bounds import (
    MAX_ALPHA,
    MAX_STEER_TOKENS,
    MAX_TOKENS,
    choice_arg,
    fields_arg,
    float_arg,
    int_arg,
    layers_arg,
    pick,
    text_arg,
)
from .routing import api
from .state import Explorer, Job, run_job
from .traces import n_tokens

EIGENVALUES = 8  # leading eigenvalues of each layer in a reply
N_RANDOM, N_SHUFFLES = 200, 50  # alignment's chance baselines (its defaults)


@api(exact=True)
async def power(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, fields?}`` -> the power report's document (:func:`walklens.reports.power.document`):
    ``spectra`` (per layer the leading eigenvalues of F, its gaps, v1's nearest tokens; no eigenvectors) and
    ``alignment`` (the mean |cos(x, v1(F_l))| of the text's tokens at each point, with random-direction,
    other-layer and shuffled-layer bands, 5-95 %; not per token)."""
    model = ex.model_name(body.get("model"))
    lm = ex.model(model)
    text = text_arg(body)
    fields = fields_arg(body)

    def compute(job: Job) -> dict[str, Any]:
        n_tokens(ex, model, text, MAX_TOKENS, "power")
        spectra = ex.results.get((model, "spectra"), lambda: power_spectra(lm, heads=False, nearest=8))
        job.check()
        al = ex.results.get(
            (model, "alignment", text),
            lambda: alignment(lm, text, spectra=spectra, n_random=N_RANDOM, n_shuffles=N_SHUFFLES),
        )
        return pick(
            power_report.document(spectra, al, texts=[text], eigenvalues=EIGENVALUES, vectors=False, per_token=False),
            fields,
        )

    return await run_job(request, ex, model, compute)


@api(exact=True)
async def steer(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, target, layers, alpha, method: eigen|add, max_new_tokens, fields?}`` -> the steering
    report's document (:func:`walklens.reports.steer.document`) of a sweep with the alphas ``[0, alpha]``: its
    first row the unsteered (alpha 0) greedy continuation of the prompt, its last the steered one, each with
    the target's next-token probability and rank, the continuation's perplexity under the unsteered model and
    the push along u; ``reach``: each layer's."""
    model = ex.model_name(body.get("model"))
    lm = ex.model(model)
    prompt = text_arg(body)
    target = text_arg(body, "target")
    layers = layers_arg(body, "layers", lm.n_layers)
    alpha = float_arg(body, "alpha", 0.0, MAX_ALPHA)
    method = choice_arg(body, "method", "eigen", ("eigen", "add"))
    steps = int_arg(body, "max_new_tokens", 12, 1, MAX_STEER_TOKENS)
    fields = fields_arg(body)

    def compute(job: Job) -> dict[str, Any]:
        n_tokens(ex, model, prompt, MAX_TOKENS, "steering")
        n_tokens(ex, model, target, MAX_TOKENS, "steering target")
        sw = steering_sweep(
            lm, prompt, target, [layers], [0.0, alpha] if alpha else [0.0], methods=[method], max_new_tokens=steps
        )
        return pick(steer_report.document(sw), fields)

    return await run_job(request, ex, model, compute)
