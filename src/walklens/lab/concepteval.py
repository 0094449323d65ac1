"""A concept-level reading of a model's output (seed 000, sec. 5, Property 2 and its footnote 12: "property 2 can
be used to semantically evaluate the output of an LLM").

Property 2 says concepts organise associatively like tokens, so a continuation that follows from a context
should have a concept vector near the context's.  The score of a continuation is the cosine between the two
concept vectors, each the standard decoder-only composition of sec. 5.1 (one segment: hidden states of the
last layer, ``w1mean`` over its tokens; :func:`walklens.analyses.concepts.vectors.text_vectors`).

Whether the score evaluates anything is checked on HellaSwag items, against things known independently of it:

- ``own_vs_offtopic``: the model's own greedy continuation of the context against the greedy continuation
  of another item's context (a seeded derangement): a score that reads meaning ranks its own first;
- ``own_vs_shuffled``: the own continuation against the same words in a seeded random order (what a
  bag-of-words score cannot tell apart);
- ``gold_vs_distractors``: the human-written true ending against the three distractors, as pairs;
- ``chance_control``: two off-topic continuations against each other (two further derangements): no answer
  is right, so the share must be 1/2 up to noise.

Each comparison is a share of pairs the first member wins (ties dropped) with a Wilson 95% interval and an
exact two-sided binomial test against 1/2.  The pairs of ``gold_vs_distractors`` share their item (three per
item), so its interval is narrower than the items warrant; ``gold_top1`` (the true ending scored first of
four, chance 1/4) is one trial per item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..analyses.concepts.vectors import layer_key, text_vectors
from ..analyses.encoderself import derangement
from ..base.display import Shown
from ..base.errors import InputError
from ..base.frames import DataFrame, frame, pick, record_table
from .hellaswag.data import HellaswagItem

if TYPE_CHECKING:
    from ..core.loading import LoadedModel

LAYER, WORD = "-1", "w1mean"  # the standard decoder-only composition of sec. 5.1


@dataclass(frozen=True)
class Comparison:
    """A share of pairs won by the first member (ties dropped), its Wilson 95% interval and the exact two-sided
    binomial p against ``chance``."""

    wins: int
    n: int
    share: float
    lo: float
    hi: float
    p: float
    chance: float = 0.5


def compare(first: torch.Tensor, second: torch.Tensor, chance: float = 0.5) -> Comparison:
    """How often ``first`` scores above ``second`` (same shapes, paired), ties dropped."""
    from scipy.stats import binomtest

    if first.shape != second.shape:
        raise InputError(f"paired scores of shapes {tuple(first.shape)} and {tuple(second.shape)}")
    wins, losses = int((first > second).sum()), int((first < second).sum())
    n = wins + losses
    if n == 0:
        return Comparison(0, 0, float("nan"), 0.0, 1.0, 1.0, chance)
    t = binomtest(wins, n, chance)
    ci = t.proportion_ci(method="wilson")
    return Comparison(wins, n, wins / n, float(ci.low), float(ci.high), float(t.pvalue), chance)


@dataclass(frozen=True)
class ConceptEval(Shown):
    """Scores of footnote 12's reading on ``n_items`` HellaSwag items (module docstring): per item the cosine of
    the context's concept with its own greedy continuation (``own``), an off-topic one (``offtopic``, and
    ``offtopic2`` for the chance control), the shuffled own one (``shuffled``), the true ending (``gold``) and
    the distractors (``distractors`` [N, 3]); ``comparisons`` by name; ``continuations`` the greedy texts."""

    model_name: str
    n_items: int
    max_new_tokens: int
    seed: int
    layer: str
    word: str
    continuations: list[str]
    own: torch.Tensor
    offtopic: torch.Tensor
    offtopic2: torch.Tensor
    shuffled: torch.Tensor
    gold: torch.Tensor
    distractors: torch.Tensor
    comparisons: dict[str, Comparison]

    def _headline(self) -> str:
        c = self.comparisons["own_vs_offtopic"]
        return f"{self.model_name}, {self.n_items} items: own continuation ahead of off-topic in {c.share:.0%}"

    def to_pandas(self, table: str = "items") -> DataFrame:
        """The scores as tables (pandas; docs/notebooks.md, "Tables"): ``items`` one row per item (its greedy
        continuation and every cosine, the distractors as ``distractor_0..2``), ``comparisons`` one row per
        comparison with its share, interval and p."""
        d = self.distractors.tolist()

        def items() -> dict[str, Any]:
            scores = ("own", "offtopic", "offtopic2", "shuffled", "gold")
            rows = [
                {"item": i, "continuation": self.continuations[i], **{k: float(getattr(self, k)[i]) for k in scores},
                 **{f"distractor_{j}": float(v) for j, v in enumerate(d[i])}}
                for i in range(self.n_items)
            ]  # fmt: skip
            return record_table(rows)

        def comparisons() -> dict[str, Any]:
            return record_table([{"comparison": k, **vars(c)} for k, c in self.comparisons.items()])

        cols = pick(table, {"items": items, "comparisons": comparisons}, "a ConceptEval")
        return frame(cols, {"model": self.model_name, "layer": self.layer, "word": self.word, "seed": self.seed})


def shuffle_words(text: str, g: torch.Generator) -> str:
    """The words of ``text`` in a seeded random order, another order than the given one where one exists."""
    words = text.split()
    if len(set(words)) < 2:
        return text
    while True:
        out = [words[i] for i in torch.randperm(len(words), generator=g).tolist()]
        if out != words:
            return " ".join(out)


@torch.no_grad()
def greedy_continuations(
    lm: LoadedModel, contexts: Sequence[str], max_new_tokens: int = 16, batch: int = 16
) -> list[str]:
    """The model's greedy continuation of each context (decoded text, stripped), ``batch`` contexts at a time,
    padded on the left so every row's last token is its own."""
    if not lm.is_causal:
        raise InputError(f"{lm.name}: the concept-level evaluation generates with a decoder-only model")
    tok = lm.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out: list[str] = []
    for start in range(0, len(contexts), batch):
        rows = [tok(c)["input_ids"] for c in contexts[start : start + batch]]
        T = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (T - len(r)) + list(r) for r in rows], device=lm.device)
        mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows], device=lm.device)
        gen = lm.hf.generate(  # type: ignore[operator]  # GenerationMixin, not in PreTrainedModel's type
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad
        )
        out += [tok.decode(g[T:], skip_special_tokens=True).strip() for g in gen]
    return out


def concept_scores(lm: LoadedModel, contexts: Sequence[str], texts: Sequence[Sequence[str]]) -> list[torch.Tensor]:
    """For each list of ``texts``: the cosine of the concept vector of ``contexts[i]`` with that of
    ``texts[k][i]`` (module docstring); every distinct text runs through the model once."""
    bank = text_vectors(lm, [*contexts, *(t for ts in texts for t in ts)], [layer_key(lm, LAYER)], [WORD])
    a = bank.vectors[bank.rows(contexts), 0, 0].double()
    return [
        torch.nn.functional.cosine_similarity(a, bank.vectors[bank.rows(ts), 0, 0].double(), dim=-1) for ts in texts
    ]


def concept_eval(
    lm: LoadedModel, items: Sequence[HellaswagItem], *, max_new_tokens: int = 16, seed: int = 0
) -> ConceptEval:
    """Footnote 12's reading on ``items`` with its three checks and the chance control (module docstring)."""
    if len(items) < 3:
        raise InputError("the concept-level evaluation needs at least 3 items (its controls pair them)")
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
    ctx = [it.ctx for it in items]
    cont = greedy_continuations(lm, ctx, max_new_tokens)
    keep = [i for i, c in enumerate(cont) if c.strip()]
    if len(keep) < 3:
        raise InputError("fewer than 3 items have a non-empty greedy continuation")
    ctx, cont = [ctx[i] for i in keep], [cont[i] for i in keep]
    items = [items[i] for i in keep]
    n = len(items)
    g = torch.Generator().manual_seed(seed)
    p1, p2 = derangement(n, seed), derangement(n, seed + 1)
    while any(a == b for a, b in zip(p1, p2)):  # the two off-topic continuations of an item differ
        p2 = derangement(n, int(torch.randint(0, 2**31, (1,), generator=g)))
    shuf = [shuffle_words(c, g) for c in cont]
    endings = [[it.endings[k] for it in items] for k in range(4)]
    own, off, off2, sh, *per_end = concept_scores(
        lm, ctx, [cont, [cont[j] for j in p1], [cont[j] for j in p2], shuf, *endings]
    )
    ends = torch.stack(per_end, 1)
    gold_ix = torch.tensor([it.label for it in items])
    gold = ends.gather(1, gold_ix[:, None])[:, 0]
    dis = torch.stack([ends[i][[k for k in range(4) if k != it.label]] for i, it in enumerate(items)])
    top1 = ends.argmax(1) == gold_ix
    return ConceptEval(
        model_name=lm.name,
        n_items=n,
        max_new_tokens=max_new_tokens,
        seed=seed,
        layer=LAYER,
        word=WORD,
        continuations=cont,
        own=own,
        offtopic=off,
        offtopic2=off2,
        shuffled=sh,
        gold=gold,
        distractors=dis,
        comparisons={
            "own_vs_offtopic": compare(own, off),
            "own_vs_shuffled": compare(own, sh),
            "gold_vs_distractors": compare(gold[:, None].expand_as(dis), dis),
            "gold_top1": compare(top1.double(), torch.full((n,), 0.5, dtype=torch.double), 0.25),
            "chance_control": compare(off, off2),
        },
    )


__all__ = ["Comparison", "ConceptEval", "compare", "concept_eval", "concept_scores", "greedy_continuations"]
