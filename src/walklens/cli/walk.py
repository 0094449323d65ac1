"""``walklens walk TEXT``: the encoding walk of every position (seed 000, sec. 2.2.2, Fig. 9, A.2).

Prints the nearest token of each position at every layer and where w_{t+1} overtakes w_t; ``--json`` writes
every number, ``--out DIR`` a self-contained HTML report with PNG figures.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import InputError
from .common import add_model_args, add_output_args, add_text_args, load, read_text, write_json

MAX_TERMINAL_COLS = 12


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("walk", help="the encoding walk of a text: nearest tokens, ranks and escape layers")
    add_text_args(p)
    add_model_args(p)
    add_output_args(p)
    p.add_argument("--k", type=int, default=10, help="nearest tokens kept per point and position (default 10)")
    p.add_argument("--metric", choices=("dot", "cosine"), default="dot", help="similarity (default dot, eq. 13)")
    p.add_argument("--norm", choices=("none", "final", "both"), default="both",
                   help="none: raw vectors against V (the papers' reading); final: final norm + the model's head "
                        "(logit lens); both (default)")
    p.add_argument("--points", default="all",
                   help="'all' captured points (default), 'residual', or comma-separated glob patterns")
    p.set_defaults(func=run)


def walk_json(walk: Any) -> dict[str, Any]:
    from .common import _jsonable

    d = _jsonable(walk)
    d["escape_names"] = walk.escape_names
    d["escape_stable_names"] = walk.escape_stable_names
    if walk.encoder is not None:
        d["encoder"] = walk_json(walk.encoder)
    return d


def _short(point: str | None) -> str:
    """``L26.resid_post`` -> ``L26 post`` for narrow terminals; None -> ``-``."""
    if point is None:
        return "-"
    return point.replace(".resid_", " ")


def _terminal(walks: dict[str, Any], labels: dict[int, str], model: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..reports.walks import show

    con = Console()
    main_key = "final" if "final" in walks else next(iter(walks))
    w = walks[main_key]
    T = len(w.tokens)
    n = min(T, MAX_TERMINAL_COLS)
    fi = w.points.index("final")
    ids = w.token_ids.tolist()
    rows = [i for i, p in enumerate(w.points) if p in ("embed", "final") or p.endswith(".resid_post")]
    if len(rows) > 40:
        step = -(-len(rows) // 40)
        rows = rows[:1] + rows[1:-1:step] + rows[-1:]
    title = (f"{model}: nearest token at each layer ({'logit lens' if main_key == 'final' else 'raw, against V'}; "
             f"green = w_t+1, dim = w_t)")
    table = Table(title=title, show_lines=False)
    table.add_column("point", style="bold", no_wrap=True)
    for t in range(n):
        table.add_column(f"{t}:{show(w.tokens[t])}", overflow="fold")
    for i in rows:
        cells = []
        for t in range(n):
            top = int(w.top_ids[i, t, 0])
            s = show(labels.get(top, str(top))).replace("[", r"\[")
            if t + 1 < T and top == ids[t + 1]:
                s = f"[green]{s}[/green]"
            elif top == ids[t]:
                s = f"[dim]{s}[/dim]"
            cells.append(s)
        table.add_row(w.points[i], *cells)
    con.print(table)
    summary = Table(title="per position: the next token at the top of the stack, the first point where w_t+1 "
                          "outranks w_t, and the point from which it stays ahead")
    cols = ["t", "w_t", "w_t+1", "rank w_t+1", "P(w_t+1)"]
    for k in walks:
        cols += [f"first ({k})", f"stays ({k})"]
    for c in cols:
        summary.add_column(c, no_wrap=c.startswith(("first", "stays")))
    for t in range(min(T, 64)):
        rn = int(w.rank_of_next[fi, t])
        esc = []
        for v in walks.values():
            esc += [_short(v.escape_names[t]), _short(v.escape_stable_names[t])]
        summary.add_row(str(t), show(w.tokens[t]).replace("[", r"\["),
                        show(w.tokens[t + 1]).replace("[", r"\[") if t + 1 < T else "",
                        str(rn) if rn >= 0 else "", f"{float(w.prob_of_next[fi, t]):.3f}" if rn >= 0 else "", *esc)
    con.print(summary)
    if n < T:
        con.print(f"[dim](showing {n} of {T} positions; --json / --out hold all of them)[/dim]")


def run(args: argparse.Namespace) -> int:
    from ..capture import capture
    from ..walks import encoding_walk, labels_for

    if args.k < 1:
        raise InputError(f"k must be a positive integer, not {args.k}")
    text = read_text(args.text)
    points: Any = args.points if args.points in ("all", "residual") else [p.strip() for p in args.points.split(",")]
    lm = load(args)
    trace = capture(lm, text, truncate=args.truncate)
    norms = ("none", "final") if args.norm == "both" else (args.norm,)
    walks = {}
    for norm in norms:
        try:
            walks[norm] = encoding_walk(trace, k=args.k, metric=args.metric, norm=norm, points=points)
        except InputError as e:
            if args.norm != "both" or norm != "none":
                raise
            sys.stderr.write(f"walklens: note: raw reading skipped: {e}\n")  # ALBERT: V lives in E-space
    ids = sorted(set().union(*[set(w.label_ids()) for w in walks.values()]))
    labels = labels_for(lm.tokenizer, ids)
    if args.json:
        write_json(args.json, {"model": lm.name, "text": text, "tokens": trace.tokens,
                               "token_ids": trace.token_ids, "labels": labels,
                               "walks": {k: walk_json(w) for k, w in walks.items()}})
    _terminal(walks, labels, lm.name)
    if args.out:
        from ..reports.walks import encoding_walk_report

        rep = encoding_walk_report(walks, labels, title=f"Encoding walk — {lm.name}",
                                   subtitle=f"text: {text[:300]!r} ({len(trace.tokens)} tokens)")
        path = rep.save(args.out)
        sys.stderr.write(f"walklens: report written to {path}\n")
    return 0
