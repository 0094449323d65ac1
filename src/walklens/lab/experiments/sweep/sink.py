"""Where a sweep's results go and how a sweep call reports (seed 000, sec. 5.1): :class:`Sink`, one sweep run's
tables in the store, and :class:`Tally`, the shards computed per kind, the progress bars and the stop after a
number of groups (tests simulate an interruption with it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import numpy as np

from ...hellaswag.store import SweepStore
from ..runner import progress_bar

#: ``on_shard(kind, n)``: called after the n-th shard of a kind (baseline, forward, test2, test1) is stored.
OnShard = Callable[[str, int], None]
#: A group as stored: its context part, its choice parts and its picks ``[metrics, outs, items]``.
GroupRow = tuple[str, Sequence[str], np.ndarray]


@dataclass
class Sink:
    """One sweep run in the store: its id and its items' gold labels (accuracies are computed against them)."""

    store: SweepStore
    run_id: int
    labels: np.ndarray

    def done(self) -> set[str]:
        """The context parts of the groups already stored."""
        return self.store.done(self.run_id)

    def kept(self) -> dict[str, tuple[np.ndarray, float]]:
        """The shards kept by an interrupted call: ``{name: (picks, seconds)}``."""
        return self.store.shards(self.run_id)

    def put_groups(
        self, rows: Sequence[GroupRow], metrics: Sequence[str], seconds: float, drop: Sequence[str] = ()
    ) -> None:
        """Store groups in one transaction, dropping the kept shards named ``drop``."""
        self.store.put_groups(self.run_id, rows, metrics, self.labels, seconds, drop_shards=drop)

    def put_shard(self, name: str, preds: np.ndarray, seconds: float) -> None:
        """Keep a finished shard's picks under ``name`` until its groups are stored."""
        self.store.put_shard(self.run_id, name, preds, seconds)


@dataclass
class Tally:
    """How a sweep call reports and stops: ``shards`` computed per kind (``on_shard(kind, n)`` after the n-th),
    progress bars, and at most ``stop_after`` groups stored per test (None: all)."""

    progress: bool = True
    on_shard: OnShard | None = None
    stop_after: int | None = None
    shards: dict[str, int] = field(default_factory=dict)

    def shard(self, kind: str) -> None:
        """One more shard of ``kind`` stored."""
        self.set(kind, self.shards.get(kind, 0) + 1)

    def set(self, kind: str, n: int) -> None:
        """``n`` shards of ``kind`` stored."""
        self.shards[kind] = n
        if self.on_shard is not None:
            self.on_shard(kind, n)

    def limit(self, rows: list[GroupRow], stored: int) -> list[GroupRow]:
        """``rows`` cut to what ``stop_after`` still allows after ``stored`` groups."""
        return rows if self.stop_after is None else rows[: max(0, self.stop_after - stored)]

    def stop(self, stored: int) -> bool:
        """Whether ``stored`` groups reach ``stop_after``."""
        return self.stop_after is not None and stored >= self.stop_after


class GroupRun:
    """An executor's groups stored so far (``computed``, those stored before counted too) and its progress bar,
    closed when the run ends (``with run: ...``)."""

    def __init__(self, sink: Sink, tally: Tally, computed: int, total: int, desc: str, show: bool = True) -> None:
        self.sink, self.tally, self.computed = sink, tally, computed
        self.bar = progress_bar(total=total, desc=desc, disable=not (tally.progress and show))

    def store(self, rows: list[GroupRow], metrics: Sequence[str], seconds: float, drop: Sequence[str] = ()) -> bool:
        """Store ``rows``, as many as ``stop_after`` still allows, dropping the kept shards named ``drop``, and
        count them; True when ``stop_after`` is reached."""
        rows = self.tally.limit(rows, self.computed)
        self.sink.put_groups(rows, metrics, seconds, drop=drop)
        self.computed += len(rows)
        self.bar.update(len(rows))
        return self.tally.stop(self.computed)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.bar.close()


__all__ = ["GroupRow", "GroupRun", "OnShard", "Sink", "Tally"]
