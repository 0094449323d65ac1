"""Model dtypes and devices (issue 14): parsing, errors and warnings (no GPU needed), the record dtype, and what
stays exact in bfloat16 -- logits recomputation, the A.3 identity, walk ranks, eigenvalues, packed scoring.

Tolerances (docs/dtype.md), with u = 2**-8 the bfloat16 unit roundoff:

- ``trace.logits()`` against the bfloat16 model's own logits: ``u * max|logit|`` (the same head on the same
  bfloat16 input; measured bit-identical);
- the A.3 identity: max |error| / max |output| <= 8 u per module (measured <= 1.2 u on every family and on
  smollm2-135m);
- scores of two bfloat16 computations that round differently (packed + SDPA against eager full sequences):
  ``8 u |ref| + 16 u`` per scored token (measured <= 0.022 nats per token on the tiny families, <= 0.051 on
  smollm2-135m).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import walklens
from oracles import reference_logliks
from walklens.base import precision
from walklens.base.errors import InputError, SlowDtypeWarning
from walklens.base.precision import UNIT_ROUNDOFF, check_device, model_label, parse_dtype, slow_reason, warn_if_slow
from walklens.core.capture import tokenize
from walklens.core.interventions import attention_kernel, sdpa_possible
from walklens.core.loading import wrap
from walklens.core.scoring import packing
from walklens.core.scoring.packing import packed_logliks
from walklens.core.scoring.request import ScoreRequest
from walklens.lab.hellaswag.baseline import baseline_items, baseline_request, item_result
from walklens.lab.hellaswag.data import load_hellaswag
from walklens.testing import TINY_FAMILIES, tiny_model

TEXT = "the king ran to the river and the queen walks to the city of paris"
U = UNIT_ROUNDOFF[torch.bfloat16]
CAUSAL = tuple(f for f in TINY_FAMILIES if f not in ("t5", "bert", "albert"))


def _forward_logits(lm, text: str) -> torch.Tensor:
    ids = tokenize(lm, text)
    kw = {"input_ids": ids}
    if lm.adapter.auto_class == "seq2seq":
        kw["decoder_input_ids"] = lm.model._shift_right(ids)
    with torch.no_grad():
        return lm.model(**kw).logits[0].float()


def _as_float32(lm):
    """A float32 copy of a (bfloat16) model: the very same numbers, computed in float32."""
    return wrap(copy.deepcopy(lm.model).float(), lm.tokenizer, name=lm.name)


def _scores_close(got: float, ref: float, n_tokens: int) -> bool:
    return abs(got - ref) <= 8 * U * abs(ref) + 16 * U * n_tokens


# ---- parsing, devices, warnings (no GPU needed) -------------------------------------------------------------


def test_dtype_names():
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype(" Float16 ") is torch.float16
    assert parse_dtype(torch.float32) is torch.float32
    for bad in ("bf16", "float64", torch.float64, torch.int8, "", None):
        with pytest.raises(InputError, match="unsupported model dtype"):
            parse_dtype(bad)
    assert model_label("m", torch.float32) == "m" and model_label("m", torch.bfloat16) == "m@bfloat16"


def test_devices(monkeypatch):
    assert check_device("cpu") == torch.device("cpu")
    for bad in ("gpu", "mps", "cuda:x"):
        with pytest.raises(InputError, match="device"):
            check_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="no CUDA GPU is available"):
        check_device("cuda")


def test_slow_dtypes_by_cpu_flags():
    assert slow_reason(torch.float32, "cpu", {"avx2"}) is None
    assert "AMX-BF16/AVX512-BF16" in slow_reason(torch.bfloat16, "cpu", {"avx2", "avx512f"})
    assert slow_reason(torch.bfloat16, "cpu", {"avx512f", "avx512_bf16"}) is None
    assert slow_reason(torch.bfloat16, "cpu", {"amx_bf16", "amx_tile"}) is None
    fp16 = slow_reason(torch.float16, "cpu", {"amx_bf16", "avx512_fp16"})
    assert "no faster than float32" in fp16 and "bfloat16 is the fast half precision" in fp16
    assert "bfloat16 is the fast" not in slow_reason(torch.float16, "cpu", {"avx2"})
    assert slow_reason(torch.float16, "cpu", {"amx_fp16"}) is None
    assert precision.cpu_flags() is None or isinstance(precision.cpu_flags(), set)


def test_slow_warning_once(monkeypatch):
    monkeypatch.setattr(precision, "_warned", set())
    with pytest.warns(SlowDtypeWarning, match="bfloat16 on this CPU"):
        assert warn_if_slow(torch.bfloat16, "cpu", {"avx2"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        assert warn_if_slow(torch.bfloat16, "cpu", {"avx2"}) is None
        assert warn_if_slow(torch.bfloat16, "cpu", {"amx_bf16"}) is None  # already said for bf16 on the CPU
        assert warn_if_slow(torch.float32, "cpu", {"avx2"}) is None


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    lm = tiny_model("llama")
    d = tmp_path_factory.mktemp("tiny-llama")
    lm.model.save_pretrained(d, safe_serialization=True)
    lm.tokenizer.save_pretrained(d)
    return d


def test_load_model_dtype_and_device(tiny_dir, monkeypatch):
    lm = walklens.load_model(str(tiny_dir), dtype="bfloat16")
    assert lm.dtype is torch.bfloat16 and lm.name == f"{tiny_dir}@bfloat16"
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    ref = walklens.load_model(str(tiny_dir))
    assert ref.name == str(tiny_dir) and ref.dtype is torch.float32
    assert torch.equal(lm.embedding_matrix(), ref.embedding_matrix().to(torch.bfloat16))
    with pytest.raises(InputError, match="unsupported model dtype"):
        walklens.load_model("no/such-model", dtype="int8")  # refused before anything is looked up
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="no CUDA GPU"):
        walklens.load_model("no/such-model", device="cuda")


def _cli(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""},
    )


@pytest.mark.slow
def test_cli_cuda_without_gpu_is_one_line(tiny_dir, tmp_path):
    out = tmp_path / "w.json"
    r = _cli(
        "import sys; from walklens.cli import main; "
        f"sys.exit(main(['walk', 'the king', '--model', {str(tiny_dir)!r}, '--device', 'cuda', "
        f"'--json', {str(out)!r}]))"
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "walklens: error: device 'cuda' asked for, but no CUDA GPU is available "
        "("
        + ("this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU was found")
        + "); use --device cpu"
    ]
    assert not out.exists()


@pytest.mark.slow
def test_cli_dtype_runs_and_warns_once(tiny_dir, tmp_path):
    out = tmp_path / "w.json"
    r = _cli(
        "import sys; import walklens.base.precision as p; p.cpu_flags = lambda: {'avx2'}; "
        "from walklens.cli import main; "
        f"sys.exit(main(['walk', 'the king ran', '--model', {str(tiny_dir)!r}, '--dtype', 'bfloat16', "
        f"'--json', {str(out)!r}]))"
    )
    assert r.returncode == 0, r.stderr
    assert [l for l in r.stderr.splitlines() if l.strip()] == [
        "walklens: warning: bfloat16 on this CPU has no AMX-BF16/AVX512-BF16 instructions: its matrix products "
        "are emulated and usually slower than float32"
    ]
    assert json.loads(out.read_text())["model"] == f"{tiny_dir}@bfloat16"


def test_every_model_command_takes_dtype_and_device():
    from walklens.cli import build_parser

    parser = build_parser()
    for argv in (
        ["walk", "x"],
        ["generate", "x"],
        ["simmap", "x"],
        ["heads", "x"],
        ["kernels"],
        ["power", "x"],
        ["steer", "x", "--toward", "y", "--layers", "1"],
        ["hellaswag", "baseline"],
        ["hellaswag", "test1"],
        ["sweep", "--test", "1"],
    ):
        args = parser.parse_args(argv + ["--dtype", "bfloat16", "--device", "cuda"])
        assert (args.dtype, args.device) == ("bfloat16", "cuda"), argv
        assert parser.parse_args(argv).dtype == "float32"


# ---- the record dtype ---------------------------------------------------------------------------------------


def test_record_dtype_is_independent_of_the_model_dtype(tmp_path):
    lm = tiny_model("llama", dtype="bfloat16")
    tr = walklens.capture(lm, TEXT)  # default: float32 records
    own = walklens.capture(lm, TEXT, dtype=None)  # the model's dtype
    assert tr.hidden.dtype is torch.float32 and own.hidden.dtype is torch.bfloat16
    assert tr.model_dtype == own.model_dtype == "bfloat16"
    assert torch.equal(tr.hidden, own.hidden.float())  # bfloat16 -> float32 is exact
    back = walklens.Trace.load(tr.save(tmp_path / "t.safetensors"))
    assert back.model_dtype == "bfloat16" and torch.equal(back.hidden, tr.hidden)
    batch = walklens.core.capture_batch(lm, [[7, 8, 9]], ["L1.resid_pre"], dtype=None)
    assert batch.hidden.dtype is torch.bfloat16


# ---- exact in its dtype ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_logits_and_identity_in_16_bits(family, dtype):
    lm = tiny_model(family, dtype=dtype)
    u = UNIT_ROUNDOFF[parse_dtype(dtype)]
    ref = _forward_logits(lm, TEXT)
    got = walklens.capture(lm, TEXT).logits()
    assert got.dtype is torch.float32
    assert (got - ref).abs().max() <= u * ref.abs().max(), family
    res = walklens.attention_identity(lm, TEXT)
    assert res.model_dtype == dtype
    assert res.holds() and res.max_rel_error <= 8 * u, dict(res)
    assert res.max_error > 0  # bfloat16 really rounds: the float64 recomputation is not the model's own


def test_wrong_w_vo_fails_in_bfloat16():
    lm = tiny_model("llama", dtype="bfloat16")
    swap = [1, 0, 2, 3]

    def tampered(stack, layer, cross):
        hm = walklens.head_matrices(lm, layer, stack, cross)
        return dataclasses.replace(hm, weights=dataclasses.replace(hm.weights, w_o=hm.weights.w_o[swap]))

    res = walklens.attention_identity(lm, TEXT, matrices=tampered)
    assert res.max_rel_error > 8 * U and not res.holds()


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2", "bert"])
def test_walk_ranks_are_float32_from_bfloat16_weights(family):
    lm = tiny_model(family, dtype="bfloat16")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    tr = walklens.capture(lm, TEXT)
    wide = _as_float32(lm)
    for norm in ("none", "final"):
        got = walklens.encoding_walk(tr, norm=norm, progress=False)
        want = walklens.encoding_walk(dataclasses.replace(tr, lm=wide), norm=norm, progress=False)
        assert got.model_dtype == "bfloat16" and want.model_dtype == "float32"
        assert torch.equal(got.rank_of_input, want.rank_of_input), (family, norm)
        assert torch.equal(got.rank_of_next, want.rank_of_next), (family, norm)
        assert torch.equal(got.dot_next.nan_to_num(), want.dot_next.nan_to_num()), (family, norm)
    after = lm.model.state_dict()  # the model is back as it was, bit for bit, in bfloat16
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())


def test_walk_lens_in_bfloat16_differs_from_rounded_head():
    """The float32 head matters: scores of the bfloat16 head itself are rounded to bfloat16 (8 bits)."""
    lm = tiny_model("llama", dtype="bfloat16")
    tr = walklens.capture(lm, TEXT)
    got = walklens.encoding_walk(tr, norm="final", points=["final"], progress=False)
    rounded = tr.logits("final")  # the model's own bfloat16 head
    dots = got.top_scores[0, :, 0]
    assert not torch.equal(dots, rounded.max(-1).values)
    assert (dots - rounded.max(-1).values).abs().max() <= U * rounded.abs().max()


def test_eigenvalues_in_float64_from_bfloat16_weights():
    lm = tiny_model("llama", dtype="bfloat16")
    wide = _as_float32(lm)
    got, want = walklens.power_spectra(lm, nearest=3), walklens.power_spectra(wide, nearest=3)
    assert got.model_dtype == "bfloat16" and want.model_dtype == "float32"
    for a, b in zip(got.layers, want.layers):
        assert a.eigenvalues.dtype is torch.complex128 and torch.equal(a.eigenvalues, b.eigenvalues)
    al = walklens.alignment(lm, TEXT, spectra=got, n_random=8, n_shuffles=4)
    assert al.model_dtype == "bfloat16"
    hm = walklens.head_matrices(lm, 0)
    fm = walklens.core.FactoredMatrix(hm.weights.w_v[0].bfloat16(), hm.weights.w_o[0].bfloat16())
    assert torch.equal(fm.eigenvalues(), walklens.core.FactoredMatrix(fm.A.float(), fm.B.float()).eigenvalues())


# ---- scoring: SDPA and bfloat16 -------------------------------------------------------------------------------


def _requests(lm, n: int) -> list[ScoreRequest]:
    g = torch.Generator().manual_seed(3)
    V = len(lm.tokenizer)
    out = []
    for _ in range(n):
        ctx = torch.randint(6, V, (int(torch.randint(1, 13, (1,), generator=g)),), generator=g).tolist()
        conts = [
            torch.randint(6, V, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
            for _ in range(int(torch.randint(1, 5, (1,), generator=g)))
        ]
        out.append(ScoreRequest(conts, context_ids=ctx))
    return out


@pytest.mark.parametrize("family", CAUSAL)
def test_sdpa_equals_eager_in_float32(family, monkeypatch):
    lm = tiny_model(family)
    reqs = _requests(lm, 10)  # rows up to 12 + 15 tokens: past Gemma's sliding window of 4
    seen: list[str] = []
    real = packing._packed_batch
    monkeypatch.setattr(
        packing, "_packed_batch", lambda lm_, rs: (seen.append(lm_.model.config._attn_implementation), real(lm_, rs))[1]
    )
    sdpa = packed_logliks(lm, reqs, max_tokens=64)
    assert lm.model.config._attn_implementation == "eager"  # set back
    if packing.can_pack(lm) and family != "gpt_neo":  # GPT-Neo's rows past its local window fall back
        assert set(seen) == ({"sdpa"} if sdpa_possible(lm) else {"eager"}), seen
    monkeypatch.setattr(packing, "attention_kernel", lambda lm_, kernel: attention_kernel(lm_, "eager"))
    eager = packed_logliks(lm, reqs, max_tokens=64)
    for a, b in zip(sdpa, eager):
        assert a == pytest.approx(b, abs=1e-5)


@pytest.mark.parametrize("family", CAUSAL)
def test_packed_scores_in_bfloat16_match_a_bfloat16_reference(family):
    lm = tiny_model(family, dtype="bfloat16")
    reqs = _requests(lm, 8)
    for r, got in zip(reqs, packed_logliks(lm, reqs, max_tokens=64)):
        ref = reference_logliks(lm, r.context_ids, r.continuations)  # eager full sequences, in bfloat16
        for g, f, c in zip(got, ref, r.continuations):
            assert _scores_close(g, f, len(c)), (family, g, f, len(c))


def _check_baseline(lm, items) -> None:
    """The packed bfloat16 baseline runner against eager full-sequence bfloat16 scores: scores within the
    stated tolerance, each pick the reference's best unless the two are within that tolerance."""
    results = baseline_items(lm, items)
    for it, res in zip(items, results):
        r = baseline_request(lm, it)
        ref = reference_logliks(lm, r.context_ids, r.continuations)
        n = [len(c) for c in r.continuations]
        assert all(_scores_close(g, f, k) for g, f, k in zip(res.scores, ref, n)), (it.index, res.scores, ref)
        want = item_result(it, ref)
        for got_pick, want_pick in ((res.pred, want.pred), (res.pred_norm, want.pred_norm)):
            if got_pick != want_pick:
                assert _scores_close(ref[got_pick], ref[want_pick], max(n)), (it.index, res, ref)


def test_hellaswag_baseline_in_bfloat16():
    lm = tiny_model("llama", dtype="bfloat16")
    _check_baseline(lm, load_hellaswag(limit=6))


# ---- once on smollm2 ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_bf16():
    return walklens.load_model("smollm2-135m", dtype="bfloat16")


@pytest.mark.real
def test_smollm2_in_bfloat16(smollm2_bf16, smollm2):
    lm = smollm2_bf16
    assert lm.name == "smollm2-135m@bfloat16" and lm.dtype is torch.bfloat16
    assert torch.equal(lm.embedding_matrix(), smollm2.embedding_matrix().to(torch.bfloat16))  # from the cache
    text = "The capital of France is Paris, and the river that runs through it is the Seine."
    ref = _forward_logits(lm, text)
    assert (walklens.capture(lm, text).logits() - ref).abs().max() <= U * ref.abs().max()
    res = walklens.attention_identity(lm, text)
    assert res.holds() and res.max_rel_error <= 8 * U
    _check_baseline(lm, load_hellaswag(limit=4))


# ---- the GPU path (skipped without a CUDA GPU; the tests above cover the dtype logic on the CPU) ----------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_path(tiny_dir, dtype):
    lm = walklens.load_model(str(tiny_dir), dtype=dtype, device="cuda")
    assert lm.device.type == "cuda" and lm.dtype is parse_dtype(dtype)
    cpu = walklens.load_model(str(tiny_dir), dtype=dtype)
    tr = walklens.capture(lm, TEXT)
    ref = _forward_logits(cpu, TEXT)
    assert (tr.logits() - ref).abs().max() <= (1e-4 if dtype == "float32" else 8 * U) * ref.abs().max()
    assert walklens.attention_identity(lm, TEXT).holds()
    walk = walklens.encoding_walk(tr, norm="final", progress=False)
    assert walk.model_dtype == dtype
    reqs = _requests(cpu, 6)
    for a, b, r in zip(packed_logliks(lm, reqs), packed_logliks(cpu, reqs), reqs):
        for g, f, c in zip(a, b, r.continuations):
            assert (abs(g - f) <= 1e-3 * (1 + abs(f))) if dtype == "float32" else _scores_close(g, f, len(c))


@pytest.mark.parametrize("family", ["t5", "llama", "gemma3"])
def test_float32_embeddings_feed_a_bfloat16_model(family):
    """Test 1 feeds vectors (recorded in float32) back through ``inputs_embeds``: they enter the bfloat16 model
    in its dtype, and its own embeddings give exactly the scores of the token ids."""
    from walklens.core.scoring.encode import continuation_logliks, input_embeddings

    lm = tiny_model(family, dtype="bfloat16")
    ids, conts = [7, 8, 9, 10, 11], [[12, 13], [14], [15, 16, 17]]
    e = input_embeddings(lm, torch.tensor(ids)).float()
    want = continuation_logliks(lm, conts, context_ids=ids)
    assert continuation_logliks(lm, conts, context_embeds=e) == want
    if packing.can_pack(lm):
        assert packed_logliks(lm, [ScoreRequest(conts, context_embeds=e)]) == packed_logliks(
            lm, [ScoreRequest(conts, context_ids=ids)]
        )


def test_logsumexp_rows_equals_torch():
    g = torch.Generator().manual_seed(0)
    for n in (1, 15, 16, 17, 40):
        x = (torch.randn(n, 300, generator=g) * 8).to(torch.bfloat16)
        x[0, :7] = float("-inf")
        assert torch.allclose(packing._logsumexp_rows(x), torch.logsumexp(x.float(), -1), rtol=1e-6, atol=1e-6)
    x = torch.full((3, 5), float("-inf"))
    x[1, 2] = 4.0
    assert torch.equal(packing._logsumexp_rows(x), torch.logsumexp(x, -1))
