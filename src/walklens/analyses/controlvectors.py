"""llama.cpp control vectors (GGUF): walklens' steering directions out, anyone's control vectors in
(docs/ecosystem.md; seed 002's steering next to the usual steering vector).

**The format** (llama.cpp ``common/common.cpp``, ``common_control_vector_load_one``; repeng's
``ControlVector.export_gguf``): a GGUF file with ``general.architecture = "controlvector"``,
``controlvector.model_hint`` (a string naming the model type), ``controlvector.layer_count`` (an integer; repeng
writes the number of directions, llama.cpp never reads it) and one tensor ``direction.{k}`` per layer: float32, one
row of n_embd numbers.  llama.cpp adds ``strength * direction.k`` to the output of layer k (0-based: the ``l_out``
of its layer loop, after the MLP's residual add), which is where :func:`~walklens.core.interventions.add_to_residual`
adds and what walklens calls ``L{k}.resid_post``.  Its loader refuses ``direction.0`` (the buffer has no row for
layer 0), so the indices of a file run from 1 to n_layer - 1 and look 1-based, but ``direction.k`` and walklens'
layer k are the same layer; repeng keys its directions by the same 0-based index of ``model.layers``.

**What is exported** (:func:`control_vector`), for a unit target direction u
(:func:`walklens.analyses.steering.direction`):

- activation addition (``method="add"``): ``alpha u`` at each layer, exactly the vector
  ``steer(..., method="add")`` adds there (float32), so llama.cpp's ``--control-vector FILE`` (strength 1) adds
  what walklens adds;
- eigen-steering (``method="eigen"``): the edit ``dB = alpha A^+ w u^T`` of layer k's W_O changes what attention
  adds to the residual at position t by ``c_t u`` (``c_t = alpha sum_h (A_h (X W_v,h + b_v,h))_t . z_h``, a
  number that depends on the token and its context; for Gemma 2/3 the post-attention norm then reshapes it).  A
  control vector adds a constant, so the exported vector of layer k is the **mean over the tokens of ``texts``
  of the change of** ``L{k}.attn_out``, measured with the edit at layer k alone (capture with and without it);
  ``along_u`` is its cosine with u (1 up to rounding wherever no norm follows the projection).  It is an
  approximation: a constant instead of c_t, added at the layer's output (after its MLP) instead of inside it.

:func:`read_control_vector` reads any such file back into ``{layer: float32 [D]}``, checked (architecture, names,
F32 rows of one length, finite numbers, and against a model its D and layers); :func:`apply_control_vector`
applies one with activation addition.
"""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..base.display import Shown
from ..base.errors import InputError
from ..base.outputs import check_file, write_atomic
from ..core.capture import capture
from ..core.interventions import add_to_residual, eigen_edit, resolve_layers
from .steering import direction

if TYPE_CHECKING:
    from ..core.loading import LoadedModel

ARCHITECTURE = "controlvector"
#: a tensor's name: ``direction.`` and the layer in ASCII digits (``\d`` and ``int`` also read ``١`` or ``１``, which
#: llama.cpp's ``std::stoi`` does not; nine digits at most)
_DIRECTION = re.compile(r"direction\.([0-9]{1,9})", re.ASCII)
METHODS = ("add", "eigen")


@dataclass
class ControlVector(Shown, view="control_vector"):
    """One residual vector per layer, as a llama.cpp control vector holds them: ``directions[k]`` (float32 [D]) is
    added to the output of layer k (0-based, k >= 1; module docstring).  ``model_hint``: the model type it was made
    for; ``method``/``alpha``/``label``: how walklens made it (empty for a file from elsewhere); ``along_u``:
    eigen-steering's cosine of each exported vector with u; ``layer_count``: the file's
    ``controlvector.layer_count``."""

    directions: dict[int, torch.Tensor]
    model_hint: str = ""
    method: str = ""
    alpha: float | None = None
    label: str = ""
    along_u: dict[int, float] = field(default_factory=dict)
    layer_count: int | None = None

    def __post_init__(self) -> None:
        """A NaN or infinite direction is refused here, in one line (a writer, a reader and steering all refuse it)."""
        _check_finite(self, "control vector")

    @property
    def layers(self) -> list[int]:
        return sorted(self.directions)

    @property
    def n_embd(self) -> int:
        return next(iter(self.directions.values())).shape[0] if self.directions else 0


def residual_dim(lm: LoadedModel) -> int:
    """The size of the model's residual stream (n_embd)."""
    return lm.head_weights(0).d_model


def control_layers(lm: LoadedModel, layers: int | Sequence[int]) -> list[int]:
    """Layers (negative: from the top) as a control vector's indices: layer 0 is refused, since llama.cpp never
    steers its output."""
    ls = resolve_layers(lm, layers)
    if 0 in ls:
        raise InputError(
            f"layer 0 cannot be a control vector's layer: llama.cpp never steers layer 0's output (its "
            f"loader refuses direction.0); choose layers 1 to {lm.n_layers - 1}"
        )
    return sorted(ls)


@torch.no_grad()
def control_vector(
    lm: LoadedModel,
    toward: str | torch.Tensor,
    layers: int | Sequence[int],
    alpha: float,
    *,
    method: str = "add",
    texts: Sequence[str] | None = None,
) -> ControlVector:
    """The steering of ``steer(lm, toward, layers, alpha, method)`` as a control vector (module docstring):
    ``alpha u`` per layer for activation addition; for eigen-steering the mean change of each layer's attention
    output over the tokens of ``texts`` (needed), with its cosine with u."""
    if method not in METHODS:
        raise InputError(f"unknown steering method {method!r}; choose {' or '.join(METHODS)}")
    if not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise InputError(f"alpha must be a finite number, got {alpha!r}")
    ls = control_layers(lm, layers)
    u, _, label = direction(lm, toward)
    directions: dict[int, torch.Tensor] = {}
    along_u: dict[int, float] = {}
    if method == "add":
        directions = {k: (float(alpha) * u).float() for k in ls}
    else:
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise InputError("eigen-steering's write depends on the token: give texts to average it over")
        points = [f"L{k}.attn_out" for k in ls]
        base = [capture(lm, t, points=points) for t in texts]
        for k in ls:
            pt = f"L{k}.attn_out"
            with eigen_edit(lm, [k], u, float(alpha)):
                deltas = [capture(lm, t, points=[pt])[pt].double() - b[pt].double() for t, b in zip(texts, base)]
            mean = torch.cat(deltas).mean(0)
            norm = float(mean.norm())
            directions[k] = mean.float()
            along_u[k] = float(mean @ u) / norm if norm > 0 else math.nan
    return ControlVector(  # refuses a direction that overflowed float32 (a huge alpha)
        directions=directions,
        model_hint=str(getattr(lm.model.config, "model_type", "") or lm.adapter.family),
        method=method,
        alpha=float(alpha),
        label=label,
        along_u=along_u,
    )


def _check_finite(cv: ControlVector, where: str) -> None:
    """Every direction of finite numbers (one line naming the first that is not)."""
    for k, v in cv.directions.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise InputError(f"{where}: direction.{k} holds NaN or infinite numbers")


def _check_rows(cv: ControlVector, where: str) -> None:
    """Every direction: a layer index >= 1, one finite float row, all of one length."""
    if not cv.directions:
        raise InputError(f"{where}: no directions")
    n = None
    for k, v in cv.directions.items():
        if not isinstance(k, int) or k < 1:
            raise InputError(
                f"{where}: layer {k!r} cannot be a control vector's layer (llama.cpp's indices start at 1)"
            )
        if v.dim() != 1 or not v.is_floating_point():
            raise InputError(f"{where}: direction.{k} is not one row of numbers (shape {tuple(v.shape)})")
        if n is not None and v.shape[0] != n:
            raise InputError(f"{where}: direction.{k} has {v.shape[0]} entries, the others {n}")
        n = v.shape[0]
    _check_finite(cv, where)


def check_for_model(cv: ControlVector, lm: LoadedModel, where: str = "control vector") -> None:
    """Refuse, in one line, a control vector that does not fit ``lm``: its length is not the residual's D, or it
    names a layer the model does not have (llama.cpp: 1 .. n_layer - 1)."""
    _check_rows(cv, where)
    d, L = residual_dim(lm), lm.n_layers
    if cv.n_embd != d:
        raise InputError(f"{where}: its directions have {cv.n_embd} entries; {lm.name}'s residual has {d}")
    bad = [k for k in cv.layers if k >= L]
    if bad:
        raise InputError(
            f"{where}: direction.{bad[0]} names a layer {lm.name} does not have ({L} layers: "
            f"direction.1 to direction.{L - 1})"
        )


def write_control_vector(cv: ControlVector, path: str | Path, label: str | None = None) -> Path:
    """Write ``cv`` as a llama.cpp control-vector GGUF by the rules of :mod:`walklens.base.outputs` (a regular file
    replaced atomically, links written through, a device, FIFO or folder never replaced)."""
    import gguf

    where = f"{label} {path}" if label else str(path)
    check_file(path, label)
    _check_rows(cv, where)
    with tempfile.TemporaryDirectory(prefix="walklens-cvec-") as tmp:
        out = Path(tmp) / "controlvector.gguf"
        writer = gguf.GGUFWriter(str(out), ARCHITECTURE)  # general.architecture = controlvector
        writer.add_string(f"{ARCHITECTURE}.model_hint", cv.model_hint)
        writer.add_uint32(f"{ARCHITECTURE}.layer_count", len(cv.directions))  # as repeng: the number of directions
        if cv.method:
            writer.add_string("walklens.method", cv.method)
        if cv.alpha is not None:
            writer.add_float64("walklens.alpha", float(cv.alpha))
        if cv.label:
            writer.add_string("walklens.toward", cv.label)
        for k in cv.layers:
            writer.add_tensor(f"direction.{k}", cv.directions[k].detach().to(torch.float32).cpu().numpy())
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        data = out.read_bytes()
    return write_atomic(path, data, label)


def _field(reader: Any, key: str, where: str) -> Any:
    """A scalar or string field of a GGUF file (None when absent); an array is refused."""
    import gguf

    f = reader.get_field(key)
    if f is None:
        return None
    if not f.types or f.types[0] == gguf.GGUFValueType.ARRAY or not f.data:
        raise InputError(f"{where}: {key} is not a single value")
    part = f.parts[f.data[0]]
    if f.types[0] == gguf.GGUFValueType.STRING:
        try:
            return bytes(part).decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{where}: {key} is not UTF-8 text") from None
    return part[0].item()


def read_control_vector(path: str | Path, lm: LoadedModel | None = None) -> ControlVector:
    """A llama.cpp control-vector GGUF (from walklens, repeng, llama.cpp's cvector-generator ...) as
    ``{layer: float32 [D]}``, checked: ``general.architecture`` is ``controlvector``; every tensor is
    ``direction.{k}`` with k >= 1, F32, one row (trailing dimensions of 1 allowed, as llama.cpp's ``ggml_n_dims``),
    all of one length, finite; ``controlvector.model_hint`` a string and ``controlvector.layer_count`` an integer
    when present; with ``lm`` also the length against its residual and the layers against its depth.  Anything
    else is refused in one line."""
    p = Path(path)
    where = str(p)
    reader = _gguf_reader(p, where)
    arch = _field(reader, "general.architecture", where)
    if arch != ARCHITECTURE:
        raise InputError(
            f"{where}: general.architecture is {arch!r}, not {ARCHITECTURE!r}: not a control vector"
            if arch is not None
            else f"{where}: no general.architecture: not a control vector"
        )
    hint = _field(reader, f"{ARCHITECTURE}.model_hint", where)
    if hint is not None and not isinstance(hint, str):
        raise InputError(f"{where}: {ARCHITECTURE}.model_hint is not a string")
    count = _field(reader, f"{ARCHITECTURE}.layer_count", where)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
        raise InputError(f"{where}: {ARCHITECTURE}.layer_count is not an integer")
    method = _field(reader, "walklens.method", where)
    alpha = _field(reader, "walklens.alpha", where)
    label = _field(reader, "walklens.toward", where)
    directions = _directions(reader, where)
    cv = ControlVector(
        directions=dict(sorted(directions.items())),
        model_hint=hint or "",
        method=method if method in METHODS else "",
        alpha=float(alpha) if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) else None,
        label=label if isinstance(label, str) else "",
        layer_count=count,
    )
    if lm is not None:
        check_for_model(cv, lm, where)
    else:
        _check_rows(cv, where)
    return cv


def _gguf_reader(p: Path, where: str) -> Any:
    """A ``gguf.GGUFReader`` of the regular file ``p``; a missing, irregular or unreadable file refused in one line."""
    import gguf

    if not p.exists():
        raise InputError(f"{where}: no such file")
    if not p.is_file():
        raise InputError(f"{where}: not a regular file")
    try:
        reader = gguf.GGUFReader(str(p), "r")
    except Exception as e:  # a foreign or broken file: numpy, struct and gguf raise many kinds
        raise InputError(f"{where}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    return reader


def _directions(reader: Any, where: str) -> dict[int, torch.Tensor]:
    """The control vector's rows ``{layer: float32 [D]}`` of a GGUF ``reader``, each tensor checked to be
    ``direction.{k}`` (k >= 1, one name per layer), F32 and one row."""
    import gguf

    if not reader.tensors:
        raise InputError(f"{where}: holds no direction tensors")
    directions: dict[int, torch.Tensor] = {}
    names: dict[int, str] = {}
    for t in reader.tensors:
        m = _DIRECTION.fullmatch(t.name)
        if not m:
            raise InputError(f"{where}: tensor {str(t.name)[:80]!r} is not direction.N (N in ASCII digits)")
        k = int(m.group(1))
        if k in names:
            raise InputError(f"{where}: {names[k]} and {t.name} both name layer {k}")
        names[k] = t.name
        if k == 0:
            raise InputError(f"{where}: direction.0: llama.cpp never steers layer 0's output (its loader refuses it)")
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise InputError(f"{where}: {t.name} is {t.tensor_type.name}, not F32")
        if not len(t.shape) or any(int(d) != 1 for d in t.shape[1:]):
            raise InputError(f"{where}: {t.name} has shape {[int(d) for d in t.shape]}, not one row")
        directions[k] = torch.from_numpy(t.data.reshape(-1).astype("<f4", copy=True))
    return directions


@contextmanager
def apply_control_vector(lm: LoadedModel, cv: ControlVector, scale: float = 1.0) -> Iterator[ControlVector]:
    """Inside the block, ``scale * cv.directions[k]`` is added to the output of every layer k of ``cv``
    (activation addition, :func:`~walklens.core.interventions.add_to_residual`), as llama.cpp's
    ``--control-vector-scaled FILE SCALE`` does; the model is restored on exit, even on error."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise InputError(f"scale must be a finite number, got {scale!r}")
    check_for_model(cv, lm)
    with ExitStack() as stack:
        for k in cv.layers:
            stack.enter_context(add_to_residual(lm, [k], cv.directions[k], float(scale)))
        yield cv


__all__ = ["ControlVector", "control_vector", "write_control_vector", "read_control_vector", "apply_control_vector"]
