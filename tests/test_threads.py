"""The CPU threads a command runs (walklens.base.threads, the CLI's ``--threads``): the count given, else torch's own,
never one the machine's load decides; on a busy machine, one line on a terminal and nothing changed."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import torch

from walklens.base.threads import busy_note, runnable_others
from walklens.cli import main


@pytest.fixture
def threads() -> Iterator[None]:
    """torch's count restored after the test, whatever the test set."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine whose every core is held by other processes, with no count chosen in the environment."""
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr("walklens.base.threads.runnable_others", lambda: 10**6)


def test_runnable_others_is_the_least_reading_minus_this_process() -> None:
    readings = iter(["0.50 0.40 0.30 3/120 999", "0.50 0.40 0.30 2/120 999", "0.50 0.40 0.30 4/121 999"])
    assert runnable_others(lambda: next(readings), samples=3, gap=0) == 1
    assert runnable_others(lambda: "1.0 1.0 1.0 1/50 7", samples=1) == 0
    assert runnable_others(lambda: "garbage", samples=1) is None


def test_runnable_others_reads_this_machine() -> None:
    n = runnable_others(samples=1)
    assert n is None or n >= 0


@pytest.mark.parametrize(
    ("threads", "cores", "others", "free"),
    [(2, 2, 0, None), (2, 2, 1, 1), (2, 2, 5, 1), (8, 4, 1, 3), (1, 2, 3, None), (3, 4, 1, None)],
)
def test_a_note_names_the_threads_that_fit_when_others_hold_cores(
    threads: int, cores: int, others: int, free: int | None
) -> None:
    note = busy_note(threads, cores=cores, others=others)
    if free is None:
        assert note is None
    else:
        assert note is not None and "\n" not in note
        assert f"{others} other process" in note and f"--threads {free} may be faster" in note, note


def test_no_note_where_the_load_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("walklens.base.threads.runnable_others", lambda: None)
    assert busy_note(2, cores=2) is None


def _walk(tiny: dict[str, str], *options: str) -> list[str]:
    return ["walk", "the cat", "--model", tiny["model"], *options]


@pytest.mark.usefixtures("threads", "busy")
def test_the_cli_keeps_torchs_count_on_a_busy_machine(tiny_llama_inputs: dict[str, str]) -> None:
    """Every core held by others: the command still runs torch's own count (it used to drop to one thread)."""
    torch.set_num_threads(3)
    assert main(_walk(tiny_llama_inputs)) == 0
    assert torch.get_num_threads() == 3


@pytest.mark.usefixtures("threads", "busy")
@pytest.mark.parametrize(
    ("before", "after", "want"),
    [(["--threads", "2"], [], 2), ([], ["--threads", "2"], 2), (["--threads", "3"], ["--threads", "2"], 2)],
)
def test_the_cli_runs_the_threads_given_before_or_after_the_command(
    tiny_llama_inputs: dict[str, str], before: list[str], after: list[str], want: int
) -> None:
    torch.set_num_threads(1)
    assert main([*before, *_walk(tiny_llama_inputs, *after)]) == 0
    assert torch.get_num_threads() == want


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two", "100000"])
def test_a_bad_thread_count_is_one_line(capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--threads", value, "walk", "x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("walklens: error: argument --threads:"), err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.usefixtures("threads", "busy")
@pytest.mark.parametrize(("argv", "noted"), [([], True), (["--threads", "2"], False)])
def test_a_terminal_is_told_once_when_others_hold_the_cores(
    monkeypatch: pytest.MonkeyPatch, tiny_llama_inputs: dict[str, str], argv: list[str], noted: bool
) -> None:
    """The note is for a person at a terminal, only when the count was not chosen; the count is not changed."""
    torch.set_num_threads(2)
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    assert main([*argv, *_walk(tiny_llama_inputs)]) == 0
    notes = [ln for ln in term.getvalue().splitlines() if ln.startswith("walklens: note:")]
    assert notes == (["walklens: note: " + str(busy_note(2, others=10**6))] if noted else []), notes
    assert torch.get_num_threads() == 2
