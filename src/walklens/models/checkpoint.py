"""A checkpoint folder checked before transformers builds anything from it, from its files alone: config.json,
the tokenizer's config, and the safetensors headers (no tensor is read).

The weights are ``model.safetensors`` or the shards ``model.safetensors.index.json`` names: each shard must lie
inside the folder (a hub snapshot's links into its repository's blobs do), exist, and hold exactly the tensors the
index maps to it.  The config's layer count, hidden size, vocabulary and head counts are compared with the tensors'
shapes, and its other sizes bounded by them, so that a config the weights contradict is one line naming the field,
its value and what the weights say, before a model is built (a billion layers would build for minutes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import InputError, UnknownModelError, WalklensError, first_line
from ..base.numbers import kind
from ..base.records import Field, Schema, confined, parse_json, read_bytes, read_head, read_json
from . import get_adapter, has_adapter
from .base import Adapter
from .derive import K_NAMES, Q_NAMES

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
#: config.json / tokenizer_config.json larger than this are refused unread (real ones are a few kB).
MAX_JSON_BYTES = 16 * 2**20
MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header
MAX_INDEX = 64 * 2**20
#: how often a shared layer (ALBERT) may be applied: the weights hold one layer whatever the count
MAX_SHARED_REPEATS = 4096
REMOTE_CODE = "walklens never enables trust_remote_code"
INDEX_SCHEMA = Schema(
    "shard index", (Field("metadata", "dict", required=False, nullable=True), Field("weight_map", "dict")), extra=True
)
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model")
HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads")
KV_FIELDS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
HEAD_DIM_FIELDS = ("head_dim", "d_kv")
EMBED_WIDTH_FIELDS = ("embedding_size", "word_embed_proj_dim")  # embeddings narrower than the stream (ALBERT, OPT)
#: sizes no tensor can be smaller than: bounded by the largest dimension (or numbered list) of the weights
BOUNDED_FIELDS = (
    *HIDDEN_FIELDS,
    "vocab_size",
    *HEAD_FIELDS,
    *KV_FIELDS,
    *HEAD_DIM_FIELDS,
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "d_ff",
)
#: the same, for a mixture of experts (bounded only where the weights hold experts: dense configs carry them unused)
EXPERT_FIELDS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)
EMBED_NAMES = ("embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings", "shared")
POSITION_FIELDS, POSITION_NAMES = ("max_position_embeddings", "n_positions"), ("wpe", "embed_positions")


# ---- files ---------------------------------------------------------------------------------------------------


def check_family(model_type: str) -> None:
    """Refuse at once a model_type that has no adapter file and is no causal LM of the installed transformers
    (nothing could be derived for it)."""
    if has_adapter(model_type):
        return
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        get_adapter(model_type)  # raises: not supported, with the list of adapter files


def read_json_object(path: Path, label: str) -> dict[str, Any]:
    """A small JSON object file (config.json, tokenizer_config.json), or one UnknownModelError line."""
    try:
        doc = parse_json(read_bytes(path, label, MAX_JSON_BYTES), f"{label}: {path.name}")
    except InputError as e:  # not a regular file, too large, not JSON, too deep
        raise UnknownModelError(str(e)) from None
    if not isinstance(doc, dict):
        raise UnknownModelError(f"{label}: {path.name} is not a JSON object")
    return doc


def check_model_files(folder: Path, label: str) -> dict[str, Any]:
    """Refuse, before transformers sees it, a model folder whose config.json is missing or malformed or names
    no supported family, whose tokenizer needs the repository's own code, or whose safetensors are corrupt;
    returns config.json as written."""
    config = folder / "config.json"
    if not config.is_file():
        raise UnknownModelError(f"{label}: not a model directory (no config.json)")
    raw = read_json_object(config, label)
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise UnknownModelError(f"{label}: not a model directory (config.json names no model_type)")
    check_family(model_type)
    tok_config = folder / "tokenizer_config.json"
    if tok_config.is_file():
        auto_map = read_json_object(tok_config, label).get("auto_map")
        if auto_map and not (isinstance(auto_map, dict) and "AutoTokenizer" not in auto_map):
            raise UnknownModelError(
                f"{label}: the tokenizer needs the repository's own code (auto_map in "
                f"tokenizer_config.json), and {REMOTE_CODE}"
            )
    for weights in sorted(folder.glob("*.safetensors")):
        read_header(weights)
        check_safetensors(weights)
    return raw


#: the files one of which a model folder's tokenizer is read from (transformers' fast and slow tokenizers)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer_config.json",
)


def check_tokenizer_files(folder: Path, label: str) -> None:
    """Refuse, in one line naming the folder, a local model folder that holds no tokenizer file (transformers'
    own message ends cut in the middle of a sentence about sentencepiece)."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise UnknownModelError(
            f"{label}: the folder {folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
            "save one beside the weights: tokenizer.save_pretrained(folder)"
        )


def check_safetensors(path: Path) -> None:
    """Refuse a truncated or corrupt safetensors file: ``safe_open`` checks the header against the file size
    without reading the tensors."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as e:  # SafetensorError, OSError
        raise UnknownModelError(f"{path}: not a valid safetensors file ({first_line(e)})") from None


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file, as its header states it: its file, dtype name (``BF16``, ``F32``, ...),
    shape, and where its bytes lie (``begin``, ``end``: absolute offsets in the file)."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_entries(path: Path) -> dict[str, Entry]:
    """Every tensor of a safetensors file, from its header alone (read without blocking, its length checked
    against the file's size before it is read; each tensor's bytes checked to lie inside the file)."""
    where = f"{path}: not a valid safetensors file"
    head, size = read_head(path, "the weights", 8)
    n = int.from_bytes(head, "little")
    if len(head) < 8 or n > MAX_HEADER or 8 + n > size:
        raise UnknownModelError(f"{where} (a header of {n:,} bytes in a file of {size:,})")
    try:
        doc = parse_json(read_head(path, "the weights", 8 + n)[0][8:], where)
    except InputError as e:
        raise UnknownModelError(str(e)) from None
    if not isinstance(doc, dict):
        raise UnknownModelError(f"{where} (its header is not a JSON object)")
    entries = {}
    for name, info in doc.items():
        if name == "__metadata__":
            continue
        info = info if isinstance(info, dict) else {}
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise UnknownModelError(f"{where} (tensor {str(name)[:80]!r} has no shape)")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)) or not (
            0 <= offsets[0] <= offsets[1] <= size - 8 - n
        ):
            raise UnknownModelError(f"{where} (tensor {str(name)[:80]!r} lies outside the file)")
        dtype = info.get("dtype")
        entries[str(name)] = Entry(path, str(dtype), tuple(shape), 8 + n + offsets[0], 8 + n + offsets[1])
    return entries


def read_header(path: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor in a safetensors file, from its header alone (:func:`read_entries`)."""
    return {name: e.shape for name, e in read_entries(path).items()}


def _shard_path(folder: Path, name: str, where: str, hub: bool) -> Path:
    """A shard named by the index, inside the folder (for a hub snapshot: inside its repository's cache)."""
    if os.path.isabs(name) or ".." in Path(name).parts or "\x00" in name:
        raise InputError(f"{where}: {name[:80]!r} lies outside the folder {folder}")
    root = folder.parent.parent if hub and folder.parent.name == "snapshots" else folder
    return confined(root, os.path.relpath(folder / name, root), where)


@dataclass(frozen=True)
class Weights:
    """Every tensor's shape, by name, over a checkpoint's safetensors files (headers only), and where each lies
    (``entries``: its file, dtype and byte range; what a streamed model reads, :mod:`walklens.core.streaming`)."""

    shapes: dict[str, tuple[int, ...]]
    entries: dict[str, Entry]

    def stacks(self) -> dict[str, set[int]]:
        """The numbered lists: the indices below each prefix (``model.layers`` -> {0, 1}), by the first number in
        each tensor's name."""
        found: dict[str, set[int]] = {}
        for name in self.shapes:
            parts = name.split(".")
            i = next((i for i, p in enumerate(parts) if p.isdigit()), None)
            if i is not None:
                found.setdefault(".".join(parts[:i]), set()).add(int(parts[i]))
        return found

    def biggest(self) -> int:
        """The largest dimension of any tensor, or length of any numbered list."""
        dims = [d for s in self.shapes.values() for d in s]
        counts = [max(ix) + 1 for ix in self.stacks().values()]
        return max([1, *dims, *counts])

    def named(self, suffixes: tuple[str, ...], dims: int, under: str = "") -> tuple[str, tuple[int, ...]] | None:
        """The first tensor (shortest name) of ``dims`` dimensions below ``under`` whose module is named one of
        ``suffixes``."""
        hits = [
            n
            for n in self.shapes
            if n.startswith(under)
            and len(self.shapes[n]) == dims
            and n.endswith(".weight")
            and n[: -len(".weight")].rsplit(".", 1)[-1] in suffixes
        ]
        best = min(hits, key=lambda n: (len(n), n), default=None)
        return None if best is None else (best, self.shapes[best])


def read_weights(folder: Path, hub: bool = False) -> Weights | None:
    """The weights' shapes as transformers will load them: ``model.safetensors``, else the shards of
    ``model.safetensors.index.json`` (checked against the index); None when the folder holds neither (or, for a
    hub snapshot, not every shard yet: they are downloaded at load)."""
    if os.path.lexists(folder / SINGLE):
        single = read_entries(folder / SINGLE)
        return Weights({n: e.shape for n, e in single.items()}, single)
    index = folder / INDEX
    if not os.path.lexists(index):
        return None
    doc = INDEX_SCHEMA.check(read_json(index, "the shard index", MAX_INDEX), str(index))
    by_shard: dict[str, set[str]] = {}
    for name, shard in doc["weight_map"].items():
        if not isinstance(shard, str) or not shard:
            raise InputError(f"{index}: the tensor {name[:80]!r} is mapped to {kind(shard)}, not a shard's name")
        by_shard.setdefault(shard, set()).add(name)
    entries: dict[str, Entry] = {}
    for shard, names in sorted(by_shard.items()):
        path = _shard_path(folder, shard, str(index), hub)
        if not os.path.exists(path):  # (False for a name too long to exist, too)
            if hub:
                return None
            raise InputError(f"{index}: the shard {shard[:80]!r} it names is missing")
        held = read_entries(path)
        check_safetensors(path)
        lost, stray = sorted(names - held.keys()), sorted(held.keys() - names)
        if lost:
            raise InputError(f"{index}: maps the tensor {lost[0][:80]!r} to the shard {shard!r}, which lacks it")
        if stray:
            raise InputError(
                f"{index}: the shard {shard!r} holds the tensor {stray[0][:80]!r}, which the index does not map to it"
            )
        entries.update(held)
    return Weights({n: e.shape for n, e in entries.items()}, entries)


# ---- the config against the weights ----------------------------------------------------------------------------


def _int(config: Any, names: tuple[str, ...]) -> tuple[str, int] | None:
    """The first of ``names`` the config sets to an integer, and its value."""
    for n in names:
        v = getattr(config, n, None)
        if type(v) is float and v.is_integer():  # 1e9 in config.json
            v = int(v)
        if type(v) is int:
            return n, v
    return None


def _spelled(config: Any, raw: Mapping[str, Any], name: str) -> str:
    """``name`` as config.json spells it (``n_layer`` for GPT-2's ``num_hidden_layers``)."""
    amap = getattr(config, "attribute_map", {}) or {}
    for cand in (name, amap.get(name), *(a for a, t in amap.items() if t == name)):
        if isinstance(cand, str) and cand in raw:
            return cand
    return name


def check_config(config: Any, raw: Mapping[str, Any], weights: Weights, adapter: Adapter | None, label: str) -> None:
    """Refuse, in one line naming the config field, its value and what the weights say, a config the weights
    contradict: its layer count, hidden size, vocabulary or head counts, or a size over every dimension of the
    weights.  ``adapter``: the family's adapter file (None: the adapter will be derived)."""

    def refuse(field: str, value: int, says: str) -> UnknownModelError:
        return UnknownModelError(f"{label}: config.json gives {_spelled(config, raw, field)} {value}, but {says}")

    stacks = {p: len(ix) for p, ix in weights.stacks().items()}
    main = max(stacks, key=lambda p: (stacks[p], p), default=None)
    layers = _int(config, LAYER_FIELDS)
    if adapter is not None:
        n = adapter.n_layers(config)
        layers = (next((f for f in LAYER_FIELDS if getattr(config, f, None) == n), "the layer count"), n)
    shared = adapter is not None and any(s.shared_layer for s in adapter.stacks)
    counts = [layers] if layers else []
    decoder = _int(config, ("num_decoder_layers",))
    if adapter is not None and adapter.auto_class == "seq2seq" and decoder:
        counts.append(decoder)
    for field, n in counts:
        if shared and not 1 <= n <= MAX_SHARED_REPEATS:
            raise refuse(field, n, f"a shared layer is applied from 1 to {MAX_SHARED_REPEATS:,} times")
        if not shared and n not in stacks.values():
            held = f"{stacks[main]} layers ({main}.0 to {main}.{stacks[main] - 1})" if main is not None else "no layers"
            raise refuse(field, n, f"the weights hold {held}")
    embed = _embedding(weights, adapter)
    hidden = _int(config, HIDDEN_FIELDS)
    if embed is not None:
        name, shape = embed
        vocab = _int(config, ("vocab_size",))
        if vocab and vocab[1] != shape[0]:
            raise refuse(*vocab, f"the weights' token embeddings {name} {list(shape)} hold {shape[0]} tokens")
        narrow = _int(config, EMBED_WIDTH_FIELDS)
        layer0 = {d for n, s in weights.shapes.items() if main and n.startswith(f"{main}.0.") for d in s}
        if hidden and hidden[1] != shape[1] and not (narrow and narrow[1] == shape[1] and hidden[1] in layer0):
            raise refuse(*hidden, f"the weights' token embeddings {name} {list(shape)} have width {shape[1]}")
    if hidden and main is not None:
        _check_heads(config, raw, weights, f"{main}.0.", hidden[1], refuse)
    top = weights.biggest()
    experts = any("expert" in n for n in weights.shapes)
    for field in BOUNDED_FIELDS + (EXPERT_FIELDS if experts else ()):
        got = _int(config, (field,))
        if got and got[1] > top:
            raise refuse(*got, f"no tensor of the weights has a dimension over {top:,}")
    table = weights.named(POSITION_NAMES, 2)
    for field in POSITION_FIELDS:
        got = _int(config, (field,))
        if got and table and got[1] > table[1][0]:
            raise refuse(*got, f"the weights' position table {table[0]} {list(table[1])} holds {table[1][0]}")


def _embedding(weights: Weights, adapter: Adapter | None) -> tuple[str, tuple[int, ...]] | None:
    """The token-embedding matrix of the weights: the adapter's module, else one of the names families use."""
    if adapter is not None:
        path = adapter.embed
        for n, s in weights.shapes.items():
            stem = n[: -len(".weight")] if n.endswith(".weight") else ""
            if len(s) == 2 and stem and (stem == path or path.endswith("." + stem) or stem.endswith("." + path)):
                return n, s
    return weights.named(EMBED_NAMES, 2)


def _check_heads(config: Any, raw: Mapping[str, Any], weights: Weights, layer0: str, D: int, refuse: Any) -> None:
    """Heads times the head size must be the rows of layer 0's separate query and key projections, where it has
    them (a fused projection's layout differs by family: its sizes are only bounded)."""
    heads = _int(config, HEAD_FIELDS)
    if not heads or heads[1] < 1:
        return
    dim = _int(config, HEAD_DIM_FIELDS)
    d = dim[1] if dim and dim[1] > 0 else D // heads[1]
    size = f"{_spelled(config, raw, dim[0])} {d}" if dim else f"heads of {d} (the width over the heads)"
    for (field, n), names, what in ((heads, Q_NAMES, "query"), (_int(config, KV_FIELDS) or heads, K_NAMES, "key")):
        proj = weights.named(names, 2, layer0)
        if proj is None:
            continue
        name, shape = proj
        rows = shape[0] if shape[1] == D else shape[1] if shape[0] == D else None
        if rows is not None and n * d != rows:
            raise refuse(
                field,
                n,
                f"{n} heads with {size} make {n * d} {what} rows, where the weights' {what} projection "
                f"{name} {list(shape)} has {rows}",
            )


def check_depth(adapter: Adapter, config: Any, spec: str) -> None:
    """Refuse a config whose layer count is not a positive integer (``num_hidden_layers`` 0 or -3 would load a
    model that ignores its weights)."""
    try:
        n = adapter.n_layers(config)
    except WalklensError:
        raise
    except Exception as e:  # a missing, non-numeric or inconsistent layer count
        raise UnknownModelError(f"{spec}: config.json gives no usable layer count ({first_line(e)})") from None
    if n < 1:
        raise UnknownModelError(f"{spec}: config.json gives {n} layers; a model needs at least 1")


def check_loading_info(spec: str, info: dict[str, Any]) -> None:
    """Refuse weights that do not fit the config: tensors missing, of the wrong shape, or unused."""
    bad = sorted(info.get("missing_keys") or ()) + sorted(str(k) for k in info.get("mismatched_keys") or ())
    if bad:
        raise UnknownModelError(
            f"{spec!r}: the safetensors weights do not fit the config ({len(bad)} tensors "
            f"missing or of the wrong shape, e.g. {bad[0]})"
        )
    unused = sorted(str(k) for k in info.get("unexpected_keys") or ())
    if unused:
        raise UnknownModelError(
            f"{spec!r}: the safetensors weights do not fit the config ({len(unused)} tensors "
            f"the config does not use, e.g. {unused[0]})"
        )


__all__ = [
    "INDEX",
    "SINGLE",
    "Weights",
    "check_config",
    "check_depth",
    "check_family",
    "check_loading_info",
    "check_model_files",
    "check_safetensors",
    "check_tokenizer_files",
    "read_header",
    "read_json_object",
    "read_weights",
]
