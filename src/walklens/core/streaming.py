"""Models larger than memory: the layers' weights read from the safetensors files when a layer runs, released after.

A streamed model is the model's own module tree built with its parameters on the ``meta`` device (buffers real:
accelerate's ``init_empty_weights``), so nothing of its weights is allocated. What is outside the layers (the
embedding, the final norm, the head, the rotary tables) is read once and stays. Each layer of each stack gets a
forward pre-hook that reads its tensors from the checkpoint (views of a private memory map of the bytes the
safetensors header locates, as ``from_pretrained``'s tensors are views of a map of the whole file, cast to the
model's dtype as it casts them; only the layer that runs is mapped, and the resident tensors are read into memory)
and a hook after its forward that puts them back on ``meta``, which unmaps them. One forward pass of a batch runs
every sequence through layer ``l`` before layer ``l + 1``, so each weight is read from disk once per batch,
whatever the batch holds. While a layer runs, the kernel is asked to bring the next one's byte ranges into the page
cache (``posix_fadvise(WILLNEED)``, from a background thread): its disk reads overlap this layer's compute, take no
memory of the process and are not read twice. The model's forward pass itself is the model's own: the same modules,
the same kernels, the same weights' values, so a streamed pass equals the in-memory pass bit for bit (tested on
every family, float32 and bfloat16).

Written here rather than taken from accelerate's disk offload because that path copies weights that need a cast or
a conversion into an offload folder first, and walklens must plan a run from the files alone (bytes read, peak
memory: :mod:`walklens.costs`) and count what it reads.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..base.errors import InputError
from ..base.hooks import Hooks
from ..models.base import Adapter, get_module
from ..models.checkpoint import Entry, Weights

if TYPE_CHECKING:
    from pathlib import Path

#: safetensors dtype names -> torch dtypes (the ones model weights use)
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass
class StreamStats:
    """What a streamed model has read: bytes and tensors from the files, layers loaded (a layer loaded once per
    forward pass), and the most bytes of layer weights held at once."""

    bytes_read: int = 0
    tensors_read: int = 0
    layers_loaded: int = 0
    peak_layer_bytes: int = 0


def read_tensor(entry: Entry, dtype: torch.dtype | None, name: str, mapped: bool = False) -> torch.Tensor:
    """The tensor ``entry`` locates, cast to ``dtype`` (None: kept): read with plain reads into fresh memory, or
    with ``mapped`` a view of a private memory map of its bytes (no copy: they stay in the page cache, copied only
    if written; unmapped when the tensor is freed)."""
    stored = DTYPES.get(entry.dtype)
    if stored is None:
        raise InputError(
            f"{entry.path}: the tensor {name[:80]!r} is stored as {entry.dtype}, which walklens cannot read"
        )
    n = entry.end - entry.begin
    if math.prod(entry.shape) * stored.itemsize != n:
        raise InputError(f"{entry.path}: the tensor {name[:80]!r} holds {n:,} bytes, not what its shape needs")
    # At the file offset's alignment, as a memory map of the file puts it: kernels may sum in another order at
    # another alignment, and the in-memory model's tensors are views of such a map.
    with open(entry.path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size < entry.end:  # refused before a map could fault past the end
            raise InputError(f"{entry.path}: ends inside the tensor {name[:80]!r} (truncated?)")
        if mapped and n:
            start = entry.begin - entry.begin % mmap.ALLOCATIONGRANULARITY
            view = mmap.mmap(f.fileno(), entry.end - start, access=mmap.ACCESS_COPY, offset=start)
            raw = torch.frombuffer(view, dtype=torch.uint8, offset=entry.begin - start, count=n)
        else:
            shift = entry.begin % 64
            raw = torch.empty(n + 64, dtype=torch.uint8)[shift : shift + n]
            _read_into(f, entry.begin, raw, f"{entry.path}: ends inside the tensor {name[:80]!r} (truncated?)")
    t = raw.view(stored).reshape(entry.shape)
    return t if dtype is None or dtype == stored or not t.is_floating_point() else t.to(dtype)


def _read_into(f: Any, offset: int, raw: torch.Tensor, short: str) -> None:
    """Fill the uint8 tensor ``raw`` from the file ``f`` at ``offset`` (``short``: the error if the file ends)."""
    f.seek(offset)
    view = memoryview(cast(Any, raw.numpy())).cast("B")
    got = 0
    while got < raw.numel():
        k = f.readinto(view[got:])
        if not k:
            raise InputError(short)
        got += k


@dataclass
class LayerStream:
    """The streamed weights of one model: the checkpoint tensors each layer is built from (by the layer's module
    path), the resident ones, and what has been read (:class:`StreamStats`).

    A layer is loaded by transformers' own loader (``convert_and_load_state_dict_in_model``) from just that
    layer's tensors, so each family's renamings, fused experts and dtype plan apply exactly as ``from_pretrained``
    applies them."""

    model: nn.Module
    weights: Weights
    dtype: torch.dtype
    layers: dict[str, nn.Module]
    sources: dict[str, list[str]]  # layer path ("" for the resident part) -> its checkpoint tensors
    stats: StreamStats = field(default_factory=StreamStats)
    hooks: Hooks = field(default_factory=Hooks)
    #: weight edits by layer path: (parameter name inside the layer, delta), added each time the layer is read
    edits: dict[str, list[tuple[str, torch.Tensor]]] = field(default_factory=dict)
    #: advise the kernel to read the next layer ahead while one runs (:meth:`advise_next`)
    prefetch: bool = True
    _held: dict[str, int] = field(default_factory=dict)

    def _read(self, part: str) -> int:
        """Read ``part``'s tensors into the model; the bytes they take there."""
        from transformers.core_model_loading import convert_and_load_state_dict_in_model
        from transformers.modeling_utils import LoadStateDictConfig

        state = {}
        for key in self.sources[part]:
            entry = self.weights.entries[key]
            # a layer's tensors are views of the map (no copy out of the page cache; unmapped at release); the
            # resident ones are read into memory once, where the budget counts them
            state[key] = read_tensor(entry, None, key, mapped=bool(part))
            self.stats.bytes_read += entry.end - entry.begin
            self.stats.tensors_read += 1
        model: Any = self.model
        config = LoadStateDictConfig(
            dtype=self.dtype, dtype_plan=model._get_dtype_plan(self.dtype), weight_mapping=_mapping(model)
        )
        with quiet_transformers():
            info, _ = convert_and_load_state_dict_in_model(model, state, config)
        if info.conversion_errors or info.mismatched_keys:
            what = next(iter(info.conversion_errors or info.mismatched_keys))
            raise InputError(f"the checkpoint's tensors for {part or 'the embedding and head'} do not load ({what})")
        module = self.layers[part] if part else self.model
        return sum(t.numel() * t.element_size() for t in _tensors(module) if t.device.type != "meta")

    def load(self, layer: str) -> None:
        """Read ``layer``'s tensors (once while held: a nested or repeated hold reads nothing more)."""
        self._held[layer] = self._held.get(layer, 0) + 1
        if self._held[layer] > 1:
            return
        held = self._read(layer)
        with torch.no_grad():
            for name, delta in self.edits.get(layer, ()):
                p = self.layers[layer].get_parameter(name)
                p.add_(delta.to(dtype=p.dtype, device=p.device))
        self.stats.layers_loaded += 1
        self.stats.peak_layer_bytes = max(self.stats.peak_layer_bytes, held)
        self.advise_next(layer)

    def advise_next(self, layer: str) -> None:
        """Ask the kernel to read the layer after ``layer`` (the first after the last: the next pass, the next
        token) into the page cache now, in a background thread, so that its disk reads overlap ``layer``'s compute.
        Advice only: it reads nothing into the process, and where the system has no ``posix_fadvise`` it does
        nothing."""
        if not self.prefetch or not hasattr(os, "posix_fadvise"):
            return
        order = list(self.layers)
        following = order[(order.index(layer) + 1) % len(order)]
        spans: dict[Path, list[tuple[int, int]]] = {}
        for key in self.sources[following]:
            entry = self.weights.entries[key]
            spans.setdefault(entry.path, []).append((entry.begin, entry.end))
        _advisor().submit(_advise, spans)

    def release(self, layer: str) -> None:
        """Put ``layer``'s tensors back on ``meta`` when its last hold ends."""
        self._held[layer] = self._held.get(layer, 1) - 1
        if self._held[layer] > 0:
            return
        for module in self.layers[layer].modules():
            for name, p in list(module._parameters.items()):
                if p is not None:
                    module._parameters[name] = nn.Parameter(p.to("meta"), requires_grad=False)
            for name in list(module._buffers):
                b = module._buffers[name]
                if b is not None and name not in module._non_persistent_buffers_set:
                    module._buffers[name] = b.to("meta")
        _trim()

    @contextmanager
    def edited(self, layer: str, name: str, delta: torch.Tensor) -> Iterator[None]:
        """``delta`` added to ``layer``'s parameter ``name`` each time the layer is read, inside the block (as
        :func:`~walklens.core.interventions.edit_weights` adds it in memory); released, the edit is gone with the
        weights, and the files are never written.  Refused while the layer is held (its weights already read)."""
        if self._held.get(layer, 0) > 0:
            raise InputError(f"{layer}: cannot edit a streamed layer's weights while they are held")
        if name not in dict(self.layers[layer].named_parameters()):
            raise InputError(f"{layer}: no parameter {name[:80]!r} to edit")
        entry = (name, delta.detach())
        self.edits.setdefault(layer, []).append(entry)
        try:
            yield
        finally:
            self.edits[layer] = [e for e in self.edits[layer] if e is not entry]
            if not self.edits[layer]:
                del self.edits[layer]

    def path_of(self, module: nn.Module) -> str:
        """The path of the layer module ``module`` (a streamed layer)."""
        return next(path for path, m in self.layers.items() if m is module)

    @contextmanager
    def held(self, layer: str) -> Iterator[None]:
        """``layer``'s weights in memory for the block (an analysis reading them)."""
        self.load(layer)
        try:
            yield
        finally:
            self.release(layer)

    def attach(self) -> None:
        """Hooks on each layer module: read before its forward, release after (even when the forward fails)."""
        for path, module in self.layers.items():
            self.hooks.pre(module, lambda m, args, p=path: self.load(p))
            self.hooks.post(module, lambda m, args, out, p=path: self.release(p), always=True)

    def layer_bytes(self) -> int:
        """The most bytes one layer's tensors take in the files."""
        return max((self.file_bytes(p) for p in self.layers), default=0)

    def resident_file_bytes(self) -> int:
        """The bytes of the resident tensors (embedding, final norm, head) in the files."""
        return self.file_bytes("")

    def file_bytes(self, part: str) -> int:
        return sum(self.weights.entries[k].end - self.weights.entries[k].begin for k in self.sources[part])


def merged_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Byte ranges ``(begin, end)`` sorted, with touching or overlapping ones joined."""
    out: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if out and begin <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((begin, end))
    return out


def _advise(spans: dict[Path, list[tuple[int, int]]]) -> None:
    """``posix_fadvise(WILLNEED)`` on each file's joined byte ranges; a file that cannot be opened is skipped (the
    read that follows reports it)."""
    for path, ranges in spans.items():
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            for begin, end in merged_spans(ranges):
                os.posix_fadvise(fd, begin, end - begin, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


@functools.cache
def _advisor() -> ThreadPoolExecutor:
    """The one thread that gives the kernel read-ahead advice (:meth:`LayerStream.advise_next`)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="walklens-read-ahead")


def _trim() -> None:
    """Give the freed heap back to the system (glibc's ``malloc_trim``): a layer's smaller tensors live on the
    heap, and without it each layer released leaves tens of MB the next cannot reuse (measured: 14B-shaped,
    ~35 MB a layer).  Nothing where the C library has no such call."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """Every distinct parameter and buffer of ``module``."""
    seen: dict[int, torch.Tensor] = {}
    for t in [*module.parameters(), *module.buffers()]:
        seen.setdefault(id(t), t)
    return list(seen.values())


def _mapping(model: Any) -> list[Any]:
    """transformers' weight renamings and conversions for this model (what ``from_pretrained`` applies)."""
    from transformers.modeling_utils import get_model_conversion_mapping  # type: ignore[attr-defined]  # not in its __all__

    return list(get_model_conversion_mapping(model, None, None) or [])


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars, info logs, config warnings or hub retry messages during a load: a load either works
    or ends in one error line."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    bars, level, hub_level = (
        hf_logging.is_progress_bar_enabled(),
        hf_logging.get_verbosity(),
        hub_logging.get_verbosity(),
    )
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        hub_logging.set_verbosity(hub_level)
        if bars:
            hf_logging.enable_progress_bar()


def layer_modules(model: nn.Module, adapter: Adapter) -> dict[str, nn.Module]:
    """Every layer module of every stack, by its path in the module tree (``model.layers.3``)."""
    found: dict[str, nn.Module] = {}
    for stack in adapter.stacks:
        layers: Any = get_module(model, stack.layers)
        for i, module in enumerate(layers):
            found[f"{stack.layers}.{i}"] = module
    return found


def _sources(model: Any, weights: Weights, layers: dict[str, nn.Module], label: str) -> dict[str, list[str]]:
    """Each checkpoint tensor by the part it builds: the layer its name (renamed and converted as transformers
    loads it) lies under, or ``""`` (resident).  A model parameter no tensor builds is refused in one line."""
    from transformers.core_model_loading import WeightConverter, rename_source_key

    mapping = _mapping(model)
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    renamings = [m for m in mapping if not isinstance(m, WeightConverter)]
    meta = dict(model.state_dict())
    prefixes = sorted(layers, key=len, reverse=True)
    out: dict[str, list[str]] = {"": [], **{p: [] for p in layers}}
    built: set[str] = set()
    for key in weights.entries:
        target, _ = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
        built.add(target)
        out[next((p for p in prefixes if target.startswith(p + ".")), "")].append(key)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    missing = sorted(n for n, _ in model.named_parameters(remove_duplicate=False) if n not in built and n not in tied)
    if missing:
        raise InputError(
            f"{label}: no tensor of the checkpoint builds the model's {missing[0]!r}; streaming refuses it"
        )
    return out


def _init_buffers(model: Any) -> None:
    """The buffers no checkpoint holds (sin/cos tables, rotary frequencies) computed as ``from_pretrained``
    computes them: by the family's own ``_init_weights``, every other tensor marked as loaded so it is left alone."""
    for module in model.modules():
        module._is_hf_initialized = False  # (from_config initialised them all once)
        for name, t in [*module._parameters.items(), *module._buffers.items()]:
            if t is not None and name not in module._non_persistent_buffers_set:
                t._is_hf_initialized = True
    model.initialize_weights()


def _check_fit(model: Any, weights: Weights, dtype: torch.dtype, label: str) -> None:
    """Refuse, before anything is read, a checkpoint whose tensors do not fit the model the config builds (a tensor
    of another shape, one no parameter takes, one a conversion cannot fuse): transformers' loader run on ``meta``
    tensors of the headers' shapes (nothing read, nothing allocated), the checks ``from_pretrained`` makes."""
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_utils import LoadStateDictConfig

    entries = weights.entries.items()
    state = {k: torch.empty(e.shape, dtype=DTYPES.get(e.dtype, dtype), device="meta") for k, e in entries}
    config = LoadStateDictConfig(
        dtype=dtype, dtype_plan=model._get_dtype_plan(dtype), weight_mapping=_mapping(model), device_map={"": "meta"}
    )
    with quiet_transformers():
        info, _ = convert_and_load_state_dict_in_model(model, state, config)
    if info.mismatched_keys:
        name, got, want = sorted(info.mismatched_keys, key=str)[0]
        raise InputError(
            f"{label}: the checkpoint's tensor for {name[:80]!r} has shape {list(got)}, the config makes it "
            f"{list(want)} ({len(info.mismatched_keys)} such); streaming refuses it"
        )
    if info.conversion_errors:
        what = sorted(info.conversion_errors)[0]
        raise InputError(f"{label}: the checkpoint's tensors for {what[:80]!r} do not fit the config's model")
    if info.unexpected_keys:
        what = sorted(info.unexpected_keys)[0]
        raise InputError(f"{label}: the checkpoint's tensor {what[:80]!r} fits no parameter of the config's model")


def stream_weights(model: nn.Module, adapter: Adapter, weights: Weights, dtype: torch.dtype, label: str) -> LayerStream:
    """Stream ``model`` (built with its parameters on ``meta``): the tensors checked against the config first, the
    resident ones read now, each layer's when it runs (hooks on each layer's module)."""
    layers = layer_modules(model, adapter)
    out = LayerStream(model, weights, dtype, layers, _sources(model, weights, layers, label))
    _check_fit(model, weights, dtype, label)
    out._read("")
    hf = cast(Any, model)
    hf.tie_weights()  # the head that shares the embedding's tensor takes the one just read
    _init_buffers(hf)
    out.attach()
    return out


def skeleton(model_class: Any, config: Any, dtype: torch.dtype) -> Any:
    """The model's module tree with its parameters on ``meta`` and its buffers real (the rotary tables)."""
    from accelerate import init_empty_weights  # type: ignore[import-untyped]  # accelerate ships no stubs

    with init_empty_weights(include_buffers=False):
        model = model_class.from_config(config, dtype=dtype, attn_implementation="eager")
    model.tie_weights()  # outside: inside, each parameter registered is a new one (the tie would not hold)
    return model.eval()


def weights_bytes(weights: Weights, dtype: torch.dtype) -> int:
    """The bytes a checkpoint's floating-point tensors take in ``dtype`` (its other tensors as stored)."""
    size = torch.empty((), dtype=dtype).element_size()
    total = 0
    for entry in weights.entries.values():
        stored = DTYPES.get(entry.dtype)
        n = math.prod(entry.shape)
        total += n * (size if stored is None or stored.is_floating_point else stored.itemsize)
    return total


def streams(
    stream: bool | None,
    max_memory: float | None,
    weights: Weights | None,
    adapter: Adapter | None,
    dtype: torch.dtype,
    device: torch.device,
    spec: str,
) -> bool:
    """Whether the model streams: ``stream`` when given, else whether its weights in ``dtype`` (and a tenth more
    for the work) exceed ``max_memory`` GB or the memory free now; a model that cannot stream is refused when
    ``stream`` asks for it."""
    if stream is False:
        return False
    if stream is None:
        budget = available_memory() if max_memory is None else int(max_memory * 2**30)
        if weights is None or weights_bytes(weights, dtype) * 1.1 <= budget:
            return False
    why = (
        "its weights are not local safetensors files"
        if weights is None
        else "its family has no adapter file (a derived adapter is confirmed on weights in memory)"
        if adapter is None
        else "streaming runs on the CPU"
        if device.type != "cpu"
        else ""
    )
    if why:
        raise InputError(f"{spec}: cannot stream the model layer by layer: {why}")
    return True


def available_memory() -> int:
    """The bytes of memory this process may use: MemAvailable of /proc/meminfo, or a cgroup's limit below it."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit() and int(text) < 2**60:
                found.append(int(text))
        except OSError:
            continue
    return min(found) if found else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


__all__ = [
    "DTYPES",
    "LayerStream",
    "StreamStats",
    "available_memory",
    "read_tensor",
    "skeleton",
    "stream_weights",
    "quiet_transformers",
    "streams",
    "weights_bytes",
]
