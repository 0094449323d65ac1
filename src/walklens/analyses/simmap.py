"""The similarity map as a result (seed 000, Figs. 3, 11, 12): a [tokens, tokens] tensor that knows its tokens
and how it was read, so that it shows itself (:class:`walklens.base.display.Shown`).

:class:`SimilarityMap` is a ``torch.Tensor``: everything that takes the plain tensor
:func:`walklens.similarity_map` returned before takes it unchanged.  Arithmetic on it gives plain tensors (its
``__torch_function__`` is torch's disabled one), so a product or a slice never carries labels that no longer fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..base.display import WIDTH, Shown, displayable_copy, headline, summary
from ..base.errors import InputError
from ..base.frames import concat_columns, frame, similarity_columns, with_constants

if TYPE_CHECKING:
    from pandas import DataFrame


class SimilarityMap(Shown, torch.Tensor, view="similarity"):
    """The similarity of every pair of positions at one point: ``tokens``, ``point`` (a captured point or ``"V"``),
    ``metric`` (``"dot"`` or ``"cosine"``), ``normed`` (final norm applied first), ``model_name``."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # torch's own opt-out
    tokens: list[str]
    point: str
    metric: str
    normed: bool
    model_name: str

    @staticmethod
    def of(
        values: torch.Tensor, tokens: list[str], point: str, metric: str, normed: bool, model_name: str = ""
    ) -> SimilarityMap:
        """``values`` [T, T] as a :class:`SimilarityMap` (no copy)."""
        out = values.as_subclass(SimilarityMap)
        out.tokens, out.point, out.metric, out.normed, out.model_name = list(tokens), point, metric, normed, model_name
        return out

    def plain(self) -> torch.Tensor:
        """The values as a plain tensor (no copy)."""
        return self.as_subclass(torch.Tensor)

    def _displayable_copy(self) -> SimilarityMap:
        """The same map, its tokens and model name as a view shows them
        (:func:`walklens.base.display.displayable_copy`)."""
        shown = displayable_copy([self.tokens, self.model_name])
        return SimilarityMap.of(self.plain(), shown[0], self.point, self.metric, self.normed, shown[1])

    def __deepcopy__(self, memo: dict[int, Any]) -> SimilarityMap:
        return SimilarityMap.of(
            self.plain().clone(), self.tokens, self.point, self.metric, self.normed, self.model_name
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (
            SimilarityMap.of,
            (self.plain().clone(), self.tokens, self.point, self.metric, self.normed, self.model_name),
        )

    def to_pandas(self) -> DataFrame:
        """The map as a long table: one row per pair of positions (``i``, ``j``) with ``token_i``, ``token_j`` and
        ``similarity`` (:func:`similarity_frame`); point, metric, normed and model as ``attrs``."""
        return frame(
            similarity_columns(self.plain(), self.tokens),
            {"point": self.point, "metric": self.metric, "normed": self.normed, "model": self.model_name},
        )

    def _headline(self) -> str:
        norm = "+norm" if self.normed else ""
        return f"{self.model_name + ' · ' if self.model_name else ''}{self.point}{norm}/{self.metric}"

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]  # torch stub: odd name
        T = len(self.tokens)
        lines = [
            headline(self),
            f"  values      {summary(self.plain())}",
            f"  tokens      {summary(self.tokens)}",
        ]
        if T:
            v = self.plain().float()
            off = v[~torch.eye(T, dtype=torch.bool)] if T > 1 else v.reshape(-1)
            lines.append(
                f"  range       {float(v.min()):.4g} .. {float(v.max()):.4g}; "
                f"off the diagonal mean {float(off.mean()):.4g}"
            )
        return "\n".join(line if len(line) <= WIDTH else line[: WIDTH - 1] + "…" for line in lines)


@dataclass
class SimilarityPair(Shown, view="similarity_pair"):
    """Two texts' similarity maps read alike (same point, metric and norm), for a side-by-side view on one colour
    scale (:func:`compare_maps`): ``a`` and ``b``, ``names`` (how each text is called, default ``"A"``, ``"B"``)."""

    a: SimilarityMap
    b: SimilarityMap
    names: tuple[str, str] = ("A", "B")

    def __post_init__(self) -> None:
        got = [(m.point, m.metric, m.normed) for m in (self.a, self.b)]
        if got[0] != got[1]:
            raise InputError(f"the two maps are read differently: {got[0]} and {got[1]}; compare maps read alike")

    def _headline(self) -> str:
        (na, nb), ta, tb = self.names, len(self.a.tokens), len(self.b.tokens)
        return f"{headline(self.a)} · {na} ({ta} tokens) vs {nb} ({tb} tokens)"

    def to_pandas(self) -> DataFrame:
        """Both maps as one long table: a first column ``text`` (its name), then :meth:`SimilarityMap.to_pandas`'s."""
        parts = [
            with_constants({"text": name}, similarity_columns(m.plain(), m.tokens))
            for name, m in zip(self.names, (self.a, self.b))
        ]
        return frame(concat_columns(parts), {"point": self.a.point, "metric": self.a.metric, "normed": self.a.normed})


def compare_maps(a: SimilarityMap, b: SimilarityMap, names: tuple[str, str] = ("A", "B")) -> SimilarityPair:
    """Two similarity maps (:func:`walklens.similarity_map` of two texts, read alike) as one result whose view draws
    them side by side on one colour scale (``walklens simmap TEXT_A TEXT_B``)."""
    return SimilarityPair(a, b, names)


def similarity_frame(maps: Any, tokens: Sequence[str] | None = None) -> DataFrame:
    """A similarity map (:func:`walklens.similarity_map`, seed 000, Figs. 3, 11, 12) as a long table: one row
    per pair of positions (``i``, ``j``) with ``token_i``, ``token_j`` and ``similarity``; given a mapping of
    maps (``{"L5.resid_post/cosine": m}``, the ``--json`` document's ``maps``) a first column ``map`` names
    each."""
    return frame(similarity_columns(maps, tokens))


__all__ = ["SimilarityMap", "SimilarityPair", "compare_maps", "similarity_frame"]
