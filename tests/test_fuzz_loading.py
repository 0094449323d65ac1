"""Fuzzing what a load reads back (hypothesis): tampered derived-adapter cache entries, and tampered config.json and
``model.safetensors.index.json`` files of tiny models, each through ``walklens walk --json`` in this process.

Whatever the tampering, the run either exits 0 with the numbers of an untampered run (bit for bit; a bad cache
entry adds one ``walklens: warning:`` line and is derived again) or exits 2 with one line ``walklens: error: ...``;
never a traceback, an ``internal error``, a hang or a silently different result.  The config fields fuzzed are the
ones the weights determine (layer count, sizes, vocabulary, head counts): any other value contradicts the weights.

Bounded and deterministic: ``max_examples``, ``derandomize=True``, no example database.  Each test counts the
hostile inputs it tried and prints the count (``-s``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walklens.cli import main
from walklens.models.derived_cache import ENTRY, MAX_ENTRY
from walklens.testing import tiny_model

FUZZ = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TEXT = "the king ran to the river"
#: the fields of the config each model's weights determine (a wrong value contradicts them)
CONFIG_FIELDS = {
    "llama": ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads")
    + ("head_dim", "intermediate_size"),
    "arcee": ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads")
    + ("head_dim", "intermediate_size"),
    "gpt2": ("n_layer", "n_embd", "vocab_size", "n_positions", "n_inner"),
}
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.sampled_from([10**9, 2**31, 2**63, -(2**63), 10**30, 1e9, 2.0, 0.5, -0.0, 1e308]),
    st.sampled_from(["", "2", "x", "model.nope", "__class__", "_modules", "model.layers.0", "self_attn", "mlp"]),
    st.sampled_from(["model.norm", "model.embed_tokens", "lm_head", "../x", "a" * 400, "model.layers", "q_proj"]),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.sampled_from(["attn", "mlp", "qk_bilinear", "__class__", "x"]), st.sampled_from(["", "x"])),
)


def _walk(model: Path, out: Path, capfd: pytest.CaptureFixture[str]) -> tuple[int, list[str], bytes | None]:
    """``walk --json`` of a model folder: exit code, stderr lines, and the numbers (on exit 0)."""
    capfd.readouterr()
    out.unlink(missing_ok=True)
    code = main(["walk", TEXT, "--model", str(model), "--json", str(out)])
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert "internal error" not in " ".join(err) and "Traceback" not in " ".join(err), err
    # every number as written (bit for bit); the model's folder, named in the file, stood in for
    named = json.dumps(str(model))[1:-1].encode()
    return code, err, out.read_bytes().replace(named, b"<model>") if code == 0 else None


def _one_rule(code: int, err: list[str], numbers: bytes | None, reference: bytes, warn: bool = False) -> None:
    """Exit 0 with the reference numbers (and, with ``warn``, at most one warning line), or exit 2 in one line."""
    if code == 0:
        assert numbers == reference, "a tampered input gave other numbers"
        assert len(err) <= (1 if warn else 0) and all(e.startswith("walklens: warning: ") for e in err), err
    else:
        assert code == 2 and len(err) == 1 and err[0].startswith("walklens: error: "), (code, err)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny models saved as folders: llama and gpt2 (adapter files), arcee and smollm3 (derived), a sharded llama."""
    root = tmp_path_factory.mktemp("fuzz-models")
    out = {}
    for name, family, kw in (
        ("llama", "llama", {}),
        ("gpt2", "gpt2", {}),
        ("arcee", "arcee", {}),
        ("smollm3", "smollm3", {}),
        ("sharded", "llama", {"max_shard_size": "20KB"}),
    ):
        lm = tiny_model(family)
        lm.model.save_pretrained(str(root / name), safe_serialization=True, **kw)
        lm.tokenizer.save_pretrained(str(root / name))
        out[name] = root / name
    return out


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private walklens cache (and no hub) for the test; returns the cache root."""
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "cache"


def _reference(model: Path, tmp: Path, capfd: pytest.CaptureFixture[str]) -> bytes:
    code, err, numbers = _walk(model, tmp / "reference.json", capfd)
    assert code == 0 and err == [] and numbers is not None, err
    return numbers


# ---- derived-adapter cache entries ---------------------------------------------------------------------------


def _canon(entry: bytes) -> str | None:
    """An entry's JSON written one way (types kept apart: 0 is not false), None when it is not JSON."""
    try:
        return json.dumps(json.loads(entry), sort_keys=True)
    except ValueError:
        return None


def _resigned(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its digest made again (an entry changed by someone who knows the format)."""
    fields = {k: v for k, v in doc.items() if k not in ("version", "digest")}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return {**doc, "digest": hashlib.sha256(text.encode()).hexdigest()}


#: fields whose roles only the probe confirms: changed and re-signed, no check without the probe could tell
PROBE_ONLY = ("norms", "residual", "layout", "limits")
FIELDS = tuple(f.name for f in ENTRY.fields)


@st.composite
def tampered_entries(draw: st.DrawFn, entry: bytes) -> bytes:
    """An entry changed: a field replaced or removed (the digest kept, or made again), an extra field, or its
    bytes cut, flipped, padded or replaced."""
    how = draw(st.sampled_from(["field", "resigned", "drop", "extra", "cut", "flip", "pad", "bytes"]))
    if how in ("field", "resigned", "drop", "extra"):
        doc = json.loads(entry)
        if how == "drop":
            doc.pop(draw(st.sampled_from(FIELDS)))
        elif how == "extra":
            doc[draw(st.text(max_size=8))] = draw(HOSTILE)
        else:
            names = FIELDS if how == "field" else tuple(f for f in FIELDS if f not in PROBE_ONLY + ("digest",))
            doc[draw(st.sampled_from(names))] = draw(HOSTILE)
            if how == "resigned":
                doc = _resigned(doc)
        return json.dumps(doc).encode()
    if how == "cut":
        return entry[: draw(st.integers(0, len(entry) - 1))]
    if how == "flip":
        i = draw(st.integers(0, len(entry) - 1))
        return entry[:i] + bytes([entry[i] ^ draw(st.integers(1, 255))]) + entry[i + 1 :]
    if how == "pad":
        return draw(st.sampled_from([b" " * 300_000, b"\x00", b"\xff\xfe", b"["])) + entry
    return draw(st.binary(max_size=200))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["smollm3", "arcee"])
def test_fuzz_tampered_cache_entries(family, models, fresh, tmp_path, capfd):
    reference = _reference(models[family], tmp_path, capfd)
    (entry,) = (fresh / "derived").glob("*.json")
    good = entry.read_bytes()
    tried = []

    @settings(max_examples=45, **FUZZ)
    @given(data=st.data())
    def hostile(data: st.DataObject) -> None:
        bad = data.draw(tampered_entries(good))
        tried.append(bad)
        entry.write_bytes(bad)
        code, err, numbers = _walk(models[family], tmp_path / "walk.json", capfd)
        assert code == 0, err  # a cache entry never stops a run: it is derived again
        _one_rule(code, err, numbers, reference, warn=True)
        if _canon(bad) == _canon(good) and len(bad) <= MAX_ENTRY:  # the same entry, written otherwise: used
            assert err == []
        else:  # a warning, and the entry written again as a fresh derivation writes it
            assert len(err) == 1 and "derived again" in err[0], err
            assert entry.read_bytes() == good

    hostile()
    print(f"\n{family}: {len(tried)} tampered cache entries")
    assert len(tried) >= 40


# ---- config.json and the shard index -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "arcee", "gpt2"])
def test_fuzz_tampered_config(family, models, fresh, tmp_path, capfd):
    reference = _reference(models[family], tmp_path, capfd)
    raw = json.loads((models[family] / "config.json").read_text())
    tried = []

    @settings(max_examples=30, **FUZZ)
    @given(field=st.sampled_from(CONFIG_FIELDS[family]), value=HOSTILE, drop=st.booleans())
    def hostile(field: str, value: Any, drop: bool) -> None:
        d = tmp_path / "m"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(models[family], d)
        cfg = dict(raw)
        if drop:
            cfg.pop(field, None)
        else:
            cfg[field] = value
        tried.append((field, None if drop else value))
        (d / "config.json").write_text(json.dumps(cfg))
        _one_rule(*_walk(d, tmp_path / "walk.json", capfd), reference)

    hostile()
    print(f"\n{family}: {len(tried)} tampered configs")
    assert len(tried) >= 25


@st.composite
def tampered_indexes(draw: st.DrawFn, index: dict[str, Any], shards: list[str]) -> bytes:
    """The shard index changed: a tensor mapped elsewhere (a hostile name, another shard) or dropped, a tensor
    added, its metadata or top level replaced, or its bytes cut."""
    how = draw(st.sampled_from(["map", "move", "drop", "add", "metadata", "top", "cut"]))
    doc = json.loads(json.dumps(index))
    names = sorted(doc["weight_map"])
    if how == "map":
        doc["weight_map"][draw(st.sampled_from(names))] = draw(
            st.one_of(HOSTILE, st.sampled_from(["/etc/passwd", "../" + shards[0], "sub/x.safetensors", "a\x00b"]))
        )
    elif how == "move":
        doc["weight_map"][draw(st.sampled_from(names))] = draw(st.sampled_from(shards))
    elif how == "drop":
        doc["weight_map"].pop(draw(st.sampled_from(names)))
    elif how == "add":
        doc["weight_map"][draw(st.sampled_from(["model.extra.weight", "", "model.layers.9.x"]))] = draw(
            st.sampled_from(shards)
        )
    elif how == "metadata":
        doc["metadata"] = draw(HOSTILE)
    elif how == "top":
        doc = draw(HOSTILE)
    text = json.dumps(doc).encode()
    return text[: draw(st.integers(0, len(text) - 1))] if how == "cut" else text


@pytest.mark.slow
def test_fuzz_tampered_shard_index(models, fresh, tmp_path, capfd):
    reference = _reference(models["sharded"], tmp_path, capfd)
    index = json.loads((models["sharded"] / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    tried = []

    @settings(max_examples=40, **FUZZ)
    @given(data=st.data())
    def hostile(data: st.DataObject) -> None:
        d = tmp_path / "m"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(models["sharded"], d)
        bad = data.draw(tampered_indexes(index, shards))
        tried.append(bad)
        (d / "model.safetensors.index.json").write_bytes(bad)
        _one_rule(*_walk(d, tmp_path / "walk.json", capfd), reference)

    hostile()
    print(f"\nsharded llama: {len(tried)} tampered shard indexes")
    assert len(tried) >= 35
