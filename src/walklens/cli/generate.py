"""``walklens generate PROMPT``: the decoding walk of generated (or teacher-forced) tokens (seed 000, sec. 2.1,
eqs. 10-15; the target path of A.1)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from ..base.numbers import COUNT, POSITIVE, POSITIVE_INT, PROBABILITY
from ..reports import generate as generate_report
from ..reports.html import show
from .common import add_model_args, add_output_args, add_text_args, load, read_text, seed_arg, write_json
from .limits import add_limit_args
from .terminal import Col, add_command, console, print_table, say, written

DESCRIPTION = """\
The decoding walk: generate from a prompt (greedy by default, 20 tokens) and record at every step the
decoding vector d_t (the final normed output), the probability and rank of the emitted token, its 10
nearest tokens, and how far and in which direction d_t moved. --target teacher-forces a continuation
instead and reports where the walk leaves the target's path (A.1). The prompt's forward pass (its
attention grows with the square of the prompt) is checked against --max-memory / --max-work first."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub, "generate", "the decoding walk: generate and record d_t, its neighbours, P and rank", DESCRIPTION
    )
    add_text_args(p, "prompt")
    add_model_args(p)
    add_output_args(p)
    p.add_argument("--max-new-tokens", type=COUNT.arg(), default=20, help="tokens to generate (default 20)")
    p.add_argument("--sample", action="store_true", help="sample from P_t instead of greedy decoding")
    p.add_argument("--seed", type=seed_arg, default=0, help="random seed for --sample (default 0)")
    p.add_argument(
        "--temperature",
        type=POSITIVE.arg(),
        default=1.0,
        help="sampling temperature, any positive number (default 1; one too small to tell the logits apart, such as "
        "1e-320, samples the most probable token)",
    )
    p.add_argument("--top-k", type=POSITIVE_INT.arg(), default=None, help="sample among the k most probable tokens")
    p.add_argument(
        "--top-p", type=PROBABILITY.arg(), default=None, help="nucleus sampling: smallest set with mass >= p"
    )
    p.add_argument(
        "--target", default=None, help="teacher-force this continuation and report where the walk leaves its path (A.1)"
    )
    p.add_argument("--k", type=POSITIVE_INT.arg(), default=10, help="nearest tokens recorded per step (default 10)")
    add_limit_args(p)
    p.set_defaults(func=run)


def _plan(lm: Any, prompt: str, target: str | None, args: argparse.Namespace) -> int:
    """Refuse, before the prompt's forward pass, a walk over the limits; the steps it will take."""
    from ..costs import fit_hint, generate_need, model_shape
    from .limits import check, check_context, text_tokens

    sh = model_shape(lm)
    T = text_tokens(lm, prompt, False)
    steps = args.max_new_tokens if target is None else len(lm.tokenizer(target, add_special_tokens=False)["input_ids"])
    check_context(lm, T, steps, "--max-new-tokens" if target is None else "--target")

    def need(t: int) -> Any:
        return generate_need(sh, t, steps=steps, k=args.k, json=bool(args.json), out=bool(args.out))

    check(
        need(T), args, f"a decoding walk from a prompt of {T} tokens ({steps} steps)", fit_hint(need, args, T, "prompt")
    )
    return steps


def streamed_cost(lm: Any, steps: int) -> str:
    """What generating ``steps`` tokens costs a model streamed layer by layer: each new token is one forward pass,
    which reads every layer from disk again (the key/value cache is counted in the memory check before)."""
    from ..costs import fmt_bytes
    from ..costs.calibration import rates

    layers = sum(lm.stream.file_bytes(p) for p in lm.stream.layers)
    rate = rates().disk_gbps
    per, total = f"{fmt_bytes(layers)}, ~{layers / rate / 1e9:.3g} s at {rate:.3g} GB/s", fmt_bytes(steps * layers)
    return f"streamed layer by layer: each new token reads the layers again ({per}); {steps} tokens read {total}"


def run(args: argparse.Namespace) -> int:
    from ..analyses.decoding import decoding_walk

    if args.k < 1:
        raise InputError(f"k must be a positive integer, not {args.k}")
    if args.max_new_tokens < 1 and args.target is None:
        raise InputError(f"max_new_tokens must be a positive integer, not {args.max_new_tokens}")
    prompt = read_text(args.prompt)
    target = read_text(args.target) if args.target is not None else None
    lm = load(args)
    steps = _plan(lm, prompt, target, args)
    if lm.stream is not None:
        say(console(args), streamed_cost(lm, steps))
    dw = decoding_walk(
        lm,
        prompt,
        max_new_tokens=args.max_new_tokens,
        sample=args.sample,
        seed=args.seed,
        target=target,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        k=args.k,
    )
    if args.json:
        write_json(args.json, generate_report.document(dw, lm.name))
    _print(args, lm.name, prompt, target, dw)
    if args.out:
        path = generate_report.build(dw, title=f"Decoding walk — {lm.name}").save(args.out)
        written(path)
    return 0


def _print(args: argparse.Namespace, model: str, prompt: str, target: str | None, dw: Any) -> None:
    """The walk on the terminal: one row per step (the token, its P and rank, whether it stays on the target path
    or is the greedy pick, |d_t|, the step, the nearest tokens), the output, and where it leaves the path."""
    con = console(args)
    title = f"{model}: decoding walk of {prompt[-60:]!r}" + (" (teacher-forced target)" if target else "")
    cols = [
        Col("step", justify="right"),
        Col("token"),
        Col("P", justify="right"),
        Col("rank", justify="right"),
        Col("in N(target)" if target else "greedy"),
        Col("|d_t|", justify="right"),
        Col("|Δd|", justify="right"),
        Col("angle°", justify="right"),
        Col("nearest tokens (P)", wrap=True),
    ]
    rows = []
    for i, tok in enumerate(dw.tokens):
        near = ", ".join(f"{show(s)} {float(p):.2f}" for s, p in zip(dw.top_tokens[i][:4], dw.top_probs[i][:4]))
        if dw.in_neighbourhood is not None:
            flag = "[green]yes[/green]" if bool(dw.in_neighbourhood[i]) else "[red]no[/red]"
        else:
            flag = escape("=" if int(dw.greedy_ids[i]) == int(dw.token_ids[i]) else show(dw.top_tokens[i][0]))
        rows.append(
            [
                str(i),
                escape(show(tok)),
                f"{float(dw.probs[i]):.3f}",
                str(int(dw.ranks[i])),
                flag,
                f"{float(dw.d_norm[i]):.1f}",
                f"{float(dw.step_length[i]):.1f}",
                f"{float(dw.step_angle[i]):.1f}",
                escape(near),
            ]
        )
    print_table(con, title, cols, rows, keys=2, short="decoding walk")
    say(con, f"output: {dw.text!r}")
    if target is not None:
        say(
            con,
            "the walk stays on the target path"
            if dw.left_path_at < 0
            else f"the walk leaves the target path at step {dw.left_path_at}",
        )
