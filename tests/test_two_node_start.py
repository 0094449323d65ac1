"""benchmarks/two_node.py starts its head node with ``--ray-client-server-port``, which needs ``ray[client]``
(grpcio): the ``ray`` extra (and ``test``) must install it, and the script's start path must work on a fresh
install.  The start is run here at its smallest: two one-CPU nodes started and stopped, nothing computed."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_ray_extras_carry_ray_client() -> None:
    """What docs/scale.md (``ray://HEAD:10001``) and the two-node script use is what ``pip install walklens[ray]``
    installs."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for name in ("ray", "test"):
        rays = [r for r in extras[name] if re.match(r"ray\b", r)]
        assert rays and all(r.startswith("ray[client]") for r in rays), (name, rays)
    assert "--ray-client-server-port" in (ROOT / "benchmarks/two_node.py").read_text(encoding="utf-8")


def _two_node() -> object:
    spec = importlib.util.spec_from_file_location("two_node", ROOT / "benchmarks/two_node.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.ray
def test_the_two_node_cluster_starts_and_stops(tmp_path: Path) -> None:
    """The script's :class:`Cluster` starts a head (with the Ray Client server) and a second node, then stops
    every process of its own (bounded: each ``ray start`` has 300 s)."""
    pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[ray]'")
    if importlib.util.find_spec("grpc") is None:
        pytest.skip(
            "ray[client] is not installed in this environment (no grpcio): `ray start "
            "--ray-client-server-port` would fail with 'Ray Client requires pip package ray[client]'; "
            "pip install -e '.[test]' installs it"
        )
    two_node = _two_node()
    if not (Path(two_node.BIN) / "ray").exists() and shutil.which("ray") is None:
        pytest.skip("no `ray` command next to this Python")
    cluster = two_node.Cluster({**os.environ, "OMP_NUM_THREADS": "1"}, tmp_path / "ray_start.log")
    t0 = time.monotonic()
    try:
        cluster.start()
        assert len(cluster.raylets) == 2, (tmp_path / "ray_start.log").read_text()[-2000:]
    finally:
        cluster.stop()
    assert not cluster.pids() and not cluster.tmp.exists()
    assert time.monotonic() - t0 < 600
