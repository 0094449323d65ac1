"""A toy HellaSwag set and a tiny saved model for CLI tests, the CLI run in-process (shared by
tests/test_hellaswag_cli.py and tests/test_compaction_cli.py), and :func:`write_items`, the one writer of the
tests' HellaSwag files; :func:`saved_tiny`, a tiny family's folder as a checkpoint."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from walklens.testing import tiny_model

ROWS = [
    ("the city", "the man walks to the", "river. he", ["runs to the house.", "eats a red car.", "was big", "ran."], 0),
    ("a dog", "the dog runs. it", "", ["eats.", "was good.", "ran to the queen.", "is red."], 2),
    ("the king", "the king and the queen walk.", "they", ["eat.", "run to london.", "ran.", "walk to paris."], 3),
    ("a cat", "a small cat", "is", ["red.", "big.", "good.", "bad."], 1),
    ("a boy", "the boy eats", "a", ["red car.", "dog.", "big house.", "city."], 0),
    ("a girl", "she walks to", "the", ["river.", "king.", "blue car.", "one."], 2),
]


#: one HellaSwag item as the tests write it: (ctx_a, ctx_b, endings, label), or with the activity label first
Row = tuple[str, str, Sequence[str], int] | tuple[str, str, str, Sequence[str], int]


def write_items(path: Path, rows: Iterable[Row]) -> Path:
    """``rows`` as a HellaSwag file in rowanz's ``.jsonl`` format at ``path`` (activity label ``x`` where a row
    has none); returns ``path``."""
    lines = []
    for row in rows:
        a, ca, cb, e, label = row if len(row) == 5 else ("x", *row)
        lines.append(json.dumps({"activity_label": a, "ctx_a": ca, "ctx_b": cb, "endings": list(e), "label": label}))
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def cli_runner(capsys: Any) -> Callable[..., SimpleNamespace]:
    """The CLI in-process (``walklens.cli.main``), returning code and captured output like a subprocess."""
    from walklens.cli import main

    def call(*args: str) -> SimpleNamespace:
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse errors
            code = e.code
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return call


def saved_tiny(family: str, dtype: str, root: Path) -> Path:
    """The tiny ``family`` model saved as safetensors (in ``dtype``) with its tokenizer under ``root``."""
    lm = tiny_model(family, dtype=dtype)
    folder = root / f"{family}-{dtype}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm.model.save_pretrained(str(folder))
        lm.tokenizer.save_pretrained(str(folder))
    return folder


def write_toy(d: Path, rows: int = len(ROWS)) -> SimpleNamespace:
    """A tiny random llama saved under ``d/model`` and the first ``rows`` of :data:`ROWS` as ``d/toy.jsonl``."""
    lm = tiny_model("llama")
    lm.model.save_pretrained(str(d / "model"), safe_serialization=True)
    lm.tokenizer.save_pretrained(str(d / "model"))
    data = write_items(d / "toy.jsonl", ROWS[:rows])
    return SimpleNamespace(dir=d, lm=lm, model=str(d / "model"), data=str(data))
