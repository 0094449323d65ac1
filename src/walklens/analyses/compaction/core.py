"""Compacting a text into concept vectors (seed 000, footnote 11: property 1 "can be applied to 1) compact long
contexts by replacing them with preaggregated concepts").

A text's tokens ``t_0..t_{n-1}`` are split into a compacted part ``[0, n - r)`` and a verbatim tail of the last
``r`` tokens (the **recent window**; r = 0 compacts everything).  The compacted part is cut into segments, each
replaced by one vector:

* ``method=concept``: the segment's text encoded on its own at the scheme's layer, reduced by its word
  aggregation and NORM (A.6; :func:`~walklens.analyses.concepts.vectors.text_vectors`, so vectors come from and go to
  the concept cache);
* ``method=avgpool`` (a baseline): the plain average of the segment's own input embeddings;
* ``method=drop`` (a baseline): no vectors at all for the segments; the compacted part is replaced by its last
  ``k`` tokens, verbatim (the same number of model inputs as ``k`` vectors).

Where the segments end (``bounds``), for a budget of ``k`` vectors (or ``ratio``: ``k = ceil(n_compacted /
ratio)``, ``max``: one vector):

* ``even``: ``k`` runs of (nearly) equal token counts;
* ``sentence``: cut ``j`` lies at the sentence start nearest to ``j·m/k`` when one is within half a segment of
  it, else at the nearest word start, else exactly there (so long texts of short sentences get whole
  sentences, and the budget is always met);
* ``scheme``: the A.6 encoding scheme's own cut, whatever the number of vectors (for a plain text:
  ``sentence_level_segmentation`` = every sentence, ``concat_each_example`` = every paragraph,
  ``concat_all_examples`` = one vector; HellaSwag items also get the examples' structure, :mod:`.hellaswag`).

A segment that would be white space only is merged into its neighbour, so a result holds at most ``k`` vectors;
a compacted part that is white space only (say the ``"\\n\\n"`` before a short text's recent window) has no
concept to stand for, so nothing is compacted and its tokens stay verbatim (:func:`compactable_end`).
Compaction feeds a causal LM's prefix through ``inputs_embeds``; the model input is ``[BOS (Gemma)]``, the
vectors, then the tail's input embeddings (:func:`prefix_embeds`).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, Unpack, cast

import torch

from ...base.display import Shown
from ...base.errors import EmptyTextError, InputError, UnsupportedFamilyError, utf8_text
from ...base.frames import Columns, DataFrame, frame, long_table, pick
from ...core.scoring.encode import input_embeddings, n_prefix_tokens
from ..concepts.schemes import Scheme
from ..concepts.vectors import VectorBank, layer_key, segment_vectors_of, text_vectors
from ..walks import labels_for

if TYPE_CHECKING:
    from ...core.loading import LoadedModel
    from ..concepts.cache import ConceptCache

METHODS: tuple[str, ...] = ("concept", "avgpool", "drop")
BOUNDS: tuple[str, ...] = ("even", "sentence", "scheme")
#: Encoding schemes that cut a plain text (the others need HellaSwag's examples and sections).
TEXT_ENCODINGS: tuple[str, ...] = ("sentence_level_segmentation", "concat_each_example", "concat_all_examples")
_SENT_END = (".", "!", "?", '."', '!"', '?"', ".'", ".)")

Part = torch.Tensor | Sequence[int]


@dataclass
class Cut:
    """The segments of a token sequence ``ids``: token spans ``[a, b)`` and their texts."""

    ids: list[int]
    spans: list[tuple[int, int]]
    texts: list[str]


@dataclass
class Compacted(Shown, view="compacted_text"):
    """A text compacted into concept vectors (module docstring).

    ``vectors`` ``[k, D]`` (float32) stand for ``token_ids[a:b]`` of each span in ``spans`` (``segments``: their
    texts); ``token_ids[keep_from:]`` stay verbatim.  For ``method=drop`` the spans are the single tokens kept
    and ``vectors`` are their input embeddings.  ``ratio`` is compacted tokens per vector."""

    text: str
    token_ids: list[int]
    keep_from: int
    spans: list[tuple[int, int]]
    segments: list[str]
    vectors: torch.Tensor
    method: str
    bounds: str
    scheme: str | None
    model: str = ""

    @property
    def k(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def n_compacted(self) -> int:
        """Tokens replaced: the whole part before the recent window."""
        return self.keep_from

    @property
    def ratio(self) -> float:
        return self.keep_from / self.k if self.k else math.inf

    @property
    def tail_ids(self) -> list[int]:
        return self.token_ids[self.keep_from :]

    def _columns(self, table: str = "segments") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        k = len(self.spans)

        def segments() -> Columns:
            return long_table(
                [("vector", range(k))],
                by_axis={
                    "vector": {
                        "start": [a for a, _ in self.spans],
                        "end": [b for _, b in self.spans],
                        "n_tokens": [b - a for a, b in self.spans],
                        "segment": list(self.segments),
                    }
                },
            )

        def vectors() -> Columns:
            return long_table(
                [("vector", range(self.vectors.shape[0])), ("dim", range(self.vectors.shape[1]))],
                {"value": self.vectors.float()},
            )

        return pick(table, {"segments": segments, "vectors": vectors}, "a Compacted")

    def to_pandas(self, table: str = "segments") -> DataFrame:
        """The compaction as tables (pandas; docs/notebooks.md, "Tables"): ``segments`` one row per concept
        vector with the token span ``[start, end)`` it stands for and its text; ``vectors`` the vectors, one row
        per (vector, dim)."""
        return frame(
            self._columns(table),
            {
                "model": self.model,
                "method": self.method,
                "bounds": self.bounds,
                "scheme": self.scheme,
                "k": self.k,
                "tokens": len(self.token_ids),
                "keep_from": self.keep_from,
                "ratio": self.ratio,
            },
        )


# ---- where segments end ---------------------------------------------------------------------------------------


def token_pieces(lm: LoadedModel, ids: Sequence[int]) -> list[str]:
    """Each token decoded on its own (:func:`walklens.analyses.walks.labels_for`)."""
    labels = labels_for(lm.tokenizer, ids)
    return [labels[int(i)] for i in ids]


def word_starts(pieces: Sequence[str]) -> list[int]:
    """Positions where a word starts: the first token, a token starting with white space, or one after white
    space."""
    return [i for i, p in enumerate(pieces) if i == 0 or p[:1].isspace() or pieces[i - 1][-1:].isspace()]


def sentence_starts(pieces: Sequence[str]) -> list[int]:
    """Positions where a sentence starts: after a token ending a sentence (``.``, ``!``, ``?``, also before a
    closing quote) when white space follows, or after a line break."""
    out = [0] if pieces else []
    for i in range(1, len(pieces)):
        prev, cur = pieces[i - 1], pieces[i]
        if "\n" in prev or (prev.rstrip().endswith(_SENT_END) and (cur[:1].isspace() or prev[-1:].isspace())):
            out.append(i)
    return out


def paragraph_starts(pieces: Sequence[str]) -> list[int]:
    """Positions after a blank line (a token holding ``\\n\\n``, or two line-break tokens in a row)."""
    out = [0] if pieces else []
    for i in range(1, len(pieces)):
        prev = pieces[i - 1]
        if "\n\n" in prev or (prev.endswith("\n") and i > 1 and pieces[i - 2].endswith("\n")):
            out.append(i)
    return out


def _nearest(cands: Sequence[int], t: float, lo: int, hi: int, tol: float) -> int | None:
    """The candidate in ``[lo, hi]`` nearest to ``t`` within ``tol`` (the lower one on a tie), or None."""
    j = bisect_left(cands, lo)
    best = None
    while j < len(cands) and cands[j] <= hi:
        c = cands[j]
        if abs(c - t) <= tol and (best is None or abs(c - t) < abs(best - t)):
            best = c
        if c > t + tol:
            break
        j += 1
    return best


def choose_cuts(n: int, k: int, preferred: Sequence[int] = (), fallback: Sequence[int] = ()) -> list[int]:
    """``k - 1`` increasing cut positions in ``1..n-1`` splitting ``n`` tokens into ``k`` non-empty runs: cut ``j``
    at the ``preferred`` position nearest to ``j·n/k`` within ``n/(2k)``, else the nearest ``fallback`` one,
    else ``round(j·n/k)`` (kept within what leaves every later run a token)."""
    k = max(1, min(k, n))
    pref, fall = sorted(set(preferred)), sorted(set(fallback))
    cuts: list[int] = []
    prev = 0
    tol = n / (2 * k)
    for j in range(1, k):
        t = j * n / k
        lo, hi = prev + 1, n - (k - j)
        c = _nearest(pref, t, lo, hi, tol)
        if c is None:
            c = _nearest(fall, t, lo, hi, tol)
        if c is None:
            c = min(max(int(math.floor(t + 0.5)), lo), hi)
        cuts.append(c)
        prev = c
    return cuts


def cut_region(lm: LoadedModel, ids: Sequence[int], bounds: str, k: int | None, enc: str | None = None) -> Cut:
    """Cut token ids into segments by ``bounds`` (module docstring); ``k`` for ``even``/``sentence``, ``enc`` (an
    encoding of :data:`TEXT_ENCODINGS`) for ``scheme``.  White-space-only segments are merged into a neighbour."""
    ids = [int(i) for i in ids]
    n = len(ids)
    if n == 0:
        return Cut(ids=[], spans=[], texts=[])
    pieces = token_pieces(lm, ids)
    if bounds == "even":
        cuts = choose_cuts(n, k or 1)
    elif bounds == "sentence":
        cuts = choose_cuts(n, k or 1, sentence_starts(pieces), word_starts(pieces))
    elif bounds == "scheme":
        if enc not in TEXT_ENCODINGS:
            raise InputError(
                f"bounds=scheme cuts a plain text with enc={' or '.join(TEXT_ENCODINGS)}, not "
                f"enc={enc} (which needs HellaSwag's examples)"
            )
        starts = {
            "sentence_level_segmentation": sentence_starts,
            "concat_each_example": paragraph_starts,
            "concat_all_examples": lambda p: [0],
        }[enc](pieces)
        cuts = [c for c in starts if c > 0]
    else:
        raise InputError(f"unknown bounds {bounds!r}; use one of {', '.join(BOUNDS)}")
    edges = [0, *cuts, n]
    spans = [(a, b) for a, b in zip(edges, edges[1:]) if b > a]
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        blank = not "".join(pieces[a:b]).strip()
        if merged and (blank or not "".join(pieces[merged[-1][0] : merged[-1][1]]).strip()):
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    if len(merged) > 1 and not "".join(pieces[merged[-1][0] : merged[-1][1]]).strip():
        last = merged.pop()
        merged[-1] = (merged[-1][0], last[1])
    return Cut(ids=ids, spans=merged, texts=[lm.tokenizer.decode(ids[a:b]) for a, b in merged])


def compactable_end(lm: LoadedModel, ids: Sequence[int], a: int, b: int) -> int:
    """``b``, or ``a`` when the part ``ids[a:b]`` to compact decodes to white space only (module docstring):
    then it is kept verbatim, for every method alike."""
    return a if b > a and not lm.tokenizer.decode([int(i) for i in ids[a:b]]).strip() else b


def budget_of(n: int, budget: int | None, ratio: float | None) -> int:
    """Vectors for ``n`` compacted tokens: ``budget``, or ``ceil(n / ratio)`` (``ratio = inf``: 1), at least 1 and
    at most ``n``."""
    if budget is not None:
        k = budget
    elif ratio is not None:
        k = 1 if math.isinf(ratio) else math.ceil(n / ratio - 1e-9)
    else:
        raise InputError("give a budget of vectors or a compression ratio")
    return max(1, min(int(k), n))


# ---- the vectors ------------------------------------------------------------------------------------------------


def check_causal(lm: LoadedModel) -> None:
    if not lm.is_causal:
        raise UnsupportedFamilyError(
            f"{lm.adapter.family}: compaction feeds a causal LM's prefix; this model is "
            f"{'encoder-decoder' if lm.is_encoder_decoder else 'a masked LM'}"
        )


def region_bank(lm: LoadedModel, cuts: Sequence[Cut], scheme: Scheme, cache: ConceptCache | None = None) -> VectorBank:
    """The segment vectors (before NORM) of every segment text of ``cuts``, one :func:`text_vectors` call."""
    texts = [t for c in cuts for t in c.texts]
    return text_vectors(lm, texts, [layer_key(lm, scheme.layer)], [scheme.word], cache=cache)


@torch.inference_mode()
def region_vectors(
    lm: LoadedModel,
    cut: Cut,
    method: str,
    scheme: Scheme | None = None,
    bank: VectorBank | None = None,
    k: int | None = None,
) -> tuple[torch.Tensor, Cut]:
    """The vectors ``[k, D]`` (float32, CPU) standing for ``cut`` and the cut they stand for (for ``drop``: the
    last ``k`` tokens, one span each)."""
    dev = lm.device
    if method == "concept":
        if scheme is None or bank is None:
            raise ValueError("method=concept needs a scheme and a bank")
        v = segment_vectors_of(bank, cut.texts, layer_key(lm, scheme.layer), scheme.word, scheme.norm)
        return v.float().cpu(), cut
    if method == "avgpool":
        rows = [input_embeddings(lm, torch.tensor(cut.ids[a:b], device=dev)).float().mean(0) for a, b in cut.spans]
        return (torch.stack(rows).cpu() if rows else torch.zeros(0, lm.d_model)), cut
    if method == "drop":
        n = len(cut.ids)
        kk = n if k is None else max(0, min(k, n))
        kept = Cut(ids=cut.ids, spans=[(i, i + 1) for i in range(n - kk, n)], texts=lm.token_strings(cut.ids[n - kk :]))
        v = input_embeddings(lm, torch.tensor(cut.ids[n - kk :], device=dev, dtype=torch.long)).float().cpu()
        return v.reshape(kk, -1), kept
    raise InputError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")


def prefix_embeds(lm: LoadedModel, parts: Sequence[Part], bos: bool = True) -> torch.Tensor:
    """The model input ``[m, D]`` in the embedding dtype: Gemma's BOS embedding first when ``bos`` (and the
    harness adds one), then each part in order: a tensor of vectors as it is, token ids as their input
    embeddings (the input-embedding module's output, so feeding ids and feeding these is the same)."""
    dev = lm.device
    dtype = cast(torch.Tensor, lm.hf.get_input_embeddings().weight).dtype
    out = []
    with torch.inference_mode():
        if bos and n_prefix_tokens(lm):
            out.append(input_embeddings(lm, torch.tensor([lm.tokenizer.bos_token_id], device=dev)))
        for p in parts:
            if isinstance(p, torch.Tensor):
                if p.shape[0]:
                    out.append(p.to(device=dev, dtype=dtype))
            elif len(p):
                out.append(input_embeddings(lm, torch.tensor(list(p), device=dev, dtype=torch.long)))
    if not out:
        raise EmptyTextError("nothing is left of the context")
    return torch.cat([o.to(dtype) for o in out], dim=0)


def text_ids(lm: LoadedModel, text: str) -> list[int]:
    """The text's tokens without special tokens (the BOS is added by :func:`prefix_embeds`)."""
    if not isinstance(text, str) or not text.strip():
        raise EmptyTextError("the text to compact is empty")
    return [int(i) for i in lm.tokenizer.encode(utf8_text(text), add_special_tokens=False)]


def resolve_scheme(lm: LoadedModel, scheme: Scheme | str | None) -> Scheme:
    """``None``/``"standard"``: sec. 5.1's standard Test 1 scheme; a string: :meth:`Scheme.parse`; validated for
    Test 1 on this model (compaction scores what follows the vectors, as Test 1 does)."""
    s = scheme if isinstance(scheme, Scheme) else Scheme.from_spec(scheme, 1, "decoder")
    return s.validate(1, "decoder")


def compact_ids(
    lm: LoadedModel,
    ids: Sequence[int],
    *,
    scheme: Scheme | str | None = None,
    budget: int | None = None,
    ratio: float | None = None,
    bounds: str = "sentence",
    method: str = "concept",
    recent: int = 0,
    cache: ConceptCache | None = None,
    text: str | None = None,
) -> Compacted:
    """:func:`compact` of token ids (no special tokens)."""
    check_causal(lm)
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
    if recent < 0:
        raise InputError(f"recent must be >= 0 tokens, got {recent}")
    s = resolve_scheme(lm, scheme)
    ids = [int(i) for i in ids]
    keep = compactable_end(lm, ids, 0, max(0, len(ids) - int(recent)))
    if bounds == "scheme":
        if method != "concept" or budget is not None or ratio is not None:
            raise InputError("bounds=scheme cuts where the A.6 encoding does (method=concept, no budget or ratio)")
        k = None
    else:
        k = budget_of(keep, budget, ratio) if keep else 0
    cut = cut_region(lm, ids[:keep], "even" if method == "drop" else bounds, k, s.enc)
    bank = region_bank(lm, [cut], s, cache) if method == "concept" else None
    vectors, shown = region_vectors(lm, cut, method, s, bank, k)
    return Compacted(
        text=text if text is not None else lm.tokenizer.decode(ids),
        token_ids=ids,
        keep_from=keep,
        spans=shown.spans,
        segments=shown.texts,
        vectors=vectors,
        method=method,
        bounds=bounds,
        scheme=_scheme_label(s, bounds) if method == "concept" else None,
        model=lm.name,
    )


def _scheme_label(s: Scheme, bounds: str) -> str:
    """The scheme's values that made the vectors: layer, word and NORM (and the encoding with its
    aggregations when it also cut the segments)."""
    return str(s) if bounds == "scheme" else f"layer={s.layer},word={s.word},norm={s.norm}"


class CompactOptions(TypedDict, total=False):
    """The keyword options of :func:`compact_ids` that :func:`compact` passes on (both documented there)."""

    ratio: float | None
    bounds: str
    method: str
    recent: int
    cache: ConceptCache | None


def compact(
    lm: LoadedModel,
    text: str,
    scheme: Scheme | str | None = None,
    budget: int | None = None,
    **options: Unpack[CompactOptions],
) -> Compacted:
    """Compact ``text`` into at most ``budget`` concept vectors (module docstring).

    ``scheme``: the A.6 scheme whose layer, word aggregation and NORM make each vector (a :class:`Scheme`, its
    string form or ``"standard"``/None; its ``enc`` matters only for ``bounds="scheme"``).  ``budget`` or
    ``ratio`` (compacted tokens per vector; ``math.inf``: one vector) sets ``k``; ``bounds``: where the text
    is cut (:data:`BOUNDS`, default ``"sentence"``); ``method``: how a region becomes a vector (:data:`METHODS`,
    default ``"concept"``); ``recent`` (default 0): tokens kept verbatim at the end; ``cache``: the concept
    cache the segment vectors are read from and stored in."""
    return compact_ids(lm, text_ids(lm, text), scheme=scheme, budget=budget, text=text, **options)


def compacted_embeds(lm: LoadedModel, c: Compacted) -> torch.Tensor:
    """The model input standing for the whole text: ``[BOS] vectors tail`` (:func:`prefix_embeds`)."""
    return prefix_embeds(lm, [c.vectors, c.tail_ids])


__all__ = [
    "BOUNDS",
    "METHODS",
    "CompactOptions",
    "Compacted",
    "Cut",
    "budget_of",
    "choose_cuts",
    "compact",
    "compact_ids",
    "compactable_end",
    "compacted_embeds",
    "cut_region",
    "prefix_embeds",
    "region_bank",
    "region_vectors",
]
