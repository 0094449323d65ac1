"""Scheme grids: the cartesian product of the A.6 parameter values, minus invalid combinations.

Seed 000, A.6 lists the parameters of a "distributed concept composition scheme": ``encoding_scheme``,
``ENCODING_LAYER``, ``WORD_AGG_SCHEME``, ``NORM``, ``SEGMENT_AGG_SCHEME``, ``EXAMPLE_AGG_SCHEME``,
``SIMILARITY_FUNC`` and, for Test 2 (concept similarity, sec. 5.1.2), ``OUT_ENCODING_LAYER`` and
``OUT_WORD_AGG_SCHEME``.  The seed's authors swept "about 1200" Test 1 and "over 6000" Test 2 schemes
(sec. 5.1.1-5.1.2); a :class:`GridSpec` with the default layer set (``E, 0, middle, -2, -1``) spans the whole
product instead (~10^6 Test 2 schemes), which :mod:`walklens.lab.experiments.sweep` evaluates from one forward pass
per distinct segment text.

A grid is a mapping from :class:`~walklens.analyses.concepts.schemes.Scheme` field names to the values to try:

* ``full``: every value of every parameter (layers from the layer set);
* ``standard``: only the paper's standard scheme (sec. 5.1), handy as a reference point and for benchmarks;
* ``small``: a first sweep (:data:`SMALL`: 8 Test 1 schemes, 32 Test 2 schemes, two layers), minutes on a
  laptop, with no grid file to write;
* a TOML file: any parameter given as a list restricts (or extends: e.g. more layers) the full grid; the
  optional ``base = "standard"`` starts from the standard scheme instead of the full product, e.g.::

      base = "full"              # or "standard"
      layer = ["-1", "middle"]   # restricts ENCODING_LAYER (and layers = [...] sets the layer set of both)
      norm = ["None", "L2"]

Invalid combinations are those :meth:`Scheme.validate` refuses for the test and architecture.
"""

from __future__ import annotations

import itertools
import math
import operator
import tomllib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...base.errors import InputError
from ...base.records import read_text

#: Default layer set for ENCODING_LAYER and OUT_ENCODING_LAYER: token embeddings, the first
#: layer's input, the middle, one below the top and the top of the stack.
DEFAULT_LAYERS: tuple[str, ...] = ("E", "0", "middle", "-2", "-1")

#: Scheme fields in A.6 order; the last two only exist for Test 2.
FIELDS: tuple[str, ...] = ("enc", "layer", "word", "norm", "seg", "ex", "sim", "out_layer", "out_word")
#: Fields that fix the context side of a Test 2 scheme (everything but the choice-side encoding).
CONTEXT_FIELDS: tuple[str, ...] = ("enc", "layer", "word", "norm", "seg", "ex", "sim")
OUT_FIELDS: tuple[str, ...] = ("out_layer", "out_word")


def _schemes_module() -> Any:
    from ...analyses.concepts import schemes

    return schemes


def parameter_values(test: int, layers: Sequence[str] = DEFAULT_LAYERS) -> dict[str, tuple[Any, ...]]:
    """Every A.6 value of every parameter for ``test`` (1 or 2), layers taken from ``layers``."""
    s = _schemes_module()
    vals: dict[str, tuple[Any, ...]] = {
        "enc": tuple(s.ENCODING_SCHEMES),
        "layer": tuple(layers),
        "word": tuple(s.WORD_AGG_SCHEMES),
        "norm": tuple(s.NORMS),
        "seg": tuple(s.SEGMENT_AGG_SCHEMES),
        "ex": tuple(s.EXAMPLE_AGG_SCHEMES),
    }
    if test == 2:
        # SIMILARITY_FUNC=None is A.6's value for Test 1 only ("where it's not applicable")
        vals.update(
            sim=tuple(v for v in s.SIMILARITY_FUNCS if v is not None),
            out_layer=tuple(layers),
            out_word=tuple(s.WORD_AGG_SCHEMES),
        )
    return vals


#: ``--grid small``: a first sweep, two values of the parameters that matter most (sec. 5.1's layer and word
#: aggregation, the paper's own and the sentence-level encoding) and the standard value of the rest; the layers
#: are replaced by ``--layers`` when given
SMALL: dict[str, tuple[str, ...]] = {
    "enc": ("concat_each_example", "sentence_level_segmentation"),
    "layer": ("middle", "-1"),
    "word": ("w1mean", "last"),
    "norm": ("None",),
    "seg": ("mean",),
    "ex": ("mean",),
    "sim": ("cosine",),
    "out_layer": ("middle", "-1"),
    "out_word": ("w1mean", "last"),
}


#: The largest grid or experiment file read (a grid of every value is a few kilobytes).
MAX_TOML = 2**20


def read_toml(p: Path, kind: str) -> dict[str, Any]:
    """The table of a TOML file (a grid or an experiment file); every failure is one :class:`InputError` line."""
    if not p.exists() and not p.is_symlink():
        raise InputError(f"{p}: no such {kind} file")
    text = read_text(p, str(p), MAX_TOML)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{p}: not valid TOML ({e})") from None
    except RecursionError:  # the parser recurses once per level of nested arrays or inline tables
        raise InputError(f"{p}: arrays or inline tables nested too deeply to read") from None


@dataclass(frozen=True)
class GridSpec:
    """The values to try for each parameter, plus the test they belong to (1 or 2).

    ``values`` holds, per Scheme field, a tuple of values in their string form (as in ``str(Scheme)``);
    ``explicit`` lists the schemes of a ``standard`` grid (which is a list, not a product).
    """

    test: int
    values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    explicit: tuple[Any, ...] = ()
    name: str = "custom"

    # ---- construction -----------------------------------------------------------------------------------
    @classmethod
    def full(cls, test: int, layers: Sequence[str] = DEFAULT_LAYERS) -> GridSpec:
        _check_test(test)
        vals = {k: tuple(_as_str(v) for v in vs) for k, vs in parameter_values(test, layers).items()}
        return cls(test=test, values=vals, name="full")

    @classmethod
    def standard(cls, test: int, arch: str, layers: Sequence[str] | None = None) -> GridSpec:
        """The standard scheme (sec. 5.1); with ``layers``, the standard scheme at each of those layers (and,
        for Test 2, each OUT_ENCODING_LAYER among them)."""
        _check_test(test)
        if not layers:
            return cls(test=test, explicit=(_schemes_module().Scheme.standard(test, arch),), name="standard")
        return cls(test=test, values=_standard_values(test, arch, layers), name="standard").checked()

    @classmethod
    def small(cls, test: int, layers: Sequence[str] | None = None) -> GridSpec:
        """``--grid small`` (:data:`SMALL`): a first sweep of a few schemes; ``layers`` replace its two layers."""
        _check_test(test)
        vals = {k: v for k, v in SMALL.items() if test == 2 or k not in ("sim", *OUT_FIELDS)}
        if layers:
            vals = {**vals, "layer": tuple(layers), **({"out_layer": tuple(layers)} if test == 2 else {})}
        return cls(test=test, values=vals, name="small").checked()

    @classmethod
    def from_toml(cls, path: str | Path, test: int, arch: str, layers: Sequence[str] | None = None) -> GridSpec:
        """A grid file: lists restrict/extend parameters of ``base`` (``full``, default, or ``standard``)."""
        _check_test(test)
        p = Path(path)
        doc = read_toml(p, "grid")
        base = doc.pop("base", "full")
        lay = doc.pop("layers", None)
        layer_fields = [k for k in ("layer", "out_layer") if k in _fields_for(test)]
        if layers and (lay is not None or all(k in doc for k in layer_fields)):
            raise InputError(
                f"{p}: the grid file sets {'layers' if lay is not None else ' and '.join(layer_fields)} "
                f"itself, so --layers would be ignored: give the layers in one place"
            )
        if lay is not None:
            if not isinstance(lay, list) or not lay:
                raise InputError(f"{p}: 'layers' must be a non-empty list")
            layers = [_as_str(x) for x in lay]
        if base == "full":
            spec = cls.full(test, tuple(layers) if layers else DEFAULT_LAYERS)
            vals = dict(spec.values)
        elif base == "standard":
            vals = _standard_values(test, arch, layers)
        else:
            raise InputError(f"{p}: base must be 'full' or 'standard', not {base!r}")
        allowed = set(_fields_for(test))
        for key, v in doc.items():
            if key not in allowed:
                raise InputError(f"{p}: unknown parameter {key!r} for Test {test}; known: {', '.join(sorted(allowed))}")
            if not isinstance(v, list) or not v:
                raise InputError(f"{p}: {key} must be a non-empty list")
            vals[key] = tuple(_as_str(x) for x in v)
        try:
            return cls(test=test, values=vals, name=p.stem).checked()
        except InputError as e:
            raise InputError(f"{p}: {e}") from None

    @classmethod
    def resolve(cls, grid: str, test: int, arch: str, layers: Sequence[str] | None = None) -> GridSpec:
        """``full`` | ``standard`` | ``small`` | a TOML file path (``./small`` for a file of that name); ``layers``
        (e.g. from ``--layers``) is the layer set of ``full``, the layers of ``standard`` and ``small``, and the
        layer set of a file that does not set its own."""
        if grid == "full":
            return cls.full(test, tuple(layers) if layers else DEFAULT_LAYERS).checked()
        if grid == "standard":
            return cls.standard(test, arch, layers)
        if grid == "small":
            return cls.small(test, layers)
        return cls.from_toml(grid, test, arch, layers)

    def checked(self) -> GridSpec:
        """Self, after every value of every parameter was checked (an :class:`InputError` naming the first bad
        one), so that a bad grid fails before any model loads."""
        next(self.candidates(), None)
        return self

    def layers(self) -> tuple[str, ...]:
        """Every ENCODING_LAYER and OUT_ENCODING_LAYER value the grid uses (to check against a model's depth)."""
        if self.explicit:
            used = [x for s in self.explicit for x in (s.layer, s.out_layer) if x is not None]
        else:
            used = list(self.values.get("layer", ()) + self.values.get("out_layer", ()))
        return tuple(dict.fromkeys(used))

    # ---- enumeration --------------------------------------------------------------------------------------
    def product_size(self) -> int:
        """Size of the cartesian product of the distinct values (``-1`` and ``-1``, ``None`` and ``none`` count
        once), before removing invalid combinations."""
        if self.explicit:
            return len(self.explicit)
        return math.prod(len(v) for v in self._distinct()[1])

    def _distinct(self) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The fields and, per field, its distinct values as Scheme field values (canonical layers, None)."""
        canon = _schemes_module().canonical_layer
        keys = list(self.values)
        return keys, [
            tuple(dict.fromkeys(canon(v) if k in ("layer", "out_layer") else _from_str(k, v) for v in self.values[k]))
            for k in keys
        ]

    def candidates(self) -> Iterator[Any]:
        """Every scheme of the product, valid or not, in a fixed order (the product's, last field fastest)."""
        if self.explicit:
            yield from self.explicit
            return
        Scheme = _schemes_module().Scheme
        keys, vals = self._distinct()
        if not all(vals):
            return
        # every value is checked once by the dataclass (canonical form, allowed values) ...
        probe = Scheme(**{k: v[0] for k, v in zip(keys, vals)})
        for k, vs in zip(keys, vals):
            for v in vs:
                if getattr(replace(probe, **{k: v}), k) != v:
                    raise InputError(f"grid value {k}={v!r} is not in canonical form")
        # ... so the product is built without re-running __post_init__ 10^6 times (same objects, ~5x faster)
        base = dict(probe.__dict__)
        new = object.__new__
        for combo in itertools.product(*vals):
            s = new(Scheme)
            d = dict(base)
            d.update(zip(keys, combo))
            s.__dict__.update(d)
            yield s

    def enumerate(self, arch: str) -> tuple[list[Any], dict[str, int]]:
        """Valid schemes of this grid for ``arch`` (duplicates removed) and how many were refused, by reason."""
        valid: list[Any] = []
        refused: dict[str, int] = {}
        seen: set[Any] = set()
        for s in self.candidates():
            if self.explicit:  # a product has no duplicates (values are canonical and unique per field)
                if s in seen:
                    continue
                seen.add(s)
            try:
                s.validate(self.test, arch)
            except InputError as e:
                msg = str(e)
                reason = msg.split(": ", 1)[-1] if " model: " in msg else msg
                refused[reason] = refused.get(reason, 0) + 1
                continue
            valid.append(s)
        return valid, refused


def group_by_context(schemes: Iterable[Any]) -> OrderedDict[tuple[Any, ...], list[Any]]:
    """Schemes grouped by their context part (:data:`CONTEXT_FIELDS`), each group's schemes in order.

    One group shares its context vectors; its members differ only in how the choices are encoded
    (OUT_ENCODING_LAYER, OUT_WORD_AGG_SCHEME), so the sweep scores a whole group with one matrix product.
    """
    key = operator.attrgetter(*CONTEXT_FIELDS)
    groups: OrderedDict[tuple[Any, ...], list[Any]] = OrderedDict()
    for s in schemes:
        groups.setdefault(key(s), []).append(s)
    return groups


def _standard_values(test: int, arch: str, layers: Sequence[str] | None) -> dict[str, tuple[str, ...]]:
    """The standard scheme as one-value lists, its layer (and Test 2's out_layer) replaced by ``layers``."""
    std = _schemes_module().Scheme.standard(test, arch)
    vals: dict[str, tuple[str, ...]] = {k: (_as_str(getattr(std, k)),) for k in _fields_for(test)}
    if layers:
        vals["layer"] = tuple(layers)
        if test == 2:
            vals["out_layer"] = tuple(layers)
    return vals


def _fields_for(test: int) -> tuple[str, ...]:
    return FIELDS if test == 2 else FIELDS[:6]


def _from_str(key: str, v: str) -> Any:
    """A grid value in string form → the Scheme field value (``"None"`` → None for the optional fields)."""
    if key in ("enc", "layer", "word"):
        return v
    return None if v in ("None", "none", "") else v


def _as_str(v: Any) -> str:
    return "None" if v is None else str(v)


def _check_test(test: int) -> None:
    if test not in (1, 2):
        raise InputError(f"--test must be 1 or 2, not {test!r}")
