"""``walklens export TEXT --out FILE.safetensors``: a text's captured activations as one safetensors file, under
walklens' point names or TransformerLens hook names (``--names transformerlens``, :mod:`walklens.core.tlnames`),
each tensor ``[1, positions, d_model]`` as an ``ActivationCache`` entry of one text; the token ids and the model's
identity in the file's metadata.  The output path is checked before the model loads."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..base.errors import InputError
from .common import add_model_args, add_text_args, command_inputs, load, read_text
from .terminal import add_command, console, say

DESCRIPTION = """\
A text's activations as one safetensors file: every captured point (or those --points names), each a
[1, positions, d_model] float32 tensor keyed by its walklens point name (L3.resid_post) or, with
--names transformerlens, its TransformerLens hook name (blocks.3.hook_resid_post), so that a sparse
autoencoder or a probe trained on TransformerLens activations reads it. The file's metadata holds the
model, the text's token ids and the naming. An existing file is replaced only if it is a regular file."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub, "export", "a text's activations as a safetensors file (walklens or TransformerLens names)", DESCRIPTION
    )
    add_text_args(p)
    add_model_args(p)
    p.add_argument("--out", metavar="FILE", required=True, help="the .safetensors file to write")
    p.add_argument(
        "--points",
        default=None,
        help="comma-separated glob patterns of points in the naming chosen (default: every point), e.g. "
        "'L*.resid_post' or, with --names transformerlens, 'blocks.*.hook_resid_post'",
    )
    p.add_argument(
        "--names",
        choices=("walklens", "transformerlens"),
        default="walklens",
        help="the tensors' names: walklens points (default) or TransformerLens hook names",
    )
    p.set_defaults(func=run)


def _check_out(args: argparse.Namespace) -> None:
    """``--out``: a .safetensors file that is writable (an existing one a regular file), not an input."""
    from ..base.outputs import check_file, check_not_inputs

    check_file(args.out, "--out")
    check_not_inputs(args.out, "--out", command_inputs(args))
    if not str(args.out).endswith(".safetensors"):
        raise InputError(f"--out {args.out}: name a .safetensors file")


def tensors_of(trace: Any) -> dict[str, Any]:
    """Each point of ``trace`` as a contiguous float32 ``[1, positions, d_model]`` tensor, by its name."""
    return {name: trace.hidden[i].float().unsqueeze(0).contiguous() for i, name in enumerate(trace.points)}


def run(args: argparse.Namespace) -> int:
    from safetensors.torch import save

    from ..base.outputs import write_atomic
    from ..core.capture import capture

    text = read_text(args.text)
    _check_out(args)
    points = [p.strip() for p in args.points.split(",")] if args.points else None
    lm = load(args)
    trace = capture(lm, text, truncate=args.truncate, points=points, names=args.names)
    meta = {
        "model": lm.name,
        "names": args.names,
        "token_ids": json.dumps([int(i) for i in trace.token_ids.reshape(-1)]),
        "tokens": json.dumps(list(trace.tokens)),
    }
    tensors = tensors_of(trace)
    path = write_atomic(args.out, save(tensors, metadata=meta), "--out")
    say(
        console(args),
        f"{len(tensors)} tensors of [1, {len(trace.tokens)}, {trace.d_model}] ({args.names} names) written to {path}",
    )
    return 0
