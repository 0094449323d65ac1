"""The size rules of docs/architecture.md hold, and they can fail.

* no function in ``src/`` over :data:`MAX_LINES` lines, and no module over :data:`MAX_MODULE_LINES` lines;
* no signature over :data:`MAX_PARAMS` parameters, except that a public verb (a public function or method; not a
  constructor) may take more keyword-only options;
* no room (a top-level package; in the four floors each package, and the floor's loose modules together) over
  :data:`MAX_SHARE` of the package's lines; no loose module at the package root but its entry.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "walklens"
MAX_LINES = 60
MAX_MODULE_LINES = 600
MAX_PARAMS = 8
MAX_SHARE = 0.20
FLOORS = ("analyses", "base", "core", "lab")  #: layers made of rooms (docs/architecture.md)


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> tuple[int, int]:
    """(positional-or-keyword parameters, keyword-only parameters) of ``fn``, ``self``/``cls`` left out."""
    a = fn.args
    positional = len(a.posonlyargs) + len(a.args) - (1 if method and (a.posonlyargs or a.args) else 0)
    return positional, len(a.kwonlyargs)


def violations(source: str, where: str = "") -> list[str]:
    """Every function of ``source`` over the line or parameter rule, as ``where:line name why``."""
    out = []
    tree = ast.parse(source)
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
    public_verbs = {
        id(f)
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and not f.name.startswith("_")
    }
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        lines = (fn.end_lineno or fn.lineno) - fn.lineno + 1
        if lines > MAX_LINES:
            out.append(f"{where}:{fn.lineno} {fn.name} is {lines} lines")
        positional, keyword = _params(fn, id(fn) in methods)
        counted = positional if id(fn) in public_verbs else positional + keyword
        if counted > MAX_PARAMS:
            out.append(f"{where}:{fn.lineno} {fn.name} takes {counted} parameters")
    return out


def module_violations(source: str, where: str = "") -> list[str]:
    """``source``, one module, as ``[where is N lines]`` when it is over :data:`MAX_MODULE_LINES` lines, else ``[]``."""
    lines = len(source.splitlines())
    return [f"{where} is {lines} lines"] if lines > MAX_MODULE_LINES else []


def _lines(path: Path) -> int:
    return sum(1 for _ in path.open(encoding="utf-8"))


def test_functions_are_short_and_take_few_parameters() -> None:
    found = [
        v
        for p in sorted(PACKAGE.rglob("*.py"))
        for v in violations(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    ]
    assert found == []


def test_modules_are_short() -> None:
    found = [
        v
        for p in sorted(PACKAGE.rglob("*.py"))
        for v in module_violations(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    ]
    assert found == []


def room_of(rel: Path) -> str:
    """The room of a module (``rel``: its path under ``walklens``): a top-level package, except that the four floors
    (:data:`FLOORS`, layers of the import contracts) are made of rooms: each of their packages is one, and their
    loose modules together are one (``analyses/*.py``); the package root's own modules are one room too."""
    parts = rel.parts
    if len(parts) == 1:
        return "(root)"
    if parts[0] in FLOORS:
        return "/".join(parts[:2]) if len(parts) > 2 else f"{parts[0]}/*.py"
    return parts[0]


def room_shares(package: Path) -> dict[str, float]:
    sizes: dict[str, int] = {}
    for p in package.rglob("*.py"):
        room = room_of(p.relative_to(package))
        sizes[room] = sizes.get(room, 0) + _lines(p)
    total = sum(sizes.values())
    return {r: n / total for r, n in sizes.items()}


def test_no_room_holds_over_a_fifth_of_the_package() -> None:
    assert {r: round(s, 3) for r, s in room_shares(PACKAGE).items() if s > MAX_SHARE} == {}


def test_the_package_root_holds_only_entry_points() -> None:
    """No loose module at the root but the package's own entry (``__init__``, ``__main__``, ``_version``)."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py", "_version.py"]


def test_the_room_rule_can_fail(tmp_path: Path) -> None:
    """A floor's loose modules are one room: 21 lines of 100 in ``analyses/*.py`` break the rule, split over files."""
    (tmp_path / "analyses" / "walks").mkdir(parents=True)
    (tmp_path / "__init__.py").write_text("x = 0\n" * 40)
    (tmp_path / "analyses" / "walks" / "a.py").write_text("x = 0\n" * 39)
    for i in range(3):
        (tmp_path / "analyses" / f"m{i}.py").write_text("x = 0\n" * 7)
    shares = room_shares(tmp_path)
    assert {r for r, s in shares.items() if s > MAX_SHARE} == {"(root)", "analyses/walks", "analyses/*.py"}
    assert round(shares["analyses/*.py"], 2) == 0.21


def test_the_rules_can_fail() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    assert violations(f"def long():\n{body}\n") == [f":1 long is {MAX_LINES + 1} lines"]
    nine = ", ".join(f"a{i}" for i in range(MAX_PARAMS + 1))
    assert violations(f"def _wide({nine}):\n    pass\n") == [f":1 _wide takes {MAX_PARAMS + 1} parameters"]
    assert violations(f"def wide({nine}):\n    pass\n") == [f":1 wide takes {MAX_PARAMS + 1} parameters"]
    # a public verb may take more keyword-only options; a constructor or a private helper may not
    assert violations(f"def verb(a, *, {nine}):\n    pass\n") == []
    assert violations(f"class C:\n    def m(self, a, *, {nine}):\n        pass\n") == []
    assert violations(f"class C:\n    def _m(self, a, *, {nine}):\n        pass\n") == [
        f":2 _m takes {MAX_PARAMS + 2} parameters"
    ]
    assert violations(f"class C:\n    def __init__(self, a, *, {nine}):\n        pass\n") == [
        f":2 __init__ takes {MAX_PARAMS + 2} parameters"
    ]
    assert (
        violations(f"class C:\n    def m(self, {', '.join(f'a{i}' for i in range(MAX_PARAMS))}):\n        pass\n") == []
    )


def test_the_module_rule_can_fail() -> None:
    at_limit = "".join(f"x{i} = {i}\n" for i in range(MAX_MODULE_LINES))
    assert module_violations(at_limit, "m.py") == []
    assert module_violations(at_limit + "y = 0\n", "m.py") == [f"m.py is {MAX_MODULE_LINES + 1} lines"]
    assert module_violations(at_limit + "y = 0", "m.py") == [f"m.py is {MAX_MODULE_LINES + 1} lines"]  # no last newline
