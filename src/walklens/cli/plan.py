"""``walklens plan MODEL``: what a capture would take, from the model's config.json and safetensors headers alone
(no tensor is read, no model is built): :func:`walklens.costs.planning.plan`."""

from __future__ import annotations

import argparse
import sys

from .common import add_model_arg, add_stream_arg, positive_arg, positive_number_arg, read_text
from .terminal import add_command, flat

DESCRIPTION = """\
The plan of a capture before it runs, from the model's config.json and the headers of its safetensors files
alone (no weight is read, no model is built): the weights' size in the dtype, whether the model runs in memory or
layer by layer under the memory budget, the peak memory, the trace's size on disk (float32 records), the bytes
read from disk and an estimated time (the disk and matrix-product rates of walklens calibrate, or shipped ones).

The budget is --max-memory GB, the whole process with the weights (default: the memory free now). A run the budget
cannot hold is refused in one line naming the smallest budget that would do, as every command refuses it before
loading the model. Give the text (--text, @FILE for a file) or its length (--tokens; default 512)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "plan", "what a run would take (memory, disk, time), from the files alone", DESCRIPTION)
    add_model_arg(p)
    add_stream_arg(p)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--text", default=None, help="the text to plan for (use @FILE to read it from a file)")
    length.add_argument(
        "--tokens", "--items", type=positive_arg, default=None, metavar="N", help="the text's length in tokens"
    )
    p.add_argument(
        "--max-memory",
        type=positive_number_arg,
        default=None,
        metavar="GB",
        help="the memory budget of the whole process, weights included (default: the memory free now)",
    )
    p.add_argument(
        "--batch",
        type=positive_arg,
        default=1,
        metavar="N",
        help="N texts of that length in one forward pass, as a batched capture runs them (default 1)",
    )
    p.add_argument(
        "--to-disk",
        action="store_true",
        help="the trace goes to a folder as it is computed (--trace-dir): one point in memory at a time",
    )
    p.add_argument(
        "--points",
        default=None,
        help="comma-separated glob patterns of the points captured, as capture takes them (default: every point)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..costs.planning import plan

    got = plan(
        args.model,
        text=None if args.text is None else read_text(args.text),
        tokens=args.tokens,
        dtype=args.dtype,
        device=args.device,
        max_memory=args.max_memory,
        stream=args.stream,
        points=None if args.points is None else [p.strip() for p in args.points.split(",") if p.strip()],
        batch=args.batch,
        to_disk=args.to_disk,
    )
    for line in got.lines():  # plain lines, never wrapped: a plan is read by scripts too
        sys.stdout.write(flat(line) + "\n")
    return 0
