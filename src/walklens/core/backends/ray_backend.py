"""The Ray backend: shards on actors that hold the model once each (docs/scale.md).

* No address: a local Ray instance with ``workers x cpus_per_worker`` CPUs is started in this process (or the
  one already started here is used).  ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``: an existing cluster.
* Each worker is an actor (``num_cpus=cpus_per_worker``, ``num_gpus=gpus_per_worker``; torch runs that many
  threads) that loads the model from its :class:`~.base.ModelSpec` once, in its constructor.
* :meth:`RayWorkers.map` puts the shared context in the object store once and hands each actor the next payload
  whenever it has fewer than two (so one is always queued behind the one it runs); Ray restarts an actor that
  dies (``max_restarts``) and retries the shard it held (``max_task_retries``).  A shard's result depends on its
  payload only, so a retried shard gives the same bits.  :meth:`RayWorkers.map_parts` puts one context per part
  (Test 2: an item range's bank rows, at most ``context_mb`` MB, so a node never needs the whole bank; default
  :data:`CONTEXT_MB` or ``$WALKLENS_RAY_CONTEXT_MB``).
* Before anything loads: ``cuda`` on a cluster without GPUs, and more workers than the cluster's CPUs or GPUs,
  are one-line errors (such actors would wait forever); workers that still do not start within
  ``start_timeout`` seconds are another, never a hang.
"""

from __future__ import annotations

import logging
import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...base.errors import InputError, WalklensError
from ...base.extras import require
from ...base.precision import check_device, dtype_name, parse_dtype
from .base import Backend, ModelSpec, ShardFn, Workers

if TYPE_CHECKING:
    from ..loading import LoadedModel

#: The most MB of bank rows one shard's context holds on the Ray backend (Test 2 item ranges; docs/scale.md).
CONTEXT_MB = 1024.0
CONTEXT_ENV = "WALKLENS_RAY_CONTEXT_MB"
_ADDRESS = re.compile(r"^(ray://)?[A-Za-z0-9._\-\[\]:]+:\d{1,5}$")


def require_ray() -> Any:
    """The ``ray`` module, or one :class:`~walklens.base.errors.MissingDependencyError` line naming the extra."""
    return require("ray", "the Ray backend")[0]


def check_address(address: str | None) -> str | None:
    """``None`` (start a local instance), ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``."""
    if address is None or address == "auto" or (isinstance(address, str) and _ADDRESS.match(address)):
        return address
    raise InputError(f"Ray address must be auto, HOST:PORT or ray://HOST:PORT, not {str(address)[:80]!r}")


def resolve_context_mb(value: float | str | None = None) -> float:
    """The bound on a shard's context in MB: ``value``, else ``$WALKLENS_RAY_CONTEXT_MB``, else :data:`CONTEXT_MB`;
    anything but a positive number is one :class:`InputError` line."""
    what = "context_mb"
    if value is None:
        value, what = os.environ.get(CONTEXT_ENV) or CONTEXT_MB, CONTEXT_ENV
    try:
        mb = float(value)
    except (TypeError, ValueError):
        mb = float("nan")
    if not mb > 0 or mb == float("inf") or isinstance(value, bool):
        raise InputError(f"{what} must be a positive number of MB, not {str(value)[:40]!r}")
    return mb


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[-1] if lines else e.__class__.__name__)[:300]


class ShardWorker:
    """A Ray actor's state: the model, loaded once, and a count of the shards it ran.

    ``hook(n)`` (optional, picklable) runs before the ``n``-th shard of this actor process; the tests use it to
    kill a worker mid-run (:class:`walklens.testing.faults.CrashOnce`)."""

    def __init__(self, spec: ModelSpec, threads: int, hook: Callable[[int], None] | None = None) -> None:
        torch.set_num_threads(max(1, threads))
        self.lm = spec.load()
        self.hook = hook
        self.n = 0

    def ready(self) -> str:
        return self.lm.name

    def run(self, fn: ShardFn, ctx: Any, payload: Any) -> Any:
        self.n += 1
        if self.hook is not None:
            self.hook(self.n)
        return fn(self.lm, ctx, payload)


@dataclass(frozen=True)
class ActorOptions:
    """How each actor is started, restarted and fed: Ray restarts a dead actor and retries its shard up to
    ``retries`` times; every actor must have loaded the model within ``start_timeout`` seconds; ``hook(n)``
    (optional, picklable) runs before its ``n``-th shard (:class:`ShardWorker`); it holds ``depth`` shards at a
    time (the one it runs and the next, queued, so it never waits for the driver between shards)."""

    retries: int = 3
    start_timeout: float = 600.0
    hook: Callable[[int], None] | None = None
    depth: int = 2


class RayWorkers(Workers):
    """``n`` :class:`ShardWorker` actors on the connected cluster, each asking Ray for ``cpus`` CPUs and ``gpus``
    GPUs and run as ``options`` says; one shard's context holds at most ``context_mb`` MB."""

    kind = "ray"

    def __init__(
        self,
        ray: Any,
        spec: ModelSpec,
        n: int,
        *,
        cpus: float,
        gpus: float,
        context_mb: float = CONTEXT_MB,
        options: ActorOptions = ActorOptions(),
    ) -> None:
        retries, start_timeout = options.retries, options.start_timeout
        self.ray, self.n, self.retries, self.depth = ray, n, retries, max(1, options.depth)
        self.context_bytes = int(context_mb * 2**20)
        total = ray.cluster_resources()
        for what, each in (("CPU", cpus), ("GPU", gpus)):
            have = float(total.get(what, 0.0))
            if each and n * each > have:
                raise InputError(
                    f"{n} Ray worker(s) with {each:g} {what}(s) each need {n * each:g} {what}s; the "
                    f"cluster has {have:g} (use fewer --workers)"
                )
        actor = ray.remote(num_cpus=cpus, num_gpus=gpus, max_restarts=retries, max_task_retries=retries)(ShardWorker)
        self.actors = [actor.remote(spec, int(max(1, cpus)), options.hook) for _ in range(n)]
        ready = [a.ready.remote() for a in self.actors]
        try:
            done, pending = ray.wait(ready, num_returns=n, timeout=start_timeout)
            if pending:
                raise WalklensError(
                    f"{len(pending)} of {n} Ray worker(s) did not start within {start_timeout:g} s "
                    f"(busy cluster? resources: {dict(total)})"
                )
            for r in done:
                self._get(r, "could not load the model")
        except BaseException:
            self.close()
            raise

    def _get(self, ref: Any, what: str = "died running a shard") -> Any:
        """``ray.get`` with walklens' errors: a shard's own error as itself, a dead worker as one line."""
        ex = self.ray.exceptions
        try:
            return self.ray.get(ref)
        except ex.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise WalklensError(f"a Ray worker {what}: {_first_line(e)}") from None
        except ex.RayActorError as e:
            cause = getattr(e, "cause", None)
            inner = getattr(cause, "cause", None)
            if isinstance(inner, WalklensError):
                raise inner from None
            raise WalklensError(f"a Ray worker {what} ({self.retries} restarts allowed): {_first_line(e)}") from None

    def map_parts(self, fn: ShardFn, parts: Iterable[tuple[Any, Iterable[Any]]]) -> Iterator[tuple[int, Any]]:
        def flat() -> Iterator[tuple[int, Any, Any]]:
            """``(position, context ref, payload)``: each part's context put in the object store once, when its
            first payload is handed out; the driver drops the ref at the next part (running shards keep it)."""
            i = 0
            for ctx, payloads in parts:
                ref = None
                for p in payloads:
                    if ref is None:
                        ref, ctx = self.ray.put(ctx), None
                    yield i, ref, p
                    i += 1

        todo = flat()
        idle = deque(a for _ in range(self.depth) for a in self.actors)  # free slots
        running: dict[Any, tuple[int, Any]] = {}
        try:
            while True:
                while idle:
                    nxt = next(todo, None)
                    if nxt is None:
                        break
                    a = idle.popleft()
                    running[a.run.remote(fn, nxt[1], nxt[2])] = (nxt[0], a)
                if not running:
                    return
                (ref,), _ = self.ray.wait(list(running), num_returns=1)
                i, a = running.pop(ref)
                idle.append(a)
                yield i, self._get(ref)
        finally:
            for ref in running:  # the caller stopped early: queued shards need not run
                try:
                    self.ray.cancel(ref)
                except Exception:
                    pass

    def close(self) -> None:
        for a in getattr(self, "actors", []):
            try:
                self.ray.kill(a)
            except Exception:
                pass
        self.actors = []


class RayBackend(Backend):
    """Shards on Ray actors (module docstring).  ``workers``: actors per model (default: 1 on a local instance;
    on a cluster, one per GPU for ``cuda`` or one per ``cpus_per_worker`` CPUs); ``gpus_per_worker``: default 1
    for ``cuda``, 0 otherwise; ``runtime_env``: passed to ``ray.init`` (code and packages for remote nodes);
    ``context_mb``: the most MB of bank rows one shard's context holds (:func:`resolve_context_mb`);
    ``actors``: restarts, start timeout, a test hook and queue depth of each actor (:class:`ActorOptions`)."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        *,
        cpus_per_worker: float = 1,
        gpus_per_worker: float | None = None,
        runtime_env: dict[str, Any] | None = None,
        context_mb: float | None = None,
        actors: ActorOptions = ActorOptions(),
    ) -> None:
        self.ray = require_ray()
        self.address = check_address(address)
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            raise InputError(f"the number of Ray workers must be a positive integer, not {workers!r}")
        if not cpus_per_worker or cpus_per_worker <= 0:
            raise InputError(f"cpus_per_worker must be positive, not {cpus_per_worker!r}")
        if gpus_per_worker is not None and gpus_per_worker < 0:
            raise InputError(f"gpus_per_worker must be >= 0, not {gpus_per_worker!r}")
        if runtime_env is not None and not isinstance(runtime_env, dict):
            raise InputError("runtime_env must be a table (a dict)")
        self.n_workers, self.cpus, self.gpus = workers, float(cpus_per_worker), gpus_per_worker
        self.runtime_env, self.actor_options = runtime_env, actors
        self.context_mb = resolve_context_mb(context_mb)
        self._specs: dict[int, ModelSpec] = {}

    def describe(self) -> str:
        where = self.address or "a local instance"
        return f"ray ({where}, {self.n_workers or 'default'} worker(s))"

    def start(self) -> None:
        """Connect to the cluster, or start a local instance (once per process; one already started is used)."""
        ray = self.ray
        if ray.is_initialized():
            return
        # workers' own output stays in Ray's session logs (/tmp/ray/session_latest/logs): their errors reach the
        # driver as one line each (RayWorkers._get), never as a stream of tracebacks
        kw: dict[str, Any] = {"logging_level": logging.WARNING, "runtime_env": self.runtime_env, "log_to_driver": False}
        if self.address is None:
            kw.update(num_cpus=int(round((self.n_workers or 1) * self.cpus)), include_dashboard=False)
        else:
            kw["address"] = self.address
        for attempt in (1, 2):  # a local node gets 30 s to register with Ray; a loaded machine can miss that once
            try:
                ray.init(**kw)
                return
            except Exception as e:
                ray.shutdown()
                if attempt == 1 and self.address is None:
                    continue
                raise WalklensError(
                    f"cannot start or reach the Ray cluster at {self.address or 'a local instance'}: {_first_line(e)}"
                ) from None

    def _gpus(self, device: str) -> float:
        gpus = (1.0 if device.startswith("cuda") else 0.0) if self.gpus is None else float(self.gpus)
        if device.startswith("cuda") and gpus <= 0:
            raise InputError("device cuda needs gpus_per_worker > 0")
        return gpus

    def check_device(self, device: str) -> str:
        """The workers' device; ``cuda`` where the cluster (or, for a local instance, this machine) has no GPU is
        one :class:`InputError` line, before anything loads."""
        if self.address is None:
            check_device(device)
        else:
            try:
                torch.device(device)
            except (RuntimeError, TypeError, ValueError):
                raise InputError(f"unknown device {device!r}; use cpu or cuda") from None
        dev = "cuda" if str(device).startswith("cuda") else str(device)  # Ray gives each actor its own GPU(s)
        if dev == "cuda":
            need = self._gpus(dev)
            if self.address is not None:
                self.start()
                have = float(self.ray.cluster_resources().get("GPU", 0.0))
                if have < need:
                    raise InputError(
                        f"device cuda asked for, but the Ray cluster at {self.address} has {have:g} "
                        f"GPU(s); use --device cpu"
                    )
        return dev

    def driver_model(self, spec: str, *, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
        """The device is checked first; the driver's own copy is loaded on the CPU (it only tokenises and plans)."""
        from ..loading import load_model

        dev = self.check_device(device)
        name = dtype_name(parse_dtype(dtype))
        lm = load_model(spec, dtype=name, device="cpu")
        path = os.path.abspath(spec) if os.path.exists(spec) else spec  # actors may run in another folder
        self._specs[id(lm)] = ModelSpec(path, name, dev, lm.stream is not None)
        return lm

    def workers(self, lm: LoadedModel) -> RayWorkers:
        spec = self._specs.get(id(lm)) or ModelSpec.of(lm)
        self.start()
        gpus = self._gpus(spec.device)
        n = self.n_workers
        if n is None:
            if self.address is None:
                n = 1
            else:
                res = self.ray.cluster_resources()
                n = max(1, int(res.get("GPU", 0) // gpus) if gpus else int(res.get("CPU", 1) // self.cpus))
        return RayWorkers(
            self.ray, spec, n, cpus=self.cpus, gpus=gpus, context_mb=self.context_mb, options=self.actor_options
        )
