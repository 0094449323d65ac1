"""The keys of a sweep's shards (seed 000, sec. 5.1): what a shard computed, and the name its picks are kept under
in the store's ``sweep_shards`` table until its groups are stored (:mod:`.run`).

* :class:`BundleKey` -- a Test 2 bundle (NORM, canonical encoding, SEGMENT_AGG, EXAMPLE_AGG, SIMILARITY_FUNC, choice
  parts, and the (layer, word) pair of each group); its :attr:`~BundleKey.digest` names it;
* :class:`Test2ShardKey` -- a bundle over an item range: ``test2|DIGEST|A:B``;
* :class:`BlockKey` -- a Test 1 block (bank layer, word aggregation);
* :class:`Test1ShardKey` -- a block's schemes over an item range: ``test1|LAYER|WORD|A:B|DIGEST``.

The names are those every earlier sweep stored, byte for byte, so a database written by an interrupted sweep
resumes from its kept shards; :meth:`~Test2ShardKey.parse` reads a stored name back (None for another kind's).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ....analyses.concepts.schemes import Scheme

_RANGE = r"(0|[1-9][0-9]*):(0|[1-9][0-9]*)"
_TEST2 = re.compile(rf"test2\|([0-9a-f]{{16}})\|{_RANGE}")
_TEST1 = re.compile(rf"test1\|([^|]+)\|(.+)\|{_RANGE}\|([0-9a-f]{{16}})")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BundleKey:
    """A Test 2 bundle: context groups sharing NORM (``str(norm)``: ``"None"`` for none), the encoding (the first
    one that cuts every item identically), SEGMENT_AGG, EXAMPLE_AGG and SIMILARITY_FUNC, and the choice parts
    ``outs``; ``pairs`` holds each group's (ENCODING_LAYER, WORD_AGG_SCHEME)."""

    norm: str
    enc: str
    seg: str
    ex: str
    sim: str | None
    outs: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, norm: str, enc: str, groups: Sequence[Sequence[Scheme]], outs: tuple[str, ...]) -> BundleKey:
        """The key of the bundle ``groups`` (context groups, each a list of schemes) with encoding ``enc``."""
        s = groups[0][0]
        return cls(
            norm=norm,
            enc=enc,
            seg=str(s.seg),
            ex=str(s.ex),
            sim=s.sim,
            outs=outs,
            pairs=tuple((g[0].layer, g[0].word) for g in groups),
        )

    @property
    def digest(self) -> str:
        """16 hex digits of the SHA-256 of the key's ``repr`` as a tuple (the stored shard names hold it)."""
        return _digest(repr((self.norm, self.enc, self.seg, self.ex, self.sim, self.outs, self.pairs)))


@dataclass(frozen=True)
class Test2ShardKey:
    """A Test 2 bundle (its :attr:`BundleKey.digest`) over items ``[a, b)``."""

    bundle: str
    a: int
    b: int

    @property
    def name(self) -> str:
        """The stored name: ``test2|DIGEST|A:B``."""
        return f"test2|{self.bundle}|{self.a}:{self.b}"

    @classmethod
    def parse(cls, name: str) -> Test2ShardKey | None:
        """The key a stored name holds (None where it is not a Test 2 shard's)."""
        m = _TEST2.fullmatch(name)
        return None if m is None else cls(bundle=m[1], a=int(m[2]), b=int(m[3]))


@dataclass(frozen=True)
class BlockKey:
    """A Test 1 block: the schemes of one bank layer (bit-identical layers as one) and word aggregation."""

    layer: str
    word: str

    @staticmethod
    def digest(schemes: Sequence[Scheme]) -> str:
        """16 hex digits of the SHA-256 of the block's scheme names (sorted as the block runs them)."""
        return _digest("\n".join(map(str, schemes)))


@dataclass(frozen=True)
class Test1ShardKey:
    """A Test 1 block (its layer and word, and the :meth:`BlockKey.digest` of its schemes) over items ``[a, b)``."""

    layer: str
    word: str
    a: int
    b: int
    digest: str

    @property
    def block(self) -> BlockKey:
        return BlockKey(self.layer, self.word)

    @property
    def name(self) -> str:
        """The stored name: ``test1|LAYER|WORD|A:B|DIGEST`` (a word aggregation may hold ``|``)."""
        return f"test1|{self.layer}|{self.word}|{self.a}:{self.b}|{self.digest}"

    @classmethod
    def parse(cls, name: str) -> Test1ShardKey | None:
        """The key a stored name holds (None where it is not a Test 1 shard's)."""
        m = _TEST1.fullmatch(name)
        if m is None:
            return None
        return cls(layer=m[1], word=m[2], a=int(m[3]), b=int(m[4]), digest=m[5])


__all__ = ["BlockKey", "BundleKey", "Test1ShardKey", "Test2ShardKey"]
