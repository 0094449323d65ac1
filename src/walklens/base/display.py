"""Results that show themselves: in a notebook as their report's view, in a terminal as 80 columns of text.

Every public result type derives from :class:`Shown` and names its view (``class EncodingWalk(Shown,
view="walk")``).  Two of IPython's display hooks follow from that:

- ``_repr_html_`` draws the result with its report's own builder, in a sandboxed frame (everything inline,
  nothing fetched).  The drawing lives in :mod:`walklens.reports.notebook`, at the top of the layers with the CLI,
  and this module never imports it: the result holds only its view's name, and ``_repr_html_`` looks the name
  up in a table of renderers (:func:`register_view`) that the views fill when they are imported.  The package
  root (``walklens/__init__.py``, the entry point) hands this module the import of the views
  (:func:`views_from`), run the first time the table is read, and a submodule is never imported without its
  package (``import walklens.core.trace`` runs ``walklens/__init__.py`` first), so the table is full before any
  result is shown, and ``import walklens`` stays light (``walklens --help`` loads no torch).  No import runs
  upward, by name or otherwise: an analysis must never import the reports (import contracts in
  ``pyproject.toml``; ``tests/test_architecture.py`` checks imports by name too).
- ``__repr__`` is :func:`text`: one head line and a line per public field (its type and shape, or the start of
  its value), every line at most :data:`WIDTH` columns, at most :data:`MAX_LINES` lines.

:func:`text` knows nothing of the result types: it reads dataclass fields, and a result may add its own head
line with ``_headline()``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

from .errors import displayable

WIDTH = 80  #: the columns of a plain-text repr
MAX_LINES = 24  #: lines of a plain-text repr (the last one says how many fields were left out)
_NAME = 16  #: the widest column of field names (a longer name pushes its summary right)
_NESTED = 4  #: how deep :func:`displayable_copy` looks for strings (a result, its lists, their parts)

Renderer = Callable[[Any], str]  #: a result -> its view as notebook HTML

_RENDERERS: dict[str, Renderer] = {}  #: view name -> its renderer (:func:`register_view`)
_LOADERS: list[Callable[[], object]] = []  #: imports that fill the table, run once when it is first read


def views_from(load: Callable[[], object]) -> None:
    """Run ``load`` (an import of views that register themselves) the first time the table is read: the package
    root passes the import of :mod:`walklens.reports.notebook`, which this module never names."""
    _LOADERS.append(load)


def _load_views() -> None:
    while _LOADERS:
        _LOADERS.pop(0)()


def register_view(name: str, renderer: Renderer) -> None:
    """Draw every result of view ``name`` with ``renderer`` (its ``_repr_html_``); called by the views as they
    are imported (:mod:`walklens.reports.notebook`).  Registering a name again replaces its renderer."""
    if not name:
        raise ValueError("a view needs a name")
    _RENDERERS[name] = renderer


def registered_views() -> dict[str, Renderer]:
    """A copy of the table: view name -> renderer."""
    _load_views()
    return dict(_RENDERERS)


def _clip(line: str, width: int = WIDTH) -> str:
    line = displayable(line)  # a name holding a lone surrogate, as a terminal can print it
    return line if len(line) <= width else line[: width - 1] + "…"


def _number(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10_000 else str(x)
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    if isinstance(x, complex):
        return f"{x.real:.4g}{x.imag:+.4g}j"
    return repr(x)


def summary(value: Any) -> str:
    """One line of a field's value: a tensor or an array as its shape and dtype, a sequence as its length and
    first items, a mapping as its size and first keys, a nested result as its class name."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):  # torch.Tensor, numpy.ndarray
        dims = ", ".join(str(int(s)) for s in shape)
        kind = "tensor" if hasattr(value, "detach") else "array"
        head = f"{kind}[{dims}] {str(value.dtype).removeprefix('torch.')}"
        if len(shape) == 0:
            return f"{head} = {_number(value.item())}"
        return head
    if isinstance(value, (str, bytes)):
        return repr(value)
    if isinstance(value, dict):
        keys = ", ".join(repr(k) for k in list(value)[:4])
        return f"dict[{len(value)}] {{{keys}{', …' if len(value) > 4 else ''}}}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(_item(v) for v in value[:6])
        return f"{type(value).__name__}[{len(value)}] {items}{', …' if len(value) > 6 else ''}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__
    return _number(value)


def _item(v: Any) -> str:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return type(v).__name__
    if isinstance(v, (list, tuple, dict)) or hasattr(v, "shape"):
        return summary(v)
    return _number(v) if not isinstance(v, str) else repr(v)


def headline(result: Any) -> str:
    """The head line of a result: its class name, then its own ``_headline()`` or its model's name
    (:func:`~walklens.base.errors.displayable`)."""
    own = getattr(result, "_headline", None)
    tail = own() if callable(own) else getattr(result, "model_name", "")
    return displayable(f"{type(result).__name__}({tail})" if tail else type(result).__name__)


def text(result: Any) -> str:
    """The plain-text repr of a result (dataclass): :func:`headline`, then ``name  summary`` per public field,
    at most :data:`WIDTH` columns a line and :data:`MAX_LINES` lines."""
    lines = [_clip(headline(result))]
    names = [f.name for f in dataclasses.fields(result) if not f.name.startswith("_")]
    room = MAX_LINES - 1
    shown = names if len(names) <= room else names[: room - 1]
    width = min(_NAME, max((len(n) for n in shown), default=0) + 1)
    for name in shown:
        lines.append(_clip(f"  {name:<{width}} {summary(getattr(result, name))}"))
    if len(shown) < len(names):
        lines.append(f"  … {len(names) - len(shown)} more fields: {', '.join(names[len(shown) :])}")
        lines[-1] = _clip(lines[-1])
    return "\n".join(lines)


def displayable_copy(value: Any, depth: int = _NESTED) -> Any:
    """``value`` with every string in it :func:`~walklens.base.errors.displayable` (in lists, tuples, dicts and
    dataclass fields ``depth`` levels down; a result that is no dataclass defines ``_displayable_copy()``): what a
    view draws
    of a result holding a name of undecodable bytes.  ``value`` itself when nothing changes."""
    if isinstance(value, str):
        return displayable(value)
    own = getattr(value, "_displayable_copy", None)
    if callable(own) and not isinstance(value, type):
        return own()
    if depth <= 0:
        return value
    if type(value) in (list, tuple):
        items = [displayable_copy(v, depth - 1) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    if type(value) is dict:
        pairs = [(displayable_copy(k, depth - 1), displayable_copy(v, depth - 1)) for k, v in value.items()]
        return value if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items())) else dict(pairs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name, None)
            shown = displayable_copy(v, depth - 1)
            if shown is not v:
                changed[f.name] = shown
        if not changed:
            return value
        out = copy.copy(value)
        for name, v in changed.items():
            object.__setattr__(out, name, v)  # a frozen dataclass too: the copy is this function's own
        return out
    return value


class Shown:
    """A result that shows itself (IPython's display protocol): ``class X(Shown, view="topic")``.

    ``_repr_html_`` is the renderer registered under ``view`` (kept as ``_view``: a tensor result already has a
    ``view`` method; :func:`register_view`); ``__repr__`` is :func:`text`.  A
    dataclass deriving from it keeps this ``__repr__`` (``dataclass`` adds none where the class has one).
    """

    _view: ClassVar[str] = ""

    def __init_subclass__(cls, view: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if view:
            cls._view = view
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = Shown.__repr__  # type: ignore[method-assign]  # before @dataclass adds its own

    def _repr_html_(self) -> str:
        """The result's view for a notebook: the renderer registered for its view (:func:`register_view`;
        :func:`walklens.reports.notebook.html` for every view of walklens)."""
        _load_views()
        renderer = _RENDERERS.get(type(self)._view)
        if renderer is None:
            raise TypeError(f"{type(self).__name__} has no notebook view (none is registered as {self._view!r})")
        return renderer(self)

    def __repr__(self) -> str:
        return text(self)


__all__ = [
    "MAX_LINES",
    "WIDTH",
    "Renderer",
    "Shown",
    "displayable_copy",
    "headline",
    "register_view",
    "registered_views",
    "summary",
    "text",
    "views_from",
]
