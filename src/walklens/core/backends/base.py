"""The backend interface: where the shards of a sweep run, and the local backend (this process).

A sweep is cut into shards defined before any of them runs (seed 000, sec. 5.1, at scale: docs/scale.md):
item ranges for the baseline's and the vector bank's forward passes, (scheme bundle, item range) pairs for
Test 2, (scheme block, item range) pairs for Test 1's concept sequences.  A shard is a pure function
``fn(lm, ctx, payload)`` of the model, a context shared by every shard of one :meth:`Workers.map` call (or of
one part of a :meth:`Workers.map_parts` call: Test 2's item ranges, each with the bank rows it reads), and its
own payload, so its result is the same wherever it runs; the driver stores results as they come back.

* :class:`Backend` -- loads the driver's model (:meth:`Backend.driver_model`) and opens :class:`Workers` that
  hold a model each (:meth:`Backend.workers`);
* :class:`LocalBackend` / :class:`LocalWorkers` -- every shard in this process, in order, on the driver's model;
* :class:`~.ray_backend.RayBackend` -- actors on a Ray cluster, each holding the model once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...base.precision import check_device, dtype_name, parse_dtype

if TYPE_CHECKING:
    from ..loading import LoadedModel

#: A shard: ``fn(lm, ctx, payload) -> result`` (a module-level function, so it pickles by reference).
ShardFn = Callable[["LoadedModel", Any, Any], Any]


@dataclass(frozen=True)
class ModelSpec:
    """How a worker loads its model: :func:`~walklens.core.loading.load_model` ``(spec, dtype=dtype,
    device=device, stream=stream)``: a model the driver streams layer by layer streams in every worker too."""

    spec: str
    dtype: str = "float32"
    device: str = "cpu"
    stream: bool = False

    def load(self) -> LoadedModel:
        from ..loading import load_model

        return load_model(self.spec, dtype=self.dtype, device=self.device, stream=self.stream)

    @classmethod
    def of(cls, lm: LoadedModel, device: str | None = None) -> ModelSpec:
        """The spec that loads ``lm`` again: its name without the ``@dtype`` suffix that
        :func:`~walklens.base.precision.model_label` adds outside float32, its dtype, and ``device`` (default: its
        own)."""
        name, dt = lm.name, dtype_name(lm.dtype)
        if lm.dtype != torch.float32 and name.endswith(f"@{dt}"):
            name = name[: -len(dt) - 1]
        return cls(name, dt, device or str(lm.device), lm.stream is not None)


class Workers(ABC):
    """Processes holding a model each, which run shards: :meth:`map` yields ``(index, result)`` as shards
    finish (in any order; the local workers keep the order).  Payloads are drawn from the iterable only as
    workers are free, so a long sweep never holds every payload at once."""

    #: How many shards run at once.
    n: int = 1
    #: The backend's name (``local``, ``ray``).
    kind: str = "local"
    #: The most bytes of bank rows one shard's context may hold (``None``: no bound; the local workers read the
    #: driver's own arrays, so the whole bank is one context).  Test 2 cuts its items into ranges to stay under it.
    context_bytes: int | None = None

    def map(self, fn: ShardFn, ctx: Any, payloads: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        """Run ``fn(lm, ctx, payload)`` for every payload; yield ``(position in payloads, result)``."""
        return self.map_parts(fn, ((ctx, payloads),))

    @abstractmethod
    def map_parts(self, fn: ShardFn, parts: Iterable[tuple[Any, Iterable[Any]]]) -> Iterator[tuple[int, Any]]:
        """:meth:`map` over parts ``(ctx, payloads)``, each with its own context: run ``fn(lm, ctx, payload)`` for
        every payload of every part; yield ``(position among all payloads, result)``.  A part is drawn only when
        the payloads before it are handed out, so only the contexts of the shards in flight are held at once
        (each copied once where a backend copies them: Ray's object store)."""

    def close(self) -> None:  # noqa: B027  # not abstract: workers that hold nothing need no close of their own
        """Release the workers (the local ones hold nothing)."""

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalWorkers(Workers):
    """Every shard in this process, one after the other, on the driver's own model."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm

    def map_parts(self, fn: ShardFn, parts: Iterable[tuple[Any, Iterable[Any]]]) -> Iterator[tuple[int, Any]]:
        i = 0
        for ctx, payloads in parts:
            for p in payloads:
                yield i, fn(self.lm, ctx, p)
                i += 1


class Backend(ABC):
    """Where a sweep runs: the model the driver plans with, and the workers that compute."""

    name: str = "local"

    @abstractmethod
    def check_device(self, device: str) -> str:
        """The device the workers will use; one :class:`~walklens.base.errors.InputError` line where they cannot have
        it (``cuda`` where no GPU is), before anything loads or is written."""

    @abstractmethod
    def driver_model(self, spec: str, *, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
        """The model the driver tokenises and plans with (the local backend computes with it too); the device is
        checked first (:meth:`check_device`)."""

    @abstractmethod
    def workers(self, lm: LoadedModel) -> Workers:
        """Workers that hold the model ``lm`` was loaded from (a context manager: closing releases them)."""

    def describe(self) -> str:
        return self.name


class LocalBackend(Backend):
    """The sweep in this process: the driver's model computes every shard."""

    name = "local"

    def check_device(self, device: str) -> str:
        return str(check_device(device))

    def driver_model(self, spec: str, *, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
        from ..loading import load_model

        return load_model(spec, dtype=dtype_name(parse_dtype(dtype)), device=device)

    def workers(self, lm: LoadedModel) -> Workers:
        return LocalWorkers(lm)
