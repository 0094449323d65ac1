"""``walklens calibrate``: measure this machine's rates of the cost model (:mod:`walklens.costs.calibration`) with small
timed runs and store them in the walklens cache, where every command's and the explorer's estimates read them.

Three timings, each the fastest of several runs on the threads a command runs: a float32 matrix product (the rate
work is counted at), eager forward passes of a model at two lengths (what an attention score costs beyond the
matrix products, from the difference: what is paid once per pass cancels) and the ``--json`` writer and a
report's heatmap writing the same scores (what a byte of output costs).  The model is a tiny random Llama built
in code (four heads of 64 dimensions, two layers: the attention's [H, T, T] passes dominate), or ``--model``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from ..base.numbers import Range
from ..costs import MAX_WORK_TFLOP, TFLOP
from ..costs import calibration as machine
from ..costs.measure import disk_rate, measure, tiny_llama, write_rate
from .common import load
from .terminal import console, print_table, say

TOKENS = 512  # the longer of the two forward passes (the shorter is half); --tokens

DESCRIPTION = """\
Measure the rates the size limits count work in (--max-work) on this machine, and store them in the walklens
cache: the matrix-product rate, the cost of an attention score of an eager forward pass beyond its matrix
products, and the cost of a byte of JSON or HTML built in Python, both in matrix-product FLOP.  Until a machine is
calibrated the estimates use shipped conservative figures; a calibration file that fails its check is discarded
with a warning.  Takes a few seconds on the default tiny random model."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("calibrate", help="measure this machine's rates for the size limits", description=DESCRIPTION)
    p.add_argument(
        "--model",
        default=None,
        help="time forward passes of this model (short name, .gguf, directory or hub id) instead of a tiny "
        "random Llama built in code",
    )
    p.add_argument(
        "--tokens",
        type=Range(32, 4096, integer=True).arg(),
        default=TOKENS,
        metavar="N",
        help=f"tokens of the longer forward pass, the shorter has half (default {TOKENS}; at most the context)",
    )
    p.add_argument(
        "--disk",
        default=None,
        metavar="DIR",
        help="also time reading this model folder's .safetensors files from disk (at most 4 GiB, each dropped from "
        "the page cache first) and writing 256 MiB to the walklens cache: the rates a plan counts (default: the "
        "rates stored before, else 1 and 0.5 GB/s assumed)",
    )
    p.set_defaults(func=run)


def _number(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def run(args: argparse.Namespace) -> int:
    disk = None if args.disk is None else disk_rate(Path(args.disk))  # first: a bad folder is refused before timing
    write = None if args.disk is None else write_rate(machine.calibration_path().parent)
    lm = load(args) if args.model else tiny_llama()
    measured = measure(lm, args.tokens, disk_gbps=disk, write_gbps=write)
    path = machine.save(measured, model=lm.name[:400], threads=torch.get_num_threads())
    con = console(args)
    rows = [
        [name, _number(getattr(measured, key)), _number(getattr(machine.DEFAULTS, key)), unit]
        for name, key, unit in (
            ("matrix products", "matmul_gflops", "GFLOP/s"),
            ("matrix products, bfloat16", "bf16_gflops", "GFLOP/s"),
            ("an attention score", "attn_element", "FLOP"),
            ("a byte of output", "write_work", "FLOP"),
            ("reading from disk", "disk_gbps", "GB/s"),
            ("writing to disk", "write_gbps", "GB/s"),
        )
    ]
    threads = torch.get_num_threads()
    title = f"this machine's rates ({lm.name}, {threads} thread{'s' * (threads != 1)})"
    print_table(con, title, ["rate", "measured", "shipped", "unit"], rows)
    seconds = MAX_WORK_TFLOP * TFLOP / (measured.matmul_gflops * 1e9)
    say(con, f"stored in {path}; the default --max-work {MAX_WORK_TFLOP:g} is about {math.ceil(seconds):,} s here")
    return 0
