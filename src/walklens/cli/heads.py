"""``walklens heads TEXT`` (per-head filters, the A.3 identity, attention maps, cluster & aggregate) and
``walklens kernels`` (position kernels and self-bias statistics) -- seed 000, sec. 2.2.1, A.2, A.3."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import InputError
from .common import add_model_args, add_output_args, add_text_args, load, read_text, write_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("heads", help="attention heads: A.3 identity, attention maps, cluster & aggregate, W_vo/W_qk")
    add_text_args(p)
    add_model_args(p)
    add_output_args(p)
    p.add_argument("--layer", type=int, default=-1, help="layer of the cluster & aggregate view (default: last)")
    p.add_argument("--position", type=int, default=-1, help="query position of the cluster view (default: last)")
    p.add_argument("--stack", default=None, help="T5: enc or dec for the cluster view (default: dec)")
    p.add_argument("--cross", action="store_true", help="T5: cluster view of the decoder's cross-attention")
    p.add_argument("--maps", metavar="LAYERS", default=None,
                   help="comma-separated layers whose attention maps go into the report (default: all)")
    p.add_argument("--kernels", action="store_true",
                   help="also add position kernels to the report (empirical for rotary/learned models: slower)")
    p.set_defaults(func=run_heads)

    k = sub.add_parser("kernels", help="position kernels of every head and self-bias fractions per stack (A.2)")
    add_model_args(k)
    add_output_args(k)
    k.add_argument("--method", choices=("auto", "weights", "empirical"), default="auto",
                   help="auto: from the weights for T5/ALiBi, else empirical")
    k.add_argument("--margin", type=float, default=0.1, help="classification margin in nats (default 0.1)")
    k.add_argument("--max-distance", type=int, default=None, help="largest |key - query| distance shown")
    k.add_argument("--samples", type=int, default=16, help="empirical: shuffled-token samples (default 16)")
    k.add_argument("--length", type=int, default=64, help="empirical: tokens per sample (default 64)")
    k.add_argument("--corpus", default=None, help="empirical: corpus text or @FILE (default: built-in prose)")
    k.add_argument("--seed", type=int, default=0)
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


def _kernels_json(pk: Any) -> dict[str, Any]:
    return {
        "model": pk.model_name, "scheme": pk.scheme, "units": pk.units, "estimator": pk.estimator,
        "notes": pk.notes, "margin": pk.margin, "fractions": pk.fractions(), "margin_sweep": pk.margin_sweep(),
        "alibi_slopes": pk.alibi_slopes, "alibi_scale": pk.alibi_scale,
        "stacks": [{"stack": s.stack, "causal": s.causal, "distances": s.distances, "layers": s.layers,
                    "values": s.values, "spread": s.spread, "ci95": s.ci95,
                    "labels": [[c.label for c in row] for row in s.classes]} for s in pk.stacks],
    }


def _print_kernels(pk: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"{pk.model_name}: position kernels ({pk.scheme}); self-bias fractions at margin {pk.margin:g}")
    cols = ["negative_self", "far_amplifying", "local", "flat"]
    t.add_column("stack")
    t.add_column("kernels")
    for c in cols:
        t.add_column(c)
    for s in pk.stacks:
        f = s.fractions()
        t.add_row(s.stack or "model", str(sum(len(r) for r in s.classes)), *[f"{f[c]:.1%}" for c in cols])
    con.print(t)
    sw = Table(title="negative self-bias / far-amplifying fractions by margin (nats)")
    sw.add_column("stack")
    margins = list(next(iter(pk.margin_sweep().values())).keys())
    for m in margins:
        sw.add_column(m)
    for st, per in pk.margin_sweep().items():
        sw.add_row(st, *[f"{per[m]['negative_self']:.0%} / {per[m]['far_amplifying']:.0%}" for m in margins])
    con.print(sw)
    con.print(pk.estimator, style="dim", markup=False)
    if pk.notes and pk.notes != pk.estimator:
        con.print(pk.notes, style="dim", markup=False)


def run_kernels(args: argparse.Namespace) -> int:
    from ..kernels import position_kernels

    if args.samples < 2 or args.length < 8:
        raise InputError("--samples must be >= 2 and --length >= 8")
    lm = load(args)
    pk = position_kernels(lm, method=args.method, margin=args.margin, max_distance=args.max_distance,
                          corpus=read_text(args.corpus) if args.corpus else None, samples=args.samples,
                          length=args.length, seed=args.seed)
    _print_kernels(pk)
    if args.json:
        write_json(args.json, _kernels_json(pk))
    if args.out:
        from ..reports.heads import add_kernels
        from ..reports.html import Report

        rep = Report(f"walklens kernels: {lm.name}", "position kernels and self-bias (seed 000, A.2, Figs. 6, 8)")
        path = add_kernels(rep, pk).save(args.out)
        print(f"report: {path}")
    return 0


def run_heads(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..attention import attention_identity, cluster_view, head_matrices, head_stats, self_mass

    lm = load(args)
    text = read_text(args.text)
    n = lm.n_layers
    if not -n <= args.layer < n:
        raise InputError(f"--layer {args.layer} out of range: the model has {n} layers")
    maps = _layers(args.maps, n)
    stack = args.stack or lm.adapter.stacks[-1].name
    if stack not in [s.name for s in lm.adapter.stacks]:
        raise InputError(f"{lm.name} has no stack {stack!r}; stacks: {[s.name for s in lm.adapter.stacks]}")
    if args.cross and not lm.adapter.stack(stack).cross_attn:
        raise InputError(f"{lm.name} has no cross-attention in stack {stack!r}")
    ident = attention_identity(lm, text, truncate=args.truncate)
    trace = ident.trace
    if trace is None:  # pragma: no cover - attention_identity always attaches its trace
        raise InputError("no trace was captured")
    tr = trace.encoder if (trace.encoder is not None and stack == lm.adapter.stacks[0].name
                           and len(lm.adapter.stacks) > 1) else trace
    hm = head_matrices(lm, args.layer, stack, args.cross)
    if not -len(tr.tokens) <= args.position < len(tr.tokens):
        raise InputError(f"--position {args.position} out of range for {len(tr.tokens)} tokens")
    views = [cluster_view(tr, hm, h, args.position) for h in range(hm.n_heads)]
    masses = {s.name or "model": self_mass(trace.encoder if (s is not lm.adapter.stacks[-1]) else trace,
                                           causal=s.causal) for s in lm.adapter.stacks}
    stats = {s.name or "model": head_stats(lm, s.name) for s in lm.adapter.stacks}

    con = Console()
    t = Table(title=f"{lm.name}: A.3 identity, max |error| per module (max {ident.max_error:.2g})")
    t.add_column("module")
    t.add_column("max |error|")
    t.add_column("max |output|")
    for c in ident.checks:
        t.add_row(c.name, f"{c.max_abs_error:.2g}", f"{c.max_abs_output:.3g}")
    con.print(t)
    v0 = views[0]
    ct = Table(title=escape(f"cluster & aggregate: layer {hm.layer} {v0.kind}, query {v0.position} "
                            f"{tr.tokens[v0.position]!r}"))
    for col in ("head", "self mass", "foreign mass", "|centroid - x_t|", "cos(x_t, centroid)", "top members"):
        ct.add_column(col)
    for v in views:
        ct.add_row(str(v.head), f"{v.self_mass:.3f}", f"{v.foreign_mass:.3f}", f"{v.move_distance:.3g}",
                   f"{v.cos_query_centroid:.3f}",
                   escape(", ".join(f"{t!r} {w:.2f}" for _, t, w in v.top_members[:3])))
    con.print(ct)
    for name, sm in masses.items():
        below = float((sm.ratio < 1).float().mean())
        con.print(f"{name}: heads whose mean self mass is below uniform attention: {below:.1%} "
                  f"of {sm.mass.numel()} (mean self mass {float(sm.mass.mean()):.3f}, uniform "
                  f"{float(sm.uniform.mean()):.3f})")

    if args.json:
        write_json(args.json, {
            "model": lm.name, "tokens": trace.tokens,
            "encoder_tokens": trace.encoder.tokens if trace.encoder is not None else None,
            "identity": dict(ident), "identity_max": ident.max_error,
            "identity_relative": {c.name: c.rel_error for c in ident.checks},
            "cluster": [{"layer": v.layer, "head": v.head, "position": v.position, "kind": v.kind,
                         "memberships": v.memberships, "self_mass": v.self_mass, "foreign_mass": v.foreign_mass,
                         "move_distance": v.move_distance, "foreign_distance": v.foreign_distance,
                         "cos_query_centroid": v.cos_query_centroid,
                         "head_output_norm": float(v.filtered_centroid.norm())} for v in views],
            "self_mass": {k: {"mass": v.mass, "uniform": v.uniform} for k, v in masses.items()},
            "head_stats": {k: {"vo_norm": v.vo_norm, "qk_norm": v.qk_norm, "vo_sigma1": v.vo_sigma1,
                               "vo_copying": v.vo_copying} for k, v in stats.items()},
            "attentions": {**{f"{trace.stack + '.' if trace.encoder is not None else ''}{k}": a
                              for k, a in trace.attentions.items()},
                           **({f"{trace.encoder.stack}.{k}": a for k, a in trace.encoder.attentions.items()}
                              if trace.encoder is not None else {})},
        })
    if args.out:
        from ..reports.heads import (add_attention_maps, add_cluster_views, add_head_stats, add_identity,
                                     add_kernels, add_self_mass)
        from ..reports.html import Report

        rep = Report(f"walklens heads: {lm.name}", f"text: {text[:200]!r}")
        add_identity(rep, ident)
        add_cluster_views(rep, views)
        if trace.encoder is not None:
            add_attention_maps(rep, trace.encoder.attentions, trace.encoder.tokens, title="encoder self-attention",
                               layers=maps)
            add_attention_maps(rep, trace.attentions, trace.tokens, title="decoder self-attention", layers=maps)
            add_attention_maps(rep, trace.attentions, trace.tokens, trace.encoder.tokens, kind="cross",
                               title="decoder cross-attention (keys: encoder output)", layers=maps)
        else:
            add_attention_maps(rep, trace.attentions, trace.tokens, layers=maps)
        for name, sm in masses.items():
            add_self_mass(rep, sm, title=f"self-attention mass ({name})")
        for name, st in stats.items():
            add_head_stats(rep, {"layers": [f"{name} L{l}" for l in st.layers], "vo_norm": st.vo_norm,
                                 "qk_norm": st.qk_norm, "vo_copying": st.vo_copying},
                           title=f"per-head filters W_vo,h and W_qk,h ({name}; factored, A.3)")
        scheme = lm.adapter.position_scheme(lm.config)
        if args.kernels or scheme in ("t5_relative", "alibi"):
            from ..kernels import position_kernels

            add_kernels(rep, position_kernels(lm))
        path = rep.save(args.out)
        print(f"report: {path}")
    return 0
