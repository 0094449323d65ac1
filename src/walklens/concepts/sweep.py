"""The composition-scheme sweep at full scale: one forward pass serves every scheme (seed 000, sec. 5.1, A.6).

How the cost of ~10^6 schemes is kept near the cost of one:

1. **Distinct texts, one pass each.**  Every encoding scheme of A.6 cuts an item's context into segments
   (sentences, context/completion parts, examples, everything); the choices are one segment each.  The set
   of distinct segment texts over all items and encoding schemes is run through the model once each (texts
   of equal token length are batched, so no padding touches the numbers), keeping only the layers of the
   layer set.
2. **Word aggregation once per (text, layer, word scheme).**  The ``[T, D]`` hidden states of a text are
   reduced right away by every WORD_AGG_SCHEME (A.6) into a :class:`VectorBank` ``[texts, layers, words, D]``
   (the hidden states themselves are dropped), optionally cached on disk as safetensors.
3. **Test 2: one batched product per bundle.**  Context groups (enc, layer, word, NORM, SEGMENT_AGG,
   EXAMPLE_AGG, SIMILARITY_FUNC; each holding its (out_layer, out_word) schemes) that differ only in
   (layer, word) form a bundle.  For a chunk of items, the context sequences of all (layer, word) pairs
   ``[n, m, P, D]`` (masked padding) meet all choice vectors ``[n, C, Q, D]`` in one ``bmm``; the best match
   is a masked max, ``soft_cluster`` uses the weights and a Gram matrix instead of per-choice vectors.
   Bit-identical layers (``E`` = hidden state 0 without absolute positions) and encodings that cut every
   item identically are computed once.
4. **Test 1** still needs a model pass per (concept sequence, ending): the engine's
   :func:`~.packing.packed_logliks` (context once per request, requests packed into shared forward passes).
   Shared across schemes: the segment vectors (from the bank) and identical concept sequences (a bit-exact
   memo, which collapses e.g. every SEGMENT_AGG/EXAMPLE_AGG of a one-segment zero-shot context).  What
   remains is one such call per distinct concept sequence and item.

Results go into the same SQLite file as single runs (issue 4's store), in two tables of their own:
``sweep_runs`` (one row per model, data, split, shots, test and item set) and ``sweep_groups`` (one row per
context group with the predictions of all its schemes packed 2 bits per item): a million schemes are a few
thousand rows.  A bundle's groups are written in one transaction, so a killed sweep resumes at the first
unstored group and the final table is identical to an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from ..errors import InputError
from .grid import group_by_context
from .stats import Cells, Counts, cell_counts, count_cells
from .store import connect, tables

Tensor = torch.Tensor

# ======================================================================================================
# Items: the segmentation of each item under every encoding scheme
# ======================================================================================================


@dataclass(frozen=True)
class ItemPlan:
    """One HellaSwag item, cut by every encoding scheme that the grid uses.

    ``contexts[enc]`` is the context as a list of examples, each a list of segment texts (A.6: examples are
    the few-shot examples followed by the query); ``endings`` are the four choice texts as fed to the model;
    ``label`` the gold ending; ``ending_chars`` the character counts used by acc_norm (Test 1).
    """

    index: int
    label: int
    contexts: dict[str, tuple[tuple[str, ...], ...]]
    endings: tuple[str, ...]
    ending_chars: tuple[int, ...]

    def texts(self) -> Iterator[str]:
        for ex in self.contexts.values():
            for seg in ex:
                yield from seg
        yield from self.endings


# ======================================================================================================
# The vector bank: every (text, layer, word aggregation) reduced once
# ======================================================================================================


@dataclass
class VectorBank:
    """Word-aggregated vectors ``vectors[text, layer, word, D]`` (before NORM) of every distinct text.

    ``layers`` are resolved layer keys (``"E"`` or a hidden-state index 0..N, A.6), ``words`` the
    WORD_AGG_SCHEME names, ``index`` maps a text to its row.
    """

    layers: tuple[str, ...]
    words: tuple[str, ...]
    index: dict[str, int]
    vectors: Tensor

    def layer_alias(self) -> list[int]:
        """For each bank layer, the first layer whose vectors are bit-identical to it (itself if none): e.g.
        ``E`` and hidden state ``0`` coincide in models without absolute position embeddings."""
        out = []
        for i in range(len(self.layers)):
            out.append(next((j for j in range(i) if out[j] == j and torch.equal(self.vectors[:, i], self.vectors[:, j])),
                            i))
        return out

    def rows(self, texts: Sequence[str]) -> Tensor:
        return self.vectors[[self.index[t] for t in texts]]

    def layer_pos(self, key: str) -> int:
        return self.layers.index(key)

    def word_pos(self, word: str) -> int:
        return self.words.index(word)


def text_key(model_name: str, text: str) -> str:
    return hashlib.sha256(f"{model_name}\x00{text}".encode()).hexdigest()


def layer_keys(lm: Any, layers: Iterable[str]) -> dict[str, str]:
    """Scheme layer values (``E``, ``middle``, ``-1``, ...) → bank keys (``"E"`` or the hidden-state index)."""
    from .schemes import resolve_layer

    out = {}
    for l in layers:
        r = resolve_layer(str(l), lm.n_layers)
        out[str(l)] = "E" if r is None else str(r)
    return out


def _cache_sources(cache: Path, tag: str, lm: Any, layers: Sequence[str], words: Sequence[str]
                   ) -> list[tuple[Path, list[int] | None, list[int] | None]]:
    """Cache folders that hold these (layers, words) for this model: its own (``tag``, created with a
    ``meta.json``), then any folder written for a superset of layers and words (read back by slicing).
    Returns ``(folder, layer positions, word positions)``; ``None`` positions: the folder is an exact match."""
    own = cache / tag
    own.mkdir(parents=True, exist_ok=True)
    meta = {"model": lm.name, "n_layers": lm.n_layers, "d_model": lm.d_model, "layers": list(layers),
            "words": list(words)}
    if not (own / "meta.json").is_file():
        tmp = own / f"meta.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(meta), encoding="utf-8")
        tmp.replace(own / "meta.json")
    out: list[tuple[Path, list[int] | None, list[int] | None]] = [(own, None, None)]
    for d in sorted(cache.iterdir()):
        if d == own or not (d / "meta.json").is_file():
            continue
        try:
            m = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (m.get("model"), m.get("n_layers"), m.get("d_model")) != (lm.name, lm.n_layers, lm.d_model):
            continue
        if set(layers) <= set(m["layers"]) and set(words) <= set(m["words"]):
            out.append((d, [m["layers"].index(l) for l in layers], [m["words"].index(w) for w in words]))
    return out


def build_bank(lm: Any, texts: Iterable[str], layers: Sequence[str], words: Sequence[str], *,
               cache_dir: str | Path | None = None, batch_tokens: int = 2048, progress: bool = True) -> VectorBank:
    """Run every distinct text once and reduce its hidden states by every word aggregation.

    ``layers``: bank keys (``"E"`` or a hidden-state index ``"0"``..``"N"``; hidden state ``l`` is the input of
    layer ``l`` and ``N`` the top of the stack after the final norm, A.6 ENCODING_LAYER).  Each text is
    tokenised and run exactly as the single-scheme runner does (:func:`~.encode.segment_token_ids`,
    :func:`~.encode.hidden_states`; a BOS prefix conditions the segment but is left out of the aggregation).
    Texts of equal token length share a batch, so no padding enters any number.  With ``cache_dir``, each
    reduced text is also written there (safetensors, atomically) and read back on the next run, also by runs
    that need a subset of these layers and word aggregations (a Test 1 grid after a full Test 2 grid).
    """
    from .encode import hidden_states, n_prefix_tokens, segment_token_ids
    from .schemes import word_aggregate

    uniq = list(OrderedDict.fromkeys(texts))
    layers = tuple(layers)
    words = tuple(words)
    D = lm.d_model
    out = torch.empty(len(uniq), len(layers), len(words), D, dtype=torch.float32)
    todo: list[int] = []
    cache = Path(cache_dir) if cache_dir else None
    tag = hashlib.sha256(json.dumps([lm.name, lm.n_layers, D, list(layers), list(words)]).encode()).hexdigest()[:12]
    if cache:
        from safetensors.torch import load_file

        sources = _cache_sources(cache, tag, lm, layers, words)
        for i, t in enumerate(uniq):
            for folder, li, wi in sources:
                f = folder / f"{text_key(lm.name, t)}.safetensors"
                if f.is_file():
                    v = load_file(str(f))["v"]
                    out[i] = v if li is None else v[li][:, wi]
                    break
            else:
                todo.append(i)
    else:
        todo = list(range(len(uniq)))
    act = lm.adapter.mlp_activation(lm.model)
    skip = n_prefix_tokens(lm)
    ids = {i: segment_token_ids(lm, uniq[i]) for i in todo}
    by_len: dict[int, list[int]] = {}
    for i in todo:
        by_len.setdefault(len(ids[i]), []).append(i)
    batches: list[list[int]] = []
    for n, members in sorted(by_len.items()):
        per = max(1, batch_tokens // n)
        batches += [members[j:j + per] for j in range(0, len(members), per)]
    bar = _bar(total=len(todo), desc="forward passes (distinct texts)", disable=not progress or not todo)
    resolved = [None if k == "E" else int(k) for k in layers]
    for b in batches:
        hs, _mask = hidden_states(lm, [ids[i] for i in b], resolved)
        stack = torch.stack([hs[r][:, skip:] for r in resolved], dim=1)  # [B, L, T, D]
        for w_i, w in enumerate(words):
            out[b, :, w_i] = word_aggregate(stack, w, act).float()
        if cache:
            from safetensors.torch import save_file

            for i in b:
                f = cache / tag / f"{text_key(lm.name, uniq[i])}.safetensors"
                tmp = f.with_name(f.name + ".tmp")
                save_file({"v": out[i].contiguous()}, str(tmp))
                tmp.replace(f)
        bar.update(len(b))
    bar.close()
    return VectorBank(layers=layers, words=words, index={t: i for i, t in enumerate(uniq)}, vectors=out)


# ======================================================================================================
# Context composition (A.6): segments -> segment vectors -> SEGMENT_AGG -> EXAMPLE_AGG
# ======================================================================================================


class NormedBank:
    """The bank after NORM, which follows word aggregation except ``word=last`` (a selection, not an
    aggregation; :mod:`~.compose` does the same), indexed like ``bank.vectors`` (``[texts, layers, words, D]``).

    The rows asked for are normalised when they are read, so a sweep never holds a second copy of the whole
    bank (at 10,042 items the bank alone is ~9 GB).  NORM acts on each vector by itself, so a row reads the same
    whichever other rows are read with it.
    """

    def __init__(self, bank: VectorBank, norm: str | None) -> None:
        self.bank = bank
        self.norm = norm
        self.last = bank.word_pos("last") if "last" in bank.words else None

    @property
    def shape(self) -> torch.Size:
        return self.bank.vectors.shape

    def __getitem__(self, rows: Any) -> Tensor:
        from .schemes import normalize

        x = self.bank.vectors[rows]
        if self.norm is None:
            return x
        out = normalize(x, self.norm)
        if self.last is not None:
            out[..., self.last, :] = x[..., self.last, :]
        return out


def normed_bank(bank: VectorBank, norm: str | None) -> NormedBank:
    """:class:`NormedBank` of ``bank`` for ``norm``."""
    return NormedBank(bank, norm)


def compose_batch(seg_vecs: Sequence[Tensor], norm: str | None, seg: str | None, ex: str | None) -> Tensor:
    """:func:`~.compose.compose_context` for many (layer, word) pairs at once: one ``[P, n_segments, D]`` tensor
    per example → the context's vector sequence ``[P, m, D]``.  SEGMENT_AGG ``mean`` (then NORM) per example;
    EXAMPLE_AGG ``mean`` (then NORM) only when more than one vector remains; ``soft_cluster`` is applied when
    scoring (it needs the choice vectors)."""
    from .schemes import normalize

    parts = [normalize(v.mean(dim=-2, keepdim=True), norm) if seg == "mean" else v for v in seg_vecs]
    seq = torch.cat(parts, dim=-2)
    if seq.shape[-2] > 1 and ex == "mean":
        seq = normalize(seq.mean(dim=-2, keepdim=True), norm)
    return seq


def score_batch(ctx: Tensor, choices: Tensor, sim: str, soft_cluster: bool) -> Tensor:
    """Test 2 scores ``[P, Q, C]`` of choice vectors ``[Q, C, D]`` against context sequences ``[P, m, D]``.

    As :func:`~.test2.test2_from_vectors`: the best match over the sequence, ``max_j sim(k_j, e_c)``; with
    ``soft_cluster`` the sequence is first averaged with weights ``softmax_j(k_j · e_c)`` (one context vector
    per choice, no NORM after it) and compared once.  ``sim``: ``dot`` or ``cosine`` (A.6 SIMILARITY_FUNC).
    """
    if sim not in ("dot", "cosine"):
        raise InputError(f"invalid similarity {sim!r}; use dot or cosine")
    if soft_cluster:
        w = torch.softmax(torch.einsum("qcd,pmd->pqcm", choices, ctx), dim=-1)
        ctx_c = torch.einsum("pqcm,pmd->pqcd", w, ctx)  # [P, Q, C, D]
        if sim == "cosine":
            ctx_c = torch.nn.functional.normalize(ctx_c, p=2, dim=-1)
            choices = torch.nn.functional.normalize(choices, p=2, dim=-1)
        return (ctx_c * choices.unsqueeze(0)).sum(-1)
    if sim == "cosine":
        ctx = torch.nn.functional.normalize(ctx, p=2, dim=-1)
        choices = torch.nn.functional.normalize(choices, p=2, dim=-1)
    return torch.einsum("qcd,pmd->pqcm", choices, ctx).amax(dim=-1)


# ======================================================================================================
# Packing predictions
# ======================================================================================================


def pack_predictions(pred: np.ndarray) -> bytes:
    """Pack choice indices 0..3 two bits each (``pred``: any shape, flattened in C order)."""
    p = np.ascontiguousarray(pred, dtype=np.uint8).ravel()
    if p.size and p.max() > 3:
        raise ValueError("predictions must be 0..3")
    pad = (-p.size) % 4
    p = np.concatenate([p, np.zeros(pad, np.uint8)]).reshape(-1, 4)
    return (p[:, 0] | (p[:, 1] << 2) | (p[:, 2] << 4) | (p[:, 3] << 6)).astype(np.uint8).tobytes()


def unpack_predictions(blob: bytes, n: int) -> np.ndarray:
    """Inverse of :func:`pack_predictions`: the first ``n`` choice indices (uint8)."""
    b = np.frombuffer(blob, dtype=np.uint8)
    p = np.stack([b & 3, (b >> 2) & 3, (b >> 4) & 3, (b >> 6) & 3], axis=1).ravel()
    return p[:n].copy()


# ======================================================================================================
# Storage: the sweep tables in the run database
# ======================================================================================================

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sweep_runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  model TEXT NOT NULL, data TEXT NOT NULL, split TEXT NOT NULL, shots INTEGER NOT NULL, test INTEGER NOT NULL,
  items_hash TEXT NOT NULL, n_items INTEGER NOT NULL, labels BLOB NOT NULL, item_index TEXT NOT NULL,
  arch TEXT NOT NULL, n_layers INTEGER NOT NULL,
  baseline_acc REAL, baseline_acc_norm REAL, baseline_preds BLOB,
  created REAL NOT NULL,
  UNIQUE(model, data, split, shots, test, items_hash)
);
CREATE TABLE IF NOT EXISTS sweep_groups (
  run_id INTEGER NOT NULL REFERENCES sweep_runs(id),
  context TEXT NOT NULL,          -- the context part of the schemes: enc=..,layer=..,word=..,norm=..,seg=..,ex=..(,sim=..)
  outs TEXT NOT NULL,             -- JSON list of the choice parts (out_layer=..,out_word=..), '' for Test 1
  metrics TEXT NOT NULL,          -- JSON list: ["acc"] (Test 2) or ["acc", "acc_norm"] (Test 1)
  acc BLOB NOT NULL,              -- float32 [metrics, outs]
  preds BLOB NOT NULL,            -- 2-bit packed [metrics, outs, items]
  seconds REAL NOT NULL,
  PRIMARY KEY (run_id, context)
);
"""


#: predictions (schemes x items) unpacked at a time by :meth:`SweepStore.load_counts` (about 16 MB per metric)
COUNT_CHUNK_ELEMS = 1 << 24


class SweepStore:
    """The sweep's tables inside an SQLite database file (WAL mode; every write one transaction).

    Two processes may sweep into the same file at once: each group is written with ``INSERT OR IGNORE``
    inside a transaction (SQLite serialises writers; ``busy_timeout`` waits), so the file is never corrupted
    and a group computed by both is stored once, with the same content.  Opening checks the file
    (:func:`~.store.connect`: a damaged database is refused); ``readonly`` (the report) never creates or
    changes it.
    """

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        self.con = connect(self.path, timeout=60.0, readonly=readonly)
        try:
            if not readonly:
                self.con.executescript(_SCHEMA)
            self._has_tables = {"sweep_runs", "sweep_groups"} <= tables(self.con)
        except sqlite3.DatabaseError as e:
            self.con.close()
            raise InputError(f"{self.path}: not a usable SQLite database ({e})") from None

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
        """Rows of a query; a read error (a page damaged after opening) is one :class:`InputError`."""
        try:
            yield from self.con.execute(sql, args)
        except sqlite3.DatabaseError as e:
            raise InputError(f"{self.path}: cannot read the database ({e}); if it is damaged, restore it or start "
                             f"a new database") from None

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> SweepStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- runs ----------------------------------------------------------------------------------------------
    def run_id(self, *, model: str, data: str, split: str, shots: int, test: int, labels: Sequence[int],
               item_index: Sequence[int], arch: str, n_layers: int) -> int:
        items_hash = hashlib.sha256(json.dumps([list(map(int, item_index)), list(map(int, labels))]).encode()
                                    ).hexdigest()[:16]
        key = (model, data, split, int(shots), int(test), items_hash)
        self.con.execute("BEGIN IMMEDIATE")
        try:
            self.con.execute(
                "INSERT OR IGNORE INTO sweep_runs (model,data,split,shots,test,items_hash,n_items,labels,item_index,"
                "arch,n_layers,created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (*key, len(labels), bytes(np.asarray(labels, np.uint8)), json.dumps(list(map(int, item_index))),
                 arch, int(n_layers), time.time()))
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        row = self.con.execute("SELECT id FROM sweep_runs WHERE model=? AND data=? AND split=? AND shots=? AND "
                               "test=? AND items_hash=?", key).fetchone()
        return int(row[0])

    def set_baseline(self, run_id: int, acc: float, acc_norm: float, preds: np.ndarray) -> None:
        """The baseline of the same items, model and shots (normalised score = acc / baseline acc)."""
        self.con.execute("UPDATE sweep_runs SET baseline_acc=?, baseline_acc_norm=?, baseline_preds=? WHERE id=?",
                         (float(acc), float(acc_norm), pack_predictions(preds), run_id))

    def runs(self) -> list[dict[str, Any]]:
        if not self._has_tables:  # a database opened readonly that never held a sweep
            return []
        cols = ["id", "model", "data", "split", "shots", "test", "items_hash", "n_items", "labels", "item_index",
                "arch", "n_layers", "baseline_acc", "baseline_acc_norm", "baseline_preds"]
        out = []
        for r in list(self._rows(f"SELECT {','.join(cols)} FROM sweep_runs ORDER BY id")):
            d = dict(zip(cols, r))
            d["labels"] = np.frombuffer(d["labels"], np.uint8).copy()
            d["item_index"] = json.loads(d["item_index"])
            if d["baseline_preds"] is not None:
                d["baseline_preds"] = unpack_predictions(d["baseline_preds"], 2 * d["n_items"]).reshape(2, -1)
            out.append(d)
        return out

    # ---- groups ---------------------------------------------------------------------------------------------
    def done(self, run_id: int) -> set[str]:
        return {r[0] for r in self.con.execute("SELECT context FROM sweep_groups WHERE run_id=?", (run_id,))}

    def put_group(self, run_id: int, context: str, outs: Sequence[str], metrics: Sequence[str],
                  preds: np.ndarray, labels: np.ndarray, seconds: float) -> None:
        """Store one group: ``preds`` ``[metrics, outs, items]`` choice indices."""
        acc = (preds == labels[None, None, :]).mean(axis=-1).astype(np.float32)
        self.con.execute("BEGIN IMMEDIATE")
        try:
            self.con.execute("INSERT OR IGNORE INTO sweep_groups VALUES (?,?,?,?,?,?,?)",
                             (run_id, context, json.dumps(list(outs)), json.dumps(list(metrics)), acc.tobytes(),
                              pack_predictions(preds), float(seconds)))
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def put_groups(self, run_id: int, groups: Sequence[tuple[str, Sequence[str], np.ndarray]],
                   metrics: Sequence[str], labels: np.ndarray, seconds: float) -> None:
        """Store several groups ``(context, outs, preds [metrics, outs, items])`` in one transaction."""
        rows = []
        for context, outs, preds in groups:
            acc = (preds == labels[None, None, :]).mean(axis=-1).astype(np.float32)
            rows.append((run_id, context, json.dumps(list(outs)), json.dumps(list(metrics)), acc.tobytes(),
                         pack_predictions(preds), float(seconds)))
        self.con.execute("BEGIN IMMEDIATE")
        try:
            self.con.executemany("INSERT OR IGNORE INTO sweep_groups VALUES (?,?,?,?,?,?,?)", rows)
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def _run(self, run_id: int) -> dict[str, Any]:
        run = next((r for r in self.runs() if r["id"] == run_id), None)
        if run is None:
            raise InputError(f"{self.path}: no sweep run {run_id}")
        return run

    def load(self, run_id: int, with_preds: bool = True) -> SweepResults:
        """Every stored scheme of a run: names, accuracy per metric and (optionally) predictions, dense
        ``[metrics, schemes, items]`` (a full grid over all items is gigabytes: see :meth:`load_counts`)."""
        run = self._run(run_id)
        n = run["n_items"]
        names: list[str] = []
        accs: list[np.ndarray] = []
        preds: list[np.ndarray] = []
        metrics: list[str] | None = None
        for ctx, outs, mets, acc, pb in self._rows(
                "SELECT context, outs, metrics, acc, preds FROM sweep_groups WHERE run_id=? ORDER BY context", (run_id,)):
            outs_l = json.loads(outs)
            mets_l = json.loads(mets)
            metrics = metrics or mets_l
            names += [f"{ctx},{o}" if o else ctx for o in outs_l]
            accs.append(np.frombuffer(acc, np.float32).reshape(len(mets_l), len(outs_l)))
            if with_preds:
                preds.append(unpack_predictions(pb, len(mets_l) * len(outs_l) * n).reshape(len(mets_l), len(outs_l), n))
        metrics = metrics or ["acc"]
        A = np.concatenate(accs, axis=1) if accs else np.zeros((len(metrics), 0), np.float32)
        Pr = np.concatenate(preds, axis=1) if preds else None
        return SweepResults(run=run, schemes=names, metrics=metrics, acc=A, preds=Pr)

    def load_counts(self, run_id: int, k: int = 5, seed: int = 0, chunk: int | None = None) -> SweepResults:
        """Every stored scheme of a run with, instead of predictions, its hits per cell of the item partition
        ``Cells.build(n, min(k, n), seed)`` (:mod:`.stats`: all the held-out statistics need).

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
        pending: list[tuple[int, bytes]] = []  # (schemes, packed predictions) of the groups not yet reduced
        metrics: list[str] | None = None

        def flush() -> None:
            assert metrics is not None
            M, r = len(metrics), sum(o for o, _ in pending)
            block = np.empty((M, r, n), np.uint8)
            a = 0
            for outs, pb in pending:
                block[:, a:a + outs] = unpack_predictions(pb, M * outs * n).reshape(M, outs, n)
                a += outs
            hits.append(np.stack([count_cells(block[m] == labels[None, :], cells, onehot) for m in range(M)])
                        .astype(np.int32))
            pending.clear()

        for ctx, outs, mets, acc, pb in self._rows(
                "SELECT context, outs, metrics, acc, preds FROM sweep_groups WHERE run_id=? ORDER BY context", (run_id,)):
            outs_l = json.loads(outs)
            mets_l = json.loads(mets)
            if metrics is None:
                metrics = mets_l
            elif mets_l != metrics:
                raise InputError(f"{self.path}: sweep run {run_id} mixes metrics {metrics} and {mets_l}")
            names += [f"{ctx},{o}" if o else ctx for o in outs_l]
            accs.append(np.frombuffer(acc, np.float32).reshape(len(mets_l), len(outs_l)))
            pending.append((len(outs_l), pb))
            if sum(o for o, _ in pending) >= rows:
                flush()
        if pending:
            flush()
        metrics = metrics or ["acc"]
        A = np.concatenate(accs, axis=1) if accs else np.zeros((len(metrics), 0), np.float32)
        H = np.concatenate(hits, axis=1) if hits else np.zeros((len(metrics), 0, cells.n_cells), np.int32)
        return SweepResults(run=run, schemes=names, metrics=metrics, acc=A, hits=H, cells=cells)


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
        """:class:`~.stats.Counts` over ``Cells.build(items, min(k, items), seed)``: the streamed table when
        loaded by :meth:`SweepStore.load_counts` with that partition, else computed from the predictions."""
        n = len(self.labels)
        want = (min(k, n), seed)
        if self.hits is not None and self.cells is not None and (self.cells.k, self.cells.seed) == want:
            return Counts(hits=self.hits[self.metrics.index(metric)], cells=self.cells)
        if self.preds is None:
            raise ValueError(f"loaded without predictions, with counts for other folds than k={k}, seed={seed}")
        return cell_counts(self.correct(metric), Cells.build(n, *want))



# ======================================================================================================
# Evaluating groups of schemes
# ======================================================================================================


def context_key(s: Any) -> str:
    """The context part of a scheme's string form: ``str(s)`` without out_layer/out_word (built from the
    fields in the order of ``Scheme.__str__``, without formatting the whole scheme)."""
    key = (f"enc={s.enc},layer={s.layer},word={s.word},norm={s.norm},seg={s.seg},ex={s.ex}")
    return key if s.sim is None else f"{key},sim={s.sim}"


def out_key(s: Any) -> str:
    """The choice part of a scheme's string form (``out_layer=..,out_word=..``; empty for Test 1)."""
    if s.out_layer is None and s.out_word is None:
        return ""
    if s.out_word is None:
        return f"out_layer={s.out_layer}"
    if s.out_layer is None:
        return f"out_word={s.out_word}"
    return f"out_layer={s.out_layer},out_word={s.out_word}"


def _items_from(it: Any, ex: Sequence[Any], encs: Iterable[str], lm: Any) -> ItemPlan:
    from .segment import segment_context

    contexts = {}
    for enc in encs:
        segs = segment_context(it, ex, enc, lm)
        contexts[enc] = tuple(tuple(str(x) for x in e) for e in segs)
    return ItemPlan(index=it.index, label=it.label, contexts=contexts, endings=tuple(it.endings),
                    ending_chars=tuple(len(e) for e in it.endings))


def tie_identical(score: Tensor, choices: Tensor, c_dim: int, cv_dim: int) -> Tensor:
    """Give bitwise-identical choice vectors bitwise-identical scores (the first one's).

    Two endings can have the very same vector (e.g. ``out_layer=E, out_word=last`` and both end in ``.``); the
    single-scheme runner then scores them equally and the first wins the argmax, while a batched product may
    round them differently.  ``score`` has the choices on ``c_dim``; ``choices`` holds their vectors on
    ``cv_dim`` (``D`` last), its other dims broadcastable to ``score``'s once both choice dims are moved last.
    """
    C = score.shape[c_dim]
    sc = score.movedim(c_dim, -1).clone()
    cv = choices.movedim(cv_dim, -2)  # [..., C, D]
    for c in range(1, C):
        for c0 in range(c):
            same = (cv[..., c, :] == cv[..., c0, :]).all(-1)  # [...]
            if bool(same.any()):
                sc[..., c] = torch.where(same, sc[..., c0], sc[..., c])
                break
    return sc.movedim(-1, c_dim)


def test2_bundle(bank: VectorBank, nbank: NormedBank, items: Sequence[ItemPlan], groups: Sequence[Sequence[Any]],
                 layer_key: dict[str, str]) -> np.ndarray:
    """Predictions ``[groups, outs, items]`` of Test 2 for context groups that share (enc, norm, seg, ex, sim)
    and the list of choice encodings (out_layer, out_word), differing in (layer, word).

    ``nbank`` is :func:`normed_bank` for the groups' NORM.  Per item, all context sequences ``[P, m, D]`` and
    all choice vectors ``[Q, C, D]`` are formed at once and scored with one einsum.  This is the plain
    reference that the sweep's :func:`test2_bundle_batched` is tested against (same predictions).
    """
    s0 = groups[0][0]
    pl = torch.tensor([bank.layer_pos(layer_key[g[0].layer]) for g in groups])
    pw = torch.tensor([bank.word_pos(g[0].word) for g in groups])
    ol = torch.tensor([bank.layer_pos(layer_key[s.out_layer_eff]) for s in groups[0]])
    ow = torch.tensor([bank.word_pos(s.out_word_eff) for s in groups[0]])
    preds = np.empty((len(groups), len(groups[0]), len(items)), np.uint8)
    soft = s0.ex == "soft_cluster"
    for j, it in enumerate(items):
        segs = []
        for e in it.contexts[s0.enc]:
            rows = nbank[[bank.index[t] for t in e]]  # [n, L, W, D]
            segs.append(rows[:, pl, pw].transpose(0, 1))  # [P, n, D]
        ctx = compose_batch(segs, s0.norm, s0.seg, s0.ex)
        E = nbank[[bank.index[t] for t in it.endings]]  # [C, L, W, D]
        choice = E[:, ol, ow].transpose(0, 1)  # [Q, C, D]
        scores = score_batch(ctx, choice, s0.sim, soft)  # [P, Q, C]
        scores = tie_identical(scores, choice.unsqueeze(0), 2, 2)
        preds[:, :, j] = scores.argmax(dim=-1).numpy()
    return preds


@dataclass
class EncLayout:
    """Padded text-row indices of one encoding scheme over all items: ``seg[N, E, S]`` (row in the bank,
    0 where padded), ``smask[N, E, S]`` (a real segment), ``emask[N, E]`` (a real example), ``end[N, C]``."""

    seg: Tensor
    smask: Tensor
    emask: Tensor
    end: Tensor

    @classmethod
    def build(cls, bank: VectorBank, items: Sequence[ItemPlan], enc: str) -> EncLayout:
        E = max(len(it.contexts[enc]) for it in items)
        S = max(len(e) for it in items for e in it.contexts[enc])
        seg = torch.zeros(len(items), E, S, dtype=torch.long)
        smask = torch.zeros(len(items), E, S, dtype=torch.bool)
        for n, it in enumerate(items):
            for e, ex in enumerate(it.contexts[enc]):
                for k, t in enumerate(ex):
                    seg[n, e, k] = bank.index[t]
                    smask[n, e, k] = True
        end = torch.tensor([[bank.index[t] for t in it.endings] for it in items], dtype=torch.long)
        return cls(seg=seg, smask=smask, emask=smask.any(-1), end=end)

    def same_cut(self, other: EncLayout) -> bool:
        """Whether two encoding schemes cut every item into the very same examples and segments (e.g. all
        example-level schemes in zero-shot, where the query is the only example and one segment)."""
        return (self.seg.shape == other.seg.shape and torch.equal(self.seg, other.seg)
                and torch.equal(self.smask, other.smask) and torch.equal(self.end, other.end))


def _masked_mean(x: Tensor, mask: Tensor, dim: int) -> Tensor:
    """Mean of ``x`` over ``dim`` counting only ``mask`` (broadcast over the trailing dims of x)."""
    m = mask.to(x.dtype)
    while m.dim() < x.dim():
        m = m.unsqueeze(-1)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def test2_bundle_batched(bank: VectorBank, nbank: NormedBank, layout: EncLayout, groups: Sequence[Sequence[Any]],
                         layer_key: dict[str, str], chunk: int = 8, alias: Sequence[int] | None = None) -> np.ndarray:
    """:func:`test2_bundle` vectorised over items too (chunks of ``chunk`` items; padding masked out):
    predictions ``[groups, outs, items]``.

    Padded segments and examples are masked; the best match over the sequence ignores padded positions;
    ``soft_cluster`` is computed without forming a context vector per (pair, choice): with weights
    ``w = softmax_j(k_j · e_c)``, ``k̄_c · e_c = sum_j w_j (k_j · e_c)`` and ``|k̄_c|^2 = w^T G w`` with the Gram
    matrix ``G = K K^T`` (cosine).  The same numbers as :func:`test2_bundle` up to float rounding.  Pairs
    whose bank vectors are bit-identical (``alias``: :meth:`VectorBank.layer_alias`) are computed once.
    """
    from .schemes import normalize

    s0 = groups[0][0]
    norm, seg, ex, sim = s0.norm, s0.seg, s0.ex, s0.sim
    if sim not in ("dot", "cosine"):
        raise InputError(f"invalid similarity {sim!r}; use dot or cosine")
    alias = bank.layer_alias() if alias is None else alias
    # identical (layer, word) vectors give identical predictions: compute each distinct pair once
    pl, pw, p_inv = _unique_pairs([alias[bank.layer_pos(layer_key[g[0].layer])] for g in groups],
                                  [bank.word_pos(g[0].word) for g in groups])
    ol, ow, q_inv = _unique_pairs([alias[bank.layer_pos(layer_key[s.out_layer_eff])] for s in groups[0]],
                                  [bank.word_pos(s.out_word_eff) for s in groups[0]])
    N = layout.seg.shape[0]
    preds = np.empty((len(pl), len(ol), N), np.uint8)
    for a in range(0, N, chunk):
        sl = slice(a, min(N, a + chunk))
        idx, smask, emask = layout.seg[sl], layout.smask[sl], layout.emask[sl]
        n, E, S = idx.shape
        x = nbank[idx.reshape(-1)][:, pl, pw].reshape(n, E, S, len(pl), -1)  # [n, E, S, P, D]
        if seg == "mean":
            seq = normalize(_masked_mean(x, smask, dim=2), norm)  # [n, E, P, D]
            mmask = emask  # [n, E]
        else:
            seq = x.reshape(n, E * S, len(pl), -1)
            mmask = smask.reshape(n, E * S)
        count = mmask.sum(-1)  # [n]
        if ex == "mean":
            avg = normalize(_masked_mean(seq, mmask, dim=1), norm).unsqueeze(1)  # [n, 1, P, D]
            first = seq[torch.arange(n), mmask.to(torch.int8).argmax(-1)].unsqueeze(1)  # the single real vector
            seq = torch.where((count > 1)[:, None, None, None], avg, first)
            mmask = torch.ones(n, 1, dtype=torch.bool)
        P, Q = len(pl), len(ol)
        m = seq.shape[1]
        ch = nbank[layout.end[sl].reshape(-1)][:, ol, ow].reshape(n, -1, Q, nbank.shape[-1])  # [n, C, Q, D]
        C = ch.shape[1]
        if sim == "cosine" and ex != "soft_cluster":
            seq = torch.nn.functional.normalize(seq, p=2, dim=-1)
            ch = torch.nn.functional.normalize(ch, p=2, dim=-1)
        # every context vector against every choice vector: one batched matrix product [n, m*P, C*Q]
        dots = torch.bmm(seq.reshape(n, m * P, -1), ch.reshape(n, C * Q, -1).transpose(1, 2)).reshape(n, m, P, C, Q)
        pad = ~mmask[:, :, None, None, None]
        if ex == "soft_cluster":
            w = torch.softmax(dots.masked_fill(pad, float("-inf")), dim=1)  # weights over the sequence
            score = (w * dots.masked_fill(pad, 0.0)).sum(1)  # k̄_c · e_c  [n, P, C, Q]
            if sim == "cosine":
                gram = torch.einsum("nmpd,nkpd->npmk", seq, seq)  # [n, P, m, m]
                sq = torch.einsum("nmpcq,npmk,nkpcq->npcq", w, gram, w).clamp_min(0.0)
                score = score / (sq.sqrt().clamp_min(1e-12) * ch.norm(dim=-1).clamp_min(1e-12)[:, None])
        else:
            score = dots.masked_fill(pad, torch.finfo(dots.dtype).min).amax(1)  # best match [n, P, C, Q]
        score = tie_identical(score, ch.unsqueeze(1), 2, 2)  # ch [n, 1, C, Q, D] broadcasts over P
        preds[:, :, sl] = score.argmax(2).permute(1, 2, 0).numpy()  # [P, Q, n]
    return preds[p_inv][:, q_inv]


def _unique_pairs(layers: Sequence[int], words: Sequence[int]) -> tuple[Tensor, Tensor, np.ndarray]:
    """Distinct (layer, word) pairs in first-seen order and, for each input pair, its position among them."""
    first: dict[tuple[int, int], int] = {}
    inv = [first.setdefault((l, w), len(first)) for l, w in zip(layers, words)]
    u = list(first)
    return (torch.tensor([k[0] for k in u]), torch.tensor([k[1] for k in u]), np.asarray(inv, dtype=np.int64))


def _bar(**kw: Any) -> Any:
    import sys

    from tqdm.auto import tqdm

    return tqdm(file=sys.stderr, dynamic_ncols=True, **kw)


def evaluate_test2(store: SweepStore, run_id: int, bank: VectorBank, items: Sequence[ItemPlan],
                   schemes: Sequence[Any], layer_key: dict[str, str], progress: bool = True,
                   stop_after: int | None = None) -> int:
    """Evaluate and store every Test 2 context group not yet stored; returns the number computed.

    Groups are bundled by (NORM, enc, seg, ex, sim) so that one batched product scores every (layer, word)
    of the bundle; a bundle's groups are committed in one transaction.  ``stop_after`` stops after that many groups (the
    tests use it to simulate an interruption).
    """
    groups = group_by_context(schemes)
    done = store.done(run_id)
    labels = np.array([it.label for it in items], np.uint8)
    bundles: OrderedDict[tuple[Any, ...], list[list[Any]]] = OrderedDict()
    outs_of: dict[tuple[Any, ...], tuple[str, ...]] = {}  # interned: every group of a grid has the same outs
    group_outs: dict[int, tuple[str, ...]] = {}
    for members in groups.values():
        if context_key(members[0]) in done:
            continue
        s = members[0]
        raw = tuple((m.out_layer, m.out_word) for m in members)
        if raw not in outs_of:
            outs_of[raw] = tuple(out_key(m) for m in members)
        outs = outs_of[raw]
        group_outs[id(members)] = outs
        bundles.setdefault((str(s.norm), s.enc, str(s.seg), str(s.ex), s.sim, outs), []).append(members)
    todo = sum(len(b) for b in bundles.values())
    bar = _bar(total=todo, desc="Test 2 scheme groups", disable=not progress or not todo)
    computed = 0
    by_norm: OrderedDict[str, list[list[list[Any]]]] = OrderedDict()
    for key, b in bundles.items():
        by_norm.setdefault(key[0], []).append(b)
    layouts: dict[str, EncLayout] = {}
    canon: dict[str, str] = {}  # encoding scheme -> the first one that cuts every item identically
    cache: dict[tuple[Any, ...], np.ndarray] = {}
    alias = bank.layer_alias()
    try:
        for norm_s, bl in by_norm.items():
            nbank = normed_bank(bank, None if norm_s == "None" else norm_s)
            cache.clear()
            for b in bl:
                t0 = time.perf_counter()
                enc = b[0][0].enc
                if enc not in layouts:
                    layouts[enc] = EncLayout.build(bank, items, enc)
                    canon[enc] = next((e for e in layouts if e != enc and canon[e] == e
                                       and layouts[e].same_cut(layouts[enc])), enc)
                s0 = b[0][0]
                ckey = (canon[enc], str(s0.seg), str(s0.ex), s0.sim, group_outs[id(b[0])],
                        tuple((g[0].layer, g[0].word) for g in b))
                preds = cache.get(ckey)
                if preds is None:
                    preds = test2_bundle_batched(bank, nbank, layouts[enc], b, layer_key, alias=alias)
                    cache[ckey] = preds
                dt = (time.perf_counter() - t0) / len(b)
                if stop_after is not None:
                    b = b[:max(0, stop_after - computed)]
                store.put_groups(run_id, [(context_key(m[0]), group_outs[id(m)], preds[g:g + 1])
                                          for g, m in enumerate(b)], ["acc"], labels, dt)
                computed += len(b)
                bar.update(len(b))
                if stop_after is not None and computed >= stop_after:
                    return computed
    finally:
        bar.close()
    return computed


def test1_predictions(lm: Any, bank: VectorBank, nbank: NormedBank, items: Sequence[ItemPlan], scheme: Any,
                      layer_key: dict[str, str], conts: Sequence[Sequence[Sequence[int]]],
                      memo: dict[bytes, list[float]]) -> np.ndarray:
    """Test 1 (pyramidal generation, sec. 5.1.1) predictions ``[2, 1, items]`` (acc, acc_norm) of one scheme.

    The concept sequence of each item (from the bank; Gemma's BOS embedding in front, as
    :func:`~.test1.concept_sequence`) replaces the context; :func:`~.packing.packed_logliks` scores the
    baseline's continuation tokens of the four endings after it, every item's request packed into shared
    forward passes (the context computed once per request, see :mod:`.packing`).  ``memo`` maps the bytes of a
    concept sequence (and its continuations) to its four log-likelihoods, so schemes that give the same
    sequence (e.g. every EXAMPLE_AGG of a one-example context) share one pass.
    """
    from .encode import input_embeddings, n_prefix_tokens
    from .packing import ScoreRequest, packed_logliks

    lk, wk = bank.layer_pos(layer_key[scheme.layer]), bank.word_pos(scheme.word)
    dtype = lm.model.get_input_embeddings().weight.dtype
    prefix = None
    if n_prefix_tokens(lm):
        with torch.inference_mode():
            prefix = input_embeddings(lm, torch.tensor([lm.tokenizer.bos_token_id])).float()
    if lm.adapter.auto_class != "causal":
        raise InputError("the Test 1 sweep supports decoder-only models (use walklens hellaswag test1 for others)")
    keys: list[bytes] = []
    new: dict[bytes, ScoreRequest] = {}
    for j, it in enumerate(items):
        segs = [nbank[[bank.index[t] for t in e]][:, lk, wk].unsqueeze(0) for e in it.contexts[scheme.enc]]
        seq = compose_batch(segs, scheme.norm, scheme.seg, scheme.ex)[0]
        if prefix is not None:
            seq = torch.cat([prefix, seq], dim=0)
        seq = seq.to(dtype).contiguous()
        key = hashlib.sha256(seq.numpy().tobytes() + json.dumps(conts[j]).encode()).digest()
        keys.append(key)
        if key not in memo and key not in new:
            new[key] = ScoreRequest(conts[j], context_embeds=seq)
    memo.update(zip(new, packed_logliks(lm, list(new.values()))))
    preds = np.empty((2, 1, len(items)), np.uint8)
    for j, (it, key) in enumerate(zip(items, keys)):
        ll = np.asarray(memo[key], dtype=np.float64)
        preds[0, 0, j] = int(np.argmax(ll))
        preds[1, 0, j] = int(np.argmax(ll / np.asarray(it.ending_chars, dtype=np.float64)))
    return preds


def evaluate_test1(store: SweepStore, run_id: int, lm: Any, bank: VectorBank, items: Sequence[ItemPlan],
                   schemes: Sequence[Any], layer_key: dict[str, str], conts: Sequence[Sequence[Sequence[int]]],
                   baseline_preds: np.ndarray, progress: bool = True, stop_after: int | None = None) -> int:
    """Evaluate and store every Test 1 scheme not yet stored (one group each); returns how many were computed.
    ``enc=cross_encoding`` is the baseline itself: its predictions are the baseline's ``[2, items]``."""
    done = store.done(run_id)
    labels = np.array([it.label for it in items], np.uint8)
    todo = [s for s in schemes if context_key(s) not in done]
    todo.sort(key=lambda s: str(s.norm))
    memo: dict[bytes, list[float]] = {}
    bar = _bar(total=len(todo), desc="Test 1 schemes", disable=not progress or not todo)
    computed = 0
    nb: tuple[str, Tensor] | None = None
    try:
        for s in todo:
            t0 = time.perf_counter()
            if s.enc == "cross_encoding":
                preds = baseline_preds.reshape(2, 1, -1).astype(np.uint8)
            else:
                if nb is None or nb[0] != str(s.norm):
                    nb = (str(s.norm), normed_bank(bank, s.norm))
                preds = test1_predictions(lm, bank, nb[1], items, s, layer_key, conts, memo)
            store.put_group(run_id, context_key(s), [""], ["acc", "acc_norm"], preds, labels,
                            time.perf_counter() - t0)
            computed += 1
            bar.update(1)
            if stop_after is not None and computed >= stop_after:
                break
    finally:
        bar.close()
    return computed


# ======================================================================================================
# Driver
# ======================================================================================================


@dataclass
class SweepOutcome:
    """What one call of :func:`run_sweep` did."""

    run_id: int
    n_schemes: int
    n_groups: int
    groups_stored_before: int
    groups_computed: int
    n_texts: int
    seconds_baseline: float
    seconds_forward: float
    seconds_eval: float
    baseline_acc: float | None
    baseline_acc_norm: float | None
    refused: dict[str, int] = field(default_factory=dict)


def run_sweep(lm: Any, items: Sequence[Any], *, test: int, schemes: Sequence[Any], db: str | Path, shots: int = 0,
              pool: Sequence[Any] | None = None, data: str = "", fewshot_seed: int | None = None,
              cache_dir: str | Path | None = None, progress: bool = True, stop_after: int | None = None,
              log: Callable[[str], None] = lambda m: None) -> SweepOutcome:
    """Sweep ``schemes`` (valid for ``test`` on this model) over ``items``, storing into ``db``.

    1. the baseline of the same items (issue 4's runner and store, same database: shared with single runs;
       normalised scores divide by it);
    2. every distinct segment text of every encoding scheme used, run once (:func:`build_bank`);
    3. every scheme group not yet stored, evaluated and committed one by one (:func:`evaluate_test2`,
       :func:`evaluate_test1`).  Rerunning the same call after an interruption continues where it stopped.
    """
    from .data import FEWSHOT_SEED, fewshot_examples
    from .encode import arch_of
    from .runner import run_test
    from .store import ResultStore

    seed = FEWSHOT_SEED if fewshot_seed is None else fewshot_seed
    if not items:
        raise InputError("no items to sweep")
    if not schemes:
        raise InputError("the grid has no valid scheme for this test and model")
    arch = arch_of(lm)
    pool = list(items) if pool is None else list(pool)
    t0 = time.perf_counter()
    with ResultStore(db) as rs:
        base = run_test(lm, items, test="baseline", shots=shots, pool=pool, data=data, store=rs,
                        fewshot_seed=seed, progress=progress, desc=f"{lm.name} baseline")
    t_base = time.perf_counter() - t0
    base_preds = np.array([[r.pred for r in base.results], [r.pred_norm for r in base.results]], np.uint8)
    data_key = data if seed == FEWSHOT_SEED else f"{data}#seed={seed}"
    store = SweepStore(db)
    try:
        rid = store.run_id(model=lm.name, data=data_key, split=items[0].split, shots=shots, test=test,
                           labels=[it.label for it in items], item_index=[it.index for it in items], arch=arch,
                           n_layers=lm.n_layers)
        store.set_baseline(rid, base.acc or 0.0, base.acc_norm or 0.0, base_preds)
        groups = group_by_context(schemes) if test == 2 else {context_key(s): [s] for s in schemes}
        done = store.done(rid)
        before = sum(1 for g in groups.values() if context_key(g[0]) in done)
        log(f"{len(schemes)} schemes in {len(groups)} groups; {before} groups already stored")
        outcome = SweepOutcome(run_id=rid, n_schemes=len(schemes), n_groups=len(groups), groups_stored_before=before,
                               groups_computed=0, n_texts=0, seconds_baseline=t_base, seconds_forward=0.0,
                               seconds_eval=0.0, baseline_acc=base.acc, baseline_acc_norm=base.acc_norm)
        if before == len(groups):
            return outcome
        encs = list(dict.fromkeys(s.enc for s in schemes if s.enc != "cross_encoding"))
        exs = [fewshot_examples(pool, shots, it.index, seed=seed, query_split=it.split) if shots else []
               for it in items]
        plans = [_items_from(it, ex, encs, lm) for it, ex in zip(items, exs)]
        layer_vals = {s.layer for s in schemes if s.enc != "cross_encoding"}
        word_vals = {s.word for s in schemes if s.enc != "cross_encoding"}
        if test == 2:
            layer_vals |= {s.out_layer_eff for s in schemes}
            word_vals |= {s.out_word_eff for s in schemes}
        lkey = layer_keys(lm, layer_vals)
        bank_layers = sorted(set(lkey.values()), key=lambda k: -1 if k == "E" else int(k))
        from .schemes import WORD_AGG_SCHEMES

        words = [w for w in WORD_AGG_SCHEMES if w in word_vals]
        texts = [t for p in plans for t in p.texts()] if encs else []
        t1 = time.perf_counter()
        bank = build_bank(lm, texts, bank_layers, words, cache_dir=cache_dir, progress=progress)
        outcome.n_texts = len(bank.index)
        t2 = time.perf_counter()
        outcome.seconds_forward = t2 - t1
        if test == 2:
            outcome.groups_computed = evaluate_test2(store, rid, bank, plans, schemes, lkey, progress, stop_after)
        else:
            from .baseline import item_tokens

            conts = [item_tokens(lm, it, ex)[1] for it, ex in zip(items, exs)]
            outcome.groups_computed = evaluate_test1(store, rid, lm, bank, plans, schemes, lkey, conts, base_preds,
                                                     progress, stop_after)
        outcome.seconds_eval = time.perf_counter() - t2
        return outcome
    finally:
        store.close()
