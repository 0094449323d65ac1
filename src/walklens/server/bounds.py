"""What a request may ask and what a response may weigh: argument checks with clear JSON errors, and the
reductions that keep every payload bounded whatever the text's length.

Every argument of an API call goes through one of the ``*_arg`` readers; a bad value raises :class:`ApiError`
(HTTP 400, or 413 for a text over the limits) whose message names the argument and the allowed range.  A text
that runs the model is refused (413) over :data:`MAX_TOKENS` tokens or over what its view would need
(:func:`check_cost`: the view's estimate in :mod:`walklens.costs` against ``walklens serve --max-memory
--max-work``, by the rule and with the estimates the commands use).  Maps wider than :data:`MAX_CELLS` cells
are reduced on the server by blocks of positions (:func:`column_min`, torch's pooling, :func:`by_blocks`, or
:func:`walklens.reports.html.block_mean`), never shipped whole; numbers are rounded to :data:`DIGITS` decimals in
the replies that carry maps (:mod:`.routing`).
Measured sizes of each view's payload are in docs/explorer.md.

A view's reply is its result's document (``document()`` of the report's topic, the dict ``--json`` writes):
the view names the fields it draws (:func:`fields_arg`, :func:`pick`), so a field added to a result reaches the
API with no edit here, and a view shows it by naming and drawing it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import costs
from ..base.errors import WalklensError
from ..base.numbers import MAX_ALPHA as MAX_ALPHA  # |alpha| of steering, the command line's bound too
from ..base.numbers import NumberError, Range
from ..costs import (
    LimitValues,
    Need,
    Shape,
    WalkPlan,
    attention_need,
    fit_hint,
    generate_need,
    power_need,
    refusal,
    simmap_need,
    steer_need,
    tokens_that_fit,
    walk_need,
)

MAX_BODY = 256 * 1024  # bytes of a request body
MAX_DEPTH = 32  # levels of nesting of a request body (lists and objects)
MAX_TEXT_CHARS = 20_000  # characters of a text, a prompt or a target
MAX_TOKENS = 2048  # tokens of a text read by any view (fewer where the view's need is over the limits)
MAX_K = 50  # nearest tokens of a cell or a decoding step
MAX_NEW_TOKENS = 64  # generated tokens of a decoding walk
MAX_STEER_TOKENS = 32  # generated tokens of each steered / unsteered continuation
MAX_CELLS = 65_536  # cells of one map in a response (larger maps are reduced by blocks of positions)
MAX_FIELDS = 64  # names of document fields a request asks for
DIGITS = 5  # decimals of the floats in a response


class ApiError(Exception):
    """A request the server refuses: ``status`` (4xx) and a one-line ``message`` sent as ``{"error": ...}``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = " ".join(str(message).split())
        self.status = status


def from_walklens(e: WalklensError) -> ApiError:
    """A walklens error raised by an analysis (bad layer, empty text, ...) as a 400 with its message."""
    return ApiError(str(e), 400)


def _get(body: dict[str, Any], name: str, default: Any) -> Any:
    v = body.get(name, default)
    if v is None and default is not None:
        return default
    return v


def text_arg(body: dict[str, Any], name: str = "text", required: bool = True) -> str:
    """A text of at most :data:`MAX_TEXT_CHARS` characters (413 beyond); empty or blank is refused when
    ``required``."""
    v = body.get(name)
    if v is None and not required:
        return ""
    if not isinstance(v, str):
        raise ApiError(f"{name} must be a string")
    if len(v) > MAX_TEXT_CHARS:
        raise ApiError(f"{name} has {len(v):,} characters; at most {MAX_TEXT_CHARS:,} are accepted", 413)
    if required and not v.strip():
        raise ApiError(f"{name} is empty")
    return v


def int_arg(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (booleans and floats with a fraction are refused): the shared check of
    :mod:`walklens.base.numbers`, its refusal a 400."""
    return number_arg(body, name, default, Range(lo, hi, integer=True))


def float_arg(body: dict[str, Any], name: str, default: float, bound: float) -> float:
    """A finite number with |x| <= bound (a huge integer is refused, never converted)."""
    return number_arg(body, name, default, Range(-bound, bound))


def number_arg(body: dict[str, Any], name: str, default: Any, rng: Range) -> Any:
    """``body[name]`` (``default`` when absent or null) checked by ``rng`` (:class:`walklens.base.numbers.Range`)."""
    try:
        return rng.check(_get(body, name, default), name)
    except NumberError as e:
        raise ApiError(str(e)) from None


def choice_arg(body: dict[str, Any], name: str, default: str, choices: Sequence[str]) -> str:
    v = _get(body, name, default)
    if v not in choices:
        raise ApiError(f"{name} must be one of {', '.join(choices)}")
    return str(v)


def bool_arg(body: dict[str, Any], name: str, default: bool) -> bool:
    v = _get(body, name, default)
    if not isinstance(v, bool):
        raise ApiError(f"{name} must be true or false")
    return v


def layers_arg(body: dict[str, Any], name: str, n_layers: int) -> list[int]:
    """A non-empty list of at most ``n_layers`` distinct layers (negative: from the top)."""
    v = body.get(name)
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list) or not v or len(v) > n_layers:
        raise ApiError(f"{name} must be a list of 1 to {n_layers} layer numbers")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or not -n_layers <= x < n_layers:
            raise ApiError(f"{name}: every layer must be an integer from {-n_layers} to {n_layers - 1}")
        out.append(x % n_layers)
    return sorted(set(out))


def fields_arg(body: dict[str, Any]) -> list[str] | None:
    """``fields``: the names of the document's fields a view draws (1 to :data:`MAX_FIELDS` strings); None when
    absent (every field)."""
    v = body.get("fields")
    if v is None:
        return None
    if (
        not isinstance(v, list)
        or not 0 < len(v) <= MAX_FIELDS
        or not all(isinstance(f, str) and 0 < len(f) <= 64 for f in v)
    ):
        raise ApiError(f"fields must be a list of 1 to {MAX_FIELDS} field names")
    return list(dict.fromkeys(v))


def pick(doc: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """The fields of a document a view asked for (all of them when ``fields`` is None).  A name the document
    lacks is a 400 listing the document's fields (never echoing the request)."""
    if fields is None:
        return doc
    if any(f not in doc for f in fields):
        raise ApiError(f"fields: a name is not a field of this document; its fields are {', '.join(doc)}")
    return {f: doc[f] for f in fields}


def check_tokens(n: int, limit: int, view: str) -> None:
    """Refuse (413) a text whose token count exceeds the view's limit, naming both."""
    if n > limit:
        raise ApiError(f"the text has {n:,} tokens; the {view} view reads at most {limit:,}", 413)


def _walk_view(sh: Shape, T: int) -> Need:
    """The rank maps of every walk point (no top k), the trace they read."""
    points = sh.layers + 2  # WALK_POINTS: embed, every resid_post, final
    return walk_need(sh, T, WalkPlan(points=points, captured=points, shown=points, k=0))


#: what each view that runs the model needs for a text of T tokens (at the largest values its arguments take),
#: by the view's name in :func:`check_tokens`; views not named here (a target) are bounded by another's
VIEW_COSTS: dict[str, Callable[[Shape, int], Need]] = {
    "walk": _walk_view,
    "similarity map": lambda sh, T: simmap_need(sh, T, maps=1, captured=1),
    "attention": attention_need,
    "decoding": lambda sh, T: generate_need(sh, T, steps=MAX_NEW_TOKENS, k=MAX_K),
    "power": lambda sh, T: power_need(sh, [T], heads=False, dynamics=False, shared=False),
    "steering": lambda sh, T: steer_need(sh, [T], runs=2, steps=MAX_STEER_TOKENS),
}


def check_cost(sh: Shape, n: int, view: str, limits: LimitValues) -> None:
    """Refuse (413) a text of ``n`` tokens whose view would need more than ``limits`` allow, by the commands'
    rule (:func:`walklens.costs.refusal`): what it would need, and how many tokens fit."""
    cost = VIEW_COSTS.get(view)
    if cost is None:
        return
    message = refusal(
        cost(sh, n), limits, f"the {view} view of {n:,} tokens", fit_hint(functools.partial(cost, sh), limits, n)
    )
    if message:
        raise ApiError(message, 413)


def view_tokens(sh: Shape, limits: LimitValues) -> dict[str, int]:
    """The most tokens of a text each view reads for this model under ``limits`` (at most :data:`MAX_TOKENS`)."""
    return {view: tokens_that_fit(functools.partial(cost, sh), limits, MAX_TOKENS) for view, cost in VIEW_COSTS.items()}


# ---- reductions ------------------------------------------------------------------------------------------------


def block_for(rows: int, cols: int, cells: int | None = None, square: bool = False) -> int:
    """The smallest block b of positions such that the reduced map has at most ``cells`` (:data:`MAX_CELLS`) cells:
    columns are grouped by b (and rows too when ``square``: a [T, T] map, reduced by
    :func:`walklens.reports.html.block_mean`); the cost model's one rule, :func:`walklens.costs.block_for`."""
    return costs.block_for(rows, cols, MAX_CELLS if cells is None else cells, square=square)


def best_rank(r: torch.Tensor, b: int) -> torch.Tensor:
    """Ranks [R, C] (integers, -1: undefined) reduced to the best rank of each block of ``b`` columns; -1 where
    a whole block has none."""
    if b <= 1:
        return r
    big = float(2**40)
    z = column_min(torch.where(r < 0, big, r.double()), b)
    return torch.where(z >= big, -1, z).long()


def column_mean(x: torch.Tensor, b: int) -> torch.Tensor:
    """``x`` [R, C] reduced to its mean over blocks of ``b`` columns, NaN left out (NaN where a block has only
    NaN)."""
    if b <= 1:
        return x
    pad = (-x.shape[1]) % b
    return torch.nn.functional.pad(x.double(), (0, pad), value=float("nan")).reshape(x.shape[0], -1, b).nanmean(-1)


def by_blocks(doc: dict[str, Any], shape: tuple[int, int], b: int) -> dict[str, Any]:
    """A document whose [points, positions] maps (each tensor whose first two sizes are ``shape``) are reduced
    over blocks of ``b`` positions: integers (ranks) to the best rank of each block (:func:`best_rank`), floats
    to the block's mean (:func:`column_mean`), tensors of more dimensions to the first position of each block.
    Every other field is left whole."""
    if b <= 1:
        return doc
    out: dict[str, Any] = {}
    for name, v in doc.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 2 and tuple(v.shape[:2]) == tuple(shape):
            v = v[:, ::b] if v.dim() > 2 else column_mean(v, b) if v.is_floating_point() else best_rank(v, b)
        out[name] = v
    return out


def column_min(x: torch.Tensor, b: int) -> torch.Tensor:
    """``x`` [R, C] reduced to its minimum over blocks of ``b`` columns (the last block may be partial): the
    best rank among b positions.  Torch's max pooling (with ``ceil_mode``) does the work."""
    if b <= 1:
        return x
    return -torch.nn.functional.max_pool2d(-x.float()[None, None], (1, b), (1, b), ceil_mode=True)[0, 0]
