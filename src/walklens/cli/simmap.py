"""``walklens simmap TEXT``: similarity maps between every pair of positions (seed 000, Figs. 3, 11, 12).

``walklens simmap --example grading --out DIR`` reproduces the kind of maps of the paper on its own few-shot
grading prompt (A.4), shipped with walklens as ``examples/grading_prompt.txt``.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources

from ..errors import InputError
from .common import add_model_args, add_output_args, load, read_text, write_json

EXAMPLES = {"grading": "grading_prompt.txt"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simmap", help="similarity maps of token vectors at any captured point (Figs. 3, 11, 12)")
    p.add_argument("text", nargs="?", help="the text (use @FILE to read it from a file)")
    p.add_argument("--example", choices=sorted(EXAMPLES), help="use a bundled text (grading: the A.4 prompt)")
    p.add_argument("--truncate", action="store_true", help="cut a text longer than the model's context")
    add_model_args(p)
    add_output_args(p)
    p.add_argument("--point", action="append", default=None,
                   help="captured point, or V for the embedding rows (repeatable; default: V, the middle "
                        "layer's resid_post and final)")
    p.add_argument("--metric", choices=("dot", "cosine", "both"), default="both", help="default both")
    p.add_argument("--normed", action="store_true",
                   help="also show maps of vectors passed through the model's final norm (the paper's layer-normed maps)")
    p.set_defaults(func=run)


def example_text(name: str) -> str:
    """The text of a bundled example (``grading``: the few-shot grading prompt of seed 000, A.4)."""
    if name not in EXAMPLES:
        raise InputError(f"no example {name!r}; examples: {', '.join(sorted(EXAMPLES))}")
    return resources.files("walklens").joinpath("examples", EXAMPLES[name]).read_text(encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    from ..capture import capture
    from ..walks import similarity_map

    if (args.text is None) == (args.example is None):
        raise InputError("give either a TEXT or --example NAME")
    text = example_text(args.example) if args.example else read_text(args.text)
    lm = load(args)
    trace = capture(lm, text, truncate=args.truncate)
    points = args.point or ["V", f"L{trace.n_layers // 2}.resid_post", "final"]
    for p in points:
        if p != "V":
            trace.point_index(p)  # a clear error before any work
    metrics = ("dot", "cosine") if args.metric == "both" else (args.metric,)
    maps = {}
    for p in points:
        for normed in ((False, True) if args.normed else (False,)):
            for m in metrics:
                maps[f"{p}{'+norm' if normed else ''}/{m}"] = similarity_map(trace, p, metric=m, normed=normed)
    if args.json:
        write_json(args.json, {"model": lm.name, "text": text, "tokens": trace.tokens, "token_ids": trace.token_ids,
                               "maps": maps})
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{lm.name}: similarity maps over {len(trace.tokens)} tokens")
    for c in ("map", "min", "max", "mean off-diagonal"):
        table.add_column(c)
    for key, m in maps.items():
        T = m.shape[0]
        off = (m.sum() - m.diagonal().sum()) / max(1, T * T - T)
        table.add_row(key, f"{float(m.min()):.4g}", f"{float(m.max()):.4g}", f"{float(off):.4g}")
    Console().print(table)
    if args.out:
        from ..reports.walks import similarity_report

        rep = similarity_report(maps, trace.tokens, title=f"Similarity maps — {lm.name}",
                                subtitle=f"{len(trace.tokens)} tokens" + (f"; example: {args.example}" if args.example else ""))
        path = rep.save(args.out)
        sys.stderr.write(f"walklens: report written to {path}\n")
    return 0
