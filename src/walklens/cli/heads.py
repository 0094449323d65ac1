"""``walklens heads TEXT`` (per-head filters, the A.3 identity, attention maps, cluster & aggregate) and
``walklens kernels`` (position kernels and self-bias statistics) -- seed 000, sec. 2.2.1, A.2, A.3."""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from rich.markup import escape

from ..errors import InputError, ReducedWarning
from ..reports import heads as heads_report
from ..reports import kernels as kernels_report
from .common import add_model_args, add_output_args, add_text_args, finite_arg, load, read_text, seed_arg, write_json
from .limits import add_limit_args
from .terminal import Col, ParagraphHelp, console, print_table, say

MAX_DISTANCE = 65536  # largest --max-distance (the window of distances; the model's context bounds it further)

HEADS_DESCRIPTION = """\
Attention heads of a text: the A.3 identity on every attention module, every layer's attention maps, the
cluster & aggregate view of one layer at one query position, self-attention mass and per-head W_vo / W_qk.

By default every layer and every head is computed; the cluster view is the last layer at the last position.
The A.3 check keeps every layer's attention probabilities (layers x heads x T x T floats), so memory grows
with the square of the text: a text over --max-memory is refused before anything is computed, saying how
many tokens fit. The report draws each layer's maps with at most 250,000 cells (a longer text's maps show
means over b x b blocks of positions) and, without --maps, as many layers (evenly spaced, first and last
included) as fit --max-output, with a note. --json holds the attention of every layer (of the --maps
layers when given); a JSON over --max-output is refused."""

KERNELS_DESCRIPTION = """\
Position kernels of every head and the fraction of heads with negative self-bias (A.2). T5 and ALiBi
kernels are read from the weights; other models are measured empirically on 16 shuffled samples of 64
tokens (--samples, --length), 4 samples per forward pass, every layer and head. Memory and work grow with
--length squared and are checked against --max-memory / --max-work before anything is computed."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "heads",
        help="attention heads: A.3 identity, attention maps, cluster & aggregate, W_vo/W_qk",
        description=HEADS_DESCRIPTION,
        formatter_class=ParagraphHelp,
    )
    add_text_args(p)
    add_model_args(p)
    add_output_args(p)
    p.add_argument("--layer", type=int, default=-1, help="layer of the cluster & aggregate view (default: last)")
    p.add_argument("--position", type=int, default=-1, help="query position of the cluster view (default: last)")
    p.add_argument("--stack", default=None, help="T5: enc or dec for the cluster view (default: dec)")
    p.add_argument("--cross", action="store_true", help="T5: cluster view of the decoder's cross-attention")
    p.add_argument(
        "--maps",
        metavar="LAYERS",
        default=None,
        help="comma-separated layers whose attention maps go into the report and the JSON "
        "(default: all; the report keeps as many as fit --max-output)",
    )
    p.add_argument(
        "--kernels",
        action="store_true",
        help="also add position kernels to the report (empirical for rotary/learned models: slower)",
    )
    add_limit_args(p)
    p.set_defaults(func=run_heads)

    k = sub.add_parser(
        "kernels",
        help="position kernels of every head and self-bias fractions per stack (A.2)",
        description=KERNELS_DESCRIPTION,
        formatter_class=ParagraphHelp,
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


def _layers(spec: str | None, n: int) -> list[int] | None:
    """Parse ``--maps 0,5,-1`` into layer indices (negative counts from the top)."""
    if spec is None:
        return None
    out = []
    for part in spec.split(","):
        try:
            v = int(part)
        except ValueError:
            raise InputError(f"--maps wants comma-separated layer numbers, got {spec!r}") from None
        if not -n <= v < n:
            raise InputError(f"--maps: layer {v} out of range: the model has {n} layers")
        out.append(v % n)
    return out


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
    from ..experiments.stats import above_band
    from ..selfbias import self_bias_count

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
    from ..capture import context_limit
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
    from ..kernels import position_kernels

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


def _plan_heads(lm: Any, text: str, args: argparse.Namespace, maps: list[int] | None) -> tuple[int, list[int], int]:
    """Check the limits before the forward pass; returns the report's block size b (b x b positions
    averaged per cell), the layers whose maps it draws and the number of tokens."""
    from ..costs import MB, fit_hint, heads_need, model_shape
    from .limits import HEATMAP_CELLS, block_size, check, note, spread, text_tokens

    sh = model_shape(lm)
    n = lm.n_layers
    T = text_tokens(lm, text, args.truncate)
    json_layers = len(maps) if maps is not None else n
    page = "--out index.html"

    def need(t: int, layers: int) -> Any:
        b = block_size(t, t, HEATMAP_CELLS, per_col=sh.heads) if args.out else 1
        return heads_need(
            sh, t, json_layers=json_layers, map_layers=layers, block=b, json=bool(args.json), out=bool(args.out)
        )

    layers = maps if maps is not None else list(range(n))
    if args.out and maps is None:
        k = n
        while k > 1 and need(T, k).files[page] > args.max_output * MB:
            k -= 1
        layers = spread(n, k)
    hint = [fit_hint(lambda t: need(t, len(layers)), args, T)]
    if args.json or maps is not None:
        hint.insert(0, "--maps LAYERS keeps fewer layers' attention in the JSON and the report")
    check(
        need(T, len(layers)),
        args,
        f"heads over {T} tokens (the A.3 check keeps {n} layers x {sh.heads} heads x {T}x{T} attention probabilities)",
        "; ".join(hint),
    )
    b = block_size(T, T, HEATMAP_CELLS, per_col=sh.heads) if args.out else 1
    if args.out and (b > 1 or len(layers) < n):
        which = f"{len(layers)} of {n} layers ({', '.join(map(str, layers))})" if len(layers) < n else "every layer"
        note(
            f"heads: the report draws the attention maps of {which}"
            + (f" as means over blocks of {b} x {b} positions" if b > 1 else "")
            + ("; --maps LAYERS chooses the layers" if maps is None else "")
        )
    return b, layers, T


def run_heads(args: argparse.Namespace) -> int:
    from ..attention import attention_identity, cluster_view, head_matrices, head_stats

    lm = load(args)
    text = read_text(args.text)
    n = lm.n_layers
    if not -n <= args.layer < n:
        raise InputError(f"--layer {args.layer} out of range: the model has {n} layers")
    maps = _layers(args.maps, n)
    stack = _stack(lm, args)
    b, map_layers, T = _plan_heads(lm, text, args, maps)
    if not -T <= args.position < T:  # before the forward pass
        raise InputError(f"--position {args.position} out of range for {T} tokens")
    ident = attention_identity(lm, text, truncate=args.truncate)
    trace = ident.trace
    if trace is None:  # pragma: no cover - attention_identity always attaches its trace
        raise InputError("no trace was captured")
    tr = (
        trace.encoder
        if (trace.encoder is not None and stack == lm.adapter.stacks[0].name and len(lm.adapter.stacks) > 1)
        else trace
    )
    hm = head_matrices(lm, args.layer, stack, args.cross)
    if not -len(tr.tokens) <= args.position < len(tr.tokens):
        raise InputError(f"--position {args.position} out of range for {len(tr.tokens)} tokens")
    views = [cluster_view(tr, hm, h, args.position) for h in range(hm.n_heads)]
    masses = _self_masses(lm, trace, len(tr.tokens))
    stats = {s.name or "model": head_stats(lm, s.name) for s in lm.adapter.stacks}
    _print_heads(lm.name, ident, views, tr.tokens, hm.layer, masses, args)
    if args.json:
        write_json(args.json, heads_report.document(ident, views, masses, stats, lm.name, layers=maps))
    if args.out:
        pk = None
        if args.kernels or lm.adapter.position_scheme(lm.config) in ("t5_relative", "alibi"):
            from ..kernels import position_kernels

            pk = position_kernels(lm)
        rep = heads_report.build(
            ident,
            views,
            masses,
            stats,
            f"walklens heads: {lm.name}",
            f"text: {text[:200]!r}",
            block=b,
            layers=map_layers,
            kernels=pk,
        )
        say(console(args), f"report: {rep.save(args.out)}")
    return 0


def _stack(lm: Any, args: argparse.Namespace) -> str:
    """The stack --stack names (default: the last), checked to exist and, with --cross, to have cross-attention."""
    stack: str = args.stack or lm.adapter.stacks[-1].name
    if stack not in [s.name for s in lm.adapter.stacks]:
        raise InputError(f"{lm.name} has no stack {stack!r}; stacks: {[s.name for s in lm.adapter.stacks]}")
    if args.cross and not lm.adapter.stack(stack).cross_attn:
        raise InputError(f"{lm.name} has no cross-attention in stack {stack!r}")
    return stack


def _self_masses(lm: Any, trace: Any, n_tokens: int) -> dict[str, Any]:
    """The self-attention mass of every stack, and with the attention-sink control (position 0 removed) where the
    stack read has at least 3 tokens (``n_tokens``)."""
    from ..attention import self_mass

    return {
        (s.name or "model") + (", position 0 removed" if sink else ""): self_mass(
            trace.encoder if (s is not lm.adapter.stacks[-1] and trace.encoder is not None) else trace,
            causal=s.causal,
            sink=sink,
        )
        for sink in (False, True)
        for s in lm.adapter.stacks
        if not sink or n_tokens >= 3
    }


def _print_heads(
    model: str, ident: Any, views: Any, tokens: Any, layer: int, masses: Any, args: argparse.Namespace
) -> None:
    """The A.3 errors, the cluster view of every head and the share of heads below uniform self mass."""
    con = console(args)
    print_table(
        con,
        f"{model}: A.3 identity, max |error| per module (max {ident.max_error:.2g})",
        ["module", "max |error|", "max |output|"],
        [[escape(c.name), f"{c.max_abs_error:.2g}", f"{c.max_abs_output:.3g}"] for c in ident.checks],
    )
    v0 = views[0]
    rows = [
        [
            str(v.head),
            f"{v.self_mass:.3f}",
            f"{v.foreign_mass:.3f}",
            f"{v.move_distance:.3g}",
            f"{v.cos_query_centroid:.3f}",
            escape(", ".join(f"{t!r} {w:.2f}" for _, t, w in v.top_members[:3])),
        ]
        for v in views
    ]
    print_table(
        con,
        f"cluster & aggregate: layer {layer} {v0.kind}, query {v0.position} {tokens[v0.position]!r}",
        [
            Col("head", justify="right"),
            "self mass",
            "foreign mass",
            "|centroid - x_t|",
            "cos(x_t, centroid)",
            Col("top members", wrap=True),
        ],
        rows,
        short="cluster & aggregate",
    )
    for name, sm in masses.items():
        below = float((sm.ratio < 1).float().mean())
        say(
            con,
            f"{name}: heads whose mean self mass is below uniform attention: {below:.1%} of {sm.mass.numel()} "
            f"(mean self mass {float(sm.mass.mean()):.3f}, uniform {float(sm.uniform.mean()):.3f})",
        )
