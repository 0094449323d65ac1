"""The ``--compact SPEC`` grammar: what of a HellaSwag context to compact, and how (seed 000, footnote 11).

A SPEC is ``key=value`` pairs joined by commas, in any order, each key at most once::

    what=examples|context|both       the few-shot examples, the item's own context, or all of it (default examples)
    method=concept|avgpool|drop      concept vectors, or a baseline: average pooling / dropping tokens (default concept)
    bounds=even|sentence|scheme      where segments end (default sentence; scheme: the A.6 encoding's own cut;
                                     method=drop has no segments: its canonical form says even)
    ratio=R | ratio=max | budget=K   compacted tokens per vector (R >= 1), one vector, or K >= 1 vectors
                                     (one of them unless bounds=scheme, which takes neither; default ratio=4)
    recent=R                         keep the last R tokens of the compacted part verbatim (default 0)
    layer=L, word=W, norm=N          the A.6 scheme making each vector (method=concept; default -1, w1mean, None)
    enc=E, seg=S, ex=X               the A.6 encoding and aggregations (bounds=scheme only; default
                                     concat_each_example, mean, None: one vector per example)

``str(spec)`` is the canonical form (every key that applies, in the order above), :meth:`CompactSpec.parse`
inverts it, and the results database stores runs under it.  Every malformed SPEC is one
:class:`~walklens.base.errors.InputError` line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ...base.errors import InputError
from ...base.numbers import show
from ..concepts.schemes import Scheme, parse_pairs
from .core import BOUNDS, METHODS

WHATS: tuple[str, ...] = ("examples", "context", "both")
_KEYS = ("what", "method", "bounds", "ratio", "budget", "recent", "layer", "word", "norm", "enc", "seg", "ex")
_SCHEME_KEYS = ("layer", "word", "norm")
_ENC_KEYS = ("enc", "seg", "ex")
DEFAULT_RATIO = 4.0


def _ratio_str(r: float) -> str:
    if math.isinf(r):
        return "max"
    s = repr(float(r))
    return s[:-2] if s.endswith(".0") else s


def _none(v: str) -> str | None:
    return None if v in ("None", "none", "") else v


@dataclass(frozen=True)
class CompactSpec:
    """One compaction of a HellaSwag context (module docstring); ``ratio`` ``math.inf`` is ``max``."""

    what: str = "examples"
    method: str = "concept"
    bounds: str = "sentence"
    ratio: float | None = DEFAULT_RATIO
    budget: int | None = None
    recent: int = 0
    layer: str = "-1"
    word: str = "w1mean"
    norm: str | None = None
    enc: str = "concat_each_example"
    seg: str | None = "mean"
    ex: str | None = None

    def __post_init__(self) -> None:
        def bad(msg: str) -> InputError:
            return InputError(f"compact spec: {msg}")

        for name, allowed in (("what", WHATS), ("method", METHODS), ("bounds", BOUNDS)):
            if getattr(self, name) not in allowed:
                raise InputError(f"invalid {name}={show(getattr(self, name), 60)}; use one of {', '.join(allowed)}")
        if self.bounds == "scheme":
            if self.method != "concept":
                raise bad("bounds=scheme cuts where the A.6 encoding does, so it needs method=concept")
            if self.ratio is not None or self.budget is not None:
                raise bad("bounds=scheme takes no ratio or budget (the encoding decides the vectors)")
            if self.recent:
                raise bad("bounds=scheme cuts whole segments, so it takes no recent window")
            if self.enc in ("token_level", "cross_encoding"):
                raise bad(f"enc={self.enc} makes no text segments to compact")
        elif (self.ratio is None) == (self.budget is None):
            raise bad("give exactly one of ratio=R (or ratio=max) and budget=K")
        if self.ratio is not None and not (
            isinstance(self.ratio, (int, float)) and self.ratio >= 1 and not math.isnan(self.ratio)
        ):
            raise InputError(f"invalid ratio={show(self.ratio, 60)}: compacted tokens per vector, a number >= 1 or max")
        if self.budget is not None and not (isinstance(self.budget, int) and self.budget >= 1):
            raise InputError(f"invalid budget={show(self.budget, 60)}: a number of vectors >= 1")
        if not (isinstance(self.recent, int) and self.recent >= 0):
            raise InputError(f"invalid recent={show(self.recent, 60)}: a number of tokens >= 0")
        # keys that do not apply take their defaults, so that equal compactions are equal specs
        d = CompactSpec.__dataclass_fields__
        if self.bounds != "scheme":
            for k in _ENC_KEYS:
                object.__setattr__(self, k, d[k].default)
        if self.method != "concept":
            for k in _SCHEME_KEYS:
                object.__setattr__(self, k, d[k].default)
        if self.method == "drop":  # keeps the last tokens: no segments, so no bounds
            object.__setattr__(self, "bounds", "even")
        if self.ratio is not None:
            object.__setattr__(self, "ratio", float(self.ratio))
        object.__setattr__(self, "layer", self.scheme().layer)  # the A.6 values are checked by Scheme

    def scheme(self) -> Scheme:
        """The A.6 scheme making the vectors (enc, seg and ex matter for ``bounds=scheme`` only)."""
        return Scheme(enc=self.enc, layer=self.layer, word=self.word, norm=self.norm, seg=self.seg, ex=self.ex)

    # ---- string form --------------------------------------------------------------------------------------
    def pairs(self) -> list[tuple[str, str]]:
        """``(key, value)`` of every key that applies, in the canonical order."""
        out = [("what", self.what), ("method", self.method), ("bounds", self.bounds)]
        if self.ratio is not None:
            out.append(("ratio", _ratio_str(self.ratio)))
        if self.budget is not None:
            out.append(("budget", str(self.budget)))
        out.append(("recent", str(self.recent)))
        if self.method == "concept":
            s = self.scheme()
            out += [("layer", s.layer), ("word", s.word), ("norm", str(s.norm))]
            if self.bounds == "scheme":
                out += [("enc", s.enc), ("seg", str(s.seg)), ("ex", str(s.ex))]
        return out

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.pairs())

    @classmethod
    def parse(cls, spec: str) -> CompactSpec:
        """A SPEC string (module docstring) → :class:`CompactSpec`; one :class:`InputError` line if malformed."""
        kv = parse_pairs(spec, _KEYS, what="compact spec", example="what=examples,ratio=4")
        shown = show(spec, 80)
        method = kv.get("method", "concept")
        bounds = kv.get("bounds", "sentence")
        if method != "concept":
            given = [k for k in _SCHEME_KEYS + _ENC_KEYS if k in kv]
            if given:
                raise InputError(
                    f"method={show(method, 20)} takes no {', '.join(given)} (only method=concept "
                    f"makes vectors with an A.6 scheme) in {shown}"
                )
        if bounds != "scheme":
            given = [k for k in _ENC_KEYS if k in kv]
            if given:
                raise InputError(f"{', '.join(given)} apply to bounds=scheme only, in {shown}")
        args: dict[str, Any] = {k: v for k, v in kv.items() if k in ("what", "method", "bounds", "layer", "word")}
        for k in ("norm", "seg", "ex"):
            if k in kv:
                args[k] = _none(kv[k])
        if "enc" in kv:
            args["enc"] = kv["enc"]
        args["ratio"] = _parse_ratio(kv["ratio"], shown) if "ratio" in kv else None
        args["budget"] = _parse_int(kv["budget"], "budget", 1, shown) if "budget" in kv else None
        if "recent" in kv:
            args["recent"] = _parse_int(kv["recent"], "recent", 0, shown)
        if bounds != "scheme" and args["ratio"] is None and args["budget"] is None:
            args["ratio"] = DEFAULT_RATIO
        return cls(**args)

    def with_ratio(self, ratio: float) -> CompactSpec:
        """The same compaction at another ratio (``math.inf``: one vector)."""
        return replace(self, ratio=float(ratio), budget=None)


def ratio_value(text: str) -> float | None:
    """A compaction ratio (compacted tokens per vector): a finite number >= 1, or ``max`` (``inf``: one vector);
    ``None`` when ``text`` is neither (each caller words its own error)."""
    if text.strip().lower() == "max":
        return math.inf
    try:
        r = float(text)
    except ValueError:
        return None
    return r if r >= 1 and math.isfinite(r) else None


def _parse_ratio(v: str, shown: str) -> float:
    r = ratio_value(v)
    if r is None:
        raise InputError(f"invalid ratio={show(v, 30)} in {shown}: a number >= 1 (tokens per vector) or max")
    return r


def _parse_int(v: str, name: str, lo: int, shown: str) -> int:
    try:
        n = int(v)
    except ValueError:
        n = lo - 1
    if n < lo or n > 10**9:
        raise InputError(f"invalid {name}={show(v, 30)} in {shown}: an integer from {lo} to 10**9")
    return n


__all__ = ["CompactSpec", "WHATS"]
