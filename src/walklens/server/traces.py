"""The traces the views read: one :func:`walklens.core.capture` per (model, text, points), kept in the explorer's
small caches so that switching a reading, clicking a cell or changing a point does not run the model again.

Only the points a view needs are captured (the walk: ``embed``, every ``resid_post`` and ``final``); the
attention view's traces, which hold every layer's [heads, T, T] probabilities, have a cache of their own with
room for one.  Every text is counted in tokens and refused (413) over the view's limit, or over what the view
would need (:func:`~.bounds.check_cost`, the commands' cost model), before the model runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.capture import capture, tokenize
from .bounds import check_cost, check_tokens
from .state import Explorer, Job

if TYPE_CHECKING:
    from ..core.trace import Trace

#: the points of the layer x position views: the stream after every layer, between the embeddings and `final`
WALK_POINTS = ("embed", "L*.resid_post", "final")


def n_tokens(explorer: Explorer, model: str, text: str, limit: int, view: str) -> int:
    """The token count of ``text`` for ``model``, refused (413) over the view's ``limit`` or over the explorer's
    limits; an empty text or one longer than the model's context is refused by
    :func:`walklens.core.capture.tokenize` (400)."""
    lm = explorer.model(model)
    if text.strip():
        check_tokens(int(lm.tokenizer(text, return_tensors="pt")["input_ids"].shape[1]), limit, view)
    n = int(tokenize(lm, text).shape[1])
    check_cost(explorer.shape(model), n, view, explorer.limits)
    return n


def trace(
    explorer: Explorer, job: Job, model: str, text: str, points: Sequence[str] | None, limit: int, view: str
) -> Trace:
    """The trace of ``text`` at ``points`` (glob patterns; None: every point), cached."""
    n_tokens(explorer, model, text, limit, view)
    key = (model, "trace", text, tuple(points) if points is not None else None)
    tr = explorer.traces.get(
        key, lambda: capture(explorer.model(model), text, points=list(points) if points is not None else None)
    )
    job.check()
    return tr


def attention_trace(explorer: Explorer, job: Job, model: str, text: str, limit: int) -> Trace:
    """The trace of ``text`` with every attention module's probabilities (``attentions=True``), cached once."""
    n_tokens(explorer, model, text, limit, "attention")
    tr = explorer.attention.get(
        (model, text), lambda: capture(explorer.model(model), text, points=["final"], attentions=True)
    )
    job.check()
    return tr
