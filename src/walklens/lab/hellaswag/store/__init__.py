"""The walklens database file: one SQLite file (WAL) holding the results of single runs and of sweeps.

* :mod:`.db` — opening a file with an integrity check, each store's schema version (over :mod:`walklens.base.sqlite`:
  write transactions, pragmas, the ``meta`` table);
* :mod:`.results` — :class:`ResultStore`: single runs and per-item results, resume, CSV/Parquet export;
* :mod:`.sweeps` — :class:`SweepStore`: every scheme's per-item picks of a sweep, packed 2 bits each.
"""

from __future__ import annotations

from .db import connect
from .results import KEY_COLUMNS, SCHEMA_VERSION, ItemResult, ResultStore, RunKey, default_db_path
from .sweeps import COUNT_CHUNK_ELEMS, SweepResults, SweepRun, SweepStore, pack_predictions, unpack_predictions

__all__ = [
    "COUNT_CHUNK_ELEMS",
    "KEY_COLUMNS",
    "SCHEMA_VERSION",
    "ItemResult",
    "ResultStore",
    "RunKey",
    "SweepResults",
    "SweepRun",
    "SweepStore",
    "connect",
    "default_db_path",
    "pack_predictions",
    "unpack_predictions",
]
