"""Models larger than memory (walklens.core.streaming): a model streamed layer by layer equals the model in memory
bit for bit, on every family with an adapter file, in float32 and bfloat16; each layer's weights are read once per
forward pass (one batch) and released after; the refusals are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import walklens
from _toy import saved_tiny
from walklens.base.errors import InputError, WalklensError
from walklens.core.capture import capture_batch
from walklens.core.loading import LoadedModel, load_model
from walklens.testing import TINY_FAMILIES, tiny_model

TEXT = "The capital of France is Paris, and"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_streamed_equals_in_memory_bit_for_bit(family: str, dtype: str, tmp_path: Path) -> None:
    folder = saved_tiny(family, dtype, tmp_path)
    whole = load_model(str(folder), dtype=dtype, progress=False, stream=False)
    streamed = load_model(str(folder), dtype=dtype, progress=False, stream=True)
    assert whole.stream is None and streamed.stream is not None
    a, b = walklens.capture(whole, TEXT), walklens.capture(streamed, TEXT)
    assert a.points == b.points and a.tokens == b.tokens
    differ = [p for i, p in enumerate(a.points) if not torch.equal(a.hidden[i], b.hidden[i])]
    assert differ == []
    # between forward passes no layer holds a weight: every layer tensor is back on meta
    for path, layer in streamed.stream.layers.items():
        assert all(p.device.type == "meta" for p in layer.parameters()), path


def test_each_weight_is_read_once_per_batch(tmp_path: Path) -> None:
    """A batch of four texts runs each layer once: the layers are loaded once each, and the bytes read are the
    layers' bytes in the files, whatever the batch holds."""
    lm = load_model(str(saved_tiny("llama", "float32", tmp_path)), progress=False, stream=True)
    stream = lm.stream
    assert stream is not None
    before = (stream.stats.layers_loaded, stream.stats.bytes_read)
    seqs = [lm.tokenizer(t)["input_ids"] for t in (TEXT, "One two three", "A longer text of several words here", "x")]
    capture_batch(lm, seqs, ["*"], stop_early=False)
    loaded = stream.stats.layers_loaded - before[0]
    read = stream.stats.bytes_read - before[1]
    assert loaded == lm.n_layers == len(stream.layers)
    assert read == sum(stream.file_bytes(p) for p in stream.layers) == lm.n_layers * stream.layer_bytes()
    assert stream.resident_file_bytes() > 0


def test_each_layer_advises_the_kernel_to_read_the_next_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While layer l runs, layer l + 1's byte ranges (the first layer's after the last) are advised to the page
    cache, file by file, joined where they touch; nothing is advised with ``prefetch`` off."""
    import os

    from walklens.core import streaming

    lm = load_model(str(saved_tiny("llama", "float32", tmp_path)), progress=False, stream=True)
    stream = lm.stream
    assert stream is not None and len(stream.layers) >= 2
    advised: list[tuple[str, int, int]] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED
        advised.append((os.readlink(f"/proc/self/fd/{fd}"), offset, offset + length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    walklens.capture(lm, TEXT)
    streaming._advisor().submit(lambda: None).result()  # the advice given so far has run

    def spans(part: str) -> list[tuple[str, int, int]]:
        by_file: dict[str, list[tuple[int, int]]] = {}
        for key in stream.sources[part]:
            e = stream.weights.entries[key]
            by_file.setdefault(str(Path(e.path).resolve()), []).append((e.begin, e.end))
        return [(f, b, e) for f, r in by_file.items() for b, e in streaming.merged_spans(r)]

    order = list(stream.layers)
    assert advised == [s for p in [*order[1:], order[0]] for s in spans(p)]
    stream.prefetch = False
    advised.clear()
    walklens.capture(lm, TEXT)
    streaming._advisor().submit(lambda: None).result()
    assert advised == []


def _mapped_file(address: int) -> str | None:
    """The file mapped at ``address`` in this process (/proc/self/maps), None for anonymous memory."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= address < hi:
            path = rest[4] if len(rest) > 4 else ""
            return path if path.startswith("/") else None
    return None


def test_a_layer_is_a_view_of_the_files_and_the_resident_tensors_are_read(tmp_path: Path) -> None:
    """A streamed layer's weights are views of a map of the shard (nothing copied out of the page cache), equal to
    the weights in memory; the resident tensors are read into anonymous memory, which the budget counts."""
    folder = saved_tiny("llama", "bfloat16", tmp_path)
    lm = load_model(str(folder), dtype="bfloat16", progress=False, stream=True)
    whole = load_model(str(folder), dtype="bfloat16", progress=False, stream=False)
    stream = lm.stream
    assert stream is not None
    shard = str((folder / "model.safetensors").resolve())
    with stream.held("model.layers.1"):
        w = stream.layers["model.layers.1"].mlp.down_proj.weight
        assert _mapped_file(w.data_ptr()) == shard
        assert torch.equal(w, whole.model.model.layers[1].mlp.down_proj.weight)
    assert _mapped_file(lm.model.model.embed_tokens.weight.data_ptr()) is None


def test_touching_byte_ranges_are_joined() -> None:
    from walklens.core.streaming import merged_spans

    assert merged_spans([(10, 20), (0, 10), (30, 40), (35, 50), (60, 61)]) == [(0, 20), (30, 50), (60, 61)]


def test_a_held_layer_reads_its_weights_once(tmp_path: Path) -> None:
    lm = load_model(str(saved_tiny("llama", "float32", tmp_path)), progress=False, stream=True)
    stream = lm.stream
    assert stream is not None
    whole = load_model(str(tmp_path / "llama-float32"), progress=False, stream=False)
    n = stream.stats.layers_loaded
    with stream.held("model.layers.1"):
        w = stream.layers["model.layers.1"].self_attn.o_proj.weight
        assert torch.equal(w, whole.model.model.layers[1].self_attn.o_proj.weight)
        walklens.capture(lm, TEXT)  # the forward pass finds it held: not read again
        assert stream.stats.layers_loaded == n + 1 + (lm.n_layers - 1)
    assert stream.layers["model.layers.1"].self_attn.o_proj.weight.device.type == "meta"


def test_the_budget_decides_when_not_asked(tmp_path: Path) -> None:
    folder = str(saved_tiny("llama", "float32", tmp_path))
    assert load_model(folder, progress=False, max_memory=64.0).stream is None
    assert load_model(folder, progress=False, max_memory=1e-6).stream is not None


def test_a_family_without_an_adapter_file_is_refused(tmp_path: Path) -> None:
    """A derived adapter is confirmed on weights in memory, so such a model does not stream (one line)."""
    from walklens.testing import tiny_config

    cfg = tiny_config("arcee", vocab_size=128)
    model = __import__("transformers").AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(tmp_path / "arcee"))
    tiny_model("llama").tokenizer.save_pretrained(str(tmp_path / "arcee"))
    with pytest.raises(InputError, match="cannot stream the model layer by layer: its family has no adapter file"):
        load_model(str(tmp_path / "arcee"), progress=False, stream=True)


def test_a_truncated_shard_is_refused_before_anything_runs(tmp_path: Path) -> None:
    folder = saved_tiny("llama", "float32", tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(WalklensError, match="lies outside the file") as e:
        load_model(str(folder), progress=False, stream=True)
    assert "\n" not in str(e.value)


def test_the_stream_reads_by_the_index_of_a_sharded_checkpoint(tmp_path: Path) -> None:
    """Shards named by model.safetensors.index.json: each tensor read from its own shard."""
    lm = tiny_model("llama")
    folder = tmp_path / "sharded"
    lm.model.save_pretrained(str(folder), max_shard_size="20KB")
    lm.tokenizer.save_pretrained(str(folder))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    whole = load_model(str(folder), progress=False, stream=False)
    streamed = load_model(str(folder), progress=False, stream=True)
    assert torch.equal(walklens.capture(whole, TEXT).hidden, walklens.capture(streamed, TEXT).hidden)


def _same(a: object, b: object, where: str = "") -> list[str]:
    """Where two results differ: every tensor, array, number and string compared exactly, recursively."""
    import dataclasses

    import numpy as np

    if isinstance(a, LoadedModel):  # a result's model (a trace's): the two models differ by construction
        return []
    if isinstance(a, torch.Tensor):
        ok = isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        return (
            []
            if ok
            or (
                a.is_floating_point()
                and torch.equal(a.isnan(), b.isnan())
                and torch.equal(a.nan_to_num(), b.nan_to_num())
            )
            else [where]
        )
    if isinstance(a, np.ndarray):
        return [] if np.array_equal(a, np.asarray(b), equal_nan=True) else [where]
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return [
            d for f in dataclasses.fields(a) for d in _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
        ]
    if isinstance(a, dict):
        return [where] if set(a) != set(b) else [d for k in a for d in _same(a[k], b[k], f"{where}[{k!r}]")]
    if isinstance(a, (list, tuple)):
        return (
            [where]
            if len(a) != len(b)
            else [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{where}[{i}]")]
        )
    if isinstance(a, float) and a != a:
        return [] if b != b else [where]
    return [] if a == b else [where]


ANALYSES = {
    "head_matrices": lambda lm: walklens.analyses.head_matrices(lm, 1),
    "head_stats": lambda lm: walklens.analyses.head_stats(lm),
    "attention_identity": lambda lm: walklens.analyses.attention_identity(lm, TEXT),
    "power_spectra": lambda lm: walklens.analyses.power_spectra(lm),
    "alignment": lambda lm: walklens.analyses.alignment(lm, TEXT, n_random=4, n_shuffles=2),
    "dynamics": lambda lm: walklens.analyses.dynamics(lm, TEXT),
    "encoding_walk": lambda lm: walklens.analyses.encoding_walk(walklens.capture(lm, TEXT), lm=lm, progress=False),
    "similarity_map": lambda lm: walklens.analyses.similarity_map(walklens.capture(lm, TEXT)),
    "position_kernels": lambda lm: walklens.analyses.position_kernels(lm, progress=False, samples=2, length=16),
    "decoding_walk": lambda lm: walklens.analyses.decoding_walk(lm, TEXT, max_new_tokens=4),
    "verify": lambda lm: walklens.verify(lm, quick=True),  # the parity card
}


@pytest.mark.parametrize("family", ["llama", "gpt2", "bloom", "gemma2", "qwen3_moe", "t5", "falcon"])
def test_every_analysis_of_a_streamed_model_equals_in_memory(family: str, tmp_path: Path) -> None:
    """The analyses that read a layer's weights (W_vo, W_qk, F = W_V W_O, position biases) read them from disk
    for a streamed model: each result equals the in-memory model's exactly, field by field."""
    folder = str(saved_tiny(family, "float32", tmp_path))
    whole = load_model(folder, progress=False, stream=False)
    streamed = load_model(folder, progress=False, stream=True)
    differ, refused = {}, {}
    for name, run in ANALYSES.items():
        try:
            expected = run(whole)
        except WalklensError as e:  # an analysis this family does not support: refused the same way streamed
            with pytest.raises(type(e)):
                run(streamed)
            refused[name] = str(e)
            continue
        differ[name] = _same(expected, run(streamed))
    assert {k: v for k, v in differ.items() if v} == {}
    assert len(differ) >= 6, refused
    for path, layer in streamed.stream.layers.items():  # nothing left in memory after them
        assert all(p.device.type == "meta" for p in layer.parameters()), path


def test_a_worker_streams_the_model_its_driver_streams(tmp_path: Path) -> None:
    """A backend's workers load the model by its spec: a streamed model's spec streams (each Ray actor reads the
    layers from disk for its share), an in-memory one's does not."""
    from walklens.core.backends.base import ModelSpec

    folder = str(saved_tiny("llama", "float32", tmp_path))
    streamed = load_model(folder, progress=False, stream=True)
    spec = ModelSpec.of(streamed)
    assert spec.stream and spec.load().stream is not None
    assert not ModelSpec.of(load_model(folder, progress=False, stream=False)).stream


def test_generation_streamed_says_what_each_token_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each new token of a streamed model is one forward pass, one read of every layer (counted by the stream), and
    ``walklens generate`` says so before it runs: the layers' bytes per token and in all."""
    from walklens.analyses.decoding import decoding_walk
    from walklens.cli import main
    from walklens.costs import fmt_bytes

    folder = str(saved_tiny("llama", "float32", tmp_path))
    lm = load_model(folder, progress=False, stream=True)
    layers = sum(lm.stream.file_bytes(p) for p in lm.stream.layers)
    for n in (1, 4):
        before = lm.stream.stats.bytes_read
        decoding_walk(lm, TEXT, max_new_tokens=n)
        assert lm.stream.stats.bytes_read - before == n * layers
    assert main(["generate", TEXT, "--model", folder, "--stream", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr()
    said = " ".join((out.out + out.err).split())
    assert f"each new token reads the layers again ({fmt_bytes(layers)}," in said
    assert f"4 tokens read {fmt_bytes(4 * layers)}" in said


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_hellaswag_baseline_streamed_equals_in_memory(dtype: str, tmp_path: Path) -> None:
    """The baseline's packed scoring (oneDNN-prepacked linears in bfloat16) on a streamed model: the same
    log-likelihoods bit for bit as in memory, each layer read once per packed batch (its weights, read inside
    inference mode, are prepacked afresh at each read, never kept)."""
    from walklens.lab.experiments.runner import baseline_scorer, run_test
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.hellaswag.data import load_hellaswag

    folder = str(saved_tiny("qwen3", "float32", tmp_path))  # an untied head: a resident nn.Linear, prepacked
    items = load_hellaswag(limit=3)
    quiet = RunSetup(progress=False)
    runs = []
    for stream in (False, True):
        lm = load_model(folder, dtype=dtype, progress=False, stream=stream)
        run_test(lm, items[:1], baseline_scorer(), quiet)  # a first pass (a warm-up), then the items
        runs.append(run_test(lm, items, baseline_scorer(), quiet))
    whole, streamed = ([r.scores for r in run.results] for run in runs)
    assert whole == streamed and len(whole) == 3
