"""The derived-adapter cache is an input like any other: an output never replaces it or lands inside the walklens
cache, and an entry is checked before use.  A bad entry (malformed, tampered, naming modules the model lacks, a
link to a device, a FIFO) is discarded with one warning line and derived again, giving the numbers a fresh
derivation gives, bit for bit; entries are written atomically (no temp file is left by an interrupted write)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import walklens
from walklens.base.errors import InputError
from walklens.base.outputs import write_atomic
from walklens.cli import main
from walklens.testing import tiny_model

TEXT = "the king ran to the river"


def _walk_in_a_process(derived_dir: Path, cache_root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``walk --json`` in a child process (a hang there is a timeout, not a stuck test run)."""
    env = dict(os.environ, WALKLENS_CACHE=str(cache_root), OMP_NUM_THREADS="1")
    argv = ["walk", TEXT, "--model", str(derived_dir), "--json", str(out)]
    code = f"import sys; from walklens.cli import main; sys.exit(main({argv!r}))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def derived_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny smollm3 (no adapter file: its adapter is derived) saved as a model folder."""
    lm = tiny_model("smollm3")
    d = tmp_path_factory.mktemp("derived") / "smollm3"
    lm.model.save_pretrained(str(d), safe_serialization=True)
    lm.tokenizer.save_pretrained(str(d))
    return d


@pytest.fixture(scope="module")
def reference(derived_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``walk --json`` of the model with a cold cache (a fresh derivation), and the entry that run wrote."""
    root = tmp_path_factory.mktemp("ref")
    out = root / "walk.json"
    r = _walk_in_a_process(derived_dir, root / "cache", out)
    assert r.returncode == 0, r.stderr
    (entry,) = (root / "cache" / "derived").glob("*.json")
    return {"numbers": out.read_bytes(), "entry": entry.read_bytes(), "name": entry.name}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: dict[str, Any]) -> Path:
    """A private walklens cache holding the reference run's entry; returns the entry's path."""
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    entry = tmp_path / "cache" / "derived" / reference["name"]
    entry.parent.mkdir(parents=True)
    entry.write_bytes(reference["entry"])
    return entry


def _walk(model: Path, out: Path, capfd: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    capfd.readouterr()
    code = main(["walk", TEXT, "--model", str(model), "--json", str(out)])
    return code, capfd.readouterr().err.strip().splitlines()


# ---- an output never replaces a cache entry, nor lands in the cache folder ------------------------------------


@pytest.mark.parametrize("where", ["entry", "new", "dir"])
def test_no_output_inside_the_walklens_cache(where, derived_dir, cache, monkeypatch, capfd):
    """``verify DIR --json CACHE/derived/<entry>.json`` used to replace the entry; the cache folder is an input
    of every command: one line, exit 2, before the model loads."""
    import walklens.cli.common as common

    monkeypatch.setattr(common, "load_model", lambda *a, **k: pytest.fail("the model must not load"))
    before = cache.read_bytes()
    target = {"entry": cache, "new": cache.parent / "card.json", "dir": cache.parent.parent}[where]
    argv = ["verify", str(derived_dir), "--out" if where == "dir" else "--json", str(target)]
    capfd.readouterr()
    assert main(argv) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("walklens: error: "), err
    assert "walklens cache" in err[0] and "an input of this command" in err[0], err
    assert cache.read_bytes() == before
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name]


def test_an_entry_read_is_an_input_only_its_cache_rewrites(derived_dir, cache):
    walklens.load_model(str(derived_dir))  # reads the entry
    with pytest.raises(InputError, match="an input of this command"):
        write_atomic(cache, "{}")
    assert cache.read_bytes() != b"{}"


# ---- a bad entry is discarded and derived again, with one warning --------------------------------------------


def _tampered(entry: bytes, **changes: Any) -> bytes:
    doc = json.loads(entry)
    doc.update(changes)
    return json.dumps(doc).encode()


TAMPERED = {
    "final_norm null": lambda e: _tampered(e, final_norm=None),  # used to give other numbers, exit 0
    "layers model.nope": lambda e: _tampered(e, layers="model.nope"),  # used to be an internal error
    "n_heads 0": lambda e: _tampered(e, n_heads=0),
    "n_heads x": lambda e: _tampered(e, n_heads="x"),
    "attn __class__": lambda e: _tampered(e, attn="__class__"),
    "final_norm a layer": lambda e: _tampered(e, final_norm="model.layers.0"),
    "mlp_out attn": lambda e: _tampered(e, mlp_out="self_attn"),
    "residual parallel": lambda e: _tampered(e, residual="parallel"),
    "limits": lambda e: _tampered(e, limits={"qk_bilinear": "planted"}),
    "extra field": lambda e: _tampered(e, planted=1),
    "not json": lambda e: e[: len(e) // 2],
    "a list": lambda e: b"[1, 2]",
    "deep": lambda e: b"[" * 100_000 + b"]" * 100_000,
    "empty": lambda e: b"",
    "huge": lambda e: b" " * (5 * 2**20) + e,
}


@pytest.mark.parametrize("how", list(TAMPERED))
def test_a_tampered_entry_is_derived_again(how, derived_dir, cache, reference, tmp_path, capfd):
    cache.write_bytes(TAMPERED[how](reference["entry"]))
    code, err = _walk(derived_dir, tmp_path / "walk.json", capfd)
    assert code == 0, err
    assert len(err) == 1 and err[0].startswith("walklens: warning: ") and "derived again" in err[0], err
    assert (tmp_path / "walk.json").read_bytes() == reference["numbers"]  # bit for bit
    assert cache.read_bytes() == reference["entry"]  # written again, as a fresh derivation writes it
    code, err = _walk(derived_dir, tmp_path / "again.json", capfd)  # and now used without a word
    assert code == 0 and err == [] and (tmp_path / "again.json").read_bytes() == reference["numbers"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "folder"])
def test_an_entry_that_is_no_regular_file_is_never_read(kind, derived_dir, cache, reference, tmp_path):
    """A link to /dev/zero used to be read until the process was killed, a FIFO hung: neither is read."""
    cache.unlink()
    if kind == "fifo":
        os.mkfifo(cache)
    elif kind == "folder":
        cache.mkdir()
    else:
        cache.symlink_to(kind)
    r = _walk_in_a_process(derived_dir, cache.parent.parent, tmp_path / "walk.json")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 0, r.stderr
    assert len(err) == 1 and err[0].startswith("walklens: warning: ") and "derived again" in err[0], err
    assert (tmp_path / "walk.json").read_bytes() == reference["numbers"]
    if kind != "folder":  # a link or a FIFO in the cache is replaced by the entry; a folder is left alone
        assert cache.is_file() and not cache.is_symlink() and cache.read_bytes() == reference["entry"]


def test_an_interrupted_write_leaves_no_temp_file(derived_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))

    def killed(*_a: Any, **_k: Any) -> None:
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        walklens.load_model(str(derived_dir))
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "cache" / "derived").iterdir()] == []
