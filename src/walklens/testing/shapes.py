"""Models of real shapes with random weights, written shard by shard (for tests and benchmarks at scale).

:func:`write_real_shape` writes a folder that loads like the real checkpoint (``config.json`` with its published
values, ``model-0000k-of-0000n.safetensors`` shards under ``model.safetensors.index.json``, the tensor names and
shapes ``from_pretrained`` expects) but whose weights are seeded random numbers, with the default model's
tokenizer.  The model is never held in memory: the parameter list comes from a model built on the meta device,
and each shard's tensors are generated, saved and dropped before the next shard's.  Every tensor comes from its
own seed (a hash of the seed, its name and a block number), so any tensor can be made again alone
(:func:`real_shape_tensor`) and the files hold the same numbers whatever the shard size.

Random weights say nothing about what a trained model does: these models exercise memory, time and exactness
only (docs/shapes.md).

    python -m walklens.testing.shapes llama-3.1-8b /data/llama-3.1-8b --dtype bfloat16
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..base.errors import InputError, WalklensError
from ..base.precision import dtype_name, parse_dtype

_LLAMA_3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 128256,
}

_QWEN3_14B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 17408,
    "max_position_embeddings": 40960,
    "max_window_layers": 40,
    "model_type": "qwen3",
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

_GEMMA_2_9B: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "tie_word_embeddings": True,
    "use_cache": True,
    "vocab_size": 256000,
}

_QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

#: The published ``config.json`` of each checkpoint (its ``torch_dtype`` and ``transformers_version`` left out: the
#: writer sets the first), by short name.
REAL_SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": _LLAMA_3_1_8B,
    "qwen3-14b": _QWEN3_14B,
    "gemma-2-9b": _GEMMA_2_9B,
    "qwen3-30b-a3b": _QWEN3_30B_A3B,
}
#: Where each shape's values come from (the hub repository whose config.json they copy).
SOURCES: dict[str, str] = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "qwen3-14b": "Qwen/Qwen3-14B",
    "gemma-2-9b": "google/gemma-2-9b",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
}

#: Elements per seeded block of a tensor (a tensor is its blocks in order; each block has its own seed).
BLOCK = 1 << 22
#: The tokenizer files copied from the default model.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True)
class Spec:
    """One tensor of a checkpoint: its name, shape and how the model initialises it (``normal`` with standard
    deviation ``value``, or ``constant`` ``value``)."""

    name: str
    shape: tuple[int, ...]
    init: str
    value: float

    def nbytes(self, dtype: torch.dtype) -> int:
        return math.prod(self.shape) * dtype.itemsize


def real_shape_config(
    name: str, layers: int | None = None, config_overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The config dict written for ``name``: its published values, ``num_hidden_layers=layers`` when given (the
    first ``layers`` layers), then ``config_overrides`` (a shrunken width for tests)."""
    if name not in REAL_SHAPES:
        raise InputError(f"unknown real shape {name!r}; use one of: {', '.join(REAL_SHAPES)}")
    config = copy.deepcopy(REAL_SHAPES[name])
    if layers is not None:
        full = config["num_hidden_layers"]
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= full:
            raise InputError(f"layers must be a whole number from 1 to {full} for {name}, not {layers!r}")
        config["num_hidden_layers"] = layers
    config.update(copy.deepcopy(config_overrides or {}))
    return config


def _hf_config(config: dict[str, Any]) -> Any:
    import transformers

    rest = {k: v for k, v in config.items() if k != "model_type"}
    with _quiet():
        return transformers.AutoConfig.for_model(config["model_type"], **rest)


@contextmanager
def _quiet() -> Iterator[None]:
    """transformers' info and warning logs silenced for the duration."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def meta_model(config: dict[str, Any]) -> Any:
    """The causal LM of ``config`` built on the meta device (names and shapes, no memory)."""
    import transformers

    hf = _hf_config(config)
    with torch.device("meta"), _quiet():
        return transformers.AutoModelForCausalLM.from_config(hf)


def _natural(name: str) -> list[Any]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name)]


def _write_order(names: Sequence[str], module_order: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """The order tensors are written in, as a real checkpoint's shards hold them: what the model builds before
    its layers (the embeddings), then layer by layer (names in natural order within a layer), then the rest (the
    final norm, the head)."""
    at = {n: i for i, n in enumerate(module_order)}
    layer = {n: int(m[1]) for n in names if (m := re.search(r"\.layers\.(\d+)\.", n))}
    first = min((i for n, i in at.items() if re.search(r"\.layers\.\d+\.", n)), default=0)
    return {
        n: (1, layer[n], _natural(n)) if n in layer else (0 if at.get(n, first) < first else 2, at.get(n, 0), [])
        for n in names
    }


@lru_cache(maxsize=32)
def _specs_cached(config_json: str) -> tuple[Spec, ...]:
    config = json.loads(config_json)
    try:
        model = meta_model(config)
    except Exception as e:  # transformers refuses a config in many ways (ValueError, TypeError, KeyError, ...)
        raise InputError(
            f"the config of {config.get('model_type')!r} does not build: {' '.join(str(e).split())}"
        ) from None
    state = model.state_dict()
    try:  # what save_pretrained writes: tied copies dropped, fused tensors back in the checkpoint's own layout
        from transformers.core_model_loading import revert_weight_conversion
        from transformers.modeling_utils import remove_tied_weights_from_state_dict

        state = revert_weight_conversion(model, remove_tied_weights_from_state_dict(state, model))
    except ImportError:  # pragma: no cover - an older transformers loads the state dict's own names
        pass
    std = float(config.get("initializer_range", 0.02))
    specs = [_spec(model, n, tuple(int(d) for d in t.shape), std) for n, t in state.items()]
    order = _write_order([s.name for s in specs], list(model.state_dict()))
    return tuple(sorted(specs, key=lambda s: order[s.name]))


def _spec(model: Any, name: str, shape: tuple[int, ...], std: float) -> Spec:
    """A matrix is drawn from normal(0, initializer_range); a vector takes the constant the model's own
    ``_init_weights`` gives it (ones for an RMSNorm, zeros for Gemma's ``1 + w`` norms and for biases)."""
    if len(shape) >= 2:
        return Spec(name, shape, "normal", std)
    if name.endswith(".bias"):
        return Spec(name, shape, "constant", 0.0)
    owner, _, leaf = name.rpartition(".")
    try:
        found = model.get_submodule(owner)
        if not owner or sum(p.numel() for p in found.parameters()) > 1 << 24:  # never the model, nor a big part
            raise AttributeError(owner)
        module = copy.deepcopy(found).to_empty(device="cpu")
        with torch.no_grad():
            for p in module.parameters(recurse=False):
                p.fill_(float("nan"))
            model._init_weights(module)
        values = getattr(module, leaf).detach().float()
    except (AttributeError, RuntimeError):
        values = torch.tensor([float("nan")])
    if bool(torch.isnan(values).any()) or bool((values != values.flatten()[0]).any()):
        return Spec(name, shape, "constant", 1.0 if "norm" in name else 0.0)
    return Spec(name, shape, "constant", float(values.flatten()[0]))


def real_shape_specs(
    name: str, layers: int | None = None, config_overrides: dict[str, Any] | None = None
) -> list[Spec]:
    """Every tensor the checkpoint of ``name`` holds, in the order they are written."""
    config = real_shape_config(name, layers, config_overrides)
    return list(_specs_cached(json.dumps(config, sort_keys=True)))


def real_shape_size(
    name: str,
    dtype: str | torch.dtype = torch.bfloat16,
    layers: int | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> int:
    """Bytes of the weights of ``name`` in ``dtype`` (from the shapes only)."""
    dt = parse_dtype(dtype)
    return sum(s.nbytes(dt) for s in real_shape_specs(name, layers, config_overrides))


def _block_seed(seed: int, name: str, block: int) -> int:
    digest = hashlib.sha256(f"{seed}\0{name}\0{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def make_tensor(spec: Spec, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """The tensor ``spec`` in ``dtype``: a constant, or blocks of :data:`BLOCK` float32 normals, each from its own
    seed, scaled and rounded to ``dtype`` (at most one block of float32 beside the tensor)."""
    if spec.init == "constant":
        return torch.full(spec.shape, spec.value, dtype=dtype)
    out = torch.empty(spec.shape, dtype=dtype)
    flat = out.view(-1)
    n = flat.numel()
    buf = torch.empty(min(BLOCK, n), dtype=torch.float32)
    gen = torch.Generator()
    for block, start in enumerate(range(0, n, BLOCK)):
        size = min(BLOCK, n - start)
        gen.manual_seed(_block_seed(seed, spec.name, block))
        part = torch.randn(size, generator=gen, out=buf[:size])
        flat[start : start + size].copy_(part.mul_(spec.value))
    return out


def real_shape_tensor(
    name: str,
    tensor: str,
    dtype: str | torch.dtype = torch.bfloat16,
    seed: int = 0,
    layers: int | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> torch.Tensor:
    """The tensor called ``tensor`` of what :func:`write_real_shape` writes, made again alone."""
    for spec in real_shape_specs(name, layers, config_overrides):
        if spec.name == tensor:
            return make_tensor(spec, parse_dtype(dtype), seed)
    raise InputError(f"{name} has no tensor {tensor!r}")


def plan_shards(specs: Sequence[Spec], dtype: torch.dtype, shard_bytes: int) -> list[list[Spec]]:
    """The tensors in order, cut into shards of at most ``shard_bytes`` (a larger tensor is a shard alone)."""
    shards: list[list[Spec]] = [[]]
    size = 0
    for spec in specs:
        nbytes = spec.nbytes(dtype)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return [s for s in shards if s]


@lru_cache(maxsize=1)
def _default_tokenizer() -> Any:
    """The default model's tokenizer, read from its GGUF (no weights are loaded)."""
    import warnings

    import transformers

    from ..core.loading import DEFAULT_MODEL, NAMED_MODELS

    gguf = NAMED_MODELS[DEFAULT_MODEL]()
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def _tokenizer_for(vocab_size: int) -> Any:
    """The default model's tokenizer, refused in one line when its ids reach ``vocab_size``."""
    tok = _default_tokenizer()
    if len(tok) > vocab_size:
        raise InputError(
            f"the default tokenizer has {len(tok)} tokens: more than the model's vocabulary of {vocab_size}"
        )
    return tok


def _copy_tokenizer(tok: Any, folder: Path) -> None:
    """The tokenizer files of ``tok`` (:data:`TOKENIZER_FILES`), written into ``folder``."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        tok.save_pretrained(tmp)
        for f in TOKENIZER_FILES:
            if (Path(tmp) / f).is_file():
                shutil.copyfile(Path(tmp) / f, folder / f)


def _check_folder(folder: Path, needed: int) -> None:
    """Refuse a folder that is not an empty folder, or a disk with less than ``needed`` bytes free."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise InputError(f"{folder}: exists and is not an empty folder; give a new or empty one")
    there = folder
    while not there.exists() and there != there.parent:
        there = there.parent
    free = shutil.disk_usage(there).free
    if free < needed:
        raise InputError(
            f"{folder}: writing the model needs {needed / 1e9:.2f} GB free on the disk of {there}, "
            f"which has {free / 1e9:.2f} GB free"
        )


def write_real_shape(
    name: str,
    folder: str | Path,
    dtype: str | torch.dtype = torch.bfloat16,
    seed: int = 0,
    layers: int | None = None,
    shard_bytes: int = 2**31,
    progress: bool = True,
    config_overrides: dict[str, Any] | None = None,
) -> Path:
    """Write the random-weight model of real shape ``name`` to the new (or empty) ``folder`` and return it.

    ``layers``: only the first ``layers`` layers (``num_hidden_layers=layers``); ``config_overrides``: config
    values replaced (tests shrink the width with them); ``shard_bytes``: the most bytes of a shard (a bigger tensor
    is a shard alone) and, with one tensor, the most held in memory.  ``config.json`` is written last: a folder
    without it is an interrupted write.  One :class:`~walklens.base.errors.InputError` line for a folder that exists
    and is not empty, or a disk without the room.
    """
    from tqdm.auto import tqdm

    dt = parse_dtype(dtype)
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes < 1:
        raise InputError(f"shard_bytes must be a positive whole number, not {shard_bytes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError(f"seed must be a whole number, not {seed!r}")
    config = real_shape_config(name, layers, config_overrides)
    specs = real_shape_specs(name, layers, config_overrides)
    total = sum(s.nbytes(dt) for s in specs)
    out = Path(folder).expanduser()
    _check_folder(out, total + 2**24)  # the weights, the tokenizer and the index
    tok = _tokenizer_for(int(config["vocab_size"]))
    out.mkdir(parents=True, exist_ok=True)
    _copy_tokenizer(tok, out)
    shards = plan_shards(specs, dt, shard_bytes)
    weight_map: dict[str, str] = {}
    with tqdm(total=total, desc=f"writing {name}", unit="B", unit_scale=True, disable=not progress) as bar:
        for k, shard in enumerate(shards, start=1):
            file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            tensors: dict[str, torch.Tensor] = {}
            for spec in shard:
                tensors[spec.name] = make_tensor(spec, dt, seed)
                weight_map[spec.name] = file
                bar.update(spec.nbytes(dt))
            save_file(tensors, str(out / file), metadata={"format": "pt"})
            del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    written = dict(config, torch_dtype=dtype_name(dt))
    (out / "config.json").write_text(json.dumps(written, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m walklens.testing.shapes NAME FOLDER [--layers N] [--dtype bfloat16] [--seed S]``."""
    p = argparse.ArgumentParser(prog="python -m walklens.testing.shapes", description=__doc__.split("\n")[0])
    p.add_argument("name", choices=sorted(REAL_SHAPES))
    p.add_argument("folder")
    p.add_argument("--layers", type=int, default=None, help="only the first N layers")
    p.add_argument("--dtype", default="bfloat16", help="float32, bfloat16 (default) or float16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-gb", type=float, default=2**31 / 1e9, help="the most GB of a shard (2.15)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    try:
        out = write_real_shape(
            a.name,
            a.folder,
            dtype=a.dtype,
            seed=a.seed,
            layers=a.layers,
            shard_bytes=max(1, int(a.shard_gb * 1e9)),
            progress=not a.quiet,
        )
    except WalklensError as e:
        sys.stderr.write(f"walklens: error: {' '.join(str(e).split())}\n")
        return e.exit_code
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
