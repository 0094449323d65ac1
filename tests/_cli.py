"""Running the command line in-process, as the one-line-error tests do."""

from __future__ import annotations

import pytest

from walklens.cli import main


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    """``walklens ARGV`` in this process: its exit code and the non-blank lines it wrote to standard error."""
    capfd.readouterr()
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = int(e.code or 0)
    return rc, [line for line in capfd.readouterr().err.splitlines() if line.strip()]
