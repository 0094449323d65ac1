"""A small steering set, the steering card's command line over the tiny saved Llama, and the fixtures the steering
card's test files share (tests/test_steering_card.py, test_steering_card_inputs.py, test_steering_card_store.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from _cli import run


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run far faster on one thread when the cores are shared."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


#: one token target (rows with a rank) and one topic target (rows without), two prompts each, two neutral texts
MINI: list[dict[str, Any]] = [
    {"type": "target", "kind": "token", "name": "paris", "token": " paris", "words": [" paris"],
     "pairs": [["the capital of france is paris", "the capital of england is london"]]},
    {"type": "target", "kind": "topic", "name": "animals", "words": [" dog", " cat"],
     "pairs": [["the dog and the cat", "the car and the house"]]},
    {"type": "prompt", "target": "paris", "split": "choose", "text": "the man walks to the"},
    {"type": "prompt", "target": "paris", "split": "heldout", "text": "she was in the"},
    {"type": "prompt", "target": "animals", "split": "choose", "text": "the queen of england"},
    {"type": "prompt", "target": "animals", "split": "heldout", "text": "a big red"},
    {"type": "neutral", "text": "the boy and the girl walk to the city"},
    {"type": "neutral", "text": "two cats eat"},
]  # fmt: skip


def write_mini(path: Path, records: list[dict[str, Any]] | None = None) -> Path:
    """The records (default :data:`MINI`) as a JSONL steering set at ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in (MINI if records is None else records)), encoding="utf-8")
    return path


def card_argv(set_path: Path | str, model: str, *extra: str) -> list[str]:
    """``walklens steer --card SET`` over the tiny model: one layer, one dose, add and ablate, 3 new tokens."""
    return [
        "steer", "--card", str(set_path), "--model", model, "--layers", "1", "--doses", "1",
        "--methods", "add,ablate", "--max-new-tokens", "3", "--n-boot", "100", *extra,
    ]  # fmt: skip


def one_error(rc: int, err: list[str]) -> str:
    """The one ``walklens: error:`` line of a refused command (exit 2, nothing else on standard error)."""
    assert rc == 2 and len(err) == 1 and err[0].startswith("walklens: error: "), (rc, err)
    assert "internal error" not in err[0] and "Traceback" not in err[0]
    return err[0]


def refused(capfd: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the command line; it must refuse in one line (returned)."""
    return one_error(*run(capfd, *argv))


__all__ = ["MINI", "write_mini", "card_argv", "one_error", "refused"]
