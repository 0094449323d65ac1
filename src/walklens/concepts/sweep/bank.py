"""The sweep's vector bank (seed 000, A.6): every distinct segment text run once, reduced by every word
aggregation, optionally cached on disk; NORM applied as rows are read.

The ``[T, D]`` hidden states of a text are reduced right away by every WORD_AGG_SCHEME into a
:class:`VectorBank` ``[texts, layers, words, D]`` (the hidden states themselves are dropped).  With a cache
folder, each text's ``[layers, words, D]`` is kept as safetensors and read back by later runs, also by runs
that need a subset of the layers and word aggregations.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import torch
from safetensors.torch import load_file, save_file

from ..encode import hidden_states, n_prefix_tokens, segment_token_ids
from ..runner import progress_bar
from ..schemes import normalize, resolve_layer, word_aggregate

if TYPE_CHECKING:
    from ...loading import LoadedModel

Tensor = torch.Tensor


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
        out: list[int] = []
        for i in range(len(self.layers)):
            same = (j for j in range(i) if out[j] == j and torch.equal(self.vectors[:, i], self.vectors[:, j]))
            out.append(next(same, i))
        return out

    def rows(self, texts: Sequence[str]) -> list[int]:
        """The bank rows of ``texts``."""
        return [self.index[t] for t in texts]

    def layer_pos(self, key: str) -> int:
        return self.layers.index(key)

    def word_pos(self, word: str) -> int:
        return self.words.index(word)


class NormedBank:
    """The bank after NORM, which follows word aggregation except ``word=last`` (a selection, not an
    aggregation; :mod:`..compose` does the same), indexed like ``bank.vectors`` (``[texts, layers, words, D]``).

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

    def __getitem__(self, rows: Tensor | Sequence[int]) -> Tensor:
        x = self.bank.vectors[rows]
        if self.norm is None:
            return x
        out = normalize(x, self.norm)
        if self.last is not None:
            out[..., self.last, :] = x[..., self.last, :]
        return out


def text_key(model_name: str, text: str) -> str:
    """The cache file name of one text of one model."""
    return hashlib.sha256(f"{model_name}\x00{text}".encode()).hexdigest()


def layer_keys(lm: LoadedModel, layers: Iterable[str]) -> dict[str, str]:
    """Scheme layer values (``E``, ``middle``, ``-1``, ...) → bank keys (``"E"`` or the hidden-state index)."""
    out = {}
    for l in layers:
        r = resolve_layer(str(l), lm.n_layers)
        out[str(l)] = "E" if r is None else str(r)
    return out


def _cache_sources(lm: LoadedModel, cache: Path, tag: str, layers: Sequence[str], words: Sequence[str]
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


def _read_cache(lm: LoadedModel, cache: Path, tag: str, texts: Sequence[str], layers: Sequence[str],
                words: Sequence[str], out: Tensor) -> list[int]:
    """Fill ``out[i]`` for every text found in the cache; returns the positions of the texts not found."""
    sources = _cache_sources(lm, cache, tag, layers, words)
    todo = []
    for i, t in enumerate(texts):
        for folder, li, wi in sources:
            f = folder / f"{text_key(lm.name, t)}.safetensors"
            if f.is_file():
                v = load_file(str(f))["v"]
                out[i] = v if li is None else v[li][:, wi]
                break
        else:
            todo.append(i)
    return todo


def _length_batches(ids: dict[int, list[int]], batch_tokens: int) -> list[list[int]]:
    """Texts of equal token length in batches of at most ``batch_tokens`` tokens (at least one text each)."""
    by_len: dict[int, list[int]] = {}
    for i, seq in ids.items():
        by_len.setdefault(len(seq), []).append(i)
    batches: list[list[int]] = []
    for n, members in sorted(by_len.items()):
        per = max(1, batch_tokens // n)
        batches += [members[j:j + per] for j in range(0, len(members), per)]
    return batches


def build_bank(lm: LoadedModel, texts: Iterable[str], layers: Sequence[str], words: Sequence[str], *,
               cache_dir: str | Path | None = None, batch_tokens: int = 2048, progress: bool = True) -> VectorBank:
    """Run every distinct text once and reduce its hidden states by every word aggregation.

    ``layers``: bank keys (``"E"`` or a hidden-state index ``"0"``..``"N"``; hidden state ``l`` is the input of
    layer ``l`` and ``N`` the top of the stack after the final norm, A.6 ENCODING_LAYER).  Each text is
    tokenised and run exactly as the single-scheme runner does (:func:`~..encode.segment_token_ids`,
    :func:`~..encode.hidden_states`; a BOS prefix conditions the segment but is left out of the aggregation).
    Texts of equal token length share a batch, so no padding enters any number.  With ``cache_dir``, each
    reduced text is also written there (safetensors, atomically) and read back on the next run, also by runs
    that need a subset of these layers and word aggregations (a Test 1 grid after a full Test 2 grid).
    """
    uniq = list(OrderedDict.fromkeys(texts))
    layers, words = tuple(layers), tuple(words)
    out = torch.empty(len(uniq), len(layers), len(words), lm.d_model, dtype=torch.float32)
    cache = Path(cache_dir) if cache_dir else None
    tag = hashlib.sha256(json.dumps([lm.name, lm.n_layers, lm.d_model, list(layers), list(words)]).encode()
                         ).hexdigest()[:12]
    todo = _read_cache(lm, cache, tag, uniq, layers, words, out) if cache else list(range(len(uniq)))
    act = lm.adapter.mlp_activation(lm.model)
    skip = n_prefix_tokens(lm)
    ids = {i: segment_token_ids(lm, uniq[i]) for i in todo}
    resolved = [None if k == "E" else int(k) for k in layers]
    bar = progress_bar(total=len(todo), desc="forward passes (distinct texts)", disable=not progress or not todo)
    try:
        for b in _length_batches(ids, batch_tokens):
            hs, _mask = hidden_states(lm, [ids[i] for i in b], resolved)
            stack = torch.stack([hs[r][:, skip:] for r in resolved], dim=1)  # [B, L, T, D]
            for w_i, w in enumerate(words):
                out[b, :, w_i] = word_aggregate(stack, w, act).float().cpu()
            if cache:
                for i in b:
                    f = cache / tag / f"{text_key(lm.name, uniq[i])}.safetensors"
                    tmp = f.with_name(f.name + ".tmp")
                    save_file({"v": out[i].contiguous()}, str(tmp))
                    tmp.replace(f)
            bar.update(len(b))
    finally:
        bar.close()
    return VectorBank(layers=layers, words=words, index={t: i for i, t in enumerate(uniq)}, vectors=out)
