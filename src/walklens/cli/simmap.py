"""``walklens simmap TEXT``: similarity maps between every pair of positions (seed 000, Figs. 3, 11, 12).

``walklens simmap --example grading --out DIR`` reproduces the kind of maps of the paper on its own few-shot
grading prompt (A.4), shipped with walklens as ``examples/grading_prompt.txt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from importlib import resources
from typing import Any

from rich.markup import escape

from ..analyses.walks import Metric
from ..base.errors import InputError
from ..reports import simmap as simmap_report
from .common import add_model_args, add_output_args, load, read_text, seed_arg, write_json
from .limits import add_limit_args
from .terminal import add_command, console, print_table, written

EXAMPLES = {"grading": "grading_prompt.txt"}

DESCRIPTION = """\
Similarity maps between every pair of positions of a text, at any captured point.

By default: three points (V, the token embedding rows; the middle layer's resid_post; final), each with
the dot product and the cosine (6 maps of T x T). The report draws each map with at most 250,000 cells:
a longer text's maps show means over b x b blocks of positions (a note says so; --json keeps every value),
and b grows until the page fits --max-output. A --json file of T x T numbers per map, or memory or work
over --max-memory / --max-work, is refused before anything is computed."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub, "simmap", "similarity maps of token vectors at any captured point (Figs. 3, 11, 12)", DESCRIPTION
    )
    p.add_argument("text", nargs="?", help="the text (use @FILE to read it from a file)")
    p.add_argument(
        "text_b",
        nargs="?",
        help="a second text to compare: each map of both texts side by side on one colour scale (@FILE too)",
    )
    p.add_argument("--example", choices=sorted(EXAMPLES), help="use a bundled text (grading: the A.4 prompt)")
    p.add_argument("--truncate", action="store_true", help="cut a text longer than the model's context")
    add_model_args(p)
    add_output_args(p)
    p.add_argument(
        "--point",
        action="append",
        default=None,
        help="captured point, or V for the embedding rows (repeatable; default: V, the middle "
        "layer's resid_post and final)",
    )
    p.add_argument("--metric", choices=("dot", "cosine", "both"), default="both", help="default both")
    p.add_argument(
        "--normed",
        action="store_true",
        help="also show maps of vectors passed through the model's final norm (the paper's layer-normed maps)",
    )
    p.add_argument(
        "--blocks",
        metavar="FILE",
        help="write each map's block contrast (within- vs between-class similarity of numbers, brackets, "
        "separators and words, with a permutation test and a bootstrap interval) to this JSON file",
    )
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of --blocks' shuffles and resamples (default 0)")
    add_limit_args(p)
    p.set_defaults(func=run)


def example_text(name: str) -> str:
    """The text of a bundled example (``grading``: the few-shot grading prompt of seed 000, A.4)."""
    if name not in EXAMPLES:
        raise InputError(f"no example {name!r}; examples: {', '.join(sorted(EXAMPLES))}")
    return resources.files("walklens").joinpath("examples", EXAMPLES[name]).read_text(encoding="utf-8")


def _plan(lm: Any, text: str, args: argparse.Namespace, points: list[str], n_maps: int) -> int:
    """Check the limits before capturing; returns the block size b of the report's maps (b x b positions
    averaged per cell, 1 = every position), chosen so that each map has at most HEATMAP_CELLS cells and the
    page fits --max-output."""
    from ..core.capture import point_names
    from ..costs import MB, fit_hint, model_shape, simmap_need
    from .limits import block_size, check, note, text_tokens

    names = point_names(lm.adapter.stacks[-1], lm.adapter.residual_kind(lm.config), lm.n_layers)
    for p in points:
        if p != "V" and p not in names:  # the same message as Trace.point_index, before any work
            raise InputError(f"no captured point {p!r}; captured: {', '.join(names[:8])} ...")
    sh = model_shape(lm)
    T = text_tokens(lm, text, args.truncate)
    captured = len({p for p in points if p != "V"} | {"final"})

    def need(t: int, b: int) -> Any:
        return simmap_need(sh, t, maps=n_maps, captured=captured, block=b, json=bool(args.json), out=bool(args.out))

    b = block_size(T, T, per_col=1) if args.out else 1
    while args.out and -(-T // b) > 16 and need(T, b).files["--out index.html"] > args.max_output * MB:
        b += 1
    hint = "fewer --point / --metric maps" + ("; --json holds T x T numbers per map" if args.json else "")
    check(
        need(T, b),
        args,
        f"simmap over {T} tokens x {n_maps} maps",
        f"{hint}; {fit_hint(lambda t: need(t, block_size(t, t, per_col=1) if args.out else 1), args, T)}",
    )
    if b > 1:
        side = -(-T // b)
        note(
            f"simmap: the report's {T} x {T} maps show means over blocks of {b} x {b} positions "
            f"({side} x {side} cells){'; --json holds every value' if args.json else ''}"
        )
    return b


def _check_blocks(args: argparse.Namespace) -> None:
    """``--blocks FILE``: a writable regular file, not standard output and not another output of the command."""
    from ..base.outputs import check_file, check_not_inputs
    from .common import command_inputs

    check_file(args.blocks, "--blocks")
    check_not_inputs(args.blocks, "--blocks", command_inputs(args))
    others = [x for x in (args.json,) if x and x != "-"]
    if any(os.path.realpath(args.blocks) == os.path.realpath(x) for x in others):
        raise InputError("--blocks: the same file as --json")


def _write_blocks(
    args: argparse.Namespace, maps: dict[str, Any], tokens: list[str], ids: list[int], model: str
) -> None:
    """Each map's :func:`walklens.analyses.association.block_contrast` over the tokens' classes, pairs of two copies
    of one
    token left out, as one JSON document."""
    from ..analyses.association import CLASS_RULES, block_contrast, token_classes

    classes = token_classes(tokens)
    doc = {
        "kind": "similarity_blocks",
        "model": model,
        "example": args.example,
        "tokens": tokens,
        "classes": classes,
        "rules": CLASS_RULES,
        "maps": {
            k: dataclasses.asdict(
                block_contrast(m.plain(), classes, same=ids, name=k, model_name=model, seed=args.seed)
            )
            for k, m in maps.items()
        },
    }
    written(write_json(args.blocks, doc))


def _maps(
    lm: Any, trace: Any, points: list[str], metrics: tuple[Metric, ...], normeds: tuple[bool, ...]
) -> dict[str, Any]:
    """Every map of ``trace`` by its key (:func:`walklens.reports.simmap.key`)."""
    from ..analyses.walks import similarity_map

    return {
        simmap_report.key(p, metric, normed): similarity_map(trace, p, metric=metric, normed=normed)
        for p in points
        for normed in normeds
        for metric in metrics
    }


def _compare(args: argparse.Namespace) -> int:
    """``walklens simmap TEXT_A TEXT_B``: both texts' maps, side by side on one colour scale per map."""
    from ..core.capture import capture

    if args.blocks:
        raise InputError("--blocks reads one text: drop it, or the second text")
    texts = (read_text(args.text), read_text(args.text_b))
    lm = load(args)
    points = args.point or ["V", f"L{lm.n_layers // 2}.resid_post", "final"]
    metrics: tuple[Metric, ...] = ("dot", "cosine") if args.metric == "both" else (args.metric,)
    normeds = (False, True) if args.normed else (False,)
    n_maps = len(points) * len(metrics) * len(normeds)
    for text in texts:
        _plan(lm, text, args, points, n_maps)
    traces = [capture(lm, t, truncate=args.truncate, points=[p for p in points if p != "V"]) for t in texts]
    maps = [_maps(lm, tr, points, metrics, normeds) for tr in traces]
    if args.json:
        docs = [simmap_report.document(m, tr.tokens, tr.token_ids, lm.name, t) for m, tr, t in zip(maps, traces, texts)]
        write_json(args.json, {"model": lm.name, "compared": docs})
    rows = []
    for key in maps[0]:
        lo, hi, _ = simmap_report.shared_range(maps[0][key].plain(), maps[1][key].plain())
        for name, m in zip("AB", (maps[0][key], maps[1][key])):
            T = m.shape[0]
            off = (m.sum() - m.diagonal().sum()) / max(1, T * T - T)
            rows.append(
                [
                    escape(f"{name} {key}"),
                    f"{float(m.min()):.4g}",
                    f"{float(m.max()):.4g}",
                    f"{float(off):.4g}",
                    f"{lo:.4g} .. {hi:.4g}",
                ]
            )
    print_table(
        console(args),
        f"{lm.name}: similarity maps of A ({len(traces[0].tokens)} tokens) and B ({len(traces[1].tokens)} tokens)",
        ["map", "min", "max", "mean off-diagonal", "one colour scale"],
        rows,
    )
    if args.out:
        rep = simmap_report.build_pair(
            {k: m.plain() for k, m in maps[0].items()},
            traces[0].tokens,
            {k: m.plain() for k, m in maps[1].items()},
            traces[1].tokens,
            title=f"Similarity maps compared — {lm.name}",
            subtitle=f"A: {texts[0][:150]!r}; B: {texts[1][:150]!r}",
        )
        written(rep.save(args.out))
    return 0


def run(args: argparse.Namespace) -> int:
    from ..analyses.walks import similarity_map
    from ..core.capture import capture

    if (args.text is None) == (args.example is None):
        raise InputError("give either a TEXT or --example NAME")
    if args.text_b is not None:
        return _compare(args)
    text = example_text(args.example) if args.example else read_text(args.text)
    if args.blocks:
        _check_blocks(args)
    lm = load(args)
    points = args.point or ["V", f"L{lm.n_layers // 2}.resid_post", "final"]
    metrics: tuple[Metric, ...] = ("dot", "cosine") if args.metric == "both" else (args.metric,)
    normeds = (False, True) if args.normed else (False,)
    b = _plan(lm, text, args, points, len(points) * len(metrics) * len(normeds))
    trace = capture(lm, text, truncate=args.truncate, points=[p for p in points if p != "V"])
    maps = {}
    for p in points:
        for normed in normeds:
            for metric in metrics:
                maps[simmap_report.key(p, metric, normed)] = similarity_map(trace, p, metric=metric, normed=normed)
    if args.json:
        write_json(args.json, simmap_report.document(maps, trace.tokens, trace.token_ids, lm.name, text))
    if args.blocks:
        _write_blocks(args, maps, trace.tokens, [int(i) for i in trace.token_ids], lm.name)
    rows = []
    for key, m in maps.items():
        T = m.shape[0]
        off = (m.sum() - m.diagonal().sum()) / max(1, T * T - T)
        rows.append([escape(key), f"{float(m.min()):.4g}", f"{float(m.max()):.4g}", f"{float(off):.4g}"])
    print_table(
        console(args),
        f"{lm.name}: similarity maps over {len(trace.tokens)} tokens",
        ["map", "min", "max", "mean off-diagonal"],
        rows,
    )
    if args.out:
        sub = f"{len(trace.tokens)} tokens" + (f"; example: {args.example}" if args.example else "")
        rep = simmap_report.build(maps, trace.tokens, title=f"Similarity maps — {lm.name}", subtitle=sub, block=b)
        path = rep.save(args.out)
        written(path)
    return 0
