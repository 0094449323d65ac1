"""``walklens walk TEXT``: capture one forward pass and show, for every captured point, the nearest token of
each position (a plain table until the full encoding-walk view lands)."""

from __future__ import annotations

import argparse

import torch

from ..capture import capture
from .common import add_model_args, add_output_args, add_text_args, load, read_text, write_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("walk", help="the encoding walk of a text: nearest tokens at every captured point")
    add_text_args(p)
    add_model_args(p)
    add_output_args(p, out=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    lm = load(args)
    trace = capture(lm, read_text(args.text), truncate=args.truncate)
    V = lm.embedding_matrix().detach().float()
    table = Table(title=f"{lm.name}: top token (dot product with V) at each point")
    table.add_column("point")
    for t in trace.tokens:
        table.add_column(repr(t)[1:-1], overflow="fold")
    rows = {}
    for i, name in enumerate(trace.points):
        h = trace.hidden[i].float()
        top = (h @ V.T).argmax(-1) if h.shape[-1] == V.shape[-1] else torch.full((h.shape[0],), -1)
        toks = [lm.tokenizer.decode([int(j)]) if j >= 0 else "" for j in top]
        rows[name] = toks
        table.add_row(name, *[repr(s)[1:-1] for s in toks])
    Console().print(table)
    if args.json:
        write_json(args.json, {"model": lm.name, "tokens": trace.tokens, "points": trace.points, "top_tokens": rows})
    return 0
