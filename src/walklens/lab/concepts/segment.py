"""Encoding schemes (seed 000, A.6 ``encoding_scheme``): how a HellaSwag context is cut into examples and
segments before each segment is encoded on its own.

A context is the few-shot examples (each solved: its query and its gold ending) followed by the query.  The
result is a list of examples, each a list of segments; a segment is a text, or (``token_level`` only) a tuple
of token ids:

* ``sentence_level_segmentation``: every sentence of each example is a segment (the query's sentences, then
  the gold ending's); sentences end at ``.``, ``!`` or ``?`` followed by white space (the seed used nltk's
  punkt, which also knows abbreviations; this splitter does not);
* ``segment_each_example``: an example's two sections are segments: its context passage and its completion
  (the query has only its context passage);
* ``merge_all_segments``: as ``segment_each_example``, all segments put into one single example (so example
  aggregation has nothing to do);
* ``concat_each_example``: each example's text (``query + " " + gold ending``) is one segment;
* ``concat_all_examples``: the whole context string (examples joined by ``"\\n\\n"`` as the harness joins them)
  is one segment of one example;
* ``cross_encoding``: the ordinary run; as one segment, the whole context (Test 1 scores it as the baseline);
* ``token_level`` (for tests): every token of the context as the baseline tokenises it is its own segment.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...analyses.concepts.compose import Segment
from ...base.errors import InputError
from ..hellaswag.data import HellaswagItem, fewshot_context

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

_SENT_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: cut after ``.``, ``!`` or ``?`` followed by white space; empty pieces dropped."""
    return [s for s in (p.strip() for p in _SENT_END.split(text.strip())) if s]


def segment_context(
    item: HellaswagItem, examples: Sequence[HellaswagItem], enc: str, lm: LoadedModel | None = None
) -> list[list[Segment]]:
    """The context of ``item`` (after few-shot ``examples``) as examples of segments under encoding scheme
    ``enc`` (see the module docstring).  ``token_level`` needs ``lm`` (the baseline's tokenisation)."""
    if enc == "sentence_level_segmentation":
        out: list[list[Segment]] = [
            [*split_sentences(ex.ctx), *split_sentences(ex.endings[ex.label])] for ex in examples
        ]
        return out + [[*split_sentences(item.ctx)]]
    if enc == "segment_each_example":
        each: list[list[Segment]] = [[ex.ctx, ex.endings[ex.label]] for ex in examples]
        return each + [[item.ctx]]
    if enc == "merge_all_segments":
        merged: list[Segment] = [s for ex in examples for s in (ex.ctx, ex.endings[ex.label])]
        return [merged + [item.ctx]]
    if enc == "concat_each_example":
        whole: list[list[Segment]] = [[ex.solved()] for ex in examples]
        return whole + [[item.ctx]]
    if enc in ("concat_all_examples", "cross_encoding"):
        return [[fewshot_context(item, examples)]]
    if enc == "token_level":
        if lm is None:
            raise InputError("token_level segmentation needs the model's tokenizer")
        from ..hellaswag.baseline import item_tokens

        ctx_ids, _ = item_tokens(lm, item, examples)
        return [[(int(t),) for t in ctx_ids]]
    raise InputError(f"unknown encoding scheme {enc!r}")
