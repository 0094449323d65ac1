"""``walklens generate PROMPT``: the decoding walk of generated (or teacher-forced) tokens (seed 000, sec. 2.1,
eqs. 10-15; the target path of A.1)."""

from __future__ import annotations

import argparse
import sys

from ..errors import InputError
from .common import add_model_args, add_output_args, add_text_args, load, read_text, write_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="the decoding walk: generate and record d_t, its neighbours, P and rank")
    add_text_args(p, "prompt")
    add_model_args(p)
    add_output_args(p)
    p.add_argument("--max-new-tokens", type=int, default=20, help="tokens to generate (default 20)")
    p.add_argument("--sample", action="store_true", help="sample from P_t instead of greedy decoding")
    p.add_argument("--seed", type=int, default=0, help="random seed for --sample (default 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most probable tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: smallest set with mass >= p")
    p.add_argument("--target", default=None,
                   help="teacher-force this continuation and report where the walk leaves its path (A.1)")
    p.add_argument("--k", type=int, default=10, help="nearest tokens recorded per step (default 10)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..reports.walks import show
    from ..walks import decoding_walk

    if args.k < 1:
        raise InputError(f"k must be a positive integer, not {args.k}")
    if args.max_new_tokens < 1 and args.target is None:
        raise InputError(f"max_new_tokens must be a positive integer, not {args.max_new_tokens}")
    prompt = read_text(args.prompt)
    target = read_text(args.target) if args.target is not None else None
    lm = load(args)
    dw = decoding_walk(lm, prompt, max_new_tokens=args.max_new_tokens, sample=args.sample, seed=args.seed,
                       target=target, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, k=args.k)
    if args.json:
        write_json(args.json, {"model": lm.name, **{f: getattr(dw, f) for f in dw.__dataclass_fields__},
                               "text": dw.text})
    con = Console()
    title = f"{lm.name}: decoding walk of {prompt[-60:]!r}" + (" (teacher-forced target)" if target else "")
    table = Table(title=title)
    for c in ("step", "token", "P", "rank", "in N(target)" if target else "greedy", "|d_t|", "|Δd|", "angle°",
              "nearest tokens (P)"):
        table.add_column(c, overflow="fold")
    for i, tok in enumerate(dw.tokens):
        near = ", ".join(f"{show(s)} {float(p):.2f}" for s, p in zip(dw.top_tokens[i][:4], dw.top_probs[i][:4]))
        if dw.in_neighbourhood is not None:
            flag = "[green]yes[/green]" if bool(dw.in_neighbourhood[i]) else "[red]no[/red]"
        else:
            flag = "=" if int(dw.greedy_ids[i]) == int(dw.token_ids[i]) else show(dw.top_tokens[i][0])
        table.add_row(str(i), show(tok).replace("[", r"\["), f"{float(dw.probs[i]):.3f}", str(int(dw.ranks[i])),
                      flag.replace("[", r"\[") if dw.in_neighbourhood is None else flag, f"{float(dw.d_norm[i]):.1f}",
                      f"{float(dw.step_length[i]):.1f}", f"{float(dw.step_angle[i]):.1f}",
                      near.replace("[", r"\["))
    con.print(table)
    con.print(f"output: {dw.text!r}", markup=False, highlight=False)
    if target is not None:
        con.print("the walk stays on the target path" if dw.left_path_at < 0 else
                  f"the walk leaves the target path at step {dw.left_path_at}", markup=False)
    if args.out:
        from ..reports.walks import decoding_walk_report

        path = decoding_walk_report(dw, title=f"Decoding walk — {lm.name}").save(args.out)
        sys.stderr.write(f"walklens: report written to {path}\n")
    return 0
