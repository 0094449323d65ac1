"""An output path may never be an input of the same command: every command refuses, in one line and before any
model loads, an output (``--json``, ``--out``, an export file) that names its database, data, cache folder (or
its index), model folder, grid or experiment file, by path, symbolic link or hard link."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from _toy import ROWS, write_items
from walklens.cli import main


def _refused(capsys: Any, calls: list[str], argv: list[str], *needles: str) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and not calls, (code, err, calls)
    assert len(lines) == 1 and lines[0].startswith("walklens: error: "), err
    assert "an output may never replace an input" in lines[0] and all(n in lines[0] for n in needles), err


@pytest.fixture
def db(tmp_path: Path) -> Path:
    from walklens.lab.hellaswag.store import ResultStore

    path = tmp_path / "results.sqlite"
    ResultStore(path).close()
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_items(tmp_path / "toy.jsonl", ROWS)


@pytest.mark.parametrize(
    "cmd",
    [
        ["hellaswag", "baseline"],
        ["hellaswag", "test2"],
        ["hellaswag", "test1"],
        ["sweep", "--test", "2"],
        ["hellaswag", "sweep", "--test", "1"],
        ["hellaswag", "compaction", "--out", "{out}"],
    ],
)
@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "env", "wal"])
def test_json_never_replaces_the_database(cmd, how, db, data, tmp_path, monkeypatch, no_model, capsys):
    before = db.read_bytes()
    target = {
        "same": db,
        "symlink": tmp_path / "link.json",
        "hardlink": tmp_path / "hard.json",
        "env": db,
        "wal": db.with_name(db.name + "-wal"),
    }[how]
    if how == "symlink":
        target.symlink_to(db)
    if how == "hardlink":
        os.link(db, target)
    argv = [a.format(out=tmp_path / "out") for a in cmd] + ["--data", str(data), "--json", str(target)]
    if how == "env":
        monkeypatch.setenv("WALKLENS_DB", str(db))
    else:
        argv += ["--db", str(db)]
    _refused(capsys, no_model, argv, "--json", "--db")
    assert db.read_bytes() == before


def test_json_never_replaces_a_database_not_made_yet(tmp_path, data, no_model, capsys):
    new = tmp_path / "new.sqlite"
    _refused(
        capsys, no_model, ["hellaswag", "baseline", "--data", str(data), "--db", str(new), "--json", str(new)], "--db"
    )
    assert not new.exists()


@pytest.mark.parametrize(
    "cmd", [["hellaswag", "baseline", "--no-db"], ["hellaswag", "test2"], ["sweep", "--test", "2"]]
)
def test_json_never_replaces_the_data(cmd, data, db, no_model, capsys):
    before = data.read_bytes()
    _refused(capsys, no_model, [*cmd, "--db", str(db), "--data", str(data), "--json", str(data)], "--data")
    assert data.read_bytes() == before


def test_json_never_replaces_the_default_data(tmp_path, data, db, monkeypatch, no_model, capsys):
    monkeypatch.setenv("WALKLENS_HELLASWAG", str(data))
    _refused(capsys, no_model, ["hellaswag", "baseline", "--db", str(db), "--json", str(data)], "--data")


@pytest.mark.parametrize(
    "argv,opt",
    [
        (["compact", "some text to compact", "--json", "{cache}/index.sqlite"], "--json"),
        (["hellaswag", "test1", "--db", "{db}", "--data", "{data}", "--json", "{cache}/index.sqlite"], "--json"),
        (["sweep", "--test", "2", "--db", "{db}", "--data", "{data}", "--json", "{cache}/shards/x.json"], "--json"),
        (["hellaswag", "compaction", "--db", "{db}", "--data", "{data}", "--out", "{cache}"], "--out"),
    ],
)
def test_outputs_never_land_in_the_cache(argv, opt, db, data, tmp_path, no_model, capsys):
    from walklens.analyses.concepts.cache import ConceptCache

    cache = tmp_path / "cache"
    ConceptCache(cache).close()
    index = (cache / "index.sqlite").read_bytes()
    _refused(
        capsys,
        no_model,
        [a.format(db=db, data=data, cache=cache) for a in argv] + ["--cache", str(cache)],
        opt,
        "--cache",
    )
    assert (cache / "index.sqlite").read_bytes() == index and os.listdir(cache / "shards") == []


def test_outputs_never_replace_the_model_folder_or_a_text_file(tmp_path, no_model, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    _refused(capsys, no_model, ["walk", "hi", "--model", str(model), "--json", str(model / "config.json")], "--model")
    _refused(capsys, no_model, ["walk", "hi", "--model", str(model), "--out", str(model)], "--out", "--model")
    text = tmp_path / "t.txt"
    text.write_text("a text")
    _refused(capsys, no_model, ["walk", f"@{text}", "--json", str(text)], "@FILE")
    _refused(capsys, no_model, ["power", "a", f"@{text}", "--json", str(text)], "@FILE")
    assert text.read_text() == "a text" and (model / "config.json").read_text() == "{}"


def test_export_never_replaces_the_database(db, tmp_path, capsys):
    before = db.read_bytes()
    _refused(capsys, [], ["hellaswag", "export", str(db), "--db", str(db)], "out", "--db")
    link = tmp_path / "x.csv"
    link.symlink_to(db)
    _refused(capsys, [], ["hellaswag", "export", str(link), "--db", str(db)], "--db")
    assert db.read_bytes() == before
    assert main(["hellaswag", "export", str(tmp_path / "ok.csv"), "--db", str(db)]) == 0


def test_sweep_grid_and_experiment_file_are_inputs(tmp_path, db, data, no_model, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text('[1]\nlayer = ["-1"]\n')
    _refused(
        capsys,
        no_model,
        ["sweep", "--test", "1", "--grid", str(grid), "--db", str(db), "--data", str(data), "--json", str(grid)],
        "--grid",
    )
    exp = tmp_path / "exp.toml"
    exp.write_text(f'models = ["tiny"]\ntests = [2]\ngrid = "standard"\ndb = "{db}"\ndata = "{data}"\n')
    for target, needle in ((exp, "FILE"), (db, "--db"), (data, "experiment data")):
        before = target.read_bytes()
        code = main(["experiment", "run", str(exp), "--dry-run", "--json", str(target)])
        err = capsys.readouterr().err
        assert code == 2 and needle in err and "never replace an input" in err, err
        assert target.read_bytes() == before
