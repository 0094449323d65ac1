"""Does a stack's output c_t stay near its own input token w_t?  (seed 000, A.2 "Encoder vs Decoder Walks",
Fig. 9: "in the encoder stack c_t stays within vicinity of w_t ... in the decoder stack the output vector strays
away from w_t".)

For each stack of a trace (the encoder's first, on an encoder-decoder model) and each position t, the stack's
final output x_t (``final``: c_t after the encoder's final norm, d_t for a decoder) is read against the input
token vectors (the embedding matrix E, cosine): ``rank_own[t]`` is the 0-based rank of w_t's own row among all
|V| rows, ``cos_own[t]`` its cosine.  The control reads the same x_t against the token of another position of
the same text (a seeded derangement, so every control token comes from the text and has its frequency):
``rank_control``, ``cos_control``.  ``closer`` is the share of positions where w_t outranks the control token,
with an exact two-sided sign test against 1/2 (ties dropped) and a Wilson interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..base.display import Shown
from ..base.errors import InputError
from ..base.frames import DataFrame, frame, values
from ..core.trace import Trace

if TYPE_CHECKING:
    from ..core.loading import LoadedModel


@dataclass(frozen=True)
class SelfRank(Shown):
    """One stack's reading (module docstring): per position the rank and cosine of its own token and of the
    control token; the summaries ``closer`` (share of positions where its own token ranks higher), its Wilson
    interval ``closer_lo``/``closer_hi`` and sign-test ``p``."""

    model_name: str
    stack: str
    vocab: int
    token_ids: list[int]
    control_ids: list[int]
    rank_own: torch.Tensor
    rank_control: torch.Tensor
    cos_own: torch.Tensor
    cos_control: torch.Tensor
    closer: float
    closer_lo: float
    closer_hi: float
    p: float
    tokens: list[str] = field(default_factory=list)  # the token strings of ``token_ids`` (empty: not kept)

    def _headline(self) -> str:
        med = float(self.rank_own.float().median())
        return (
            f"{self.model_name} {self.stack or 'model'}: own token median rank {med:g} of {self.vocab}; own ahead "
            f"of the control at {self.closer:.0%} of {len(self.token_ids)} positions (p={self.p:.2g})"
        )

    def to_pandas(self) -> DataFrame:
        """One row per position: its own token and the control token (ids and strings), each one's rank and cosine
        (pandas; docs/notebooks.md, "Tables"); the summaries as ``attrs``."""
        text = dict(zip(self.token_ids, self.tokens))  # a control token is another position's own token
        cols = {
            "position": list(range(len(self.token_ids))), "token_id": self.token_ids,
            "token": [text.get(i) for i in self.token_ids], "control_id": self.control_ids,
            "control_token": [text.get(i) for i in self.control_ids],
            "rank_own": self.rank_own, "rank_control": self.rank_control,
            "cos_own": self.cos_own, "cos_control": self.cos_control,
        }  # fmt: skip
        attrs = {"model": self.model_name, "stack": self.stack, "vocab": self.vocab, "closer": self.closer,
                 "closer_lo": self.closer_lo, "closer_hi": self.closer_hi, "p": self.p}  # fmt: skip
        return frame({k: values(v) for k, v in cols.items()}, attrs)

    def summary(self) -> dict[str, float]:
        """Medians and shares of both readings, as the claims table reads them."""
        own, ctl = self.rank_own.float(), self.rank_control.float()
        return {
            "positions": float(len(self.token_ids)),
            "median_rank_own": float(own.median()),
            "median_rank_control": float(ctl.median()),
            "top1_own": float((own == 0).float().mean()),
            "top10_own": float((own < 10).float().mean()),
            "top10_control": float((ctl < 10).float().mean()),
            "mean_cos_own": float(self.cos_own.mean()),
            "mean_cos_control": float(self.cos_control.mean()),
        }


def derangement(n: int, seed: int = 0) -> list[int]:
    """A seeded permutation of ``range(n)`` with no fixed point (``n >= 2``): each position's control position."""
    if n < 2:
        raise InputError("the control needs at least 2 positions")
    g = torch.Generator().manual_seed(seed)
    while True:
        p = torch.randperm(n, generator=g).tolist()
        if all(i != j for i, j in enumerate(p)):
            return p


def _ranks(x: torch.Tensor, E: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based rank (rows strictly more similar) and cosine of row ``ids[t]`` of E for each x_t."""
    xn = torch.nn.functional.normalize(x.float(), dim=-1)
    En = torch.nn.functional.normalize(E.float(), dim=-1)
    s = xn @ En.T  # [T, V]
    own = s.gather(1, ids[:, None])  # [T, 1]
    return (s > own).sum(1), own[:, 0]


def stack_self_rank(trace: Trace, E: torch.Tensor, *, seed: int = 0, model_name: str = "") -> SelfRank:
    """The reading of one stack's ``final`` output against the token matrix ``E`` [V, D] (module docstring)."""
    from scipy.stats import binomtest

    if "final" not in trace.points:
        raise InputError("the trace has no 'final' point (capture it: the stack's normed output)")
    x = trace.hidden[trace.point_index("final")]
    ids = trace.token_ids.reshape(-1).long().cpu()
    if x.shape[0] != ids.numel():
        raise InputError(f"{x.shape[0]} vectors for {ids.numel()} token ids")
    perm = derangement(ids.numel(), seed)
    ctl = ids[perm]
    r_own, c_own = _ranks(x, E, ids)
    r_ctl, c_ctl = _ranks(x, E, ctl)
    wins, losses = int((r_own < r_ctl).sum()), int((r_own > r_ctl).sum())
    n = wins + losses
    if n:
        ci = binomtest(wins, n).proportion_ci(method="wilson")
        closer, lo, hi, p = wins / n, float(ci.low), float(ci.high), float(binomtest(wins, n).pvalue)
    else:
        closer, lo, hi, p = 0.5, 0.0, 1.0, 1.0
    return SelfRank(
        model_name=model_name,
        stack=trace.stack,
        vocab=int(E.shape[0]),
        token_ids=ids.tolist(),
        control_ids=ctl.tolist(),
        rank_own=r_own,
        rank_control=r_ctl,
        cos_own=c_own,
        cos_control=c_ctl,
        closer=closer,
        closer_lo=lo,
        closer_hi=hi,
        p=p,
        tokens=list(trace.tokens) if len(trace.tokens) == ids.numel() else [],
    )


def self_ranks(trace: Trace, lm: LoadedModel | None = None, *, seed: int = 0) -> list[SelfRank]:
    """Every stack's reading (the encoder's first on an encoder-decoder model), against the model's input
    embedding matrix."""
    lm = lm if lm is not None else trace.lm
    if lm is None:
        raise InputError("this trace is not attached to a model (capture it with walklens.core.capture, or pass lm=)")
    E = lm.adapter.embedding_matrix(lm.model).detach().float().cpu()
    stacks = ([trace.encoder] if trace.encoder is not None else []) + [trace]
    return [stack_self_rank(t, E, seed=seed, model_name=lm.name) for t in stacks]


__all__ = ["SelfRank", "derangement", "self_ranks", "stack_self_rank"]
