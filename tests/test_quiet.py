"""Quiet by default (issue 56): every command accepts ``--no-progress``; a command's progress bars are drawn only on
a terminal and only after :data:`walklens.cli.terminal.PROGRESS_DELAY` seconds of work; ``walklens --help`` and
``import walklens.cli`` are measured in benchmarks/bench_help.py (no wall-clock assertion here)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import tqdm.auto

from walklens.cli import _below, build_parser
from walklens.cli.terminal import PROGRESS_DELAY, progress_bars


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [p for p in dict.fromkeys(_below(parser))]


def test_every_command_accepts_no_progress() -> None:
    parser = build_parser()
    missing = [p.prog for p in _leaves(parser) if "--no-progress" not in p._option_string_actions]
    assert not missing, missing


def test_steer_and_walk_parse_no_progress() -> None:
    parser = build_parser()
    args = parser.parse_args(["walk", "hi", "--no-progress"])
    assert args.no_progress is True
    args = parser.parse_args(["walk", "hi"])
    assert not getattr(args, "no_progress", False)


def test_bars_wait_and_go_quiet() -> None:
    with progress_bars(quiet=False):
        bar = tqdm.auto.tqdm(range(3))
        assert bar.delay == PROGRESS_DELAY and not bar.disable
        bar.close()
        explicit = tqdm.auto.tqdm(range(3), disable=True)
        assert explicit.disable
    with progress_bars(quiet=True):
        bar = tqdm.auto.tqdm(range(3), disable=False)
        assert bar.disable
    assert tqdm.auto.tqdm is not None and tqdm.auto.tqdm.__name__ != "Bar"  # put back


def test_off_a_terminal_a_command_draws_no_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` under pytest (standard error not a terminal): the command sees ``no_progress`` set and every bar
    it makes is disabled, though it asked for none of that."""
    import walklens.cli as cli

    seen: dict[str, Any] = {}

    def fake(args: argparse.Namespace) -> int:
        seen["no_progress"] = args.no_progress
        seen["disabled"] = tqdm.auto.tqdm(range(2), disable=False).disable
        return 0

    real = cli.build_parser

    def parser(command: str | None = "*") -> argparse.ArgumentParser:  # main builds only the command it runs
        p = real(command)
        walk = next(c for c in _below(p) if c.prog.endswith(" walk"))
        walk.set_defaults(func=fake)
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    assert cli.main(["walk", "hi"]) == 0
    assert seen == {"no_progress": True, "disabled": True}
