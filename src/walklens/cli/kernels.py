"""``walklens kernels``: position kernels of every head and self-bias statistics -- seed 000, A.2."""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from rich.markup import escape

from ..base.errors import InputError, ReducedWarning
from ..reports import kernels as kernels_report
from .common import add_model_args, add_output_args, finite_arg, load, read_text, seed_arg, write_json
from .limits import add_limit_args
from .terminal import add_command, console, print_table, say

MAX_DISTANCE = 65536  # largest --max-distance (the window of distances; the model's context bounds it further)

KERNELS_DESCRIPTION = """\
Position kernels of every head and the fraction of heads with negative self-bias (A.2). T5 and ALiBi
kernels are read from the weights; other models are measured empirically on 16 shuffled samples of 64
tokens (--samples, --length), 4 samples per forward pass, every layer and head. Memory and work grow with
--length squared and are checked against --max-memory / --max-work before anything is computed."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k = add_command(
        sub, "kernels", "position kernels of every head and self-bias fractions per stack (A.2)", KERNELS_DESCRIPTION
    )
    add_model_args(k)
    add_output_args(k)
    k.add_argument(
        "--method",
        choices=("auto", "weights", "empirical"),
        default="auto",
        help="auto: from the weights for T5/ALiBi, else empirical",
    )
    k.add_argument("--margin", type=finite_arg, default=0.1, help="classification margin in nats (default 0.1)")
    k.add_argument("--max-distance", type=int, default=None, help="largest |key - query| distance shown")
    k.add_argument("--samples", type=int, default=16, help="empirical: shuffled-token samples (default 16)")
    k.add_argument("--length", type=int, default=64, help="empirical: tokens per sample (default 64)")
    k.add_argument("--corpus", default=None, help="empirical: corpus text or @FILE (default: built-in prose)")
    k.add_argument("--seed", type=seed_arg, default=0)
    k.add_argument(
        "--sink-control",
        action="store_true",
        help="empirical: also fit the kernels with position 0 removed (rows renormalised) and count the heads "
        "with negative self-bias both ways, against chance",
    )
    add_limit_args(k)
    k.set_defaults(func=run_kernels)


def _print_kernels(pk: Any, args: argparse.Namespace) -> None:
    con = console(args)
    cols = ["negative_self", "far_amplifying", "local", "flat"]
    rows = []
    for s in pk.stacks:
        f = s.fractions()
        rows.append([escape(s.stack or "model"), str(sum(len(r) for r in s.classes)), *[f"{f[c]:.1%}" for c in cols]])
    print_table(
        con,
        f"{pk.model_name}: position kernels ({pk.scheme}); self-bias fractions at margin {pk.margin:g}",
        ["stack", "kernels", *cols],
        rows,
    )
    sweep = pk.margin_sweep()
    margins = list(next(iter(sweep.values())).keys())
    rows = [
        [escape(st), *[f"{per[m]['negative_self']:.0%} / {per[m]['far_amplifying']:.0%}" for m in margins]]
        for st, per in sweep.items()
    ]
    print_table(
        con,
        "negative self-bias / far-amplifying fractions by margin (nats)",
        ["stack", *[escape(str(m)) for m in margins]],
        rows,
        short="by margin",
    )
    con.print(pk.estimator, style="dim", markup=False)
    if pk.notes and pk.notes != pk.estimator:
        con.print(pk.notes, style="dim", markup=False)


def _self_bias(pk: Any, ctl: Any, args: argparse.Namespace) -> dict[str, list[Any]]:
    """The negative-self-bias counts of the empirical kernels, as measured and (``ctl``) with position 0
    removed, printed with the number expected by chance; ``{}`` for kernels read from the weights."""
    from ..analyses.chance import above_band
    from ..analyses.selfbias import self_bias_count

    out: dict[str, list[Any]] = {}
    for name, kernels in (("as measured", pk), ("position 0 removed", ctl)):
        if kernels is None or kernels.stacks[0].samples is None:
            continue
        out[name] = [self_bias_count(kernels, s.stack) for s in kernels.stacks]
        for c in out[name]:
            say(
                console(args),
                f"negative self-bias ({name}): {c.negative} of {c.heads} flagged at {c.margin:g} nats; "
                f"gap below zero (one-sided t, {c.alpha:g}): {above_band(c.significant, c.heads, c.alpha)}",
            )
    return out


def _plan_kernels(lm: Any, args: argparse.Namespace) -> None:
    """Refuse, before any forward pass, kernels whose memory, work or files exceed the limits."""
    from ..core.capture import context_limit
    from ..costs import kernels_need, model_shape
    from .limits import check

    sh = model_shape(lm)
    scheme = lm.adapter.position_scheme(lm.config)
    empirical = args.method == "empirical" or (args.method == "auto" and scheme not in ("t5_relative", "alibi"))
    limit = context_limit(lm)
    length = min(args.length, limit) if limit else args.length
    if empirical and length < args.length:
        warnings.warn(
            f"--length {args.length} is cut to the model's context: samples of {length} tokens",
            ReducedWarning,
            stacklevel=2,
        )
    window = args.max_distance or (
        max((length - 2) // 2 if sh.causal else (length - 1) // 4, 2) if empirical else 128
    )  # the analysis' defaults (kernels.empirical_kernels)
    widest = (length - 2 if sh.causal else (length - 1) // 2) if empirical else (limit or MAX_DISTANCE)
    if args.max_distance is None:
        window = min(window, widest)  # the default never exceeds what the model or the samples allow
    elif window > widest:
        raise InputError(
            f"--max-distance {window} is too large: at most {widest} "
            + (f"for samples of {length} tokens (a larger --length allows more)" if empirical else "for this model")
        )
    need = kernels_need(
        sh,
        samples=args.samples,
        length=length,
        window=window,
        json=bool(args.json),
        out=bool(args.out),
        empirical=empirical,
    )
    check(
        need,
        args,
        f"kernels over {args.samples} samples of {length} tokens",
        "a smaller --length (memory and work grow with its square) or fewer --samples (work)",
    )


def run_kernels(args: argparse.Namespace) -> int:
    from ..analyses.kernels import position_kernels

    if args.samples < 2 or args.length < 8:
        raise InputError("--samples must be >= 2 and --length >= 8")
    if args.margin < 0:
        raise InputError("--margin must be >= 0")
    if args.max_distance is not None and not 1 <= args.max_distance <= MAX_DISTANCE:
        raise InputError(f"--max-distance must be from 1 to {MAX_DISTANCE}, not {args.max_distance}")
    lm = load(args)
    _plan_kernels(lm, args)
    opts: dict[str, Any] = dict(
        method=args.method,
        margin=args.margin,
        max_distance=args.max_distance,
        corpus=read_text(args.corpus) if args.corpus else None,
        samples=args.samples,
        length=args.length,
        seed=args.seed,
    )
    ctl = position_kernels(lm, **opts, sink=True) if args.sink_control else None
    pk = position_kernels(lm, **opts)
    _print_kernels(pk, args)
    counts = _self_bias(pk, ctl, args)
    if args.json:
        write_json(args.json, kernels_report.document(pk) | ({"self_bias": counts} if counts else {}))
    if args.out:
        path = kernels_report.build(pk, f"walklens kernels: {lm.name}").save(args.out)
        say(console(args), f"report: {path}")
    return 0
