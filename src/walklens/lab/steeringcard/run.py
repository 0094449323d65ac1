"""What a steering card measures on the model (seed 002: steering "towards an arbitrary desired direction"),
one unit of work at a time: the directions of each method, the one dose scale, batched greedy continuations
(:func:`walklens.core.generation.generate_batch`, each the one its prompt gets alone) and their scores under the
unsteered model.

Methods (each an intervention of :mod:`walklens.core.interventions`, restored bit for bit on exit):

* ``eigen``: eigen-steering, the rank-one W_O edit along the target's token direction (:func:`eigen_edit`);
* ``add``: activation addition of the token direction (:func:`add_to_residual`);
* ``meandiff``: activation addition of the mean-difference direction of the target's contrastive pairs (mean
  residual at the layer's output over the positive texts minus over the negative ones; the usual baseline);
* ``ablate``: projection ablation of the mean-difference direction (:func:`ablate_direction`; the control,
  which has no strength: its dose is what it removes, measured).

The token direction is the unit row of V of the target's token (token targets), the mean of the rows of the
topic's words (topic), or the mean of the positive words' rows minus the negative words' rows (sentiment).

**Dose** (one scale for every method): the norm of the change the intervention adds to the residual stream at
the layer, over the mean residual norm at that layer's output, both measured with hooks over the set's neutral
texts (every position but the first, whose norm is an attention sink's).  The change is read at the layer's
output for the hook methods (``add``/``meandiff``: exactly ``alpha``) and at its mid-residual (the attention
write, where W_O acts) for ``eigen``, whose ``alpha`` is calibrated from the change at ``alpha = 1`` (linear
unless the family normalises the attention output, e.g. Gemma's post-attention norm); every cell also
reports the dose it realised.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from ...analyses.steering import repetition  # the card's coherence is steer()'s
from ...base.hooks import Hooks, first_output
from ...core.capture import tokenize
from ...core.generation import generate_batch
from ...core.interventions import ablate_direction, add_to_residual, eigen_edit
from ...models.base import get_module
from .sets import Target

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

METHODS = ("eigen", "add", "meandiff", "ablate")
#: prompts per forward pass when scoring continuations (bounds the [batch, tokens, vocabulary] log-probs)
SCORE_BATCH = 8
#: prompts per batch of greedy continuations
GEN_BATCH = 32


def first_ids(lm: LoadedModel, words: Sequence[str]) -> list[int]:
    """The first token id of each word (as the tokenizer reads it, without special tokens)."""
    out = []
    for w in words:
        ids = lm.tokenizer(w, add_special_tokens=False)["input_ids"]
        if ids:
            out.append(int(ids[0]))
    return out


def token_direction(lm: LoadedModel, target: Target) -> torch.Tensor:
    """The unit token-space direction of a target [D] (float64; module docstring)."""
    V = lm.embedding_matrix().detach().double().cpu()
    if target.kind == "token":
        u = V[first_ids(lm, [target.token])].mean(0)
    elif target.kind == "topic":
        u = V[first_ids(lm, target.words)].mean(0)
    else:
        u = V[first_ids(lm, target.words)].mean(0) - V[first_ids(lm, target.negative_words)].mean(0)
    return u / u.norm()


def _padded(lm: LoadedModel, seqs: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id sequences as one right-padded batch and its attention mask (on the model's device)."""
    T = max(len(q) for q in seqs)
    ids = torch.zeros((len(seqs), T), dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, : len(q)] = torch.tensor(q)
        mask[i, : len(q)] = 1
    return ids.to(lm.device), mask.to(lm.device)


@torch.no_grad()
def record(
    lm: LoadedModel, texts: Sequence[str], layer: int
) -> tuple[list[dict[str, torch.Tensor]], list[torch.Tensor]]:
    """One forward pass over the texts as a right-padded batch: per text, the layer's ``resid_post`` and
    ``resid_mid`` (``resid_post`` minus the feed-forward's contribution ``mlp_out``) [T-1, D] (float64, first
    position left out), read by hooks registered after any intervention's (so they see the steered states),
    and the next-token log-probs [T, V] (float32)."""
    got: dict[str, torch.Tensor] = {}
    mod = lm.adapter.layer_modules(lm.model)[layer]

    def keep(name: str) -> Any:
        def fn(_m: Any, _inp: Any, output: Any) -> None:
            got[name] = first_output(output).detach().double().cpu()

        return fn

    seqs = [tokenize(lm, t)[0].tolist() for t in texts]
    ids, mask = _padded(lm, seqs)
    with Hooks() as hooks:
        hooks.post(mod, keep("post"))
        hooks.post(get_module(mod, lm.adapter.stack().mlp_out), keep("mlp"))
        logits = lm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float().cpu()
    states, logps = [], []
    for i, q in enumerate(seqs):
        post = got["post"][i, 1 : len(q)]
        states.append({"resid_post": post, "resid_mid": post - got["mlp"][i, 1 : len(q)]})
        logps.append(torch.log_softmax(logits[i, : len(q)], -1))
    return states, logps


def _states(lm: LoadedModel, texts: Sequence[str], layer: int) -> torch.Tensor:
    """The ``resid_post`` states of a layer over texts, stacked [N, D] (first positions left out)."""
    return torch.cat([st["resid_post"] for st in record(lm, texts, layer)[0]])


def mean_difference(lm: LoadedModel, target: Target, layer: int) -> torch.Tensor:
    """The unit mean-difference direction of a target's pairs at a layer's output [D] (float64)."""
    pos = _states(lm, [p for p, _ in target.pairs], layer).mean(0)
    neg = _states(lm, [n for _, n in target.pairs], layer).mean(0)
    d = pos - neg
    return d / d.norm()


def mean_norm(lm: LoadedModel, texts: Sequence[str], layer: int) -> float:
    """The mean residual norm at a layer's output over ``texts`` (first positions left out)."""
    return float(_states(lm, texts, layer).norm(dim=-1).mean())


def change_point(method: str) -> str:
    """Where a method's change to the residual stream is read (module docstring, "Dose")."""
    return "resid_mid" if method == "eigen" else "resid_post"


@contextmanager
def intervene(lm: LoadedModel, method: str, layer: int, u: torch.Tensor, alpha: float) -> Iterator[None]:
    """One method's intervention at one layer (``u`` unit [D]; ``alpha`` unused by ``ablate``)."""
    if method == "eigen":
        with eigen_edit(lm, [layer], u, alpha):
            yield
    elif method in ("add", "meandiff"):
        with add_to_residual(lm, [layer], u.float(), alpha):
            yield
    elif method == "ablate":
        with ablate_direction(lm, [layer], u.float()):
            yield
    else:
        with contextlib.nullcontext():
            yield


def neutral_pass(
    lm: LoadedModel, texts: Sequence[str], layer: int, point: str, ctx: contextlib.AbstractContextManager[Any] | None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per neutral text: the states of ``point`` at ``layer`` (first position left out) and the next-token
    log-probs [T, V] (float32), inside ``ctx`` (None: the unsteered model)."""
    with ctx if ctx is not None else contextlib.nullcontext():
        states, logps = record(lm, texts, layer)
    return [st[point] for st in states], logps


def neutral_rows(
    base: tuple[list[torch.Tensor], list[torch.Tensor]],
    steered: tuple[list[torch.Tensor], list[torch.Tensor]],
    norm: float,
) -> list[dict[str, float]]:
    """Per neutral text: the KL(unsteered || steered) of the next-token distribution (mean over positions; a
    rounding below 0 read as 0, the least a KL is) and the dose it realised (mean norm of the change at the
    change point over ``norm``)."""
    rows = []
    for hb, hs, lb, ls in zip(base[0], steered[0], base[1], steered[1]):
        kl = float((lb.exp() * (lb - ls)).sum(-1).mean())
        rows.append({"kl": 0.0 if kl < 0 else kl, "dose": float((hs - hb).norm(dim=-1).mean()) / norm})
    return rows


def eos_ids(lm: LoadedModel) -> set[int]:
    """Every id that ends a continuation (the tokenizer's and the generation config's end of sequence)."""
    ids: set[int] = set()
    for v in (lm.tokenizer.eos_token_id, getattr(getattr(lm.hf, "generation_config", None), "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return ids


@torch.no_grad()
def generate(lm: LoadedModel, prompts: Sequence[list[int]], n: int) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy continuations of ``n`` tokens (ended at an end of sequence, which is left out) of the prompts in
    left-padded batches of :data:`GEN_BATCH` with the model's own ``generate`` and key/value cache
    (:func:`walklens.core.generation.generate_batch`: each continuation the one its prompt gets alone), and the first
    step's next-token log-probs [B, V] (float32; NaN where the steered model's logits were not finite, whose
    continuation is then empty)."""
    ends = eos_ids(lm)
    gens = generate_batch(lm, list(prompts), max_new_tokens=n, eos=ends, logits=1, batch_size=GEN_BATCH)
    conts = [g.token_ids[:-1] if g.stopped_at_eos else g.token_ids for g in gens]
    return conts, torch.log_softmax(torch.stack([g.logits[0] for g in gens]).float().cpu(), -1)


@torch.no_grad()
def score(
    lm: LoadedModel, prompts: Sequence[list[int]], conts: Sequence[list[int]], words: list[int], negative: list[int]
) -> list[tuple[float, float]]:
    """Under the unsteered model, per (prompt, continuation): the continuation's mean negative log-likelihood
    (log perplexity; NaN when empty) and the word score after it: the mean log-prob of the first tokens of
    ``words``, minus that of ``negative`` when given."""
    out = []
    for b in range(0, len(prompts), SCORE_BATCH):
        seqs = [list(p) + list(c) for p, c in zip(prompts[b : b + SCORE_BATCH], conts[b : b + SCORE_BATCH])]
        ids, mask = _padded(lm, seqs)
        logits = lm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        lp = torch.log_softmax(logits.float().cpu(), -1)
        for i, (p, c) in enumerate(zip(prompts[b : b + SCORE_BATCH], conts[b : b + SCORE_BATCH])):
            P, last = len(p), len(p) + len(c) - 1
            nll = -lp[i, P - 1 : last].gather(1, torch.tensor(c).view(-1, 1)).mean() if c else torch.tensor(math.nan)
            s = lp[i, last, words].mean() - (lp[i, last, negative].mean() if negative else 0.0)
            out.append((float(nll), float(s)))
    return out


def unit_rows(
    lm: LoadedModel,
    target: Target,
    prompts: Sequence[tuple[str, list[int]]],
    n: int,
    ctx: contextlib.AbstractContextManager[Any],
) -> list[dict[str, Any]]:
    """One unit of work: the prompts of one target and split, continued inside ``ctx`` and scored outside it.
    Per prompt: ``score`` (token targets: the target's next-token log-prob under the steered model; topic and
    sentiment: the word score after the continuation under the unsteered model), ``rank`` (token targets,
    0-based), ``log_ppl``, ``repetition`` (share of repeated 3-grams) and the continuation's ``text``."""
    ids = [p for _, p in prompts]
    with ctx:
        conts, first = generate(lm, ids, n)
    words = first_ids(lm, [target.token] if target.kind == "token" else target.words)
    negative = first_ids(lm, target.negative_words) if target.kind == "sentiment" else []
    scored = score(lm, ids, conts, words, negative)
    rows = []
    for i, ((pid, _), c, (nll, s)) in enumerate(zip(prompts, conts, scored)):
        row: dict[str, Any] = {"id": pid, "log_ppl": nll, "repetition": repetition(c), "n_tokens": len(c)}
        if target.kind == "token":
            lp = first[i]
            row["score"], row["rank"] = float(lp[words[0]]), int((lp > lp[words[0]]).sum())
        else:
            row["score"] = s
        row["text"] = lm.tokenizer.decode(c)
        rows.append(row)
    return rows


__all__ = [
    "METHODS",
    "token_direction",
    "mean_difference",
    "mean_norm",
    "record",
    "change_point",
    "intervene",
    "neutral_pass",
    "neutral_rows",
    "generate",
    "score",
    "unit_rows",
]
