"""docs/recipes.md runs (issue 56): every recipe's code blocks, in order, in an empty folder, on the default model.
Python blocks are executed (the blocks of one recipe share their names); each line of a bash block is one
``walklens ...`` command, run in-process by :func:`walklens.cli.main`, which must exit 0.  A quick test checks the
page's shape (every recipe has Python and a command, every command is walklens', every Python block compiles)."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

RECIPES = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.M | re.S)


def recipes() -> dict[str, list[tuple[str, str]]]:
    """docs/recipes.md's recipes: heading -> its (language, code) blocks in order."""
    out = {}
    for part in RECIPES.read_text(encoding="utf-8").split("\n## ")[1:]:
        title, _, body = part.partition("\n")
        out[title.strip()] = [(m[1], m[2]) for m in BLOCK.finditer(body)]
    return out


def commands(code: str) -> list[list[str]]:
    """A bash block's commands: one per line (``\\`` continues a line; ``#`` starts a comment), each ``walklens
    ARGS...`` as its ARGS."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            assert argv[0] == "walklens", f"not a walklens command: {line!r}"
            out.append(argv[1:])
    return out


def test_every_recipe_has_python_and_commands():
    found = recipes()
    for task in ("top token", "heads", "Steer", "similarity maps", "HellaSwag", "sweep", "pandas",
                 "TransformerLens", "parity card"):  # fmt: skip
        assert any(task in title for title in found), f"no recipe for {task!r}"
    for title, blocks in found.items():
        langs = {lang for lang, _ in blocks}
        assert langs == {"python", "bash"}, f"{title}: {langs}"
        for lang, code in blocks:
            if lang == "python":
                compile(code, f"recipes.md: {title}", "exec")
            else:
                assert commands(code), f"{title}: an empty bash block"


@pytest.mark.slow  # imports every command
def test_a_failing_recipe_is_reported(tmp_path, monkeypatch):
    """The runner can fail: a command that exits 2 and a Python block that raises are both caught."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError, match="exit 2"):
        run_blocks("planted", [("bash", "walklens walk --no-such-option\n")], {})
    with pytest.raises(ZeroDivisionError):
        run_blocks("planted", [("python", "1 / 0\n")], {})


def run_blocks(title: str, blocks: list[tuple[str, str]], namespace: dict[str, Any]) -> None:
    """One recipe's blocks in order in the current folder."""
    from walklens.cli import main

    for lang, code in blocks:
        if lang == "python":
            exec(compile(code, f"recipes.md: {title}", "exec"), namespace)
            continue
        for argv in commands(code):
            try:
                rc = main(argv)
            except SystemExit as e:  # argparse
                rc = e.code
            assert rc == 0, f"{title}: walklens {shlex.join(argv)}: exit {rc}"


@pytest.fixture(scope="module")
def loaded() -> Any:
    """``walklens.load_model`` memoised for the module: every recipe loads the default model, once here."""
    import walklens

    return functools.lru_cache(maxsize=4)(walklens.load_model)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("title", list(recipes()))
def test_recipe_runs(title, tmp_path, monkeypatch, loaded):
    import matplotlib

    import walklens

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WALKLENS_DB", str(tmp_path / "default.sqlite"))  # no recipe writes the user's database
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(walklens, "load_model", loaded)
    run_blocks(title, recipes()[title], {"__name__": "recipe"})
