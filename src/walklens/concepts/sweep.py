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
3. **Test 2: one batched product per context group.**  For a context group (encoding scheme, NORM,
   SEGMENT_AGG_SCHEME, EXAMPLE_AGG_SCHEME, SIMILARITY_FUNC) the context vectors of all (layer, word) pairs
   of an item are formed at once ``[P, m, D]``, the choice vectors of all (out_layer, out_word) pairs
   ``[Q, 4, D]``, and one einsum gives every score ``[P, Q, m, 4]``.
4. **Test 1** still needs a model pass per (context vector sequence, ending).  Shared: the segment vectors
   (from the bank), identical concept sequences (deduplicated bit-exactly across schemes, which collapses
   e.g. all EXAMPLE_AGG_SCHEMEs of a zero-shot context), the ending's token embeddings, and the batch: many
   sequences go through the model in one padded forward pass.  What remains is one pass per distinct
   (concept sequence, ending) pair.

Results go into the same SQLite file as single runs (issue 4's store), in two tables of their own:
``sweep_runs`` (one row per model, data, shots, test, items, layer set) and ``sweep_groups`` (one row per
context group with the predictions of all its schemes packed 2 bits per item): a million schemes are a few
thousand rows.  Each group is written in its own transaction, so a killed sweep resumes at the next
unfinished group and the final table is identical to an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from ..errors import InputError
from .grid import CONTEXT_FIELDS, OUT_FIELDS, group_by_context

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


def build_bank(lm: Any, texts: Iterable[str], layers: Sequence[str], words: Sequence[str], *,
               cache_dir: str | Path | None = None, batch_tokens: int = 2048, progress: bool = True) -> VectorBank:
    """Run every distinct text once and reduce its hidden states by every word aggregation.

    ``layers``: bank keys (``"E"`` or a hidden-state index ``"0"``..``"N"``; hidden state ``l`` is the input of
    layer ``l`` and ``N`` the top of the stack after the final norm, A.6 ENCODING_LAYER).  Each text is
    tokenised and run exactly as the single-scheme runner does (:func:`~.encode.segment_token_ids`,
    :func:`~.encode.hidden_states`; a BOS prefix conditions the segment but is left out of the aggregation).
    Texts of equal token length share a batch, so no padding enters any number.  With ``cache_dir``, each
    reduced text is also written there (safetensors, atomically) and read back on the next run.
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
        (cache / tag).mkdir(parents=True, exist_ok=True)
        from safetensors.torch import load_file

        for i, t in enumerate(uniq):
            f = cache / tag / f"{text_key(lm.name, t)}.safetensors"
            if f.is_file():
                out[i] = load_file(str(f))["v"]
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


def compose_context(seg_vecs: list[Tensor], norm: str, seg: str, ex: str,
                    choice: Tensor | None = None) -> Tensor:
    """Compose the context of one item for many (layer, word) pairs at once.

    ``seg_vecs``: one tensor ``[P, n_segments, D]`` per example, already word-aggregated and normalised.
    Returns ``[P, m, D]`` (a sequence of ``m`` context vectors), or, for ``ex=soft_cluster``,
    ``[P, Q, C, D]`` with one context vector per choice vector of ``choice`` ``[Q, C, D]``.

    NORM is applied after every aggregation that takes place (A.6: "applied to vectors after an aggregation
    operation").  SEGMENT_AGG ``mean`` turns each example into one vector, ``None`` keeps its segment vectors;
    EXAMPLE_AGG then works on the whole sequence: ``mean`` averages it, ``None`` keeps it, ``soft_cluster``
    averages it with weights softmax(sequence · choice vector), a different context vector per choice.
    """
    from .schemes import normalize

    if seg == "mean":
        examples = [normalize(v.mean(dim=-2, keepdim=True), norm) for v in seg_vecs]
    else:
        examples = seg_vecs
    seq = torch.cat(examples, dim=-2)  # [P, m, D]
    if ex == "mean":
        return normalize(seq.mean(dim=-2, keepdim=True), norm)
    if ex == "soft_cluster":
        if choice is None:
            raise ValueError("soft_cluster needs the choice vectors")
        logits = torch.einsum("pmd,qcd->pqcm", seq, choice)
        w = torch.softmax(logits, dim=-1)
        return normalize(torch.einsum("pqcm,pmd->pqcd", w, seq), norm)
    return seq


def similarity_scores(ctx: Tensor, choices: Tensor, sim: str) -> Tensor:
    """Scores ``[P, Q, C]`` of C choices: the best match over the context sequence (sec. 5.1.2).

    ``ctx`` is ``[P, m, D]`` (or ``[P, Q, C, D]`` for soft_cluster), ``choices`` ``[Q, C, D]``; ``sim`` is
    ``dot`` or ``cosine`` (SIMILARITY_FUNC, A.6).
    """
    if sim == "cosine":
        choices = choices / choices.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        ctx = ctx / ctx.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    elif sim != "dot":
        raise InputError(f"unknown similarity function {sim!r}")
    if ctx.dim() == 4:
        return (ctx * choices.unsqueeze(0)).sum(-1)
    return torch.einsum("pmd,qcd->pqcm", ctx, choices).amax(dim=-1)


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


class SweepStore:
    """The sweep's tables inside an SQLite database file (WAL mode; every write one transaction).

    Two processes may sweep into the same file at once: each group is written with ``INSERT OR IGNORE``
    inside a transaction (SQLite serialises writers; ``busy_timeout`` waits), so the file is never corrupted
    and a group computed by both is stored once, with the same content.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.con = sqlite3.connect(str(self.path), timeout=60.0, isolation_level=None)
            self.con.execute("PRAGMA journal_mode=WAL")
            self.con.execute("PRAGMA busy_timeout=60000")
            self.con.execute("PRAGMA synchronous=NORMAL")
            self.con.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise InputError(f"{self.path}: not a usable SQLite database ({e})") from None

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
        cur = self.con.execute("SELECT id,model,data,split,shots,test,items_hash,n_items,labels,item_index,arch,"
                               "n_layers,baseline_acc,baseline_acc_norm,baseline_preds FROM sweep_runs ORDER BY id")
        cols = [c[0] for c in cur.description]
        out = []
        for r in cur.fetchall():
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

    def load(self, run_id: int, with_preds: bool = True) -> SweepResults:
        """Every stored scheme of a run: names, accuracy per metric and (optionally) predictions."""
        run = next((r for r in self.runs() if r["id"] == run_id), None)
        if run is None:
            raise InputError(f"{self.path}: no sweep run {run_id}")
        n = run["n_items"]
        names: list[str] = []
        accs: list[np.ndarray] = []
        preds: list[np.ndarray] = []
        metrics: list[str] | None = None
        for ctx, outs, mets, acc, pb in self.con.execute(
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


@dataclass
class SweepResults:
    """All stored schemes of one sweep run: ``acc[metric, scheme]``, ``preds[metric, scheme, item]``."""

    run: dict[str, Any]
    schemes: list[str]
    metrics: list[str]
    acc: np.ndarray
    preds: np.ndarray | None = None

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


# ======================================================================================================
# Test 2 over a whole grid
# ======================================================================================================


def _ctx_key(s: Any) -> str:
    """The context part of a scheme's string form (everything before out_layer)."""
    parts = [p for p in str(s).split(",") if p.split("=")[0] not in OUT_FIELDS]
    return ",".join(parts)


def _out_key(s: Any) -> str:
    parts = [p for p in str(s).split(",") if p.split("=")[0] in OUT_FIELDS]
    return ",".join(parts)


@dataclass
class SweepPlan:
    """What a sweep needs besides the model: the items (cut by every encoding scheme) and the schemes."""

    items: list[ItemPlan]
    schemes: list[Any]
    layer_key: Callable[[Any], str]  # scheme layer value -> bank layer key
    test: int

    @property
    def labels(self) -> np.ndarray:
        return np.array([it.label for it in self.items], dtype=np.uint8)


def test2_group_predictions(bank: VectorBank, items: Sequence[ItemPlan], group: Sequence[Any],
                            layer_key: Callable[[Any], str]) -> tuple[list[str], np.ndarray]:
    """Predictions ``[1, len(group), items]`` of every scheme of one context group (same enc/norm/seg/ex/sim
    and the same context layer and word).  Vectorised over the group's (out_layer, out_word) pairs."""
    from .schemes import normalize

    s0 = group[0]
    enc, norm, seg, ex, sim = s0.enc, s0.norm, s0.seg, s0.ex, s0.sim
    lk, wk = bank.layer_pos(layer_key(s0.layer)), bank.word_pos(s0.word)
    outs = [(bank.layer_pos(layer_key(s.out_layer)), bank.word_pos(s.out_word)) for s in group]
    ol = torch.tensor([o[0] for o in outs])
    ow = torch.tensor([o[1] for o in outs])
    preds = np.empty((1, len(group), len(items)), np.uint8)
    for j, it in enumerate(items):
        segs = [normalize(bank.rows(list(e))[:, lk, wk], norm).unsqueeze(0) for e in it.contexts[enc]]  # [1,n,D]
        E = bank.rows(list(it.endings))  # [C, L, W, D]
        choice = normalize(E[:, ol, ow].transpose(0, 1), norm)  # [Q, C, D]
        ctx = compose_context(segs, norm, seg, ex, choice if ex == "soft_cluster" else None)
        scores = similarity_scores(ctx, choice, sim)[0]  # [Q, C]
        preds[0, :, j] = scores.argmax(dim=-1).numpy()
    return [_out_key(s) for s in group], preds


def test2_context_predictions(bank: VectorBank, items: Sequence[ItemPlan], groups: Sequence[Sequence[Any]],
                              layer_key: Callable[[Any], str]) -> list[tuple[list[str], np.ndarray]]:
    """Like :func:`test2_group_predictions` for several groups that differ only in (layer, word): the context
    vectors of all of them are composed in one batch ``[P, m, D]`` and scored with one einsum per item."""
    from .schemes import normalize

    s0 = groups[0][0]
    enc, norm, seg, ex, sim = s0.enc, s0.norm, s0.seg, s0.ex, s0.sim
    lw = [(bank.layer_pos(layer_key(g[0].layer)), bank.word_pos(g[0].word)) for g in groups]
    pl = torch.tensor([x[0] for x in lw])
    pw = torch.tensor([x[1] for x in lw])
    # all groups share the same out list when they come from one grid; fall back to per-group otherwise
    outs0 = [_out_key(s) for s in groups[0]]
    if any([_out_key(s) for s in g] != outs0 for g in groups):
        return [test2_group_predictions(bank, items, g, layer_key) for g in groups]
    ol = torch.tensor([bank.layer_pos(layer_key(s.out_layer)) for s in groups[0]])
    ow = torch.tensor([bank.word_pos(s.out_word) for s in groups[0]])
    preds = np.empty((len(groups), len(outs0), len(items)), np.uint8)
    for j, it in enumerate(items):
        segs = [normalize(bank.rows(list(e))[:, pl, pw].transpose(0, 1), norm) for e in it.contexts[enc]]  # [P,n,D]
        E = bank.rows(list(it.endings))
        choice = normalize(E[:, ol, ow].transpose(0, 1), norm)  # [Q, C, D]
        ctx = compose_context(segs, norm, seg, ex, choice if ex == "soft_cluster" else None)
        scores = similarity_scores(ctx, choice, sim)  # [P, Q, C]
        preds[:, :, j] = scores.argmax(dim=-1).numpy()
    return [(outs0, preds[g:g + 1]) for g in range(len(groups))]


# ======================================================================================================
# Test 1 over a whole grid
# ======================================================================================================


def test1_group_predictions(lm: Any, bank: VectorBank, items: Sequence[ItemPlan], scheme: Any,
                            layer_key: Callable[[Any], str], ending_ids: Sequence[Sequence[Sequence[int]]],
                            context_embeds: Callable[[Any, Tensor], Tensor],
                            ending_embeds: Callable[[Any, list[int]], Tensor],
                            memo: dict[bytes, tuple[float, ...]], batch: int = 16) -> tuple[list[str], np.ndarray]:
    """Test 1 (pyramidal generation, sec. 5.1.1) predictions ``[2, 1, items]`` (acc, acc_norm) of one scheme.

    The context's concept vectors (from the bank) are followed by an ending's token embeddings and fed
    through ``inputs_embeds``; the ending's joint log-likelihood picks the answer (acc), and divided by its
    character count (acc_norm), as in the baseline.  ``context_embeds(lm, vectors)`` maps the concept
    vectors to the model input (identity, or whatever the single-scheme runner does), ``ending_embeds`` an
    ending's ids to input embeddings.  ``memo`` maps the bytes of an identical (concept sequence, ending)
    pair to its log-likelihood so that schemes giving the same sequence share one model pass.
    """
    from .schemes import normalize

    lk, wk = bank.layer_pos(layer_key(scheme.layer)), bank.word_pos(scheme.word)
    preds = np.empty((2, 1, len(items)), np.uint8)
    jobs: list[tuple[bytes, Tensor, list[int]]] = []
    keys_per_item: list[list[bytes]] = []
    for j, it in enumerate(items):
        segs = [normalize(bank.rows(list(e))[:, lk, wk], scheme.norm).unsqueeze(0) for e in it.contexts[scheme.enc]]
        keys = []
        if scheme.ex == "soft_cluster":
            E = bank.rows(list(it.endings))  # choices as in Test 2: the choice encoded at the same layer/word
            choice = normalize(E[:, lk, wk], scheme.norm).unsqueeze(0)
            ctx = compose_context(segs, scheme.norm, scheme.seg, scheme.ex, choice)[0, 0]  # [C, D]
            per_choice = [ctx[c:c + 1] for c in range(len(it.endings))]
        else:
            c = compose_context(segs, scheme.norm, scheme.seg, scheme.ex)[0]  # [m, D]
            per_choice = [c] * len(it.endings)
        for c_i, (cv, ids) in enumerate(zip(per_choice, ending_ids[j])):
            cv = context_embeds(lm, cv)
            key = hashlib.sha256(cv.numpy().tobytes() + np.asarray(ids, np.int64).tobytes()).digest()
            keys.append(key)
            if key not in memo:
                jobs.append((key, cv, list(ids)))
        keys_per_item.append(keys)
    # one padded forward pass per batch of distinct (concept sequence, ending) pairs
    uniq: dict[bytes, tuple[Tensor, list[int]]] = {}
    for k, cv, ids in jobs:
        uniq.setdefault(k, (cv, ids))
    todo = list(uniq.items())
    todo.sort(key=lambda kv: kv[1][0].shape[0] + len(kv[1][1]))
    with torch.inference_mode():
        for b0 in range(0, len(todo), batch):
            chunk = todo[b0:b0 + batch]
            seqs = [torch.cat([cv, ending_embeds(lm, ids)], dim=0) for _, (cv, ids) in chunk]
            L = max(s.shape[0] for s in seqs)
            D = seqs[0].shape[1]
            x = torch.zeros(len(seqs), L, D, dtype=seqs[0].dtype)
            mask = torch.zeros(len(seqs), L, dtype=torch.long)
            for r, s in enumerate(seqs):
                x[r, :s.shape[0]] = s
                mask[r, :s.shape[0]] = 1
            logits = lm.model(inputs_embeds=x, attention_mask=mask, use_cache=False).logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            for r, (k, (cv, ids)) in enumerate(chunk):
                m = cv.shape[0]
                tgt = torch.tensor(ids)
                lp = logp[r, m - 1:m - 1 + len(ids)].gather(-1, tgt[:, None])[:, 0]
                memo[k] = (float(lp.sum()),)
    for j, it in enumerate(items):
        ll = np.array([memo[k][0] for k in keys_per_item[j]])
        preds[0, 0, j] = int(np.argmax(ll))
        preds[1, 0, j] = int(np.argmax(ll / np.asarray(it.ending_chars, dtype=np.float64)))
    return [""], preds


# ======================================================================================================
# Driver
# ======================================================================================================


@dataclass
class SweepReport:
    """What one call of :func:`run_sweep` did."""

    run_id: int
    n_schemes: int
    n_groups: int
    groups_done_before: int
    groups_computed: int
    n_texts: int
    seconds_forward: float
    seconds_eval: float
    refused: dict[str, int] = field(default_factory=dict)


def _bar(**kw: Any) -> Any:
    from tqdm.auto import tqdm

    return tqdm(**kw)


def _batched_groups(groups: "OrderedDict[tuple[Any, ...], list[Any]]", done: set[str]
                    ) -> Iterator[list[list[Any]]]:
    """Unfinished groups, bundled by (enc, norm, seg, ex, sim) so one einsum scores many (layer, word)."""
    bundles: OrderedDict[tuple[Any, ...], list[list[Any]]] = OrderedDict()
    for key, members in groups.items():
        if _ctx_key(members[0]) in done:
            continue
        k = (key[0],) + tuple(key[3:])
        bundles.setdefault(k, []).append(members)
    for b in bundles.values():
        yield b


def evaluate_test2(store: SweepStore, run_id: int, bank: VectorBank, plan: SweepPlan,
                   progress: bool = True, stop_after: int | None = None) -> int:
    """Evaluate and store every unfinished Test 2 group; returns the number of groups computed.

    ``stop_after`` stops after that many groups (used by the tests to simulate an interruption).
    """
    groups = group_by_context(plan.schemes)
    done = store.done(run_id)
    labels = plan.labels
    todo = sum(1 for g in groups.values() if _ctx_key(g[0]) not in done)
    bar = _bar(total=todo, desc="Test 2 scheme groups", disable=not progress or not todo)
    computed = 0
    for bundle in _batched_groups(groups, done):
        t0 = time.perf_counter()
        results = test2_context_predictions(bank, plan.items, bundle, plan.layer_key)
        dt = (time.perf_counter() - t0) / len(bundle)
        for members, (outs, preds) in zip(bundle, results):
            store.put_group(run_id, _ctx_key(members[0]), outs, ["acc"], preds, labels, dt)
            computed += 1
            bar.update(1)
            if stop_after is not None and computed >= stop_after:
                bar.close()
                return computed
    bar.close()
    return computed


def evaluate_test1(store: SweepStore, run_id: int, lm: Any, bank: VectorBank, plan: SweepPlan,
                   ending_ids: Sequence[Sequence[Sequence[int]]], context_embeds: Callable[[Any, Tensor], Tensor],
                   ending_embeds: Callable[[Any, list[int]], Tensor], progress: bool = True,
                   stop_after: int | None = None, batch: int = 16) -> int:
    """Evaluate and store every unfinished Test 1 scheme (one group each); returns how many were computed."""
    done = store.done(run_id)
    labels = plan.labels
    todo = [s for s in plan.schemes if _ctx_key(s) not in done]
    memo: dict[bytes, tuple[float, ...]] = {}
    bar = _bar(total=len(todo), desc="Test 1 schemes", disable=not progress or not todo)
    computed = 0
    for s in todo:
        t0 = time.perf_counter()
        outs, preds = test1_group_predictions(lm, bank, plan.items, s, plan.layer_key, ending_ids, context_embeds,
                                              ending_embeds, memo, batch=batch)
        store.put_group(run_id, _ctx_key(s), outs, ["acc", "acc_norm"], preds, labels, time.perf_counter() - t0)
        computed += 1
        bar.update(1)
        if stop_after is not None and computed >= stop_after:
            break
    bar.close()
    return computed
