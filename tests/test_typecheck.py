"""The type check holds: mypy, configured in pyproject.toml (``[tool.mypy]``), finds no error in src/walklens; and
every ``type: ignore`` and ``noqa`` there says which codes it silences and why.

Run alone with ``pytest -m typecheck`` (or ``pytest tests/test_typecheck.py``).  The first run builds mypy's cache
(``.mypy_cache``: a minute or more, torch and transformers are read too); later runs take seconds.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.typecheck

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "walklens"

#: Files whose mypy errors would not fail the checks (a temporary list while a module is being made clean); empty:
#: all of src/walklens is covered.
MYPY_PENDING: list[str] = []


def mypy(*args: str, cwd: Path = ROOT) -> tuple[int, str]:
    """Run mypy (this interpreter's) in ``cwd``: (exit code, output)."""
    done = subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True, timeout=1200)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_mypy_finds_no_error() -> None:
    code, out = mypy()  # the files of pyproject.toml
    assert code in (0, 1), out  # 2: mypy itself failed
    errors = [ln for ln in out.splitlines() if re.match(r"[^:\s]+\.py:\d+: error:", ln)]
    if MYPY_PENDING:
        covered = {str(p.relative_to(ROOT)) for p in covered_files()}
        errors = [ln for ln in errors if ln.split(":", 1)[0] in covered]
    else:
        assert code == 0 and "Success: no issues found" in out, out
    assert errors == [], "\n".join(errors)


def test_the_configuration_is_in_force(tmp_path: Path) -> None:
    """pyproject.toml's [tool.mypy] flags what the house rule forbids: a def without hints, an ignore without an
    error code, one that silences nothing."""
    (tmp_path / "bad.py").write_text(
        "def f(x):\n    return x\n\n\n"
        "y: int = 'one'  # type: ignore\n"
        "z: int = 1  # type: ignore[assignment]  # silences nothing\n"
    )
    code, out = mypy(
        "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"), "bad.py", cwd=tmp_path
    )
    assert code == 1, out
    for error_code in ("no-untyped-def", "ignore-without-code", "unused-ignore"):
        assert f"[{error_code}]" in out, out


# ---- every ignore gives its codes and its reason ---------------------------------------------------------------

#: A directive in a comment: mypy's ``type: ignore`` or ruff's ``noqa``.
DIRECTIVE = re.compile(r"#\s*(?P<what>type:\s*ignore|noqa)(?P<rest>.*)", re.IGNORECASE)
#: What must follow it: the codes silenced, then the reason as a comment of its own
#: (``# type: ignore[arg-type]  # why``, ``# why``).
WITH_REASON = {
    "type": re.compile(r"\[[a-z][a-z0-9-]*(?:,\s*[a-z][a-z0-9-]*)*\]\s+#\s*\S"),
    "noqa": re.compile(r":\s*[A-Z]+[0-9]+(?:,\s*[A-Z]+[0-9]+)*\s+#\s*\S"),
}


def unexplained(source: str) -> list[tuple[int, str]]:
    """(line, comment) of each ``type: ignore`` or ``noqa`` comment of ``source`` without its codes and a reason
    after them (comments only: a string that mentions one is not a directive)."""
    bad = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        for m in DIRECTIVE.finditer(tok.string):
            if not WITH_REASON[m["what"][:4].lower()].match(m["rest"]):
                bad.append((tok.start[0], tok.string))
    return bad


def covered_files() -> list[Path]:
    """The .py files the checks cover: all of src/walklens but :data:`MYPY_PENDING`."""
    pending = {ROOT / f for f in MYPY_PENDING}
    return sorted(p for p in SRC.rglob("*.py") if p not in pending)


def test_every_ignore_says_why() -> None:
    files = covered_files()
    assert len(files) > 10, files
    bad = [f"{p.relative_to(ROOT)}:{line}: {comment}" for p in files for line, comment in unexplained(p.read_text())]
    assert bad == [], "a type: ignore / noqa without its codes and '  # why' after them:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "line",
    [
        "x = f()  # type: ignore\n",
        "x = f()  # type: ignore[arg-type]\n",
        "x = f()  # type:ignore[arg-type] because\n",
        "x = f()  # TYPE: IGNORE[arg-type]\n",
        "x = f()  # type: ignore[]  # why\n",
        "import os  # noqa\n",
        "import os  # noqa: F401\n",
        "import os  # noqa: F401 - unused\n",
        "import os  # NOQA: F401  #\n",
        "x = f()  # a note  # type: ignore[arg-type]\n",
        "def f(): pass  # a note  # noqa: E704\n",
    ],
)
def test_an_unexplained_ignore_is_found(line: str) -> None:
    assert unexplained(line) == [(1, line.rstrip("\n")[line.index("#") :])]


@pytest.mark.parametrize(
    "line",
    [
        "x = f()  # type: ignore[arg-type]  # transformers types it str\n",
        "x = f()  # type: ignore[arg-type, call-arg]  # both: see above\n",
        "import os  # noqa: F401  # imported for its side effect\n",
        "import os  # noqa: F401, E402  # after the path set-up\n",
        "s = '# type: ignore'  # a string, not a directive\n",
        "s = '''\n# noqa\n'''\n",
        "x = 1  # nothing to see\n",
    ],
)
def test_an_explained_ignore_passes(line: str) -> None:
    assert unexplained(line) == []
