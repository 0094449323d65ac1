"""The ``walklens`` command line.  Each sub-command lives in its own module in this package and exposes
``register(subparsers)``; modules are discovered automatically (:func:`command_modules`, the one scan).  The
top-level parser is built from a static table (:data:`COMMANDS`, checked against the scan by tests/test_lazy_help.py),
so ``walklens --help`` imports no command module and no torch; :func:`main` imports only the module of the command
that runs (and those extending it).  A command whose ``register`` returns its own sub-parsers
(``walklens hellaswag``) can be extended by the others: a module defining ``register_<command>(subparsers)``
adds a sub-command there (``walklens hellaswag sweep``; :data:`EXTENDERS`).

A command parses its options, checks every input and output path, calls the analysis, then renders: tables
on the terminal (:mod:`.terminal`), ``--json`` and ``--out`` through the topic's builder in
:mod:`walklens.reports`.

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
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from .._version import __version__
from ..base.errors import WalklensError, WalklensWarning
from ..base.records import one_command


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse's default prints usage too)
        sys.stderr.write(f"walklens: error: {message}\n")
        raise SystemExit(2)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        """Every option's value goes through here: an empty or blank one (``--json ""``, ``--layers=``) is
        refused in one line instead of silently meaning the option's default."""
        if action.option_strings and isinstance(arg_string, str) and not arg_string.strip():
            self.error(
                f"argument {'/'.join(action.option_strings)}: an empty value ({arg_string!r}); "
                "leave the option out for its default"
            )
        return super()._get_value(action, arg_string)


#: every command of ``walklens``, in the order of its help: command -> (its module in this package, its one-line
#: help).  The top-level parser is built from this table alone, so ``walklens --help`` imports no command module
#: (nor torch); a command's module is imported when that command runs or its own ``--help`` is asked.
#: tests/test_lazy_help.py checks it equals what the modules register (:func:`command_modules`): it cannot drift.
COMMANDS: dict[str, tuple[str, str]] = {
    "adapter": ("adapter", "the adapter walklens uses for a model (derived ones can be written out)"),
    "calibrate": ("calibrate", "measure this machine's rates for the size limits"),
    "compact": ("compact", "compact a text into K concept vectors and see what they keep"),
    "cooccur": ("cooccur", "co-occurrence vs similarity of token vectors (Result 4)"),
    "experiment": ("experiment", "run a whole study described in a TOML experiment file (docs/scale.md)"),
    "export": ("export", "a text's activations as a safetensors file (walklens or TransformerLens names)"),
    "generate": ("generate", "the decoding walk: generate and record d_t, its neighbours, P and rank"),
    "heads": ("heads", "attention heads: A.3 identity, attention maps, cluster & aggregate, W_vo/W_qk"),
    "hellaswag": ("hellaswag", "HellaSwag baseline and concept-space Tests 1 and 2 (seed 000, sec. 5)"),
    "kernels": ("kernels", "position kernels of every head and self-bias fractions per stack (A.2)"),
    "patch": ("patch", "activation / attribution patching of a clean and a corrupted prompt"),
    "plan": ("plan", "what a run would take (memory, disk, time), from the files alone"),
    "power": ("power", "power-method view: spectra of W_V W_O, alignment through depth, shared weights"),
    "report": ("report", "report of the scheme sweeps in a results database (HTML, PNG, CSV)"),
    "reproduce": ("reproduce", "measure every claim of both seeds and write the claims table"),
    "serve": ("serve", "the explorer in the browser: every view of a text, offline, on localhost"),
    "simmap": ("simmap", "similarity maps of token vectors at any captured point (Figs. 3, 11, 12)"),
    "steer": ("steer", "activation addition or eigen-steering toward a token, with coherence"),
    "sweep": (
        "sweep",
        "alias of `walklens hellaswag sweep` (the same command): run a whole grid of composition schemes (Test 1 "
        "or 2) on HellaSwag",
    ),
    "verify": ("verify", "the parity card: every recomputation checked against the model itself"),
    "walk": ("walk", "the encoding walk of a text: nearest tokens, ranks and escape layers"),
}

#: command -> the modules that add sub-commands to it (``register_<command>``), imported with it
EXTENDERS: dict[str, tuple[str, ...]] = {"hellaswag": ("compact", "selection", "sweep")}


def build_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """The ``walklens`` parser.  ``command="*"`` (the default): every command registered by its module (every
    command module imported).  ``command=None``: only the top level, from :data:`COMMANDS` (no command module
    imported: ``walklens --help``).  ``command=NAME``: that command registered by its module (and the modules
    extending it), every other one a bare entry of the top-level help."""
    parser = _Parser(prog="walklens", description="See a transformer as movement through embedding space.")
    parser.add_argument("--version", action="version", version=f"walklens {__version__}")
    _threads_option(parser, None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    if command == "*":
        modules = command_modules()
    else:
        wanted = (COMMANDS[command][0], *EXTENDERS.get(command, ())) if command in COMMANDS else ()
        modules = tuple(importlib.import_module(f"{__name__}.{name}") for name in sorted(set(wanted)))
    loaded = {module.__name__.rsplit(".", 1)[-1] for module in modules}
    groups = {}  # command name -> its sub-parsers, for the register_<command> hooks
    done: set[str] = set()
    for name, (home, help_) in COMMANDS.items():  # in the table's order: the help lists them as before
        if home in loaded:
            if home not in done:
                done.add(home)
                module = importlib.import_module(f"{__name__}.{home}")
                got = module.register(sub) if hasattr(module, "register") else None
                if got is not None:
                    groups[home] = got
        else:
            sub.add_parser(name, help=help_)
    for module in modules:  # a module of the scan registering a command the table does not name yet
        home = module.__name__.rsplit(".", 1)[-1]
        if home not in done and hasattr(module, "register"):
            done.add(home)
            got = module.register(sub)
            if got is not None:
                groups[home] = got
    for name, group in groups.items():
        for module in modules:
            hook = getattr(module, f"register_{name}", None)
            if hook is not None:
                hook(group)
    for parsed in dict.fromkeys(_below(parser)):  # `walklens --threads 1 walk ...` = `walklens walk ... --threads 1`
        _threads_option(parsed, argparse.SUPPRESS)
        if "--no-progress" not in parsed._option_string_actions:  # every command takes it
            parsed.add_argument(
                "--no-progress", action="store_true", default=argparse.SUPPRESS, help="no progress bars"
            )
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first argument that is not a top-level option), or None."""
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[i + 1] if i + 1 < len(args) else None
        if len(arg) > 2 and "--threads".startswith(arg):  # its value follows (argparse takes `--thr N` too)
            i += 2
            continue
        if not arg.startswith("-") or arg == "-":
            return arg
        i += 1
    return None


def _threads_option(parser: argparse.ArgumentParser, default: Any) -> None:
    """``--threads N``; ``default``: ``None`` on the top parser, ``SUPPRESS`` on the commands, so that a count given
    before the command is kept and one given after it wins."""
    from ..base.threads import THREADS

    parser.add_argument(
        "--threads",
        type=THREADS.arg(),
        default=default,
        metavar="N",
        help="CPU threads torch runs (default: torch's own count: OMP_NUM_THREADS when set, else the cores torch "
        "sees; never lowered by walklens on its own)",
    )


def _below(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every sub-command parser under ``parser``, at any depth (``hellaswag`` and ``hellaswag test1``)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                found += [child, *_below(child)]
    return found


@functools.cache
def command_modules() -> tuple[ModuleType, ...]:
    """The modules of this package that define a command (``register``) or extend one (``register_<command>``),
    found once per process."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "common":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if any(name == "register" or name.startswith("register_") for name in vars(module)):
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


def _threads(chosen: int | None) -> None:
    """Run torch on ``--threads`` when given, else on its own count, whatever else the machine runs
    (:mod:`walklens.base.threads`).  On a terminal, when the count was not chosen (neither ``--threads`` nor
    ``OMP_NUM_THREADS``) and other processes hold cores it needs, one line says so; nothing is changed."""
    from ..base.threads import busy_note, set_threads

    n = set_threads(chosen)
    if chosen is None and not os.environ.get("OMP_NUM_THREADS") and sys.stderr.isatty():
        note = busy_note(n)
        if note:
            sys.stderr.write(f"walklens: note: {note}\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))  # only the command that runs is imported (walklens --help: none)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    _threads(args.threads)
    from .terminal import progress_bars

    quiet = bool(getattr(args, "no_progress", False)) or not sys.stderr.isatty()
    args.no_progress = quiet  # off a terminal, no bars: the commands that read it pass it on
    try:
        with (
            warnings.catch_warnings(),
            one_command(),
            progress_bars(quiet),
        ):  # the inputs this command reads: never overwritten
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
        sys.stderr.write(
            f"walklens: internal error: {e.__class__.__name__}: {one_line(str(e))} (WALKLENS_DEBUG=1 for details)\n"
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
