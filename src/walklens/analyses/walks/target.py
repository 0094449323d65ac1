"""A chosen token through the walk (seed 000, sec. 2.2.2): :class:`TargetAnswer`, the rank of one token at
one position at every point of a walk, and the point where it first becomes the top-1 token **and stays** top-1
up to the top of the stack (:func:`first_top_index`).  The walk's methods
:meth:`~walklens.analyses.walks.EncodingWalk.first_top` and :meth:`~walklens.analyses.walks.EncodingWalk.rank_of`
build it; nothing here reads a model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import DataFrame, frame, point_kind, point_layer

#: the name of each reading as the commands print it
READING = {"none": "raw", "final": "lens"}


@dataclass
class TargetAnswer(Shown, view="target"):
    """One token's ranks at one position through a walk's points (0 = top-1; None: not among the top k the walk
    kept, when ``exact`` is False).

    ``point`` / ``layer``: the first residual point from which the token is top-1 at every later residual point
    (its layer; None: ``embed`` or ``final``, or never); ``point`` None when it never becomes top-1 for good.
    ``exact``: the ranks were read for this token (the walk's ``target``, w_t or w_t+1); False: taken from the
    walk's top k (a rank of k or more is unknown, None)."""

    token: str
    token_id: int
    position: int
    reading: str
    model_name: str
    points: list[str]
    residual: list[bool]
    ranks: list[int | None]
    probs: list[float]
    exact: bool
    point: str | None
    layer: int | None

    def _headline(self) -> str:
        """The head line of its text repr (:mod:`walklens.base.display`)."""
        return f"{self.token!r} at position {self.position} ({READING.get(self.reading, self.reading)}): {self.said()}"

    def said(self) -> str:
        """The answer in words: ``top-1 from L17.resid_post (layer 17) on``, or why there is none."""
        if self.point is not None:
            where = f" (layer {self.layer})" if self.layer is not None else ""
            return f"top-1 from {self.point}{where} on"
        if any(r == 0 for r, res in zip(self.ranks, self.residual) if res):
            return "top-1 at some points, not up to the top"
        return "never top-1"

    def to_pandas(self) -> DataFrame:
        """One row per point: ``point``, ``layer``, ``kind``, ``residual``, ``rank`` (0 = top-1), ``prob``,
        ``top1`` and ``top1_stays`` (from this point on); the token, its id, position and reading as attrs."""
        at = self.points.index(self.point) if self.point is not None else len(self.points)
        return frame(
            {
                "point": self.points,
                "layer": [point_layer(p) for p in self.points],
                "kind": [point_kind(p) for p in self.points],
                "residual": self.residual,
                "rank": self.ranks,
                "prob": self.probs,
                "top1": [r == 0 for r in self.ranks],
                "top1_stays": [i >= at for i in range(len(self.points))],
            },
            {
                "model": self.model_name,
                "token": self.token,
                "token_id": self.token_id,
                "position": self.position,
                "reading": self.reading,
                "exact": self.exact,
            },
        )


def first_top_index(ranks: Sequence[int | None], residual: Sequence[bool]) -> int:
    """The index of the first residual point from which ``ranks`` is 0 at every later residual point (-1: none);
    contribution points (``attn_out``, ``mlp_out``) are not on the stream and are skipped."""
    found = -1
    for i in range(len(ranks) - 1, -1, -1):
        if not residual[i]:
            continue
        if ranks[i] != 0:
            break
        found = i
    return found


def token_id_of(token: str | int, labels: Mapping[int, str], what: str) -> int:
    """The id of ``token`` (an id, or a token's text as the walk's labels decode it: ``" Paris"``)."""
    if isinstance(token, bool) or not isinstance(token, (int, str)):
        raise InputError(f"token must be a token's text or its id, not {token!r}")
    if isinstance(token, int):
        return token
    found = [i for i, s in labels.items() if s == token]
    if not found:
        raise InputError(
            f"{token!r} is not a token {what} read; read it as the target: encoding_walk(trace, target={token!r}) "
            f"(walklens walk TEXT --target {token!r})"
        )
    return min(found)


__all__ = ["READING", "TargetAnswer", "first_top_index", "token_id_of"]
