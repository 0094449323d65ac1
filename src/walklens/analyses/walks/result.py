"""The encoding walk's result type (seed 000, sec. 2.2.2, Fig. 9, A.2): :class:`EncodingWalk`, its shapes checked
when it is made, its escape points by name and its long table; the names of the walk's readings (``Metric``,
``Norm``, ``Against``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import Columns, DataFrame, concat_columns, frame, long_table, pick, point_kind, point_layer
from .target import TargetAnswer, first_top_index, token_id_of

Metric = Literal["dot", "cosine"]
Norm = Literal["none", "final"]
Against = Literal["auto", "embed", "unembed"]

# the [points, positions] readings of an EncodingWalk, in its columns' order
_WALK_CELLS = (
    "rank_of_input",
    "rank_of_next",
    "prob_of_input",
    "prob_of_next",
    "dot_input",
    "dot_next",
    "cos_input",
    "cos_next",
    "vector_norm",
    "step_length",
    "step_angle",
)


def _texts(ids: torch.Tensor, labels: dict[int, str]) -> np.ndarray:
    """The text of each token id of ``ids`` (any shape) as an object array of that shape (-1: None)."""
    flat = [labels.get(i, str(i)) if i >= 0 else None for i in ids.reshape(-1).tolist()]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(tuple(ids.shape))


@dataclass
class EncodingWalk(Shown, view="walk"):
    """The encoding walk of every position through every selected point (sec. 2.2.2, Fig. 9, A.2).

    Per point p and position t (tensors [points, tokens]): ``top_ids``/``top_scores`` [points, tokens, k]
    (nearest tokens by ``metric``; k = 0: none read), ``rank_of_input``/``rank_of_next`` (rank of w_t /
    w_{t+1}; 0 = nearest; the last position has no next token: -1), ``prob_of_input``/``prob_of_next``
    (softmax of the inner products, eq. 12; NaN where undefined, and everywhere if read with ``probs=False``),
    ``dot_input``/``dot_next`` and ``cos_input``/``cos_next`` (inner product and cosine with the token's row),
    ``vector_norm`` (|x|), ``step_length`` and ``step_angle`` (distance and angle in degrees from the previous
    residual point, measured on the raw captured vectors; NaN for the first residual point and for
    contribution points such as ``attn_out``).  Per position: ``escape_point`` — index into ``points`` of the
    first residual point where w_{t+1} outranks w_t (the escape from the self-neighbourhood, A.2), -1 if never
    (or the last position); ``escape_stable`` — the first residual point from which w_{t+1} stays ahead of w_t
    up to the top.
    ``encoder`` holds the encoder stack's walk for encoder-decoder models (A.2, "Encoder vs Decoder Walks").
    ``target_id`` / ``target_position`` / ``rank_of_target`` / ``prob_of_target``: a chosen token read at one
    position, every point ([points]; ``encoding_walk(trace, target=" Paris")``; None when none was chosen):
    :meth:`first_top` and :meth:`rank_of` answer where it becomes top-1.
    """

    tokens: list[str]
    token_ids: torch.Tensor
    points: list[str]
    residual: list[bool]
    k: int
    metric: str
    norm: str
    matrix: str
    top_ids: torch.Tensor
    top_scores: torch.Tensor
    rank_of_input: torch.Tensor
    rank_of_next: torch.Tensor
    prob_of_input: torch.Tensor
    prob_of_next: torch.Tensor
    dot_input: torch.Tensor
    dot_next: torch.Tensor
    cos_input: torch.Tensor
    cos_next: torch.Tensor
    vector_norm: torch.Tensor
    step_length: torch.Tensor
    step_angle: torch.Tensor
    escape_point: torch.Tensor
    escape_stable: torch.Tensor
    stack: str = ""
    model_name: str = ""
    n_layers: int = 0
    encoder: EncodingWalk | None = None
    model_dtype: str = "float32"
    target_id: int | None = None
    target_position: int | None = None
    rank_of_target: torch.Tensor | None = None
    prob_of_target: torch.Tensor | None = None
    #: the text of each token id the walk names (its tokens and their nearest tokens): what its view shows
    labels: dict[int, str] = field(default_factory=dict, repr=False)

    def _headline(self) -> str:
        """The head line of its text repr (:mod:`walklens.base.display`)."""
        return f"{self.model_name} · {len(self.tokens)} tokens × {len(self.points)} points · {self.metric}/{self.norm}"

    def __post_init__(self) -> None:
        P, T = len(self.points), len(self.tokens)
        if len(self.residual) != P:
            raise ValueError(f"residual flags: {len(self.residual)} for {P} points")
        for name in _WALK_CELLS:
            shape = tuple(getattr(self, name).shape)
            if shape != (P, T):
                raise ValueError(f"{name} has shape {shape}, expected {(P, T)}")
        for name in ("top_ids", "top_scores"):
            if tuple(getattr(self, name).shape) != (P, T, self.k):
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {(P, T, self.k)}")
        for name in ("escape_point", "escape_stable"):
            if tuple(getattr(self, name).shape) != (T,):
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {(T,)}")
        for name in ("rank_of_target", "prob_of_target"):
            v = getattr(self, name)
            if v is not None and tuple(v.shape) != (P,):
                raise ValueError(f"{name} has shape {tuple(v.shape)}, expected {(P,)}")

    @property
    def residual_points(self) -> list[str]:
        """The points on the residual stream, in walk order."""
        return [p for p, r in zip(self.points, self.residual) if r]

    @property
    def escape_names(self) -> list[str | None]:
        """Name of the escape point of each position (None: w_{t+1} never outranks w_t)."""
        return [self.points[i] if i >= 0 else None for i in self.escape_point.tolist()]

    @property
    def escape_stable_names(self) -> list[str | None]:
        """Name of the point from which w_{t+1} stays ahead of w_t to the top (None: it does not)."""
        return [self.points[i] if i >= 0 else None for i in self.escape_stable.tolist()]

    def _ranks_of(self, token_id: int, position: int) -> tuple[list[int | None], list[float], bool]:
        """The ranks and probabilities of ``token_id`` at ``position`` at every point, and whether they are exact
        (read for it) or taken from the top k."""
        T = len(self.tokens)
        ids = self.token_ids.reshape(-1).tolist()
        if self.target_id == token_id and self.target_position == position and self.rank_of_target is not None:
            assert self.prob_of_target is not None
            return [int(r) for r in self.rank_of_target], [float(p) for p in self.prob_of_target], True
        for rank, prob, at in (
            (self.rank_of_next, self.prob_of_next, position + 1),
            (self.rank_of_input, self.prob_of_input, position),
        ):
            if at < T and ids[at] == token_id:
                return [int(r) for r in rank[:, position]], [float(p) for p in prob[:, position]], True
        if self.k == 0:
            raise InputError(
                f"the rank of token {token_id} at position {position} was not read and the walk kept no top k: "
                f"read it as the target (encoding_walk(trace, target=...))"
            )
        top = self.top_ids[:, position, :].tolist()
        ranks: list[int | None] = [row.index(token_id) if token_id in row else None for row in top]
        return ranks, [float("nan")] * len(top), False

    def _position(self, position: int | None) -> int:
        T = len(self.tokens)
        if position is None:
            position = self.target_position if self.target_position is not None else T - 1
        if not isinstance(position, int) or isinstance(position, bool) or not -T <= position < T:
            raise InputError(f"position must be an integer in [{-T}, {T - 1}], not {position!r}")
        return position % T

    def rank_of(self, token: str | int, position: int | None = None) -> list[int | None]:
        """The rank of ``token`` (its text as decoded, ``" Paris"``, or its id) at ``position`` (default: the
        target's, else the last) at each point of the walk, 0 = top-1: exact when the walk read it (its
        ``target``, or w_t / w_t+1 there); else from the top k, None where it is not among them."""
        return self.first_top(token, position).ranks

    def first_top(self, token: str | int, position: int | None = None) -> TargetAnswer:
        """Where ``token`` first becomes the top-1 token at ``position`` (default: the target's, else the last)
        **and stays** top-1 at every later residual point, with its rank at every point
        (:class:`~walklens.analyses.walks.target.TargetAnswer`)."""
        at = self._position(position)
        labels = dict(self.labels)
        if self.target_id is not None:
            labels.setdefault(self.target_id, str(self.target_id))
        tid = token_id_of(token, labels, "this walk")
        ranks, probs, exact = self._ranks_of(tid, at)
        i = first_top_index(ranks, self.residual)
        point = self.points[i] if i >= 0 else None
        return TargetAnswer(
            token=labels.get(tid, str(tid)),
            token_id=tid,
            position=at,
            reading=self.norm,
            model_name=self.model_name,
            points=list(self.points),
            residual=list(self.residual),
            ranks=ranks,
            probs=probs,
            exact=exact,
            point=point,
            layer=point_layer(point) if point is not None else None,
        )

    def point_index(self, name: str) -> int:
        try:
            return self.points.index(name)
        except ValueError:
            raise InputError(f"no point {name!r} in this walk") from None

    def label_ids(self) -> list[int]:
        """Every token id this walk mentions (inputs and top-k), for decoding labels once."""
        extra = torch.tensor([self.target_id] if self.target_id is not None else [], dtype=torch.long)
        ids = torch.cat([self.token_ids.reshape(-1).long(), self.top_ids.reshape(-1).long(), extra]).unique()
        out = [int(i) for i in ids.tolist() if i >= 0]
        if self.encoder is not None:
            out = sorted(set(out) | set(self.encoder.label_ids()))
        return out

    def _columns(self, table: str = "walk") -> Columns:
        """The plain columns of :meth:`to_pandas` (encoder rows first on an encoder-decoder model)."""

        def walk(w: EncodingWalk) -> Columns:
            ids = [int(i) for i in w.token_ids.reshape(-1).tolist()]
            return long_table(
                [("point", w.points), ("position", range(len(w.tokens)))],
                {name: getattr(w, name) for name in _WALK_CELLS},
                constants={"stack": w.stack},
                by_axis={
                    "point": {
                        "layer": [point_layer(p) for p in w.points],
                        "kind": [point_kind(p) for p in w.points],
                        "residual": w.residual,
                    },
                    "position": {
                        "token": w.tokens,
                        "token_id": ids,
                        "next_token_id": ids[1:] + [None],
                        "next_token": list(w.tokens[1:]) + [None],
                        "escape_point": w.escape_names,
                        "escape_stable": w.escape_stable_names,
                    },
                },
                wide={"top_id": w.top_ids, "top_token": _texts(w.top_ids, w.labels), "top_score": w.top_scores},
            )

        parts = ([self.encoder] if self.encoder is not None else []) + [self]
        return pick(table, {"walk": lambda: concat_columns([walk(w) for w in parts])}, "an EncodingWalk")

    def to_pandas(self, table: str = "walk") -> DataFrame:
        """The walk as a long table (pandas; docs/notebooks.md, "Tables"): one row per (stack, point, position)
        with the fields above under their own names, the escape points by name and the top-k as ``top_id_i``,
        ``top_token_i``, ``top_score_i`` (i = rank, 0 = nearest); ``next_token`` beside ``next_token_id``."""
        return frame(
            self._columns(table),
            {
                "model": self.model_name,
                "metric": self.metric,
                "norm": self.norm,
                "matrix": self.matrix,
                "k": self.k,
                "model_dtype": self.model_dtype,
            },
        )
