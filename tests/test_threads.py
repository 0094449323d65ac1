"""Threads from the cores no other process uses (walklens.threads), as the CLI sets them."""

from __future__ import annotations

import pytest

from walklens.threads import choose_threads, runnable_others


def test_runnable_others_is_the_least_reading_minus_this_process() -> None:
    readings = iter(["0.50 0.40 0.30 3/120 999", "0.50 0.40 0.30 2/120 999", "0.50 0.40 0.30 4/121 999"])
    assert runnable_others(lambda: next(readings), samples=3, gap=0) == 1
    assert runnable_others(lambda: "1.0 1.0 1.0 1/50 7", samples=1) == 0
    assert runnable_others(lambda: "garbage", samples=1) is None


def test_runnable_others_reads_this_machine() -> None:
    n = runnable_others(samples=1)
    assert n is None or n >= 0


@pytest.mark.parametrize(
    ("default", "cores", "others", "want"),
    [(2, 2, 0, 2), (2, 2, 1, 1), (2, 2, 5, 1), (8, 4, 1, 3), (1, 2, 0, 1), (2, 2, None, 2)],
)
def test_threads_are_the_free_cores_never_more_than_the_default(
    monkeypatch: pytest.MonkeyPatch, default: int, cores: int, others: int | None, want: int
) -> None:
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    if others is None:
        monkeypatch.setattr("walklens.threads.runnable_others", lambda: None)
    assert choose_threads(default, cores=cores, others=others) == want


def test_a_users_thread_count_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads(2, cores=2, others=1) == 2


def test_the_cli_runs_on_the_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from walklens.cli import _threads_from_free_cores

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr("walklens.threads.runnable_others", lambda: 10**6)
    try:
        _threads_from_free_cores()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
