"""GGUF files: checked, then de-quantized once through transformers into a plain safetensors folder in the walklens
cache (``load_model`` reads that folder, in memory or streamed layer by layer)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..base.errors import InputError, MissingDependencyError, UnknownModelError, WalklensError, first_line
from ..models.checkpoint import check_family
from .streaming import quiet_transformers


def check_gguf(gguf: Path) -> None:
    """Refuse an empty, truncated or non-GGUF file with one line.  ``gguf.GGUFReader`` memory-maps the file and
    parses the header, metadata and tensor table (a tensor cut short fails to take its shape), reading no
    tensor data into memory."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(gguf))
        arch = reader.fields.get("general.architecture")
        del reader
    except Exception as e:  # the reader raises ValueError, IndexError, OSError, ... on malformed files
        raise UnknownModelError(f"{gguf}: not a valid GGUF file ({first_line(e)})") from None
    if arch is None:
        raise UnknownModelError(f"{gguf}: not a valid GGUF file (no general.architecture)")


@contextmanager
def _counted_gguf_tensors(count: Callable[[int], None], advance: Callable[[], None]) -> Iterator[None]:
    """transformers de-quantizes a GGUF's tensors in one loop under its own ``tqdm.auto`` bar, which the quiet
    load does not silence: for the duration, that loop counts its tensors on walklens' bar instead (``count``
    once with their number, ``advance`` after each)."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - a transformers without GGUF support fails the load anyway
        yield
        return
    real = getattr(gguf_utils, "tqdm", None)
    if real is None:  # pragma: no cover - the pinned transformers has it
        yield
        return

    def counted(iterable: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        count(len(iterable))
        for item in iterable:
            yield item
            advance()

    gguf_utils.tqdm = counted  # type: ignore[attr-defined,assignment]  # the loader's own tqdm, stood in for during a load
    try:
        yield
    finally:
        gguf_utils.tqdm = real  # type: ignore[attr-defined]  # restored


def dequantize_gguf(gguf: Path, target: Path, progress: bool = True) -> None:
    """Load a GGUF through transformers (de-quantizing it) and save a plain safetensors copy to ``target``;
    ``progress``: one ``tqdm.auto`` bar over its tensors, the copy and the save (a widget in a notebook, a line on
    stderr in a terminal), none with ``False``."""
    for pkg in ("gguf", "accelerate"):
        if importlib.util.find_spec(pkg) is None:
            raise MissingDependencyError(f"loading a .gguf needs the package {pkg!r}; run: pip install {pkg}")
    check_gguf(gguf)
    import transformers
    from tqdm.auto import tqdm

    where = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    bar: Any = None

    def count(n: int) -> None:
        if bar is not None:
            bar.total += n
            bar.refresh()

    def advance() -> None:
        if bar is not None:
            bar.update(1)

    with warnings.catch_warnings(), quiet_transformers(), _counted_gguf_tensors(count, advance):
        warnings.simplefilter("ignore")
        try:
            # an unsupported family is refused before de-quantizing (and before a bar is drawn: one line)
            check_family(transformers.AutoConfig.from_pretrained(**where).model_type)
            bar = tqdm(
                total=2,
                desc=f"de-quantizing {gguf.name} (once)",
                unit="tensor",
                file=sys.stderr,
                leave=False,
                disable=not progress,
            )
            _save_plain(where, tmp, bar)
        except WalklensError:
            raise
        except Exception as e:  # transformers' GGUF reader fails in many ways on a file it cannot use
            shutil.rmtree(tmp, ignore_errors=True)
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


def _save_plain(where: dict[str, str], tmp: Path, bar: Any) -> None:
    """The GGUF at ``where`` loaded de-quantized in float32 and saved to ``tmp`` as plain safetensors with its
    tokenizer (``bar`` advanced after the load and after the save)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(**where)
    q = transformers.AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    config = q.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(q.state_dict(), strict=False)
    plain.tie_weights()
    bar.set_postfix_str("saving as safetensors")
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


__all__ = ["check_gguf", "dequantize_gguf", "gguf_cached"]
