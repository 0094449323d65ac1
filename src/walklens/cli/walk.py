"""``walklens walk TEXT``: the encoding walk of every position (seed 000, sec. 2.2.2, Fig. 9, A.2).

Prints the nearest token of each position at every layer and where w_{t+1} overtakes w_t; ``--json`` writes
every number, ``--out DIR`` a self-contained HTML report with PNG figures, ``--trace-dir DIR`` the captured points
(a trace folder, written point by point as the forward pass computes them; a rerun resumes an interrupted one).
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from ..base.outputs import check_dir, check_not_inputs
from ..reports import walk as walk_report
from ..reports.html import show
from .common import add_model_args, add_output_args, add_text_args, command_inputs, load, read_text, write_json
from .limits import add_limit_args
from .terminal import Col, add_command, console, print_table, written

MAX_TERMINAL_COLS = 12
MAX_TERMINAL_ROWS = 64
RESIDUAL = ("resid_pre", "resid_mid", "resid_cross", "resid_post")
POST = ("embed", "L*.resid_post", "final")  # the narrowest default: the stream after each layer
READING = {"none": "raw", "final": "lens"}

DESCRIPTION = """\
The encoding walk of every position: its vector at each captured point read against the token vectors.

By default every captured point is read (embed; per layer resid_pre, attn_out, resid_mid, mlp_out,
resid_post; final), in both readings (raw vectors against V, and the final norm + the model's head), with
the 10 nearest tokens. When that would exceed --max-work, --max-memory or --max-output, the default narrows
to the residual points, then to embed, L*.resid_post and final, with a note on stderr; an explicit --points
is refused instead, naming what would fit. The terminal shows the first 12 positions at embed, every
resid_post and final (tables wrapped to the terminal's width) and the first 64 positions' escape points;
--json holds every number, --out a report of the first 96 positions."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "walk", "the encoding walk of a text: nearest tokens, ranks and escape layers", DESCRIPTION)
    add_text_args(p)
    add_model_args(p)
    add_output_args(p)
    p.add_argument("--k", type=int, default=10, help="nearest tokens kept per point and position (default 10)")
    p.add_argument("--metric", choices=("dot", "cosine"), default="dot", help="similarity (default dot, eq. 13)")
    p.add_argument(
        "--norm",
        choices=("none", "final", "both"),
        default="both",
        help="none: raw vectors against V (the papers' reading); final: final norm + the model's head "
        "(logit lens); both (default)",
    )
    p.add_argument(
        "--points", default=None, help="'all' captured points (default), 'residual', or comma-separated glob patterns"
    )
    p.add_argument(
        "--self-rank",
        action="store_true",
        help="instead of the walk: does each stack's output x_t stay near its own token w_t (A.2, Fig. 9)? The "
        "rank and cosine of w_t among the token vectors, against another position's token (seeded control)",
    )
    p.add_argument(
        "--trace-dir",
        metavar="DIR",
        default=None,
        help="also write every captured point to this folder as the forward pass computes it (safetensors shards "
        "and a manifest; memory holds one point at a time; rerun to resume an interrupted capture; docs/scale.md)",
    )
    p.add_argument(
        "--target",
        metavar="TOKEN",
        default=None,
        help="a token to follow at the last position (its text, e.g. ' Paris', one token): the layer where it first "
        "becomes top-1 and stays, in each reading, with its rank at every layer; shown first",
    )
    add_limit_args(p)
    p.set_defaults(func=run)


def _check_trace_dir(args: argparse.Namespace) -> None:
    """``--trace-dir``, before any model loads: a folder that is (or can be made) writable, and no input."""
    if args.trace_dir:
        check_dir(args.trace_dir, "--trace-dir")
        check_not_inputs(args.trace_dir, "--trace-dir", command_inputs(args))


def _short(point: str | None) -> str:
    """``L26.resid_post`` -> ``L26 post`` for narrow terminals; None -> ``-``."""
    if point is None:
        return "-"
    return point.replace(".resid_", " ")


def _selected(names: list[str], spec: Any) -> list[str]:
    """The point names a --points value selects (as :func:`walklens.analyses.walks.encoding_walk` does)."""
    if spec == "all":
        return names
    if spec == "residual":
        return [n for n in names if n in ("embed", "final") or n.split(".", 1)[-1] in RESIDUAL]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in spec)]


def _plan(lm: Any, text: str, args: argparse.Namespace, points: Any) -> tuple[Any, Any]:
    """Check the limits before capturing: (points to read, patterns to capture).  The default (all points)
    narrows to the residual points, then to :data:`POST`, with a note; anything else over a limit is refused."""
    from ..core.capture import point_names
    from ..costs import WalkPlan, fit_hint, model_shape, walk_need
    from .limits import check, note, text_tokens

    sh = model_shape(lm)  # with the token rows the walk holds
    T = text_tokens(lm, text, args.truncate)
    names = point_names(lm.adapter.stacks[-1], lm.adapter.residual_kind(lm.config), lm.n_layers)
    readings = 2 if args.norm == "both" else 1

    def need(spec: Any, t: int = T) -> Any:
        sel = _selected(names, spec)
        shown = [n for n in sel if n in ("embed", "final") or n.split(".", 1)[-1] in RESIDUAL[1:]] or sel
        captured = len(names) if spec == "all" else len(set(sel) | {"final"})
        plan = WalkPlan(points=len(sel), captured=captured, shown=len(shown), k=args.k, readings=readings)
        return walk_need(sh, t, plan, json=bool(args.json), out=bool(args.out))

    default = args.points is None  # only the default narrows; an explicit --points all is refused instead
    chosen = points
    if default and not need("all").fits(args):
        chosen = "residual" if need("residual").fits(args) else list(POST)
        if need(chosen).fits(args):
            what = "the residual points" if chosen == "residual" else "embed, L*.resid_post and final"
            note(
                f"walk: all {len(names)} points of {T} tokens would need {' and '.join(need('all').over(args))}; "
                f"reading {what} ({len(_selected(names, chosen))} points) instead"
            )
    sel = _selected(names, chosen)
    hints = []
    if chosen not in ("residual", list(POST)) and len(_selected(names, list(POST))) < len(sel):
        hints.append(f"--points '{','.join(POST)}' reads {len(_selected(names, list(POST)))} points")
    if readings == 2:
        hints.append("--norm final reads once")
    if args.json and args.k > 1:
        hints.append("a smaller --k shrinks the JSON")
    hints.append(fit_hint(lambda t: need(chosen, t), args, T))
    what = f"walk over {T} tokens x {len(sel)} points" + (
        f" (the default narrowed from all {len(names)})" if default and chosen != "all" else ""
    )
    check(need(chosen), args, what, "; ".join(hints))
    capture_points = None if chosen == "all" or not sel else sorted(set(sel) | {"final"}, key=names.index)
    return chosen, capture_points


def _terminal(walks: dict[str, Any], labels: dict[int, str], model: str, args: argparse.Namespace) -> None:
    """The walk on the terminal: the nearest token of each position at each layer, and per position the rank and
    P of w_t+1 and its escape points in every reading."""
    con = console(args)
    main_key = "final" if "final" in walks else next(iter(walks))
    w = walks[main_key]
    T = len(w.tokens)
    n = min(T, MAX_TERMINAL_COLS)
    _target_table(con, walks)
    _nearest_table(con, w, labels, model, main_key)
    _position_table(con, walks, w, main_key)
    if n < T:
        con.print(
            f"[dim](the nearest tokens of {n} of {T} positions, the escape points of "
            f"{min(T, MAX_TERMINAL_ROWS)}; --json / --out hold all of them)[/dim]"
        )


def _target_table(con: Any, walks: dict[str, Any]) -> None:
    """The target's answer first: in each reading the point where it becomes top-1 and stays, and its rank and P
    at embed, every resid_post and final."""
    answers = walk_report.targets_of(walks)
    if not answers:
        return
    a0 = answers[0]
    w = next(iter(walks.values()))
    for a in answers:
        con.print(
            f"{show(a.token)!r} after {show(w.tokens[a.position])!r} (position {a.position}), "
            f"{READING.get(a.reading, a.reading)}: {a.said()}",
            markup=False,
        )
    rows = [i for i, p in enumerate(a0.points) if p in ("embed", "final") or p.endswith(".resid_post")]
    cols = [Col("point", style="bold")]
    for a in answers:
        r = READING.get(a.reading, a.reading)
        cols += [Col(f"rank ({r})", justify="right"), Col(f"P ({r})", justify="right")]
    grid = []
    for i in rows:
        cells = [_short(a0.points[i])]
        for a in answers:
            rank, prob = a.ranks[i], a.probs[i]
            cells += ["" if rank is None else str(rank), "" if prob != prob else f"{prob:.3f}"]
        grid.append(cells)
    print_table(con, f"rank of {escape(show(a0.token))!r} at each layer (0 = top-1)", cols, grid, short="target")


def _nearest_table(con: Any, w: Any, labels: dict[int, str], model: str, main_key: str) -> None:
    """The nearest token of each position (at most :data:`MAX_TERMINAL_COLS`) at each residual point of ``w``
    (at most 40): green where it is w_t+1, dim where it is w_t."""
    T = len(w.tokens)
    n = min(T, MAX_TERMINAL_COLS)
    ids = w.token_ids.tolist()
    rows = [i for i, p in enumerate(w.points) if p in ("embed", "final") or p.endswith(".resid_post")]
    rows = rows or list(range(len(w.points)))
    if len(rows) > 40:
        step = -(-len(rows) // 40)
        rows = rows[:1] + rows[1:-1:step] + rows[-1:]
    title = (
        f"{model}: nearest token at each layer ({'logit lens' if main_key == 'final' else 'raw, against V'}; "
        f"green = w_t+1, dim = w_t)"
    )
    cols = [Col("point", style="bold")] + [Col(escape(f"{t}:{show(w.tokens[t])}")) for t in range(n)]
    grid = []
    for i in rows:
        cells = [_short(w.points[i])]
        for t in range(n):
            top = int(w.top_ids[i, t, 0])
            s = escape(show(labels.get(top, str(top))))
            if t + 1 < T and top == ids[t + 1]:
                s = f"[green]{s}[/green]"
            elif top == ids[t]:
                s = f"[dim]{s}[/dim]"
            cells.append(s)
        grid.append(cells)
    print_table(con, title, cols, grid, short="nearest token")


def _position_table(con: Any, walks: dict[str, Any], w: Any, main_key: str) -> None:
    """Per position (at most :data:`MAX_TERMINAL_ROWS`): the rank and P of w_t+1 at the last point of ``w``, and
    where w_t+1 first outranks w_t and from where it stays ahead, in every reading of ``walks`` (A.2)."""
    T = len(w.tokens)
    fi = w.points.index("final") if "final" in w.points else len(w.points) - 1
    cols = [
        Col("t", justify="right"),
        Col("w_t"),
        Col("w_t+1"),
        Col("rank", justify="right"),
        Col("P", justify="right"),
    ]
    for k in walks:
        r = READING.get(k, k)
        cols += [Col(f"ahead ({r})"), Col(f"stays ({r})")]
    summary = []
    for t in range(min(T, MAX_TERMINAL_ROWS)):
        rn = int(w.rank_of_next[fi, t])
        esc = []
        for v in walks.values():
            esc += [_short(v.escape_names[t]), _short(v.escape_stable_names[t])]
        summary.append(
            [
                str(t),
                escape(show(w.tokens[t])),
                escape(show(w.tokens[t + 1])) if t + 1 < T else "",
                str(rn) if rn >= 0 else "",
                f"{float(w.prob_of_next[fi, t]):.3f}" if rn >= 0 else "",
                *esc,
            ]
        )
    print_table(
        con,
        f"per position: rank and P of w_t+1 at {w.points[fi]} ({READING.get(main_key, main_key)}); "
        f"ahead: where w_t+1 first outranks w_t (not where it becomes top-1: --target); stays: from where it "
        f"stays ahead of w_t (raw: against V; lens: final norm + head)",
        cols,
        summary,
        keys=2,
        short="per position",
    )


def _self_rank(args: argparse.Namespace) -> int:
    """``--self-rank``: the reading of :mod:`walklens.analyses.encoderself`, one line per stack, the JSON with
    --json."""
    from ..analyses.encoderself import self_ranks
    from ..core.capture import capture

    if args.out or args.points or args.trace_dir:
        raise InputError("--self-rank writes --json only: drop --out, --points and --trace-dir")
    text = read_text(args.text)
    lm = load(args)
    trace = capture(lm, text, truncate=args.truncate, points=["final"])
    if len(trace.tokens) < 2:
        raise InputError("--self-rank needs a text of at least 2 tokens")
    rows = self_ranks(trace, lm)
    con = console(args)
    if not lm.is_encoder_decoder:
        con.print(f"{lm.name} has no encoder stack: the decoder side only (Fig. 9's claim is the encoder's)")
    for r in rows:
        s = r.summary()
        con.print(
            f"{r.stack or 'model'}: own token median rank {s['median_rank_own']:g} of {r.vocab} (top-1 "
            f"{s['top1_own']:.0%}, cos {s['mean_cos_own']:.3f}); control {s['median_rank_control']:g} (cos "
            f"{s['mean_cos_control']:.3f}); own ahead at {r.closer:.0%} [{r.closer_lo:.0%}, {r.closer_hi:.0%}] of "
            f"{len(r.token_ids)} positions, sign test p={r.p:.2g}",
            markup=False,
        )
    if args.json:
        doc = {"model": lm.name, "text": text, "encoder_decoder": lm.is_encoder_decoder}
        write_json(args.json, doc | {"stacks": [{**vars(r), "summary": r.summary()} for r in rows]})
    return 0


def run(args: argparse.Namespace) -> int:
    from ..analyses.walks import encoding_walk
    from ..core.capture import capture
    from ..core.tracewrite import NamedFolder

    if args.k < 1:
        raise InputError(f"k must be a positive integer, not {args.k}")
    if args.self_rank:
        return _self_rank(args)
    text = read_text(args.text)
    spec = args.points or "all"
    points: Any = spec if spec in ("all", "residual") else [p.strip() for p in spec.split(",")]
    _check_trace_dir(args)
    lm = load(args)
    points, capture_points = _plan(lm, text, args, points)
    to = NamedFolder(args.trace_dir, "--trace-dir") if args.trace_dir else None
    trace = capture(lm, text, truncate=args.truncate, points=capture_points, to=to)
    norms = ("none", "final") if args.norm == "both" else (args.norm,)
    walks = {}
    for norm in sorted(norms, key=lambda n: n == "none"):  # lens first: an error both share is raised, no note
        try:
            walks[norm] = encoding_walk(
                trace, k=args.k, metric=args.metric, norm=norm, points=points, target=args.target
            )
        except InputError as e:
            if args.norm != "both" or norm != "none":
                raise
            sys.stderr.write(f"walklens: note: raw reading skipped: {e}\n")  # ALBERT: V lives in E-space
    walks = {n: walks[n] for n in norms if n in walks}
    labels = {i: t for w in walks.values() for i, t in w.labels.items()}  # decoded once, by encoding_walk
    if args.json:
        write_json(args.json, walk_report.document(walks, labels, lm.name, text))
    _terminal(walks, labels, lm.name, args)
    if args.out:
        rep = walk_report.build(
            walks,
            labels,
            title=f"Encoding walk — {lm.name}",
            subtitle=f"text: {text[:300]!r} ({len(trace.tokens)} tokens)",
        )
        path = rep.save(args.out)
        written(path)
    return 0
