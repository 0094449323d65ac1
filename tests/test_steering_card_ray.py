"""The steering card on the Ray backend (a local Ray instance, one actor holding a tiny random Llama): the same
document as the local card, bit for bit (greedy generations, CPU float32, one thread each), from the command
line too; a driver stopped after storing k units resumes on the actors without running a stored unit again."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import ray
import torch

from _cli import run
from _ray import saved_tiny_llama, start_ray
from test_steering_card import write_set
from walklens.base.outputs import jsonable
from walklens.core.backends import LocalBackend, Workers
from walklens.core.backends.base import ShardFn
from walklens.core.backends.ray_backend import RayBackend
from walklens.lab.reports.steercard import document
from walklens.lab.steeringcard import steering_card
from walklens.lab.steeringcard.store import CardStore

pytestmark = [pytest.mark.slow, pytest.mark.ray]

KW: dict[str, Any] = {"layers": [1], "doses": [1.0], "methods": ["add", "eigen"], "max_new_tokens": 3, "n_boot": 100}
KILL_AT = 5  # units stored before the driver stops


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A local Ray instance (1 CPU), a tiny Llama saved as a folder (the actor loads it from there), a tiny
    steering set, the local card (the reference) and one Ray actor holding the model, with the driver's copy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the actor runs (one CPU)
    tmp = tmp_path_factory.mktemp("cardray")
    start_ray(num_cpus=1, store_mb=80)
    mdir = saved_tiny_llama(tmp)
    sset = write_set(tmp / "tiny.jsonl")
    local = steering_card(LocalBackend().driver_model(str(mdir)), sset, store=tmp / "local.db", **KW)
    backend = RayBackend(workers=1)
    lm = backend.driver_model(str(mdir))
    with backend.workers(lm) as pool:  # one actor for the module (each start imports torch and loads the model)
        yield {"tmp": tmp, "mdir": mdir, "set": sset, "local": local, "lm": lm, "pool": pool}
    ray.shutdown()
    torch.set_num_threads(threads)


def text(card: Any) -> str:
    return json.dumps(jsonable(document(card)), sort_keys=True)


class Counted(Workers):
    """Workers that count the shards handed to them (the store's resume, seen from the actors' side)."""

    def __init__(self, inner: Workers) -> None:
        self.inner, self.kind, self.n, self.shards = inner, inner.kind, inner.n, 0

    def map_parts(self, fn: ShardFn, parts: Iterable[tuple[Any, Iterable[Any]]]) -> Iterator[tuple[int, Any]]:
        def counted(payloads: Iterable[Any]) -> Iterator[Any]:
            for p in payloads:
                self.shards += 1
                yield p

        return self.inner.map_parts(fn, ((ctx, counted(ps)) for ctx, ps in parts))


def test_ray_card_is_the_local_card_and_resumes(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    tmp, local, lm, w = env["tmp"], env["local"], env["lm"], env["pool"]
    real_put, puts = CardStore.put, {"n": 0}

    def stops(self: CardStore, *a: Any) -> None:
        if puts["n"] == KILL_AT:
            raise KeyboardInterrupt  # the driver stopped after storing KILL_AT units
        puts["n"] += 1
        real_put(self, *a)

    assert w.kind == "ray"
    far = steering_card(lm, env["set"], store=tmp / "ray.db", workers=w, **KW)
    monkeypatch.setattr(CardStore, "put", stops)
    with pytest.raises(KeyboardInterrupt):
        steering_card(lm, env["set"], store=tmp / "killed.db", workers=w, **KW)
    monkeypatch.setattr(CardStore, "put", real_put)
    counted = Counted(w)
    resumed = steering_card(lm, env["set"], store=tmp / "killed.db", workers=counted, **KW)
    assert far.units_generated == local.units_generated > KILL_AT and far.units_stored == 0
    assert text(far) == text(local)  # every number, interval and generated text
    assert resumed.units_stored == KILL_AT and resumed.units_generated == local.units_generated - KILL_AT
    assert counted.shards == 1 + local.units_generated - KILL_AT  # the plan, then only the units not stored
    assert resumed.cells == local.cells and resumed.examples == local.examples
    with sqlite3.connect(tmp / "killed.db") as con, sqlite3.connect(tmp / "local.db") as ref:
        got, want = (sorted(c.execute("SELECT unit, rows FROM units").fetchall()) for c in (con, ref))
    assert got == want  # each unit stored once, the local bits


def test_the_card_command_on_ray(
    env: dict[str, Any], capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``walklens steer --card SET --backend ray --address ... --workers 1`` writes the local card's document, its
    units run on the module's actor (``RayBackend.workers`` handing out that pool, so no second actor starts)."""
    js = env["tmp"] / "cli.json"
    argv = ["steer", "--card", str(env["set"]), "--model", str(env["mdir"]), "--layers", "1", "--doses", "1"]
    argv += ["--methods", "add,eigen", "--max-new-tokens", "3", "--n-boot", "100", "--json", str(js)]
    address = ray.get_runtime_context().gcs_address
    shared = Counted(env["pool"])  # closing it leaves the pool to the fixture
    monkeypatch.setattr(RayBackend, "workers", lambda self, lm: shared)
    rc, err = run(capfd, *argv, "--backend", "ray", "--address", address, "--workers", "1")
    assert rc == 0, err
    assert shared.shards == 1 + env["local"].units_generated  # the plan and every unit ran on the actor
    assert json.loads(js.read_text()) == json.loads(json.dumps(jsonable(document(env["local"]))))
