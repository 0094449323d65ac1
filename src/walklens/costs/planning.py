"""The plan of a run before it runs (``walklens plan``, :func:`plan`): from a model's config.json and its safetensors
headers alone (no tensor is read, no model is built), what a capture of a text would take: the weights' size in the
dtype, whether the model streams layer by layer under the memory budget, the peak memory, the trace's size on disk,
the bytes read from disk and an estimated time.

The same estimate gives the smallest budget a model runs in: layer by layer, its resident tensors (embeddings, final
norm, head) + its largest layer as read (views of the files' map) + transformers' converted copy of it where one is
made (a dtype cast, a fused conversion of the family) + the activations of the batch.  Every command checks it
before it loads a model (:func:`check_budget`, called by :func:`walklens.cli.common.load`), and checks its own
estimate after the load against the budget less what the model holds (:func:`model_memory`).  1 GB = 10^9 bytes.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import torch

from ..base.errors import InputError, UnknownModelError
from ..base.precision import check_device, dtype_name, model_label, parse_dtype
from ..core.capture import point_names, tokenize
from ..core.loading import model_config, model_source
from ..core.streaming import DTYPES, quiet_transformers, streams, weights_bytes
from ..models.base import Adapter
from ..models.checkpoint import Weights, check_model_files, read_weights
from . import GB, Shape, config_shape, fmt_bytes, forward_memory, forward_work, free_memory
from .calibration import DEFAULTS, Rates, rates

if TYPE_CHECKING:
    from ..core.loading import LoadedModel

#: the disk read rate the time estimate assumes (bytes per second): not measured, a plain SSD's order
DISK_RATE = 1e9
#: the text length a plan assumes when given neither a text nor a number of tokens
DEFAULT_TOKENS = 512
#: bytes of a recorded vector's number (capture records float32 by default)
RECORD_BYTES = 4


@dataclass(frozen=True)
class Files:
    """A model's files read without its weights: where it loads from, its config and adapter (None: a family
    without an adapter file) and its tensors' headers (None: no local safetensors)."""

    spec: str
    source: str
    kw: dict[str, Any]
    weights: Weights | None
    config: Any
    adapter: Adapter | None


def read_files(spec: str, progress: bool = False) -> Files:
    """``spec``'s config.json and safetensors headers, checked as :func:`walklens.core.loading.load_model` checks
    them (a GGUF or named model is de-quantized into the cache first, once, as every load does)."""

    if not isinstance(spec, str) or not spec.strip():
        raise UnknownModelError("no model given")
    source, folder, hub, kw = model_source(spec, progress)
    raw = check_model_files(folder, spec)
    weights = read_weights(folder, hub=hub)
    with quiet_transformers():
        config, adapter = model_config(source, kw, raw, weights, spec)
    return Files(spec, source, kw, weights, config, adapter)


# ---- the checkpoint by the part a streamed model reads it for --------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """A checkpoint's tensors by part: the resident ones (``""``) and each layer's, by the layer module's path
    (``model.layers.3``, as :class:`~walklens.core.streaming.LayerStream` names them), and how often a forward pass
    runs each layer (a shared layer, ALBERT's, once per depth)."""

    parts: dict[str, list[str]]
    runs: dict[str, int]


def _layer_of(key: str, stacks: Sequence[str]) -> str:
    """The layer path ``key`` lies under (``model.layers.3``), matching a stack's path or its tail (checkpoints may
    leave out the model's prefix: ``h.3`` for ``transformer.h``), else ``""`` (resident)."""
    for path in stacks:
        names = path.split(".")
        for i in range(len(names)):
            tail = ".".join(names[i:]) + "."
            if key.startswith(tail):
                index = key[len(tail) :].split(".", 1)[0]
                if index.isdigit():
                    return f"{path}.{index}"
    return ""


def layout(weights: Weights, adapter: Adapter | None, config: Any) -> Layout:
    """The :class:`Layout` of ``weights``: by the adapter's stacks, or (no adapter) by the longest numbered list."""
    if adapter is not None:
        stacks = sorted((s.layers for s in adapter.stacks), key=len, reverse=True)
        shared = {s.layers for s in adapter.stacks if s.shared_layer}
        depth = adapter.n_layers(config)
    else:
        numbered = weights.stacks()
        stacks = [max(numbered, key=lambda p: (len(numbered[p]), p))] if numbered else []
        shared, depth = set(), 1
    parts: dict[str, list[str]] = {"": []}
    for key in weights.entries:
        parts.setdefault(_layer_of(key, stacks), []).append(key)
    runs = {p: (depth if p.rpartition(".")[0] in shared else 1) for p in parts if p}
    return Layout(parts, runs)


def file_bytes(weights: Weights, keys: Sequence[str]) -> int:
    """The bytes of the tensors ``keys`` in the files (what reading them reads)."""
    return sum(weights.entries[k].end - weights.entries[k].begin for k in keys)


def dtype_bytes(weights: Weights, keys: Sequence[str], dtype: torch.dtype) -> int:
    """The bytes the tensors ``keys`` take loaded in ``dtype`` (:func:`walklens.core.streaming.weights_bytes`)."""
    part = {k: weights.entries[k] for k in keys}
    return weights_bytes(Weights({k: e.shape for k, e in part.items()}, part), dtype)


def converted_bytes(weights: Weights, keys: Sequence[str], dtype: torch.dtype, fused: bool) -> int:
    """The bytes of transformers' converted copy of the tensors ``keys`` loaded in ``dtype``: all of them where
    the family fuses tensors at load (``fused``), else those a cast changes; a tensor used as stored is a view of the
    files' map (:func:`walklens.core.streaming.read_tensor`) and takes no copy."""
    if fused:
        return dtype_bytes(weights, keys, dtype)
    cast_keys = [k for k in keys if (t := DTYPES.get(weights.entries[k].dtype)) is not None and t.is_floating_point
                 and t != dtype]  # fmt: skip
    return dtype_bytes(weights, cast_keys, dtype)


def _fuses(config: Any) -> bool:
    """Whether transformers converts this family's checkpoint tensors at load (a ``WeightConverter``: fused
    experts, fused projections), which makes a copy of a layer whatever the dtype."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter

    mapping = get_checkpoint_conversion_mapping(str(getattr(config, "model_type", "")))
    return any(isinstance(m, WeightConverter) for m in mapping or ())


def _largest_copy(weights: Weights, parts: Sequence[Sequence[str]], dtype: torch.dtype, config: Any) -> int:
    """The largest converted copy (:func:`converted_bytes`) of the layers whose tensors are ``parts``."""
    fused = _fuses(config)
    return max((converted_bytes(weights, keys, dtype, fused) for keys in parts), default=0)


def _copy(converted: int) -> str:
    return f"{fmt_bytes(converted)} converted" if converted else "used as stored: no copy"


def model_memory(lm: LoadedModel) -> int:
    """The bytes of the memory budget a loaded model holds: every weight in memory, or for a model streamed layer
    by layer its resident tensors and its largest layer in the model's dtype."""
    seen = {id(t): t for t in [*lm.model.parameters(), *lm.model.buffers()] if t.device.type != "meta"}
    held = sum(t.numel() * t.element_size() for t in seen.values())
    stream = lm.stream
    if stream is None:
        return held
    layers = (dtype_bytes(stream.weights, keys, stream.dtype) for p, keys in stream.sources.items() if p)
    return held + max(layers, default=0)


# ---- the plan ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class Plan:
    """What a capture of ``tokens`` tokens of ``model`` in ``dtype`` would take under a memory ``budget`` (GB; from
    ``budget_from``), from the files alone: the weights' bytes in the dtype (``weights``; ``files``: in the files),
    whether it ``streams``, the resident tensors and the largest layer in the dtype (``layer``; ``layer_file``: in
    the files), the capture's ``activations`` (its forward pass and trace), the ``peak`` memory and the
    ``smallest`` budget that runs it, the ``trace`` on disk (``points`` x ``tokens`` x ``width`` float32, for each of
    ``batch`` texts of ``tokens`` tokens run as one forward pass), the bytes ``read`` from disk (the load and one
    forward pass), the ``work`` (FLOP) and the ``seconds`` it takes at the ``rates`` named and ``disk_gbps``."""

    model: str
    dtype: str
    tokens: int
    budget: float
    budget_from: str
    weights: int
    files: int
    layers: int
    streams: bool
    resident: int
    layer: int
    layer_file: int
    activations: float
    converted: int  # the largest layer's converted copy: 0 where its tensors are used as stored
    peak: float
    smallest: float
    trace: int
    points: int
    width: int
    read: int
    work: float
    seconds: float
    rates: str
    batch: int = 1
    to_disk: bool = False
    disk_gbps: float = DISK_RATE / GB
    disk_from: str = "an assumed disk rate"
    write_gbps: float = DEFAULTS.write_gbps

    @property
    def fits(self) -> bool:
        """Whether the peak memory fits the budget."""
        return self.peak <= self.budget * GB

    def lines(self) -> list[str]:
        """The plan as text, one quantity a line."""
        how = (
            f"layer by layer: the resident tensors {fmt_bytes(self.resident)} stay, each layer is read as it runs "
            f"(the largest: {fmt_bytes(self.layer_file)} read, {_copy(self.converted)})"
            if self.streams
            else "in memory: the weights fit the budget"
        )
        reading = self.read / (self.disk_gbps * GB)
        writing = self.trace / (self.write_gbps * GB) if self.to_disk else 0.0
        texts = (
            f"{self.batch:,} texts of {self.tokens:,} tokens (one pass)"
            if self.batch > 1
            else f"{self.tokens:,} tokens"
        )
        return [
            f"plan of {self.model}: a capture of {texts} in {self.dtype}",
            f"  weights          {fmt_bytes(self.weights)} in {self.dtype} ({fmt_bytes(self.files)} in the files), "
            f"{self.layers} layers",
            f"  memory budget    {self.budget:g} GB ({self.budget_from})",
            f"  runs             {how}",
            f"  peak memory      ~{fmt_bytes(self.peak)} (activations and trace ~{fmt_bytes(self.activations)})",
            f"  smallest budget  ~{fmt_bytes(self.smallest)}",
            f"  trace on disk    {fmt_bytes(self.trace)}: {self.points} points x {self.batch * self.tokens:,} tokens x "
            f"{self.width} x {RECORD_BYTES} bytes"
            + (", written as computed (one point in memory)" if self.to_disk else ", held in memory"),
            f"  read from disk   {fmt_bytes(self.read)}: "
            + ("the files once, the resident tensors at load, each layer as it runs" if self.streams else "at load"),
            f"  estimated time   ~{self.seconds:.3g} s",
            f"    reading        {reading:.3g} s at {self.disk_gbps:.3g} GB/s ({self.disk_from})",
            *(
                [f"    writing        {writing:.3g} s: the trace at {self.write_gbps:.3g} GB/s ({self.disk_from})"]
                if self.to_disk
                else []
            ),
            f"    computing      {self.seconds - reading - writing:.3g} s: {self.work / 1e12:.3g} TFLOP at "
            f"{self.rates}",
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    __repr__ = __str__


@dataclass(frozen=True)
class _Run:
    """What a plan is asked: the dtype, the device, the budget (GB) and where it comes from, the streaming choice,
    the text's tokens and the points captured (None: every point; an empty list: no trace)."""

    dtype: torch.dtype
    device: torch.device
    budget: float
    budget_from: str
    stream: bool | None
    tokens: int
    points: Sequence[str] | None
    batch: int = 1
    rates: Rates | None = None
    to_disk: bool = False


def _selected(names: list[str], patterns: Sequence[str] | None) -> list[str]:
    """The points ``capture(points=patterns)`` records (``final`` always kept)."""
    if patterns is None:
        return names
    keep = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    return keep + (["final"] if patterns and "final" not in keep else [])


def _trace_points(files: Files, layers: int, patterns: Sequence[str] | None) -> int:
    """The points a capture records over every stack."""
    if files.adapter is None:
        return len(_selected(["embed", *(f"L{i}.{p}" for i in range(layers) for p in _PRE_NORM), "final"], patterns))
    residual = files.adapter.residual_kind(files.config)
    return sum(len(_selected(point_names(s, residual, layers), patterns)) for s in files.adapter.stacks)


_PRE_NORM = ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")  # a pre-norm decoder layer's points


def _rates_used(given: Rates | None, dtype: torch.dtype) -> tuple[Rates, float, str, str]:
    """The rates a plan counts at (``given``, else this machine's calibrated ones), the matmul rate of ``dtype``
    (GFLOP/s: bfloat16's own, else float32's), and where the matmul rate and the disk rate come from."""
    r = rates() if given is None else given
    gflops = r.bf16_gflops if dtype == torch.bfloat16 else r.matmul_gflops
    kind = "bfloat16" if dtype == torch.bfloat16 else "float32"
    if given is not None:
        return r, gflops, f"{gflops:.3g} GFLOP/s ({kind} matrix products, given)", "given"
    source = "shipped default; walklens calibrate measures this machine's" if r is DEFAULTS else "walklens calibrate"
    disk = "walklens calibrate --disk" if r.disk_gbps != DEFAULTS.disk_gbps else "an assumed disk rate"
    return r, gflops, f"{gflops:.3g} GFLOP/s ({kind} matrix products, {source})", disk


def _capture_costs(files: Files, run: _Run, sh: Shape) -> tuple[int, int, float, float]:
    """The points, the trace's bytes, the activations' peak bytes and the work of ``run``'s forward pass: a capture
    stops after its last point (the final norm), so the head never runs; a trace folder holds one point."""
    T, B = run.tokens, run.batch
    capture = run.points != []
    points = _trace_points(files, sh.layers, run.points) if capture else 0
    trace = points * B * T * sh.d_model * RECORD_BYTES
    held = min(trace, B * T * sh.d_model * RECORD_BYTES) if run.to_disk else trace
    head_memory, head_work = (T * sh.vocab * 4, 2 * T * sh.vocab * sh.d_model) if capture else (0, 0)
    return points, trace, B * (forward_memory(sh, T) - head_memory) + held, B * (forward_work(sh, T) - head_work)


def _estimate(files: Files, run: _Run) -> Plan:
    """The :class:`Plan` of ``run`` on ``files`` (whose weights are known)."""
    weights = cast(Weights, files.weights)
    lay = layout(weights, files.adapter, files.config)
    layers = [p for p in lay.parts if p]
    all_keys = list(weights.entries)
    sh = config_shape(
        files.config,
        files.adapter,
        vocab=int(getattr(files.config, "vocab_size", 0) or 0),
        params=sum(_numel(e.shape) for e in weights.entries.values()),
        width=0,
    )
    points, trace, activations, work = _capture_costs(files, run, sh)
    whole = weights_bytes(weights, run.dtype)
    resident = dtype_bytes(weights, lay.parts[""], run.dtype)
    layer = max((dtype_bytes(weights, lay.parts[p], run.dtype) for p in layers), default=0)
    layer_file = max((file_bytes(weights, lay.parts[p]) for p in layers), default=0)
    converted = _largest_copy(weights, [lay.parts[p] for p in layers], run.dtype, files.config)
    streamed = streams(run.stream, run.budget, weights, files.adapter, run.dtype, run.device, files.spec)
    streamed_peak = resident + layer_file + converted + activations
    in_memory_peak = whole + activations
    read = (
        file_bytes(weights, lay.parts[""]) + sum(file_bytes(weights, lay.parts[p]) * lay.runs[p] for p in layers)
        if streamed
        else file_bytes(weights, all_keys)
    )
    r, gflops, rate_text, disk_from = _rates_used(run.rates, run.dtype)
    return Plan(
        model=model_label(files.spec, run.dtype),
        dtype=dtype_name(run.dtype),
        tokens=run.tokens,
        budget=run.budget,
        budget_from=run.budget_from,
        weights=whole,
        files=file_bytes(weights, all_keys),
        layers=sh.layers,
        streams=streamed,
        resident=resident,
        layer=layer,
        layer_file=layer_file,
        converted=converted,
        activations=activations,
        peak=streamed_peak if streamed else in_memory_peak,
        smallest=_smallest(files, run, in_memory_peak, streamed_peak, whole),
        trace=trace,
        points=points,
        width=sh.d_model,
        read=read,
        work=work,
        seconds=read / (r.disk_gbps * GB)
        + work / (gflops * 1e9)
        + (trace / (r.write_gbps * GB) if run.to_disk else 0.0),
        rates=rate_text,
        batch=run.batch,
        to_disk=run.to_disk,
        disk_gbps=r.disk_gbps,
        disk_from=disk_from,
        write_gbps=r.write_gbps,
    )


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _can_stream(files: Files, run: _Run) -> bool:
    """Whether the model can run layer by layer (the conditions of :func:`walklens.core.streaming.streams`)."""
    return files.weights is not None and files.adapter is not None and run.device.type == "cpu"


def _smallest(files: Files, run: _Run, in_memory: float, streamed: float, weights: int) -> float:
    """The smallest budget (bytes) that runs it: layer by layer, or in memory (where the budget decides, only
    from 1.1 x the weights up: below, the model streams)."""
    if run.stream is True:
        return streamed
    memory = in_memory if run.stream is False else max(in_memory, 1.1 * weights)
    return min(memory, streamed) if run.stream is None and _can_stream(files, run) else memory


def refusal(p: Plan, what: str) -> str | None:
    """The one line refusing a run whose peak memory exceeds the budget, naming the smallest budget that would
    do; None when it fits."""
    if p.fits:
        return None
    act = fmt_bytes(p.activations)
    how = (
        f"layer by layer: the resident tensors {fmt_bytes(p.resident)} + the largest layer read "
        f"{fmt_bytes(p.layer_file)} ({_copy(p.converted)}) + activations {act}"
        if p.streams
        else f"in memory: the weights {fmt_bytes(p.weights)} + activations {act}"
    )
    hint = " with --stream" if not p.streams and p.smallest < p.budget * GB else ""
    return (
        f"{p.model}: {what} would need ~{fmt_bytes(p.peak)} of memory ({how}), over --max-memory {p.budget:g}; "
        f"the smallest budget that runs it is ~{fmt_bytes(p.smallest)}{hint}"
    )


def _run(
    dtype: str | torch.dtype, device: str | torch.device, max_memory: float | None, stream: bool | None
) -> tuple[torch.dtype, torch.device, float, str, bool | None]:
    """The dtype, the device and the budget (GB) checked, and where the budget comes from."""
    dt, dev = parse_dtype(dtype), check_device(device)
    if max_memory is None:
        return dt, dev, free_memory(), "the memory free now", stream
    if isinstance(max_memory, bool) or not isinstance(max_memory, (int, float)) or not 0 < max_memory < float("inf"):
        raise InputError(f"max_memory must be a positive number of GB, not {max_memory!r}")
    return dt, dev, float(max_memory), "--max-memory", stream


def _tokens(files: Files, text: str | None, tokens: int | None) -> int:
    """The length planned for: ``tokens``, or ``text`` tokenised by the model's tokenizer as capture does."""
    import transformers

    if text is not None and tokens is not None:
        raise InputError("give a text or a number of tokens, not both")
    if text is None:
        n = DEFAULT_TOKENS if tokens is None else tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"tokens must be a whole number of at least 1, not {n!r}")
        return n
    with quiet_transformers():
        try:
            tok = transformers.AutoTokenizer.from_pretrained(files.source, **files.kw)
        except Exception as e:
            raise UnknownModelError(f"{files.spec!r}: the tokenizer could not be loaded ({str(e)[:200]})") from None
    # capture's own tokenisation (its refusals too): it reads only the tokenizer and the config
    files_lm = SimpleNamespace(tokenizer=tok, model=SimpleNamespace(config=files.config))
    return int(tokenize(cast("LoadedModel", files_lm), text).shape[1])


def plan(
    spec: str,
    *,
    text: str | None = None,
    tokens: int | None = None,
    dtype: str | torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    max_memory: float | None = None,
    stream: bool | None = None,
    points: Sequence[str] | None = None,
    batch: int = 1,
    rates: Rates | None = None,
    to_disk: bool = False,
) -> Plan:
    """The :class:`Plan` of capturing ``text`` (or ``tokens`` tokens; default :data:`DEFAULT_TOKENS`) with ``spec``
    in ``dtype`` under a budget of ``max_memory`` GB (the whole process, weights included; default the memory free
    now), from config.json and the safetensors headers alone: no tensor is read, no model built.  ``stream`` as
    :func:`~walklens.core.loading.load_model` takes it; ``points``: capture's patterns (None: every point);
    ``batch``: that many texts of that length in one forward pass (``capture_batch``); ``to_disk``: the trace goes
    to a trace folder as it is computed (``to=DIR``, ``--trace-dir``: one point in memory at a time); ``rates``: the
    machine's rates to count time at (default: ``walklens calibrate``'s).  A capture stops after its last point:
    the head's logits are neither computed nor counted.  A run the budget cannot hold is refused in one line naming
    the smallest budget that would do."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InputError(f"batch must be a whole number of at least 1, not {batch!r}")
    dt, dev, budget, source, stream = _run(dtype, device, max_memory, stream)
    files = read_files(spec)
    if files.weights is None:
        raise InputError(
            f"{spec}: no safetensors weights (model.safetensors or model.safetensors.index.json) to plan from"
        )
    n = _tokens(files, text, tokens)
    pts = None if points is None else list(points)
    got = _estimate(files, _Run(dt, dev, budget, source, stream, n, pts, batch, rates, bool(to_disk)))
    message = refusal(got, f"a capture of {batch:,} x {n:,} tokens" if batch > 1 else f"a capture of {n:,} tokens")
    if message:
        raise InputError(message)
    return got


def check_budget(
    spec: str, max_memory: float, *, dtype: str | torch.dtype, device: str | torch.device, stream: bool | None
) -> None:
    """Refuse, before loading ``spec``, a budget of ``max_memory`` GB that cannot hold it with the activations of
    one token (the commands' own estimates, checked after the load, bound their texts): one line naming the
    smallest budget that would do.  A model without local safetensors is left to the load."""
    dt, dev, budget, source, stream = _run(dtype, device, max_memory, stream)
    files = read_files(spec)
    if files.weights is None:
        return
    message = refusal(_estimate(files, _Run(dt, dev, budget, source, stream, 1, [])), "loading it")
    if message:
        raise InputError(message)


__all__ = [
    "DEFAULT_TOKENS",
    "DISK_RATE",
    "Files",
    "Layout",
    "Plan",
    "check_budget",
    "dtype_bytes",
    "file_bytes",
    "layout",
    "model_memory",
    "plan",
    "read_files",
    "refusal",
]
