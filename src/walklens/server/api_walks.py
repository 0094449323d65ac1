"""The walk views: the encoding walk heatmap and its cells, the decoding walk, the similarity map (seed 000,
sec. 2.1, 2.2.2, A.1, A.2; Figs. 3, 9, 11, 12).  The compare view asks :func:`walk` once per model.

Each route checks its arguments, then runs the analysis of :mod:`walklens.analyses.walks` /
:mod:`walklens.analyses.decoding` on a cached trace (:mod:`.traces`) and sends its result's document, the dict the
report module writes as
``--json`` (:mod:`walklens.reports.walk`, :mod:`~walklens.reports.generate`, :mod:`~walklens.reports.simmap`),
with the fields the page asks for (``fields``): ranks as integers (-1: undefined, the last position has no
next token), maps of at most :data:`~.bounds.MAX_CELLS` cells, top-k lists cut to the k asked.  The heatmap
needs the ranks of w_t and w_t+1 at every cell and P(w_t+1) at ``final`` only, so the walk is computed in two
parts, each once per (model, text, reading, metric) and kept: the rank maps of every point (:func:`get_walk`:
``k=0, probs=False``, the matrix products and rank counts and nothing else), and the full reading of one
point at every position (:func:`get_point`: :data:`~.bounds.MAX_K` nearest tokens, probabilities, cosines),
for ``final`` with the heatmap and for any other point on the first click on it.
Both are :func:`walklens.encoding_walk` itself, so a cell shows what the whole walk would.

The page paints at once, then exactly, piece by piece: it asks first with ``provisional: true`` and gets the rank
maps of the bfloat16 screen at every :data:`SCREEN_STRIDE`-th walk point and ``final`` (:func:`get_screen`,
``encoding_walk(screen=True)``: about 3x faster per point, not exact; ``point_index``: each row's index among the
walk's points), marked ``provisional``, unless the exact maps are already kept; then it asks for each piece of the
exact pass (``piece: n``; :func:`pieces_of`, :func:`get_piece`: a few consecutive points, each piece one job,
kept) and puts its rows in place; then for the whole walk, joined from the pieces kept (:func:`get_walk`,
:func:`walklens.analyses.walks.join_walks`), which brings the escape points.  The pieces are background jobs
(:func:`~.state.run_job`): a click waits for the piece in progress only, and reads its own point alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from starlette.requests import Request

from ..analyses.decoding import decoding_walk
from ..analyses.walks import (
    EncodingWalk,
    Metric,
    Norm,
    encoding_walk,
    join_walks,
    labels_for,
    similarity_map,
    walk_chunk_rows,
    walk_rows,
)
from ..reports import generate as generate_report
from ..reports import simmap as simmap_report
from ..reports import walk as walk_report
from ..reports.html import block_labels, block_mean
from .bounds import (
    MAX_K,
    MAX_NEW_TOKENS,
    MAX_TOKENS,
    ApiError,
    block_for,
    bool_arg,
    by_blocks,
    choice_arg,
    fields_arg,
    int_arg,
    pick,
    text_arg,
)
from .routing import api
from .state import Explorer, Job, run_job
from .traces import WALK_POINTS, n_tokens, trace

if TYPE_CHECKING:
    from ..core.trace import Trace


#: points of each piece of the exact pass (None: as many as one chunk of the walk's reading holds, so that a
#: piece is one of the chunks a one-shot walk reads: :func:`walklens.analyses.walks.point_aligned_chunks`)
PIECE_POINTS: int | None = None


def pieces_of(ex: Explorer, model: str, tr: Trace) -> list[range]:
    """The pieces of the exact pass over ``tr``'s points: consecutive points, each piece one job (one for the
    whole walk of an encoder-decoder model, whose encoder walk is read with it)."""
    P, T = len(tr.points), len(tr.tokens)
    if tr.encoder is not None:
        return [range(P)]
    n_vocab = int(ex.model(model).embedding_matrix().shape[0])
    g = PIECE_POINTS if PIECE_POINTS is not None else max(1, walk_chunk_rows(n_vocab) // T)
    return [range(i, min(i + g, P)) for i in range(0, P, g)]


def get_piece(
    ex: Explorer, job: Job, model: str, text: str, norm: Norm, metric: Metric, n: int
) -> tuple[EncodingWalk, list[int]]:
    """The exact ranks of the ``n``-th piece's points and their indices among the walk's points: read once (no
    top k, no probabilities) and kept with the other pieces of this walk until they are joined, or the rows of
    the whole walk when it is kept."""
    tr = trace(ex, job, model, text, WALK_POINTS, MAX_TOKENS, "walk")
    plan = pieces_of(ex, model, tr)
    if not 0 <= n < len(plan):
        raise ApiError(f"no piece {n}: the exact walk has {len(plan)} piece{'s' if len(plan) > 1 else ''}")
    rows = plan[n]
    whole = ex.results.peek((model, "walk", text, norm, metric))
    if whole is not None:
        return walk_rows(whole, rows.start, rows.stop), list(rows)
    return _piece(ex, job, tr, (model, text, norm, metric), rows, n), list(rows)


def _piece(ex: Explorer, job: Job, tr: Trace, args: tuple[str, str, Norm, Metric], rows: range, n: int) -> EncodingWalk:
    """The walk at the points ``rows`` (the n-th piece), read once and kept with the other pieces of its walk."""
    model, text, norm, metric = args
    kept: dict[int, EncodingWalk] = ex.results.get((model, "walk pieces", text, norm, metric), dict)
    if n not in kept:  # the pieces are read under the model's lock: never two at once
        names = [tr.points[i] for i in rows]
        kept[n] = encoding_walk(tr, k=0, metric=metric, norm=norm, points=names, probs=False, progress=False)
    job.check()
    return kept[n]


def get_walk(ex: Explorer, job: Job, model: str, text: str, norm: Norm, metric: Metric) -> EncodingWalk:
    """The ranks of the encoding walk of ``text`` at :data:`~.traces.WALK_POINTS` (no top k, no probabilities;
    cached): its pieces (:func:`get_piece`, those not kept read now) joined
    (:func:`walklens.analyses.walks.join_walks`)."""
    tr = trace(ex, job, model, text, WALK_POINTS, MAX_TOKENS, "walk")

    def join() -> EncodingWalk:
        plan = pieces_of(ex, model, tr)
        parts = [_piece(ex, job, tr, (model, text, norm, metric), rows, n) for n, rows in enumerate(plan)]
        return parts[0] if len(parts) == 1 else join_walks(tr, parts)

    w = ex.results.get((model, "walk", text, norm, metric), join)
    ex.results.drop((model, "walk pieces", text, norm, metric))  # the whole walk holds every piece's rows
    job.check()
    return w


SCREEN_STRIDE = 4  # the first paint screens every 4th walk point (and the last): a quarter of the rows


def screen_points(points: list[str]) -> list[int]:
    """The indices of the walk points the first paint screens: every :data:`SCREEN_STRIDE`-th and the last."""
    return sorted(set(range(0, len(points), SCREEN_STRIDE)) | {len(points) - 1})


def get_screen(ex: Explorer, job: Job, model: str, text: str, norm: Norm, metric: Metric) -> EncodingWalk:
    """The provisional ranks of the encoding walk of ``text`` at :func:`screen_points` from bfloat16 products
    (``screen=True``; cached)."""
    tr = trace(ex, job, model, text, WALK_POINTS, MAX_TOKENS, "walk")
    names = [tr.points[i] for i in screen_points(list(tr.points))]
    w = ex.results.get(
        (model, "walk screen", text, norm, metric),
        lambda: encoding_walk(
            tr, k=0, metric=metric, norm=norm, points=names, probs=False, progress=False, screen=True
        ),
    )
    job.check()
    return w


def get_point(ex: Explorer, job: Job, model: str, text: str, norm: Norm, metric: Metric, point: str) -> EncodingWalk:
    """The full encoding walk of ``text`` at one walk point (:data:`~.bounds.MAX_K` nearest tokens, probabilities,
    cosines, at every position; cached)."""
    tr = trace(ex, job, model, text, WALK_POINTS, MAX_TOKENS, "walk")
    w = ex.results.get(
        (model, "walk point", text, norm, metric, point),
        lambda: encoding_walk(tr, k=MAX_K, metric=metric, norm=norm, points=[point], progress=False),
    )
    job.check()
    return w


def _walk_args(ex: Explorer, body: dict[str, Any]) -> tuple[str, str, Norm, Metric]:
    text = text_arg(body)
    norm = cast(Norm, choice_arg(body, "norm", "none", ("none", "final")))
    metric = cast(Metric, choice_arg(body, "metric", "dot", ("dot", "cosine")))
    return ex.model_name(body.get("model")), text, norm, metric


#: fields of the walk's document that need every point (the escape points) or the point before (the steps): null
#: in a piece's reply, sent with the whole walk
WHOLE_ONLY = ("escape_point", "escape_stable", "escape_names", "escape_stable_names", "step_length", "step_angle")


@api
async def walk(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, norm: none|final, metric: dot|cosine, fields?}`` -> the document of the walk of rank maps
    (:func:`walklens.reports.walk.walk_document`; the view asks for the layer x position maps of rank(w_t) and
    rank(w_t+1) and the escape points), its [points, positions] maps reduced over ``block`` positions (a
    label per block in ``columns``); ``final``: the same fields read in full at ``final`` (every position,
    probabilities included: :func:`~walklens.reports.walk.point_document`); ``n_vocab``: the rows ranked.
    ``provisional: true``: the bfloat16 screen's maps (``"provisional": true``, ``final`` null, ``walk_points``:
    every point's name, ``pieces``: how many pieces the exact pass has) unless the exact ones are already kept;
    the exact reply has ``"provisional": false``.  ``piece: n``: the exact maps of the n-th piece's points only
    (:func:`piece_reply`)."""
    model, text, norm, metric = _walk_args(ex, body)
    fields = fields_arg(body)
    provisional = bool_arg(body, "provisional", False)
    if body.get("piece") is not None:
        n = int_arg(body, "piece", 0, 0, 10**6)
        return await run_job(
            request,
            ex,
            model,
            lambda job: piece_reply(ex, job, (model, text, norm, metric), n, fields),
            background=True,
        )

    def compute(job: Job) -> dict[str, Any]:
        screen = provisional and ex.results.peek((model, "walk", text, norm, metric)) is None
        w = (get_screen if screen else get_walk)(ex, job, model, text, norm, metric)
        tr = trace(ex, job, model, text, WALK_POINTS, MAX_TOKENS, "walk")
        P, T = w.rank_of_input.shape
        b = block_for(len(tr.points), T)  # the whole walk's: a provisional row is replaced by an exact one
        final = None
        if not screen:
            fin = walk_report.point_document(get_point(ex, job, model, text, norm, metric, "final"), 0)
            final = {f: v for f, v in fin.items() if fields is None or f in fields}
        more = {"walk_points": list(tr.points), "pieces": len(pieces_of(ex, model, tr))} if screen else {}
        return {
            **_head(ex, model, w, b),
            **by_blocks(pick(walk_report.walk_document(w), fields), (P, T), b),
            "final": final,
            "provisional": screen,
            "point_index": screen_points(list(tr.points)) if screen else None,
            **more,
        }

    return await run_job(request, ex, model, compute)


def _head(ex: Explorer, model: str, w: EncodingWalk, b: int) -> dict[str, Any]:
    return {
        "model": model,
        "n_vocab": int(ex.model(model).embedding_matrix().shape[0]),
        "block": b,
        "columns": block_labels(w.tokens, b),
    }


def piece_reply(
    ex: Explorer, job: Job, args: tuple[str, str, Norm, Metric], n: int, fields: list[str] | None
) -> dict[str, Any]:
    """The reply to ``{..., piece: n}``: the exact maps of the n-th piece's points (:func:`get_piece`), reduced
    by the whole walk's blocks, ``point_index`` their indices among the walk's points, ``pieces`` the number of
    pieces; the fields in :data:`WHOLE_ONLY` null (they come with the whole walk, asked for after the last
    piece and joined from the pieces kept)."""
    model, text, norm, metric = args
    w, rows = get_piece(ex, job, model, text, norm, metric, n)
    tr = trace(ex, job, model, text, WALK_POINTS, MAX_TOKENS, "walk")
    T = len(tr.tokens)
    b = block_for(len(tr.points), T)
    doc = {f: None if f in WHOLE_ONLY else v for f, v in pick(walk_report.walk_document(w), fields).items()}
    return {
        **_head(ex, model, w, b),
        **by_blocks(doc, (len(rows), T), b),
        "final": None,
        "provisional": False,
        "point_index": rows,
        "piece": n,
        "pieces": len(pieces_of(ex, model, tr)),
    }


@api(exact=True)
async def walk_cell(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, norm, metric, point, position, k, fields?}`` -> the walk's document at one cell
    (:func:`walklens.reports.walk.cell_document`: the k nearest tokens with their scores, the ranks,
    probabilities and cosines of w_t and w_t+1 there, the position's escape points) and the ``labels`` of the
    nearest tokens' ids.  It reads the one point in full (:func:`get_point`), never the whole walk: the escape
    points, found over every point, are null until the exact walk is kept (the page asks again then)."""
    model, text, norm, metric = _walk_args(ex, body)
    lm = ex.model(model)
    p = int_arg(body, "point", None, 0, 10**6)
    t = int_arg(body, "position", None, 0, MAX_TOKENS - 1)
    k = int_arg(body, "k", 10, 1, MAX_K)
    fields = fields_arg(body)

    def compute(job: Job) -> dict[str, Any]:
        tr = trace(ex, job, model, text, WALK_POINTS, MAX_TOKENS, "walk")
        P, T = len(tr.points), len(tr.tokens)
        if p >= P or t >= T:
            raise ApiError(f"no cell ({p}, {t}): the walk has {P} points and {T} positions")
        c = get_point(ex, job, model, text, norm, metric, tr.points[p])
        w = ex.results.peek((model, "walk", text, norm, metric))
        if w is not None:
            doc = walk_report.cell_document(w, p, t, k, reading=c)  # the escape points are the map's (w)
        else:  # the cell's reading alone: the escape points need the whole walk
            doc = {**walk_report.cell_document(c, 0, t, k, reading=c), "escape_point": None, "escape_stable": None}
        ids = [int(i) for i in doc["top_ids"] if i >= 0]
        return pick({**doc, "labels": labels_for(lm.tokenizer, ids)}, fields)

    return await run_job(request, ex, model, compute)


@api(exact=True)
async def decode(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, max_new_tokens, target?, k, fields?}`` -> the decoding walk's document
    (:func:`walklens.reports.generate.document`, without the decoding vectors): per step the emitted token, its
    rank and probability, d_t's k nearest tokens with probabilities and its movement; with a target (teacher
    forcing, A.1) whether each d_t lies in the target token's neighbourhood."""
    model = ex.model_name(body.get("model"))
    lm = ex.model(model)
    prompt = text_arg(body)
    target = text_arg(body, "target", required=False) or None
    steps = int_arg(body, "max_new_tokens", 12, 1, MAX_NEW_TOKENS)
    k = int_arg(body, "k", 10, 1, MAX_K)
    fields = fields_arg(body)

    def compute(job: Job) -> dict[str, Any]:
        n_tokens(ex, model, prompt, MAX_TOKENS, "decoding")
        if target is not None:
            n_tokens(ex, model, target, MAX_NEW_TOKENS, "decoding target")
        dw = ex.results.get(
            (model, "decode", prompt, target, steps, k),
            lambda: decoding_walk(lm, prompt, max_new_tokens=steps, target=target, k=k, progress=False),
        )
        return pick(generate_report.document(dw, model, vectors=False), fields)

    return await run_job(request, ex, model, compute)


@api
async def simmap(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, point, metric, normed, fields?}`` -> the similarity report's document
    (:func:`walklens.reports.simmap.document`) of the one [tokens, tokens] map at a captured point (or ``V``),
    averaged over ``block`` x ``block`` positions when it has more than MAX_CELLS cells (``labels``: one per
    block)."""
    model = ex.model_name(body.get("model"))
    text = text_arg(body)
    point = body.get("point", "embed")
    if point != "V" and point not in ex.points[model]:
        raise ApiError("point must be V or a captured point of the model (see /api/info)")
    metric = cast(Metric, choice_arg(body, "metric", "cosine", ("dot", "cosine")))
    normed = bool_arg(body, "normed", False)
    fields = fields_arg(body)

    def compute(job: Job) -> dict[str, Any]:
        tr = trace(ex, job, model, text, ["embed" if point == "V" else point], MAX_TOKENS, "similarity map")
        S = similarity_map(tr, point, metric, normed)
        b = block_for(S.shape[0], S.shape[1], square=True)
        doc = simmap_report.document(
            {simmap_report.key(point, metric, normed): block_mean(S, b)}, tr.tokens, tr.token_ids, model, text
        )
        return {**pick(doc, fields), "block": b, "labels": block_labels(tr.tokens, b)}

    return await run_job(request, ex, model, compute)
