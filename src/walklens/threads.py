"""How many CPU threads a command runs: one per core that no other process is using when it starts.

PyTorch's CPU wheels run each operation on a GNU OpenMP team whose threads spin at the barrier while they wait
for one another.  When another process holds one of the cores, every operation waits for the thread that is not
running: on this 2-core machine one competing process made ``walklens hellaswag test1 --limit 60`` 2.0-2.2x and
the baseline 2.0-2.6x slower than quiet with two threads, against ~1.2x with one thread
(``benchmarks/bench_busy.py``, docs/dtype.md).  The passive wait policy (``OMP_WAIT_POLICY=PASSIVE``) halves
the busy slowdown but made the quiet baseline 1.5-2x slower (its many short parallel regions pay a wake-up each),
so it is not the default; a user may still set it.

So the CLI counts the processes running or runnable now besides itself (``/proc/loadavg``'s fourth field, the
least of a few samples) and runs on the cores left: :func:`choose_threads`.  It only ever lowers torch's own
default, and it leaves alone a count the user chose (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``).  A competitor
that starts later is not seen.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["choose_threads", "runnable_others"]

LOADAVG = "/proc/loadavg"
USER_SET = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


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


def choose_threads(default: int, cores: int | None = None, others: int | None = None) -> int:
    """The threads to run: ``default`` (torch's own count) lowered to the cores no other process is using, at
    least 1.  ``cores``: this process's CPUs (its affinity); ``others``: :func:`runnable_others`."""
    if any(os.environ.get(k) for k in USER_SET):
        return default
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    others = others if others is not None else runnable_others()
    if others is None:
        return default
    return max(1, min(default, cores - others))
