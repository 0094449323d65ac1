"""Concept composition schemes (seed 000, A.6): one small frozen dataclass per scheme.

A scheme names, for each A.6 parameter, the value used to turn a HellaSwag context (and, in Test 2, each
ending) into concept vectors:

==================  =============  ============================================================================
A.6 parameter       field          values
==================  =============  ============================================================================
encoding_scheme     ``enc``        :data:`ENCODING_SCHEMES` (+ ``token_level``: one token per segment, for tests)
ENCODING_LAYER      ``layer``      ``E`` (input embeddings), ``0``..``N`` (input of layer l; N = top, after the
                                   final norm), ``-l`` (from the top, ``-1`` = N), ``middle`` (``(N+1)//2``)
WORD_AGG_SCHEME     ``word``       :data:`WORD_AGG_SCHEMES`
NORM                ``norm``       :data:`NORMS`
SEGMENT_AGG_SCHEME  ``seg``        :data:`SEGMENT_AGG_SCHEMES`
EXAMPLE_AGG_SCHEME  ``ex``         :data:`EXAMPLE_AGG_SCHEMES`
SIMILARITY_FUNC     ``sim``        :data:`SIMILARITY_FUNCS` (Test 2 only)
OUT_ENCODING_LAYER  ``out_layer``  as ``layer`` (Test 2 only; None = same as ``layer``)
OUT_WORD_AGG_SCHEME ``out_word``   as ``word`` (Test 2 only; None = same as ``word``)
==================  =============  ============================================================================

``str(scheme)`` is ``enc=concat_each_example,layer=-1,word=w1mean,norm=None,seg=mean,ex=mean`` (Test 2 adds
``sim``, ``out_layer`` and ``out_word``) and :meth:`Scheme.parse` inverts it.  :meth:`Scheme.validate`
refuses a combination that does not make sense for a test and an architecture, with the reason.
:meth:`Scheme.standard` is sec. 5.1's "standard concept composition scheme".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from ...base.errors import InputError
from ...base.numbers import show

#: A.6 encoding schemes (``cross_encoding`` is the ordinary, unaggregated run).
ENCODING_SCHEMES: tuple[str, ...] = (
    "sentence_level_segmentation",
    "segment_each_example",
    "merge_all_segments",
    "concat_each_example",
    "concat_all_examples",
    "cross_encoding",
)
#: Not part of A.6: every context token is its own segment (Test 1 with layer=E, word=last is then the baseline).
TEST_ENCODING_SCHEMES: tuple[str, ...] = ("token_level",)
ALL_ENCODING_SCHEMES: tuple[str, ...] = ENCODING_SCHEMES + TEST_ENCODING_SCHEMES
#: Named layers; any integer (as a string) is also a layer.
LAYER_NAMES: tuple[str, ...] = ("E", "middle")
#: The activation filters of A.6: ``relu`` = the model's MLP activation f, ``-relu`` = -f(-x), ``+`` adds x back.
ACTIVATION_FILTERS: tuple[str, ...] = ("relu", "-relu", "relu+", "-relu+")
WORD_AGG_SCHEMES: tuple[str, ...] = (
    ("mean", "w1mean") + tuple(f"{f}|{a}" for a in ("mean", "w1mean") for f in ACTIVATION_FILTERS) + ("last",)
)
NORMS: tuple[str | None, ...] = (None, "L2", "varNorm", "zNorm")
SEGMENT_AGG_SCHEMES: tuple[str | None, ...] = ("mean", None)
EXAMPLE_AGG_SCHEMES: tuple[str | None, ...] = ("mean", None, "soft_cluster")
SIMILARITY_FUNCS: tuple[str | None, ...] = ("dot", "cosine", None)

#: Architectures as :meth:`Scheme.validate` names them, with accepted aliases.
ARCHES: dict[str, str] = {
    "decoder": "decoder",
    "decoder-only": "decoder",
    "causal": "decoder",
    "encoder-decoder": "encoder-decoder",
    "seq2seq": "encoder-decoder",
    "encoder": "encoder",
    "masked": "encoder",
}

_KEYS = ("enc", "layer", "word", "norm", "seg", "ex", "sim", "out_layer", "out_word")
_OPTIONAL_KEYS = ("sim", "out_layer", "out_word")
_OUT_KEYS = ("out_layer", "out_word")
_INT = re.compile(r"[+-]?\d+")


def _none(v: str) -> str | None:
    return None if v in ("None", "none", "") else v


def parse_pairs(text: str, keys: Sequence[str], *, what: str, example: str = "") -> dict[str, str]:
    """``key=value`` pairs joined by commas → ``{key: value}`` (both stripped, in the order given): the grammar of
    a scheme (:meth:`Scheme.parse`) and of a compact spec (:meth:`walklens.analyses.compaction.CompactSpec.parse`).

    An empty ``text``, a part without ``=``, a key not in ``keys`` and a key given twice are each one
    :class:`InputError` line naming ``what`` (``"scheme"``, ``"compact spec"``), the part or key at fault (cut
    short) and, for the first two, the keys allowed; ``example`` follows the refusal of an empty ``text``.
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"empty {what}" + (f"; e.g. {example}" if example else ""))
    shown, allowed = show(text, 80), ", ".join(keys)
    kv: dict[str, str] = {}
    for part in text.strip().split(","):
        if "=" not in part:
            raise InputError(
                f"bad {what} part {show(part.strip(), 40)} in {shown}: expected key=value with a key of {allowed}"
            )
        k, v = (x.strip() for x in part.split("=", 1))
        if k not in keys:
            raise InputError(f"unknown {what} key {show(k, 40)} in {shown}; keys: {allowed}")
        if k in kv:
            raise InputError(f"{what} key {show(k, 40)} given twice in {shown}")
        kv[k] = v
    return kv


def canonical_layer(layer: Any) -> str:
    """``"E"``, ``"middle"`` or a canonical integer string (``"+3"`` → ``"3"``); refuses anything else."""
    try:
        s = str(layer).strip()
        if s in LAYER_NAMES:
            return s
        if _INT.fullmatch(s):
            return str(int(s))
    except ValueError:  # an integer too long for int() / str() (sys.int_info.str_digits_check_threshold)
        pass
    raise InputError(
        f"invalid layer {show(layer, 60)}: use E, middle, a layer index 0..N or a negative index (-1 = top)"
    )


def resolve_layer(layer: str, n_layers: int) -> int | None:
    """The hidden-state index of ``layer`` for an ``n_layers`` stack: None for ``E`` (input embeddings), else
    0..N where l < N is the input of layer l and N is the top of the stack after the final norm (A.6)."""
    layer = canonical_layer(layer)
    if layer == "E":
        return None
    if layer == "middle":
        return (n_layers + 1) // 2
    i = int(layer)
    j = i if i >= 0 else n_layers + 1 + i
    if not 0 <= j <= n_layers:
        raise InputError(
            f"layer {layer} is out of range for a {n_layers}-layer stack (use 0..{n_layers} or -1..-{n_layers + 1})"
        )
    return j


def word_parts(word: str) -> tuple[str | None, str]:
    """Split a word aggregation scheme into (activation filter or None, ``mean``|``w1mean``|``last``)."""
    if "|" in word:
        f, a = word.split("|", 1)
        return f, a
    return None, word


def normalize_arch(arch: str) -> str:
    if arch not in ARCHES:
        raise InputError(f"unknown architecture {arch!r}; use one of {sorted(set(ARCHES))}")
    return ARCHES[arch]


@dataclass(frozen=True)
class Scheme:
    """One concept composition scheme (A.6).  See the module docstring for the fields and their values."""

    enc: str
    layer: str
    word: str
    norm: str | None = None
    seg: str | None = "mean"
    ex: str | None = "mean"
    sim: str | None = None
    out_layer: str | None = None
    out_word: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer", canonical_layer(self.layer))
        if self.out_layer is not None:
            object.__setattr__(self, "out_layer", canonical_layer(self.out_layer))
        checks = (
            ("enc", ALL_ENCODING_SCHEMES),
            ("word", WORD_AGG_SCHEMES),
            ("norm", NORMS),
            ("seg", SEGMENT_AGG_SCHEMES),
            ("ex", EXAMPLE_AGG_SCHEMES),
            ("sim", SIMILARITY_FUNCS),
        )
        for name, allowed in checks:
            v = getattr(self, name)
            if v not in allowed:
                raise InputError(f"invalid {name}={v!r}; allowed: {', '.join(str(a) for a in allowed)}")
        if self.out_word is not None and self.out_word not in WORD_AGG_SCHEMES:
            raise InputError(f"invalid out_word={self.out_word!r}; allowed: {', '.join(WORD_AGG_SCHEMES)}")

    # ---- string form ------------------------------------------------------------------------------------
    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.pairs())

    @classmethod
    def parse(cls, s: str) -> Scheme:
        """Inverse of ``str(scheme)``; unknown keys, repeated keys and missing ``enc``/``layer``/``word`` are
        refused.  Omitted ``norm``/``seg``/``ex``/``sim``/``out_*`` take the dataclass defaults."""
        kv: dict[str, Any] = {
            k: v if k in ("enc", "layer", "word") else _none(v) for k, v in parse_pairs(s, _KEYS, what="scheme").items()
        }
        missing = [k for k in ("enc", "layer", "word") if k not in kv]
        if missing:
            raise InputError(f"scheme {show(s, 80)} lacks {', '.join(missing)}")
        return cls(**kv)

    @classmethod
    def standard(cls, test: int, arch: str) -> Scheme:
        """Sec. 5.1's standard concept composition scheme: top layer, w1mean words (decoder-only) or mean
        (encoder-decoder), segments and examples by mean; each example one segment; Test 2 compares by dot
        product and embeds each ending the same way."""
        arch = normalize_arch(arch)
        word = "w1mean" if arch == "decoder" else "mean"
        s = cls(enc="concat_each_example", layer="-1", word=word, norm=None, seg="mean", ex="mean")
        if test == 2:
            s = replace(s, sim="dot", out_layer="-1", out_word=word)
        elif test != 1:
            raise InputError(f"test must be 1 or 2, got {test}")
        return s

    @classmethod
    def from_spec(cls, spec: str | None, test: int, arch: str) -> Scheme:
        """``None``/``"standard"`` → :meth:`standard`, else :meth:`parse` (which refuses ``""``); then
        :meth:`validate`."""
        s = cls.standard(test, arch) if spec in (None, "standard") else cls.parse(spec)
        s.validate(test, arch)
        return s

    # ---- effective values ---------------------------------------------------------------------------------
    @property
    def out_layer_eff(self) -> str:
        """OUT_ENCODING_LAYER, defaulting to ENCODING_LAYER as in the seed's code."""
        return self.out_layer if self.out_layer is not None else self.layer

    @property
    def out_word_eff(self) -> str:
        return self.out_word if self.out_word is not None else self.word

    def as_dict(self) -> dict[str, str | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # ---- validation ---------------------------------------------------------------------------------------
    def validate(self, test: int, arch: str) -> Scheme:
        """Refuse a combination that makes no sense for Test ``test`` (1 or 2) on ``arch`` (``decoder``,
        ``encoder-decoder``, ``encoder`` or their aliases), with the reason; returns self."""
        arch = normalize_arch(arch)

        def bad(reason: str) -> InputError:
            return InputError(f"scheme {self} is invalid for Test {test} on a {arch} model: {reason}")

        if test == 1:
            if arch == "encoder":
                raise bad("Test 1 scores endings by their likelihood, which needs a causal or encoder-decoder LM")
            if self.sim is not None or self.out_layer is not None or self.out_word is not None:
                raise bad("sim, out_layer and out_word belong to Test 2 (concept similarity)")
            if self.ex == "soft_cluster":
                raise bad(
                    "soft_cluster weighs example vectors by their similarity to a choice vector, which only "
                    "Test 2 computes"
                )
            if self.enc == "cross_encoding" and (self.layer, self.word, self.norm, self.seg, self.ex) != (
                "E",
                "last",
                None,
                None,
                None,
            ):
                raise bad(
                    "cross_encoding is the ordinary run (the baseline), without composition: write it as "
                    "enc=cross_encoding,layer=E,word=last,norm=None,seg=None,ex=None"
                )
        elif test == 2:
            if self.sim is None:
                raise bad("Test 2 needs a similarity function: sim=dot or sim=cosine")
            if self.enc == "cross_encoding":
                raise bad(
                    "cross_encoding runs context and ending as one sequence, so there is no separate context "
                    "vector to compare (the seed's code refuses it too)"
                )
        else:
            raise InputError(f"test must be 1 or 2, got {test}")
        if arch != "decoder":
            for name, layer, word in (
                ("word", self.layer, self.word),
                ("out_word", self.out_layer_eff, self.out_word_eff),
            ):
                if word.endswith("last") and layer != "E" and (name == "word" or test == 2):
                    raise bad(
                        f"{name}=last takes the last vector as a summary of the sequence, which only holds "
                        f"under causal masking (decoder-only models); use it with layer=E only"
                    )
        return self

    # ---- parts of the string form ---------------------------------------------------------------------------
    def pairs(self) -> list[tuple[str, str]]:
        """``(key, value)`` of the string form, in its order: the six context fields always, ``sim``,
        ``out_layer`` and ``out_word`` when set (``str(self)`` joins them as ``key=value``)."""
        return [(k, str(getattr(self, k))) for k in _KEYS if k not in _OPTIONAL_KEYS or getattr(self, k) is not None]

    def context_part(self) -> str:
        """``str(self)`` without ``out_layer``/``out_word``: the context group a sweep stores the scheme under."""
        return ",".join(f"{k}={v}" for k, v in self.pairs() if k not in _OUT_KEYS)

    def out_part(self) -> str:
        """The choice part of ``str(self)`` (``out_layer=..,out_word=..``; empty for Test 1): ``str(self)`` is
        ``context_part()`` followed, when this is not empty, by ``,`` and ``out_part()``."""
        return ",".join(f"{k}={v}" for k, v in self.pairs() if k in _OUT_KEYS)


# ---- pure composition functions (A.6), on batched tensors ------------------------------------------------------


def apply_filter(
    x: torch.Tensor, filt: str | None, act_fn: Callable[[torch.Tensor], torch.Tensor] | None
) -> torch.Tensor:
    """A.6's activation filters with the model's own MLP activation f: ``relu`` → f(x); ``-relu`` → -f(-x)
    (lets the negative part through); ``relu+`` → x + f(x); ``-relu+`` → x - f(-x); None → x."""
    if filt is None:
        return x
    if act_fn is None:
        raise InputError(f"word aggregation {filt}|... needs the model's MLP activation function")
    if filt == "relu":
        return act_fn(x)
    if filt == "-relu":
        return -act_fn(-x)
    if filt == "relu+":
        return x + act_fn(x)
    if filt == "-relu+":
        return x - act_fn(-x)
    raise InputError(f"unknown activation filter {filt!r}; use one of {ACTIVATION_FILTERS}")


def word_aggregate(
    vectors: torch.Tensor,
    scheme_word: str,
    act_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """WORD_AGG_SCHEME (A.6): reduce token vectors ``[..., T, D]`` to ``[..., D]``.

    ``mean``: element-wise mean; ``w1mean``: weighted mean with weight t/N for the t-th of N vectors (1-based),
    i.e. ``sum_t t·e_t / sum_t t`` (the seed's code divides by the sum of the weights); ``last``: the last
    vector (decoder-only models: the only one that has seen the whole segment); ``F|mean`` / ``F|w1mean``:
    :func:`apply_filter` F first.  ``mask`` (``[..., T]``, broadcastable against ``vectors[..., 0]``; 1 = real
    token) excludes padding: weights count real tokens only and ``last`` takes the last real one.
    """
    import torch

    filt, agg = word_parts(scheme_word)
    if scheme_word not in WORD_AGG_SCHEMES:
        raise InputError(f"invalid word aggregation {scheme_word!r}; allowed: {', '.join(WORD_AGG_SCHEMES)}")
    T = vectors.shape[-2]
    if T == 0:
        raise InputError("cannot aggregate an empty sequence of vectors")
    m = (
        torch.ones(vectors.shape[:-1], dtype=vectors.dtype, device=vectors.device)
        if mask is None
        else mask.to(vectors.dtype).expand(vectors.shape[:-1])
    )
    if agg == "last":
        idx = (m * torch.arange(1, T + 1, dtype=m.dtype, device=m.device)).argmax(dim=-1)  # last real position
        x = apply_filter(vectors, filt, act_fn)
        return torch.gather(x, -2, idx[..., None, None].expand(*idx.shape, 1, x.shape[-1])).squeeze(-2)
    x = apply_filter(vectors, filt, act_fn)
    w = m if agg == "mean" else torch.cumsum(m, dim=-1) * m
    return (x * w[..., None]).sum(dim=-2) / w.sum(dim=-1, keepdim=True)


def normalize(v: torch.Tensor, norm: str | None) -> torch.Tensor:
    """NORM (A.6), over the last dimension: None → v; ``L2`` → v/||v||; ``varNorm`` → v/std(v) (unit variance,
    the mean kept; unbiased std as in the seed's code); ``zNorm`` → (v - mean)/sqrt(var + 1e-5) (layer norm
    without affine parameters, as in the seed's code)."""
    import torch

    if norm is None:
        return v
    if norm == "L2":
        return torch.nn.functional.normalize(v, p=2, dim=-1)
    if norm == "varNorm":
        return v / v.std(dim=-1, keepdim=True)
    if norm == "zNorm":
        return torch.nn.functional.layer_norm(v, v.shape[-1:])
    raise InputError(f"invalid norm {norm!r}; allowed: {', '.join(str(n) for n in NORMS)}")


def similarity(a: torch.Tensor, b: torch.Tensor, sim: str) -> torch.Tensor:
    """SIMILARITY_FUNC (A.6) between every row of ``a`` ``[..., M, D]`` and every row of ``b`` ``[..., C, D]``:
    ``[..., C, M]`` (choices by context vectors).  ``dot``: inner product; ``cosine``: inner product of the
    L2-normalised vectors."""
    import torch

    if sim == "cosine":
        a = torch.nn.functional.normalize(a, p=2, dim=-1)
        b = torch.nn.functional.normalize(b, p=2, dim=-1)
    elif sim != "dot":
        raise InputError(f"invalid similarity {sim!r}; use dot or cosine")
    return b @ a.transpose(-1, -2)
