"""GGUF files: checked, then de-quantized once into a plain safetensors folder in the walklens cache (``load_model``
reads that folder, in memory or streamed layer by layer).

The conversion goes shard by shard: the GGUF's tensor table is read memory-mapped (``gguf.GGUFReader``), each
tensor de-quantized in row blocks (``gguf.quants.dequantize``), renamed and reshuffled per tensor by transformers'
own legacy GGUF helpers (``get_gguf_hf_weights_map`` and the architecture's ``TensorProcessor``: the llama q/k
permutation, gemma's norm offsets, ...), and written one layer per safetensors shard with a
``model.safetensors.index.json``.  What is held at once is one layer's float32 tensors, or one tensor outside the
layers (the embedding, the head): never the model.  The tensors equal, bit for bit, those of transformers' whole
load (``from_pretrained(gguf_file=...)``), which runs the same helpers over the whole file in one go.  Written by
hand here (the loop, not the helpers) because transformers offers that loop only over the whole model.

The architectures transformers converts with its newer weight-conversion mapping (``GGUF_ARCHS``) are loaded whole
as before.  Everything is written to a temporary folder renamed at the end: an interrupted conversion leaves no
folder that is taken as complete."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import mmap
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ..base.errors import InputError, MissingDependencyError, UnknownModelError, WalklensError, first_line
from ..models.checkpoint import check_family
from .streaming import quiet_transformers

#: Bytes of float32 output de-quantized at a time within one tensor (the quantized rows' intermediates scale with it).
ROW_BLOCK_BYTES = 8 << 20
INDEX = "model.safetensors.index.json"
_LAYER = re.compile(r"^blk\.(\d+)\.")


class Stored(NamedTuple):
    """A tensor of the GGUF's table: its name, ggml type, and its bytes' numpy dtype, shape and offset in the file
    (as ``gguf.GGUFReader`` reads them)."""

    name: str
    tensor_type: Any
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int


def check_gguf(gguf: Path) -> str:
    """Refuse an empty, truncated or non-GGUF file with one line; returns its ``general.architecture``."""
    return read_table(gguf)[0]


def read_table(gguf: Path) -> tuple[str, list[Stored]]:
    """The GGUF's ``general.architecture`` and tensor table, or one line refusing an empty, truncated or non-GGUF
    file.  ``gguf.GGUFReader`` memory-maps the file and parses the header, metadata and tensor table (a tensor cut
    short fails to take its shape), reading no tensor data; its parsed metadata (a large vocabulary's strings) is
    let go on return."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(gguf))
        field = reader.fields.get("general.architecture")
        arch = None if field is None else bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
        table = [Stored(t.name, t.tensor_type, t.data.dtype, t.data.shape, t.data_offset) for t in reader.tensors]
        del reader, field
    except Exception as e:  # the reader raises ValueError, IndexError, OSError, ... on malformed files
        raise UnknownModelError(f"{gguf}: not a valid GGUF file ({first_line(e)})") from None
    if arch is None:
        raise UnknownModelError(f"{gguf}: not a valid GGUF file (no general.architecture)")
    return arch, table


def dequantize_gguf(gguf: Path, target: Path, progress: bool = True) -> None:
    """De-quantize the GGUF at ``gguf`` into a plain float32 safetensors folder ``target`` (shard by shard, with
    its config and tokenizer); ``progress``: one ``tqdm.auto`` bar over its tensors (a widget in a notebook, a
    line on stderr in a terminal), none with ``False``."""
    if importlib.util.find_spec("gguf") is None:
        raise MissingDependencyError("loading a .gguf needs the package 'gguf'; run: pip install gguf")
    arch, table = read_table(gguf)
    import transformers
    from tqdm.auto import tqdm

    where = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    _remove_abandoned(target)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    bar: Any = None
    with warnings.catch_warnings(), quiet_transformers():
        warnings.simplefilter("ignore")
        try:
            # an unsupported family is refused before de-quantizing (and before a bar is drawn: one line)
            config = transformers.AutoConfig.from_pretrained(**where)
            check_family(config.model_type)
            bar = tqdm(
                total=2,
                desc=f"de-quantizing {gguf.name} (once)",
                unit="tensor",
                file=sys.stderr,
                leave=False,
                disable=not progress,
            )
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            if _whole_only(arch):
                _save_whole(where, tmp, bar)
            else:
                _save_sharded(gguf, arch, table, where, config, tmp, bar)
        except BaseException as e:  # an interruption too: no half folder is left behind
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, WalklensError) or not isinstance(e, Exception):
                raise
            raise UnknownModelError(f"{gguf}: could not be loaded as a model ({first_line(e)})") from None
        finally:
            if bar is not None:
                bar.close()
    try:
        tmp.rename(target)
    except OSError:  # another process finished the same cache first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():
            raise


def _remove_abandoned(target: Path) -> None:
    """Remove the temporary folders of conversions of ``target`` whose process is gone (killed mid-way)."""
    for tmp in target.parent.glob(f"{target.name}.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        if not pid.isdecimal() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (PermissionError, OverflowError, ValueError):  # alive under another user, or no such pid
            continue


def _whole_only(arch: str) -> bool:
    """Whether transformers converts the GGUF architecture ``arch`` with its newer mapping (not per tensor here)."""
    try:
        from transformers.integrations.gguf.utils import is_gguf_arch_supported
    except ImportError:  # pragma: no cover - a transformers before the newer mapping converts every file per tensor
        return False
    return bool(is_gguf_arch_supported(arch))


def _save_metadata(where: dict[str, str], config: Any, model: Any, tmp: Path) -> None:
    """The config, generation config and tokenizer, as ``save_pretrained`` of the loaded model writes them."""
    import transformers

    config.architectures = [type(model).__name__]
    config.dtype = torch.float32
    config.save_pretrained(str(tmp))
    if model.can_generate():
        transformers.GenerationConfig.from_model_config(config).save_pretrained(str(tmp))
    transformers.AutoTokenizer.from_pretrained(**where).save_pretrained(str(tmp))


def _save_sharded(
    gguf: Path, arch: str, table: list[Stored], where: dict[str, str], config: Any, tmp: Path, bar: Any
) -> None:
    """Write the GGUF's tensors de-quantized to ``tmp``, one safetensors shard per layer (and one per tensor
    outside the layers), with the index, config and tokenizer."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )

    with torch.device("meta"):  # the model's names and ties, no weights
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _save_metadata(where, config, model, tmp)
    bar.update(1)
    # metadata only: the processor's config (the rest, the vocabulary above all, is let go at once)
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(
        config=load_gguf_checkpoint(str(gguf), return_tensors=False)["config"]
    )
    names = get_gguf_hf_weights_map(model, processor)
    tied = _tied_output(model)
    groups: dict[str, list[Stored]] = {}
    for t in table:
        found = _LAYER.match(t.name)
        groups.setdefault(found.group(0) if found else t.name, []).append(t)
    bar.total = len(table) + 2
    bar.refresh()
    weight_map: dict[str, str] = {}
    total = 0
    with open(gguf, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    written = 0
    try:
        for group in groups.values():
            shard = _convert_group(group, mapped, processor, names, bar.update)
            for name in tied:
                shard.pop(name, None)
            if shard:
                written += 1
                file = f"model-{written:05d}.safetensors"
                write_shard(shard, tmp / file)
                weight_map.update(dict.fromkeys(shard, file))
                total += sum(t.numel() * t.element_size() for t in shard.values())
            del shard
    finally:
        with contextlib.suppress(BufferError):  # a view an error's traceback still holds: closed when it goes
            mapped.close()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    bar.update(1)


def _convert_group(
    group: list[Stored], mapped: mmap.mmap, processor: Any, names: dict[str, str], advance: Callable[[int], Any]
) -> dict[str, torch.Tensor]:
    """One layer's GGUF tensors (or one tensor outside the layers) de-quantized, reshuffled by ``processor`` and
    named for transformers, as ``load_gguf_checkpoint`` does for each (tensors it does not map are dropped)."""
    made: dict[str, Any] = {"tensors": {}}  # where a processor puts what it joins (an MoE layer's experts)
    shard: dict[str, torch.Tensor] = {}
    for t in group:
        weights = dequantized(t, mapped)
        result = processor.process(weights=weights, name=t.name, tensor_key_mapping=names, parsed_parameters=made)
        if result.name in names:
            out = result.weights if result.weights is weights else np.copy(result.weights)
            shard[names[result.name]] = torch.from_numpy(out).to(torch.float32)
        del weights, result
        advance(1)
    shard.update(made["tensors"])
    return shard


def dequantized(tensor: Stored, mapped: mmap.mmap) -> np.ndarray:
    """A GGUF tensor de-quantized by ``gguf.quants.dequantize`` into a new array, in row blocks of about
    :data:`ROW_BLOCK_BYTES` (each row's blocks de-quantize on their own: the values equal one call on the whole
    tensor), its bytes read from ``mapped`` (the file, memory-mapped) and let go block by block."""
    from gguf.quants import dequantize

    raw = np.frombuffer(mapped, tensor.dtype, math.prod(tensor.shape), tensor.offset).reshape(tensor.shape)
    rows = raw.reshape(-1, raw.shape[-1])
    first = dequantize(rows[:1], tensor.tensor_type)
    out = np.empty((rows.shape[0], first.shape[-1]), dtype=first.dtype)
    step = max(1, ROW_BLOCK_BYTES // max(1, first.nbytes))
    row_bytes = rows.shape[1] * rows.itemsize
    for start in range(0, rows.shape[0], step):
        out[start : start + step] = dequantize(rows[start : start + step], tensor.tensor_type)
        _let_go(mapped, tensor.offset + start * row_bytes, min(step, rows.shape[0] - start) * row_bytes)
    return out.reshape(*raw.shape[:-1], first.shape[-1])


def _let_go(mapped: mmap.mmap, start: int, length: int) -> None:
    """Drop the pages of ``mapped`` in ``[start, start + length)`` from this process's memory (they stay in the page
    cache and fault back in if read again), where the platform can."""
    if not hasattr(mmap, "MADV_DONTNEED"):  # pragma: no cover - Linux has it
        return
    aligned = start - start % mmap.PAGESIZE
    mapped.madvise(mmap.MADV_DONTNEED, aligned, length + start - aligned)


def _tied_output(model: Any) -> set[str]:
    """The name of the output embedding when it is the input embedding (``save_pretrained`` drops it)."""
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if out is None or inp is None or out.weight is not inp.weight:
        return set()
    return {n for n, p in model.named_parameters(remove_duplicate=False) if p is out.weight} - {
        n for n, p in model.named_parameters() if p is out.weight
    }


def write_shard(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """One safetensors shard (safetensors writes from the tensors' memory: no second copy)."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


def _save_whole(where: dict[str, str], tmp: Path, bar: Any) -> None:
    """The GGUF at ``where`` loaded whole by transformers, de-quantized in float32, and saved to ``tmp`` as plain
    safetensors with its tokenizer (``bar`` advanced after the load and after the save)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(**where)
    q = transformers.AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    config = q.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(q.state_dict(), strict=False)
    plain.tie_weights()
    bar.update(1)
    plain.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    bar.update(1)


def gguf_cached(path: Path, cached: Path, progress: bool) -> Path:
    """The de-quantized cache folder ``cached`` of the ``.gguf`` at ``path``, made (once) when missing."""
    if not cached.is_dir():
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"{cached.parent}: cannot create the model cache ({e.strerror or e})") from None
        dequantize_gguf(path, cached, progress=progress)
    return cached


__all__ = ["Stored", "check_gguf", "read_table", "dequantize_gguf", "dequantized", "gguf_cached", "write_shard"]
