"""The architecture contracts of docs/architecture.md hold, and they can fail.

The contracts live in pyproject.toml (``[tool.importlinter]``) and are checked by import-linter's ``lint-imports``
on grimp's import graph, which sees every import statement: imports inside functions and under
``TYPE_CHECKING`` count.  One check is ours (:func:`module_cycles`): ``acyclic_siblings`` squashes each sibling
into one node and never looks at a package's own ``__init__``, so a cycle between a package and one of its
modules (``walklens.cli`` -> ``walklens.cli.hellaswag`` -> ``walklens.cli``, the shape of a plugin scan) passes
it; the module-level check below finds it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = {
    c["id"]: c["name"]
    for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
}


def lint(src: Path, config: Path) -> tuple[int, dict[str, str], str]:
    """Run lint-imports on the walklens first in ``src``: (exit code, {contract name: KEPT|BROKEN}, output)."""
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: pip install -e '.[test]'"
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "250", "NO_COLOR": "1"}
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(config)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    status = {m[1].strip(): m[2] for m in re.finditer(r"^(.+?)\s*(KEPT|BROKEN)$", out, re.MULTILINE)}
    return done.returncode, status, out


def module_cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """Every import cycle between single modules, package ``__init__`` modules included, as (a, b, ..., a)."""
    return sorted(
        (a, *chain)
        for a in graph.modules
        for b in graph.find_modules_directly_imported_by(a)
        if (chain := graph.find_shortest_chain(b, a))
    )


def test_contracts_hold() -> None:
    code, status, out = lint(SRC, ROOT / "pyproject.toml")
    assert code == 0, out
    assert status == {name: "KEPT" for name in CONTRACTS.values()}, out


def test_no_module_level_cycles() -> None:
    graph = grimp.build_graph("walklens", cache_dir=None)
    assert graph.find_children("walklens"), "grimp found no walklens modules"
    assert module_cycles(graph) == []


def test_module_cycles_sees_a_package_importing_its_own_module() -> None:
    graph = grimp.build_graph("walklens", cache_dir=None)
    graph.add_import(importer="walklens.cli", imported="walklens.cli.common")
    graph.add_import(importer="walklens.cli.common", imported="walklens.cli")
    assert ("walklens.cli", "walklens.cli.common", "walklens.cli") in module_cycles(graph)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of src/walklens and of pyproject.toml to break."""
    shutil.copytree(
        SRC / "walklens", tmp_path / "src" / "walklens", ignore=shutil.ignore_patterns("__pycache__", "*.bz2")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def lint_broken(tree: Path, broken: set[str]) -> str:
    """Lint the copy; assert that exactly the contracts ``broken`` (ids) fail, and return the output."""
    code, status, out = lint(tree / "src", tree / "pyproject.toml")
    assert code == 1, out
    assert status == {name: "BROKEN" if cid in broken else "KEPT" for cid, name in CONTRACTS.items()}, out
    return out


def test_a_model_importing_the_cli_breaks_the_contracts(tree: Path) -> None:
    base = tree / "src" / "walklens" / "models" / "base.py"
    base.write_text("from walklens.cli import common\n" + base.read_text())
    out = lint_broken(tree, {"layers", "analyses-never-draw", "models-at-the-bottom", "no-cycles"})
    assert "walklens.models.base -> walklens.cli.common" in out


def test_a_lazy_import_cycle_breaks_the_contracts(tree: Path) -> None:
    """A cycle that no layer forbids (inside walklens.concepts), closed by an import inside a function."""
    graph = grimp.build_graph("walklens", cache_dir=None)
    a, b = min(
        (a, b)
        for a in graph.find_descendants("walklens.concepts")
        for b in graph.find_modules_directly_imported_by(a)
        if b.startswith("walklens.concepts.") and not graph.find_children(a) and not graph.find_children(b)
    )
    path = tree / "src" / Path(*b.split(".")).with_suffix(".py")
    path.write_text(path.read_text() + f"\n\ndef _close_a_cycle() -> None:\n    import {a}  # noqa: F401\n")
    out = lint_broken(tree, {"no-cycles"})
    assert "No cycles are allowed in walklens.concepts." in out


def test_an_undeclared_module_breaks_the_layers(tree: Path) -> None:
    (tree / "src" / "walklens" / "undeclared.py").write_text("from .capture import capture\n")
    out = lint_broken(tree, {"layers"})
    assert "walklens.undeclared" in out


def test_every_layer_is_documented() -> None:
    """docs/architecture.md names every module the layers contracts place."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    names = {
        name.strip("() ")
        for c in contracts
        if c["type"] == "layers"
        for layer in c["layers"]
        for name in layer.split("|")
    }
    assert {n for n in names if not re.search(rf"`{re.escape(n)}(\.py|/)?`", doc)} == set()


def kind_tests_outside_adapters(package: Path) -> list[str]:
    """``file:line`` of every line of the package that names ``auto_class`` outside ``models/`` and ``loading.py``:
    a model's kind is asked of its adapter (``lm.kind``, ``lm.is_causal``, ...), never tested on the auto class."""
    hits = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] == "models" or rel == Path("loading.py"):
            continue
        hits += [f"{rel}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1) if "auto_class" in line]
    return hits


def test_the_model_kind_is_asked_of_the_adapters() -> None:
    assert kind_tests_outside_adapters(SRC / "walklens") == []


def test_a_kind_test_outside_the_adapters_is_found(tree: Path) -> None:
    package = tree / "src" / "walklens"
    for rel in ("steering.py", "hellaswag/encode.py"):
        (package / rel).write_text(
            (package / rel).read_text() + '\n\nCAUSAL = lambda lm: lm.adapter.auto_class == "causal"\n'
        )
    (package / "models" / "llama.py").write_text((package / "models" / "llama.py").read_text() + "\n# auto_class\n")
    hits = kind_tests_outside_adapters(package)
    assert [h.rpartition(":")[0] for h in hits] == ["hellaswag/encode.py", "steering.py"], hits
