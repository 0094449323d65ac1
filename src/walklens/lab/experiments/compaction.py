"""HellaSwag with a compacted context (seed 000, sec. 5.1.1 and footnote 11): the endings are scored exactly as
lm-evaluation-harness scores them (:mod:`walklens.lab.hellaswag.baseline`: the same continuation tokens, summed
log-probabilities, ``acc`` and ``acc_norm``); only the context changes, from token ids to ``inputs_embeds``.

The baseline's context tokens ``c_0..c_{C-1}`` (Gemma: ``c_0`` = BOS) are cut into

* the few-shot examples ``[pre, p)``: every example with its gold ending and the ``"\\n\\n"`` after it
  (``p`` is where the query's own tokens start: the longest common prefix of the context's tokens and the
  examples' own tokenisation, so a separator that BPE merges with the query's first token stays with the
  query);
* the item's context ``[p, C)``;

and ``what`` (:class:`~.spec.CompactSpec`) picks the part compacted: ``examples`` ``[pre, p)``, ``context``
``[p, C)``, ``both`` ``[pre, C)``, minus the ``recent`` tokens at its end.  The model input is the tokens
before the part (their input embeddings), its vectors (:mod:`.core`), the tokens after it, then the endings.
With ``bounds=scheme`` the part's vectors are the A.6 encoding's own (:func:`~walklens.lab.concepts.segment.
segment_context`, :func:`~walklens.lab.concepts.generation.compose_segments`): ``what=both`` is Test 1 itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...analyses.compaction.core import (
    Cut,
    budget_of,
    check_causal,
    compactable_end,
    cut_region,
    prefix_embeds,
    region_bank,
    region_vectors,
)
from ...analyses.compaction.spec import CompactSpec
from ...analyses.concepts.vectors import VectorBank
from ...base.errors import InputError
from ...core.scoring.encode import n_prefix_tokens, tok_encode
from ...core.scoring.request import ScoreRequest
from ..concepts.generation import compose_segments, scheme_bank
from ..concepts.segment import segment_context
from ..hellaswag.baseline import item_tokens, packed_results
from ..hellaswag.data import HellaswagItem, fewshot_context
from ..hellaswag.store import ItemResult
from .runner import RunSummary, Scorer, run_test
from .runsetup import RunSetup

if TYPE_CHECKING:
    from ...analyses.concepts.cache import ConceptCache
    from ...core.loading import LoadedModel

#: Encodings whose segment_context keeps the query apart from the examples (the last "example").
_SEPARATE = ("sentence_level_segmentation", "segment_each_example", "concat_each_example")


@dataclass
class Plan:
    """One item's compaction: the context ids, the continuations, the part ``[a, b)`` replaced, and its cut
    (budget bounds) or its A.6 segments (``bounds=scheme``)."""

    ctx: list[int]
    conts: list[list[int]]
    a: int
    b: int
    k: int
    cut: Cut | None = None
    segs: list[list[str]] | None = None


def query_start(lm: LoadedModel, item: HellaswagItem, examples: Sequence[HellaswagItem], ctx: Sequence[int]) -> int:
    """Where the query's tokens start in the context ids: the common prefix of ``ctx`` and the tokens of the
    examples' text (the BOS only, with no examples)."""
    if not examples:
        return n_prefix_tokens(lm)
    context = fewshot_context(item, examples)
    head = tok_encode(lm, context[: len(context) - len(item.ctx)])
    p = 0
    while p < min(len(head), len(ctx)) and head[p] == ctx[p]:
        p += 1
    return p


def plan_item(lm: LoadedModel, item: HellaswagItem, examples: Sequence[HellaswagItem], spec: CompactSpec) -> Plan:
    """The :class:`Plan` of one item (module docstring)."""
    ctx, conts = item_tokens(lm, item, examples)
    pre = n_prefix_tokens(lm)
    p = query_start(lm, item, examples, ctx)
    a = p if spec.what == "context" else pre
    end = p if spec.what == "examples" else len(ctx)
    b = compactable_end(lm, ctx, a, max(a, end - spec.recent))
    if spec.bounds == "scheme":
        enc = spec.enc
        segs = segment_context(item, examples, enc, lm)
        if spec.what != "both" and enc not in _SEPARATE:
            raise InputError(
                f"enc={enc} does not keep the examples apart from the item's context; with "
                f"bounds=scheme use what=both or enc={' / '.join(_SEPARATE)}"
            )
        part = segs if spec.what == "both" else (segs[:-1] if spec.what == "examples" else segs[-1:])
        return Plan(ctx=ctx, conts=conts, a=a, b=b, k=0, segs=[list(map(str, e)) for e in part])
    k = budget_of(b - a, spec.budget, spec.ratio) if b > a else 0
    cut = cut_region(lm, ctx[a:b], "even" if spec.method == "drop" else spec.bounds, k) if b > a else None
    return Plan(ctx=ctx, conts=conts, a=a, b=b, k=k, cut=cut)


def plan_bank(
    lm: LoadedModel, plans: Sequence[Plan], spec: CompactSpec, cache: ConceptCache | None = None
) -> VectorBank | None:
    """The segment vectors every plan needs, computed (or read from the concept cache) in one call."""
    if spec.method != "concept":
        return None
    if spec.bounds == "scheme":
        return scheme_bank(lm, [p.segs for p in plans if p.segs], spec.scheme(), cache)
    return region_bank(lm, [p.cut for p in plans if p.cut is not None], spec.scheme(), cache)


def plan_request(lm: LoadedModel, plan: Plan, spec: CompactSpec, bank: VectorBank | None) -> ScoreRequest:
    """The compacted context (``inputs_embeds``) and the baseline's continuations after it."""
    if spec.bounds == "scheme":
        vectors = compose_segments(lm, plan.segs, spec.scheme(), bank) if plan.segs else torch.zeros(0, lm.d_model)
    elif plan.cut is not None:
        vectors, _ = region_vectors(lm, plan.cut, spec.method, spec.scheme(), bank, plan.k)
    else:
        vectors = torch.zeros(0, lm.d_model)
    embeds = prefix_embeds(lm, [plan.ctx[: plan.a], vectors, plan.ctx[plan.b :]], bos=False)
    return ScoreRequest(plan.conts, context_embeds=embeds)


def compact_requests(
    lm: LoadedModel,
    items: Sequence[HellaswagItem],
    examples: Sequence[Sequence[HellaswagItem]],
    spec: CompactSpec,
    cache: ConceptCache | None = None,
    stats: dict[str, Any] | None = None,
) -> list[ScoreRequest]:
    """The compacted requests of many items, their segment vectors from one :func:`text_vectors` call;
    ``stats`` (when given) accumulates ``tokens_replaced``, ``vectors``, ``inputs`` and ``inputs_full``."""
    check_causal(lm)
    spec.scheme().validate(1, "decoder")
    plans = [plan_item(lm, it, ex, spec) for it, ex in zip(items, examples)]
    bank = plan_bank(lm, plans, spec, cache)
    reqs = [plan_request(lm, p, spec, bank) for p in plans]
    if stats is not None:
        for p, r in zip(plans, reqs):
            stats["tokens_replaced"] = stats.get("tokens_replaced", 0) + p.b - p.a
            stats["vectors"] = stats.get("vectors", 0) + r.context_len - (len(p.ctx) - (p.b - p.a))
            stats["inputs"] = stats.get("inputs", 0) + r.context_len
            stats["inputs_full"] = stats.get("inputs_full", 0) + len(p.ctx)
    return reqs


def compact_scorer(spec: CompactSpec, stats: dict[str, Any] | None = None) -> Scorer:
    """The compacted items' results as the runner's scorer (:func:`compact_requests` scored by the packed scorer,
    ``acc`` and ``acc_norm`` as the baseline's): stored under test ``compact`` and scheme ``str(spec)``;
    ``stats`` (when given) accumulates what :func:`compact_requests` counts."""

    def batch(lm: LoadedModel, items: Sequence[HellaswagItem], examples: Any, cache: Any) -> list[ItemResult]:
        return packed_results(lm, items, compact_requests(lm, items, examples, spec, cache, stats))

    return Scorer(test="compact", scheme=str(spec), batch=batch)


def compact_run(
    lm: LoadedModel,
    items: Sequence[HellaswagItem],
    spec: CompactSpec,
    setup: RunSetup = RunSetup(),
    *,
    stats: dict[str, Any] | None = None,
) -> RunSummary:
    """:func:`compact_scorer` over ``items`` through the runner (few-shot examples, chunks, resume from the
    results store under test ``compact`` and scheme ``str(spec)``; the concept cache ``setup.cache``)."""
    check_causal(lm)
    if spec.what == "examples" and not setup.shots:
        raise InputError("what=examples compacts the few-shot examples: give --shots > 0")
    return run_test(lm, items, compact_scorer(spec, stats), setup, desc=f"{lm.name} compact")


__all__ = ["Plan", "compact_requests", "compact_run", "compact_scorer", "plan_item", "query_start"]
