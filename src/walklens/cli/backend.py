"""The backend options of the sweep commands (``--backend local|ray``, ``--address``, ``--workers``; docs/scale.md),
shared by ``walklens hellaswag sweep`` (alias ``walklens sweep``) and ``walklens experiment run``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..base.errors import InputError
from ..base.numbers import POSITIVE_INT
from ..core.backends import BACKENDS

if TYPE_CHECKING:
    from ..core.backends import Backend


def add_backend_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--backend``, ``--address``, ``--workers`` (read back by :func:`backend_from_args`)."""
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="where the shards run: local (this process; the default) or ray (Ray actors, each holding "
        "the model once; pip install 'walklens[ray]')",
    )
    p.add_argument(
        "--address",
        default=None,
        metavar="auto|HOST:PORT|ray://HOST:PORT",
        help="the Ray cluster to use (default: start a local Ray instance with --workers workers)",
    )
    p.add_argument(
        "--workers",
        type=POSITIVE_INT.arg(),
        default=None,
        metavar="N",
        help="Ray workers per model (default: 1 on a local instance; on a cluster, one per GPU with "
        "--device cuda, else one per CPU)",
    )


def backend_from_args(args: argparse.Namespace, defaults: dict[str, Any] | None = None) -> Backend:
    """The backend the options ask for; ``defaults`` (an experiment file's ``[backend]`` table) fill in what the
    command line leaves out.  Ray options without the ray backend, and ray not installed, are one-line errors."""
    from ..core.backends import make_backend

    opts = dict(defaults or {})
    name = getattr(args, "backend", None) or opts.pop("name", None) or "local"
    opts.pop("name", None)
    cli = {"address": getattr(args, "address", None), "workers": getattr(args, "workers", None)}
    if name == "local":
        given = [f"--{k}" for k, v in cli.items() if v is not None]
        if given:
            raise InputError(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --backend ray")
        return make_backend("local")
    opts.update({k: v for k, v in cli.items() if v is not None})
    return make_backend("ray", **opts)
