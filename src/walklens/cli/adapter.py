"""``walklens adapter MODEL --write FILE``: the adapter derived for a family with no adapter file, as a file."""

from __future__ import annotations

import argparse
import sys

from ..base.errors import InputError
from .common import add_model_arg, command_inputs, load
from .terminal import add_command, console, say


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = add_command(
        sub,
        "adapter",
        "the adapter walklens uses for a model (derived ones can be written out)",
        "Show the adapter of a model; --write FILE writes a derived adapter as a reviewable file for "
        "src/walklens/models/.",
    )
    add_model_arg(a)
    a.add_argument("--write", metavar="FILE", help="write the derived adapter's roles as a Python file")
    a.set_defaults(func=run_adapter)


def run_adapter(args: argparse.Namespace) -> int:
    from ..models.derive import derive_roles
    from ..models.roles import render

    if args.write:
        from ..base.outputs import check_file, check_not_inputs

        check_file(args.write, "--write")
        check_not_inputs(args.write, "--write", command_inputs(args))  # never over the model's own files
    lm = load(args)
    con = console(args)
    if not lm.adapter.family.startswith("derived:"):
        if args.write:
            raise InputError(
                f"{lm.config.model_type!r} has an adapter file already "
                f"(src/walklens/models/, family {lm.adapter.family}); nothing to write"
            )
        say(con, f"{lm.name}: adapter file of family {lm.adapter.family}")
        return 0
    text = render(derive_roles(lm.model))
    if args.write:
        from ..base.outputs import write_atomic

        path = write_atomic(args.write, text, "--write")
        sys.stderr.write(f"walklens: derived adapter written to {path!s}\n")
    else:
        sys.stdout.write(text)
    return 0
