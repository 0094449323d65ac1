"""Model dtypes and devices: parsing, availability, and a warning where a dtype is slow on this machine.

walklens runs a model in float32 by default (that is what makes the HellaSwag baseline equal
lm-evaluation-harness); ``load_model(..., dtype="bfloat16", device="cuda")`` and the CLI's ``--dtype`` /
``--device`` choose otherwise (docs/dtype.md).

- :func:`parse_dtype` / :func:`dtype_name` -- ``"float32" | "bfloat16" | "float16"`` (or a ``torch.dtype``);
- :func:`check_device` -- ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; a CUDA device without a usable GPU is one
  :class:`~walklens.base.errors.InputError` line, raised before anything loads;
- :func:`slow_reason` / :func:`warn_if_slow` -- bfloat16 on a CPU without AMX-BF16 / AVX512-BF16 (its matrix
  products are emulated), float16 on a CPU without AMX-FP16 (no faster than float32), bfloat16 on a GPU
  without native bf16: one :class:`~walklens.base.errors.SlowDtypeWarning`, once per process;
- :data:`IDENTITY_REL_TOL` -- the tolerances exactness checks use in each dtype.
"""

from __future__ import annotations

import platform
import warnings
from pathlib import Path

import torch

from .errors import InputError, SlowDtypeWarning

#: The model dtypes walklens runs, by name (float32 is the default).
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_DTYPE = "float32"
DEVICES = ("cpu", "cuda")

#: Unit roundoff of each model dtype (half the machine epsilon: 2**-24, 2**-8, 2**-11).
UNIT_ROUNDOFF: dict[torch.dtype, float] = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}

#: Largest max|recomputed - real| / max|real| the A.3 identity may show per attention module when a model runs
#: in this dtype (:meth:`walklens.analyses.attention.IdentityResult.holds`): the model rounds Q, K, V, the
#: probabilities, A V and the W_o product to its dtype, each a relative error of about one unit roundoff.
#: Measured: at most 1.2 unit roundoffs on every tiny family and on smollm2-135m in bfloat16; 8 leaves room
#: without hiding a wrong matrix (whose error is of the order of the output itself).  Only 16-bit dtypes
#: use it (float32 models keep the absolute 1e-4 of :meth:`~walklens.analyses.attention.IdentityResult.holds`).
IDENTITY_REL_TOL: dict[torch.dtype, float] = {dt: 8 * UNIT_ROUNDOFF[dt] for dt in (torch.bfloat16, torch.float16)}

_CPUINFO = Path("/proc/cpuinfo")
_warned: set[tuple[torch.dtype, str]] = set()


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or one of those ``torch.dtype``) as a ``torch.dtype``."""
    if isinstance(value, torch.dtype):
        if value in DTYPES.values():
            return value
    elif isinstance(value, str) and value.strip().lower() in DTYPES:
        return DTYPES[value.strip().lower()]
    raise InputError(f"unsupported model dtype {value!r}; use one of: {', '.join(DTYPES)}")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def is_low_precision(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is a 16-bit float (bfloat16 or float16)."""
    return dtype in (torch.bfloat16, torch.float16)


def model_label(name: str, dtype: torch.dtype) -> str:
    """A model's name as results are stored under it: ``name`` in float32, ``name@bfloat16`` otherwise, so that
    results (stores, caches) of different dtypes never mix."""
    return name if dtype == torch.float32 else f"{name}@{dtype_name(dtype)}"


def check_device(device: str | torch.device) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a ``torch.device``; refuses any other device, and a CUDA device when
    torch sees no such GPU (one :class:`InputError` line)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"unknown device {device!r}; use one of: {', '.join(DEVICES)}") from None
    if dev.type not in DEVICES:
        raise InputError(f"unsupported device {device!r}; use one of: {', '.join(DEVICES)}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU was found"
            raise InputError(
                f"device {str(device)!r} asked for, but no CUDA GPU is available ({why}); use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA GPU(s) are visible")
    return dev


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags (``/proc/cpuinfo`` ``flags`` on x86, ``Features`` on ARM), or None where
    they cannot be read (then no speed warning is given)."""
    try:
        text = _CPUINFO.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def slow_reason(dtype: torch.dtype, device: str | torch.device, flags: set[str] | None = None) -> str | None:
    """Why ``dtype`` is slow on ``device`` of this machine, or None.  ``flags``: the CPU's feature flags
    (default :func:`cpu_flags`; None when unknown, which never warns)."""
    dev = torch.device(device)
    if dtype == torch.float32:
        return None
    if dev.type == "cuda":
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported(including_emulation=False):
            return "bfloat16 on this GPU is emulated (it needs compute capability 8.0 or newer); use float16"
        return None
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return None
    arm = platform.machine().lower() in ("aarch64", "arm64") or "asimd" in flags
    if dtype == torch.bfloat16 and not ({"amx_bf16", "avx512_bf16"} & flags or (arm and "bf16" in flags)):
        return (
            "bfloat16 on this CPU has no AMX-BF16/AVX512-BF16 instructions: its matrix products are emulated "
            "and usually slower than float32"
        )
    if dtype == torch.float16 and not ("amx_fp16" in flags or (arm and "fphp" in flags)):
        fast = " (bfloat16 is the fast half precision here)" if {"amx_bf16", "avx512_bf16"} & flags else ""
        return f"float16 on this CPU has no AMX-FP16 kernels: it runs no faster than float32{fast}"
    return None


def warn_if_slow(dtype: torch.dtype, device: str | torch.device, flags: set[str] | None = None) -> str | None:
    """Warn (:class:`SlowDtypeWarning`) when ``dtype`` is slow on ``device``, once per process and (dtype,
    device type); returns the message when a warning was given."""
    key = (dtype, torch.device(device).type)
    if key in _warned:
        return None
    why = slow_reason(dtype, device, flags)
    if why is None:
        return None
    _warned.add(key)
    warnings.warn(why, SlowDtypeWarning, stacklevel=3)
    return why


__all__ = [
    "DTYPES",
    "DEFAULT_DTYPE",
    "DEVICES",
    "IDENTITY_REL_TOL",
    "UNIT_ROUNDOFF",
    "parse_dtype",
    "dtype_name",
    "is_low_precision",
    "model_label",
    "check_device",
    "cpu_flags",
    "slow_reason",
    "warn_if_slow",
]
