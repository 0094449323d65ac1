"""Fuzzing the inputs of part D (hypothesis): the A.6 scheme grammar, grid TOML files and ``load_model`` specs.

Whatever the input, the answer is a valid object or one :class:`~walklens.base.errors.WalklensError` (``InputError``
for schemes and grids; ``UnknownModelError`` / ``UnsupportedFamilyError`` for models), never another exception;
through the CLI that is one ``walklens: error:`` line and exit code 2.

Bounded and deterministic: every test has ``max_examples``, ``derandomize=True`` and no example database.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import walklens
from walklens.analyses.concepts.schemes import (
    ALL_ENCODING_SCHEMES,
    EXAMPLE_AGG_SCHEMES,
    LAYER_NAMES,
    NORMS,
    SEGMENT_AGG_SCHEMES,
    SIMILARITY_FUNCS,
    WORD_AGG_SCHEMES,
    Scheme,
)
from walklens.base.errors import InputError, UnsupportedFamilyError, WalklensError
from walklens.lab.experiments.grid import FIELDS, GridSpec
from walklens.models import ADAPTERS

FUZZ = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ARCHES = ("decoder", "encoder-decoder", "encoder")

# ---- the scheme grammar --------------------------------------------------------------------------------------

LAYERS = st.one_of(st.sampled_from(LAYER_NAMES), st.integers(-(10**6), 10**6).map(str), st.integers(-40, 40))


@st.composite
def schemes(draw: st.DrawFn, test: int | None = None) -> Scheme:
    """A valid :class:`Scheme` of Test 1 (no sim/out_*) or Test 2 (a similarity, optional out_*), A.6 values."""
    test = draw(st.sampled_from((1, 2))) if test is None else test
    kw: dict[str, Any] = dict(
        enc=draw(st.sampled_from(ALL_ENCODING_SCHEMES)),
        layer=draw(LAYERS),
        word=draw(st.sampled_from(WORD_AGG_SCHEMES)),
        norm=draw(st.sampled_from(NORMS)),
        seg=draw(st.sampled_from(SEGMENT_AGG_SCHEMES)),
        ex=draw(st.sampled_from(EXAMPLE_AGG_SCHEMES)),
    )
    if test == 2:
        kw.update(
            sim=draw(st.sampled_from([s for s in SIMILARITY_FUNCS if s is not None])),
            out_layer=draw(st.none() | LAYERS),
            out_word=draw(st.none() | st.sampled_from(WORD_AGG_SCHEMES)),
        )
    return Scheme(**kw)


@settings(max_examples=200, **FUZZ)
@given(s=schemes(), arch=st.sampled_from(ARCHES))
def test_scheme_string_round_trip(s: Scheme, arch: str) -> None:
    text = str(s)
    assert Scheme.parse(text) == s and str(Scheme.parse(text)) == text
    test = 2 if s.sim is not None else 1
    try:
        s.validate(test, arch)
    except InputError:
        with pytest.raises(InputError):
            Scheme.from_spec(text, test, arch)
    else:
        assert Scheme.from_spec(text, test, arch) == s


def _parse_or_input_error(text: Any) -> None:
    try:
        s = Scheme.parse(text)
    except InputError as e:
        assert "\n" not in str(e)
        return
    assert Scheme.parse(str(s)) == s  # whatever parses has a canonical string form that parses back


@settings(max_examples=200, **FUZZ)
@given(text=st.text())
@example("")
@example(",")
@example("enc=concat_each_example,layer=" + "9" * 5000 + ",word=mean")  # int() refuses > 4300 digits
def test_any_text_parses_or_is_an_input_error(text: str) -> None:
    _parse_or_input_error(text)


@st.composite
def near_misses(draw: st.DrawFn) -> str:
    """A valid scheme string with one small mutation (what a typo or a sloppy edit gives)."""
    text = str(draw(schemes()))
    parts = text.split(",")
    how = draw(st.sampled_from(("delete", "insert", "value", "duplicate", "drop", "case", "space", "digits")))
    i = draw(st.integers(0, len(text)))
    j = draw(st.integers(i, min(len(text), i + 8)))
    k = draw(st.integers(0, len(parts) - 1))
    if how == "delete":
        return text[:i] + text[j:]
    if how == "insert":
        return (
            text[:i]
            + draw(st.sampled_from([",", "=", "|", " ", "\n", "None", "-", "+"]) | st.text(max_size=3))
            + text[i:]
        )
    if how == "value":
        parts[k] = parts[k].split("=", 1)[0] + "=" + draw(st.text(max_size=6) | st.sampled_from(["", "none", "E"]))
    elif how == "duplicate":
        parts.insert(k, parts[k])
    elif how == "drop":
        parts.pop(k)
    elif how == "case":
        return text.upper() if draw(st.booleans()) else text.title()
    elif how == "space":
        parts[k] = " " + parts[k].replace("=", " = ") + "\t"
    else:  # layer as another numeral: 1_0, 0x1, fullwidth or Arabic-Indic digits, huge
        parts[1] = "layer=" + draw(st.sampled_from(["1_0", "0x1", "１２", "٣", "1e3", "-0", "+7", "9" * 4400]))
    return ",".join(parts)


@settings(max_examples=200, **FUZZ)
@given(text=near_misses())
def test_near_miss_scheme_strings_parse_or_are_input_errors(text: str) -> None:
    _parse_or_input_error(text)


@settings(max_examples=60, **FUZZ)
@given(spec=st.one_of(st.text(max_size=40), near_misses()), test=st.sampled_from((1, 2)), arch=st.sampled_from(ARCHES))
@example(spec="", test=1, arch="decoder")  # used to run the standard scheme
def test_scheme_specs_give_a_scheme_or_an_input_error(spec: str, test: int, arch: str) -> None:
    try:
        s = Scheme.from_spec(spec, test, arch)
    except InputError:
        return
    assert spec.strip() and s.validate(test, arch) is s


# ---- grid TOML files -----------------------------------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)  # TOML spells nan, inf, -inf and 1e+20 as Python does
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def _toml_key(k: str) -> str:
    return k if k and all(c.isascii() and (c.isalnum() or c in "-_") for c in k) else json.dumps(k, ensure_ascii=False)


def to_toml(doc: dict[str, Any]) -> str:
    """A minimal TOML writer for what the strategies draw (tomllib only reads)."""
    return "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in doc.items())


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
SCALARS = st.one_of(TEXT, st.integers(-(10**20), 10**20), st.floats(), st.booleans())
GOOD_VALUES = {
    "enc": ALL_ENCODING_SCHEMES,
    "layer": ("E", "middle", "0", "-1", "3", "-2"),
    "word": WORD_AGG_SCHEMES,
    "norm": tuple(str(n) for n in NORMS),
    "seg": tuple(str(n) for n in SEGMENT_AGG_SCHEMES),
    "ex": tuple(str(n) for n in EXAMPLE_AGG_SCHEMES),
    "sim": tuple(str(n) for n in SIMILARITY_FUNCS),
    "out_layer": ("E", "-1", "middle", "1"),
    "out_word": WORD_AGG_SCHEMES,
}
GOOD_VALUES["layers"] = GOOD_VALUES["layer"]


def _bad_values(key: str) -> st.SearchStrategy[Any]:
    good = GOOD_VALUES.get(key)
    items = st.sampled_from(good) if good else SCALARS
    return st.one_of(
        st.lists(st.one_of(items, SCALARS), max_size=3),  # wrong types, empty lists
        SCALARS,  # not a list
        st.lists(st.lists(SCALARS, max_size=2), min_size=1, max_size=2),  # nested lists
        st.dictionaries(st.sampled_from(["a", "b"]), SCALARS, max_size=2),
        st.sampled_from(["full", "standard", "nope", ""]),
    )


@st.composite
def grid_docs(draw: st.DrawFn, test: int) -> dict[str, Any]:
    """A valid grid document for ``test`` (mostly small: ``base = "standard"`` with a few lists), then zero to
    two corruptions: unknown keys, keys of the other test, wrong types, empty or nested lists, bad values."""
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["base"] = draw(st.sampled_from(["full", "standard", "standard"]))
    keys = FIELDS if test == 2 else FIELDS[:6]
    for k in draw(st.lists(st.sampled_from(keys + ("layers",)), max_size=4, unique=True)):
        doc[k] = draw(st.lists(st.sampled_from(GOOD_VALUES[k]), min_size=1, max_size=2, unique=True))
    for _ in range(draw(st.integers(0, 2))):
        k = draw(st.sampled_from(FIELDS + ("base", "layers")) | TEXT)
        doc[k] = draw(_bad_values(k))
    return doc


def _grid_or_input_error(path: Path, test: int, arch: str, layers: list[str] | None) -> None:
    try:
        g = GridSpec.resolve(str(path), test, arch, layers)
    except InputError as e:
        assert "\n" not in str(e)
        return
    assert g.product_size() >= 1 and g.layers()
    if g.product_size() <= 400:
        valid, refused = g.enumerate(arch)
        assert len(valid) + sum(refused.values()) == g.product_size()
        assert all(Scheme.parse(str(s)) == s for s in valid)


@settings(max_examples=100, **FUZZ)
@given(
    data=st.data(),
    test=st.sampled_from((1, 2)),
    arch=st.sampled_from(ARCHES),
    layers=st.none() | st.lists(st.sampled_from(["E", "-1", "2"]), min_size=1, max_size=2),
)
@example(data={"layer": [1.5]}, test=1, arch="decoder", layers=None)
@example(data={"layers": ["E"]}, test=1, arch="decoder", layers=["-1"])  # --layers would be ignored
@example(data={"base": "standard", "norm": ["None", "L2"]}, test=2, arch="decoder", layers=["-1", "E"])
@example(data={"base": "standard"}, test=1, arch="decoder", layers=["E", "E"])  # product_size counted copies
def test_random_grid_documents_load_or_are_input_errors(
    data: Any, test: int, arch: str, layers: list[str] | None
) -> None:
    doc = data if isinstance(data, dict) else data.draw(grid_docs(test))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "grid.toml"
        path.write_text(to_toml(doc), encoding="utf-8")
        _grid_or_input_error(path, test, arch, layers)


@settings(max_examples=80, **FUZZ)
@given(
    data=st.binary(max_size=200) | st.text(max_size=80).map(lambda t: t.encode("utf-8", "surrogatepass")),
    test=st.sampled_from((1, 2)),
)
@example(data=b'layer = ["\xff\xfe"]\n', test=1)  # not UTF-8: used to be an internal error
@example(data=b"", test=2)
def test_random_grid_bytes_load_or_are_input_errors(data: bytes, test: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "grid.toml"
        path.write_bytes(data)
        _grid_or_input_error(path, test, "decoder", None)


# ---- load_model specs ----------------------------------------------------------------------------------------


def write_tiny_gguf(
    path: Path, seed: int = 0, D: int = 16, L: int = 1, H: int = 2, H_kv: int = 1, F: int = 32
) -> dict[str, np.ndarray]:
    """A tiny random Llama as an F32 GGUF file (gguf's GGUFWriter), with a byte-level BPE tokenizer; returns
    the tensors written."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = ["<|endoftext|>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "th", "Ġt", "Ġth"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(L)
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(H_kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(D // H)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges(["t h", "Ġ t", "Ġt h"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    d = D // H
    shapes = {"token_embd.weight": (len(tokens), D), "output_norm.weight": (D,)}
    for i in range(L):
        shapes.update(
            {
                f"blk.{i}.attn_norm.weight": (D,),
                f"blk.{i}.ffn_norm.weight": (D,),
                f"blk.{i}.attn_q.weight": (H * d, D),
                f"blk.{i}.attn_k.weight": (H_kv * d, D),
                f"blk.{i}.attn_v.weight": (H_kv * d, D),
                f"blk.{i}.attn_output.weight": (D, H * d),
                f"blk.{i}.ffn_gate.weight": (F, D),
                f"blk.{i}.ffn_up.weight": (F, D),
                f"blk.{i}.ffn_down.weight": (D, F),
            }
        )
    tensors = {
        n: (np.ones(s) if len(s) == 1 else rng.standard_normal(s) * 0.2).astype(np.float32) for n, s in shapes.items()
    }
    for n, t in tensors.items():
        w.add_tensor(n, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from walklens.testing import tiny_model

    lm = tiny_model("gpt2")
    d = tmp_path_factory.mktemp("tiny") / "gpt2"
    lm.model.save_pretrained(d, safe_serialization=True)
    lm.tokenizer.save_pretrained(d)
    return d


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """De-quantized GGUFs go to a throw-away cache; the hub is never asked (offline mode)."""
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _refused(spec: str | Path) -> WalklensError:
    with pytest.raises(WalklensError) as info:
        walklens.load_model(str(spec))
    assert "\n" not in str(info.value)
    return info.value


def test_tiny_gguf_loads_with_its_weights(tiny_gguf: tuple[Path, dict[str, np.ndarray]]) -> None:
    """The GGUF checks refuse nothing valid: the tiny file de-quantizes and V is the matrix written."""
    path, tensors = tiny_gguf
    lm = walklens.load_model(str(path))
    assert (lm.adapter.family, lm.n_layers, lm.d_model) == ("llama", 1, 16)
    assert torch.equal(lm.embedding_matrix(), torch.from_numpy(tensors["token_embd.weight"]))
    assert torch.isfinite(walklens.capture(lm, " the cat").logits()).all()


@settings(max_examples=40, **FUZZ)
@given(frac=st.floats(0, 1, exclude_max=True))
@example(frac=0.0)
@example(frac=0.5)
def test_truncated_gguf_is_refused(tiny_gguf: tuple[Path, dict[str, np.ndarray]], frac: float) -> None:
    data = tiny_gguf[0].read_bytes()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cut.gguf"
        path.write_bytes(data[: int(len(data) * frac)])
        _refused(path)


@settings(max_examples=40, **FUZZ)
@given(data=st.binary(max_size=300), magic=st.booleans())
@example(data=b"", magic=False)
def test_random_gguf_bytes_are_refused(data: bytes, magic: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "random.gguf"
        path.write_bytes((b"GGUF\x03\x00\x00\x00" if magic else b"") + data)
        _refused(path)


@settings(max_examples=30, **FUZZ)
@given(frac=st.floats(0, 1, exclude_max=True))
@example(frac=0.5)
def test_truncated_safetensors_is_refused(tiny_dir: Path, frac: float) -> None:
    with tempfile.TemporaryDirectory() as d:
        m = Path(shutil.copytree(tiny_dir, Path(d) / "m"))
        w = m / "model.safetensors"
        w.write_bytes(w.read_bytes()[: int(w.stat().st_size * frac)])
        assert "safetensors" in str(_refused(m))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
MODEL_TYPES = st.sampled_from(sorted(ADAPTERS) + ["mamba", "nosuch", ""]) | TEXT | JSON
CONFIG_KEYS = (
    st.sampled_from(
        [
            "n_layer",
            "num_hidden_layers",
            "hidden_size",
            "vocab_size",
            "num_attention_heads",
            "n_embd",
            "auto_map",
            "architectures",
            "tie_word_embeddings",
        ]
    )
    | TEXT
)


@settings(max_examples=60, **FUZZ)
@given(
    config=st.one_of(
        JSON,
        st.fixed_dictionaries(
            {"model_type": MODEL_TYPES}, optional={"extra": st.dictionaries(CONFIG_KEYS, JSON, max_size=4)}
        ),
    )
)
@example(config={"model_type": ["gpt2"]})
@example(config={"model_type": "gpt2", "extra": {"n_layer": "x"}})
def test_config_json_with_random_json_is_refused(config: Any) -> None:
    if isinstance(config, dict) and "extra" in config:
        config = {**config.pop("extra"), **config}
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(config), encoding="utf-8")
        _refused(d)  # no weights: nothing here can load


@settings(max_examples=30, **FUZZ)
@given(model_type=st.text(min_size=1, max_size=20).filter(lambda t: t not in ADAPTERS))
def test_unknown_model_type_is_an_unsupported_family(tiny_dir: Path, model_type: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        m = Path(shutil.copytree(tiny_dir, Path(d) / "m"))
        cfg = json.loads((m / "config.json").read_text())
        (m / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
        with pytest.raises(UnsupportedFamilyError, match="is not supported; supported:"):
            walklens.load_model(str(m))


NAMES = st.sampled_from(
    [
        "config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "x.gguf",
        "vocab.txt",
    ]
) | st.text(
    st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="._-"), min_size=1, max_size=12
).filter(lambda n: n not in (".", ".."))
CONTENTS = st.binary(max_size=200) | JSON.map(lambda j: json.dumps(j).encode())


@settings(max_examples=40, **FUZZ)
@given(files=st.dictionaries(NAMES, CONTENTS, max_size=5))
@example(files={})
@example(files={"config.json": b'{"model_type": "gpt2"}', "model.safetensors": b"\x08" + b"\x00" * 15})
def test_garbage_directories_are_refused(files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as d:
        for name, content in files.items():
            (Path(d) / name).write_bytes(content)
        _refused(d)


@settings(max_examples=80, **FUZZ)
@given(spec=st.text(max_size=30))
@example(spec="nosuch-org/nosuch-model")
@example(spec="a!b/c")
@example(spec="x\x00/y")
def test_any_spec_loads_or_is_refused_offline(spec: str) -> None:
    """With the hub offline and no model at the spec, every string is refused with one line."""
    if spec.strip() in walklens.core.loading.NAMED_MODELS:
        return
    _refused(spec)


# ---- the same failures through the CLI: one line, exit code 2 ------------------------------------------------


def test_cli_bad_models_one_line(
    tmp_path: Path, tiny_dir: Path, tiny_gguf: tuple[Path, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    from walklens.cli import main

    data = tiny_gguf[0].read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    (tmp_path / "random.gguf").write_bytes(bytes(range(256)))
    (tmp_path / "empty.gguf").write_bytes(b"")
    cut = Path(shutil.copytree(tiny_dir, tmp_path / "cut_st"))
    (cut / "model.safetensors").write_bytes((tiny_dir / "model.safetensors").read_bytes()[:1000])
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text('{"model_type": "nosuch"}')
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "config.json").write_bytes(b"\xff\xfe\x00")
    expect = {
        "cut.gguf": "not a valid GGUF file",
        "random.gguf": "not a valid GGUF file",
        "empty.gguf": "not a valid GGUF file",
        "cut_st": "not a valid safetensors file",
        "unknown": "model_type 'nosuch' is not supported",
        "garbage": "config.json: not valid JSON",
    }
    for name, msg in expect.items():
        capfd.readouterr()
        assert main(["walk", "hi", "--model", str(tmp_path / name)]) == 2, name
        err = capfd.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("walklens: error: ") and msg in err[0], (name, err)
