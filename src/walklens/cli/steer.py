"""``walklens steer PROMPT... --toward T --layers L --alpha A``: activation addition (the default) or
eigen-steering (``--method eigen``, seed 002; its sign chosen on the prompts so that the target rises), with the
target's probability and rank, every prompt's continuation and its coherence as the steering card measures it;
with ``--card SET``, the steering card (run by :mod:`.steercard`)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from ..base.numbers import ALPHA, MAX_ALPHA, POSITIVE_INT, numbers_list, show
from ..costs import MAX_WORK_TFLOP
from ..reports import steer as steer_report
from .common import add_model_args, add_output_args, load, read_text, write_json
from .limits import add_limit_args
from .steercard import add_card_args, refuse_backend, run_card
from .terminal import Col, add_command, console, print_table, say

STEER_DESCRIPTION = """\
Activation addition (alpha u added to the residual at the layers' outputs; the default, the method the
steering card's held-out verdict favours) or, with --method eigen (or both), eigen-steering (a rank-one
edit of W_O along the target's direction, its sign chosen on the prompts so that the target's
log-probability rises): for each method, layer set, strength and prompt, the target's next-token
probability and rank, a greedy continuation (without cache, so every step is a forward pass over
prompt + continuation) and its coherence as the steering card measures it (KL of the next-token
distribution on neutral text, repeated 3-grams, distinct-2). The table shows the mean p(target), the
median rank and the mean coherence over the prompts (the report's curves the same statistics), then
every prompt's continuation. Work grows with runs x --max-new-tokens x the prompt's length and is
checked against --max-work (and --max-memory) first.

With --card SET (no prompts, no --toward): the steering card, eigen-steering next to activation
addition, mean-difference steering and projection ablation on one dose scale over a steering set's
held-out prompts, with bootstrap intervals (docs/power.md, "The steering card"). Its work grows with
cells x prompts x --max-new-tokens and is checked first against --max-work (100 TFLOP unless given:
a card runs for an hour or more and resumes) and --max-memory."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``walklens steer``: activation addition or eigen-steering, or the steering card (--card)."""
    s = add_command(
        sub, "steer", "activation addition or eigen-steering toward a token, with coherence", STEER_DESCRIPTION
    )
    s.add_argument("prompts", nargs="*", help="prompts (use @FILE to read one from a file); none with --card")
    s.add_argument(
        "--toward",
        help="target token or text (its first token is scored); mind the leading space, e.g. ' Paris'",
    )
    s.add_argument(
        "--layers",
        action="append",
        metavar="L",
        help="layers to steer: 12, 10,12 or 8-12; repeat the option to compare layer sets",
    )
    s.add_argument(
        "--alpha",
        default="0,2,4,8,16",
        help=f"comma-separated strengths (each within ±{MAX_ALPHA:g}); for eigen-steering a positive one moves "
        "toward the target (its sign chosen on the prompts), a negative one away",
    )
    s.add_argument(
        "--add-alpha", default=None, help="comma-separated strengths for activation addition (default: --alpha)"
    )
    s.add_argument(
        "--method",
        choices=("add", "eigen", "both"),
        default="add",
        help="add: activation addition (default); eigen: the seed's eigen-steering; both: side by side",
    )
    s.add_argument(
        "--max-new-tokens", type=POSITIVE_INT.arg(), default=None, help="continuation length (12; 16 with --card)"
    )
    s.add_argument(
        "--export-control-vector",
        metavar="FILE",
        default=None,
        help="also write the steering as a llama.cpp control vector (GGUF; docs/ecosystem.md): needs one "
        "--layers set (no layer 0), --method add or eigen and one strength; eigen exports the mean "
        "change of each layer's attention output over the prompts' tokens",
    )
    add_card_args(s)
    add_model_args(s)
    if "--no-progress" not in s._option_string_actions:  # the shared options may already hold it
        s.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_output_args(s)
    add_limit_args(s)
    s.set_defaults(func=run_steer, max_work=None)  # None: the sweep's default or the card's (run_steer)


Span = tuple[int, int]  # an inclusive range of layers as given (negative: from the top), never expanded here


def parse_layers(text: str) -> list[Span]:
    """``"12"``, ``"10,12"``, ``"8-12"`` (inclusive) or a mix, as (first, last) spans: parsed by arithmetic only,
    so ``0-999999999`` costs nothing before :func:`expand_layers` checks it against the model's depth."""
    out: list[Span] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise InputError(f"bad layer list {show(text)}: an empty item; use 12, 10,12 or 8-12")
        if len(part) > 40:
            raise InputError(f"bad layer list {show(text)}: use 12, 10,12 or 8-12")
        try:
            if "-" in part[1:]:
                cut = part.index("-", 1)
                out.append((int(part[:cut]), int(part[cut + 1 :])))
            else:
                out.append((int(part), int(part)))
        except ValueError:
            raise InputError(f"bad layer list {show(text)}: use 12, 10,12 or 8-12") from None
    return out


def expand_layers(spans: list[Span], n_layers: int, text: str) -> list[int]:
    """The layers of ``spans``, every end checked against the model's ``n_layers`` first (``-n_layers`` to
    ``n_layers - 1``), so an expansion never exceeds the model's depth per span."""
    for end in (x for span in spans for x in span):
        if not -n_layers <= end < n_layers:
            raise InputError(
                f"--layers {show(text)}: layer {end} out of range: the model has {n_layers} layers "
                f"(0 to {n_layers - 1}, or -{n_layers} to -1 from the top)"
            )
    out: list[int] = []
    for lo, hi in spans:
        a, b = lo % n_layers, hi % n_layers
        out.extend(range(a, b + 1) if a <= b else range(a, b - 1, -1))
    return out


def _plan_steer(lm: Any, prompts: list[str], runs: int, args: argparse.Namespace) -> None:
    """Refuse, before any computation, a steering sweep over the limits."""
    from ..costs import model_shape, steer_need, tokens_that_fit
    from .limits import check, check_context, text_tokens

    lengths = [text_tokens(lm, p, False) for p in prompts]
    check_context(lm, max(lengths), args.max_new_tokens, "--max-new-tokens")
    sh, files = model_shape(lm), {"json": bool(args.json), "out": bool(args.out)}
    need = steer_need(sh, lengths, runs=runs, steps=args.max_new_tokens, **files)
    if need.fits(args):
        return
    k = tokens_that_fit(lambda s: steer_need(sh, lengths, runs=runs, steps=s, **files), args, args.max_new_tokens)
    check(
        need,
        args,
        f"steering {len(prompts)} prompt(s) of up to {max(lengths)} tokens in {runs} runs of "
        f"{args.max_new_tokens} tokens each",
        (f"at most {k} new tokens fit (--max-new-tokens)" if k else "no --max-new-tokens fits")
        + "; or fewer --alpha / --add-alpha values, --layers sets or prompts, or shorter prompts",
    )


def _check_export(args: argparse.Namespace, alphas: list[float], add_alphas: list[float]) -> None:
    """``--export-control-vector FILE``, before the model loads: one steering to export, and a file that may be
    written and is no input (nor the --json file) of the command."""
    from ..base.outputs import check_file, check_not_inputs, same_file
    from .common import command_inputs

    path, label = args.export_control_vector, "--export-control-vector"
    grid = alphas if args.method == "eigen" else add_alphas
    if args.method == "both" or len(args.layers) != 1 or len(grid) != 1:
        raise InputError(
            f"{label} exports one steering: give --method add or eigen, one --layers set and one "
            f"strength ({'--alpha' if args.method == 'eigen' else '--add-alpha or --alpha'})"
        )
    check_file(path, label)
    check_not_inputs(path, label, command_inputs(args))
    if args.json and args.json != "-" and same_file(path, args.json):
        raise InputError(f"{label} {path}: is also the --json file")


def _export(lm: Any, args: argparse.Namespace, prompts: list[str], layers: list[int], alpha: float) -> None:
    """Write the one steering of the command as a llama.cpp control vector (after the layer check)."""
    from ..analyses.controlvectors import control_layers, control_vector, write_control_vector

    layers = control_layers(lm, layers)
    if args.method == "eigen" and alpha != 0:  # the sign the sweep steers with (a positive alpha raises the target)
        from ..analyses.steering import choose_sign, direction

        u, tid, _ = direction(lm, args.toward)
        alpha *= choose_sign(lm, layers, u, tid, abs(alpha), prompts, last=True)[0]
    cv = control_vector(lm, args.toward, layers, alpha, method=args.method, texts=prompts)
    path = write_control_vector(cv, args.export_control_vector, "--export-control-vector")
    along = f"; cosine with u {', '.join(f'{c:.4f}' for c in cv.along_u.values())}" if cv.along_u else ""
    say(
        console(args),
        f"control vector: {escape(str(path))} ({cv.method}, alpha {alpha:g}, direction."
        f"{','.join(map(str, cv.layers))}{along})",
    )


def run_steer(args: argparse.Namespace) -> int:
    from ..analyses.steering import steering_sweep

    spans = [parse_layers(v) for v in args.layers or []]
    if args.card is not None:
        return run_card(
            args,
            lambda lm: [l for sp, text in zip(spans, args.layers or []) for l in expand_layers(sp, lm.n_layers, text)],
        )
    refuse_backend(args)
    if args.max_work is None:
        args.max_work = MAX_WORK_TFLOP
    for given, name in ((args.prompts, "PROMPT"), (args.toward, "--toward"), (args.layers, "--layers")):
        if not given:
            raise InputError(f"steer needs {name} (or --card SET for the steering card)")
    args.max_new_tokens = args.max_new_tokens or 12
    prompts = [read_text(p) for p in args.prompts]
    alphas = numbers_list(args.alpha, ALPHA, "--alpha")
    add_alphas = numbers_list(args.add_alpha, ALPHA, "--add-alpha") if args.add_alpha is not None else alphas
    methods = ("eigen", "add") if args.method == "both" else (args.method,)
    if args.export_control_vector:
        _check_export(args, alphas, add_alphas)
    lm = load(args)
    sets = [expand_layers(sp, lm.n_layers, text) for sp, text in zip(spans, args.layers)]
    if args.export_control_vector:
        from ..analyses.controlvectors import control_layers

        control_layers(lm, sets[0])  # layer 0 refused before any computation
    _plan_steer(lm, prompts, sum(len(sets) * len(alphas if m == "eigen" else add_alphas) for m in methods), args)
    if args.export_control_vector:
        _export(lm, args, prompts, sets[0], (alphas if args.method == "eigen" else add_alphas)[0])
    sw = steering_sweep(
        lm,
        prompts,
        args.toward,
        sets,
        alphas,
        add_alphas=add_alphas,
        methods=methods,
        max_new_tokens=args.max_new_tokens,
        progress=not getattr(args, "no_progress", False),
    )
    con = console(args)
    _print_steering(con, lm.name, sw, len(prompts))
    _print_continuations(con, sw)
    if args.json:
        write_json(args.json, steer_report.document(sw))
    if args.out:
        say(con, f"report: {steer_report.build(sw).save(args.out)}")
    return 0


def _print_steering(con: Any, model: str, sw: Any, n_prompts: int) -> None:
    """The steering sweep's table: one row per method, layers and alpha, each column the statistic over the
    prompts that the report's curves draw (:data:`walklens.reports.steer.METRICS`: mean p, median rank, mean
    coherence), and eigen-steering's sign."""
    rows = []
    for m in sw.methods:
        for s in sw.layer_sets:
            curves = {metric: sw.curve(m, s, metric, stat)[1] for metric, _, stat in steer_report.METRICS}
            signs = steer_report.signs(sw, m, s)
            for i, a in enumerate(sw.curve(m, s)[0]):
                cells = [_cell(metric, curves[metric][i]) for metric, _, _ in steer_report.METRICS]
                rows.append([m, ",".join(map(str, s)), f"{a:g}", signs.get(a, ""), *cells])
    print_table(
        con,
        f"{model}: steering toward {sw.target_token!r} over {n_prompts} prompt(s)",
        [
            "method",
            "layers",
            Col("alpha", justify="right"),
            "sign",
            *(Col(f"{stat} {short}", justify="right") for _, short, stat in steer_report.COLUMNS),
        ],
        rows,
        keys=3,
        short="steering",
    )


def _cell(metric: str, v: float) -> str:
    """One statistic of the table, as the column reads it."""
    if not math.isfinite(v):
        return "nan"
    return f"{v:.0f}" if metric == "target_rank" else f"{v:.4f}" if metric == "target_prob" else f"{v:.2f}"


def _print_continuations(con: Any, sw: Any) -> None:
    """Every prompt's greedy continuation, per method, layers and alpha."""
    rows = [
        [r.method, ",".join(map(str, r.layers)), f"{r.alpha:g}", escape(repr(r.prompt)), escape(repr(r.text))]
        for r in sw.rows
    ]
    print_table(
        con,
        "continuations (greedy)",
        ["method", "layers", Col("alpha", justify="right"), Col("prompt", wrap=True), Col("continuation", wrap=True)],
        rows,
        keys=3,
        short="continuations",
    )
