"""The concept cache (seed 000, footnote 11: property 1 "can be applied to ... 2) cache frequently used
concepts"): word-aggregated segment vectors kept on disk and shared by every command that needs them (the
sweep's vector bank, Test 1, compaction).

A vector is keyed by

* its **space**: the model's name, a hash of its weights, buffers, config and tokenizer
  (:func:`weights_hash`), the dtype it ran in and the device kind (a vector computed on a GPU differs from
  the CPU's in float rounding), and D;
* the **layer** (A.6 ENCODING_LAYER as a resolved hidden-state index ``"E"``, ``"0"``..``"N"``), the **word
  aggregation** (WORD_AGG_SCHEME), the **norm** applied before storing (``"None"`` for the raw
  aggregates every caller stores) and the SHA-256 of the **segment text**.

Layout of a cache folder: ``index.sqlite`` (WAL journal, ``busy_timeout``: :mod:`walklens.base.sqlite`; tables
``spaces``, ``shards`` and ``vectors``) and ``shards/*.safetensors``, each shard one ``[rows, D]`` float32 tensor
written by one :meth:`ConceptCache.put` (to a temp file, then renamed) before the index rows that point into it
are committed, so a reader never sees a row whose vector is not on disk.  Several processes may read and write
one folder at once: every write is one ``BEGIN IMMEDIATE`` transaction, a key written twice keeps its first
vector (``INSERT OR IGNORE``), and a shard removed by another process's eviction between lookup and read is a
miss.

Size bound: when the shards exceed ``max_bytes`` (default :data:`DEFAULT_MAX_BYTES`, or
``$WALKLENS_CONCEPT_CACHE_GB``), the least recently used shards are evicted (with their index rows) until the
cache is at most 90 % of the bound.  "Use" is a logical clock shared by all processes: a shard's clock is
set when it is written and whenever :meth:`ConceptCache.get` reads a vector from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import time
import uuid
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...base.errors import InputError, StaleCacheWarning
from ...base.outputs import make_dir
from ...base.precision import dtype_name
from ...base.records import confined
from ...base.sqlite import (
    ClosedOnExit,
    closed_on_error,
    connect,
    create_tables,
    foreign,
    meta_value,
    set_mode,
    transaction,
)

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

SCHEMA_VERSION = 1
DEFAULT_MAX_BYTES = 16 * 2**30
#: Largest number of vectors in one shard file.
SHARD_ROWS = 4096
#: A shard holds at most SHARD_ROWS float32 rows of D <= 65,536 (1 GiB) plus its header: anything larger is not one.
_MAX_SHARD_BYTES = SHARD_ROWS * 65_536 * 4 + 2**20
#: Eviction stops at this fraction of the bound (so that the next writes do not evict again at once).
LOW_WATER = 0.9
#: A shard file no index row knows about (a writer killed between writing it and committing) is removed by
#: :meth:`ConceptCache.evict` once it is this old.
ORPHAN_SECONDS = 3600.0
_LOOKUP_CHUNK = 20000

_SCHEMA = (  # and meta (walklens.base.sqlite.create_tables)
    "CREATE TABLE IF NOT EXISTS spaces (id INTEGER PRIMARY KEY, model TEXT NOT NULL, weights TEXT NOT NULL, "
    "dtype TEXT NOT NULL, device TEXT NOT NULL, d_model INTEGER NOT NULL, UNIQUE (model, weights, dtype, device))",
    "CREATE TABLE IF NOT EXISTS shards (id INTEGER PRIMARY KEY, file TEXT NOT NULL UNIQUE, rows INTEGER NOT NULL, "
    "bytes INTEGER NOT NULL, last_used INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS vectors (space INTEGER NOT NULL, text BLOB NOT NULL, layer TEXT NOT NULL, "
    "word TEXT NOT NULL, norm TEXT NOT NULL, shard INTEGER NOT NULL, row INTEGER NOT NULL, "
    "PRIMARY KEY (space, text, layer, word, norm)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS vectors_by_shard ON vectors (shard)",
)


# ---- what a vector's numbers depend on -------------------------------------------------------------------------


@dataclass(frozen=True)
class Space:
    """The model side of a key: name, weights hash, the dtype it ran in, device kind and D."""

    model: str
    weights: str
    dtype: str
    device: str
    d_model: int


_HASHES: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[object, ...], str]] = weakref.WeakKeyDictionary()


def _signature(lm: LoadedModel) -> tuple[object, ...]:
    """What :func:`weights_hash` is memoised on: every tensor's storage, version counter (bumped by any in-place
    edit, e.g. an intervention) and layout, and the tokenizer object."""
    tensors = list(lm.model.named_parameters()) + list(lm.model.named_buffers())
    return (id(lm.tokenizer),) + tuple(
        (n, t.data_ptr(), t._version, tuple(t.shape), t.dtype, t.device) for n, t in tensors
    )


def weights_hash(lm: LoadedModel) -> str:
    """SHA-256 (hex) of the model's parameters and buffers (names, shapes, dtypes, bytes), its config (without
    paths and versions), its attention implementation and its tokenizer.  Memoised per model object until a
    tensor of it changes (a weight edit bumps the tensor's version counter)."""
    sig = _signature(lm)
    memo = _HASHES.get(lm.model)
    if memo is not None and memo[0] == sig:
        return memo[1]
    h = hashlib.sha256()
    cfg = {
        k: v
        for k, v in lm.config.to_dict().items()
        if k not in ("_name_or_path", "transformers_version", "name_or_path")
    }
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    h.update(str(getattr(lm.config, "_attn_implementation", "")).encode())
    tok = lm.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    vocab = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    h.update(f"{type(tok).__name__}\x00{len(tok)}\x00".encode() + vocab.encode())
    with torch.no_grad():
        for name, t in list(lm.model.named_parameters()) + list(lm.model.named_buffers()):
            h.update(f"\x00{name}\x00{tuple(t.shape)}\x00{t.dtype}\x00".encode())
            flat = t.detach().reshape(-1).contiguous().cpu()
            if flat.numel():
                h.update(flat.view(torch.uint8).numpy().data)
    digest = h.hexdigest()
    _HASHES[lm.model] = (sig, digest)
    return digest


def model_space(lm: LoadedModel) -> Space:
    """The :class:`Space` of ``lm`` as it is now (weights, dtype and device)."""
    dev = lm.device
    kind = dev.type if dev.type != "cuda" else f"cuda:{torch.cuda.get_device_name(dev)}"
    return Space(
        model=lm.name or type(lm.model).__name__,
        weights=weights_hash(lm),
        dtype=dtype_name(lm.dtype),
        device=kind,
        d_model=int(lm.d_model),
    )


def text_hash(text: str) -> bytes:
    """The key of a segment text: its SHA-256 digest (32 bytes)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _norm_key(norm: str | None) -> str:
    return "None" if norm is None else str(norm)


# ---- the cache ---------------------------------------------------------------------------------------------------


@dataclass
class CacheStats:
    """Counts of one :class:`ConceptCache` object: texts found whole / not found, vectors and shards written,
    shards evicted."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    shards_written: int = 0
    evicted: int = 0


def default_max_bytes() -> int:
    """``$WALKLENS_CONCEPT_CACHE_GB`` (GiB) when set, else :data:`DEFAULT_MAX_BYTES`."""
    env = os.environ.get("WALKLENS_CONCEPT_CACHE_GB")
    if not env:
        return DEFAULT_MAX_BYTES
    try:
        gb = float(env)
    except ValueError:
        gb = -1.0
    if not 0 < gb < float("inf"):
        raise InputError(f"$WALKLENS_CONCEPT_CACHE_GB must be a positive number of GiB, not {env[:40]!r}")
    return int(gb * 2**30)


class ConceptCache(ClosedOnExit):
    """A concept cache folder (module docstring): ``get`` and ``put`` word-aggregated vectors by key."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int | None = None, timeout: float = 60.0) -> None:
        """Open (creating it if needed) the cache folder ``root``.  A path that is not a writable folder, an
        index that is not a concept-cache database or one of a newer schema is refused with one
        :class:`InputError` line."""
        self.root = make_dir(root, "concept cache")
        self.max_bytes = default_max_bytes() if max_bytes is None else int(max_bytes)
        if self.max_bytes <= 0:
            raise InputError(f"concept cache {root}: the size bound must be positive, not {max_bytes}")
        self.stats = CacheStats()
        self.shard_dir = self.root / "shards"
        index = self.root / "index.sqlite"
        if index.exists() and not index.is_file():
            raise InputError(f"concept cache {root}: {index.name} is not a regular file")
        try:
            self.shard_dir.mkdir(exist_ok=True)
            self._conn = connect(index, timeout=timeout)
        except (OSError, sqlite3.Error) as e:
            raise InputError(f"concept cache {root}: cannot open it ({e})") from None
        with closed_on_error(
            self._conn, lambda e: f"concept cache {root}: {index.name} is not a usable SQLite index ({e})"
        ):
            other = foreign(self._conn, ("concept_cache",))  # before set_mode: a foreign file stays untouched
            if other:
                raise InputError(f"concept cache {root}: {index.name} is not a concept-cache index: {other}")
            set_mode(self._conn, readonly=False)
            found = meta_value(self._conn, "concept_cache")
            if found is not None and found != str(SCHEMA_VERSION):
                raise InputError(
                    f"concept cache {root}: index schema {found} is not the one this walklens "
                    f"reads ({SCHEMA_VERSION}); use another folder"
                )
            create_tables(self._conn, _SCHEMA, key="concept_cache", version=SCHEMA_VERSION)

    # ---- plumbing ------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._conn.close()

    def _space_id(self, space: Space, create: bool) -> int | None:
        q = "SELECT id, d_model FROM spaces WHERE model=? AND weights=? AND dtype=? AND device=?"
        key = (space.model, space.weights, space.dtype, space.device)
        row = self._conn.execute(q, key).fetchone()
        if row is None and create:
            with transaction(self._conn) as c:
                c.execute(
                    "INSERT OR IGNORE INTO spaces (model, weights, dtype, device, d_model) VALUES (?,?,?,?,?)",
                    key + (space.d_model,),
                )
            row = self._conn.execute(q, key).fetchone()
        if row is not None and int(row[1]) != space.d_model:
            raise InputError(f"concept cache {self.root}: {space.model} is stored with D={row[1]}, not {space.d_model}")
        return None if row is None else int(row[0])

    # ---- reading -------------------------------------------------------------------------------------------
    def get(
        self, space: Space, texts: Sequence[str], layers: Sequence[str], words: Sequence[str], norm: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored vectors of ``texts`` at every (layer, word): ``(vectors [n, L, W, D] float32, found [n])``.
        A text counts as found (a hit) only when all its ``L x W`` vectors are stored and readable; its rows
        of ``vectors`` are unspecified otherwise."""
        n, L, W = len(texts), len(layers), len(words)
        out = torch.zeros(n, L, W, space.d_model, dtype=torch.float32)
        have = torch.zeros(n, L, W, dtype=torch.bool)
        sid = self._space_id(space, create=False)
        if sid is not None and n:
            lpos = {l: i for i, l in enumerate(layers)}
            wpos = {w: i for i, w in enumerate(words)}
            pos: dict[bytes, list[int]] = {}
            for i, t in enumerate(texts):
                pos.setdefault(text_hash(t), []).append(i)
            hashes = list(pos)
            by_shard: dict[tuple[int, str], list[tuple[int, int, int, int]]] = {}
            c = self._conn
            c.execute("CREATE TEMP TABLE IF NOT EXISTS want (text BLOB PRIMARY KEY)")
            for a in range(0, len(hashes), _LOOKUP_CHUNK):
                c.execute("DELETE FROM want")
                c.executemany("INSERT OR IGNORE INTO want VALUES (?)", [(h,) for h in hashes[a : a + _LOOKUP_CHUNK]])
                rows = c.execute(
                    "SELECT v.text, v.layer, v.word, v.shard, v.row, s.file FROM want "
                    "JOIN vectors v ON v.space=? AND v.text=want.text AND v.norm=? "
                    "JOIN shards s ON s.id=v.shard",
                    (sid, _norm_key(norm)),
                ).fetchall()
                for h, layer, word, shard, row, file in rows:
                    if layer in lpos and word in wpos:
                        for i in pos[bytes(h)]:
                            by_shard.setdefault((shard, file), []).append((row, i, lpos[layer], wpos[word]))
            used = []
            for (shard, file), entries in by_shard.items():
                v = self._read_shard(file)
                if v is None:
                    continue
                bad = self._bad_shard(v, space.d_model, [e[0] for e in entries])
                if bad:
                    warnings.warn(
                        f"concept cache {self.root}: shard {str(file)[:60]!r} {bad}; its vectors are computed again",
                        StaleCacheWarning,
                        stacklevel=2,
                    )
                    continue
                r = torch.tensor([e[0] for e in entries])
                ti, tl, tw = (torch.tensor([e[k] for e in entries]) for k in (1, 2, 3))
                out[ti, tl, tw] = v[r]
                have[ti, tl, tw] = True
                used.append(shard)
            if used:
                self._touch(used)
        found = have.reshape(n, -1).all(dim=1) if n else torch.zeros(0, dtype=torch.bool)
        self.stats.hits += int(found.sum())
        self.stats.misses += n - int(found.sum())
        return out, found

    def _read_shard(self, file: Any) -> torch.Tensor | None:
        """A shard's tensor, or None when it is gone (evicted by another process), unreadable, named outside the
        shard folder, not a regular file, or larger than a shard is written."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            path = confined(self.shard_dir, str(file), "concept cache shard")
            st = os.stat(path)
        except (InputError, OSError, ValueError):
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_SHARD_BYTES:
            return None  # a FIFO is never opened (it would block), a huge file never mapped
        try:
            return load_file(str(path))["v"]
        except (OSError, SafetensorError, KeyError):
            return None

    @staticmethod
    def _bad_shard(v: torch.Tensor, d_model: int, rows: Sequence[Any]) -> str | None:
        """Why a shard's tensor cannot give the ``rows`` asked for (None when it can): the shape, dtype, a row out
        of range or a value that is not finite (the cache writes only finite float32 rows [n, D])."""
        if v.dim() != 2 or v.shape[1] != d_model or v.dtype != torch.float32:
            return f"holds a {v.dtype} tensor of shape {tuple(v.shape)}, not [rows, {d_model}] float32"
        n = v.shape[0]
        if any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n for r in rows):
            return f"is asked for a row outside its {n} rows"
        if not bool(torch.isfinite(v[torch.tensor(rows)]).all()):
            return "holds values that are not finite"
        return None

    def _touch(self, shards: Sequence[int]) -> None:
        with transaction(self._conn) as c:
            clock = int(c.execute("SELECT COALESCE(MAX(last_used), 0) + 1 FROM shards").fetchone()[0])
            c.executemany("UPDATE shards SET last_used=? WHERE id=?", [(clock, s) for s in sorted(set(shards))])

    # ---- writing -------------------------------------------------------------------------------------------
    def put(
        self,
        space: Space,
        texts: Sequence[str],
        layers: Sequence[str],
        words: Sequence[str],
        vectors: torch.Tensor,
        norm: str | None = None,
    ) -> None:
        """Store ``vectors [n, L, W, D]`` of ``texts`` at every (layer, word); keys already stored keep their
        first vector.  Then evict least recently used shards while the cache exceeds its bound."""
        n, L, W = len(texts), len(layers), len(words)
        if tuple(vectors.shape) != (n, L, W, space.d_model):
            raise ValueError(f"vectors of shape {tuple(vectors.shape)}, expected {(n, L, W, space.d_model)}")
        if not n:
            return
        sid = self._space_id(space, create=True)
        flat = vectors.detach().to(torch.float32).cpu().reshape(n * L * W, space.d_model)
        keys = [(text_hash(t), l, w) for t in texts for l in layers for w in words]
        nk = _norm_key(norm)
        from safetensors.torch import save_file

        for a in range(0, len(keys), SHARD_ROWS):
            part = flat[a : a + SHARD_ROWS].contiguous()
            name = f"{uuid.uuid4().hex}.safetensors"
            tmp = self.shard_dir / f".{name}.tmp"
            try:
                save_file({"v": part}, str(tmp))
                os.replace(tmp, self.shard_dir / name)
            except OSError as e:
                tmp.unlink(missing_ok=True)
                raise InputError(f"concept cache {self.root}: cannot write a shard ({e.strerror or e})") from None
            size = (self.shard_dir / name).stat().st_size
            with transaction(self._conn) as c:
                clock = int(c.execute("SELECT COALESCE(MAX(last_used), 0) + 1 FROM shards").fetchone()[0])
                cur = c.execute(
                    "INSERT INTO shards (file, rows, bytes, last_used) VALUES (?,?,?,?)",
                    (name, part.shape[0], size, clock),
                )
                assert cur.lastrowid is not None  # set by the INSERT just run
                shard = int(cur.lastrowid)
                c.executemany(
                    "INSERT OR IGNORE INTO vectors VALUES (?,?,?,?,?,?,?)",
                    [(sid, h, l, w, nk, shard, j) for j, (h, l, w) in enumerate(keys[a : a + SHARD_ROWS])],
                )
            self.stats.stored += part.shape[0]
            self.stats.shards_written += 1
        if self.size_bytes() > self.max_bytes:
            self.evict()

    # ---- size ----------------------------------------------------------------------------------------------
    def size_bytes(self) -> int:
        """Bytes of all shard files the index knows."""
        return int(self._conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM shards").fetchone()[0])

    def n_vectors(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM vectors").fetchone()[0])

    def evict(self, target: int | None = None) -> int:
        """Remove least recently used shards (their files and index rows) until the cache holds at most
        ``target`` bytes (default: :data:`LOW_WATER` of the bound); also remove orphan shard files.  Returns
        the number of shards removed."""
        target = int(self.max_bytes * LOW_WATER) if target is None else int(target)
        with transaction(self._conn) as c:
            total = int(c.execute("SELECT COALESCE(SUM(bytes), 0) FROM shards").fetchone()[0])
            gone: list[tuple[int, str]] = []
            for sid, file, size in c.execute("SELECT id, file, bytes FROM shards ORDER BY last_used, id").fetchall():
                if total <= target:
                    break
                gone.append((int(sid), file))
                total -= int(size)
            c.executemany("DELETE FROM vectors WHERE shard=?", [(s,) for s, _ in gone])
            c.executemany("DELETE FROM shards WHERE id=?", [(s,) for s, _ in gone])
            known = {r[0] for r in c.execute("SELECT file FROM shards")}
        for _, file in gone:
            (self.shard_dir / file).unlink(missing_ok=True)
        now = time.time()
        for f in self.shard_dir.iterdir():
            if (f.name.endswith(".safetensors") and f.name not in known) or f.name.endswith(".tmp"):
                try:
                    if now - f.stat().st_mtime > ORPHAN_SECONDS:
                        f.unlink()
                except OSError:
                    pass
        self.stats.evicted += len(gone)
        return len(gone)


def open_cache(cache: ConceptCache | str | os.PathLike[str] | None) -> ConceptCache | None:
    """A :class:`ConceptCache` from a folder path (None stays None; an open cache is returned as it is)."""
    if cache is None or isinstance(cache, ConceptCache):
        return cache
    return ConceptCache(cache)


__all__ = ["CacheStats", "ConceptCache", "Space", "model_space", "open_cache", "text_hash", "weights_hash"]
