"""``walklens reproduce``: the claims of both seeds (:mod:`walklens.lab.claims`) measured and tabled.

* ``--render``: docs/claims.md's table from the committed result files (no model runs);
* ``--quick``: a Test 1 and a Test 2 sweep on a few items with tiny grids and their report, on ``--model`` (a tiny
  model in the tests; bounded to well under a minute there), then the claims table read from those files;
* neither: each claim's own command in turn (hours to days: the full grids on HellaSwag), then the table.

Every file goes under ``--out``; the table is ``claims.md`` there (``--render --out docs`` writes the docs' own).
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

from ..base.errors import InputError
from ..base.outputs import make_dir, write_atomic
from ..base.records import Input, note_input
from .common import check_outputs, positive_arg
from .terminal import console, say

#: where the committed result files lie in ``--root`` (every file ``--render`` reads)
RESULTS = "docs/results"
#: the tiny grids of ``--quick``: two layers, two word aggregations, one composition (plus Test 1's standard)
_QUICK = 'layers = ["0", "-1"]\nword = ["mean", "last"]\nnorm = ["None"]\nseg = ["mean"]\nex = ["mean"]\n'
QUICK_GRIDS = {1: _QUICK, 2: _QUICK + 'sim = ["dot"]\nout_word = ["mean"]\n'}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("reproduce", help="measure every claim of both seeds and write the claims table")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="tiny sweeps on --model (seconds on a tiny model)")
    mode.add_argument("--render", action="store_true", help="only the table, from the committed result files")
    p.add_argument("--out", required=True, metavar="DIR", help="folder of the result files and claims.md")
    p.add_argument("--model", default="smollm2-135m", help="the model of --quick (default smollm2-135m)")
    p.add_argument("--limit", type=positive_arg, default=8, metavar="N", help="items of --quick (default 8)")
    p.add_argument("--root", default=".", metavar="DIR", help="the repository, for --render (default .)")
    p.set_defaults(func=run)


def _walklens(argv: list[str]) -> None:
    """One walklens command in this process; a failure is one line naming it."""
    from . import main

    if main(argv) != 0:
        raise InputError(f"reproduce: `walklens {shlex.join(argv)}` failed (its error is above)")


def _quick(args: argparse.Namespace, out: Path) -> None:
    db = out / "quick.sqlite"
    for test, grid in QUICK_GRIDS.items():
        g = out / f"grid_test{test}.toml"
        write_atomic(g, grid)
        _walklens(
            ["sweep", "--test", str(test), "--grid", str(g), "--model", args.model, "--limit", str(args.limit)]
            + ["--db", str(db), "--no-progress"]
        )
    _walklens(["report", "--db", str(db), "--out", str(out / "report")])


def _full(out: Path) -> None:
    """Each claim's command, once each, with ``$DB``, ``$C`` and ``$OUT`` in ``out``."""
    from ..lab.claims import CLAIMS

    done: set[str] = set()
    env = {"$DB": str(out / "study.sqlite"), "$C": str(out / "cache"), "$OUT": str(out)}
    for c in CLAIMS:
        if c.file is None or c.command in done or "..." in c.command:
            continue  # no file to write, already run, or a command with a placeholder (run by hand)
        done.add(c.command)
        for part in c.command.split("&&"):
            for k, v in env.items():
                part = part.replace(k, v)
            argv = shlex.split(part)
            _walklens(argv[1:] if argv[:1] == ["walklens"] else argv)


def run(args: argparse.Namespace) -> int:
    from ..lab.claims import committed, quick, render

    if args.render:  # the committed result files are its inputs: --out may not lie among them, nor may a link
        # planted in --out lead into them (refused when claims.md is written: no output replaces an input)
        results = Input("--root results", Path(args.root) / RESULTS, folder=True)
        check_outputs(args, inputs=[results])
        note_input(results.path, results.label, folder=True)
    else:
        check_outputs(args)
    out = make_dir(args.out, "--out")
    con = console(args)
    t0 = time.perf_counter()
    if args.render:
        text = render(Path(args.root))
    elif args.quick:
        _quick(args, out)
        text = render(out, source=quick, title=f"# Claims of both seeds: walklens reproduce --quick on {args.model}")
    else:
        _full(out)
        text = render(Path(args.root), source=committed)
    path = write_atomic(out / "claims.md", text)
    say(con, f"claims: {path} ({time.perf_counter() - t0:.1f} s)")
    return 0
