"""``walklens compact TEXT --budget K``: compact a text into K concept vectors (seed 000, footnote 11), show what
each vector stands for (its nearest tokens) and how well the model continues the text from the compacted form
versus the full one; and ``walklens hellaswag compaction``: the compression-retention curves (resumable,
docs/compaction.md).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from ..base.errors import InputError
from ..base.numbers import NumberError, Range
from ..base.records import read_json
from ..reports.html import show
from .common import (
    add_fewshot_seed_arg,
    add_model_args,
    check_db,
    check_outputs,
    count_arg,
    load,
    positive_arg,
    read_text,
    write_json,
)
from .terminal import Col, add_command, console, print_table, say

if TYPE_CHECKING:
    from ..lab.experiments.curves import CurveGrid

DESCRIPTION = """\
Compact TEXT into at most K concept vectors (seed 000, footnote 11): the tokens before the recent window are
cut into K segments (--bounds), each replaced by one vector (--method concept: the segment encoded on its own
at the --scheme's layer, word aggregation and norm; avgpool and drop are the baselines).

Prints each vector's segment and nearest tokens (read against the token embeddings V, as the encoding walk
reads a vector), then the per-token log-likelihood of a held-out continuation (--continuation, or the last
--holdout tokens of TEXT) after the full text and after the compacted one. --cache DIR keeps the segment
vectors in the concept cache shared with the sweep and Test 1."""


def _ratio(text: str) -> float:
    from ..analyses.compaction.spec import ratio_value

    r = ratio_value(text)
    if r is None:
        raise argparse.ArgumentTypeError(f"must be a number >= 1 (tokens per vector) or max, not {text[:40]!r}")
    return r


_count = count_arg  # a count that may be 0 (the shared range of walklens.base.numbers)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..analyses.compaction.core import BOUNDS, METHODS

    p = add_command(sub, "compact", "compact a text into K concept vectors and see what they keep", DESCRIPTION)
    p.add_argument("text", help="the text (use @FILE to read it from a file)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--budget", type=positive_arg, default=None, metavar="K", help="at most K vectors")
    size.add_argument(
        "--ratio",
        type=_ratio,
        default=None,
        metavar="R",
        help="compacted tokens per vector, or max for one vector (default 4 when --budget is not given)",
    )
    p.add_argument(
        "--scheme",
        default="standard",
        metavar="S",
        help="the A.6 scheme making each vector: 'standard' (layer=-1, word=w1mean) or key=value,... e.g. "
        "enc=sentence_level_segmentation,layer=middle,word=mean,norm=L2",
    )
    p.add_argument(
        "--bounds",
        choices=BOUNDS,
        default="sentence",
        help="even token runs, sentence starts near even cuts (default), or the scheme's own cut",
    )
    p.add_argument(
        "--method",
        choices=METHODS,
        default="concept",
        help="concept (default); avgpool: mean input embedding; drop: keep only the last K tokens",
    )
    p.add_argument("--recent", type=_count, default=0, metavar="R", help="keep the last R tokens verbatim (default 0)")
    p.add_argument(
        "--continuation",
        default=None,
        metavar="TEXT",
        help="held-out continuation scored after the text (default: the last --holdout tokens of TEXT)",
    )
    p.add_argument(
        "--holdout",
        type=positive_arg,
        default=None,
        metavar="N",
        help="tokens of TEXT held out as the continuation (default: a fifth)",
    )
    p.add_argument("--top", type=positive_arg, default=5, metavar="K", help="nearest tokens per vector (default 5)")
    p.add_argument("--metric", choices=("cosine", "dot"), default="cosine", help="similarity to V (default cosine)")
    p.add_argument("--cache", metavar="DIR", default=None, help="concept cache folder (shared with sweep and Test 1)")
    add_model_args(p)
    p.add_argument("--json", metavar="FILE", help="write the vectors' segments, neighbours and scores here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..analyses.compaction.explain import explain
    from ..analyses.concepts.cache import ConceptCache

    text, scheme, ratio = _explain_options(args)
    check_outputs(args)
    lm = load(args)
    cache = ConceptCache(args.cache) if args.cache else None
    try:
        rep = explain(
            lm,
            text,
            continuation=args.continuation,
            holdout=args.holdout,
            top=args.top,
            metric=args.metric,
            scheme=scheme,
            budget=args.budget,
            ratio=ratio,
            bounds=args.bounds,
            method=args.method,
            recent=args.recent,
            cache=cache,
        )
    finally:
        if cache is not None:
            cache.close()
    _print(rep, args)
    if args.json:
        write_json(args.json, _explain_document(lm.name, rep))
    return 0


def _explain_options(args: argparse.Namespace) -> tuple[str, Any, float | None]:
    """The text to compact, the scheme (None: the standard one) and the ratio (None: a budget or the scheme's
    own bounds), each checked before the model loads."""
    from ..analyses.concepts.schemes import Scheme

    text = read_text(args.text)
    if not text.strip():
        raise InputError("the text to compact is empty")
    if args.continuation is not None and args.holdout is not None:
        raise InputError("give --continuation or --holdout, not both")
    scheme = None if args.scheme == "standard" else Scheme.parse(args.scheme)
    if scheme is not None:
        scheme.validate(1, "decoder")
    if args.bounds == "scheme" and (args.budget is not None or args.ratio is not None or args.method != "concept"):
        raise InputError("--bounds scheme cuts where the scheme's encoding does: no --budget/--ratio, method concept")
    ratio = args.ratio if args.budget is None and args.bounds != "scheme" else None
    if ratio is None and args.budget is None and args.bounds != "scheme":
        ratio = 4.0
    return text, scheme, ratio


def _explain_document(model: str, rep: Any) -> dict[str, Any]:
    """The ``--json`` document: the vectors' spans, segments and nearest tokens, the scores, the vectors."""
    c = rep.compacted
    return {
        "model": model,
        "method": c.method,
        "bounds": c.bounds,
        "scheme": c.scheme,
        "k": c.k,
        "tokens": len(c.token_ids),
        "compacted_tokens": c.n_compacted,
        "recent": len(c.tail_ids),
        "ratio": c.ratio,
        "vectors": [
            {"span": list(s), "segment": t, "nearest": [list(n) for n in nb]}
            for s, t, nb in zip(c.spans, c.segments, rep.neighbours)
        ],
        "continuation": rep.continuation,
        "continuation_tokens": len(rep.continuation_ids),
        "full": rep.full,
        "compacted": rep.compact,
        "delta_per_token": rep.delta_per_token,
        "metric": rep.metric,
        "vector_values": c.vectors,
    }


def _print(rep: Any, args: argparse.Namespace) -> None:
    c = rep.compacted
    con = console(args)
    say(
        con,
        f"{c.model}: a context of {len(c.token_ids)} tokens (the next {len(rep.continuation_ids)} held out); "
        f"{c.n_compacted} compacted into {c.k} vectors ({c.ratio:.1f} tokens per vector), {len(c.tail_ids)} kept "
        f"verbatim; method {c.method}, bounds {c.bounds}" + (f"; {c.scheme}" if c.scheme else ""),
    )
    rows = [
        [
            str(i),
            f"{a}-{b}",
            escape(seg.replace("\n", " ").strip()),
            escape(" ".join(show(t).replace(" ", "\u2423") for t, _ in nb)),
        ]  # ␣: a space inside a token
        for i, ((a, b), seg, nb) in enumerate(zip(c.spans, c.segments, rep.neighbours))
    ]
    print_table(
        con,
        f"what each vector stands for (nearest tokens by {rep.metric}; \u2423 = space)",
        ["#", "tokens", Col("segment", wrap=True), Col("nearest tokens", wrap=True)],
        rows,
        keys=1,
    )
    fmt = "{:.4f}"
    rows = [
        [name, str(s.inputs), fmt.format(s.loglik), fmt.format(s.per_token), f"{math.exp(-s.per_token):.2f}"]
        for name, s in (("full", rep.full), ("compacted", rep.compact))
    ]
    print_table(
        con,
        f"held-out continuation ({len(rep.continuation_ids)} tokens)",
        [
            "context",
            Col("inputs", justify="right"),
            Col("log-lik", justify="right"),
            Col("per token", justify="right"),
            Col("ppl", justify="right"),
        ],
        rows,
    )
    say(con, f"per-token log-likelihood, compacted - full: {rep.delta_per_token:+.4f}")


# ---- walklens hellaswag compaction ---------------------------------------------------------------------------------


def register_hellaswag(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``walklens hellaswag compaction``: the compression-retention curves."""
    from ..lab.experiments.curves import DEFAULT_CANDIDATES, DEFAULT_RATIOS, DEFAULT_STRATEGIES

    p = sub.add_parser("compaction", help="compression-retention curves of context compaction (resumable)")
    add_model_args(p)
    p.add_argument(
        "--data",
        metavar="PATH",
        default=None,
        help="HellaSwag data (default: $WALKLENS_HELLASWAG, else the bundled validation set)",
    )
    p.add_argument(
        "--limit", type=positive_arg, default=1000, metavar="N", help="reported items: the first N (default 1000)"
    )
    p.add_argument(
        "--tune",
        type=_count,
        default=200,
        metavar="T",
        help="tuning items: the last T of the data, disjoint from the reported ones (default 200; 0: no tuning)",
    )
    p.add_argument("--shots", default="5,10", metavar="K,K", help="shot counts (default 5,10)")
    p.add_argument(
        "--what",
        default="examples,context",
        metavar="W,W",
        help="parts compacted: examples, context, both (default examples,context)",
    )
    p.add_argument(
        "--strategies",
        default=";".join(DEFAULT_STRATEGIES),
        metavar="S;S",
        help=f"compact-spec fragments, ';'-separated (default {';'.join(DEFAULT_STRATEGIES)}); the "
        f"avgpool and drop baselines always run",
    )
    p.add_argument(
        "--ratios",
        default=",".join("max" if math.isinf(r) else f"{r:g}" for r in DEFAULT_RATIOS),
        metavar="R,R",
        help="tokens per vector (default 2,4,8,16,32,max)",
    )
    p.add_argument(
        "--candidates",
        default=";".join(DEFAULT_CANDIDATES),
        metavar="C;C",
        help="layer=..,word=..[,norm=..] candidates tuned on the tuning items",
    )
    p.add_argument("--timing-items", type=_count, default=16, metavar="N", help="items timed per point (default 16)")
    add_fewshot_seed_arg(p)
    p.add_argument("--db", metavar="PATH", default=None, help="results database (resumes from it)")
    p.add_argument("--cache", metavar="DIR", default=None, help="concept cache folder")
    p.add_argument("--out", metavar="DIR", required=True, help="report folder: index.html, PNG, curves.csv/json")
    p.add_argument("--json", metavar="FILE", help="write every point here too")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run_curves)


def _list(text: str, sep: str, what: str) -> list[str]:
    out = [x.strip() for x in text.split(sep) if x.strip()]
    if not out:
        raise InputError(f"--{what} is empty")
    return out


def run_curves(args: argparse.Namespace) -> int:
    from ..analyses.concepts.cache import ConceptCache
    from ..base.outputs import make_dir
    from ..lab.experiments.curves import run_curves as curves
    from ..lab.experiments.runsetup import RunSetup
    from ..lab.hellaswag.data import data_id
    from ..lab.hellaswag.store import ResultStore
    from ..lab.reports.curves import build

    grid = _curve_grid(args)
    check_outputs(args)
    db = check_db(args.db)
    out_dir = make_dir(args.out, "--out")
    items, tune_items, pool = _curve_items(args, max(grid.shots))
    lm = load(args)
    timings, save_timings = _timings(out_dir / "timings.json")
    cache = ConceptCache(args.cache) if args.cache else None
    con = console(args, stderr=True)
    try:
        with ResultStore(db) as store:
            setup = RunSetup(
                pool=pool,
                fewshot_seed=args.seed,
                data=data_id(args.data),
                store=store,
                cache=cache,
                progress=not args.no_progress,
            )
            result = curves(
                lm,
                items,
                tune_items,
                setup,
                grid,
                timings=timings,
                on_timing=save_timings,
                log=lambda m: say(con, m),
            )
    finally:
        if cache is not None:
            cache.close()
    path = build(result).save(out_dir)
    _print_curves(args, lm.name, len(items), result)
    say(console(args), f"report: {path}")
    if args.json:
        write_json(args.json, result)
    return 0


def _curve_items(args: argparse.Namespace, shots: int) -> tuple[list[Any], list[Any], Any]:
    """The items scored (the first --limit), the items the strategies are tuned on (the last --tune) and the
    few-shot pool of ``shots`` examples at most."""
    from ..lab.hellaswag.data import fewshot_pool, load_hellaswag

    everything = load_hellaswag(args.data)
    if args.limit + args.tune > len(everything):
        raise InputError(f"--limit {args.limit} + --tune {args.tune} exceeds the {len(everything)} items")
    items = everything[: args.limit]
    tune_items = everything[len(everything) - args.tune :] if args.tune else []
    pool = fewshot_pool(args.data, everything, shots, None)
    return items, tune_items, pool


def _timings(
    path: Path,
) -> tuple[dict[str, dict[str, float]], Callable[[dict[str, dict[str, float]]], None]]:
    """The curves' timings read back from their resume file ``path`` (none yet: empty), and the function that
    saves them there."""
    from ..base.outputs import write_atomic

    timings = _read_timings(path) if path.exists() else {}

    def save_timings(t: dict[str, dict[str, float]]) -> None:
        write_atomic(path, json.dumps(t, indent=1), replaces_input=True)  # its own resume file

    return timings, save_timings


def _read_timings(path: Path) -> dict[str, dict[str, float]]:
    """The resume file ``timings.json`` of the curves (seconds per curve and phase), every value checked: a
    table of tables of finite non-negative numbers, else one line asking to remove it."""
    doc = read_json(path, str(path), max_bytes=2**20)
    seconds = Range(0, what="a finite number of seconds >= 0")
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise InputError(f"{path}: not the timings this command writes (a table of tables); remove it to measure again")
    try:
        return {str(k): {str(p): seconds.check(s, f"{k}.{p}") for p, s in v.items()} for k, v in doc.items()}
    except NumberError as e:
        raise InputError(f"{path}: {e}; remove it to measure again") from None


def _curve_grid(args: argparse.Namespace) -> CurveGrid:
    """What the curves measure (shots, whats, strategies, ratios, candidates, timing items) from the options; a bad
    one fails before anything loads."""
    from ..analyses.compaction.spec import WHATS, CompactSpec
    from ..lab.experiments.curves import CurveGrid

    shots = [_shot(s) for s in _list(args.shots, ",", "shots")]
    whats = _list(args.what, ",", "what")
    bad = [w for w in whats if w not in WHATS]
    if bad:
        raise InputError(f"--what {bad[0]!r}: use {', '.join(WHATS)}")
    if "examples" in whats and 0 in shots:
        raise InputError("--what examples compacts few-shot examples: every --shots must be > 0")
    strategies = _list(args.strategies, ";", "strategies")
    ratios = [_ratio_opt(r) for r in _list(args.ratios, ",", "ratios")]
    given = _list(args.candidates, ";", "candidates")  # checked even when --tune 0 leaves them unused
    candidates = given if args.tune else []
    for s in strategies:
        CompactSpec.parse(f"what=examples,{s}")  # a bad fragment fails before anything loads
        if any(k in s for k in ("ratio=", "budget=", "what=")):
            raise InputError(f"strategy {s!r}: ratio, budget and what are set by the runner")
    for c in given:
        CompactSpec.parse(f"what=examples,{c}")
    return CurveGrid(
        shots=shots,
        whats=whats,
        strategies=strategies,
        ratios=ratios,
        candidates=candidates,
        timing_items=args.timing_items,
    )


def _print_curves(args: argparse.Namespace, name: str, n_items: int, result: Any) -> None:
    """The kept accuracy of every curve point, as a table."""
    rows = [
        [
            f"{p.shots}/{p.what}",
            escape(p.strategy),
            "-" if p.ratio is None else ("max" if math.isinf(p.ratio) else f"{p.ratio:g}"),
            "-" if p.kept_acc_norm is None else f"{p.kept_acc_norm:.3f}",
            "-" if p.kept_acc is None else f"{p.kept_acc:.3f}",
        ]
        for p in result.points
    ]
    print_table(
        console(args),
        f"{name}, {n_items} items: kept = acc(compacted) / acc(full)",
        [
            "shots/part",
            Col("strategy", wrap=True),
            "ratio",
            Col("acc_norm kept", justify="right"),
            Col("acc kept", justify="right"),
        ],
        rows,
        keys=3,
    )


def _shot(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise InputError(f"--shots: {text[:40]!r} is not an integer >= 0")
    return v


def _ratio_opt(text: str) -> float:
    try:
        return _ratio(text)
    except argparse.ArgumentTypeError as e:
        raise InputError(f"--ratios: {e}") from None
