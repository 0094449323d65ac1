"""The sweep tables (seed 000, sec. 5.1): every scheme's per-item picks, 2 bits each, one row per context group.

In the walklens database file beside the results tables (:mod:`.results`), in two tables of their own:
``sweep_runs`` (one row per model, data, split, shots, test and item set) and ``sweep_groups`` (one row per
context group: the choice parts of its schemes, their accuracies and their predictions packed 2 bits per item),
so a million schemes are a few thousand rows.  :func:`~walklens.lab.experiments.sweep.run_sweep` writes a bundle's
groups in one transaction; a killed sweep resumes at the first unstored group.

A third table, ``sweep_shards``, holds finished shards of work whose groups are not stored yet (a Test 1 scheme
block is cut into item ranges): the picks of one shard, dropped in the transaction that stores its groups.
Older databases get it when a sweep next writes to them; readers never need it, so the schema version is
unchanged.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ....base.errors import InputError
from ....base.sqlite import ClosedOnExit, closed_on_error, tables, transaction
from .counts import Cells, Counts, cell_counts, count_cells
from .db import FIX, Row, StoreTables, int_list, open_store, str_list

#: the shape of a stored scheme name: ``key=value`` parts joined by commas
_NAME = re.compile(r"[a-z_]+=[^,=\s]+(?:,[a-z_]+=[^,=\s]+)*")

#: The layout of the sweep tables (``sweep_schema`` in ``meta``; see :func:`~.db.open_tables`).
SCHEMA_VERSION = 1

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS sweep_runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  model TEXT NOT NULL, data TEXT NOT NULL, split TEXT NOT NULL, shots INTEGER NOT NULL, test INTEGER NOT NULL,
  items_hash TEXT NOT NULL, n_items INTEGER NOT NULL, labels BLOB NOT NULL, item_index TEXT NOT NULL,
  arch TEXT NOT NULL, n_layers INTEGER NOT NULL,
  baseline_acc REAL, baseline_acc_norm REAL, baseline_preds BLOB,
  created REAL NOT NULL,
  UNIQUE(model, data, split, shots, test, items_hash)
)""",
    """CREATE TABLE IF NOT EXISTS sweep_groups (
  run_id INTEGER NOT NULL REFERENCES sweep_runs(id),
  context TEXT NOT NULL,          -- Scheme.context_part(): enc=..,layer=..,word=..,norm=..,seg=..,ex=..(,sim=..)
  outs TEXT NOT NULL,             -- JSON list of Scheme.out_part() (out_layer=..,out_word=..), '' for Test 1
  metrics TEXT NOT NULL,          -- JSON list: ["acc"] (Test 2) or ["acc", "acc_norm"] (Test 1)
  acc BLOB NOT NULL,              -- float32 [metrics, outs]
  preds BLOB NOT NULL,            -- 2-bit packed [metrics, outs, items]
  seconds REAL NOT NULL,
  PRIMARY KEY (run_id, context)
)""",
    """CREATE TABLE IF NOT EXISTS sweep_shards (
  run_id INTEGER NOT NULL REFERENCES sweep_runs(id),
  shard TEXT NOT NULL,            -- the shard's key (what it computed, e.g. a Test 1 block and item range)
  shape TEXT NOT NULL,            -- JSON shape of the picks
  preds BLOB NOT NULL,            -- 2-bit packed picks
  seconds REAL NOT NULL,
  PRIMARY KEY (run_id, shard)
)""",
)
_TABLES = StoreTables("sweep", "sweep_schema", SCHEMA_VERSION, _SCHEMA, "SQLite database")

_RUN_COLUMNS = (
    "id",
    "model",
    "data",
    "split",
    "shots",
    "test",
    "items_hash",
    "n_items",
    "labels",
    "item_index",
    "arch",
    "n_layers",
    "baseline_acc",
    "baseline_acc_norm",
    "baseline_preds",
)

#: predictions (schemes x items) unpacked at a time by :meth:`SweepStore.load_counts` (about 16 MB per metric)
COUNT_CHUNK_ELEMS = 1 << 24
#: Bounds on the values read back (:class:`~.db.Row`): items of a run, outputs of a group, picks of a shard.
MAX_ITEMS = 10_000_000
MAX_OUTS = 1_000_000
MAX_SHARD_PICKS = 1 << 34
METRICS = ("acc", "acc_norm")
ARCHS = ("decoder", "encoder", "encoder-decoder")


def pack_predictions(pred: np.ndarray) -> bytes:
    """Pack choice indices 0..3 two bits each (``pred``: any shape, flattened in C order)."""
    p = np.ascontiguousarray(pred, dtype=np.uint8).ravel()
    if p.size and p.max() > 3:
        raise ValueError("predictions must be 0..3")
    pad = (-p.size) % 4
    q = np.concatenate([p, np.zeros(pad, np.uint8)]).reshape(-1, 4)
    return (q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)).astype(np.uint8).tobytes()


def packed_size(n: int) -> int:
    """Bytes of :func:`pack_predictions` of ``n`` picks."""
    return (n + 3) // 4


def _run_row(path: Path, d: dict[str, Any]) -> dict[str, Any]:
    """A ``sweep_runs`` row checked field by field (:class:`~.db.Row`), its blobs and JSON decoded."""
    r = Row(path, "sweep_runs", f"id={d['id']!r}"[:60])
    r.integer("id", d["id"], -(2**63), 2**63 - 1)
    for f in ("model", "data", "split", "items_hash"):
        r.text(f, d[f])
    r.integer("shots", d["shots"], 0, 1_000_000)
    r.integer("test", d["test"], 1, 2)
    n = r.integer("n_items", d["n_items"], 1, MAX_ITEMS)
    labels = np.frombuffer(r.blob("labels", d["labels"], n), np.uint8).copy()
    if labels.max() > 3:
        raise r.fail("labels", "a label is not 0..3")
    d["labels"] = labels
    d["item_index"] = r.json(
        "item_index", d["item_index"], lambda x: int_list(x, n), f"a list of {n:,} item indices (integers >= 0)"
    )
    if r.text("arch", d["arch"]) not in ARCHS:
        raise r.fail("arch", f"{d['arch'][:40]!r} is not one of {', '.join(ARCHS)}")
    r.integer("n_layers", d["n_layers"], 0, 1_000_000)
    for f in ("baseline_acc", "baseline_acc_norm"):
        d[f] = r.real(f, d[f], 0.0, 1.0, null=True)
    if d["baseline_preds"] is not None:
        blob = r.blob("baseline_preds", d["baseline_preds"], packed_size(2 * n))
        d["baseline_preds"] = unpack_predictions(blob, 2 * n).reshape(2, -1)
    return d


def _group_row(
    path: Path, rowid: Any, ctx: Any, outs: Any, mets: Any, acc: Any, pb: Any, n: int
) -> tuple[str, list[str], list[str], np.ndarray, bytes]:
    """A ``sweep_groups`` row of a run of ``n`` items, checked field by field: (context, outs, metrics,
    acc [metrics, outs], packed predictions)."""
    r = Row(path, "sweep_groups", f"rowid={rowid}")
    ctx = r.text("context", ctx)
    outs_l = r.json(
        "outs",
        outs,
        lambda x: str_list(x, 1) and len(x) <= MAX_OUTS,
        f"a list of 1 to {MAX_OUTS:,} output parts (strings)",
    )
    mets_l = r.json(
        "metrics",
        mets,
        lambda x: str_list(x, 1) and len(set(x)) == len(x) and set(x) <= set(METRICS),
        f"a list of distinct metrics out of {', '.join(METRICS)}",
    )
    cells = len(mets_l) * len(outs_l)
    a = np.frombuffer(r.blob("acc", acc, 4 * cells), np.float32).reshape(len(mets_l), len(outs_l))
    if not (np.isfinite(a).all() and (a >= 0).all() and (a <= 1).all()):
        raise r.fail("acc", "an accuracy is not a number from 0 to 1")
    return ctx, outs_l, mets_l, a, r.blob("preds", pb, packed_size(cells * n))


def _check_names(path: Path, rowid: Any, ctx: str, outs: list[str], seen: set[str]) -> None:
    """The group's scheme names have the shape of scheme names (``key=value`` parts joined by commas): its
    context part, and each output part not met before in the run (``seen``).  The store keeps names as text;
    what a name means is the scheme grammar's (:mod:`walklens.analyses.concepts.schemes`), read above this layer."""
    r = Row(path, "sweep_groups", f"rowid={rowid}")
    for field, name in [("context", ctx)] + [("outs", f"{ctx},{o}") for o in outs if o and o not in seen]:
        if not _NAME.fullmatch(name):
            raise r.fail(field, "not a scheme name (key=value parts joined by commas)")
    seen.update(outs)


def unpack_predictions(blob: bytes, n: int) -> np.ndarray:
    """Inverse of :func:`pack_predictions`: the first ``n`` choice indices (uint8)."""
    b = np.frombuffer(blob, dtype=np.uint8)
    p = np.stack([b & 3, (b >> 2) & 3, (b >> 4) & 3, (b >> 6) & 3], axis=1).ravel()
    return p[:n].copy()


@dataclass(frozen=True)
class SweepRun:
    """A sweep run as ``sweep_runs`` holds it: what identifies it (model, data key, split, shots, test and its
    items: their indices and gold labels, hashed) and the model facts kept with it (architecture, layers)."""

    model: str
    data: str
    split: str
    shots: int
    test: int
    labels: Sequence[int]
    item_index: Sequence[int]
    arch: str
    n_layers: int

    @property
    def items_hash(self) -> str:
        """16 hex digits of the SHA-256 of the item indices and labels (the key's item set)."""
        return hashlib.sha256(
            json.dumps([list(map(int, self.item_index)), list(map(int, self.labels))]).encode()
        ).hexdigest()[:16]


@dataclass
class SweepResults:
    """All stored schemes of one sweep run: ``acc[metric, scheme]``, and either ``preds[metric, scheme, item]``
    (:meth:`SweepStore.load`) or ``hits[metric, scheme, cell]`` over the partition ``cells``
    (:meth:`SweepStore.load_counts`)."""

    run: dict[str, Any]
    schemes: list[str]
    metrics: list[str]
    acc: np.ndarray
    preds: np.ndarray | None = None
    hits: np.ndarray | None = None
    cells: Cells | None = None

    @property
    def labels(self) -> np.ndarray:
        return self.run["labels"]

    def correct(self, metric: str = "acc") -> np.ndarray:
        """Boolean ``[schemes, items]``: did the scheme pick the gold ending."""
        if self.preds is None:
            raise ValueError("loaded without predictions")
        return self.preds[self.metrics.index(metric)] == self.labels[None, :]

    def baseline(self, metric: str = "acc") -> float | None:
        v = self.run["baseline_acc" if metric == "acc" else "baseline_acc_norm"]
        return None if v is None else float(v)

    def counts(self, metric: str = "acc", k: int = 5, seed: int = 0) -> Counts:
        """:class:`~.counts.Counts` over ``Cells.build(items, min(k, items), seed)``: the streamed table when
        loaded by :meth:`SweepStore.load_counts` with that partition, else computed from the predictions."""
        n = len(self.labels)
        want = (min(k, n), seed)
        if self.hits is not None and self.cells is not None and (self.cells.k, self.cells.seed) == want:
            return Counts(hits=self.hits[self.metrics.index(metric)], cells=self.cells)
        if self.preds is None:
            raise ValueError(f"loaded without predictions, with counts for other folds than k={k}, seed={seed}")
        return cell_counts(self.correct(metric), Cells.build(n, *want))


@dataclass
class _Group:
    """One stored row of ``sweep_groups``, decoded but for its packed predictions."""

    names: list[str]
    metrics: list[str]
    acc: np.ndarray  # float32 [metrics, outs]
    packed: bytes

    def preds(self, n: int) -> np.ndarray:
        """The group's predictions ``[metrics, outs, n]``."""
        M, O = self.acc.shape
        return unpack_predictions(self.packed, M * O * n).reshape(M, O, n)


class SweepStore(ClosedOnExit):
    """The sweep's tables inside an SQLite database file (WAL mode; every write one transaction).

    Two processes may sweep into the same file at once: each group is written with ``INSERT OR IGNORE``
    inside a transaction (SQLite serialises writers; ``busy_timeout`` waits), so the file is never corrupted
    and a group computed by both is stored once, with the same content.  Opening checks the file
    (:func:`~.db.connect`: a damaged database is refused) and the sweep tables' schema version (a newer one is
    refused); ``readonly`` (the report) never creates or changes it.
    """

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        self.con = open_store(self.path, _TABLES, timeout=60.0, readonly=readonly)
        with closed_on_error(self.con, lambda e: f"{self.path}: not a usable SQLite database ({e}); {FIX}"):
            self._has_tables = {"sweep_runs", "sweep_groups"} <= tables(self.con)

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
        """Rows of a query; a read error (a page damaged after opening) is one :class:`InputError`."""
        try:
            yield from self.con.execute(sql, args)
        except sqlite3.DatabaseError as e:
            raise InputError(f"{self.path}: cannot read the database ({e}); if it is damaged, {FIX}") from None

    def close(self) -> None:
        self.con.close()

    # ---- runs ----------------------------------------------------------------------------------------------
    def run_id(self, run: SweepRun) -> int:
        """The id of ``run`` (created on first use)."""
        key = (run.model, run.data, run.split, int(run.shots), int(run.test), run.items_hash)
        with transaction(self.con) as c:
            c.execute(
                "INSERT OR IGNORE INTO sweep_runs (model,data,split,shots,test,items_hash,n_items,labels,item_index,"
                "arch,n_layers,created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    *key,
                    len(run.labels),
                    bytes(np.asarray(run.labels, np.uint8)),
                    json.dumps(list(map(int, run.item_index))),
                    run.arch,
                    int(run.n_layers),
                    time.time(),
                ),
            )
        row = self.con.execute(
            "SELECT id FROM sweep_runs WHERE model=? AND data=? AND split=? AND shots=? AND test=? AND items_hash=?",
            key,
        ).fetchone()
        return int(row[0])

    def set_baseline(self, run_id: int, acc: float, acc_norm: float, preds: np.ndarray) -> None:
        """The baseline of the same items, model and shots (normalised score = acc / baseline acc)."""
        self.con.execute(
            "UPDATE sweep_runs SET baseline_acc=?, baseline_acc_norm=?, baseline_preds=? WHERE id=?",
            (float(acc), float(acc_norm), pack_predictions(preds), run_id),
        )

    def runs(self) -> list[dict[str, Any]]:
        """Every sweep run, with its labels, item indices and baseline picks decoded, each value checked
        (one line naming the row and field for a bad one)."""
        if not self._has_tables:  # a database opened readonly that never held a sweep
            return []
        return [
            _run_row(self.path, dict(zip(_RUN_COLUMNS, r)))
            for r in list(self._rows(f"SELECT {','.join(_RUN_COLUMNS)} FROM sweep_runs ORDER BY id"))
        ]

    def _run(self, run_id: int) -> dict[str, Any]:
        run = next((r for r in self.runs() if r["id"] == run_id), None)
        if run is None:
            raise InputError(f"{self.path}: no sweep run {run_id}")
        return run

    # ---- groups ---------------------------------------------------------------------------------------------
    def done(self, run_id: int) -> set[str]:
        """The context parts of the groups already stored for a run."""
        return {r[0] for r in self.con.execute("SELECT context FROM sweep_groups WHERE run_id=?", (run_id,))}

    def put_group(
        self,
        run_id: int,
        context: str,
        outs: Sequence[str],
        metrics: Sequence[str],
        preds: np.ndarray,
        labels: np.ndarray,
        seconds: float,
    ) -> None:
        """Store one group: ``preds`` ``[metrics, outs, items]`` choice indices."""
        self.put_groups(run_id, [(context, outs, preds)], metrics, labels, seconds)

    def put_groups(
        self,
        run_id: int,
        groups: Sequence[tuple[str, Sequence[str], np.ndarray]],
        metrics: Sequence[str],
        labels: np.ndarray,
        seconds: float,
        drop_shards: Sequence[str] = (),
    ) -> None:
        """Store several groups ``(context, outs, preds [metrics, outs, items])`` in one transaction (groups
        already stored are left as they are), dropping the shards ``drop_shards`` they were assembled from."""
        rows = []
        for context, outs, preds in groups:
            acc = (preds == labels[None, None, :]).mean(axis=-1).astype(np.float32)
            rows.append(
                (
                    run_id,
                    context,
                    json.dumps(list(outs)),
                    json.dumps(list(metrics)),
                    acc.tobytes(),
                    pack_predictions(preds),
                    float(seconds),
                )
            )
        with transaction(self.con) as c:
            c.executemany("INSERT OR IGNORE INTO sweep_groups VALUES (?,?,?,?,?,?,?)", rows)
            c.executemany("DELETE FROM sweep_shards WHERE run_id=? AND shard=?", [(run_id, k) for k in drop_shards])

    # ---- shards of groups not stored yet ----------------------------------------------------------------------
    def put_shard(self, run_id: int, shard: str, preds: np.ndarray, seconds: float) -> None:
        """Keep one finished shard's picks (any shape, values 0..3) until its groups are stored."""
        with transaction(self.con) as c:
            c.execute(
                "INSERT OR IGNORE INTO sweep_shards VALUES (?,?,?,?,?)",
                (run_id, shard, json.dumps(list(preds.shape)), pack_predictions(preds), float(seconds)),
            )

    def shards(self, run_id: int) -> dict[str, tuple[np.ndarray, float]]:
        """The kept shards of a run: ``{key: (picks, seconds)}``."""
        out = {}
        for rowid, key, shape, blob, sec in self._rows(
            "SELECT rowid, shard, shape, preds, seconds FROM sweep_shards WHERE run_id=?", (run_id,)
        ):
            r = Row(self.path, "sweep_shards", f"rowid={rowid}")
            dims = r.json(
                "shape",
                shape,
                lambda x: int_list(x, None, 0, MAX_SHARD_PICKS) and 0 < len(x) <= 8 and math.prod(x) <= MAX_SHARD_PICKS,
                f"a shape of at most {MAX_SHARD_PICKS:,} picks",
            )
            size = math.prod(dims)
            out[r.text("shard", key)] = (
                unpack_predictions(r.blob("preds", blob, packed_size(size)), size).reshape(dims),
                r.real("seconds", sec, 0.0, math.inf),
            )
        return out

    def _groups(self, run_id: int) -> Iterator[_Group]:
        """The stored groups of a run in the order of their context part (one set of metrics throughout), each
        row checked against the run's item count."""
        n = int(self._run(run_id)["n_items"])
        metrics: list[str] | None = None
        seen: set[str] = set()
        for row in self._rows(
            "SELECT rowid, context, outs, metrics, acc, preds FROM sweep_groups WHERE run_id=? ORDER BY context",
            (run_id,),
        ):
            ctx, outs_l, mets_l, acc, pb = _group_row(self.path, row[0], row[1], row[2], row[3], row[4], row[5], n)
            _check_names(self.path, row[0], ctx, outs_l, seen)
            if metrics is None:
                metrics = mets_l
            elif mets_l != metrics:
                raise Row(self.path, "sweep_groups", f"rowid={row[0]}").fail(
                    "metrics", f"{mets_l} are not the metrics {metrics} of run {run_id}'s other groups"
                )
            yield _Group(names=[f"{ctx},{o}" if o else ctx for o in outs_l], metrics=mets_l, acc=acc, packed=pb)

    def iter_groups(self, run_id: int) -> Iterator[tuple[list[str], list[str], np.ndarray]]:
        """Every stored group of a run in the order of its context part, one at a time: (scheme names, metrics,
        predictions ``[metrics, schemes, items]``), so two runs can be walked side by side in O(group) memory."""
        n = int(self._run(run_id)["n_items"])
        for g in self._groups(run_id):
            yield g.names, g.metrics, g.preds(n)

    def load(self, run_id: int, with_preds: bool = True) -> SweepResults:
        """Every stored scheme of a run: names, accuracy per metric and (optionally) predictions, dense
        ``[metrics, schemes, items]`` (a full grid over all items is gigabytes: see :meth:`load_counts`)."""
        run = self._run(run_id)
        n = int(run["n_items"])
        groups = list(self._groups(run_id))
        metrics = groups[0].metrics if groups else ["acc"]
        names = [s for g in groups for s in g.names]
        A = np.concatenate([g.acc for g in groups], axis=1) if groups else np.zeros((len(metrics), 0), np.float32)
        Pr = np.concatenate([g.preds(n) for g in groups], axis=1) if groups and with_preds else None
        return SweepResults(run=run, schemes=names, metrics=metrics, acc=A, preds=Pr)

    def load_rows(self, run_id: int, rows: Sequence[int]) -> np.ndarray:
        """The predictions ``[metrics, len(rows), items]`` of the schemes at positions ``rows`` of the stored order
        (:meth:`load`'s), streamed a group at a time: a few schemes of a full grid without the dense matrix."""
        n = int(self._run(run_id)["n_items"])
        want = {int(r): j for j, r in enumerate(rows)}
        out: np.ndarray | None = None
        a = 0
        for g in self._groups(run_id):
            hit = [(r - a, want[r]) for r in range(a, a + len(g.names)) if r in want]
            if hit:
                p = g.preds(n)
                if out is None:
                    out = np.zeros((len(g.metrics), len(want), n), np.uint8)
                for local, j in hit:
                    out[:, j] = p[:, local]
            a += len(g.names)
        if out is None or any(r >= a or r < 0 for r in want):
            raise InputError(f"{self.path}: sweep run {run_id} holds {a} schemes, asked for rows {sorted(want)[:5]}")
        return out

    def load_counts(self, run_id: int, k: int = 5, seed: int = 0, chunk: int | None = None) -> SweepResults:
        """Every stored scheme of a run with, instead of predictions, its hits per cell of the item partition
        ``Cells.build(n, min(k, n), seed)`` (:mod:`..stats`: all the held-out statistics need).

        The 2-bit predictions are streamed from the database ``chunk`` schemes at a time (default: about
        :data:`COUNT_CHUNK_ELEMS` predictions; never less than one group) and each chunk is reduced at once,
        so memory is O(schemes x 2k + chunk x items), not the dense O(schemes x items) of :meth:`load`.  The
        counts equal those of the dense correctness matrix exactly (integers)."""
        run = self._run(run_id)
        n = int(run["n_items"])
        labels = run["labels"]
        cells = Cells.build(n, min(k, n), seed)
        onehot = cells.onehot(np.float32 if n < (1 << 24) else np.float64)
        rows = max(1, chunk if chunk else COUNT_CHUNK_ELEMS // max(n, 1))
        names: list[str] = []
        accs: list[np.ndarray] = []
        hits: list[np.ndarray] = []
        pending: list[_Group] = []  # groups not yet reduced
        metrics = ["acc"]

        def flush() -> None:
            block = np.empty((len(metrics), sum(len(g.names) for g in pending), n), np.uint8)
            a = 0
            for g in pending:
                block[:, a : a + len(g.names)] = g.preds(n)
                a += len(g.names)
            hits.append(
                np.stack([count_cells(block[m] == labels[None, :], cells, onehot) for m in range(len(block))]).astype(
                    np.int32
                )
            )
            pending.clear()

        for g in self._groups(run_id):
            metrics = g.metrics
            names += g.names
            accs.append(g.acc)
            pending.append(g)
            if sum(len(p.names) for p in pending) >= rows:
                flush()
        if pending:
            flush()
        A = np.concatenate(accs, axis=1) if accs else np.zeros((len(metrics), 0), np.float32)
        H = np.concatenate(hits, axis=1) if hits else np.zeros((len(metrics), 0, cells.n_cells), np.int32)
        return SweepResults(run=run, schemes=names, metrics=metrics, acc=A, hits=H, cells=cells)
