"""``walklens --help`` imports no torch (issue 56, "Quiet by default"): the package root resolves its names lazily,
the notebook views load the first time one is looked up, and the CLI's top level is built from a static table of
commands (:data:`walklens.cli.COMMANDS`) that must equal what the command modules register."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")

_PROBE = """
import contextlib, io, json, sys
import walklens, walklens.cli
from walklens.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0, e.code
    assert main([]) == 2  # no command: the help, exit 2
assert "COMMAND" in out.getvalue() and "walk" in out.getvalue()
print(json.dumps([m for m in {heavy!r} if m in sys.modules]))
"""


def _heavy_after(prelude: str = "") -> list[str]:
    code = prelude + _PROBE.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_help_imports_no_torch() -> None:
    """``import walklens``, ``import walklens.cli`` and the top-level help (and ``walklens`` alone) load neither
    torch nor transformers."""
    assert _heavy_after() == []


def test_the_probe_sees_an_eager_torch_import() -> None:
    """The probe is not blind: an eager ``import torch`` before it is reported."""
    pytest.importorskip("torch")
    assert "torch" in _heavy_after("import torch\n")


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_the_static_table_is_what_the_modules_register() -> None:
    """:data:`COMMANDS` (command -> its module, its help) and :data:`EXTENDERS` equal what every command module
    registers, in the same order: the table cannot drift from the commands the CLI dispatches."""
    from walklens import cli

    registered: dict[str, tuple[str, str]] = {}
    extenders: dict[str, list[str]] = {}
    for module in cli.command_modules():
        home = module.__name__.rsplit(".", 1)[-1]
        sub = argparse.ArgumentParser().add_subparsers()
        if hasattr(module, "register"):
            module.register(sub)
        for action in sub._choices_actions:
            registered[action.dest] = (home, str(action.help))
        for name in vars(module):
            if name.startswith("register_"):
                extenders.setdefault(name.removeprefix("register_"), []).append(home)
    assert list(registered.items()) == list(cli.COMMANDS.items())
    assert {k: tuple(v) for k, v in extenders.items()} == cli.EXTENDERS
    full = cli.build_parser()
    assert list(_commands(full).choices) == list(cli.COMMANDS)
    assert all(callable(p.get_default("func")) or _commands_below(p) for p in _commands(full).choices.values())


def _commands_below(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def test_lazy_parsers_read_as_the_full_one() -> None:
    """The top-level help built from the table is the full parser's, word for word; each command built on its own
    (its module, and those extending it) has the same help and options as in the full parser, sub-commands too."""
    from walklens.cli import COMMANDS, _below, build_parser

    full = build_parser()
    assert build_parser(None).format_help() == full.format_help()
    for name in COMMANDS:
        alone = build_parser(name)
        assert alone.format_help() == full.format_help(), name
        mine, theirs = _commands(alone).choices[name], _commands(full).choices[name]
        assert [p.format_help() for p in [mine, *_below(mine)]] == [p.format_help() for p in [theirs, *_below(theirs)]]
        func = [getattr(p.get_default("func"), "__qualname__", None) for p in (mine, theirs)]
        assert func[0] == func[1], name


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["walk", "x"], "walk"),
        (["--threads", "2", "walk"], "walk"),
        (["--thr", "2", "heads"], "heads"),
        (["--threads=2", "plan"], "plan"),
        (["-h"], None),
        ([], None),
        (["--version"], None),
        (["nosuch"], "nosuch"),
    ],
)
def test_the_command_of_argv(argv: list[str], command: str | None) -> None:
    from walklens.cli import _command_of

    assert _command_of(argv) == command


def test_an_unknown_command_is_the_same_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from walklens.cli import build_parser, main

    with pytest.raises(SystemExit) as lazy:
        main(["nosuch"])
    got = capsys.readouterr().err
    with pytest.raises(SystemExit) as eager:
        build_parser().parse_args(["nosuch"])
    assert lazy.value.code == eager.value.code == 2
    assert got == capsys.readouterr().err and got.startswith("walklens: error: argument COMMAND: invalid choice")
    assert got.count("\n") == 1


def test_the_views_register_before_anything_is_shown() -> None:
    """``import walklens`` leaves the notebook views unloaded; the first look-up of a view (``_repr_html_``,
    ``registered_views``) imports them, so every view is registered before a result is drawn."""
    code = """
import sys
import walklens
from walklens.base.display import Shown, registered_views
assert "walklens.reports.notebook" not in sys.modules

class Unknown(Shown, view="no-such-view"):
    pass

try:
    Unknown()._repr_html_()
except TypeError as e:
    assert "no notebook view" in str(e), e
assert "walklens.reports.notebook" in sys.modules
import walklens.reports.notebook as notebook
assert registered_views() == {name: notebook.html for name in notebook.VIEWS}
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
