"""``walklens serve``: the explorer in the browser (:mod:`walklens.server`, docs/explorer.md).

Checks the [serve] extra, the address, the port and the database, binds the socket, loads every ``--model``
once, prints one URL with a random access token and serves until interrupted.  Each view's request is refused
(413) over ``--max-memory`` / ``--max-work`` by the rule and the estimates the other commands use
(:mod:`walklens.costs`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from ..base.precision import DEFAULT_DTYPE, DTYPES
from ..costs import GB
from .common import add_dtype_device_args, load_within, memory_budget
from .limits import add_limit_args
from .terminal import add_command

DESCRIPTION = """\
A local web app over the analyses: type a text, pick a model, and move through the encoding walk (click a
cell for its nearest tokens), the decoding walk, similarity maps, attention heads and position kernels, power
spectra and a steering playground, the sweeps of a results database (--db), steering cards (--card), patching
grids and the walk beside the test (--patch), and two models side by side.
Binds 127.0.0.1 on a free port by default and prints one URL with a random access token; every request must
carry it. Nothing is loaded from the network. Repeat --model to load several (NAME@bfloat16 loads one in
that dtype, e.g. --model smollm2-135m --model smollm2-135m@bfloat16 to compare them)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub, "serve", "the explorer in the browser: every view of a text, offline, on localhost", DESCRIPTION
    )
    p.add_argument(
        "--model",
        action="append",
        metavar="M",
        help="a model to load (repeat for several; NAME@DTYPE for a dtype; default smollm2-135m)",
    )
    add_dtype_device_args(
        p,
        DEFAULT_DTYPE,
        f"dtype of the models without @DTYPE (default {DEFAULT_DTYPE})",
        "where the models run (default: cpu)",
    )
    p.add_argument("--db", metavar="PATH", help="a results database to browse in the sweeps view (read-only)")
    p.add_argument(
        "--card",
        action="append",
        metavar="FILE",
        help="a steering card to show in the cards view: the --json file of walklens steer --card SET (repeat: "
        "several)",
    )
    p.add_argument(
        "--patch",
        action="append",
        metavar="FILE",
        help="a patching grid to show in the patching view: the --json file of walklens patch, or the walk beside "
        "the test (docs/results/walk_beside_patch.json; repeat: several)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host that is not a loopback address (reachable from other machines)",
    )
    add_limit_args(p, files=False)
    p.set_defaults(func=run)


def _spec(spec: str, default: str) -> tuple[str, str]:
    """``NAME@DTYPE`` -> (NAME, DTYPE) when DTYPE is a dtype name; otherwise (spec, default)."""
    name, sep, dtype = spec.rpartition("@")
    return (name, dtype) if sep and name and dtype in DTYPES else (spec, default)


def _check_db(value: str) -> Path:
    from ..lab.hellaswag.store import SweepStore

    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise InputError(f"--db {value}: no such database file")
    with SweepStore(path, readonly=True):  # a damaged or foreign file is refused now, not in the browser
        pass
    return path


def _cards(values: list[str]) -> list[tuple[str, Any]]:
    """Each ``--card`` file read as a steering card (its ``--json`` document), refused in one line otherwise."""
    from ..base.records import read_json
    from ..lab.steeringcard import SteeringCard

    out = []
    for value in values:
        path = Path(value).expanduser()
        if not path.exists():
            raise InputError(f"--card {value}: no such file")
        doc = read_json(path, "--card")
        try:
            out.append((path.name, SteeringCard.from_document(doc)))
        except InputError as e:
            raise InputError(f"--card {value}: {e}") from None
    return out


def _patches(values: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Each ``--patch`` file's documents (a file may hold a list: one per model), checked, refused in one line."""
    from ..base.records import read_json
    from ..reports.patching import checked

    out = []
    for value in values:
        path = Path(value).expanduser()
        if not path.exists():
            raise InputError(f"--patch {value}: no such file")
        docs = checked(read_json(path, "--patch"), f"--patch {value}")
        out += [(path.name, d) for d in docs]
    return out


def _load(args: argparse.Namespace) -> tuple[dict[str, Any], float]:
    """Every ``--model``, each within what the budget (``--max-memory``, else the memory free now) leaves after
    the ones before it (:func:`~walklens.cli.common.load_within`), by name; and the bytes they hold together."""
    from ..core.loading import DEFAULT_MODEL
    from ..costs.planning import model_memory

    left = memory_budget(args) * GB
    models: dict[str, Any] = {}
    for spec in args.model or [DEFAULT_MODEL]:
        name, dtype = _spec(spec, args.dtype)
        if left <= 0:
            raise InputError(f"--model {spec}: the models before it hold all of --max-memory {args.max_memory:g}")
        lm = load_within(name, left / GB, dtype=dtype, device=args.device)
        if lm.name in models:
            raise InputError(f"--model {spec}: {lm.name} is loaded already")
        models[lm.name] = lm
        left -= model_memory(lm)
    return models, memory_budget(args) * GB - left


def run(args: argparse.Namespace) -> int:
    from ..base.extras import require

    require("serve", "walklens serve")  # before anything is checked, bound or loaded
    from ..costs import Limits
    from ..server.app import bind, serve
    from ..server.security import check_bind_host
    from ..server.state import Explorer

    check_bind_host(args.host, args.allow_remote)
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be from 0 to 65535, not {args.port}")
    db = _check_db(args.db) if args.db else None
    cards = _cards(args.card or [])
    patches = _patches(args.patch or [])
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise InputError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    try:
        models, held = _load(args)
        limits = Limits(args.max_memory, args.max_work, model_bytes=held)
        serve(Explorer(models, db, limits=limits, cards=cards, patches=patches), args.host, sock)
    finally:
        sock.close()
    return 0
