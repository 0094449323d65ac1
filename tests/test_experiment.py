"""Experiment files (issue 15): every key checked with one line naming the file and the key (fuzzed), the runs
they expand to, and ``walklens experiment run`` end to end on two tiny models (local backend) with a resume
and ``walklens report`` over the whole database."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walklens.base.errors import InputError
from walklens.lab.experiments.experiment import Experiment, ModelEntry, read_experiment

GOOD = """
name = "two models"
tests = [1, 2]
shots = [0, 5]
seeds = [1234, 7]
items = [10, 30]
grid = "standard"
layers = ["E", "middle", "-1"]
[grids]
test1 = "g1.toml"
[[models]]
name = "smollm2-135m"
[[models]]
name = "gemma3-270m"
dtype = "bfloat16"
device = "cuda:0"
[backend]
name = "ray"
workers = 2
address = "ray://head:10001"
gpus_per_worker = 0.5
runtime_env = { env_vars = { OMP_NUM_THREADS = "1" } }
"""


def write(folder: Path, text: str, name: str = "exp.toml") -> Path:
    p = folder / name
    p.write_text(text, encoding="utf-8")
    return p


def test_a_good_file_and_its_runs(tmp_path: Path) -> None:
    write(tmp_path, 'word = ["last"]\n', "g1.toml")
    exp = read_experiment(write(tmp_path, GOOD))
    assert exp.models == (ModelEntry("smollm2-135m"), ModelEntry("gemma3-270m", "bfloat16", "cuda:0"))
    assert exp.tests == (1, 2) and exp.shots == (0, 5) and exp.seeds == (1234, 7) and exp.items == (10, 30)
    assert exp.grids == {1: str(tmp_path / "g1.toml"), 2: "standard"}  # relative to the file's folder
    assert exp.layers == ("E", "middle", "-1") and exp.db is None and exp.cache is None
    assert exp.backend == {
        "name": "ray",
        "workers": 2,
        "address": "ray://head:10001",
        "gpus_per_worker": 0.5,
        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}},
    }
    runs = [(m.spec, seed, k, t) for m, seed, k, t in exp.runs()]
    # a model's runs together; zero-shot once (first seed), every seed for few-shot
    assert runs[:6] == [
        ("smollm2-135m", 1234, 0, 1),
        ("smollm2-135m", 1234, 0, 2),
        ("smollm2-135m", 1234, 5, 1),
        ("smollm2-135m", 1234, 5, 2),
        ("smollm2-135m", 7, 5, 1),
        ("smollm2-135m", 7, 5, 2),
    ]
    assert len(runs) == 12 and {r[0] for r in runs[6:]} == {"gemma3-270m"}
    minimal = read_experiment(write(tmp_path, 'tests = [2]\ngrid = "full"\nmodels = ["smollm2-135m"]\n', "m.toml"))
    assert isinstance(minimal, Experiment) and minimal.shots == (0,) and minimal.items == (0, None)


BAD = [
    ("bogus = 1", "bogus: unknown key"),
    ("tests = [2]\ngrid = 'full'", "models: missing"),
    ("models = ['m']\ngrid = 'full'", "tests: missing"),
    ("tests = [3]", "tests: values must be among [1, 2]"),
    ("tests = [2, 2]", "tests: repeats a value"),
    ("tests = [2]\nshots = [-1]", "shots: must be an integer from 0"),
    ("tests = [2]\nseeds = [true]", "seeds: must be an integer"),
    ("tests = [2]\nitems = [5, 2]", "items: the range [start, stop) is empty"),
    ("tests = [2]\nitems = 'all'", "items: must be N"),
    ("tests = [1]", "grids.test1: missing"),
    ("tests = [2]\ngrid = 'nope.toml'", "grid: "),
    ("tests = [2]\n[grids]\ntest3 = 'full'", "grids.test3: unknown key"),
    ("tests = [2]\nlayers = ['top']", "layers: invalid layer 'top'"),
    ("tests = [2]\ndata = 'missing.jsonl'", "data: "),
    ("tests = [2]\n[[models]]\nname = 'm'\ndtype = 'int8'", "models[0].dtype: must be one of"),
    ("tests = [2]\n[[models]]\nname = 'm'\ndevice = 'tpu'", "models[0].device: must be cpu, cuda or cuda:N"),
    ("tests = [2]\n[[models]]\nname = 'm'\n[[models]]\nname = 'm'", "models[1]: m in float32 is listed twice"),
    ("tests = [2]\n[[models]]\ndtype = 'float32'", "models[0].name: missing"),
    ("tests = [2]\n[[models]]\nname = 'm'\nlayer = 3", "models[0].layer: unknown key"),
    ("tests = [2]\n[backend]\nworkers = 0", "backend.workers: must be a positive integer"),
    ("tests = [2]\n[backend]\nname = 'dask'", "backend.name: must be local or ray"),
    ("tests = [2]\n[backend]\naddress = 'no address'", "backend.address: Ray address must be"),
    ("tests = [2]\n[backend]\ncpus_per_worker = 0", "backend.cpus_per_worker: must be a positive number"),
    ("tests = [2]\n[backend]\nruntime_env = 3", "backend.runtime_env: must be a table"),
    ("tests = [2", "not valid TOML"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_each_bad_key_is_one_line_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    models = "" if ("models" in text or message.startswith("models")) else "models = ['smollm2-135m']\n"
    grid = "" if ("grid" in text or "tests = [1]" in text or "tests" not in text) else "grid = 'standard'\n"
    p = write(tmp_path, models + grid + text + "\n")
    with pytest.raises(InputError) as e:
        read_experiment(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and message in msg and "\n" not in msg, msg


_VALUES: dict[str, list[str]] = {
    "tests": ["[1]", "[2]", "[1, 2]", "[]", "[0]", "'1'", "[1, 1]"],
    "shots": ["[0]", "[0, 5]", "[-2]", "5", "[1.5]"],
    "seeds": ["[1]", "[9223372036854775807]", "[-1]", "['x']"],
    "items": ["4", "[0, 4]", "[4, 4]", "0", "[1]", "{ start = 1 }"],
    "grid": ["'full'", "'standard'", "'x.toml'", "3", "''"],
    "grids": ["{ test1 = 'standard' }", "{ test2 = 'full' }", "{ test9 = 'full' }", "'full'"],
    "layers": ["['E', '-1']", "[]", "['x']", "[3, 'middle']"],
    "models": [
        "['m']",
        "[{ name = 'm', dtype = 'float16' }]",
        "[]",
        "[{ name = 3 }]",
        "'m'",
        "[{ name = 'm', device = 'cuda:x' }]",
        "[1]",
    ],
    "backend": [
        "{ name = 'ray', workers = 3 }",
        "{ workers = -1 }",
        "{ gpus_per_worker = -1 }",
        "{ address = 'auto' }",
        "{ extra = 1 }",
        "[]",
    ],
    "cache": ["false", "'bank'", "true", "''"],
    "db": ["'r.sqlite'", "1"],
    "data": ["'missing.jsonl'", "7"],
    "description": ["'x'", "[]"],
    "unknown_key": ["1"],
}


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(st.sampled_from(sorted(_VALUES)), st.integers(0, 6), min_size=0, max_size=8))
def test_fuzzed_files_are_read_or_refused_in_one_line(tmp_path: Path, picks: dict[str, int]) -> None:
    """Any combination of good and bad values: an :class:`Experiment`, or one ``InputError`` line naming the
    file -- never another exception."""
    lines = [f"{k} = {_VALUES[k][i % len(_VALUES[k])]}" for k, i in picks.items()]
    p = write(tmp_path, "\n".join(lines) + "\n", "fuzz.toml")
    try:
        exp = read_experiment(p)
    except InputError as e:
        assert str(e).startswith(f"{p}: ") and "\n" not in str(e), str(e)
        return
    assert exp.models and exp.tests and set(exp.grids) == set(exp.tests)
    assert all(k >= 0 for k in exp.shots) and exp.runs()


# ---- end to end ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two tiny models saved as folders (Llama; Gemma 3: BOS and scaled embeddings) and six items."""
    import torch

    from test_ray import items_jsonl
    from walklens.testing import tiny_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("exp")
    dirs = {}
    for fam in ("llama", "gemma3"):
        lm = tiny_model(fam)
        dirs[fam] = tmp / f"tiny-{fam}"
        lm.model.save_pretrained(dirs[fam])
        lm.tokenizer.save_pretrained(dirs[fam])
    yield {"tmp": tmp, "dirs": dirs, "data": items_jsonl(tmp / "items.jsonl")}
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_experiment_run_end_to_end_resume_and_report(
    two_models: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_ray import T1_GRID
    from walklens.cli import main

    write(tmp_path, T1_GRID, "g1.toml")
    d = two_models["dirs"]
    exp = write(
        tmp_path,
        f"""tests = [1, 2]
shots = [0, 1]
items = [1, 5]
grid = "standard"
data = "{two_models["data"]}"
[grids]
test1 = "g1.toml"
[[models]]
name = "{d["llama"]}"
[[models]]
name = "{d["gemma3"]}"
""",
    )
    db = tmp_path / "study.sqlite"
    args = ["experiment", "run", str(exp), "--db", str(db), "--no-progress"]
    assert main(args + ["--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # wrapped to the terminal's width
    assert "2 model(s), 8 run(s)" in out and not db.exists()
    assert main(args + ["--json", str(tmp_path / "s.json")]) == 0
    info = json.loads((tmp_path / "s.json").read_text())
    assert len(info["runs"]) == 8 and {r["model"] for r in info["runs"]} == {str(d["llama"]), str(d["gemma3"])}
    assert all(r["groups_computed"] > 0 and r["n_items"] == 4 and r["backend"] == "local" for r in info["runs"])
    assert (tmp_path / "study.sqlite.bank").is_dir()  # the default cache, next to the database
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM sweep_runs").fetchone()[0] == 8
        items = {json.dumps(json.loads(r[0])) for r in con.execute("SELECT item_index FROM sweep_runs")}
        assert items == {"[1, 2, 3, 4]"}
    assert main(args + ["--json", str(tmp_path / "s2.json")]) == 0  # again: everything stored, nothing computed
    again = json.loads((tmp_path / "s2.json").read_text())["runs"]
    assert all(r["groups_computed"] == 0 and r["shards_computed"] == {} for r in again)
    rep = tmp_path / "rep"
    assert main(["report", "--db", str(db), "--out", str(rep)]) == 0
    rows = (rep / "summary.csv").read_text().splitlines()[1:]
    assert {(r.split(",")[0], r.split(",")[1]) for r in rows} == {(str(d[f]), t) for f in d for t in ("1", "2")}


def test_experiment_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from walklens.cli import main

    assert main(["experiment", "run", str(tmp_path / "none.toml"), "--db", str(tmp_path / "x.sqlite")]) == 2
    exp = write(tmp_path, 'tests = [2]\ngrid = "standard"\nmodels = ["smollm2-135m"]\n')
    assert main(["experiment", "run", str(exp)]) == 2  # no database anywhere
    (tmp_path / "dir.sqlite").mkdir()
    assert main(["experiment", "run", str(exp), "--db", str(tmp_path / "dir.sqlite")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(e.startswith("walklens: error: ") for e in err), err
    assert (
        "no such experiment file" in err[0] and "no database" in err[1] and "--db" in err[2] and "directory" in err[2]
    )
