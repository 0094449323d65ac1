"""``walklens cooccur``: Result 4 of seed 000 (sec. 2.2) on a model's token vectors: co-occurrence in a corpus
against the tokens' inner product and cosine, with a jackknife interval and two frequency controls
(:func:`walklens.analyses.association.cooccurrence`).

The corpus is the HellaSwag validation text bundled with walklens (each item's context and its gold ending, one
document each; documents clustered by activity label for the jackknife), or ``--data FILE`` in the same forms
``walklens hellaswag`` reads.
"""

from __future__ import annotations

import argparse
import dataclasses

from ..base.errors import InputError
from .common import add_model_args, check_outputs, load, positive_arg, seed_arg, write_json
from .terminal import console, print_table

DESCRIPTION = """\
Result 4 (seed 000, sec. 2.2): over token pairs that co-occur in a corpus, the Spearman correlation of their
co-occurrence (PMI of pairs at most --window tokens apart, seen at least --min-count times) with the inner product
and the cosine of the tokens' embedding rows (the vectors the model reads), and of inner product with cosine.
Intervals: a delete-a-group jackknife over --groups random groups of clusters of documents (HellaSwag activity
labels), the whole procedure repeated without each group.
Controls: the correlation given both tokens' log frequencies (partial), and with each pair's second token swapped
for a token of matched frequency (matched; excess = measured - matched)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cooccur", help="co-occurrence vs similarity of token vectors (Result 4)",
                       description=DESCRIPTION)  # fmt: skip
    add_model_args(p)
    p.add_argument("--json", metavar="FILE", help="write every number to this JSON file")
    p.add_argument("--data", metavar="FILE", help="HellaSwag .jsonl or .txt(.bz2) (default: the bundled text)")
    p.add_argument("--limit", type=positive_arg, default=None, metavar="N", help="only the first N items")
    p.add_argument("--window", type=positive_arg, default=5, metavar="N", help="pair distance (default 5)")
    p.add_argument("--min-count", type=positive_arg, default=5, metavar="N", help="pair count (default 5)")
    p.add_argument("--groups", type=positive_arg, default=20, metavar="G", help="jackknife groups (default 20)")
    p.add_argument("--matched", type=positive_arg, default=5, metavar="N", help="matched draws (default 5)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the resamples and draws (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..analyses.association import MAX_MATCHED, cooccurrence
    from ..lab.hellaswag.data import bundled_path, load_hellaswag

    if args.groups < 2:
        raise InputError(f"--groups: at least 2 groups make a jackknife, got {args.groups}")
    if args.matched > MAX_MATCHED:
        raise InputError(f"--matched: at most {MAX_MATCHED} draws, got {args.matched}")
    check_outputs(args)  # before the corpus is read
    items = load_hellaswag(args.data or bundled_path(), limit=args.limit)
    if not items:
        raise InputError("no HellaSwag items to read")
    lm = load(args)
    texts = [f"{it.ctx} {it.endings[it.label]}" for it in items]
    ids = lm.tokenizer(texts, add_special_tokens=False)["input_ids"]
    labels = sorted({it.activity_label for it in items})
    clusters = [labels.index(it.activity_label) for it in items]
    res = cooccurrence(ids, lm.embedding_matrix().detach(), clusters=clusters, window=args.window,
                       min_count=args.min_count, n_groups=args.groups, n_matched=args.matched, seed=args.seed,
                       model_name=lm.name)  # fmt: skip
    if args.json:
        write_json(args.json, {"kind": "cooccurrence", "data": args.data or "bundled", "limit": args.limit}
                   | dataclasses.asdict(res))  # fmt: skip
    rows = [[name, f"{c.rho:+.3f}", f"[{c.lo:+.3f}, {c.hi:+.3f}]"]
            for name, c in ((f.name, getattr(res, f.name)) for f in dataclasses.fields(res))
            if hasattr(c, "rho")]  # fmt: skip
    print_table(
        console(args),
        f"{lm.name}: {res.n_pairs:,} pairs, {res.n_tokens:,} tokens, {res.n_clusters} clusters",
        ["Spearman", "rho", "95 % interval"],
        rows,
    )
    return 0
