"""A scoring request: one context and the continuations scored after it, and the check every scorer applies.

Shared by the one-request-at-a-time scorer (:func:`~.encode.continuation_logliks`) and the packed scorer
(:mod:`.packing`), which lays a request out as one row: the context, then the continuations' input tokens as a
prefix tree (:attr:`ScoreRequest.tree`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from ...base.errors import ContextTooLongError, EmptyTextError
from ..capture import context_limit

if TYPE_CHECKING:
    from ..loading import LoadedModel


@dataclass(frozen=True)
class ScoreRequest:
    """One context (token ids, or input embeddings ``[C, D]``) and the continuations (token ids) scored after it."""

    continuations: Sequence[Sequence[int]]
    context_ids: Sequence[int] | None = None
    context_embeds: torch.Tensor | None = None

    @property
    def context_len(self) -> int:
        if self.context_ids is not None:
            return len(self.context_ids)
        assert self.context_embeds is not None  # one of the two is always given
        return int(self.context_embeds.shape[0])

    @cached_property
    def tree(self) -> tuple[list[int], list[int], list[int]]:
        """The continuations' input tokens (each continuation minus its last token) as a prefix tree:
        ``(token, parent, depth)`` per node, parents first (parent -1: the context)."""
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        index: dict[tuple[int, int], int] = {}
        for c in self.continuations:
            node = -1
            for j, t in enumerate(c[:-1]):
                key = (node, int(t))
                if key not in index:
                    index[key] = len(tokens)
                    tokens.append(int(t))
                    parents.append(node)
                    depths.append(j)
                node = index[key]
        return tokens, parents, depths

    @property
    def row_len(self) -> int:
        """Length of the packed row: the context plus the prefix tree of the continuations' inputs."""
        return self.context_len + len(self.tree[0])

    @property
    def n_needed(self) -> int:
        """Positions whose logits are needed: the context's last plus every tree node."""
        return 1 + len(self.tree[0])


def check_request(lm: LoadedModel, r: ScoreRequest) -> None:
    """Refuse what no scorer can score: an empty context or continuation, and (causal LMs) a context plus
    continuation longer than the model's positions."""
    if not r.continuations or any(len(c) == 0 for c in r.continuations):
        raise EmptyTextError("a continuation tokenises to nothing")
    if r.context_len == 0:
        raise EmptyTextError("the context is empty")
    limit = context_limit(lm)
    L = max(len(c) for c in r.continuations)
    if lm.is_causal and limit is not None and r.context_len + L - 1 > limit:
        raise ContextTooLongError(
            f"context ({r.context_len}) + continuation ({L}) tokens exceed the model's {limit} positions"
        )
