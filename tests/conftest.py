from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core (pytest-xdist, -n auto)
    # one thread per worker, and for the commands it starts: threads that wait on each other at every operation
    # stall when the workers' threads outnumber the cores
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses the real model (the ``smollm2`` fixture, directly or through another fixture) is marked
    ``real``, and one that uses the ``chromium`` fixture ``browser``, so that the quick selection
    (``make quick``) leaves them out even where the test itself forgot the mark."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if "smollm2" in used and item.get_closest_marker("real") is None:
            item.add_marker(pytest.mark.real)
        if "chromium" in used and item.get_closest_marker("browser") is None:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded default model (installed from PyPI, de-quantized once and cached)."""
    import walklens

    return walklens.load_model("smollm2-135m")


@pytest.fixture(scope="session")
def saved_model(tmp_path_factory):
    """``saved_model(lm)``: a LoadedModel saved once (per name) as a local directory for ``--model DIR``."""
    dirs = {}

    def save(lm):
        if lm.name not in dirs:
            d = tmp_path_factory.mktemp(lm.name)
            lm.model.save_pretrained(str(d), safe_serialization=True)
            lm.tokenizer.save_pretrained(str(d))
            dirs[lm.name] = d
        return dirs[lm.name]

    return save


@pytest.fixture(scope="session")
def tiny_llama_inputs(tmp_path_factory):
    """A tiny Llama saved as a model directory and a three-item HellaSwag file (the CLI's bad-input tests)."""
    from _toy import write_items
    from walklens.testing import tiny_model

    root = tmp_path_factory.mktemp("cli-inputs")
    lm = tiny_model("llama")
    lm.model.save_pretrained(root / "model")
    lm.tokenizer.save_pretrained(root / "model")
    data = write_items(
        root / "items.jsonl", [("the king ran to the", "", ["river", "city", "house", "dog"], i) for i in range(3)]
    )
    return {"model": str(root / "model"), "data": str(data), "root": str(root)}


_BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _find() -> str | None:
    for name in _BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    """The system's Chromium, installed with apt-get when missing and we are root (else the test is skipped,
    saying so): the report and explorer browser tests share it."""
    path = _find()
    if path is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip(
                "Chromium is not installed and cannot be installed here (needs root and apt-get): "
                "apt-get install -y chromium"
            )
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        r = subprocess.run(
            ["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, text=True, timeout=1200, env=env
        )
        if r.returncode != 0:  # stale package lists: refresh once
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600, env=env)
            r = subprocess.run(
                ["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, text=True, timeout=1200, env=env
            )
        path = _find()
        if path is None:
            pytest.skip(f"Chromium could not be installed with apt-get: {r.stderr.strip()[-300:]}")
    return path


@pytest.fixture(scope="session")
def every_result(tmp_path_factory):
    """One instance of every public result type on a tiny model (tests/_views.py), built once per session."""
    from _views import every_result as build
    from walklens.testing import tiny_model

    return build(tiny_model("llama"), tmp_path_factory.mktemp("views"))


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Loading a model records the call and fails loudly: an output check that comes after the load shows up (the
    commands check their outputs against their inputs before any model loads)."""
    calls: list[str] = []

    def refuse(spec: str, *a: Any, **k: Any) -> Any:
        calls.append(spec)
        raise AssertionError("a model was loaded before the outputs were checked against the inputs")

    import walklens.cli.common as common
    import walklens.core.loading as loading

    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(common, "load_model", refuse)
    return calls
