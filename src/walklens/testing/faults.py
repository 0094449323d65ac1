"""Faults to inject into a distributed sweep's workers (the tests of :mod:`walklens.core.backends`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CrashOnce:
    """A worker hook (:class:`~walklens.core.backends.ray_backend.RayBackend` ``hook``) that kills its worker process
    (``os._exit``, no cleanup: as a node failure would) before the ``at``-th shard it runs, the first time only:
    ``marker`` is created just before, and a worker that finds it runs on.  Every worker shares the marker, so
    exactly one crash happens in a run."""

    marker: str
    at: int = 2

    def __call__(self, n: int) -> None:
        if n != self.at:
            return
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os._exit(1)

    @property
    def crashed(self) -> bool:
        return Path(self.marker).exists()
