"""Experiment files: a whole study in one TOML file (seed 000, sec. 5: models x tests x shots, like Fig. 10).

``walklens experiment run FILE`` runs every (model, few-shot seed, shots, test) of the file into one database
(:func:`~.sweep.study.run_experiment`); ``walklens report --db`` reports them all.  Example
(``docs/examples/experiment.toml``)::

    tests = [1, 2]                 # Test 1 (pyramidal generation) and/or Test 2 (concept similarity)
    shots = [0, 5]                 # few-shot examples per item (default [0])
    seeds = [1234]                 # few-shot sampling seeds (default [1234]; zero-shot runs once)
    items = [0, 200]               # the item range [start, stop) of the data file, or N for the first N
    grid = "standard"              # every test's grid: full, standard or a grid file (docs/sweep.md)
    [grids]                        # per test, overriding `grid`
    test1 = "../results/test1_grid.toml"
    # data = "hellaswag.jsonl"     # default: $WALKLENS_HELLASWAG, else the bundled validation set
    # layers = ["E", "0", "middle", "-2", "-1"]   # the layer set of full grids
    # db = "results.sqlite"        # default: --db
    # cache = "bank"               # the vector bank's cache (default: DB.bank next to the database; false: none)

    [[models]]
    name = "smollm2-135m"          # short name, .gguf, local folder or hub id
    dtype = "float32"              # float32 (default), bfloat16, float16
    device = "cpu"                 # cpu (default) or cuda

    [backend]                      # defaults of --backend, --address, --workers (the command line wins)
    name = "ray"
    workers = 2
    # address = "ray://head:10001"; cpus_per_worker = 1; gpus_per_worker = 1; runtime_env = {...}

Relative paths (grid files, data, db, cache) are relative to the experiment file's folder.  Every key is
checked when the file is read, before any model loads: a bad one is one :class:`InputError` line naming the
file and the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...analyses.concepts.schemes import canonical_layer
from ...base.errors import InputError
from ...base.numbers import NON_NEGATIVE, POSITIVE, SEED, NumberError, Range
from ...base.precision import DTYPES
from ...core.backends import BACKENDS
from ..hellaswag.data import FEWSHOT_SEED, HF_PREFIX
from .grid import GridSpec, read_toml

_TOP = (
    "name",
    "description",
    "models",
    "tests",
    "shots",
    "seeds",
    "items",
    "grid",
    "grids",
    "layers",
    "data",
    "db",
    "cache",
    "backend",
)
_MODEL = ("name", "dtype", "device")
_BACKEND = ("name", "address", "workers", "cpus_per_worker", "gpus_per_worker", "runtime_env")
SEED_LIMIT = 2**63


@dataclass(frozen=True)
class ModelEntry:
    """One model of a study: how to load it."""

    spec: str
    dtype: str = "float32"
    device: str = "cpu"


@dataclass(frozen=True)
class Experiment:
    """A parsed, checked experiment file (module docstring); paths are resolved against its folder."""

    path: Path
    models: tuple[ModelEntry, ...]
    tests: tuple[int, ...]
    grids: dict[int, str]
    shots: tuple[int, ...] = (0,)
    seeds: tuple[int, ...] = (FEWSHOT_SEED,)
    items: tuple[int, int | None] = (0, None)
    layers: tuple[str, ...] | None = None
    data: str | None = None
    db: str | None = None
    cache: str | None | bool = None
    backend: dict[str, Any] = field(default_factory=dict)

    def runs(self) -> list[tuple[ModelEntry, int, int, int]]:
        """Every ``(model, seed, shots, test)`` in the order they run (a model's runs together, so its workers
        load it once); zero-shot runs once, with the first seed."""
        out: list[tuple[ModelEntry, int, int, int]] = []
        for m in self.models:
            for k in self.shots:
                for seed in self.seeds if k else self.seeds[:1]:
                    out.extend((m, seed, k, t) for t in self.tests)
        return out


class _Reader:
    """Checks of one file's values; every refusal is one line ``FILE: key: why``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, why: str) -> InputError:
        return InputError(f"{self.path}: {key}: {why}")

    def unknown(self, table: dict[str, Any], allowed: Sequence[str], where: str = "") -> None:
        for k in table:
            if k not in allowed:
                raise self.fail(f"{where}{k}", f"unknown key; known: {', '.join(allowed)}")

    def string(self, v: Any, key: str) -> str:
        if not isinstance(v, str) or not v.strip():
            raise self.fail(key, f"must be a non-empty string, not {_show(v)}")
        return v

    def integer(self, v: Any, key: str, lo: int, hi: int | None = None) -> int:
        return self.number_in(v, key, Range(lo, None if hi is None else hi - 1, integer=True))

    def number(self, v: Any, key: str, positive: bool) -> float:
        return self.number_in(v, key, POSITIVE if positive else NON_NEGATIVE)

    def number_in(self, v: Any, key: str, rng: Range) -> Any:
        """``v`` checked by the shared :class:`walklens.base.numbers.Range` ``rng``; refused as ``FILE: key: ...``."""
        try:
            return rng.check(v)
        except NumberError as e:
            raise self.fail(key, str(e)) from None

    def int_list(
        self,
        v: Any,
        key: str,
        lo: int,
        hi: int | None = None,
        allowed: Sequence[int] | None = None,
        rng: Range | None = None,
    ) -> tuple[int, ...]:
        if not isinstance(v, list) or not v:
            raise self.fail(key, f"must be a non-empty list, not {_show(v)}")
        out = tuple(self.integer(x, key, lo, hi) if rng is None else self.number_in(x, key, rng) for x in v)
        if allowed is not None and any(x not in allowed for x in out):
            raise self.fail(key, f"values must be among {list(allowed)}, not {_show(v)}")
        if len(set(out)) != len(out):
            raise self.fail(key, f"repeats a value: {_show(v)}")
        return out

    def relative(self, v: str) -> str:
        """A path relative to the experiment file's folder (``hf:`` sources and absolute paths as they are)."""
        if v.startswith(HF_PREFIX) or Path(v).expanduser().is_absolute():
            return str(Path(v).expanduser()) if not v.startswith(HF_PREFIX) else v
        return str(self.path.parent / v)


def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _models(r: _Reader, v: Any) -> tuple[ModelEntry, ...]:
    if not isinstance(v, list) or not v:
        raise r.fail("models", "must be a non-empty list of [[models]] tables (name, dtype, device)")
    out: list[ModelEntry] = []
    for i, m in enumerate(v):
        where = f"models[{i}]"
        if isinstance(m, str):
            m = {"name": m}
        if not isinstance(m, dict):
            raise r.fail(where, f"must be a table with name, dtype, device, not {_show(m)}")
        r.unknown(m, _MODEL, f"{where}.")
        if "name" not in m:
            raise r.fail(f"{where}.name", "missing (a short name, .gguf file, local folder or hub id)")
        spec = r.string(m["name"], f"{where}.name")
        if not Path(spec).is_absolute() and (r.path.parent / spec).exists():
            spec = str(r.path.parent / spec)  # a local folder or .gguf next to the file
        dtype = m.get("dtype", "float32")
        if dtype not in DTYPES:
            raise r.fail(f"{where}.dtype", f"must be one of {', '.join(DTYPES)}, not {_show(dtype)}")
        device = m.get("device", "cpu")
        if not isinstance(device, str) or not (
            device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())
        ):
            raise r.fail(f"{where}.device", f"must be cpu, cuda or cuda:N, not {_show(device)}")
        entry = ModelEntry(spec, dtype, device)
        if any((e.spec, e.dtype) == (spec, dtype) for e in out):
            raise r.fail(where, f"{spec} in {dtype} is listed twice")
        out.append(entry)
    return tuple(out)


def _items(r: _Reader, v: Any) -> tuple[int, int | None]:
    if isinstance(v, int) and not isinstance(v, bool):
        return 0, r.integer(v, "items", 1)
    if isinstance(v, list) and len(v) == 2:
        a, b = r.integer(v[0], "items", 0), r.integer(v[1], "items", 1)
        if a >= b:
            raise r.fail("items", f"the range [start, stop) is empty: {_show(v)}")
        return a, b
    raise r.fail("items", f"must be N (the first N items) or [start, stop], not {_show(v)}")


def _backend(r: _Reader, v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise r.fail("backend", "must be a table ([backend])")
    r.unknown(v, _BACKEND, "backend.")
    out: dict[str, Any] = {}
    if "name" in v:
        if v["name"] not in BACKENDS:
            raise r.fail("backend.name", f"must be {' or '.join(BACKENDS)}, not {_show(v['name'])}")
        out["name"] = v["name"]
    if "address" in v:
        from ...core.backends.ray_backend import check_address

        try:
            out["address"] = check_address(r.string(v["address"], "backend.address"))
        except InputError as e:
            raise r.fail("backend.address", str(e)) from None
    if "workers" in v:
        out["workers"] = r.integer(v["workers"], "backend.workers", 1)
    if "cpus_per_worker" in v:
        out["cpus_per_worker"] = r.number(v["cpus_per_worker"], "backend.cpus_per_worker", positive=True)
    if "gpus_per_worker" in v:
        out["gpus_per_worker"] = r.number(v["gpus_per_worker"], "backend.gpus_per_worker", positive=False)
    if "runtime_env" in v:
        if not isinstance(v["runtime_env"], dict):
            raise r.fail("backend.runtime_env", "must be a table (passed to ray.init)")
        out["runtime_env"] = v["runtime_env"]
    return out


def _grids(r: _Reader, doc: dict[str, Any], tests: tuple[int, ...], layers: tuple[str, ...] | None) -> dict[int, str]:
    shared = r.string(doc["grid"], "grid") if "grid" in doc else None
    per = doc.get("grids", {})
    if not isinstance(per, dict):
        raise r.fail("grids", "must be a table (test1 = ..., test2 = ...)")
    r.unknown(per, ("test1", "test2"), "grids.")
    out: dict[int, str] = {}
    for t in tests:
        key = f"grids.test{t}" if f"test{t}" in per else "grid"
        v = per.get(f"test{t}", shared)
        if v is None:
            raise r.fail(
                f"grids.test{t}", f"missing: give grid = ... or grids.test{t} = ... (full, standard or a grid file)"
            )
        g = r.string(v, key)
        g = g if g in ("full", "standard") else r.relative(g)
        try:
            GridSpec.resolve(g, t, "decoder", layers)  # a bad grid fails here, before any model loads
        except InputError as e:
            raise r.fail(key, str(e)) from None
        out[t] = g
    return out


def read_experiment(path: str | Path) -> Experiment:
    """Read and check an experiment file (module docstring)."""
    p = Path(path)
    doc = read_toml(p, "experiment")
    r = _Reader(p)
    r.unknown(doc, _TOP)
    for k in ("name", "description"):
        if k in doc:
            r.string(doc[k], k)
    if "models" not in doc:
        raise r.fail("models", "missing: add one [[models]] table per model (name = ...)")
    if "tests" not in doc:
        raise r.fail("tests", "missing: tests = [1, 2] (Test 1 and/or Test 2)")
    tests = r.int_list(doc["tests"], "tests", 1, allowed=(1, 2))
    layers = None
    if "layers" in doc:
        v = doc["layers"]
        if not isinstance(v, list) or not v:
            raise r.fail("layers", f"must be a non-empty list, not {_show(v)}")
        try:
            layers = tuple(canonical_layer(x) for x in v)
        except InputError as e:
            raise r.fail("layers", str(e)) from None
    data = None
    if "data" in doc:
        data = r.relative(r.string(doc["data"], "data"))
        if not data.startswith(HF_PREFIX) and not Path(data).is_file():
            raise r.fail("data", f"{data}: no such file")
    cache: str | bool | None = None
    if "cache" in doc:
        c = doc["cache"]
        if c is not False:
            cache = r.relative(r.string(c, "cache"))
        else:
            cache = False
    return Experiment(
        path=p,
        models=_models(r, doc["models"]),
        tests=tests,
        grids=_grids(r, doc, tests, layers),
        shots=r.int_list(doc["shots"], "shots", 0) if "shots" in doc else (0,),
        seeds=r.int_list(doc["seeds"], "seeds", 0, rng=SEED) if "seeds" in doc else (FEWSHOT_SEED,),
        items=_items(r, doc["items"]) if "items" in doc else (0, None),
        layers=layers,
        data=data,
        db=r.relative(r.string(doc["db"], "db")) if "db" in doc else None,
        cache=cache,
        backend=_backend(r, doc["backend"]) if "backend" in doc else {},
    )
