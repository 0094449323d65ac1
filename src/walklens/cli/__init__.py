"""The ``walklens`` command line.  Each sub-command lives in its own module in this package and exposes
``register(subparsers)``; modules are discovered automatically.

Every failure on bad input prints one line (``walklens: error: ...``) and exits with code 2; results already
written stay on disk.  Set ``WALKLENS_DEBUG=1`` to see a traceback instead.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import pkgutil
import sys
import warnings
from types import ModuleType
from typing import Any, Sequence

from .. import __version__
from ..errors import WalklensError, WalklensWarning


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's default prints usage too)
        sys.stderr.write(f"walklens: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="walklens", description="See a transformer as movement through embedding space.")
    parser.add_argument("--version", action="version", version=f"walklens {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in command_modules():
        module.register(sub)
    return parser


@functools.cache
def command_modules() -> tuple[ModuleType, ...]:
    """The modules of this package that define a command (``register``), found once per process."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "common":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            found.append(module)
    return tuple(found)


def one_line(message: str) -> str:
    """``message`` on one line: a newline in a path or a library's message never splits an error in two."""
    return " ".join(message.split()) if ("\n" in message or "\r" in message) else message


def _one_line(show: Any) -> Any:
    """``warnings.showwarning`` that prints walklens' own warnings as one line, ``walklens: warning: ...``."""

    def shown(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, WalklensWarning):
            sys.stderr.write(f"walklens: warning: {message}\n")
        else:
            show(message, category, *args, **kwargs)

    return shown


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line(warnings.showwarning)
            return int(args.func(args) or 0)
    except WalklensError as e:
        if os.environ.get("WALKLENS_DEBUG"):
            raise
        sys.stderr.write(f"walklens: error: {one_line(str(e))}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("walklens: interrupted; results written so far are kept\n")
        return 130
    except Exception as e:  # last resort: still one line, never a traceback
        if os.environ.get("WALKLENS_DEBUG"):
            raise
        sys.stderr.write(f"walklens: internal error: {e.__class__.__name__}: {one_line(str(e))} "
                         "(WALKLENS_DEBUG=1 for details)\n")
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
