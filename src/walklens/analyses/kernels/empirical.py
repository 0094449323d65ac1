"""Empirical position kernels (seed 000, A.2; the estimator: :mod:`walklens.analyses.kernels`): the mean attention
weight by
relative distance over shuffled-token inputs, per layer and head, with its spread over samples."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ...base.errors import InputError, utf8_text
from ...base.hooks import Hooks, distinct
from ...core.capture import attention_probs, context_limit
from ...models.base import get_module
from .result import StackKernels

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

#: Default corpus for empirical kernels: plain prose (its words are shuffled, so only its vocabulary matters).
DEFAULT_CORPUS = (
    "The river runs through the old city and past the market where farmers sell bread, cheese and apples. "
    "In the morning the streets are quiet; by noon they are full of people, bicycles and small delivery vans. "
    "A teacher walks her class to the museum to look at paintings of ships, storms and distant mountains. "
    "The library on the hill keeps maps, letters and books written by travellers who crossed the sea. "
    "Children play football in the park while their parents talk about work, prices and the weather. "
    "At night the lights of the bridge shine on the water and the last train leaves the station at eleven. "
    "Scientists at the university study how plants grow in dry soil and how birds find their way home. "
    "The king and the queen of the story lived in a castle with a garden, a tower and a long stone wall. "
    "My friend bought a red car, a blue bicycle and three green chairs for the house near the forest. "
    "Every winter the lake freezes and the village holds a festival with music, food and a race on the ice."
)


def _attention_modules(lm: LoadedModel, stack: str) -> list[torch.nn.Module]:
    spec = lm.adapter.stack(stack)
    return [get_module(layer, spec.attn) for layer in lm.adapter.layer_modules(lm.model, stack)]


def _token_pool(lm: LoadedModel, corpus: str) -> torch.Tensor:
    utf8_text(corpus, "the corpus")
    ids = lm.tokenizer(corpus, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    if ids.numel() == 0:
        raise InputError("the corpus tokenises to no tokens")
    return ids


def _shuffled_samples(pool: torch.Tensor, samples: int, length: int, seed: int) -> torch.Tensor:
    """``samples`` random permutations of ``length`` tokens of ``pool`` (a window of it, or a draw when shorter)."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(samples):
        if pool.numel() >= length:
            start = int(torch.randint(0, pool.numel() - length + 1, (1,), generator=g))
            window_ids = pool[start : start + length]
        else:
            window_ids = pool[torch.randint(0, pool.numel(), (length,), generator=g)]
        seqs.append(window_ids[torch.randperm(length, generator=g)])
    return torch.stack(seqs)


@torch.no_grad()
def empirical_kernels(
    lm: LoadedModel,
    *,
    corpus: str | None = None,
    samples: int = 16,
    length: int = 64,
    window: int | None = None,
    seed: int = 0,
    batch: int = 4,
    progress: bool = True,
    sink: bool = False,
) -> tuple[list[StackKernels], str]:
    """Mean attention weight by relative distance over shuffled-token inputs (:mod:`walklens.analyses.kernels`), per
    layer and head, with the std over samples and a 95% CI half-width.  ``sink``: the attention-sink control, each row
    renormalised over keys 1.. before averaging (``A[i, j] / sum_{j' >= 1} A[i, j']``), so a head that
    dumps its mass on the first token weighs each row alike."""
    if lm.is_encoder_decoder:
        raise InputError(
            "empirical kernels support decoder-only and encoder-only models (T5 kernels are read from the weights)"
        )
    spec = lm.adapter.stacks[-1]
    causal = spec.causal
    length, rows, dist = _window(lm, causal, samples, length, window)
    ids = _shuffled_samples(_token_pool(lm, corpus or DEFAULT_CORPUS), samples, length, seed)
    ks = _sample_kernels(lm, spec.name, ids, rows, dist, sink, batch, progress)  # [N, L, H, n]
    L = lm.n_layers
    mean = ks.mean(0)
    std = ks.std(0)
    ci = 1.96 * std / math.sqrt(samples)
    sk = StackKernels(spec.name, causal, dist, list(range(L)), mean, mean.clamp_min(1e-12).log(), std, ci)
    sk.samples, sk.sink_removed = ks, sink
    est = ("position 0 removed, rows renormalised; " if sink else "") + (
        f"mean attention weight A_h[i, i+delta] over {samples} shuffled-token samples of {length} tokens "
        f"(corpus: {'user' if corpus else 'built-in'}, seed {seed}); query rows {int(rows[0])}..{int(rows[-1])} "
        f"for every delta in [{dist[0]}, {dist[-1]}]; spread = std over samples, ci95 = 1.96 std/sqrt(n)"
    )
    return [sk], est


def _window(
    lm: LoadedModel, causal: bool, samples: int, length: int, window: int | None
) -> tuple[int, torch.Tensor, list[int]]:
    """The samples' length (at most the model's context), the query rows Q and the distances of the empirical
    kernels (:mod:`walklens.analyses.kernels`: causal ``Q = {W+1, ..., T-1}``, bidirectional ``Q = {W, ...,
    T-1-W}``)."""
    limit = context_limit(lm)
    if limit is not None and length > limit:
        length = limit
    if samples < 2:
        raise InputError("empirical kernels need at least 2 samples (the spread is over samples)")
    W = window or ((length - 2) // 2 if causal else (length - 1) // 4)
    if causal:
        rows = torch.arange(W + 1, length)
        dist = list(range(-W, 1))
    else:
        rows = torch.arange(max(W, 1), length - W)
        dist = list(range(-W, W + 1))
    if W < 2 or rows.numel() == 0:
        raise InputError(f"length {length} is too short for window {W}")
    return length, rows, dist


def _sample_kernels(
    lm: LoadedModel,
    stack: str,
    ids: torch.Tensor,
    rows: torch.Tensor,
    dist: list[int],
    sink: bool,
    batch: int,
    progress: bool,
) -> torch.Tensor:
    """The per-sample kernels [N, L, H, n]: each layer's attention at the query rows ``rows`` and every distance
    of ``dist``, averaged over the rows, from forward passes over the samples ``ids``, ``batch`` at a time
    (``sink``: each row renormalised over keys 1.. first)."""
    from tqdm.auto import tqdm

    modules = _attention_modules(lm, stack)
    per_layer: list[torch.Tensor] = []  # per call order: [N_chunk, H, n]
    dist_t = torch.tensor(dist)
    cols = rows[:, None] + dist_t[None, :]  # [|Q|, n]

    def keep(_m: torch.nn.Module, _i: Any, out: Any) -> None:
        w = attention_probs(out)
        if w is None:
            return
        w = w.detach().float().cpu()  # [B, H, T, T]
        if sink:
            w = w / w[..., 1:].sum(-1, keepdim=True).clamp_min(1e-30)  # the other keys' own sum (no 1 - A[i, 0])
        per_layer.append(w[:, :, rows[:, None], cols].mean(2))  # [B, H, n]

    L = lm.n_layers
    chunks: list[torch.Tensor] = []
    with Hooks() as hooks:
        for m in distinct(modules):
            hooks.post(m, keep)
        for start in tqdm(range(0, ids.shape[0], batch), desc="empirical kernels", disable=not progress, leave=False):
            per_layer.clear()
            lm.model(input_ids=ids[start : start + batch].to(lm.device))
            if len(per_layer) != L:
                raise InputError(f"{lm.name}: captured {len(per_layer)} attention maps for {L} layers")
            chunks.append(torch.stack(per_layer, 1))  # [B, L, H, n]
    return torch.cat(chunks)  # [N, L, H, n]
