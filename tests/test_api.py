"""The public-API rule (package docstring): ``lm`` everywhere, ``walklens.__all__`` lists every public verb and
result type, 0-based ranks; and the module graph has no import cycles (none dodged by function-level imports)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil

import pytest

import walklens

SRC = pathlib.Path(walklens.__file__).parent

#: The modules whose ``__all__`` make up their group's ``__all__`` (walklens.core, walklens.analyses).
ANALYSES = (
    "core.capture",
    "core.trace",
    "analyses.walks",
    "analyses.decoding",
    "analyses.attention",
    "analyses.kernels",
    "core.ov",
    "analyses.power",
    "analyses.idealised",
    "analyses.steering",
    "core.interventions",
)


#: the packages whose ``__all__`` presents their modules' public names lazily (``_PUBLIC``)
GROUPS = ("walklens.core", "walklens.analyses", "walklens.lab", "walklens.base")


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(walklens.__path__, "walklens.") if not m.name.endswith("__main__")]


@pytest.mark.parametrize("name", ANALYSES)
def test_every_public_name_of_an_analysis_module_is_in_its_group(name):
    mod = importlib.import_module(f"walklens.{name}")
    group = importlib.import_module(f"walklens.{name.split('.')[0]}")
    assert mod.__all__, name
    for public in mod.__all__:
        assert public in group.__all__, f"walklens.{name}.{public} missing from {group.__name__}.__all__"
        assert getattr(group, public) is getattr(mod, public)


def test_all_resolves_and_holds_the_verbs_and_result_types():
    import walklens.lab

    for group in (walklens, walklens.core, walklens.analyses, walklens.lab, walklens.base):
        for name in group.__all__:
            assert getattr(group, name) is not None, f"{group.__name__}.{name}"
        assert len(set(group.__all__)) == len(group.__all__), group.__name__
    first = ("capture", "load_model", "encoding_walk", "decoding_walk", "power_spectra", "steer", "verify", "Trace")
    assert set(first) <= set(walklens.__all__) and len(walklens.__all__) <= 30
    for name in ("capture_batch", "ablate_mlps", "tied_layers", "Trace"):
        assert name in walklens.core.__all__, name
    for name in ("dynamics", "shared_weights", "steering_sweep", "PowerSpectra", "SteerRow", "EncodingWalk"):
        assert name in walklens.analyses.__all__, name
    assert callable(walklens.capture) and walklens.capture.__module__ == "walklens.core.capture"
    assert walklens.capture is walklens.core.capture


def test_a_moved_name_answers_one_release_more_with_a_warning() -> None:
    """Every name the root exported before the groups still resolves there, to the same object, with one
    FutureWarning naming its new home; a name that never existed is an AttributeError."""
    import warnings

    import walklens.lab

    before = set(walklens._MOVED) | set(walklens.__all__)
    assert {"cluster_view", "steering_card", "summarise_db", "ablate_mlps", "get_adapter"} <= set(walklens._MOVED)
    assert set(walklens.lab.__all__) <= before and set(walklens.analyses.__all__) <= before
    for name, home in walklens._MOVED.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(walklens, name)
        assert value is getattr(importlib.import_module(home), name), name
        assert [str(w.message) for w in caught] == [
            f"walklens.{name} is now {home}.{name}; the short alias goes in the next release"
        ] and caught[0].category is FutureWarning
    with pytest.raises(AttributeError, match="no attribute 'no_such_verb'"):
        walklens.no_such_verb  # noqa: B018


def test_the_loaded_model_parameter_is_lm_everywhere():
    bad = []
    for name in _modules():
        mod = importlib.import_module(name)
        for fname, obj in vars(mod).items():
            if inspect.isfunction(obj) and obj.__module__ == name:
                for p in inspect.signature(obj).parameters.values():
                    if "LoadedModel" in str(p.annotation) and p.name != "lm":
                        bad.append(f"{name}.{fname}({p.name})")
    assert not bad, bad


# ---- import graph -------------------------------------------------------------------------------------------------


def _module_files() -> dict[str, pathlib.Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        parts = p.relative_to(SRC.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _targets(files: dict[str, pathlib.Path], cur: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in files}
    pkg = cur if files[cur].name == "__init__.py" else cur.rpartition(".")[0]
    base = pkg
    for _ in range(max(node.level - 1, 0)):
        base = base.rpartition(".")[0]
    target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
    found = {target} if target in files else set()
    return found | {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in files}


def _runtime_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Module-level imports that run (``if TYPE_CHECKING:`` blocks excluded)."""
    out: list[ast.Import | ast.ImportFrom] = []
    for n in body:
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            continue
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out.append(n)
        elif isinstance(n, (ast.If, ast.Try)):
            out += _runtime_imports(n.body)
    return out


def test_module_level_imports_form_no_cycle():
    files = _module_files()
    graph = {
        name: set().union(*[_targets(files, name, n) for n in _runtime_imports(ast.parse(p.read_text()).body)]) - {name}
        for name, p in files.items()
    }
    state: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        for v in sorted(graph[u]):
            assert state.get(v) != 1, f"import cycle: {' -> '.join(path[path.index(v) :] + [u, v])}"
            if v not in state:
                visit(v, path + [u])
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u, [])


@pytest.mark.parametrize(
    "name",
    ANALYSES
    + (
        "core.scoring.encode",
        "core.scoring.packing",
        "core.scoring.request",
        "lab.experiments.runner",
        "lab.experiments.runsetup",
        "lab.concepts.similarity",
        "lab.experiments.sweep.plan",
        "lab.experiments.sweep.bank",
        "lab.experiments.sweep.batched",
        "lab.experiments.sweep.run",
        "lab.experiments.sweep.keys",
        "lab.experiments.sweep.generation",
        "lab.experiments.sweep.similarity",
        "lab.hellaswag.store.db",
        "lab.hellaswag.store.results",
        "lab.hellaswag.store.sweeps",
    ),
)
def test_no_function_level_imports_of_walklens_modules(name):
    """Cycles are broken by layering, not dodged by importing inside functions."""
    files = _module_files()
    full = f"walklens.{name}"
    lazy = []
    for node in ast.walk(ast.parse(files[full].read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)) and _targets(files, full, inner):
                    lazy.append(f"{node.name}: line {inner.lineno}")
    assert not lazy, lazy


def test_hooks_are_registered_in_one_place():
    """Every forward hook goes through walklens.base.hooks.Hooks, which removes it on exit."""
    hits = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if "register_forward" in p.read_text() and p.name != "hooks.py"
    ]
    assert not hits, hits


# ---- one home per public name -------------------------------------------------------------------------------------


def _exports() -> dict[str, dict[str, object]]:
    """Every walklens module's ``__all__``: {module: {name: object}} (the package and its groups left out: each
    presents its modules' names lazily, ``_PUBLIC``)."""
    out = {}
    for name in _modules():
        if name in GROUPS:
            continue
        mod = importlib.import_module(name)
        out[name] = {n: getattr(mod, n) for n in getattr(mod, "__all__", ())}
    return out


def misplaced_exports(exports: dict[str, dict[str, object]]) -> list[str]:
    """Public objects exported by more than one module, other than by the module that defines it and the packages
    above that module (a package's ``__all__`` may present what its own modules define)."""
    by_object: dict[int, tuple[object, list[str]]] = {}
    for module, names in exports.items():
        for name, obj in names.items():
            if isinstance(obj, (int, float, str, bytes, type(None))):  # interned values share identities
                continue
            by_object.setdefault(id(obj), (obj, []))[1].append(f"{module}.{name}")
    bad = []
    for obj, where in by_object.values():
        home = getattr(obj, "__module__", None)
        modules = sorted({w.rpartition(".")[0] for w in where}, key=len)
        deepest = modules[-1]
        above = all(deepest.startswith(m + ".") for m in modules[:-1])
        defined_there = (
            home is None or not home.startswith("walklens") or home == deepest or home.startswith(deepest + ".")
        )
        if not (above and defined_there):
            bad.append(" and ".join(sorted(where)))
    return sorted(bad)


def test_each_public_name_is_exported_by_one_module():
    assert misplaced_exports(_exports()) == []


def test_the_top_level_names_come_from_the_module_that_exports_them():
    for module, names in walklens._PUBLIC.items():
        mod = importlib.import_module(f"walklens.{module}")
        assert set(names) <= set(mod.__all__), module


def test_a_name_exported_by_two_modules_is_found():
    exports = _exports()
    import walklens.base.hooks
    import walklens.core.interventions

    exports["walklens.core.interventions"]["Hooks"] = walklens.base.hooks.Hooks  # a re-export from a module beside it
    exports["walklens.analyses.steering"]["SteerEdit"] = walklens.core.interventions.SteerEdit
    exports["walklens.analyses.compaction"]["Trace"] = walklens.Trace  # a package presenting what it does not hold
    assert misplaced_exports(exports) == sorted(
        [
            "walklens.analyses.compaction.Trace and walklens.core.trace.Trace",
            "walklens.base.hooks.Hooks and walklens.core.interventions.Hooks",
            "walklens.analyses.steering.SteerEdit and walklens.core.interventions.SteerEdit",
        ]
    )


def test_no_public_name_turns_into_its_module() -> None:
    """``import walklens.X`` binds ``walklens.X`` to the module when it first loads it, so a public verb named like
    a module that is imported lazily would turn into that module once anything imports it (``walklens.verify``
    lives in ``walklens.analyses.parity`` for this reason).  A name may share its module's name only when ``walklens``
    binds it eagerly, after loading the module (``capture``); checked in a fresh interpreter."""
    import pkgutil
    import subprocess
    import sys

    import walklens
    import walklens.lab

    shared = [
        f"{group.__name__}.{name}"
        for group in (walklens, *(importlib.import_module(g) for g in GROUPS))
        for name in sorted(set(group.__all__) & {m.name for m in pkgutil.iter_modules(group.__path__)})
    ]
    assert shared == ["walklens.core.capture"]  # the rule reads the real module lists (capture: bound eagerly)
    analyses = {m.name for m in pkgutil.iter_modules(walklens.analyses.__path__)}
    assert "parity" in analyses and "verify" in walklens.analyses.__all__
    code = (
        "import importlib, types, walklens\n"
        f"for n in {shared!r}:\n"
        "    group, _, name = n.rpartition('.')\n"
        "    importlib.import_module(n)\n"
        "    assert not isinstance(getattr(importlib.import_module(group), name), types.ModuleType), n\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-400:]
