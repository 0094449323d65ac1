"""One memory budget and a plan before a run (issue 52): ``walklens plan`` / ``walklens.plan`` read a model's config and
safetensors headers only, and their numbers are the measured ones exactly (the weights' bytes, the bytes a streamed
forward pass reads, the largest layer, the trace, the work); ``--max-memory`` is the budget of the whole process: a
model it cannot hold is refused before it loads, in one line naming the smallest budget that would do, a model
whose weights do not fit runs layer by layer, and the commands' own estimates are checked beside the model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import walklens
from _toy import saved_tiny
from walklens.base.errors import InputError
from walklens.core.loading import load_model
from walklens.costs import GB, fmt_bytes, forward_work, model_shape
from walklens.costs.planning import Plan, model_memory, plan
from walklens.testing import TINY_FAMILIES
from walklens.testing.shapes import real_shape_size, real_shape_specs, write_real_shape

TEXT = "The capital of France is Paris, and"
#: qwen3-14b's real shape, narrowed (its vocabulary cut to the default tokenizer's 49,152 tokens), four layers: 14 MB,
#: of which 12.6 MB the embedding and the head (with two layers, streaming could never need less than the weights)
QWEN = dict(hidden_size=64, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
QWEN_OVER = dict(QWEN, vocab_size=49152)
LAYERS = 4


def _bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from walklens.cli import main

    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's refusals
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("walklens: error: "), err
    return lines[0]


# ---- the plan against what a load and a capture measure ---------------------------------------------------------


def _check_against_measured(folder: Path, dtype: str) -> None:
    """The plan of a streamed capture of TEXT equals what the load and the capture measure, exactly."""
    p = plan(str(folder), text=TEXT, dtype=dtype, stream=True)
    streamed = load_model(str(folder), dtype=dtype, progress=False, stream=True)
    stream = streamed.stream
    assert stream is not None and p.streams
    tr = walklens.capture(streamed, TEXT)
    assert stream.stats.bytes_read == p.read  # the resident tensors at load + every layer of one pass
    assert stream.layer_bytes() == p.layer_file and p.tokens == len(tr.tokens)
    assert _bytes(tr.hidden) + (_bytes(tr.encoder.hidden) if tr.encoder is not None else 0) == p.trace
    whole = load_model(str(folder), dtype=dtype, progress=False, stream=False)
    params = {id(t): t for t in whole.model.parameters()}
    assert sum(_bytes(t) for t in params.values()) == p.weights
    sh = model_shape(whole)  # the config's shape is the loaded model's; a capture never runs the head
    assert forward_work(sh, p.tokens) - 2 * p.tokens * sh.vocab * sh.d_model == p.work


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_plan_is_what_a_streamed_capture_measures(family: str, tmp_path: Path) -> None:
    _check_against_measured(saved_tiny(family, "float32", tmp_path), "float32")


@pytest.mark.parametrize("family", ["llama", "t5", "albert", "qwen3_moe", "gemma2"])
def test_the_plan_in_bfloat16_is_what_it_measures(family: str, tmp_path: Path) -> None:
    """bfloat16 files read as bfloat16; ALBERT's shared layer is read once per depth; T5 traces two stacks."""
    _check_against_measured(saved_tiny(family, "bfloat16", tmp_path), "bfloat16")


def test_float32_weights_from_bfloat16_files(tmp_path: Path) -> None:
    """The weights are counted in the dtype they run in, the bytes read in the files' dtype."""
    folder = saved_tiny("llama", "bfloat16", tmp_path)
    p = plan(str(folder), text=TEXT, dtype="float32", stream=True)
    whole = load_model(str(folder), progress=False, stream=False)
    assert p.weights == sum(_bytes(t) for t in {id(t): t for t in whole.model.parameters()}.values())
    assert p.files * 2 == p.weights and p.layer == 2 * p.layer_file
    streamed = load_model(str(folder), progress=False, stream=True)
    walklens.capture(streamed, TEXT)
    assert streamed.stream is not None and streamed.stream.stats.bytes_read == p.read == p.files


def test_a_checkpoint_without_the_model_prefix(tmp_path: Path) -> None:
    """GPT-2's hub checkpoint names its tensors ``h.0.attn...``, not ``transformer.h.0.attn...``: the same layers."""
    from safetensors.torch import load_file, save_file

    folder = saved_tiny("gpt2", "float32", tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    assert any(k.startswith("transformer.h.0.") for k in tensors)
    save_file({k.removeprefix("transformer."): v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    _check_against_measured(folder, "float32")


def test_what_a_loaded_model_holds_of_the_budget(tmp_path: Path) -> None:
    """In memory: every weight (and buffer); layer by layer: the resident tensors and the largest layer."""
    folder = str(saved_tiny("llama", "float32", tmp_path))
    p = plan(folder, text=TEXT, stream=True)
    whole, streamed = load_model(folder, progress=False), load_model(folder, progress=False, stream=True)
    buffers = sum(_bytes(b) for b in whole.model.buffers())
    assert model_memory(whole) == p.weights + buffers
    assert model_memory(streamed) == p.resident + p.layer + buffers < model_memory(whole)


def test_points_and_the_default_length(tmp_path: Path) -> None:
    folder = str(saved_tiny("llama", "float32", tmp_path))
    lm = load_model(folder, progress=False)
    some = walklens.capture(lm, TEXT, points=["L*.resid_post"])
    p = plan(folder, text=TEXT, points=["L*.resid_post"])
    assert p.points == len(some.points) == lm.n_layers + 1 and p.trace == _bytes(some.hidden)  # final always kept
    assert plan(folder).tokens == 512 and plan(folder, tokens=7).tokens == 7
    assert not plan(folder, text=TEXT).streams  # the weights fit the memory free now


# ---- a real shape: planned from the files alone --------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("qwen3-14b")
    return write_real_shape(
        "qwen3-14b", root / "m", layers=LAYERS, shard_bytes=2**22, progress=False, config_overrides=QWEN_OVER
    )


def _no_tensor_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Reading a tensor or building a model fails the test (and is recorded)."""
    import transformers

    import walklens.core.streaming as streaming

    calls: list[str] = []

    def refuse(what: str) -> Any:
        def fail(*a: Any, **k: Any) -> Any:
            calls.append(what)
            raise AssertionError(f"the plan {what}")

        return fail

    monkeypatch.setattr(streaming, "read_tensor", refuse("read a tensor"))
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        monkeypatch.setattr(auto, "from_pretrained", refuse("built the model"))
        monkeypatch.setattr(auto, "from_config", refuse("built the model"))
    monkeypatch.setattr("safetensors.torch.load_file", refuse("loaded a safetensors file"))
    return calls


def test_a_real_shape_is_planned_from_its_files_alone(qwen: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _no_tensor_read(monkeypatch)
    p = plan(str(qwen), tokens=100, dtype="bfloat16", max_memory=1.0)
    specs = real_shape_specs("qwen3-14b", LAYERS, QWEN_OVER)
    layer0 = sum(s.nbytes(torch.bfloat16) for s in specs if s.name.startswith("model.layers.0."))
    resident = sum(s.nbytes(torch.bfloat16) for s in specs if not s.name.startswith("model.layers."))
    weights = real_shape_size("qwen3-14b", "bfloat16", LAYERS, QWEN_OVER)
    assert p.weights == p.files == weights == resident + LAYERS * layer0
    assert (p.resident, p.layer, p.layer_file, p.layers) == (resident, layer0, layer0, LAYERS)
    assert p.points == 2 + 5 * LAYERS and p.width == 64 and p.trace == p.points * 100 * 64 * 4
    assert p.budget == 1.0 and p.budget_from == "--max-memory" and not p.streams and p.read == p.files
    f32 = plan(str(qwen), tokens=100, dtype="float32", max_memory=1.0)
    assert f32.weights == 2 * p.weights and f32.files == p.files
    assert calls == []
    text = str(p)
    assert repr(p) == text and f"{fmt_bytes(weights)} in bfloat16" in text and "in memory" in text, text
    assert "GFLOP/s" in text and "1 GB/s (an assumed disk rate)" in text


def test_a_family_that_fuses_tensors_at_load_counts_its_copy() -> None:
    """transformers fuses Qwen3-MoE's and Mixtral's experts at load (a copy of the layer whatever the dtype); Llama's
    and Qwen3's tensors are used as stored."""
    from transformers import AutoConfig

    from walklens.costs.planning import _fuses

    fused = {t: _fuses(AutoConfig.for_model(t)) for t in ("qwen3_moe", "mixtral", "llama", "qwen3", "gemma3_text")}
    assert fused == {"qwen3_moe": True, "mixtral": True, "llama": False, "qwen3": False, "gemma3_text": False}


def test_a_budget_below_the_weights_streams_and_one_below_the_smallest_is_refused(
    qwen: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_tensor_read(monkeypatch)
    stream = plan(str(qwen), tokens=1, dtype="bfloat16", stream=True, max_memory=1.0)
    # a layer used as stored (bfloat16 files, bfloat16 run, no fused conversion) is a view of the map: no copy
    assert stream.converted == 0 and "used as stored: no copy" in str(stream)
    assert stream.smallest == stream.resident + stream.layer_file + stream.activations
    assert stream.peak == stream.smallest and stream.read == stream.files
    cast = plan(str(qwen), tokens=1, dtype="float32", stream=True, max_memory=1.0)  # every tensor cast: a copy
    assert cast.converted == cast.layer == 2 * cast.layer_file and f"{fmt_bytes(cast.layer)} converted" in str(cast)
    assert cast.smallest == cast.resident + cast.layer_file + cast.layer + cast.activations
    budget = math.ceil(stream.smallest / 1e3) / 1e6  # GB, rounded up to a kB
    p = plan(str(qwen), tokens=1, dtype="bfloat16", max_memory=budget)
    assert p.streams and budget * GB < 1.1 * p.weights and p.fits
    with pytest.raises(InputError) as e:
        plan(str(qwen), tokens=1, dtype="bfloat16", max_memory=budget * 0.99)
    message = str(e.value)
    assert "\n" not in message and f"the smallest budget that runs it is ~{fmt_bytes(stream.smallest)}" in message
    assert "layer by layer: the resident tensors" in message and f"--max-memory {budget * 0.99:g}" in message
    with pytest.raises(InputError, match=f"in memory: the weights {fmt_bytes(p.weights)}"):
        plan(str(qwen), tokens=1, dtype="bfloat16", stream=False, max_memory=budget)


def test_the_plan_command(qwen: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _no_tensor_read(monkeypatch)
    code, out, err = _cli(capsys, "plan", str(qwen), "--dtype", "bfloat16", "--tokens", "64", "--max-memory", "0.5")
    assert code == 0 and err == ""
    weights = fmt_bytes(real_shape_size("qwen3-14b", "bfloat16", LAYERS, QWEN_OVER))
    assert f"weights          {weights} in bfloat16" in out and "memory budget    0.5 GB (--max-memory)" in out
    code, out, err = _cli(capsys, "plan", str(qwen), "--text", "the capital of france is paris", "--stream")
    assert code == 0 and re.search("a capture of [0-9] tokens in float32", out) and "layer by layer" in out, out
    code, out, err = _cli(capsys, "plan", str(qwen), "--dtype", "bfloat16", "--max-memory", "0.001")
    line = _one_error(err)
    assert code == 2 and out == "" and re.search(r"the smallest budget that runs it is ~[\d.]+ MB$", line), line


def test_a_folder_without_safetensors_is_refused(qwen: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in qwen.iterdir():
        if "safetensors" not in f.name:
            (bare / f.name).write_bytes(f.read_bytes())
    code, _, err = _cli(capsys, "plan", str(bare))
    assert code == 2 and "no safetensors weights" in _one_error(err)
    with pytest.raises(InputError, match="give a text or a number of tokens, not both"):
        plan(str(qwen), text="a", tokens=3)
    code, _, err = _cli(capsys, "plan", str(qwen), "--max-memory", "0")
    assert code == 2 and "--max-memory" in _one_error(err)


# ---- every command: the budget before the load, the need beside the model ------------------------------------------


def test_a_need_is_checked_beside_the_model() -> None:
    """--max-memory 4 with 2.5 GB of weights leaves 1.5 GB: 1.4 GB fits, 1.6 GB does not, and the refusal says so."""
    from walklens.costs import Limits, Need

    limits = Limits(max_memory=4, model_bytes=2.5e9)
    assert Need(memory=1.4e9).fits(limits) and not Need(memory=1.6e9).fits(limits)
    assert Need(memory=1.6e9).over(limits) == ["~1.6 GB of memory beside the model's 2.5 GB (--max-memory 4)"]
    assert Need(memory=4.1e9).over(Limits(max_memory=4)) == ["~4.1 GB of memory (--max-memory 4)"]


def test_a_command_refuses_a_budget_too_small_before_loading(
    qwen: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import walklens.cli.common as common

    monkeypatch.setattr(common, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    smallest = plan(str(qwen), tokens=1, points=[], dtype="bfloat16", stream=True).smallest
    for command in (["walk", "the cat"], ["generate", "the cat"], ["heads", "the cat"]):
        code, _, err = _cli(capsys, *command, "--model", str(qwen), "--dtype", "bfloat16", "--max-memory", "0.01")
        line = _one_error(err)
        assert code == 2 and "loading it would need" in line and "over --max-memory 0.01" in line, line
        assert line.endswith(f"the smallest budget that runs it is ~{fmt_bytes(smallest)}"), line


def test_the_budget_decides_streaming_and_what_the_commands_have_left(qwen: Path) -> None:
    from walklens.cli import build_parser
    from walklens.cli.common import load

    weights = real_shape_size("qwen3-14b", "bfloat16", LAYERS, QWEN_OVER)
    base = ["walk", "the cat", "--model", str(qwen), "--dtype", "bfloat16"]
    args = build_parser().parse_args([*base, "--max-memory", f"{weights / GB:g}"])  # the weights, not 1.1 x
    lm = load(args)
    assert lm.stream is not None and args.model_bytes == model_memory(lm) < weights
    args = build_parser().parse_args([*base, "--max-memory", f"{weights / GB:g}", "--no-stream"])
    with pytest.raises(InputError, match=f"in memory: the weights {fmt_bytes(weights)}"):
        load(args)
    args = build_parser().parse_args(base)  # the budget: the memory free now
    lm = load(args)
    assert lm.stream is None and args.max_memory > 0.1 and args.model_bytes == model_memory(lm) >= weights
    args = build_parser().parse_args([*base, "--stream"])
    assert load(args).stream is not None


def test_the_refusal_of_a_command_names_the_model_beside_the_budget(
    qwen: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Streamed in the smallest budget that loads it, the walk of a text needs more than the resident tensors and a
    layer leave of it."""
    js = tmp_path / "w.json"
    p = plan(str(qwen), tokens=1, dtype="bfloat16", stream=True, points=[])  # what the load check counts
    budget = f"{math.ceil(p.smallest / 1e3) / 1e6:g}"
    code, out, err = _cli(
        capsys, "walk", "the capital of france is paris", "--model", str(qwen), "--dtype", "bfloat16",
        "--max-memory", budget, "--json", str(js),
    )  # fmt: skip
    line = _one_error(err)
    held = fmt_bytes(p.resident + p.layer)
    assert code == 2 and not js.exists() and f"of memory beside the model's {held} (--max-memory {budget})" in line


def test_a_plan_is_a_plain_dataclass(tmp_path: Path) -> None:
    p = plan(str(saved_tiny("llama", "float32", tmp_path)), tokens=3)
    assert isinstance(p, Plan) and walklens.plan is plan
    assert json.dumps({k: v for k, v in vars(p).items()})  # plain numbers and strings


# ---- a batch, and the rates a plan counts time at -----------------------------------------------------------------


def test_a_batch_is_planned_as_its_texts_in_one_pass(tmp_path: Path) -> None:
    """``batch=B``: B texts of T tokens in one streamed pass read each layer once, as one text does; their trace and
    their work are B times one text's, and the trace is what ``capture_batch`` records."""
    from walklens.core.capture import capture_batch

    folder = str(saved_tiny("llama", "float32", tmp_path))
    one = plan(folder, tokens=6, stream=True)
    three = plan(folder, tokens=6, batch=3, stream=True)
    lm = load_model(folder, progress=False, stream=True)
    assert lm.stream is not None
    got = capture_batch(lm, [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16], [17, 18, 19, 20, 21, 22]], ["*"])
    assert lm.stream.stats.bytes_read == three.read == one.read  # one read of the layers per batch
    assert three.trace == 3 * one.trace == sum(_bytes(h) for h in got.hidden)
    assert three.work == 3 * one.work and three.batch == 3 and "3 texts of 6 tokens (one pass)" in str(three)
    to_disk = plan(folder, tokens=6, batch=3, stream=True, to_disk=True)  # the writer holds one point at a time
    point = 3 * 6 * lm.d_model * 4
    assert to_disk.trace == three.trace and three.activations - to_disk.activations == three.trace - point
    assert "written as computed (one point in memory)" in str(to_disk) and "held in memory" in str(three)
    with pytest.raises(InputError, match="batch must be a whole number"):
        plan(folder, tokens=6, batch=0)


def test_the_time_is_counted_at_the_rates_given_or_calibrated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The estimate is the bytes read at the disk rate plus the work at the matmul rate; ``walklens calibrate --disk``
    measures the disk rate on a model's own files and every plan then counts at it; a calibration file written
    before the disk rate was measured still reads, at the assumed rate."""
    from walklens.costs import calibration as M
    from walklens.costs.measure import disk_rate

    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    folder = saved_tiny("llama", "float32", tmp_path)
    given = M.Rates(
        attn_element=1000.0, write_work=1000.0, matmul_gflops=2.0, disk_gbps=0.5, write_gbps=0.25, bf16_gflops=4.0
    )
    p = plan(str(folder), tokens=8, rates=given)
    assert p.seconds == p.read / 0.5e9 + p.work / 2e9 and "at 0.5 GB/s (given)" in str(p) and "writing" not in str(p)
    bf = plan(str(folder), tokens=8, rates=given, dtype="bfloat16")  # bfloat16 counted at its own matmul rate
    assert bf.seconds == bf.read / 0.5e9 + bf.work / 4e9 and "4 GFLOP/s (bfloat16 matrix products" in str(bf)
    w = plan(str(folder), tokens=8, rates=given, to_disk=True)  # a trace folder: its bytes written at write_gbps
    assert w.seconds == p.seconds + p.trace / 0.25e9 and "the trace at 0.25 GB/s" in str(w)
    assert disk_rate(folder) > 0
    with pytest.raises(InputError, match="no .safetensors files"):
        disk_rate(tmp_path)
    M.save(M.Rates(attn_element=1000.0, write_work=1000.0, matmul_gflops=2.0), model="old", threads=1)
    old = json.loads((tmp_path / "cache" / M.FILE_NAME).read_text())
    del old["disk_gbps"]
    (tmp_path / "cache" / M.FILE_NAME).write_text(json.dumps(old))
    assert M.rates().disk_gbps == M.DEFAULTS.disk_gbps and "(an assumed disk rate)" in str(plan(str(folder)))
    code, out, err = _cli(capsys, "calibrate", "--tokens", "256", "--disk", str(folder))
    assert code == 0 and "reading from disk" in out, err
    measured = M.rates().disk_gbps
    assert measured != M.DEFAULTS.disk_gbps and M.rates().write_gbps != M.DEFAULTS.write_gbps
    assert M.rates().bf16_gflops != M.DEFAULTS.bf16_gflops and "bfloat16" in out
    later = plan(str(folder), tokens=8)
    assert f"({'walklens calibrate --disk'})" in str(later) and later.disk_gbps == measured
    code, _, err = _cli(capsys, "calibrate", "--tokens", "256", "--disk", str(tmp_path / "nowhere"))
    assert code == 2 and "no .safetensors files" in _one_error(err)
