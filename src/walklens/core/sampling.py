"""One step of generation: the choice (greedy, or a draw from P_t with the sequence's own seeded generator) and the
decoding walk's record of it (seed 000, eqs. 10-12), read from the model's raw logits; the model's end-of-sequence
ids.  Used by :mod:`walklens.core.generation` and the decoding walk (:mod:`walklens.analyses.decoding`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..base.numbers import POSITIVE, POSITIVE_INT, PROBABILITY

if TYPE_CHECKING:
    from .loading import LoadedModel


def check_sampling(sample: bool, temperature: float, top_k: int | None, top_p: float | None) -> None:
    """The sampling options' ranges (one line on refusal): any positive finite temperature (:func:`sampler`)."""
    if sample:
        POSITIVE.check(temperature, "temperature")
    if top_k is not None:
        POSITIVE_INT.check(top_k, "top_k")
    if top_p is not None:
        PROBABILITY.check(top_p, "top_p")


def sampler(temperature: float, top_k: int | None, top_p: float | None, seed: int) -> Callable[[torch.Tensor], int]:
    """Draw from P_t filtered by temperature, top-k and nucleus (top-p), with a generator seeded once.  A temperature
    so small that logits / temperature overflows (or is 0 in the logits' dtype) draws the limit: the most probable
    token, uniformly among ties."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList([TemperatureLogitsWarper(float(temperature))])
    if top_k is not None:
        warpers.append(TopKLogitsWarper(int(top_k)))
    if top_p is not None and top_p < 1.0:
        warpers.append(TopPLogitsWarper(float(top_p)))
    gen = torch.Generator().manual_seed(int(seed))

    def pick(logits: torch.Tensor) -> int:
        p = warpers(None, logits[None])[0].softmax(-1)  # type: ignore[arg-type]  # these warpers ignore input_ids
        if not bool(torch.isfinite(p).all()):  # inf / inf or 0 / 0: temperature -> 0 is greedy decoding
            top = logits == logits.max()
            p = top.float() / top.sum()
        return int(torch.multinomial(p, 1, generator=gen))

    return pick


@dataclass
class StepRecord:
    """What one step contributes to a decoding walk (read from the raw logits, eq. 12): the emitted token
    ``choice``, the argmax ``greedy``, the choice's 0-based ``rank`` and probability ``prob`` in P_t, the k nearest
    tokens ``top_ids`` and their ``top_probs``, and ``d`` the decoding vector d_t [D] (float32)."""

    choice: int
    greedy: int
    rank: int
    prob: float
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    d: torch.Tensor


def read_step(logits: torch.Tensor, choice: int, d: torch.Tensor, k: int) -> StepRecord:
    """One step's record from its raw logits [V] (float32), the emitted token and d_t."""
    logp = logits.log_softmax(-1)
    _, ti = logits.topk(min(k, logits.shape[-1]))
    return StepRecord(
        choice=choice,
        greedy=int(logits.argmax()),
        rank=int((logits > logits[choice]).sum()),
        prob=float(logp[choice].exp()),
        top_ids=ti,
        top_probs=logp[ti].exp(),
        d=d,
    )


def eos_ids(lm: LoadedModel) -> set[int]:
    """The model's end-of-sequence ids: its generation config's, else its config's."""
    ids: set[int] = set()
    for src in (getattr(lm.model, "generation_config", None), lm.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(v) for v in e)
        if ids:
            break
    return ids


__all__ = ["StepRecord", "check_sampling", "eos_ids", "read_step", "sampler"]
