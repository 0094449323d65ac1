"""What a compaction keeps (seed 000, footnote 11): what each vector stands for, read against the token vectors
by the encoding-walk machinery (:func:`walklens.analyses.walks.encoding_walk`, sec. 2.2.2), and how well the model
continues the text from the compacted form versus the full one.

The continuation is held out: ``continuation`` given, the context is the text and the continuation is
tokenised the lm-evaluation-harness way (:func:`~walklens.core.scoring.encode.encode_pair`); else the last
``holdout`` tokens of the text are the continuation and the tokens before them the context.  Both inputs are
scored by :func:`~walklens.core.scoring.encode.continuation_logliks` on the same continuation tokens: the full
context's token ids, and the compacted context through ``inputs_embeds``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...base.display import Shown
from ...base.errors import EmptyTextError, InputError, utf8_text
from ...base.frames import Columns, DataFrame, frame, pick, record_table
from ...core.scoring.encode import continuation_logliks, encode_pair, n_prefix_tokens
from ...core.trace import Trace
from ..walks import Metric, encoding_walk, labels_for
from .core import Compacted, compact_ids, compacted_embeds, text_ids

if TYPE_CHECKING:
    from ...core.loading import LoadedModel


@dataclass
class Continuation:
    """Log-likelihood of the held-out continuation after one form of the context: its sum over the tokens, the
    mean per token (``per_token``) and the model inputs the context took."""

    loglik: float
    per_token: float
    inputs: int
    seconds: float


@dataclass
class CompactionReport(Shown, view="compaction_explained"):
    """A compaction (:class:`~.core.Compacted`), each vector's nearest tokens ``neighbours[i]`` as ``(token,
    score)`` (``metric`` against V, the input embedding matrix), and the continuation scored after the full and
    the compacted context."""

    compacted: Compacted
    neighbours: list[list[tuple[str, float]]]
    metric: str
    continuation: str
    continuation_ids: list[int]
    full: Continuation
    compact: Continuation

    @property
    def delta_per_token(self) -> float:
        """Compacted minus full log-likelihood per continuation token (0: nothing lost; negative: worse)."""
        return self.compact.per_token - self.full.per_token

    def _columns(self, table: str = "segments") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        return pick(
            table,
            {
                "segments": lambda: self.compacted._columns("segments"),
                "vectors": lambda: self.compacted._columns("vectors"),
                "neighbours": lambda: record_table(
                    [
                        {"vector": i, "rank": r, "token": t, "score": float(v)}
                        for i, nb in enumerate(self.neighbours)
                        for r, (t, v) in enumerate(nb)
                    ],
                    ["vector", "rank", "token", "score"],
                ),
                "continuation": lambda: record_table(
                    [
                        {
                            "context": name,
                            "inputs": c.inputs,
                            "loglik": c.loglik,
                            "per_token": c.per_token,
                            "seconds": c.seconds,
                        }
                        for name, c in (("full", self.full), ("compacted", self.compact))
                    ]
                ),
            },
            "a CompactionReport",
        )

    def to_pandas(self, table: str = "segments") -> DataFrame:
        """The report as tables (pandas; docs/notebooks.md, "Tables"): ``segments`` and ``vectors`` as
        :meth:`Compacted.to_pandas`; ``neighbours`` each vector's nearest tokens per (vector, rank);
        ``continuation`` the held-out continuation's log-likelihood after the full and the compacted context."""
        c = self.compacted
        return frame(
            self._columns(table),
            {
                "model": c.model,
                "method": c.method,
                "bounds": c.bounds,
                "scheme": c.scheme,
                "metric": self.metric,
                "continuation": self.continuation,
                "delta_per_token": self.delta_per_token,
            },
        )


def nearest_tokens(
    lm: LoadedModel, c: Compacted, k: int = 5, metric: Metric = "cosine"
) -> list[list[tuple[str, float]]]:
    """Each vector's ``k`` nearest tokens: the vectors as one captured point of a :class:`~walklens.core.trace.Trace`
    read by :func:`~walklens.analyses.walks.encoding_walk` against V (the papers' reading, ``norm="none"``)."""
    if not c.k:
        return []
    first = torch.tensor([c.token_ids[a] for a, _ in c.spans], dtype=torch.long)
    tr = Trace(
        tokens=[s[:20] for s in c.segments],
        token_ids=first,
        points=["embed"],
        hidden=c.vectors[None].float(),
        model_name=lm.name,
        family=lm.adapter.family,
        n_layers=lm.n_layers,
        lm=lm,
    )
    walk = encoding_walk(tr, k=k, metric=metric, norm="none", against="embed", lm=lm, progress=False)
    ids, scores = walk.top_ids[0], walk.top_scores[0]
    labels = labels_for(lm.tokenizer, [int(i) for i in ids.reshape(-1) if int(i) >= 0])
    return [[(labels[int(i)], float(s)) for i, s in zip(ids[r], scores[r]) if int(i) >= 0] for r in range(c.k)]


def _score(lm: LoadedModel, cont: list[int], **ctx: Any) -> Continuation:
    t0 = time.perf_counter()
    (ll,) = continuation_logliks(lm, [cont], **ctx)
    dt = time.perf_counter() - t0
    n_in = len(ctx["context_ids"]) if ctx.get("context_ids") is not None else int(ctx["context_embeds"].shape[0])
    return Continuation(loglik=ll, per_token=ll / len(cont), inputs=n_in, seconds=dt)


def explain(
    lm: LoadedModel,
    text: str,
    *,
    continuation: str | None = None,
    holdout: int | None = None,
    top: int = 5,
    metric: Metric = "cosine",
    **compact_kw: Any,
) -> CompactionReport:
    """Compact ``text`` (``compact_kw``: the options of :func:`~.core.compact`) and report what each vector
    stands for and how the held-out continuation scores after it and after the full text (module docstring).
    ``holdout``: tokens held out when no ``continuation`` is given (default: a fifth of the text, at least 1)."""
    if not isinstance(text, str) or not text.strip():
        raise EmptyTextError("the text to compact is empty")
    utf8_text(text)
    pre = n_prefix_tokens(lm)
    if continuation is not None:
        if not continuation.strip():
            raise EmptyTextError("the continuation is empty")
        utf8_text(continuation, "the continuation")
        ctx_ids, cont_ids = encode_pair(lm, text, continuation)
        ctx_ids = ctx_ids[pre:]
    else:
        ids = text_ids(lm, text)
        h = max(1, len(ids) // 5) if holdout is None else int(holdout)
        if not 1 <= h < len(ids):
            raise InputError(f"--holdout must be from 1 to {len(ids) - 1} (the text has {len(ids)} tokens), not {h}")
        ctx_ids, cont_ids = ids[:-h], ids[-h:]
        continuation = lm.tokenizer.decode(cont_ids)
    if not ctx_ids or not cont_ids:
        raise EmptyTextError("the text leaves no context or no continuation")
    c = compact_ids(lm, ctx_ids, text=lm.tokenizer.decode(ctx_ids), **compact_kw)
    full_ids = ([lm.tokenizer.bos_token_id] if pre else []) + list(ctx_ids)
    with torch.inference_mode():
        full = _score(lm, cont_ids, context_ids=full_ids)
        comp = _score(lm, cont_ids, context_embeds=compacted_embeds(lm, c))
    if not math.isfinite(full.loglik):
        raise InputError("the full context gives the continuation no finite log-likelihood")
    return CompactionReport(
        compacted=c,
        neighbours=nearest_tokens(lm, c, top, metric),
        metric=metric,
        continuation=continuation,
        continuation_ids=list(cont_ids),
        full=full,
        compact=comp,
    )


__all__ = ["CompactionReport", "Continuation", "explain", "nearest_tokens"]
