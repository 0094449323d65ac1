"""The parity card and derived adapters: every check passes on the model itself, and a planted error in a
derived adapter (a missing logit scale, a skipped norm, a wrong fused layout) is caught and refused."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import walklens
from walklens.analyses.parity import verify
from walklens.base.errors import UnsupportedFamilyError
from walklens.cli import main
from walklens.models import derive
from walklens.models import roles as roles_module
from walklens.models.base import lm_head_logits
from walklens.testing import TINY_FAMILIES, tiny_model

TEXT = ("the capital of france is paris and the king ran to the river",)
CAUSAL = tuple(f for f in TINY_FAMILIES if f not in ("t5", "bert", "albert"))
#: model types with no adapter file whose tiny models load through a derived adapter
DERIVED = ("arcee", "smollm3", "helium", "glm", "ernie4_5", "apertus", "exaone4")


@pytest.mark.parametrize("family", CAUSAL)
def test_quick_card_passes_on_every_family(family):
    card = verify(tiny_model(family), texts=TEXT, quick=True)
    assert card.passed, card
    assert {c.name for c in card.checks} == {"logits", "residual", "attention_identity", "attention_scores"}


@pytest.mark.parametrize(
    "family,dtype",
    [
        ("llama", "float32"),
        ("gemma2", "float32"),
        ("qwen3_moe", "bfloat16"),
        ("phi3", "bfloat16"),
        ("bloom", "float32"),
        ("opt_postnorm", "float32"),
    ],
)
def test_full_card_passes(family, dtype):
    card = verify(tiny_model(family, dtype=dtype), texts=TEXT)
    assert card.passed, card
    assert card["decoding_walk"].passed and card["hidden_states"].passed and card.dtype == dtype
    measured = [c for c in card.checks if c.passed is not None]
    assert len(measured) >= 5  # most checks really ran


@pytest.mark.parametrize("model_type", DERIVED)
def test_derived_adapter_loads_and_its_card_passes(model_type):
    lm = tiny_model(model_type)
    assert lm.adapter.family == f"derived:{model_type}"
    card = verify(lm, texts=TEXT)
    assert card.passed and card.derived, card


def test_card_fails_on_a_planted_missing_logit_scale():
    lm = tiny_model("cohere")  # logit_scale 0.0625
    assert verify(lm, texts=TEXT, quick=True).passed
    lm.adapter = dataclasses.replace(lm.adapter, logits_fn=lm_head_logits("lm_head"))
    card = verify(lm, texts=TEXT, quick=True)
    assert not card.passed and card.failed() == ["logits"]


def _model(model_type):
    return tiny_model(model_type).model


def test_derive_refuses_a_missing_logit_scale(monkeypatch):
    model = _model("cohere")
    assert derive.derive_roles(model).logit_scale == ("logit_scale", "mul")
    monkeypatch.setattr(derive, "LOGIT_SCALES", ())  # planted: the scale is not looked for
    with pytest.raises(UnsupportedFamilyError, match="logits recomputed from the final norm's output differ"):
        derive.derive_roles(model)


def test_derive_refuses_a_skipped_norm(monkeypatch):
    model = _model("olmo2")  # norms after attention and after the MLP
    assert derive.derive_roles(model).attn_out == "post_attention_layernorm"
    real = derive._is_norm
    monkeypatch.setattr(
        derive,
        "_is_norm",
        lambda m: (
            real(m) and "post" not in str(m.__class__) and m is not model.model.layers[0].post_attention_layernorm
        ),
    )
    with pytest.raises(UnsupportedFamilyError, match="contributions do not add up"):
        derive.derive_roles(model)


def test_derive_refuses_a_wrong_fused_layout(monkeypatch):
    model = _model("phi3")  # fused qkv_proj = [q | k | v]
    assert derive.derive_roles(model).layout == "blocks"
    monkeypatch.setattr(derive, "LAYOUTS", ("grouped",))
    with pytest.raises(UnsupportedFamilyError, match="A.3 identity fails"):
        derive.derive_roles(model)


def test_derived_roles_render_as_an_adapter_file(tmp_path):
    roles = derive.derive_roles(_model("arcee"))
    text = roles_module.render(roles)
    ns: dict = {}
    exec(compile(text.replace("from .roles import", "from walklens.models.roles import"), "f.py", "exec"), ns)
    assert ns["ROLES"] == roles and ns["ADAPTER"].family == "arcee"  # kept in models/, a family of its own
    lm = walklens.core.wrap(tiny_model("arcee").model, tiny_model("arcee").tokenizer, adapter=ns["ADAPTER"])
    assert verify(lm, texts=TEXT, quick=True).passed


def test_load_model_derives_caches_and_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    lm = tiny_model("smollm3")
    d = tmp_path / "smollm3"
    lm.model.save_pretrained(str(d))
    lm.tokenizer.save_pretrained(str(d))
    a = walklens.load_model(str(d))
    cached = list((tmp_path / "cache" / "derived").glob("smollm3-*.json"))
    assert a.adapter.family == "derived:smollm3" and len(cached) == 1
    calls = []
    monkeypatch.setattr("walklens.core.loading.derive_roles", lambda m: calls.append(1))
    b = walklens.load_model(str(d))  # from the cache: no probe
    assert not calls and b.adapter.family == "derived:smollm3"
    tr = walklens.capture(b, "the king ran to the river")
    with torch.no_grad():
        assert torch.allclose(tr.logits(), b.model(tr.token_ids[None]).logits[0], atol=1e-5)
    monkeypatch.undo()
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "card.json"
    assert main(["verify", str(d), "--json", str(out), "--out", str(tmp_path / "rep")]) == 0
    doc = json.loads(out.read_text())
    assert doc["passed"] and doc["derived"] and {c["verdict"] for c in doc["checks"]} <= {"pass", "n/a"}
    assert "<script" not in (tmp_path / "rep" / "index.html").read_text().split("</style>")[1].split("<h2")[0]
    assert main(["adapter", str(d), "--write", str(d / "config.json")]) == 2  # never over the model's own file
    assert json.loads((d / "config.json").read_text())["model_type"] == "smollm3"
    assert main(["adapter", str(d), "--write", str(tmp_path / "smollm3.py")]) == 0
    assert "ROLES = Roles(" in (tmp_path / "smollm3.py").read_text()


def test_a_type_that_cannot_be_derived_is_refused_in_one_line(tmp_path, capsys):
    import transformers as T

    from walklens.testing import tiny_config, tiny_tokenizer

    cfg = tiny_config("afmoe", len(tiny_tokenizer()))  # gated attention: the A.3 identity cannot hold
    model = T.AutoModelForCausalLM.from_config(cfg)
    d = tmp_path / "afmoe"
    model.save_pretrained(str(d))
    tiny_tokenizer().save_pretrained(str(d))
    capsys.readouterr()
    assert main(["verify", str(d)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("walklens: error: model_type 'afmoe' has no adapter file and none")


def test_head_stats_say_when_w_qk_is_only_a_summary():
    assert walklens.analyses.head_stats(tiny_model("llama")).qk_note == ""
    note = walklens.analyses.head_stats(tiny_model("qwen3")).qk_note
    assert "summarises the raw projections" in note and "normalised" in note


@pytest.mark.parametrize(
    "model_type,why",
    [
        ("gpt_oss", "attention rows do not sum to 1: attention sinks"),  # the A.3 identity's bias term needs rows of 1
        ("gpt_neox_japanese", "layer 1's contributions do not add up"),  # layer 0's roles do not hold on layer 1
    ],
)
def test_what_the_layer_0_probe_would_miss_is_refused(model_type, why):
    with pytest.raises(UnsupportedFamilyError, match=why):
        tiny_model(model_type)


def test_scores_that_do_not_rebuild_are_declared_not_guessed():
    lm = tiny_model("hunyuan_v1_moe")  # derived; its scores do not rebuild from W_q, W_k at position 0
    assert "qk_rebuild" in lm.adapter.broken(lm.model.config)
    card = verify(lm, texts=TEXT)
    assert card.passed and card["attention_scores"].passed is None and "qk_rebuild" in card["attention_scores"].note
