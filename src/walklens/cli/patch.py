"""``walklens patch``: activation patching (or attribution patching with its parity card) of a clean and a corrupted
prompt over points x positions (docs/patching.md)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from ..reports import patching as patching_report
from .common import add_model_args, add_output_args, load, positive_arg, read_text, write_json
from .limits import HEATMAP_CELLS, LimitError, add_limit_args
from .terminal import add_command, console, print_table, say

PATCH_DESCRIPTION = """\
Activation patching: the corrupted prompt's run with the clean run's vector at one (point, position) cell
(--direction denoise), or the clean run with the corrupted vector (noise), scored by --metric at the last
position and normalised so the clean run is 1 and the corrupted run 0. A layer's cells run as one batch from the
stored residual at that layer (layers l..L-1 only); every cell equals its single-patch forward pass
(docs/patching.md). --attribution: the first-order estimate (activation difference x gradient, one forward and one
backward), reported with its parity card against exact patching on the same cells.

Metrics: logitdiff:A,B (quote a token to keep its leading space: logitdiff:" Paris"," Rome"), logprob:TOKEN,
rank:TOKEN, kl (KL from the clean distribution). Points: resid_pre, attn_out, resid_mid, mlp_out, resid_post, names
(L3.mlp_out, L2.H1) or globs; --heads adds every head (its z_h, the A.3 contribution)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub, "patch", "activation / attribution patching of a clean and a corrupted prompt", PATCH_DESCRIPTION
    )
    p.add_argument("clean", help="the clean prompt (use @FILE to read it from a file)")
    p.add_argument("corrupted", help="the corrupted prompt (use @FILE)")
    add_model_args(p)
    add_output_args(p)
    p.add_argument("--metric", default="kl", help="logitdiff:A,B | logprob:TOKEN | rank:TOKEN | kl (default kl)")
    p.add_argument("--points", default="resid_pre", help="comma-separated kinds, names or globs (default resid_pre)")
    p.add_argument("--heads", action="store_true", help="also every head of every layer (z_h, its A.3 contribution)")
    p.add_argument("--positions", default=None, help="comma-separated positions of the corrupted prompt (default all)")
    p.add_argument(
        "--position-map",
        default=None,
        metavar="C:K,...",
        help="pair corrupted position C with clean position K (prompts of different token counts need it)",
    )
    p.add_argument("--direction", choices=("denoise", "noise"), default="denoise")
    p.add_argument("--attribution", action="store_true", help="attribution patching, with its parity card")
    p.add_argument(
        "--sender",
        default=None,
        metavar="POINT",
        help="path patching from this head (L0.H1) or sublayer (L0.attn_out, L0.mlp_out) to --receivers",
    )
    p.add_argument(
        "--receivers",
        default=None,
        metavar="R,...",
        help="path patching's receivers: L<r>.resid_pre (the residual entering layer r) or L<r>.H<h>.q|k|v",
    )
    p.add_argument(
        "--vector",
        default=None,
        metavar="FILE",
        help="patch this vector (a 1-D .npy, or a .safetensors holding one tensor: a steering direction, a concept "
        "vector) into the corrupted run at each cell instead of the clean run's vector",
    )
    p.add_argument("--vector-mode", choices=("add", "replace"), default="add", help="with --vector (default add)")
    p.add_argument("--scale", type=float, default=1.0, help="with --vector: the vector's multiple (default 1)")
    p.add_argument("--batch", type=positive_arg, default=64, help="most cells per forward pass (default 64)")
    add_limit_args(p)
    p.set_defaults(func=run_patch)


def _ints(value: str | None, option: str) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{option}: give comma-separated integers, not {value!r}") from None


def _position_map(value: str | None) -> dict[int, int] | None:
    if value is None:
        return None
    out: dict[int, int] = {}
    for pair in value.split(","):
        c, sep, k = pair.partition(":")
        try:
            if not sep:
                raise ValueError
            out[int(c)] = int(k)
        except ValueError:
            raise InputError(f"--position-map: give C:K pairs separated by commas, not {pair!r}") from None
    return out


def read_vector(path: str) -> Any:
    """A 1-D vector from a ``.npy`` (no pickles) or a ``.safetensors`` file holding one tensor; one line on failure."""
    import numpy as np
    import torch

    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            tensors = load_file(path)
            if len(tensors) != 1:
                raise InputError(f"--vector {path}: holds {len(tensors)} tensors; give a file with one")
            return next(iter(tensors.values()))
        if path.endswith(".npy"):
            return torch.from_numpy(np.load(path, allow_pickle=False))
    except InputError:
        raise
    except (OSError, ValueError) as e:  # missing, unreadable, not the format, or pickled objects
        raise InputError(f"--vector {path}: cannot be read ({str(e).splitlines()[0] if str(e) else e})") from None
    raise InputError(f"--vector {path}: give a .npy or a .safetensors file")


def _plan(lm: Any, args: argparse.Namespace, opts: dict[str, Any]) -> None:
    """Refuse, before any forward pass, a grid over the heatmap's size or whose memory, work or files exceed the
    limits (:func:`walklens.costs.patch_need`)."""
    from ..analyses.patching.exact import setup
    from ..costs import model_shape, patch_need
    from .limits import check

    s = setup(lm, args.clean_text, args.corrupted_text, paired=args.vector is None, **opts)
    cells = len(s.sites) * len(s.positions)
    if cells > HEATMAP_CELLS:
        raise LimitError(
            f"a grid of {cells} cells is over the {HEATMAP_CELLS} a view holds; give fewer --points or --positions"
        )
    per_layer: dict[int, int] = {}
    for site in s.sites:
        per_layer[site.layer] = per_layer.get(site.layer, 0) + len(s.positions)
    need = patch_need(
        model_shape(lm),
        int(max(s.clean_ids.shape[1], s.corrupted_ids.shape[1])),
        list(per_layer),
        list(per_layer.values()),
        batch=args.batch,
        attribution=args.attribution,
        json=bool(args.json),
        out=bool(args.out),
    )
    check(need, args, f"patching {cells} cells", "fewer --points or --positions, or a smaller --batch (memory)")


def _print(r: Any, args: argparse.Namespace) -> None:
    con = console(args)
    order = sorted(
        range(r.values.size), key=lambda i: -abs(float(r.values.flat[i]) - (0 if r.direction == "denoise" else 1))
    )
    N = len(r.positions)
    rows = [
        [
            escape(r.points[i // N]),
            str(r.positions[i % N]),
            escape(repr(r.tokens[i % N])),
            f"{float(r.values.flat[i]):.3f}",
        ]
        for i in order[:12]
    ]
    print_table(
        con,
        f"{r.model_name}: {r.method} patching ({r.direction}), {escape(r.metric)}: clean {r.clean_metric:.4g}, "
        f"corrupted {r.corrupted_metric:.4g}; the cells that move it most",
        ["point", "position", "token", "value"],
        rows,
    )
    if r.parity is not None:
        c = r.parity
        say(con, f"parity card: Spearman {c.spearman:.3f}, top-{c.k} overlap {c.topk_overlap:.2f} over {c.cells} cells")


def run_patch(args: argparse.Namespace) -> int:
    from ..analyses.patching import attribute, patch

    args.clean_text, args.corrupted_text = read_text(args.clean), read_text(args.corrupted)
    opts: dict[str, Any] = dict(
        points=[p for p in args.points.split(",") if p.strip()],
        positions=_ints(args.positions, "--positions"),
        metric=args.metric,
        direction=args.direction,
        position_map=_position_map(args.position_map),
        heads=args.heads,
    )
    if (args.sender is None) != (args.receivers is None):
        raise InputError("path patching needs both --sender and --receivers")
    if args.sender is not None and (args.attribution or args.position_map or args.heads):
        raise InputError("--attribution, --position-map and --heads are for activation patching, not --sender")
    if args.vector is not None and (args.sender or args.attribution or args.position_map or args.direction == "noise"):
        raise InputError(
            "--vector patches a vector into the corrupted run: not with --sender, --attribution, "
            "--position-map or --direction noise"
        )
    vector = None if args.vector is None else read_vector(args.vector)
    lm = load(args)
    if args.sender is not None:
        opts["points"] = [args.sender]
    _plan(lm, args, opts)
    if args.sender is not None:
        from ..analyses.patching import path_patch

        receivers = [r for r in args.receivers.split(",") if r.strip()]
        del opts["points"], opts["heads"], opts["position_map"]
        r = path_patch(lm, args.clean_text, args.corrupted_text, sender=args.sender, receivers=receivers, **opts)
    elif vector is not None:
        from ..analyses.patching.vectors import patch_vector

        del opts["position_map"]
        r = patch_vector(
            lm,
            args.clean_text,
            args.corrupted_text,
            vector,
            mode=args.vector_mode,
            scale=args.scale,
            batch=args.batch,
            **opts,
        )
    elif args.attribution:
        r = attribute(lm, args.clean_text, args.corrupted_text, **opts)
    else:
        r = patch(lm, args.clean_text, args.corrupted_text, batch=args.batch, **opts)
    _print(r, args)
    if args.json:
        write_json(args.json, r.document())
    if args.out:
        path = patching_report.build(r).save(args.out)
        say(console(args), f"report: {path}")
    return 0


__all__ = ["register", "run_patch"]
