"""The Ray backend of the sweep (issue 15) on a real local Ray instance (``ray.init(num_cpus=2)`` here): the same
stored bits as the local backend with 1 and 2 workers, a worker killed mid-run, a driver killed and rerun, and
the one-line errors.  Tiny random models; every Ray test shares one instance and as few actor pools as it can
(starting an actor imports torch and loads a model)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

from _ray import saved_tiny_llama, start_ray
from walklens.core.backends.ray_backend import ActorOptions, RayBackend
from walklens.lab.experiments.grid import GridSpec
from walklens.lab.experiments.sweep import SweepSpec
from walklens.lab.hellaswag.store import SweepStore
from walklens.testing.faults import CrashOnce

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[1]
_W = (
    "the a of to and in is was it that he she they on for with as at by from this his her their capital "
    "france paris city river london england king queen man woman boy girl dog cat house car red blue green "
    "one two three four five big small run runs ran walk walks eat eats good bad"
).split()
T1_GRID = (
    'layers = ["E", "-1"]\nword = ["last", "relu|w1mean"]\nnorm = ["None", "zNorm"]\n'
    'enc = ["concat_each_example", "sentence_level_segmentation", "cross_encoding"]\n'
)
T2_GRID = 'layers = ["E", "-1"]\nword = ["mean", "last"]\nnorm = ["None", "L2"]\nout_word = ["w1mean", "last"]\n'
SHARD_ITEMS = 2  # 6 items: three Test 1 ranges per block
TINY_MB = 1e-6  # a Test 2 item range's bank rows fit in 1 byte: every 8-item chunk a range of its own


def items_jsonl(path: Path, n: int = 6, seed: int = 3) -> Path:
    """``n`` random HellaSwag-shaped items over the tiny tokenizer's words, as a .jsonl file."""
    rng = np.random.default_rng(seed)

    def sent(k: int) -> str:
        return " ".join(rng.choice(_W, size=k))

    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            ctx = f"{sent(int(rng.integers(3, 7)))}. {sent(int(rng.integers(2, 6)))}"
            ends = [sent(int(rng.integers(1, 5))) + ("." if rng.random() < 0.5 else "") for _ in range(4)]
            f.write(
                json.dumps(
                    {
                        "activity_label": "x",
                        "ctx_a": ctx,
                        "ctx_b": "",
                        "endings": ends,
                        "label": int(rng.integers(0, 4)),
                    }
                )
                + "\n"
            )
    return path


def snapshot(db: Path) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Every sweep run of a database, as bytes: baseline accuracy and picks, scheme names, accuracies, picks."""
    out = {}
    with SweepStore(db, readonly=True) as st:
        for run in st.runs():
            r = st.load(run["id"])
            key = (run["model"], run["data"], run["shots"], run["test"])
            out[key] = (
                run["baseline_acc"],
                run["baseline_acc_norm"],
                run["baseline_preds"].tobytes(),
                tuple(r.schemes),
                r.acc.tobytes(),
                r.preds.tobytes(),
            )
    return out


def no_duplicates(db: Path, n_groups: int) -> None:
    """The store holds each group once, no shard left over, every item's baseline once, and a sound file."""
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM sweep_groups").fetchone()[0] == n_groups
        assert con.execute("SELECT count(DISTINCT run_id || context) FROM sweep_groups").fetchone()[0] == n_groups
        assert con.execute("SELECT count(*) FROM sweep_shards").fetchone()[0] == 0
        assert (
            con.execute("SELECT count(*) FROM results").fetchone()[0]
            == con.execute("SELECT count(DISTINCT model || data || shots || item) FROM results").fetchone()[0]
        )
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A local Ray instance (2 CPUs), a tiny Llama saved as a folder (workers load it from there), the items, both
    grids' schemes and the local backend's database: the reference every Ray run must equal bit for bit."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run (one CPU each)
    tmp = tmp_path_factory.mktemp("ray")
    start_ray(num_cpus=2, store_mb=100)
    mdir = saved_tiny_llama(tmp)
    from walklens.core.backends import LocalBackend
    from walklens.lab.hellaswag.data import load_hellaswag

    lm = LocalBackend().driver_model(str(mdir))
    items = load_hellaswag(items_jsonl(tmp / "items.jsonl"))
    (tmp / "g1.toml").write_text(T1_GRID, encoding="utf-8")
    (tmp / "g2.toml").write_text(T2_GRID, encoding="utf-8")
    schemes = {t: GridSpec.from_toml(tmp / f"g{t}.toml", t, "decoder").enumerate("decoder")[0] for t in (1, 2)}
    env = dict(lm=lm, mdir=mdir, items=items, schemes=schemes, tmp=tmp)
    local = tmp / "local.sqlite"
    env["local"] = {t: sweep(env, local, t) for t in (1, 2)}
    env["local_db"] = local
    env["items21"] = load_hellaswag(items_jsonl(tmp / "items21.jsonl", n=21, seed=5))  # Test 2 in 3 item ranges
    env["local21"] = sweep(env, tmp / "local21.sqlite", 2, items=env["items21"])  # one range: the bank itself
    yield env
    ray.shutdown()
    torch.set_num_threads(threads)


def sweep(env: dict[str, Any], db: Path, test: int, items: Any = None, **kw: Any) -> Any:
    from test_sweep import sweep_db

    return sweep_db(
        env["lm"],
        env["items"] if items is None else items,
        db,
        SweepSpec(test, env["schemes"][test], test1_shard_items=SHARD_ITEMS),
        shots=1,
        **kw,
    )


@pytest.mark.parametrize("n", [1, 2])
def test_ray_stores_the_local_bits_with_1_and_2_workers(setup: dict[str, Any], n: int) -> None:
    import torch

    from walklens.lab.experiments.sweep import build_bank

    db = setup["tmp"] / f"ray{n}.sqlite"
    texts = [f"{a} {b} ran to the {c}" for a in ("the", "a") for b in ("man", "dog", "cat") for c in ("river", "city")]
    texts += ["the king", "a queen"]  # several batches of equal token length
    with RayBackend(workers=n, context_mb=TINY_MB).workers(setup["lm"]) as w:
        outs = {t: sweep(setup, db, t, workers=w) for t in (1, 2)}  # 6 items: one Test 2 range all the same
        # the forward shards' float vectors themselves, not only the picks they lead to, are the local bits
        far = build_bank(setup["lm"], texts, ["E", "1", "2"], ["mean", "w1mean", "last"], progress=False, workers=w)
        # 21 items: each Test 2 bundle in 3 ranges, each range's bank rows its own context in the object store
        cut = sweep(setup, setup["tmp"] / f"ray21_{n}.sqlite", 2, items=setup["items21"], workers=w)
    here = build_bank(setup["lm"], texts, ["E", "1", "2"], ["mean", "w1mean", "last"], progress=False)
    assert torch.equal(far.vectors, here.vectors)
    for t, o in outs.items():
        assert (o.backend, o.workers) == ("ray", n)
        assert o.shards_computed == setup["local"][t].shards_computed  # the same shards, all run once
        assert o.groups_computed == o.n_groups == setup["local"][t].n_groups
    assert outs[1].shards_computed["test1"] == 2 * 2 * 3  # blocks (E|-1 x 2 words) x 3 item ranges
    assert snapshot(db) == snapshot(setup["local_db"])
    no_duplicates(db, sum(o.n_groups for o in outs.values()))
    assert cut.shards_computed["test2"] == 3 * setup["local21"].shards_computed["test2"]
    assert snapshot(setup["tmp"] / f"ray21_{n}.sqlite") == snapshot(setup["tmp"] / "local21.sqlite")
    no_duplicates(setup["tmp"] / f"ray21_{n}.sqlite", cut.n_groups)


def test_a_worker_killed_mid_run_changes_nothing(setup: dict[str, Any]) -> None:
    """One of two workers dies (``os._exit``) before its second shard; Ray restarts it and retries the shard."""
    db = setup["tmp"] / "crash.sqlite"
    hook = CrashOnce(str(setup["tmp"] / "crashed"), at=2)
    with RayBackend(workers=2, actors=ActorOptions(hook=hook)).workers(setup["lm"]) as w:
        outs = {t: sweep(setup, db, t, workers=w) for t in (1, 2)}
    assert hook.crashed
    assert snapshot(db) == snapshot(setup["local_db"])
    no_duplicates(db, sum(o.n_groups for o in outs.values()))


DRIVER = """
import os, signal, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from test_ray import setup_for_driver
from walklens.core.backends.ray_backend import ActorOptions, RayBackend
env = setup_for_driver({tmp!r}, {mdir!r}, address={address!r})

def kill(kind, n):
    if kind == "test1" and n == {kill_at}:
        os.kill(os.getpid(), signal.SIGKILL)

from walklens.lab.experiments.sweep import SweepSpec
from test_sweep import sweep_db
with RayBackend(workers=1).workers(env["lm"]) as w:
    sweep_db(env["lm"], env["items"], {db!r}, SweepSpec(1, env["schemes"][1], test1_shard_items={items}), shots=1,
             cache={cache!r}, workers=w, on_shard=kill)
"""


def setup_for_driver(tmp: str, mdir: str, address: str) -> dict[str, Any]:
    """What the killed driver of :func:`test_a_killed_driver_resumes_without_recomputing` needs (a separate
    process connected to this test's Ray instance)."""
    from walklens.core.backends.ray_backend import RayBackend
    from walklens.lab.hellaswag.data import load_hellaswag

    ray.init(address=address, logging_level=logging.WARNING)
    lm = RayBackend(address=address).driver_model(mdir)
    schemes = {1: GridSpec.from_toml(Path(tmp) / "g1.toml", 1, "decoder").enumerate("decoder")[0]}
    return dict(lm=lm, items=load_hellaswag(Path(tmp) / "items.jsonl"), schemes=schemes)


def test_a_killed_driver_resumes_without_recomputing(setup: dict[str, Any]) -> None:
    """The driver (another process on this Ray instance) is SIGKILLed right after storing its second Test 1
    shard; the rerun computes exactly the other shards (no baseline, no forward pass: all stored) and stores
    the local bits."""
    tmp = setup["tmp"]
    db, cache = tmp / "killed.sqlite", tmp / "killed.bank"
    address = ray.get_runtime_context().gcs_address
    code = DRIVER.format(
        tests=str(ROOT / "tests"),
        tmp=str(tmp),
        mdir=str(setup["mdir"]),
        address=address,
        kill_at=2,
        db=str(db),
        items=SHARD_ITEMS,
        cache=str(cache),
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM sweep_shards").fetchone()[0] == 2  # kept, not yet a whole block
    total = setup["local"][1].shards_computed
    with RayBackend(workers=1).workers(setup["lm"]) as w:
        again = sweep(setup, db, 1, workers=w, cache=cache)
    assert again.shards_computed == {"test1": total["test1"] - 2}
    assert snapshot(db) == {k: v for k, v in snapshot(setup["local_db"]).items() if k[3] == 1}
    no_duplicates(db, again.n_groups)


def test_ray_errors_are_one_line(
    setup: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from walklens.base.errors import InputError
    from walklens.cli import main

    with pytest.raises(InputError, match="5 Ray worker.*need 5 CPUs; the cluster has 2"):
        RayBackend(workers=5).workers(setup["lm"])
    for bad in (0, -1.0, float("nan"), "x"):
        with pytest.raises(InputError, match="context_mb must be a positive number of MB"):
            RayBackend(context_mb=bad)  # type: ignore[arg-type]
    exp = tmp_path / "e.toml"
    exp.write_text(
        f'tests = [2]\ngrid = "standard"\nitems = 2\ndata = "{setup["tmp"] / "items.jsonl"}"\n'
        f'[[models]]\nname = "{setup["mdir"]}"\ndevice = "cuda"\n',
        encoding="utf-8",
    )
    args = ["experiment", "run", str(exp), "--db", str(tmp_path / "x.sqlite"), "--no-progress"]
    assert main(args + ["--backend", "ray"]) == 2  # no GPU on this machine: refused before anything loads
    assert main(args + ["--workers", "2"]) == 2  # a Ray option without the ray backend
    monkeypatch.setenv("WALKLENS_RAY_CONTEXT_MB", "lots")  # the bound on a Test 2 range's bank rows
    assert main(args + ["--backend", "ray"]) == 2
    monkeypatch.delenv("WALKLENS_RAY_CONTEXT_MB")
    monkeypatch.setitem(sys.modules, "ray", None)  # ray not installed
    assert main(args + ["--backend", "ray"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(e.startswith("walklens: error: ") for e in err), err
    assert "no CUDA GPU is available" in err[0] or "has no CUDA" in err[0]
    assert "--workers needs --backend ray" in err[1]
    assert "WALKLENS_RAY_CONTEXT_MB must be a positive number of MB, not 'lots'" in err[2]
    assert "pip install 'walklens[ray]'" in err[3]
    assert not (tmp_path / "x.sqlite").exists()


def test_the_sweep_command_on_ray(setup: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``walklens hellaswag sweep --backend ray --address ... --workers 1`` stores the local bits; ``--device cuda``
    on a cluster without GPUs is one line before anything loads."""
    from walklens.cli import main

    db = tmp_path / "cli.sqlite"
    address = ray.get_runtime_context().gcs_address
    args = [
        "hellaswag",
        "sweep",
        "--test",
        "2",
        "--grid",
        str(setup["tmp"] / "g2.toml"),
        "--model",
        str(setup["mdir"]),
        "--data",
        str(setup["tmp"] / "items.jsonl"),
        "--shots",
        "1",
        "--db",
        str(db),
        "--no-progress",
        "--backend",
        "ray",
        "--address",
        address,
    ]
    assert main(args + ["--workers", "1"]) == 0
    (run,) = snapshot(db).values()
    assert run == next(v for k, v in snapshot(setup["local_db"]).items() if k[3] == 2)
    capsys.readouterr()
    assert main(args + ["--device", "cuda"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "device cuda asked for, but the Ray cluster" in err[0] and "0 GPU(s)" in err[0], err
