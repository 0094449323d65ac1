"""Item planning for the sweep (seed 000, A.6): each item cut by every encoding scheme of the grid, once."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ....base.errors import InputError
from ...concepts.segment import segment_context
from ...hellaswag.data import HellaswagItem

if TYPE_CHECKING:
    from ....core.loading import LoadedModel


@dataclass(frozen=True)
class ItemPlan:
    """One HellaSwag item, cut by every encoding scheme that the grid uses.

    ``contexts[enc]`` is the context as a list of examples, each a list of segment texts (A.6: examples are
    the few-shot examples followed by the query); ``endings`` are the four choice texts as fed to the model;
    ``label`` the gold ending; ``ending_chars`` the character counts used by acc_norm (Test 1).
    """

    index: int
    label: int
    contexts: dict[str, tuple[tuple[str, ...], ...]]
    endings: tuple[str, ...]
    ending_chars: tuple[int, ...]

    def texts(self) -> Iterator[str]:
        """Every segment text and ending of the item (with repeats)."""
        for ex in self.contexts.values():
            for seg in ex:
                yield from seg
        yield from self.endings


def plan_item(lm: LoadedModel, item: HellaswagItem, examples: Sequence[HellaswagItem], encs: Iterable[str]) -> ItemPlan:
    """The :class:`ItemPlan` of ``item`` after its few-shot ``examples`` under the encoding schemes ``encs``
    (:func:`~..segment.segment_context`; the sweep runs text segments only, so ``token_level`` is refused)."""
    contexts = {}
    for enc in encs:
        segs = segment_context(item, examples, enc, lm)
        if any(not isinstance(x, str) for e in segs for x in e):
            raise InputError(
                f"the sweep runs text segments; enc={enc} cuts the context into token ids "
                f"(use walklens hellaswag test1/test2 for it)"
            )
        contexts[enc] = tuple(tuple(x for x in e if isinstance(x, str)) for e in segs)  # all text (checked above)
    return ItemPlan(
        index=item.index,
        label=item.label,
        contexts=contexts,
        endings=tuple(item.endings),
        ending_chars=tuple(len(e) for e in item.endings),
    )
