"""Where a sweep's shards run: in this process (``local``) or on Ray actors (``ray``; docs/scale.md).

:mod:`.base` holds the interface (:class:`Backend`, :class:`Workers`, :class:`ModelSpec`) and the local backend;
:mod:`.ray_backend` the Ray one, imported only when asked for (``ray`` is an optional extra).
"""

from __future__ import annotations

from typing import Any

from ...base.errors import InputError
from .base import Backend, LocalBackend, LocalWorkers, ModelSpec, ShardFn, Workers

BACKENDS = ("local", "ray")


def make_backend(name: str = "local", **options: Any) -> Backend:
    """``local`` (no options) or ``ray`` (the options of :class:`~.ray_backend.RayBackend`: ``address``,
    ``workers``, ``cpus_per_worker``, ``gpus_per_worker``, ``runtime_env``, ...)."""
    if name == "local":
        extra = sorted(k for k, v in options.items() if v is not None)
        if extra:
            raise InputError(
                f"{', '.join(extra)}: only the ray backend takes {'these' if len(extra) > 1 else 'this'}"
                f" (use --backend ray)"
            )
        return LocalBackend()
    if name == "ray":
        from .ray_backend import RayBackend

        return RayBackend(**{k: v for k, v in options.items() if v is not None})
    raise InputError(f"unknown backend {name!r}; use one of: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "LocalBackend", "LocalWorkers", "ModelSpec", "ShardFn", "Workers", "make_backend"]
