"""``walklens heads TEXT``: per-head filters, the A.3 identity, attention maps, cluster & aggregate -- seed 000,
sec. 2.2.1, A.3."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from ..reports import heads as heads_report
from .common import add_model_args, add_output_args, add_text_args, load, read_text, write_json
from .limits import add_limit_args
from .terminal import Col, add_command, console, print_table, say

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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub, "heads", "attention heads: A.3 identity, attention maps, cluster & aggregate, W_vo/W_qk", HEADS_DESCRIPTION
    )
    add_text_args(p)
    add_model_args(p)
    add_output_args(p)
    p.add_argument(
        "--layer",
        type=int,
        default=None,
        help="the layer the terminal shows: its A.3 identity, its cluster & aggregate view and its copying heads "
        "(default: the last layer's view and copying heads, every layer's identity)",
    )
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
    from ..analyses.attention import attention_identity, cluster_view, head_matrices, head_stats

    lm = load(args)
    text = read_text(args.text)
    n = lm.n_layers
    chosen = args.layer is not None
    args.layer = -1 if args.layer is None else args.layer
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
    shown = [c for c in ident.checks if c.layer == hm.layer] if chosen else list(ident.checks)
    _print_heads(lm.name, (ident.max_error, shown), views, tr.tokens, hm.layer, masses, args)
    _print_copying(console(args), stats.get(stack or "model"), hm.layer)
    if args.json:
        write_json(args.json, heads_report.document(ident, views, masses, stats, lm.name, layers=maps))
    if args.out:
        pk = None
        if args.kernels or lm.adapter.position_scheme(lm.config) in ("t5_relative", "alibi"):
            from ..analyses.kernels import position_kernels

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
    from ..analyses.attention import self_mass

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


COPIES = 0.5  #: a head copies when its W_vo copying score is above this (negates: below minus this)


def _print_copying(con: Any, stats: Any, layer: int) -> None:
    """Which heads of ``layer`` copy (W_vo copying score > :data:`COPIES`) and which negate (< -COPIES)."""
    if stats is None or layer not in stats.layers:
        return
    row = stats.vo_copying[stats.layers.index(layer)].tolist()
    copy = [f"h{h} ({v:+.2f})" for h, v in sorted(enumerate(row), key=lambda hv: -hv[1]) if v > COPIES]
    neg = [f"h{h} ({v:+.2f})" for h, v in sorted(enumerate(row), key=lambda hv: hv[1]) if v < -COPIES]
    say(
        con,
        f"layer {layer}: heads that copy (W_vo copying score > {COPIES}; +1 copies what it attends to, -1 negates "
        f"it): {', '.join(copy) or 'none'}; heads that negate (< -{COPIES}): {', '.join(neg) or 'none'}",
    )


def _print_heads(
    model: str, ident: Any, views: Any, tokens: Any, layer: int, masses: Any, args: argparse.Namespace
) -> None:
    """The A.3 errors (``ident``: the largest error and the checks to show), the cluster view of every head and
    the share of heads below uniform self mass."""
    con = console(args)
    max_error, checks = ident
    print_table(
        con,
        f"{model}: A.3 identity, max |error| per module (max {max_error:.2g} over every layer)",
        ["module", "max |error|", "max |output|"],
        [[escape(c.name), f"{c.max_abs_error:.2g}", f"{c.max_abs_output:.3g}"] for c in checks],
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
