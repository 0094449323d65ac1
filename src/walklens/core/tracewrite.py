"""Writing a trace folder (:mod:`walklens.core.tracedir`; docs/scale.md) as the forward pass computes each point.

A shard goes to a temp name by ``safetensors.torch.save_file``, is hashed and synced, renamed atomically onto its
name, then listed in the manifest (itself replaced atomically), so a killed capture leaves complete, listed shards
and at most a temp file (removed by the next run), never half a shard; a full disk is one line, and what was
written before stays.  A rerun asking for the same model, dtype, tokens and points checks every listed shard and
writes only the missing ones; a folder holding anything else, or another trace, is refused in one line, as is a
second capture writing into the same folder at the same time (a lock).  The writer holds one point's activations
at a time (:class:`WriterStats` counts them).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._version import __version__
from ..base.errors import InputError, WalklensError, first_line
from ..base.outputs import check_file, make_dir, write_atomic
from ..base.precision import dtype_name
from ..base.records import confined
from .tracedir import (
    FORMAT,
    LOCK,
    MANIFEST,
    RECORD_DTYPES,
    SHARD_META,
    TENSOR,
    VERSION,
    all_keys,
    model_identity,
    read_manifest,
    same_model,
    sha256_file,
    shard_key,
    shard_shape,
    trace_key,
    verify_shard,
)

if TYPE_CHECKING:
    from .loading import LoadedModel


@dataclass(frozen=True)
class NamedFolder:
    """A trace folder named by a command-line option: the writer's messages start with ``label``
    (``--trace-dir``) instead of ``to``."""

    path: str
    label: str

    def __fspath__(self) -> str:
        return self.path


def new_manifest(
    lm: LoadedModel, points: dict[str, list[str]], ids: dict[str, list[list[int]]], dtype: torch.dtype
) -> dict[str, Any]:
    """The manifest of a capture about to run, no shard written yet: for each stack (in order), its ``points`` and
    the token ids ``ids`` of each text (unpadded; the same texts in every stack); ``dtype``: the record dtype."""
    stacks = [
        {
            "name": stack,
            "n_layers": lm.n_layers,
            "points": names,
            "texts": [{"token_ids": t, "tokens": lm.token_strings(t)} for t in ids[stack]],
        }
        for stack, names in points.items()
    ]
    return {
        "format": FORMAT,
        "version": VERSION,
        "walklens_version": __version__,
        "model": model_identity(lm),
        "model_dtype": dtype_name(lm.dtype),
        "dtype": dtype_name(dtype),
        "d_model": None,
        "stacks": stacks,
        "shards": {},
        "complete": False,
    }


def _differs(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """What makes the trace of ``old`` another than the one ``new`` asks for, or None."""
    if not same_model(old["model"], new["model"]):
        return f"of another model ({old['model']['name']}, not {new['model']['name']})"
    for field, what in (("model_dtype", "the model's dtype"), ("dtype", "the record dtype")):
        if old[field] != new[field]:
            return f"in another dtype ({what} is {old[field]}, not {new[field]})"
    if [s["name"] for s in old["stacks"]] != [s["name"] for s in new["stacks"]]:
        return "of other stacks"
    for a, b in zip(old["stacks"], new["stacks"]):
        if [t["token_ids"] for t in a["texts"]] != [t["token_ids"] for t in b["texts"]]:
            return "of other tokens"
        if a["points"] != b["points"] or a["n_layers"] != b["n_layers"]:
            return "of other points"
    if old["walklens_version"] != new["walklens_version"]:
        return f"written by walklens {old['walklens_version']}"
    return None


def _is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _clean_temps(folder: Path) -> None:
    """Remove the temp files a killed capture left (regular files only)."""
    for name in os.listdir(folder):
        path = folder / name
        if _is_temp(name) and stat.S_ISREG(os.lstat(path).st_mode):
            with contextlib.suppress(OSError):
                path.unlink()


@contextlib.contextmanager
def _locked(folder: Path, where: str) -> Iterator[None]:
    """Hold the folder's lock: a second capture into it at the same time is refused in one line."""
    import fcntl

    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        raise InputError(f"{where}: cannot write in it ({e.strerror or e})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise InputError(f"{where}: another capture is writing in this folder") from None
        yield
    finally:
        os.close(fd)


class WriterStats:
    """What a writer did: shards and bytes written, and the most bytes of activations it held at once."""

    def __init__(self) -> None:
        self.shards_written = 0
        self.bytes_written = 0
        self.held_bytes = 0
        self.peak_held_bytes = 0
        self.written: list[str] = []


class TraceWriter:
    """Writes the shards of one capture into its folder (:func:`trace_writer`)."""

    def __init__(self, folder: Path, manifest: dict[str, Any], label: str) -> None:
        self.folder, self.manifest, self.label = folder, manifest, label
        self.where = f"{label} {folder}"
        self.dtype = RECORD_DTYPES[manifest["dtype"]][0]
        self.key = trace_key(manifest)
        self.order = {k: i for i, k in enumerate(all_keys(manifest))}
        self.stats = WriterStats()

    def missing(self, stack: str) -> list[str]:
        """The points of ``stack`` with no shard yet, in order."""
        s = next(s for s in self.manifest["stacks"] if s["name"] == stack)
        return [p for p in s["points"] if shard_key(stack, p) not in self.manifest["shards"]]

    def write(self, stack: str, point: str, x: torch.Tensor) -> None:
        """Write one point's [texts, tokens, D] activations as its shard, then list it in the manifest."""
        key = shard_key(stack, point)
        t = x.detach().to(device="cpu", dtype=self.dtype).contiguous()
        if self.manifest["d_model"] is None:
            self.manifest["d_model"] = int(t.shape[-1])
        if list(t.shape) != shard_shape(self.manifest, key):
            raise WalklensError(f"{key}: captured {list(t.shape)}, not {shard_shape(self.manifest, key)}")
        held = t.numel() * t.element_size()
        self.stats.held_bytes += held
        self.stats.peak_held_bytes = max(self.stats.peak_held_bytes, self.stats.held_bytes)
        try:
            entry = self._save(key, t)
        finally:
            self.stats.held_bytes -= held
        self.manifest["shards"][key] = entry
        self.save_manifest()

    def _save(self, key: str, t: torch.Tensor) -> dict[str, Any]:
        """``t`` saved as the shard ``key``: a temp file, hashed and synced, renamed onto its name."""
        from safetensors.torch import save_file

        stack, _, point = key.partition("/")
        file = f"{self.order[key]:04d}-{stack + '-' if stack else ''}{point}.safetensors"
        # inside the folder (a link planted there leads nowhere else), never replacing what is not a regular file
        target = check_file(confined(self.folder, file, self.where), self.label)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{file}.", suffix=".tmp")
            os.close(fd)
            save_file({TENSOR: t}, tmp, metadata={SHARD_META: json.dumps({"point": key, "trace": self.key})})
            digest, size = sha256_file(Path(tmp), f"{self.where}/{file}", sync=True)
            os.replace(tmp, target)
        except Exception as e:  # OSError, SafetensorError (a full disk)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if isinstance(e, InputError):
                raise
            done = len(self.manifest["shards"])
            raise InputError(
                f"{self.where}: cannot write {file} ({first_line(e, 120)}); the {done} shards written are kept: "
                "free space and run the capture again to resume"
            ) from None
        self.stats.shards_written += 1
        self.stats.bytes_written += size
        self.stats.written.append(key)
        return {"file": file, "bytes": size, "sha256": digest}

    def save_manifest(self) -> None:
        """Replace the manifest atomically (a failed write leaves the previous one)."""
        text = json.dumps(self.manifest, separators=(",", ":"), ensure_ascii=False) + "\n"
        write_atomic(self.folder / MANIFEST, text, self.label, replaces_input=True)

    def finish(self) -> None:
        """Mark the trace complete (every shard written)."""
        missing = [k for k in self.order if k not in self.manifest["shards"]]
        if missing:
            raise WalklensError(f"{self.where}: the capture never wrote {missing[0]}")
        if not self.manifest["complete"]:
            self.manifest["complete"] = True
            self.save_manifest()


def _foreign(folder: Path, where: str) -> None:
    """Refuse a folder that holds files but no manifest (nothing is written into it, not even the lock)."""
    if not os.path.lexists(folder / MANIFEST):
        others = sorted(n for n in os.listdir(folder) if n != LOCK and not _is_temp(n))
        if others:
            raise InputError(f"{where}: holds {others[0]!r} but no {MANIFEST}: give an empty or a new folder")


def _resume(folder: Path, fresh: dict[str, Any], label: str) -> dict[str, Any]:
    """The manifest to write on: ``fresh`` in an empty folder; in a folder of the same trace, its shards (each
    checked), so that only the missing ones are written; another trace is refused in one line."""
    where = f"{label} {folder}"
    _foreign(folder, where)
    if not os.path.lexists(folder / MANIFEST):
        _clean_temps(folder)
        return fresh
    old = read_manifest(folder, label)
    why = _differs(old, fresh)
    if why is not None:
        raise InputError(f"{where}: holds a trace {why}; give another folder, or empty this one")
    for key in old["shards"]:
        verify_shard(folder, old, key, label)
    _clean_temps(folder)
    return fresh | {"shards": old["shards"], "d_model": old["d_model"], "complete": old["complete"]}


@contextlib.contextmanager
def trace_writer(to: str | os.PathLike[str], manifest: dict[str, Any], label: str = "to") -> Iterator[TraceWriter]:
    """A writer of the trace ``manifest`` describes into the folder ``to`` (created; refused in one line when it is
    a file, cannot be written, holds something else or another trace, or another capture writes in it)."""
    label = to.label if isinstance(to, NamedFolder) else label
    folder = make_dir(to, label)
    _foreign(folder, f"{label} {folder}")
    with _locked(folder, f"{label} {folder}"):
        writer = TraceWriter(folder, _resume(folder, manifest, label), label)
        if not writer.manifest["shards"]:
            writer.save_manifest()
        yield writer


__all__ = ["NamedFolder", "TraceWriter", "WriterStats", "new_manifest", "trace_writer"]
