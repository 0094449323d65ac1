"""The architecture contracts of docs/architecture.md hold, and they can fail.

The contracts live in pyproject.toml (``[tool.importlinter]``) and are checked by import-linter's ``lint-imports``
on grimp's import graph, which sees every import statement: imports inside functions and under
``TYPE_CHECKING`` count.  One check is ours (:func:`module_cycles`): ``acyclic_siblings`` squashes each sibling
into one node and never looks at a package's own ``__init__``, so a cycle between a package and one of its
modules (``walklens.cli`` -> ``walklens.cli.hellaswag`` -> ``walklens.cli``, the shape of a plugin scan) passes
it; the module-level check below finds it.

grimp never sees an import by name (``importlib.import_module("walklens.reports.notebook")``), so a scan of the source
does (:func:`imports_by_name`): each must run downward (:func:`below`), and the loops of the import graph are
counted with them (:func:`loops`).
"""

from __future__ import annotations

import ast
import dataclasses
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
#: each layers contract of pyproject.toml: (container, [the names of each layer], top to bottom)
LAYERS = [
    (container, [{name.strip("() ") for name in layer.split("|")} for layer in c["layers"]])
    for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    if c["type"] == "layers"
    for container in c["containers"]
]
#: modules whose imports by name no scan can read, and why they never reach walklens
UNREAD_BY_NAME = {"walklens.base.extras": "the third-party modules of each optional extra (EXTRAS), never walklens"}


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


@dataclasses.dataclass(frozen=True, order=True)
class ByName:
    """An import by name: ``importer`` calls ``import_module``/``__import__`` at ``line`` for ``target`` (a module;
    ``P.*`` for any module below ``P`` when part of the name is computed; None when none of it can be read)."""

    importer: str
    target: str | None
    line: int


def _spelled(node: ast.expr, module: str, package: str) -> str | None:
    """The text of a module name as the source spells it (a string, ``__name__``, ``__package__``, an f-string whose
    computed parts read ``*``), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in ("__name__", "__package__"):
        return module if node.id == "__name__" else package
    if isinstance(node, ast.JoinedStr):
        text = ""
        for part in node.values:
            known = _spelled(part.value if isinstance(part, ast.FormattedValue) else part, module, package)
            if known is None:
                return text + "*"
            text += known
        return text
    return None


def _resolved(name: str | None, anchor: str | None) -> str | None:
    """``name`` made absolute (relative to the package ``anchor``), computed parts as one trailing ``.*``."""
    if name is None:
        return None
    level = len(name) - len(name.lstrip("."))
    if level:
        if anchor is None or "*" in anchor:
            return None
        base = anchor.rsplit(".", level - 1)[0]
        name = f"{base}.{name[level:]}" if name[level:] else base
    if "*" in name:
        prefix = name[: name.index("*")].rpartition(".")[0]
        return f"{prefix}.*" if prefix else None
    return name


def imports_by_name(package: Path) -> list[ByName]:
    """Every call of ``import_module`` or ``__import__`` in ``package`` (a folder) that may reach the package's own
    modules: a name of it, or a name the scan cannot read."""
    root = package.name
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        own = module if parts[-1] == "__init__" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called not in ("import_module", "__import__"):
                continue
            args = {k.arg: k.value for k in node.keywords if k.arg}
            name = _spelled(node.args[0], module, own)
            if called == "import_module":
                anchor = node.args[1] if len(node.args) > 1 else args.get("package")
                target = _resolved(name, _spelled(anchor, module, own) if anchor is not None else None)
            else:
                level = node.args[4] if len(node.args) > 4 else args.get("level")
                dots = level.value if isinstance(level, ast.Constant) and isinstance(level.value, int) else 0
                target = _resolved(None if name is None else "." * dots + name, own if dots else None)
            if target is None or target == root or target.startswith(root + "."):
                found.append(ByName(module, target, node.lineno))
    return found


def _layer(module: str, container: str, layers: list[set[str]]) -> int | None:
    child = module.removeprefix(container + ".").split(".")[0] if module.startswith(container + ".") else ""
    return next((i for i, names in enumerate(layers) if child in names), None)


def below(importer: str, target: str) -> bool:
    """Whether ``target`` lies below ``importer``: inside it (a package importing its own modules), or in a lower
    layer of the first layers contract (:data:`LAYERS`) that puts them in different layers.  The package root
    and side-by-side modules never do."""
    if target.startswith(importer + "."):
        return True
    for container, layers in LAYERS:
        a, b = _layer(importer, container, layers), _layer(target, container, layers)
        if a is not None and b is not None and a != b:
            return b > a
    return False


def graph_with_names(package: Path) -> grimp.ImportGraph:
    """grimp's import graph of walklens (imports inside functions and under ``TYPE_CHECKING`` included) plus the
    imports by name of ``package`` that name one module.  One that names ``P.*`` adds nothing: it runs below its
    importer (:func:`test_no_import_by_name_runs_upward`), and an arrow to every module it could name would
    invent loops (``walklens.__getattr__`` to ``walklens.cli``, which reads ``walklens.__version__``)."""
    graph = grimp.build_graph("walklens", cache_dir=None)
    for imp in imports_by_name(package):
        if imp.target in graph.modules:
            graph.add_import(importer=imp.importer, imported=imp.target, line_number=imp.line, line_contents="")
    return graph


def loops(graph: grimp.ImportGraph) -> list[set[str]]:
    """The strongly connected components of more than one module: the modules each reaching all the others."""
    seen: set[str] = set()
    found = []
    for module in sorted(graph.modules):
        if module not in seen:
            loop = graph.find_upstream_modules(module) & graph.find_downstream_modules(module) | {module}
            seen |= loop
            found += [loop] if len(loop) > 1 else []
    return found


def test_no_import_by_name_runs_upward() -> None:
    found = imports_by_name(SRC / "walklens")
    assert {(i.importer, i.target) for i in found} >= {("walklens", "walklens.*"), ("walklens.cli", "walklens.cli.*")}
    assert {i.importer for i in found if i.target is None} <= set(UNREAD_BY_NAME)
    assert [i for i in found if i.target is not None and not below(i.importer, i.target)] == []


def test_the_import_graph_has_no_loop() -> None:
    """No strongly connected component of more than one module, imports inside functions and by name counted."""
    assert [sorted(loop) for loop in loops(graph_with_names(SRC / "walklens"))] == []


def _plant(path: Path, call: str) -> None:
    path.write_text(
        path.read_text() + f"\n\ndef _planted(name: str) -> object:\n    import importlib\n\n    return {call}\n"
    )


def test_an_upward_import_by_name_is_found(tree: Path) -> None:
    package = tree / "src" / "walklens"
    _plant(
        package / "base" / "display.py", 'importlib.import_module("walklens.reports.notebook").html(name)'
    )  # the old upward call
    _plant(package / "core" / "trace.py", '__import__("walklens")')  # the package root: above every layer
    _plant(package / "reports" / "html.py", 'importlib.import_module(f"walklens.cli.{name}")')  # any command
    _plant(package / "cli" / "walk.py", 'importlib.import_module(".generate", __package__)')  # a sibling
    # downward: fine
    _plant(package / "analyses" / "steering.py", 'importlib.import_module(".core.ov", package="walklens")')
    _plant(package / "models" / "base.py", "importlib.import_module(name)")  # unread
    found = imports_by_name(package)
    assert sorted((i.importer, i.target) for i in found if i.target and not below(i.importer, i.target)) == [
        ("walklens.base.display", "walklens.reports.notebook"),
        ("walklens.cli.walk", "walklens.cli.generate"),
        ("walklens.core.trace", "walklens"),
        ("walklens.reports.html", "walklens.cli.*"),
    ]
    assert ("walklens.analyses.steering", "walklens.core.ov") in {(i.importer, i.target) for i in found}
    assert {i.importer for i in found if i.target is None} == {"walklens.base.extras", "walklens.models.base"}


def test_the_upward_call_of_the_display_closes_a_loop(tree: Path) -> None:
    """``_repr_html_`` importing ``walklens.reports.notebook`` by name (as it did before the views registered
    themselves)
    closes one loop through the results, the analyses and the reports."""
    display = tree / "src" / "walklens" / "base" / "display.py"
    _plant(display, 'importlib.import_module("walklens.reports.notebook").html(name)')
    found = loops(graph_with_names(tree / "src" / "walklens"))
    assert (
        len(found) == 1 and {"walklens.base.display", "walklens.reports.notebook", "walklens.core.trace"} <= found[0]
    ), found


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
    broken = {"layers", "instrument-never-imports-lab", "core-rooms", "analyses-never-draw", "models-at-the-bottom"}
    broken |= {"no-cycles"}
    out = lint_broken(tree, broken)  # the CLI reaches the lab: a model importing it reaches the lab too
    assert "walklens.models.base -> walklens.cli.common" in out


def test_a_lazy_import_cycle_breaks_the_contracts(tree: Path) -> None:
    """A cycle that no layer forbids (inside walklens.analyses.concepts), closed by an import inside a function."""
    graph = grimp.build_graph("walklens", cache_dir=None)
    a, b = min(
        (a, b)
        for a in graph.find_descendants("walklens.analyses.concepts")
        for b in graph.find_modules_directly_imported_by(a)
        if b.startswith("walklens.analyses.concepts.") and not graph.find_children(a) and not graph.find_children(b)
    )
    path = tree / "src" / Path(*b.split(".")).with_suffix(".py")
    path.write_text(path.read_text() + f"\n\ndef _close_a_cycle() -> None:\n    import {a}  # noqa: F401\n")
    out = lint_broken(tree, {"no-cycles"})
    assert "No cycles are allowed in walklens.analyses.concepts." in out


def test_a_lazy_import_of_the_package_root_breaks_the_contracts(tree: Path) -> None:
    """The package root imports the notebook views (to register them), so a module below that imports the root,
    even inside a function, reaches the reports: the forbidden contracts see it."""
    trace = tree / "src" / "walklens" / "core" / "trace.py"
    trace.write_text(trace.read_text() + "\n\ndef _root() -> None:\n    import walklens  # noqa: F401\n")
    out = lint_broken(tree, {"layers", "core-rooms", "analyses-rooms", "analyses-never-draw"})
    assert "walklens.core.trace -> walklens (l." in out and "walklens -> walklens.reports.notebook (l." in out


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
    """``file:line`` of every line of the package that names ``auto_class`` outside ``models/`` and ``core/loading.py``:
    a model's kind is asked of its adapter (``lm.kind``, ``lm.is_causal``, ...), never tested on the auto class."""
    hits = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] == "models" or rel == Path("core/loading.py"):
            continue
        hits += [f"{rel}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1) if "auto_class" in line]
    return hits


def test_the_model_kind_is_asked_of_the_adapters() -> None:
    assert kind_tests_outside_adapters(SRC / "walklens") == []


def test_a_kind_test_outside_the_adapters_is_found(tree: Path) -> None:
    package = tree / "src" / "walklens"
    for rel in ("analyses/steering.py", "core/scoring/encode.py"):
        (package / rel).write_text(
            (package / rel).read_text() + '\n\nCAUSAL = lambda lm: lm.adapter.auto_class == "causal"\n'
        )
    (package / "models" / "llama.py").write_text((package / "models" / "llama.py").read_text() + "\n# auto_class\n")
    hits = kind_tests_outside_adapters(package)
    assert [h.rpartition(":")[0] for h in hits] == ["analyses/steering.py", "core/scoring/encode.py"], hits


def test_the_instrument_importing_the_lab_breaks_the_contracts(tree: Path) -> None:
    """An analysis reaching the HellaSwag harness inside a function (as compaction and the concepts once did) breaks
    the lab contract and the layers; one by name is found by the scan."""
    package = tree / "src" / "walklens"
    encoding = package / "analyses" / "walks" / "encoding.py"
    encoding.write_text(
        encoding.read_text() + "\n\ndef _lab() -> None:\n    from walklens.lab.hellaswag import data  # noqa: F401\n"
    )
    out = lint_broken(tree, {"layers", "instrument-never-imports-lab", "no-cycles"})  # the lab stands on walks
    assert "walklens.analyses.walks.encoding -> walklens.lab.hellaswag.data" in out
    _plant(package / "reports" / "walk.py", 'importlib.import_module("walklens.lab.claims")')
    found = imports_by_name(package)
    assert [(i.importer, i.target) for i in found if i.target and not below(i.importer, i.target)] == [
        ("walklens.reports.walk", "walklens.lab.claims")
    ]
