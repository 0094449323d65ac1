"""Ecosystem names and formats (docs/ecosystem.md): TransformerLens hook names both ways, checked against an
independent TransformerLens-style forward pass of GPT-2; llama.cpp control vectors written, read back (also files
from an independent writer), refused when malformed, and applied as activation addition."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import walklens
from walklens.analyses.controlvectors import (
    apply_control_vector,
    control_vector,
    read_control_vector,
    write_control_vector,
)
from walklens.base.errors import InputError
from walklens.core.tlnames import tl_cache, tl_name, to_transformerlens, to_walklens, walklens_point
from walklens.testing import tiny_model

TEXT = "the cat and the dog walk to the house"
TL = "transformerlens"


@pytest.fixture(scope="module")
def gpt2():
    return tiny_model("gpt2")


@pytest.fixture(scope="module")
def models(gpt2):
    """Pre-norm (GPT-2, grouped-query Llama), sandwich norms (Gemma 2) and parallel blocks (GPT-NeoX)."""
    return {"gpt2": gpt2, **{f: tiny_model(f) for f in ("llama", "gemma2", "gpt_neox")}}


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg, msg
    return msg


# ---- TransformerLens names ---------------------------------------------------------------------------------------


def test_the_map_is_a_bijection_on_the_mapped_points(models):
    for fam, lm in models.items():
        points = [p for p in walklens.capture(lm, TEXT).points if p != "final"]
        names = [tl_name(p) for p in points]
        assert len(set(names)) == len(names), fam
        assert [walklens_point(n) for n in names] == points, fam
        assert [tl_name(walklens_point(n)) for n in names] == names, fam
        assert ("blocks.0.hook_resid_mid" in names) == (fam != "gpt_neox"), fam  # parallel blocks have no mid
    assert tl_name("L12.resid_post") == "blocks.12.hook_resid_post" and walklens_point("hook_embed") == "embed"


def test_the_transformerlens_named_trace_holds_the_same_tensors(models):
    for fam, lm in models.items():
        wl = walklens.capture(lm, TEXT)
        tl = walklens.capture(lm, TEXT, names=TL)
        assert tl.points == [tl_name(p) for p in wl.points if p != "final"], fam
        assert tl.tokens == wl.tokens
        for name in tl.points:
            assert torch.equal(tl[name], wl[walklens_point(name)]), (fam, name)
        assert to_walklens(tl).points == wl.points[:-1]
        back = to_transformerlens(wl)
        assert back.points == tl.points and torch.equal(back.hidden, tl.hidden)


def test_points_take_transformerlens_patterns(gpt2):
    wl = walklens.capture(gpt2, TEXT)
    tl = walklens.capture(gpt2, TEXT, names=TL, points=["blocks.*.hook_resid_post", "hook_embed"])
    assert tl.points == ["hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert torch.equal(tl["blocks.1.hook_resid_post"], wl["L1.resid_post"])
    assert torch.equal(tl["hook_embed"], wl["embed"])


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _transformerlens_style_gpt2(lm, ids: torch.Tensor, center: bool = False) -> tuple[dict, torch.Tensor]:
    """GPT-2 computed from its weights the way TransformerLens' HookedTransformer does (its Embed, PosEmbed,
    TransformerBlock: hook_embed, hook_pos_embed, blocks.{l}.hook_resid_pre / attn_out / resid_mid / mlp_out /
    resid_post), written out here independently of the HF forward pass and of walklens' hooks.  ``center``:
    TransformerLens' ``center_writing_weights`` (W_E, W_pos, W_O, b_O, W_out, b_out minus their mean over d_model)."""
    tr = lm.model.transformer
    c = (lambda w: w - w.mean(-1, keepdim=True)) if center else (lambda w: w)
    T, H = ids.shape[0], lm.model.config.n_head
    cache = {"hook_embed": c(tr.wte.weight)[ids], "hook_pos_embed": c(tr.wpe.weight)[:T]}
    resid = cache["hook_embed"] + cache["hook_pos_embed"]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l, block in enumerate(tr.h):
        cache[f"blocks.{l}.hook_resid_pre"] = resid
        x = F.layer_norm(resid, resid.shape[-1:], block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
        q, k, v = (x @ block.attn.c_attn.weight + block.attn.c_attn.bias).split(resid.shape[-1], dim=-1)
        q, k, v = (t.view(T, H, -1).transpose(0, 1) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        pattern = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        z = (pattern @ v).transpose(0, 1).reshape(T, -1)
        attn_out = z @ c(block.attn.c_proj.weight) + c(block.attn.c_proj.bias)
        cache[f"blocks.{l}.hook_attn_out"] = attn_out
        resid = cache[f"blocks.{l}.hook_resid_mid"] = resid + attn_out
        x = F.layer_norm(resid, resid.shape[-1:], block.ln_2.weight, block.ln_2.bias, block.ln_2.eps)
        mlp_out = _gelu_new(x @ block.mlp.c_fc.weight + block.mlp.c_fc.bias) @ c(block.mlp.c_proj.weight) + c(
            block.mlp.c_proj.bias
        )
        cache[f"blocks.{l}.hook_mlp_out"] = mlp_out
        resid = cache[f"blocks.{l}.hook_resid_post"] = resid + mlp_out
    final = F.layer_norm(resid, resid.shape[-1:], tr.ln_f.weight, tr.ln_f.bias, tr.ln_f.eps)
    return cache, final @ tr.wte.weight.T


@torch.no_grad()
def test_tl_cache_matches_a_transformerlens_style_forward_pass(gpt2):
    trace = walklens.capture(gpt2, TEXT)
    ids = trace.token_ids
    ref, logits = _transformerlens_style_gpt2(gpt2, ids)
    assert torch.allclose(logits, gpt2.model(input_ids=ids[None]).logits[0], atol=1e-4)  # the reference is GPT-2
    for centered in (False, True):
        ref, _ = _transformerlens_style_gpt2(gpt2, ids, center=centered)
        cache = tl_cache(trace, centered=centered)
        assert set(cache) == set(ref) - {"hook_pos_embed"}
        for name, x in cache.items():
            assert x.shape == (1, len(trace.tokens), trace.d_model), name
            err = (x[0] - ref[name]).abs().max() / ref[name].abs().max()
            assert err < 1e-5, (name, centered, float(err))
        pos = cache["blocks.0.hook_resid_pre"][0] - cache["hook_embed"][0]  # the documented hook_pos_embed
        assert torch.allclose(pos, ref["hook_pos_embed"], atol=1e-5)
    assert not torch.allclose(
        tl_cache(trace)["blocks.1.hook_resid_post"],
        tl_cache(trace, centered=True)["blocks.1.hook_resid_post"],
        atol=1e-3,
    )


@pytest.mark.parametrize(
    "name,needle",
    [
        ("ln_final.hook_normalized", "before them"),
        ("blocks.0.attn.hook_pattern", "attentions=True"),
        ("hook_pos_embed", "blocks.0.hook_resid_pre - hook_embed"),
        ("blocks.1.hook_mlp_in", "blocks.1.hook_resid_mid"),
        ("blocks.0.mlp.hook_post", "blocks.0.hook_mlp_out"),
        ("blocks.0.hook_resid_prex", "nearest: blocks.0.hook_resid_pre"),
        ("blocks.7.hook_resid_pre", "records no"),
        ("blocks.*.hook_foo", "nearest"),
        ("decoder.0.hook_resid_pre", "HookedEncoderDecoder"),
    ],
)
def test_unmapped_transformerlens_names_are_refused_in_one_line(gpt2, name, needle):
    with pytest.raises(InputError) as e:
        walklens.capture(gpt2, TEXT, names=TL, points=[name])
    assert needle in _one_line(e)


@pytest.mark.parametrize(
    "point,needle", [("final", "hook_resid_post"), ("L0.cross_out", "T5"), ("L0.resid_prx", "nearest: L0.resid_pre")]
)
def test_walklens_points_without_a_hook_are_refused_in_one_line(point, needle):
    with pytest.raises(InputError) as e:
        tl_name(point)
    assert needle in _one_line(e)


def test_families_whose_hooks_mean_something_else_are_refused(gpt2, models):
    for fam, needle in (("bert", "post-norm"), ("opt_postnorm", "post-norm"), ("t5", "decoder-only")):
        with pytest.raises(InputError) as e:
            walklens.capture(tiny_model(fam), "the cat and the dog", names=TL)
        assert needle in _one_line(e), fam
    bloom = tiny_model("bloom")
    assert "hook_embed" not in walklens.capture(bloom, TEXT, names=TL).points  # after the embedding LayerNorm in TL
    with pytest.raises(InputError) as e:
        walklens.capture(bloom, TEXT, names=TL, points=["hook_embed"])
    assert "word_embeddings_layernorm" in _one_line(e)
    with pytest.raises(InputError) as e:
        tl_cache(walklens.capture(models["llama"], TEXT), centered=True)  # RMSNorm: TL centres nothing
    assert "LayerNorm" in _one_line(e)
    with pytest.raises(InputError):
        walklens.capture(gpt2, TEXT, names="nnsight")


# ---- control vectors ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deep():
    """A tiny Llama with 4 layers (llama.cpp steers layers 1 to n_layer - 1)."""
    import transformers

    from walklens.core.loading import wrap
    from walklens.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    return wrap(model, tok, name="tiny-llama-4")


@torch.no_grad()
def _logits(lm, text: str = "the dog and the") -> torch.Tensor:
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
    return lm.model(input_ids=ids).logits[0]


def test_activation_addition_round_trips_and_steers_as_walklens_does(deep, tmp_path):
    cv = control_vector(deep, " cat", [1, -1, 2], 3.0, method="add")
    u = walklens.analyses.direction(deep, " cat")[0]
    assert cv.layers == [1, 2, 3] and all(torch.equal(v, (3.0 * u).float()) for v in cv.directions.values())
    path = write_control_vector(cv, tmp_path / "cat.gguf")
    back = read_control_vector(path, deep)
    assert back.layers == cv.layers and all(torch.equal(back.directions[k], cv.directions[k]) for k in cv.layers)
    assert (back.model_hint, back.method, back.alpha, back.label, back.layer_count) == ("llama", "add", 3.0, " cat", 3)
    base = _logits(deep)
    for scale in (1.0, 2.0):
        with walklens.steer(deep, " cat", [1, 2, 3], 3.0 * scale, method="add"):
            steered = _logits(deep)
        with apply_control_vector(deep, back, scale):
            applied = _logits(deep)
        assert torch.equal(applied, steered) and not torch.equal(applied, base)
    assert torch.equal(_logits(deep), base)  # restored


def test_eigen_steering_exports_its_write_along_u(deep):
    cv = control_vector(deep, " cat", [1, 3], 50.0, method="eigen", texts=[TEXT, "paris is the capital"])
    u = walklens.analyses.direction(deep, " cat")[0]
    for k in (1, 3):
        v = cv.directions[k].double()
        assert cv.along_u[k] == pytest.approx(1.0, abs=1e-6) or cv.along_u[k] == pytest.approx(-1.0, abs=1e-6)
        assert float((v - (v @ u) * u).norm()) < 1e-5 * float(v.norm())
    # one token: attention reads only itself, so the edit writes alpha (x . w) u with x the normed input (seed 002)
    one = walklens.capture(deep, "the", attentions=True)
    assert len(one.tokens) == 1
    cv1 = control_vector(deep, " cat", [2], 50.0, method="eigen", texts=["the"])
    A, _ = walklens.core.ov_factors(deep, 2)
    _, w = walklens.core.value_projection(A, u)
    expected = 50.0 * float(one.attn_inputs["L2.attn"][0].double() @ w) * u
    assert torch.allclose(cv1.directions[2].double(), expected, rtol=1e-4, atol=1e-6)


def test_control_vectors_refuse_what_llama_cpp_cannot_express(deep, tmp_path):
    with pytest.raises(InputError) as e:
        control_vector(deep, " cat", [0, 1], 1.0)
    assert "layer 0" in _one_line(e)
    with pytest.raises(InputError) as e:
        control_vector(deep, " cat", [1], 1.0, method="eigen")
    assert "texts" in _one_line(e)
    with pytest.raises(InputError):
        control_vector(deep, " cat", [1], float("nan"))
    with pytest.raises(InputError) as e:
        write_control_vector(control_vector(deep, " cat", [1], 1.0), tmp_path)  # a folder is never replaced
    assert "directory" in _one_line(e)
    with pytest.raises(InputError), apply_control_vector(deep, control_vector(deep, " cat", [1], 1.0), float("inf")):
        pass


# ---- files from elsewhere ----------------------------------------------------------------------------------------


def _gguf_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _raw_gguf(path: Path, kv: list[tuple[str, int, bytes]], tensors: list[tuple[str, list[int], int, bytes]]) -> Path:
    """A GGUF v3 file written byte by byte from the format (no gguf package): ``kv`` as (key, value type, packed
    value), ``tensors`` as (name, dims, ggml type, data)."""
    head = struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(kv))
    head += b"".join(_gguf_string(k) + struct.pack("<I", t) + v for k, t, v in kv)
    offset, blobs = 0, []
    for name, dims, ggml_type, data in tensors:
        head += _gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        head += struct.pack("<IQ", ggml_type, offset)
        pad = (-len(data)) % 32
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    start = (len(head) + 31) // 32 * 32
    path.write_bytes(head + b"\0" * (start - len(head)) + b"".join(blobs))
    return path


STRING, UINT32 = 8, 4
ARCH = ("general.architecture", STRING, _gguf_string("controlvector"))
HINT = ("controlvector.model_hint", STRING, _gguf_string("llama"))


def _row(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def test_files_of_independent_writers_are_read(deep, tmp_path):
    rows = {k: np.random.default_rng(k).standard_normal(32).astype(np.float32) for k in (1, 3)}
    raw = _raw_gguf(
        tmp_path / "raw.gguf",
        [ARCH, HINT, ("controlvector.layer_count", UINT32, struct.pack("<I", 2))],
        [(f"direction.{k}", [32], 0, _row(v)) for k, v in rows.items()],
    )
    import gguf  # as repeng's ControlVector.export_gguf writes it

    writer = gguf.GGUFWriter(str(tmp_path / "repeng.gguf"), "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_uint32("controlvector.layer_count", len(rows))
    for k, v in rows.items():
        writer.add_tensor(f"direction.{k}", v)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    column = _raw_gguf(tmp_path / "column.gguf", [ARCH], [("direction.2", [32, 1], 0, _row(rows[1]))])
    for path in (raw, tmp_path / "repeng.gguf"):
        cv = read_control_vector(path, deep)
        assert cv.layers == [1, 3] and cv.model_hint == "llama" and cv.layer_count == 2 and cv.method == ""
        for k, v in rows.items():
            assert torch.equal(cv.directions[k], torch.from_numpy(v))
    cv = read_control_vector(column)  # [n_embd, 1]: one row for llama.cpp's ggml_n_dims too
    assert cv.layers == [2] and torch.equal(cv.directions[2], torch.from_numpy(rows[1]))
    with apply_control_vector(deep, read_control_vector(raw)):
        applied = _logits(deep)
    r1, r3 = torch.from_numpy(rows[1]), torch.from_numpy(rows[3])
    with walklens.core.add_to_residual(deep, [1], r1), walklens.core.add_to_residual(deep, [3], r3):
        assert torch.equal(_logits(deep), applied)  # direction.k at the output of walklens' layer k
    assert not torch.equal(applied, _logits(deep))


def _malformed(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    ok = _row(np.ones(32))
    d = {}

    def raw(name, kv, tensors, needle):
        d[name] = (_raw_gguf(tmp_path / f"{name}.gguf", kv, tensors), needle)

    raw(
        "model",
        [("general.architecture", STRING, _gguf_string("llama"))],
        [("direction.1", [32], 0, ok)],
        "'llama', not 'controlvector'",
    )
    raw("no_arch", [HINT], [("direction.1", [32], 0, ok)], "no general.architecture")
    raw("other_tensor", [ARCH], [("output.weight", [32], 0, ok)], "not direction.N")
    raw("layer_zero", [ARCH], [("direction.0", [32], 0, ok)], "direction.0")
    raw("f16", [ARCH], [("direction.1", [32], 1, np.ones(32, dtype="<f2").tobytes())], "not F32")
    raw("matrix", [ARCH], [("direction.1", [16, 2], 0, ok)], "not one row")
    raw("lengths", [ARCH], [("direction.1", [32], 0, ok), ("direction.2", [16], 0, ok[:64])], "entries")
    raw("nan", [ARCH], [("direction.1", [32], 0, _row([math.nan] * 32))], "NaN")
    raw("empty", [ARCH], [], "no direction tensors")
    raw("duplicate", [ARCH], [("direction.1", [32], 0, ok), ("direction.1", [32], 0, ok)], "not a readable GGUF")
    raw(
        "count",
        [ARCH, ("controlvector.layer_count", STRING, _gguf_string("two"))],
        [("direction.1", [32], 0, ok)],
        "not an integer",
    )
    raw("wrong_d", [ARCH], [("direction.1", [16], 0, ok[:64])], "residual has 32")
    raw("too_deep", [ARCH], [("direction.4", [32], 0, ok)], "does not have")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    d["junk"] = (junk, "not a readable GGUF")
    whole = d["model"][0].read_bytes()
    cut = tmp_path / "truncated.gguf"
    cut.write_bytes(whole[: len(whole) - 40])
    d["truncated"] = (cut, "not a readable GGUF")
    d["missing"] = (tmp_path / "missing.gguf", "no such file")
    d["folder"] = (tmp_path, "not a regular file")
    return d


def test_malformed_files_are_refused_in_one_line(deep, tmp_path):
    for name, (path, needle) in _malformed(tmp_path).items():
        with pytest.raises(InputError) as e:
            read_control_vector(path, deep)
        assert needle in _one_line(e), (name, str(e.value))


# ---- command line ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory, deep):
    d = tmp_path_factory.mktemp("deep")
    deep.model.save_pretrained(str(d))
    deep.tokenizer.save_pretrained(str(d))
    return d


def test_steer_exports_a_control_vector(deep, deep_dir, tmp_path, capsys):
    from walklens.cli import main

    out = tmp_path / "cat.gguf"
    assert (
        main(
            [
                "steer",
                "the dog and the",
                "--toward",
                " cat",
                "--layers",
                "1-3",
                "--method",
                "add",
                "--alpha",
                "4",
                "--max-new-tokens",
                "1",
                "--model",
                str(deep_dir),
                "--export-control-vector",
                str(out),
            ]
        )
        == 0
    )
    assert "control vector:" in capsys.readouterr().out
    cv, ref = read_control_vector(out, deep), control_vector(deep, " cat", [1, 2, 3], 4.0)
    assert cv.layers == [1, 2, 3] and all(torch.equal(cv.directions[k], ref.directions[k]) for k in ref.layers)
    eig = tmp_path / "eig.gguf"
    assert (
        main(
            [
                "steer",
                "the dog and the",
                "--toward",
                " cat",
                "--layers",
                "2",
                "--method",
                "eigen",
                "--alpha",
                "30",
                "--max-new-tokens",
                "1",
                "--model",
                str(deep_dir),
                "--export-control-vector",
                str(eig),
            ]
        )
        == 0
    )
    got = read_control_vector(eig, deep)
    want = control_vector(deep, " cat", [2], 30.0, method="eigen", texts=["the dog and the"])
    assert got.method == "eigen" and torch.allclose(got.directions[2], want.directions[2], atol=1e-6)


def test_steer_export_is_checked_before_the_model_loads(deep_dir, tmp_path, capsys, monkeypatch):
    from walklens.cli import common, main

    base = ["steer", "the dog", "--toward", " cat", "--model", str(deep_dir)]
    real = common.load_model
    monkeypatch.setattr(common, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    js = tmp_path / "s.json"
    for extra, needle in (
        (["--layers", "1", "--alpha", "4", "--method", "both", "--export-control-vector", "x.gguf"], "--method add"),
        (
            ["--layers", "1", "--layers", "2", "--method", "add", "--export-control-vector", "x.gguf"],
            "one --layers set",
        ),
        (
            ["--layers", "1", "--method", "eigen", "--alpha", "1,2", "--export-control-vector", "x.gguf"],
            "one --layers set",
        ),
        (["--layers", "1", "--method", "add", "--alpha", "1", "--export-control-vector", str(tmp_path)], "directory"),
        (
            ["--layers", "1", "--method", "add", "--alpha", "1", "--json", str(js), "--export-control-vector", str(js)],
            "--json",
        ),
    ):
        assert main([*base, *extra]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("walklens: error: ") and needle in lines[0], lines
    monkeypatch.setattr(common, "load_model", real)
    out = tmp_path / "zero.gguf"
    assert main([*base, "--layers", "0-1", "--method", "add", "--alpha", "1", "--export-control-vector", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "layer 0" in lines[0] and not out.exists()
