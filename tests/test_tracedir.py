"""Traces on disk (issue #52): ``capture(..., to=DIR)``, ``capture_batch(..., to=DIR)`` and ``capture_texts`` write
every point to its own safetensors shard as the forward pass computes it, holding one point at a time;
``Trace.open`` reads them back lazily, and the walk from an opened trace equals the walk in memory bit for bit,
without the model's layers; an interrupted capture resumes writing only the missing shards; every refusal is one
line naming the folder or the shard, and nothing already written is lost."""

from __future__ import annotations

import errno
import fcntl
import importlib
import json
import os
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import walklens
from _cli import run as run_cli
from walklens.base.errors import InputError
from walklens.base.hooks import Hooks
from walklens.core import tracewrite
from walklens.core.capture import capture_batch, capture_texts
from walklens.core.loading import load_model
from walklens.core.tracedir import PointStack
from walklens.testing import tiny_model

capture_module = importlib.import_module("walklens.core.capture")  # (walklens.core.capture is the function)
TEXT = "the capital of france is paris and the king ran to the river"
TEXTS = [TEXT, "one two three", "the dog ran to the city and the house"]


@pytest.fixture(scope="module")
def lm():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny Llama saved as safetensors with its tokenizer (for a streamed load and the command line)."""
    root = tmp_path_factory.mktemp("tiny-llama")
    lm = tiny_model("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm.model.save_pretrained(str(root))
        lm.tokenizer.save_pretrained(str(root))
    return root


def bits(x: torch.Tensor) -> torch.Tensor:
    """A tensor's bits (a float's NaN equals itself, -0.0 differs from 0.0)."""
    x = x.contiguous()
    return x.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[x.element_size()]) if x.is_floating_point() else x


def same_walk(a: Any, b: Any) -> list[str]:
    """The fields in which two walks differ (bit for bit)."""
    differ = []
    for name, v in vars(a).items():
        w = getattr(b, name)
        if isinstance(v, torch.Tensor):
            if v.shape != w.shape or not torch.equal(bits(v), bits(w)):
                differ.append(name)
        elif name != "encoder" and v != w:
            differ.append(name)
    return differ


def shards(path: Path) -> dict[str, tuple[int, int, bytes]]:
    """Each shard file of a trace folder: (inode, mtime in ns, bytes)."""
    out = {}
    for p in sorted(path.glob("*.safetensors")):
        st = p.stat()
        out[p.name] = (st.st_ino, st.st_mtime_ns, p.read_bytes())
    return out


class Spy:
    """The writers a capture opens and the recorders it makes (the largest tensor each writer held, what it wrote,
    and whether a recorder kept a buffer)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writers: list[Any] = []
        self.recorders: list[Any] = []
        real_writer, real_init = capture_module.trace_writer, capture_module.Recorder.__init__
        spy = self

        def writer(*a: Any, **k: Any) -> Any:
            cm = real_writer(*a, **k)

            class Enter:
                def __enter__(self) -> Any:
                    w = cm.__enter__()
                    spy.writers.append(w)
                    return w

                def __exit__(self, *exc: Any) -> Any:
                    return cm.__exit__(*exc)

            return Enter()

        def init(rec: Any, *a: Any, **k: Any) -> None:
            real_init(rec, *a, **k)
            spy.recorders.append(rec)

        monkeypatch.setattr(capture_module, "trace_writer", writer)
        monkeypatch.setattr(capture_module.Recorder, "__init__", init)

    @property
    def written(self) -> list[str]:
        return [k for w in self.writers for k in w.stats.written]


# ---- the same numbers, on disk and in memory -----------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2", "t5", "bert", "albert"])
def test_a_trace_on_disk_equals_the_trace_in_memory(family: str, tmp_path: Path) -> None:
    lm = tiny_model(family)
    whole = walklens.capture(lm, TEXT)
    opened = walklens.capture(lm, TEXT, to=tmp_path / "t")
    assert isinstance(opened.hidden, PointStack) and opened.lm is lm
    for a, b in [(whole, opened)] + ([(whole.encoder, opened.encoder)] if whole.encoder is not None else []):
        assert b is not None and (a.points, a.tokens, a.stack, a.n_layers) == (b.points, b.tokens, b.stack, b.n_layers)
        assert torch.equal(a.token_ids, b.token_ids) and b.model_name == a.model_name
        assert [p for i, p in enumerate(a.points) if not torch.equal(bits(a.hidden[i]), bits(b.hidden[i]))] == []
    again = walklens.Trace.open(tmp_path / "t", lm)
    assert torch.equal(again.hidden, whole.hidden)  # torch functions read every point of the stand-in


def test_an_opened_trace_reads_one_point_at_a_time_and_indexes_as_a_tensor(lm, tmp_path: Path) -> None:
    whole = walklens.capture(lm, TEXT, points=["embed", "L*.resid_post"], dtype=torch.float16)
    walklens.capture(lm, TEXT, points=["embed", "L*.resid_post"], dtype=torch.float16, to=tmp_path / "t")
    tr = walklens.Trace.open(tmp_path / "t")  # no model needed to read it
    h, w = tr.hidden, whole.hidden
    assert (h.shape, h.dtype, h.dim(), len(h), h.numel()) == (w.shape, w.dtype, 3, len(w), w.numel())
    for key in (1, -1, slice(1, 3), [0, 2], torch.tensor([2, 0]), (1, slice(3, 5)), (slice(0, 2), 4), torch.tensor(1)):
        assert torch.equal(h[key], w[key]), key
    assert torch.equal(tr["final"], whole["final"]) and torch.equal(h.float(), w.float())
    assert torch.equal(torch.stack(list(h)), w) and tr.model_dtype == "float32" and tr.lm is None
    with pytest.raises(IndexError):
        h[len(w)]
    out = tmp_path / "saved.safetensors"
    tr.save(out)  # the file format of Trace.save still holds an opened trace whole
    assert torch.equal(walklens.Trace.load(out).hidden, w)


@pytest.mark.parametrize("norm", ["none", "final"])
def test_the_walk_from_an_opened_trace_equals_the_walk_in_memory(lm, norm: str, tmp_path: Path) -> None:
    whole = walklens.capture(lm, TEXT)
    opened = walklens.capture(lm, TEXT, to=tmp_path / "t")
    for opts in ({}, {"points": "residual", "chunk_rows": 5}, {"points": ["L1.*", "final"], "chunk_rows": 30}):
        a = walklens.encoding_walk(whole, norm=norm, progress=False, **opts)
        b = walklens.encoding_walk(opened, norm=norm, progress=False, **opts)
        assert same_walk(a, b) == [], opts
    sa = walklens.similarity_map(whole, "L1.resid_post", normed=True)
    sb = walklens.similarity_map(opened, "L1.resid_post", normed=True)
    assert torch.equal(bits(torch.as_tensor(sa)), bits(torch.as_tensor(sb)))


def test_rows_read_from_disk_lie_where_the_rows_in_memory_lie(tmp_path: Path) -> None:
    """A product's kernel may sum in another order at another address: the rows the walk reads from an opened trace
    lie at the 64-byte alignment the same rows have in memory, also when a row is not 64 bytes long (D = 40)."""
    from walklens.analyses.walks.reading import point_rows
    from walklens.core.loading import auto_model_class, wrap
    from walklens.models import get_adapter
    from walklens.testing import tiny_config, tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = tiny_config("llama", len(tok), hidden_size=40, num_attention_heads=2, num_key_value_heads=2, head_dim=20)
    cfg._attn_implementation = "eager"
    lm = wrap(auto_model_class(get_adapter(cfg)).from_config(cfg).eval(), tok, name="tiny-llama-40")
    whole = walklens.capture(lm, TEXT)
    opened = walklens.capture(lm, TEXT, to=tmp_path / "t")
    T, sel = len(whole.tokens), [1, 3, 4]
    mem, disk = point_rows(whole.hidden, sel, T), point_rows(opened.hidden, sel, T)
    for r0, r1 in [(0, 5), (5, 10), (3, 7), (T - 2, T + 3), (2 * T + 1, 3 * T)]:
        a, b = mem(r0, r1), disk(r0, r1)
        assert torch.equal(a, b) and a.data_ptr() % 64 == b.data_ptr() % 64, (r0, r1)
    for norm in ("none", "final"):
        a = walklens.encoding_walk(whole, norm=norm, progress=False, chunk_rows=3)
        assert same_walk(a, walklens.encoding_walk(opened, norm=norm, progress=False, chunk_rows=3)) == []


def test_the_walk_reads_an_opened_trace_point_by_point(lm, tmp_path: Path, monkeypatch) -> None:
    """The walk asks the stand-in for rows of single points, never for the whole tensor."""
    opened = walklens.capture(lm, TEXT, to=tmp_path / "t")
    asked: list[int] = []
    real = PointStack.rows

    def rows(self: PointStack, i: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
        asked.append((stop if stop is not None else self.length) - start)
        return real(self, i, start, stop)

    monkeypatch.setattr(PointStack, "rows", rows)
    monkeypatch.setattr(PointStack, "materialize", lambda self: pytest.fail("the walk read the whole trace"))
    walklens.encoding_walk(opened, progress=False, chunk_rows=5)
    assert asked and max(asked) <= len(opened.tokens)


def test_a_streamed_model_captures_texts_in_one_pass_and_walks_them_without_its_layers(folder, tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    lm = load_model(str(folder), progress=False, stream=True)
    stream = lm.stream
    assert stream is not None
    loaded = stream.stats.layers_loaded
    traces = capture_texts(lm, TEXTS, to=tmp_path / "t")
    assert stream.stats.layers_loaded - loaded == lm.n_layers  # one forward pass for every text
    recorders = list(spy.recorders)
    seqs = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    batch = capture_batch(lm, seqs, [*traces[0].points], stop_early=False)
    for i, tr in enumerate(traces):
        n = len(seqs[i])
        assert tr.token_ids.tolist() == seqs[i] and len(tr.tokens) == n
        assert torch.equal(bits(tr.hidden.materialize()), bits(batch.hidden[:, i, :n]))
    # the writer held one point's activations at a time, and no recorder kept a buffer
    (w,) = spy.writers
    one_point = len(TEXTS) * max(map(len, seqs)) * traces[0].d_model * 4
    assert w.stats.peak_held_bytes == one_point and w.stats.shards_written == len(traces[0].points)
    assert recorders and all(rec.hidden == {} for rec in recorders)
    # every analysis that needs the trace and the token matrix or head runs without the layers
    loaded = stream.stats.layers_loaded
    again = walklens.Trace.open(tmp_path / "t", lm, item=1)
    for norm in ("none", "final"):
        walk = walklens.encoding_walk(again, norm=norm, progress=False)
        assert walk.rank_of_next.shape == (len(again.points), len(seqs[1]))
    walklens.similarity_map(again, "final")
    assert stream.stats.layers_loaded == loaded


def test_the_writer_never_holds_more_than_one_point(lm, tmp_path, monkeypatch) -> None:
    spy = Spy(monkeypatch)
    tr = walklens.capture(lm, TEXT, to=tmp_path / "t")
    (w,) = spy.writers
    point = len(tr.tokens) * tr.d_model * 4
    assert w.stats.shards_written == len(tr.points) and w.stats.peak_held_bytes == point
    assert w.stats.bytes_written > len(tr.points) * point  # (each shard: one point and its header)
    assert spy.recorders and all(rec.hidden == {} for rec in spy.recorders)


def test_capture_batch_to_a_folder(lm, tmp_path) -> None:
    seqs = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    whole = capture_batch(lm, seqs, ["L*.resid_post", "final"])
    batch = capture_batch(lm, seqs, ["L*.resid_post", "final"], to=tmp_path / "b")
    assert isinstance(batch.hidden, PointStack) and batch.hidden.shape == whole.hidden.shape
    assert batch.points == whole.points and torch.equal(batch.mask, whole.mask)
    assert torch.equal(bits(batch["final"]), bits(whole["final"])) and torch.equal(batch.hidden, whole.hidden)
    with pytest.raises(InputError, match=r"holds 3 texts; pass item="):
        walklens.Trace.open(tmp_path / "b")
    with pytest.raises(InputError, match="holds 3 texts, no item 3"):
        walklens.Trace.open(tmp_path / "b", item=3)


# ---- resuming ----------------------------------------------------------------------------------------------------


class Killed(Exception):
    """The capture killed mid-pass."""


def _killed_at_layer(lm: Any, layer: int, to: Path, **kw: Any) -> None:
    def kill(*_: Any) -> None:
        raise Killed

    with Hooks() as hooks, pytest.raises(Killed):
        hooks.pre(lm.adapter.layer_modules(lm.model)[layer], kill)
        walklens.capture(lm, TEXT, to=to, **kw)


def test_an_interrupted_capture_resumes_writing_only_the_missing_shards(lm, tmp_path, monkeypatch) -> None:
    straight = walklens.capture(lm, TEXT, to=tmp_path / "straight")
    to = tmp_path / "t"
    _killed_at_layer(lm, 1, to)
    manifest = json.loads((to / "manifest.json").read_text())
    done = set(manifest["shards"])
    assert not manifest["complete"] and done == {f"/{p}" for p in straight.points if p == "embed" or p[:3] == "L0."}
    with pytest.raises(InputError, match=rf"an interrupted capture \({len(done)} of 12 points written\)"):
        walklens.Trace.open(to)
    before = shards(to)
    (to / ".0006-L1.resid_pre.safetensors.x1.tmp").write_bytes(b"half a shard")  # a kill mid-write leaves this
    spy = Spy(monkeypatch)
    resumed = walklens.capture(lm, TEXT, to=to)
    assert sorted(spy.written) == sorted(f"/{p}" for p in straight.points if f"/{p}" not in done)
    after = shards(to)
    assert {k: after[k] for k in before} == before  # what was written stays as it was, file for file
    assert {k: v[2] for k, v in after.items()} == {k: v[2] for k, v in shards(tmp_path / "straight").items()}
    assert torch.equal(bits(resumed.hidden.materialize()), bits(straight.hidden.materialize()))
    assert not list(to.glob(".*.tmp"))
    spy.writers.clear()
    walklens.capture(lm, TEXT, to=to)  # complete: nothing runs, nothing is written
    assert spy.written == [] and shards(to) == after


def test_a_link_planted_in_the_folder_leads_nowhere_else(lm, tmp_path) -> None:
    to, outside = tmp_path / "t", tmp_path / "outside"
    _killed_at_layer(lm, 1, to)
    outside.write_text("keep me")
    (to / "0006-L1.resid_pre.safetensors").symlink_to(outside)
    with pytest.raises(InputError, match="lies outside the folder") as e:
        walklens.capture(lm, TEXT, to=to)
    _one_line(e)
    assert outside.read_text() == "keep me"


def _full(n_ok: int):
    """A ``save_file`` that fills the disk after ``n_ok`` shards."""
    from safetensors.torch import save_file

    calls = []

    def save(tensors: Any, path: str, metadata: Any = None) -> None:
        calls.append(path)
        if len(calls) > n_ok:
            Path(path).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        save_file(tensors, path, metadata=metadata)

    return save


def test_a_full_disk_is_one_line_and_loses_nothing(lm, tmp_path, monkeypatch) -> None:
    import safetensors.torch

    straight = walklens.capture(lm, TEXT, to=tmp_path / "straight")
    to = tmp_path / "t"
    monkeypatch.setattr(safetensors.torch, "save_file", _full(4))
    with pytest.raises(InputError) as e:
        walklens.capture(lm, TEXT, to=to)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"to {to}: cannot write 0004-L0.mlp_out.safetensors")
    assert "No space left on device" in msg and "the 4 shards written are kept" in msg
    assert len(json.loads((to / "manifest.json").read_text())["shards"]) == 4 and not list(to.glob(".*.tmp"))
    monkeypatch.undo()
    resumed = walklens.capture(lm, TEXT, to=to)
    assert torch.equal(bits(resumed.hidden.materialize()), bits(straight.hidden.materialize()))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (the patched writer above stands in)")
def test_a_really_full_tmpfs_is_one_line_and_loses_nothing(lm, tmp_path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        filler = mnt / "filler"
        with open(filler, "wb") as f:  # leave about 12 KiB: a few shards of 1.7 KB and the manifests fit
            f.write(b"\0" * (os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize - 12 * 1024))
        to = mnt / "t"
        with pytest.raises(InputError, match="No space left on device") as e:
            walklens.capture(lm, TEXT, to=to, points=None)
        assert "\n" not in str(e.value)
        listed = json.loads((to / "manifest.json").read_text())["shards"]
        assert 0 < len(listed) < 12
        filler.unlink()
        resumed = walklens.capture(lm, TEXT, to=to)
        assert torch.equal(resumed.hidden, walklens.capture(lm, TEXT).hidden)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# ---- refusals, one line each --------------------------------------------------------------------------------------


def _one_line(e: pytest.ExceptionInfo[InputError]) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_file_or_a_foreign_folder_is_refused_untouched(lm, tmp_path) -> None:
    file = tmp_path / "file"
    file.write_text("keep me")
    with pytest.raises(InputError, match="exists and is not a directory") as e:
        walklens.capture(lm, TEXT, to=file)
    assert _one_line(e).startswith(f"to {file}") and file.read_text() == "keep me"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"holds 'notes.txt' but no manifest.json: give an empty or a new folder"):
        walklens.capture(lm, TEXT, to=other)
    assert sorted(os.listdir(other)) == ["notes.txt"]


def test_a_folder_that_cannot_be_written_is_refused(lm, tmp_path) -> None:
    to = tmp_path / "ro"
    to.mkdir()
    if os.geteuid() == 0:  # root writes anywhere: a read-only mount refuses it
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(to)], capture_output=True)
        if r.returncode:
            pytest.skip("root, and cannot mount a read-only tmpfs")
    else:
        to.chmod(0o500)
    try:
        with pytest.raises(InputError, match="not writable") as e:
            walklens.capture(lm, TEXT, to=to)
        assert _one_line(e).startswith(f"to {to}")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(to)], capture_output=True)
        else:
            to.chmod(0o700)


def test_another_capture_writing_the_folder_is_refused(lm, tmp_path) -> None:
    to = tmp_path / "t"
    to.mkdir()
    fd = os.open(to / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(InputError, match="another capture is writing in this folder"):
            walklens.capture(lm, TEXT, to=to)
    finally:
        os.close(fd)
    assert walklens.capture(lm, TEXT, to=to).points  # the lock released, it runs


@pytest.fixture
def written(lm, tmp_path) -> Path:
    walklens.capture(lm, TEXT, to=tmp_path / "t")
    return tmp_path / "t"


def test_a_truncated_shard_is_refused_naming_it(lm, written) -> None:
    shard = written / "0004-L0.mlp_out.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(InputError, match=r"0004-L0.mlp_out.safetensors: truncated or not a file") as e:
        walklens.Trace.open(written)
    _one_line(e)
    with pytest.raises(InputError, match=r"0004-L0.mlp_out.safetensors: truncated or grown") as e:
        walklens.capture(lm, TEXT, to=written)  # the resume checks what it keeps
    _one_line(e)
    shard.unlink()
    with pytest.raises(InputError, match=r"0004-L0.mlp_out.safetensors: missing \(the manifest lists it\)"):
        walklens.Trace.open(written)


def test_a_shard_whose_bytes_changed_is_refused_naming_it(lm, written) -> None:
    shard = written / "0011-final.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 1  # one bit of one number
    shard.write_bytes(bytes(data))
    tr = walklens.Trace.open(written, lm)  # the sizes agree: the sum is checked when the point is read
    assert torch.equal(tr["embed"], walklens.capture(lm, TEXT)["embed"])
    with pytest.raises(InputError, match=r"0011-final.safetensors: its bytes changed") as e:
        tr["final"]
    _one_line(e)
    with pytest.raises(InputError, match=r"0011-final.safetensors: its bytes changed"):
        walklens.encoding_walk(tr, progress=False)
    with pytest.raises(InputError, match=r"0011-final.safetensors: its bytes changed"):
        walklens.capture(lm, TEXT, to=written)


def test_a_shard_of_another_trace_is_refused_naming_it(lm, written, tmp_path) -> None:
    """A shard copied from another model's trace, with the manifest's sum and size made to match it."""
    other = tiny_model("llama", seed=1)
    walklens.capture(other, TEXT, to=tmp_path / "other")
    name = "0003-L0.resid_mid.safetensors"
    (written / name).write_bytes((tmp_path / "other" / name).read_bytes())
    manifest = json.loads((written / "manifest.json").read_text())
    theirs = json.loads((tmp_path / "other" / "manifest.json").read_text())
    manifest["shards"]["/L0.resid_mid"] = theirs["shards"]["/L0.resid_mid"]
    (written / "manifest.json").write_text(json.dumps(manifest))
    tr = walklens.Trace.open(written)
    with pytest.raises(InputError, match=rf"{name}: a shard of another trace") as e:
        tr["L0.resid_mid"]
    _one_line(e)


def test_a_folder_of_another_capture_is_refused(lm, written) -> None:
    other = tiny_model("llama", seed=1)
    cases = [
        (lambda: walklens.capture(other, TEXT, to=written), "of another model (tiny-llama, not tiny-llama)"),
        (lambda: walklens.capture(lm, TEXT + " again", to=written), "of other tokens"),
        (lambda: walklens.capture(lm, TEXT, points=["final"], to=written), "of other points"),
        (lambda: walklens.capture(lm, TEXT, dtype=torch.float16, to=written), "the record dtype is float32, not"),
        (lambda: walklens.Trace.open(written, other), "captured from tiny-llama, not from the model given"),
    ]
    before = shards(written)
    for call, words in cases:
        with pytest.raises(InputError, match=r"^(to|trace) " + str(written)) as e:
            call()
        assert words in _one_line(e), str(e.value)
    assert shards(written) == before


def test_a_bad_manifest_is_one_line(lm, written) -> None:
    path = written / "manifest.json"
    good = json.loads(path.read_text())
    for bad, words in [
        ("{", "not valid JSON"),
        (json.dumps(good | {"dtype": "int8"}), "field 'dtype' must be one of"),
        (json.dumps(good | {"shards": {"/nowhere": good["shards"]["/embed"]}}), "is no point of the trace"),
        (
            json.dumps(
                good | {"shards": good["shards"] | {"/embed": {**good["shards"]["/embed"], "file": "../x.safetensors"}}}
            ),
            "outside",
        ),
    ]:
        path.write_text(bad)
        with pytest.raises(InputError, match=words) as e:
            walklens.Trace.open(written)
        _one_line(e)
    with pytest.raises(InputError, match="no such folder"):
        walklens.Trace.open(written / "nowhere")
    with pytest.raises(InputError, match="not a folder"):
        walklens.Trace.open(path)


def test_to_refuses_what_it_cannot_write(lm, tmp_path) -> None:
    with pytest.raises(InputError, match="without attention maps"):
        walklens.capture(lm, TEXT, attentions=True, to=tmp_path / "t")
    with pytest.raises(InputError, match="takes a list of texts"):
        capture_texts(lm, TEXT, to=tmp_path / "t")
    assert not (tmp_path / "t").exists()


# ---- the command line ---------------------------------------------------------------------------------------------


def test_walk_writes_its_trace_with_trace_dir(folder, tmp_path, capfd) -> None:
    to = tmp_path / "trace"
    argv = ["walk", TEXT, "--model", str(folder), "--norm", "none", "--k", "2", "--trace-dir", str(to)]
    rc, err = run_cli(capfd, *argv, "--json", str(tmp_path / "w.json"))
    assert rc == 0, err
    lm = load_model(str(folder), progress=False)
    tr = walklens.Trace.open(to, lm)
    assert torch.equal(tr.hidden, walklens.capture(lm, TEXT).hidden)
    assert run_cli(capfd, *argv)[0] == 0  # a rerun finds the trace complete
    rc, err = run_cli(capfd, "walk", "other words", "--model", str(folder), "--trace-dir", str(to))
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"walklens: error: --trace-dir {to}: holds a trace of")
    (tmp_path / "f").write_text("x")
    rc, err = run_cli(capfd, "walk", TEXT, "--model", str(folder), "--trace-dir", str(tmp_path / "f"))
    assert rc == 2 and err == [f"walklens: error: --trace-dir {tmp_path / 'f'}: exists and is not a directory"]


def test_the_writer_module_names_its_option(tmp_path) -> None:
    named = tracewrite.NamedFolder(str(tmp_path / "x"), "--trace-dir")
    assert os.fspath(named) == str(tmp_path / "x") and named.label == "--trace-dir"
