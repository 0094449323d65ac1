"""Every command that needs an optional extra says, when the extra is not installed, one line with the install
command and exits 2 (walklens.base.extras): each missing module is simulated in a fresh process
(``sys.modules[name] = None``, which makes ``import name`` fail as if it were not installed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from walklens.base.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

RUN = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError, as if it were not installed
from walklens.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_without(modules: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``walklens ARGV`` in a fresh process where ``modules`` (comma-separated) cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", RUN, modules, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(SRC)),
    )


def one_line(r: subprocess.CompletedProcess[str], what: str, module: str, extra: str) -> None:
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"walklens: error: {what} needs the '{extra}' extra ({module} is not "
        f"installed): pip install 'walklens[{extra}]'"
    ], r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("module", ["starlette", "uvicorn"])
def test_serve_without_the_serve_extra(module: str, tmp_path: Path) -> None:
    """Before anything is bound or loaded (the model named does not exist)."""
    r = run_without(module, ["serve", "--model", str(tmp_path / "no-model"), "--port", "0"])
    one_line(r, "walklens serve", module, "serve")


@pytest.mark.slow
def test_sweep_on_ray_without_the_ray_extra(tiny_llama_inputs: dict[str, str], tmp_path: Path) -> None:
    r = run_without(
        "ray",
        [
            "sweep",
            "--test",
            "2",
            "--grid",
            "standard",
            "--model",
            tiny_llama_inputs["model"],
            "--data",
            tiny_llama_inputs["data"],
            "--db",
            str(tmp_path / "r.sqlite"),
            "--backend",
            "ray",
        ],
    )
    one_line(r, "the Ray backend", "ray", "ray")
    assert not (tmp_path / "r.sqlite").exists()


@pytest.mark.slow
def test_experiment_on_ray_without_the_ray_extra(tiny_llama_inputs: dict[str, str], tmp_path: Path) -> None:
    """An experiment file's ``[backend] name = "ray"`` asks for the extra as ``--backend ray`` does."""
    exp = tmp_path / "e.toml"
    exp.write_text(
        f'tests = [2]\ngrid = "standard"\nitems = 2\ndata = "{tiny_llama_inputs["data"]}"\n'
        f'[[models]]\nname = "{tiny_llama_inputs["model"]}"\n[backend]\nname = "ray"\n',
        encoding="utf-8",
    )
    r = run_without("ray", ["experiment", "run", str(exp), "--db", str(tmp_path / "x.sqlite"), "--no-progress"])
    one_line(r, "the Ray backend", "ray", "ray")


@pytest.mark.slow
def test_parquet_export_without_the_data_extra(tmp_path: Path) -> None:
    from walklens.lab.hellaswag.store import ResultStore

    db, out = tmp_path / "r.sqlite", tmp_path / "r.parquet"
    ResultStore(db).close()  # an empty results database
    r = run_without("pyarrow", ["hellaswag", "export", str(out), "--db", str(db)])
    one_line(r, "Parquet export", "pyarrow", "data")
    assert not out.exists()


def test_every_extra_is_declared_in_pyproject() -> None:
    """Each extra walklens asks for is one of pyproject.toml's, holding the packages whose modules it imports;
    every extra but ``test`` is known here."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(declared) - {"test"}
    for extra, modules in EXTRAS.items():
        packages = {re.split(r"[\[<>=!~ ]", req, maxsplit=1)[0].lower() for req in declared[extra]}
        assert set(modules) <= packages, (extra, modules, packages)
