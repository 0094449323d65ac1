"""The ordinary HellaSwag score, exactly as lm-evaluation-harness computes it (seed 000, sec. 5.1.1: "the
standard procedure used to evaluate language models against Hellaswag"), with the context computed once.

Per item: context = few-shot examples (each ``query + " " + gold ending``, joined by ``"\\n\\n"``) + the query;
each ending i is scored by the summed log-probability of the tokens of ``" " + ending_i`` after the context,
tokenised by :func:`~.encode.encode_pair`.  ``acc`` picks the ending with the largest log-likelihood;
``acc_norm`` the largest log-likelihood divided by the ending's length in characters (the harness divides by
``len(choice)``, the ending without the delimiter space).  Ties go to the first ending (``numpy.argmax``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...base.errors import ContextTooLongError
from ...core.scoring.encode import continuation_logliks, encode_pair
from ...core.scoring.packing import packed_logliks
from ...core.scoring.request import ScoreRequest, check_request
from .data import HellaswagItem, fewshot_context
from .store import ItemResult

if TYPE_CHECKING:
    from ...core.loading import LoadedModel


def argmax_first(values: Sequence[float]) -> int:
    """Index of the largest value, the first one on ties (as ``numpy.argmax``)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def picks(scores: Sequence[float], endings: Sequence[str], per_char: bool = True) -> tuple[int, int]:
    """(``acc`` pick, ``acc_norm`` pick) from the four scores: argmax of the score, and of the score divided
    by ``len(ending)`` (characters) when ``per_char``, else the same as ``acc``."""
    pred = argmax_first(scores)
    if not per_char:
        return pred, pred
    return pred, argmax_first([s / len(e) for s, e in zip(scores, endings)])


def item_result(item: HellaswagItem, scores: Sequence[float], per_char: bool = True) -> ItemResult:
    pred, pred_norm = picks(scores, item.endings, per_char)
    return ItemResult(
        item=item.index, gold=item.label, pred=pred, pred_norm=pred_norm, scores=tuple(float(s) for s in scores)
    )


def accuracy(results: Sequence[ItemResult]) -> tuple[float | None, float | None]:
    """(acc, acc_norm): the fractions of items whose pick is the gold ending; None for no items."""
    if not results:
        return None, None
    n = len(results)
    return (sum(r.pred == r.gold for r in results) / n, sum(r.pred_norm == r.gold for r in results) / n)


def item_tokens(
    lm: LoadedModel, item: HellaswagItem, examples: Sequence[HellaswagItem]
) -> tuple[list[int], list[list[int]]]:
    """The context's token ids and each ending's continuation ids, as the harness splits them.  For causal
    models every ending shares the context's ids (the split is at the context's own token length)."""
    context = fewshot_context(item, examples)
    pairs = [encode_pair(lm, context, item.continuation(i)) for i in range(len(item.endings))]
    ctx = pairs[0][0]
    return ctx, [p[1] for p in pairs]


def baseline_request(lm: LoadedModel, item: HellaswagItem, examples: Sequence[HellaswagItem] = ()) -> ScoreRequest:
    """The item's context ids and its four continuations, checked against the model's context length."""
    ctx, conts = item_tokens(lm, item, examples)
    r = ScoreRequest(conts, context_ids=ctx)
    try:
        check_request(lm, r)
    except ContextTooLongError as e:
        raise ContextTooLongError(f"item {item.index}: {e} (use fewer shots)") from None
    return r


def baseline_scores(lm: LoadedModel, item: HellaswagItem, examples: Sequence[HellaswagItem] = ()) -> list[float]:
    """The four endings' log-likelihoods after the item's context (one context pass, see
    :func:`~.encode.continuation_logliks`)."""
    r = baseline_request(lm, item, examples)
    return continuation_logliks(lm, r.continuations, context_ids=r.context_ids)


def baseline_item(lm: LoadedModel, item: HellaswagItem, examples: Sequence[HellaswagItem] = ()) -> ItemResult:
    return item_result(item, baseline_scores(lm, item, examples))


def baseline_items(
    lm: LoadedModel, items: Sequence[HellaswagItem], examples: Sequence[Sequence[HellaswagItem]] | None = None
) -> list[ItemResult]:
    """:func:`baseline_item` for many items at once: their requests packed into shared forward passes
    (:func:`~.packing.packed_logliks`; same log-likelihoods to float rounding)."""
    examples = examples if examples is not None else [()] * len(items)
    return packed_results(lm, items, [baseline_request(lm, it, ex) for it, ex in zip(items, examples)])


def packed_results(lm: LoadedModel, items: Sequence[HellaswagItem], reqs: Sequence[ScoreRequest]) -> list[ItemResult]:
    """The items' results from their score requests (one each), packed into shared forward passes
    (:func:`~walklens.core.scoring.packing.packed_logliks`): the baseline's, Test 1's and compaction's scorer."""
    return [item_result(it, s) for it, s in zip(items, packed_logliks(lm, reqs), strict=True)]
