"""The concept cache (issue 17; seed 000, footnote 11): keys, persistence, concurrent processes, the size bound
with LRU eviction, bad folders, and that the sweep's bank, Test 1 and compaction share it (a second run computes
no vector it already has; results are bit-identical with and without it)."""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.synchronize
import sqlite3
import zlib
from pathlib import Path

import pytest
import torch

from walklens.analyses.concepts.cache import ConceptCache, Space, model_space, weights_hash
from walklens.base.errors import InputError

SPACE = Space(model="toy", weights="0" * 64, dtype="float32", device="cpu", d_model=4)


def vec(text: str, layer: str, word: str) -> torch.Tensor:
    """A deterministic vector per key, so any process writing a key writes the same numbers."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{text}|{layer}|{word}".encode()))  # not hash(): per process
    return torch.randn(SPACE.d_model, generator=g)


def block(texts, layers, words) -> torch.Tensor:
    return torch.stack([torch.stack([torch.stack([vec(t, l, w) for w in words]) for l in layers]) for t in texts])


def test_put_get_round_trip_and_keys(tmp_path: Path) -> None:
    texts, layers, words = ["a b", "c", "d e f"], ["E", "3"], ["mean", "last"]
    with ConceptCache(tmp_path / "c") as c:
        c.put(SPACE, texts, layers, words, block(texts, layers, words))
        got, found = c.get(SPACE, ["c", "zz", "a b"], layers, words)
        assert found.tolist() == [True, False, True]
        assert torch.equal(got[0], block(["c"], layers, words)[0]) and torch.equal(
            got[2], block(["a b"], layers, words)[0]
        )
        sub, found = c.get(SPACE, texts[::-1], ["3"], ["last"])  # any subset of layers and words
        assert found.all() and torch.equal(sub, block(texts[::-1], ["3"], ["last"]))
        # every key field matters: another norm, layer, word, dtype, device or weights is a miss
        for space, lw, norm in (
            (SPACE, (["E"], ["w1mean"]), None),
            (SPACE, (["0"], ["mean"]), None),
            (SPACE, (["E"], ["mean"]), "L2"),
            (Space("toy", "0" * 64, "bfloat16", "cpu", 4), (["E"], ["mean"]), None),
            (Space("toy", "0" * 64, "float32", "cuda:x", 4), (["E"], ["mean"]), None),
            (Space("toy", "1" * 64, "float32", "cpu", 4), (["E"], ["mean"]), None),
        ):
            assert not c.get(space, texts, *lw, norm=norm)[1].any()
        assert c.stats.hits == 2 + 3 and c.stats.misses == 1 + 3 * 6
    with ConceptCache(tmp_path / "c") as again:  # persisted
        got, found = again.get(SPACE, texts, layers, words)
        assert found.all() and torch.equal(got, block(texts, layers, words))
        again.put(SPACE, ["c"], ["E"], ["mean"], torch.zeros(1, 1, 1, 4))  # a key already stored keeps its vector
        assert torch.equal(again.get(SPACE, ["c"], ["E"], ["mean"])[0][0, 0, 0], vec("c", "E", "mean"))


def test_a_shard_gone_between_lookup_and_read_is_a_miss(tmp_path: Path) -> None:
    with ConceptCache(tmp_path) as c:
        c.put(SPACE, ["x"], ["E"], ["mean"], block(["x"], ["E"], ["mean"]))
        for f in (tmp_path / "shards").glob("*.safetensors"):
            f.unlink()  # as if another process evicted it right after our lookup
        _, found = c.get(SPACE, ["x"], ["E"], ["mean"])
        assert found.tolist() == [False]


def test_lru_eviction_keeps_the_bound_and_the_recently_used(tmp_path: Path) -> None:
    with ConceptCache(tmp_path) as c:
        for t in "abcd":
            c.put(SPACE, [t], ["E"], ["mean"], block([t], ["E"], ["mean"]))
        one = c.size_bytes() // 4
        assert c.evict(target=10 * one) == 0 and c.n_vectors() == 4
        c.get(SPACE, ["a"], ["E"], ["mean"])  # a is now the most recently used
        c.max_bytes = int(4.2 * one)  # 5 shards > 4.2: evict down to 0.9 * 4.2 = 3.78 shards, i.e. 3
        c.put(SPACE, ["e"], ["E"], ["mean"], block(["e"], ["E"], ["mean"]))  # over the bound: evict to 90 %
        assert c.size_bytes() <= 0.9 * c.max_bytes
        _, found = c.get(SPACE, list("abcde"), ["E"], ["mean"])
        assert found.tolist() == [True, False, False, True, True]  # b and c were the least recently used
        assert len(list((tmp_path / "shards").glob("*.safetensors"))) == 3


def _writer(root: str, seed: int, texts: list[str], q: mp.Queue[object], start: mp.synchronize.Barrier) -> None:
    try:
        torch.set_num_threads(1)
        layers, words = ["E", "1"], ["mean", "last"]
        with ConceptCache(root, timeout=60) as c:
            start.wait(timeout=120)  # both processes write and read at the same time
            for i in range(0, len(texts), 3):
                part = texts[i : i + 3]
                c.put(SPACE, part, layers, words, block(part, layers, words))
                got, found = c.get(SPACE, texts[: i + 3], layers, words)
                assert found.all(), "a vector this process stored is missing"
                assert torch.equal(got, block(texts[: i + 3], layers, words))
        q.put(("ok", seed))
    except BaseException as e:  # report to the parent: an assertion in a child would be lost
        q.put(("error", repr(e)))


def test_two_processes_write_and_read_at_once(tmp_path: Path) -> None:
    # fork: the children start at once (spawn re-imports torch, which takes long on a loaded machine)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q, start = ctx.Queue(), ctx.Barrier(2)
    shared = [f"t{i}" for i in range(30)]
    procs = [
        ctx.Process(target=_writer, args=(str(tmp_path), s, shared[s * 5 :] + shared[: s * 5], q, start))
        for s in range(2)
    ]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert sorted(results) == [("ok", 0), ("ok", 1)], results
    with ConceptCache(tmp_path) as c:
        got, found = c.get(SPACE, shared, ["E", "1"], ["mean", "last"])
        assert found.all() and torch.equal(got, block(shared, ["E", "1"], ["mean", "last"]))
        assert c.n_vectors() == 30 * 4  # each key once, whichever process stored it first
        assert sqlite3.connect(tmp_path / "index.sqlite").execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_bad_cache_folders_are_one_line_errors(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    for bad, what in ((f, "not a directory"), (f / "sub", "not a directory")):
        with pytest.raises(InputError, match=what):
            ConceptCache(bad)
    garbage = tmp_path / "g"
    garbage.mkdir()
    (garbage / "index.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(InputError, match="not a usable SQLite index"):
        ConceptCache(garbage)
    other = tmp_path / "o"
    other.mkdir()
    sqlite3.connect(other / "index.sqlite").execute("CREATE TABLE results (x)").connection.commit()
    with pytest.raises(InputError, match="something else"):
        ConceptCache(other)
    newer = tmp_path / "n"
    ConceptCache(newer).close()
    con = sqlite3.connect(newer / "index.sqlite")
    con.execute("UPDATE meta SET value='99' WHERE key='concept_cache'")
    con.commit()
    with pytest.raises(InputError, match="schema 99"):
        ConceptCache(newer)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "index.sqlite").mkdir()
    with pytest.raises(InputError, match="not a regular file"):
        ConceptCache(tmp_path / "d")
    for msg in (str(e.value) for e in [pytest.raises(InputError, ConceptCache, garbage)]):
        assert "\n" not in msg


def test_weights_hash_follows_the_weights() -> None:
    from walklens.testing import tiny_model

    a, b = tiny_model("llama", seed=0), tiny_model("llama", seed=0)
    assert weights_hash(a) == weights_hash(b) != weights_hash(tiny_model("llama", seed=1))
    h = weights_hash(a)
    w = a.model.model.layers[0].mlp.up_proj.weight
    old = w[0, 0].item()
    with torch.no_grad():
        w[0, 0] = old + 1.0
    assert weights_hash(a) != h  # an in-place edit is seen (the tensor's version counter moved)
    with torch.no_grad():
        w[0, 0] = old
    assert weights_hash(a) == h and model_space(a).weights == h


def _tamper(root: Path, sql: str, *params: object) -> None:
    conn = sqlite3.connect(root / "index.sqlite")
    with conn:
        conn.execute(sql, params)
    conn.close()


@pytest.mark.parametrize(
    "how",
    [
        "row out of range",
        "row negative",
        "row as text",
        "row as float",
        "file outside",
        "file absolute",
        "nan values",
        "wrong shape",
        "fifo",
        "file is a folder",
    ],
)
def test_a_tampered_entry_is_a_miss_said_in_one_warning(tmp_path: Path, how: str) -> None:
    """A value read back from the cache that fails its check (a row outside its shard, a shard named outside the
    shard folder, a FIFO, non-finite or misshapen vectors) is never used: a miss, computed again, said once."""
    import os

    from safetensors.torch import save_file

    from walklens.base.errors import StaleCacheWarning

    texts, layers, words = ["a b", "c"], ["E"], ["mean"]
    root = tmp_path / "c"
    with ConceptCache(root) as c:
        c.put(SPACE, texts, layers, words, block(texts, layers, words))
    shard = next((root / "shards").glob("*.safetensors"))
    outside = tmp_path / "outside.safetensors"
    save_file({"v": torch.ones(8, SPACE.d_model)}, str(outside))
    warned = how in ("row out of range", "row negative", "row as text", "row as float", "nan values", "wrong shape")
    if how.startswith("row"):
        value = {"row out of range": 99, "row negative": -1, "row as text": "x", "row as float": 0.5}[how]
        _tamper(root, "UPDATE vectors SET row=?", value)
    elif how == "file outside":
        _tamper(root, "UPDATE shards SET file=?", "../../outside.safetensors")
    elif how == "file absolute":
        _tamper(root, "UPDATE shards SET file=?", str(outside))
    elif how == "nan values":
        save_file({"v": torch.full((2, SPACE.d_model), float("nan"))}, str(shard))
    elif how == "wrong shape":
        save_file({"v": torch.ones(2, SPACE.d_model + 1)}, str(shard))
    elif how == "fifo":
        shard.unlink()
        os.mkfifo(shard)
    else:
        shard.unlink()
        shard.mkdir()
    with ConceptCache(root) as c, pytest.warns(StaleCacheWarning) if warned else _no_warning():
        got, found = c.get(SPACE, texts, layers, words)
    assert not found.any()


class _no_warning:
    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("error", Warning)

    def __exit__(self, *exc: object) -> None:
        self._w.__exit__(*exc)
