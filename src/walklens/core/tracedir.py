"""Traces on disk (docs/scale.md): every captured point written to its own safetensors shard as the forward pass
computes it, and read back one point at a time.

A trace folder holds ``manifest.json`` and one shard per (stack, point): ``0007-L1.attn_out.safetensors`` holds the
tensor ``hidden`` [texts, tokens, D] (texts right-padded to the longest) in the record dtype.  The manifest names
the model (its name, family, a hash of its config, and the checkpoint files' sizes and header hashes, or, for a
model with no files, a hash of its token embeddings), the model's and the record dtype, the walklens version, each
stack's points and each text's token ids and tokens, and each shard written so far with its size and sha256.

Writing: :mod:`walklens.core.tracewrite` (shard by shard, resumable).

Reading (:func:`open_folder`, :class:`PointStack`): the manifest is checked, every shard's size at once, and each
shard's sha256 and header (its point and trace key, shape and dtype) the first time one of its points is read; a
truncated, tampered or foreign shard is one :class:`~walklens.base.errors.InputError` line naming it.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..base.errors import InputError, first_line
from ..base.numbers import Range
from ..base.precision import dtype_name
from ..base.records import Field, Schema, confined, parse_json, read_head, read_json
from ..models.checkpoint import MAX_HEADER, read_weights

if TYPE_CHECKING:
    from .loading import LoadedModel

MANIFEST = "manifest.json"
LOCK = ".lock"
FORMAT = "walklens trace folder"
VERSION = 1
TENSOR = "hidden"
#: the one metadata entry of a shard's header: its point and trace key as JSON (one entry: the bytes are the same
#: for the same capture, where safetensors would write several entries in any order)
SHARD_META = "walklens_trace_shard"
#: the dtypes a trace records in, by name, with their safetensors names
RECORD_DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "float32": (torch.float32, "F32"),
    "float16": (torch.float16, "F16"),
    "bfloat16": (torch.bfloat16, "BF16"),
    "float64": (torch.float64, "F64"),
}
#: config fields that say how a model was loaded or is run, not which model it is
VOLATILE = ("transformers_version", "dtype", "torch_dtype", "use_cache", "output_attentions", "output_hidden_states",
            "return_dict", "architectures")  # fmt: skip
_CHUNK = 1 << 20
_MANIFEST_BYTES = 1 << 30
_COUNT = Range(0, 2**40, integer=True)

_TOP = Schema(
    "trace manifest",
    (
        Field("format", "str", choices=(FORMAT,)),
        Field("version", "int", Range(1, VERSION, integer=True)),
        Field("walklens_version", "str", max_len=64),
        Field("model", "dict"),
        Field("model_dtype", "str", max_len=16),
        Field("dtype", "str", choices=tuple(RECORD_DTYPES)),
        Field("d_model", "int", Range(1, 2**24, integer=True), nullable=True),
        Field("stacks", "list", max_len=4),
        Field("shards", "dict"),
        Field("complete", "bool"),
    ),
)
_STACK = Schema(
    "stack",
    (Field("name", "str", max_len=16), Field("n_layers", "int", _COUNT), Field("points", "list", max_len=2**20),
     Field("texts", "list", max_len=2**16)),
)  # fmt: skip
_TEXT = Schema("text", (Field("token_ids", "list", max_len=2**24), Field("tokens", "list", max_len=2**24)))
_SHARD = Schema("shard", (Field("file", "str", max_len=255), Field("bytes", "int", _COUNT), Field("sha256", "str")))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shard_key(stack: str, point: str) -> str:
    """How the manifest names the shard of ``point`` in ``stack``: ``"/L3.resid_pre"``, ``"enc/final"``."""
    return f"{stack}/{point}"


# ---- the model's identity ----------------------------------------------------------------------------------------


def _header(path: Path) -> dict[str, Any]:
    """A checkpoint file's name, size and the sha256 of its safetensors header (never of its tensors)."""
    head, size = read_head(path, "the weights", 8)
    n = int.from_bytes(head, "little") if len(head) == 8 else 0
    if n > MAX_HEADER or 8 + n > size:
        raise InputError(f"{path}: not a valid safetensors file (a header of {n:,} bytes in a file of {size:,})")
    return {"file": path.name, "size": size, "header_sha256": _sha(read_head(path, "the weights", 8 + n)[0])}


def _checkpoint_files(lm: LoadedModel) -> list[Path]:
    """The safetensors files the model was read from (a streamed model's, or a local folder's), else none."""
    if lm.stream is not None:
        return sorted({e.path for e in lm.stream.weights.entries.values()})
    folder = Path(str(getattr(lm.config, "_name_or_path", "") or ""))
    weights = read_weights(folder) if str(folder) and folder.is_dir() else None
    return sorted({e.path for e in weights.entries.values()}) if weights is not None else []


def model_identity(lm: LoadedModel) -> dict[str, Any]:
    """The model as a trace folder names it: name, family, the sha256 of its config (how it is run left out), and
    its checkpoint files' sizes and header hashes, or, for a model with no files, the sha256 of its embeddings."""
    config = {k: v for k, v in lm.config.to_dict().items() if not k.startswith("_") and k not in VOLATILE}
    files = _checkpoint_files(lm)
    if files:
        weights: dict[str, Any] = {"files": [_header(p) for p in files]}
    else:
        emb = lm.embedding_matrix().detach().cpu().contiguous()
        weights = {"embedding_sha256": _sha(emb.view(torch.uint8).numpy().tobytes())}
    return {
        "name": lm.name,
        "family": lm.adapter.family,
        "config_sha256": _sha(json.dumps(config, sort_keys=True, default=str).encode()),
        "weights": weights,
    }


def same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two identities name one model; weights are compared when both are of one kind (files or hash)."""
    if any(a.get(k) != b.get(k) for k in ("name", "family", "config_sha256")):
        return False
    wa, wb = a.get("weights"), b.get("weights")
    if isinstance(wa, dict) and isinstance(wb, dict) and wa.keys() == wb.keys():
        return wa == wb
    return True


def trace_key(manifest: dict[str, Any]) -> str:
    """The sha256 of what a trace is (everything of its manifest but the shards written and the width they
    show): each shard's header carries it, so a shard of another trace is known as such."""
    what = {k: v for k, v in manifest.items() if k not in ("shards", "complete", "d_model")}
    return _sha(json.dumps(what, sort_keys=True, separators=(",", ":")).encode())


def all_keys(manifest: dict[str, Any]) -> list[str]:
    return [shard_key(s["name"], p) for s in manifest["stacks"] for p in s["points"]]


# ---- the manifest read back -------------------------------------------------------------------------------------


def _check_stack(raw: Any, where: str) -> dict[str, Any]:
    """One stack of a manifest: its points (distinct names) and texts (token ids and tokens of equal length)."""
    s = _STACK.check(raw, where)
    if not s["points"] or not all(isinstance(p, str) and p and "/" not in p for p in s["points"]):
        raise InputError(f"{where}: field 'points' must be a list of point names")
    if len(set(s["points"])) != len(s["points"]):
        raise InputError(f"{where}: field 'points' names a point twice")
    texts = _TEXT.check_all(s["texts"], f"{where} texts")
    for i, t in enumerate(texts):
        ids, toks = t["token_ids"], t["tokens"]
        if not ids or not all(type(x) is int and x >= 0 for x in ids):
            raise InputError(f"{where} texts row {i}: field 'token_ids' must be a list of token ids")
        if len(toks) != len(ids) or not all(isinstance(x, str) for x in toks):
            raise InputError(f"{where} texts row {i}: field 'tokens' must hold one string per token id")
    return s | {"texts": texts}


def _check_shards(m: dict[str, Any], where: str) -> None:
    """Every shard listed is one of the manifest's points, named by a distinct file of 64 hex digits' sha256."""
    keys, files = set(all_keys(m)), set()
    for key, raw in m["shards"].items():
        here = f"{where}: shard {str(key)[:80]!r}"
        if key not in keys:
            raise InputError(f"{here} is no point of the trace")
        s = _SHARD.check(raw, here)
        digest = s["sha256"]
        if len(digest) != 64 or digest.strip("0123456789abcdef"):
            raise InputError(f"{here}: field 'sha256' must be 64 hex digits")
        if not s["file"].endswith(".safetensors") or s["file"] in files:
            raise InputError(f"{here}: field 'file' must name a .safetensors file of its own")
        files.add(s["file"])
        m["shards"][key] = s


def read_manifest(folder: Path, where: str) -> dict[str, Any]:
    """A trace folder's manifest, every field checked (one line naming the field)."""
    path = folder / MANIFEST
    m = _TOP.check(read_json(path, where, _MANIFEST_BYTES), str(path))
    m["stacks"] = [_check_stack(s, f"{path} stacks row {i}") for i, s in enumerate(m["stacks"])]
    if not m["stacks"] or len({len(s["texts"]) for s in m["stacks"]}) != 1:
        raise InputError(f"{path}: field 'stacks' must hold stacks of the same texts")
    if len({s["name"] for s in m["stacks"]}) != len(m["stacks"]):
        raise InputError(f"{path}: field 'stacks' names a stack twice")
    if not isinstance(m["model"].get("name"), str):
        raise InputError(f"{path}: field 'model' has no name")
    _check_shards(m, str(path))
    if m["complete"] and (m["d_model"] is None or len(m["shards"]) != len(all_keys(m))):
        raise InputError(f"{path}: says it is complete but lists {len(m['shards'])} of {len(all_keys(m))} shards")
    return m


# ---- shards -------------------------------------------------------------------------------------------------------


def sha256_file(path: Path, where: str, sync: bool = False) -> tuple[str, int]:
    """The sha256 and size of the regular file ``path``, read in chunks (without blocking on a FIFO); ``sync``:
    flushed to the disk too."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InputError(f"{where}: cannot read it ({e.strerror or e})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{where}: not a regular file")
        h, size = hashlib.sha256(), 0
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
            size += len(chunk)
        if sync:
            os.fsync(fd)
        return h.hexdigest(), size
    except OSError as e:
        raise InputError(f"{where}: cannot read it ({e.strerror or e})") from None
    finally:
        os.close(fd)


def _check_header(path: Path, where: str, want: dict[str, Any]) -> None:
    """A shard's header: the point and the trace key it carries, and its tensor's dtype and shape."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta, sl = parse_json((f.metadata() or {}).get(SHARD_META, "{}"), where), f.get_slice(TENSOR)
            meta = meta if isinstance(meta, dict) else {}
            got = {"point": meta.get("point"), "trace": meta.get("trace"), "dtype": sl.get_dtype()}
            got["shape"] = list(sl.get_shape())
    except InputError:
        raise
    except Exception as e:  # SafetensorError, OSError
        raise InputError(f"{where}: not a shard of this trace ({first_line(e)})") from None
    if got["point"] != want["point"] or got["trace"] != want["trace"]:
        raise InputError(f"{where}: a shard of another trace (it holds {str(got['point'])[:80]!r} of another capture)")
    if got["dtype"] != want["dtype"] or got["shape"] != want["shape"]:
        raise InputError(
            f"{where}: holds {got['dtype']} {got['shape']}, not the {want['dtype']} {want['shape']} listed"
        )


def shard_shape(m: dict[str, Any], key: str) -> list[int]:
    """The shape of a shard: [texts, the stack's longest text, D]."""
    stack = next(s for s in m["stacks"] if key.startswith(s["name"] + "/"))
    return [len(stack["texts"]), max(len(t["token_ids"]) for t in stack["texts"]), int(m["d_model"])]


def verify_shard(folder: Path, m: dict[str, Any], key: str, label: str) -> Path:
    """The file of the listed shard ``key``, checked: inside the folder, its size and sha256 as listed, its header
    this trace's (one line naming the file when not)."""
    entry = m["shards"][key]
    path = confined(folder, entry["file"], f"{label} {folder / MANIFEST}")
    where = f"{label} {path}"
    if not os.path.lexists(path):
        raise InputError(f"{where}: missing (the manifest lists it)")
    digest, size = sha256_file(path, where)
    if size != entry["bytes"]:
        raise InputError(f"{where}: truncated or grown ({size:,} bytes, the manifest lists {entry['bytes']:,})")
    if digest != entry["sha256"]:
        raise InputError(f"{where}: its bytes changed (its sha256 is not the one the manifest lists)")
    want = {"point": key, "trace": trace_key(m), "dtype": RECORD_DTYPES[m["dtype"]][1], "shape": shard_shape(m, key)}
    _check_header(path, where, want)
    return path


# ---- reading ------------------------------------------------------------------------------------------------------


class TraceFolder:
    """A complete trace folder read back: its manifest checked and every shard's size; each shard's checksum and
    header checked the first time one of its points is read (:meth:`read`)."""

    def __init__(self, folder: Path, manifest: dict[str, Any], label: str) -> None:
        self.folder, self.manifest, self.label = folder, manifest, label
        self.where = f"{label} {folder}"
        self.dtype = RECORD_DTYPES[manifest["dtype"]][0]
        self.d_model = int(manifest["d_model"])
        self.stacks = {s["name"]: s for s in manifest["stacks"]}
        self.texts = len(manifest["stacks"][0]["texts"])
        self._verified: dict[str, Path] = {}

    def read(self, stack: str, point: str, item: int | None, rows: tuple[int, int]) -> torch.Tensor:
        """The rows ``rows`` [start, stop) of text ``item`` at ``point`` ([rows, D]; ``item=None``: of every text,
        [texts, rows, D]), read from the memory-mapped shard (checked the first time)."""
        from safetensors import safe_open

        key = shard_key(stack, point)
        path = self._verified.get(key)
        if path is None:
            path = self._verified[key] = verify_shard(self.folder, self.manifest, key, self.label)
        try:
            with safe_open(str(path), framework="pt") as f:
                sl = f.get_slice(TENSOR)
                t = sl[:, rows[0] : rows[1]] if item is None else sl[item, rows[0] : rows[1]]
        except Exception as e:  # SafetensorError, OSError: changed since it was checked
            raise InputError(f"{self.label} {path}: cannot read it ({first_line(e, 120)})") from None
        return t if t.data_ptr() % 64 == 0 else t.clone()  # 64-byte aligned, as a tensor in memory is


def open_folder(path: str | os.PathLike[str], lm: LoadedModel | None = None, label: str = "trace") -> TraceFolder:
    """The trace folder ``path`` (its manifest and shard sizes checked; with ``lm``, refused when captured from
    another model)."""
    folder = Path(path)
    where = f"{label} {folder}"
    try:
        st = os.stat(folder)
    except OSError:
        raise InputError(f"{where}: no such folder") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{where}: not a folder (a trace folder holds {MANIFEST} and its shards)")
    if not os.path.lexists(folder / MANIFEST):
        raise InputError(f"{where}: holds no {MANIFEST}: not a trace folder")
    m = read_manifest(folder, label)
    if not m["complete"]:
        n, total = len(m["shards"]), len(all_keys(m))
        raise InputError(f"{where}: an interrupted capture ({n} of {total} points written); run it again to resume")
    for entry in m["shards"].values():
        file = confined(folder, entry["file"], f"{where}/{MANIFEST}")
        try:
            st = os.stat(file)
        except OSError:
            raise InputError(f"{label} {file}: missing (the manifest lists it)") from None
        size = st.st_size if stat.S_ISREG(st.st_mode) else -1
        if size != entry["bytes"]:
            raise InputError(f"{label} {file}: truncated or not a file ({size:,} bytes, listed {entry['bytes']:,})")
    if lm is not None and not same_model(m["model"], model_identity(lm)):
        raise InputError(f"{where}: captured from {m['model']['name']}, not from the model given ({lm.name})")
    return TraceFolder(folder, m, label)


class PointStack:
    """[points, tokens, D] of one text of a trace folder (``item=None``: [points, texts, tokens, D] of all of them,
    right-padded), standing in for ``Trace.hidden``: ``stack[i]`` reads point ``i`` alone from its shard
    (memory-mapped), :meth:`rows` some of its rows; ``shape``, ``dtype``, ``dim()``, ``len()`` and ``numel()`` read
    nothing.  Any other use as a tensor (a slice, a list of points, ``.float()``, ``torch.equal``) reads the points
    it needs, or all of them, into memory."""

    def __init__(self, source: TraceFolder, stack: str, item: int | None) -> None:
        self.source, self.stack, self.item = source, stack, item
        texts = source.stacks[stack]["texts"]
        self.points: list[str] = source.stacks[stack]["points"]
        self.length = max(len(t["token_ids"]) for t in texts) if item is None else len(texts[item]["token_ids"])
        lead = [len(self.points)] if item is not None else [len(self.points), len(texts)]
        self.shape = torch.Size([*lead, self.length, source.d_model])
        self.dtype = source.dtype
        self.device = torch.device("cpu")

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return self.shape.numel()

    def element_size(self) -> int:
        return self.dtype.itemsize

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        return len(self.points)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self.rows(i) for i in range(len(self.points)))

    def __repr__(self) -> str:
        return f"PointStack({list(self.shape)}, {dtype_name(self.dtype)}, {self.source.folder})"

    def rows(self, i: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows ``start`` .. ``stop - 1`` of point ``i`` (all of its tokens by default): [rows, D] (or
        [texts, rows, D])."""
        stop = self.length if stop is None else stop
        return self.source.read(self.stack, self.points[i], self.item, (start, stop))

    def __getitem__(self, key: Any) -> torch.Tensor:
        if isinstance(key, torch.Tensor) and key.dim() == 0 and not key.is_floating_point() and key.dtype != torch.bool:
            key = int(key)
        if isinstance(key, tuple) and key and all(k is not Ellipsis and k is not None for k in key):
            head = self[key[0]]  # the points first, then the rest of the index on what they hold
            return head[(slice(None),) * (head.dim() - self.dim() + 1) + key[1:]]
        if isinstance(key, slice):
            picked = list(range(len(self)))[key]
        elif isinstance(key, (list, torch.Tensor)):
            ids = (
                key.tolist()
                if isinstance(key, torch.Tensor) and key.dim() == 1 and not key.is_floating_point()
                else key
            )
            if not isinstance(ids, list) or any(isinstance(k, bool) or not hasattr(k, "__index__") for k in ids):
                return self.materialize()[key]  # a mask, a float or a nested index: on the whole tensor
            picked = [self._index(k) for k in ids]
        elif hasattr(key, "__index__"):
            return self.rows(self._index(key))
        else:
            return self.materialize()[key]
        if not picked:
            return torch.empty(0, *self.shape[1:], dtype=self.dtype)
        return torch.stack([self.rows(i) for i in picked])

    def _index(self, key: Any) -> int:
        i = operator.index(key)
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} is out of range for {len(self)} points")
        return i % len(self)

    def materialize(self) -> torch.Tensor:
        """Every point in memory: [points, tokens, D]."""
        return self[:]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    @classmethod
    def __torch_function__(
        cls, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        def real(a: Any) -> Any:
            if isinstance(a, PointStack):
                return a.materialize()
            return type(a)(real(x) for x in a) if isinstance(a, (list, tuple)) else a

        return func(*real(args), **{k: real(v) for k, v in (kwargs or {}).items()})


__all__ = ["PointStack", "TraceFolder", "model_identity", "open_folder", "read_manifest", "verify_shard"]
