"""What the explorer holds while it runs: the models loaded once at start, one lock per model, small caches
of traces and results, the database path fixed at start, and the jobs that compute for a request.

**One computation per model at a time.**  Steering edits a model's weights inside a ``with`` block
(:mod:`walklens.core.interventions` restores them on exit), so every computation on a model holds that model's
lock.  **A disconnected client costs nothing more.**  :func:`run_job` computes in a worker thread while the
request's connection is watched; when the browser drops it (the page aborts a superseded request with an
``AbortController``) the job is marked cancelled: a job still waiting for its model's lock never starts, and
a running one stops at its next :meth:`Job.check` (between a capture and the analysis that reads it).  A
cancelled job answers 499 to nobody and is counted in :attr:`Explorer.counts`.

**A click goes first.**  A *background* job (a piece of the walk's exact pass, which the page asks for piece
after piece) takes its model's lock only while no other job waits for it: a job that asks while a piece runs
(a click on a cell) waits for that piece at most, never for the rest of the pass.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ..base.errors import WalklensError
from ..costs import Limits, Shape, model_shape
from .bounds import ApiError, from_walklens

if TYPE_CHECKING:
    from starlette.requests import Request

    from ..core.loading import LoadedModel
    from ..lab.steeringcard import SteeringCard


class Cancelled(Exception):
    """The client that asked for this job is gone."""


class Job:
    """A computation for one request; :meth:`check` raises :class:`Cancelled` once its client left."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled


class Cache:
    """A small least-recently-used map (thread-safe) of at most ``size`` entries; with ``make_room`` the oldest
    entries are dropped before a new one is made, so a large one never lives next to ``size`` others."""

    def __init__(self, size: int, make_room: bool = False) -> None:
        self.size, self.make_room = size, make_room
        self._d: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                return self._d[key]
            while self.make_room and self._d and len(self._d) >= self.size:
                self._d.popitem(last=False)
        value = make()  # outside the lock: callers already hold their model's lock
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)
        return value

    def peek(self, key: Hashable) -> Any:
        """The value kept for ``key``, or None (nothing is made; the order is kept)."""
        with self._lock:
            return self._d.get(key)

    def drop(self, key: Hashable) -> None:
        """Forget the value kept for ``key`` (if any)."""
        with self._lock:
            self._d.pop(key, None)

    def __len__(self) -> int:
        return len(self._d)


@dataclass
class Explorer:
    """The server's state: ``models`` by name (in the order given), the read-only sweep database ``db``, the
    ``limits`` every view's need is checked against (``walklens serve --max-memory/--max-work``), the
    steering ``cards`` given at start (``walklens serve --card FILE``: the file's name, the card) and the patching
    documents (``walklens serve --patch FILE``: the file's name, a checked document of
    :func:`walklens.reports.patching.checked`)."""

    models: dict[str, LoadedModel]
    db: Path | None = None
    limits: Limits = field(default_factory=Limits)
    cards: list[tuple[str, SteeringCard]] = field(default_factory=list)
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    locks: dict[str, threading.Lock] = field(default_factory=dict)
    points: dict[str, list[str]] = field(default_factory=dict)  # every point name each model records
    shapes: dict[str, Shape] = field(default_factory=dict)  # what the cost model reads of each model
    traces: Cache = field(default_factory=lambda: Cache(8))  # (model, what, text, ...) -> Trace
    results: Cache = field(default_factory=lambda: Cache(16))  # (model, what, ...) -> analysis results
    attention: Cache = field(default_factory=lambda: Cache(1, make_room=True))  # traces with every layer's
    # attention (up to --max-memory): the last one is dropped before the next is captured
    counts: dict[str, int] = field(default_factory=lambda: {"computed": 0, "cancelled": 0, "refused": 0, "failed": 0})
    waiting: dict[str, int] = field(default_factory=dict)  # the foreground jobs waiting for each model's lock

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("the explorer needs at least one model")
        self.locks = {name: threading.Lock() for name in self.models}
        self.waiting = dict.fromkeys(self.models, 0)
        self._count_lock = threading.Lock()

    def model(self, name: Any) -> LoadedModel:
        if not isinstance(name, str) or name not in self.models:
            raise ApiError(f"unknown model; loaded: {', '.join(self.models)}")
        return self.models[name]

    def model_name(self, name: Any) -> str:
        """``name`` (a request's value), refused as :meth:`model` does unless it names a loaded model."""
        self.model(name)
        return str(name)

    def shape(self, name: str) -> Shape:
        """The :class:`~walklens.costs.Shape` of a loaded model (read once), with the token rows its walk holds."""
        if name not in self.shapes:
            self.shapes[name] = model_shape(self.model(name))
        return self.shapes[name]

    def count(self, what: str) -> None:
        with self._count_lock:
            self.counts[what] += 1

    def wait(self, model: str, step: int) -> None:
        """One more (``step`` 1) or one fewer (-1) foreground job waiting for ``model``'s lock."""
        with self._count_lock:
            self.waiting[model] += step


def _acquire(explorer: Explorer, model: str, job: Job, background: bool) -> None:
    """Take ``model``'s lock for ``job``; a background job only while no foreground job waits for it (taken
    and given back at once if one came meanwhile).  A job whose client left while it waited never starts."""
    lock = explorer.locks[model]
    if not background:
        explorer.wait(model, 1)
        try:
            while not lock.acquire(timeout=0.05):
                job.check()
        finally:
            explorer.wait(model, -1)
        return
    while True:
        job.check()
        if explorer.waiting[model]:
            time.sleep(0.005)
        elif lock.acquire(timeout=0.05):
            if not explorer.waiting[model]:
                return
            lock.release()  # a foreground job came while this one took the lock: it goes first


def _compute(explorer: Explorer, model: str | None, job: Job, fn: Callable[[Job], Any], background: bool) -> Any:
    lock = explorer.locks[model] if model is not None else None
    if model is not None:
        _acquire(explorer, model, job, background)
    try:
        job.check()
        try:
            return fn(job)
        except WalklensError as e:
            raise from_walklens(e) from None
    finally:
        if lock is not None:
            lock.release()


async def run_job(
    request: Request, explorer: Explorer, model: str | None, fn: Callable[[Job], Any], *, background: bool = False
) -> Any:
    """Run ``fn(job)`` in a worker thread holding ``model``'s lock (no lock when None), cancelling the job when
    the client disconnects.  The request body must have been read before (the watch reads the connection).
    ``background``: the job lets every job that waits for the lock go first (:func:`_acquire`)."""
    job = Job()
    result: Any = None

    async def watch() -> None:
        while not job.cancelled.is_set():
            if await request.is_disconnected():
                job.cancelled.set()
                return
            await anyio.sleep(0.05)

    error: BaseException | None = None
    async with anyio.create_task_group() as tg:  # errors are kept out of the group (no ExceptionGroup)
        tg.start_soon(watch)
        try:
            result = await anyio.to_thread.run_sync(_compute, explorer, model, job, fn, background)
        except Exception as e:
            error = e
        finally:
            tg.cancel_scope.cancel()
    if error is not None:
        explorer.count(
            "cancelled" if isinstance(error, Cancelled) else "refused" if isinstance(error, ApiError) else "failed"
        )
        raise error
    explorer.count("computed")
    return result
