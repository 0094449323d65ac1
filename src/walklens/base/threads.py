"""How many CPU threads a command runs: ``--threads N`` when given, else torch's own count, and never anything the
machine's load decides.

Torch's own count is ``OMP_NUM_THREADS`` when that is set, else the cores torch sees.  walklens does not change it
on its own: the same command runs the same threads whatever else the machine is doing, so its timings can be
compared from run to run.

Why the count matters on a shared machine: PyTorch's CPU wheels run each operation on a GNU OpenMP team whose
threads spin at the barrier while they wait for one another.  When another process holds one of the cores, every
operation waits for the thread that is not running: on a 2-core machine one competing process made
``walklens hellaswag test1 --limit 60`` 2.0-2.2x and the baseline 2.0-2.6x slower than quiet with two threads,
against ~1.2x with one thread (``benchmarks/bench_busy.py``, docs/dtype.md).  So on a busy machine fewer threads
(``--threads 1`` there) are often faster; on a terminal the CLI says so in one line (:func:`busy_note`), and
changes nothing.  The passive wait policy (``OMP_WAIT_POLICY=PASSIVE``) halves the busy slowdown but made the quiet
baseline 1.5-2x slower, so it is not set either; a user may set it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .numbers import Range

__all__ = ["busy_note", "runnable_others", "set_threads"]  # and THREADS, a Range (walklens.base.numbers)

LOADAVG = "/proc/loadavg"

#: What ``--threads`` may be.
THREADS = Range(1, 1024, integer=True)


def _read_loadavg() -> str:
    with open(LOADAVG, encoding="ascii") as f:
        return f.read()


def runnable_others(read: Callable[[], str] = _read_loadavg, samples: int = 5, gap: float = 0.01) -> int | None:
    """Processes running or runnable now besides this one: the least of ``samples`` readings of the fourth field
    of ``/proc/loadavg`` (``running/total``) minus 1; ``None`` where it cannot be read (not Linux)."""
    seen = []
    for i in range(samples):
        try:
            running = int(read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        seen.append(running)
        if i + 1 < samples:
            time.sleep(gap)
    return max(0, min(seen) - 1)


def set_threads(chosen: int | None) -> int:
    """Run torch on ``chosen`` threads (``None``: leave torch's own count); the count it now runs."""
    import torch

    if chosen is not None and chosen != torch.get_num_threads():
        torch.set_num_threads(chosen)
    return torch.get_num_threads()


def busy_note(threads: int, cores: int | None = None, others: int | None = None) -> str | None:
    """One line saying that ``threads`` need cores other processes hold, and which ``--threads`` would not; ``None``
    when they fit (or the load cannot be read).  ``cores``: this process's CPUs (its affinity); ``others``:
    :func:`runnable_others`.  It only informs: nothing is changed."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    others = others if others is not None else runnable_others()
    if others is None or others == 0 or threads <= 1:
        return None
    free = max(1, cores - others)
    if threads <= free:
        return None
    s = "es" if others != 1 else ""
    return (
        f"{others} other process{s} running on the {cores} cores: torch's {threads} threads wait for busy cores at "
        f"every operation, so --threads {free} may be faster (docs/dtype.md)"
    )
