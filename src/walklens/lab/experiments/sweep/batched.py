"""The sweep's batched Test 2 and Test 1 maths (seed 000, sec. 5.1.1-5.1.2, A.6), read from the vector bank.

* Test 2: context groups that differ only in (layer, word) form a bundle.  For a chunk of items, the context
  sequences of all (layer, word) pairs ``[n, m, P, D]`` (segment and example aggregation with masked padding)
  meet all choice vectors ``[n, C, Q, D]`` in :func:`~walklens.lab.concepts.similarity.batched_scores` (one ``bmm``; the
  same scorer the
  single-scheme runner uses).  Pairs with bit-identical bank vectors are computed once.
* Test 1: the concept sequence of each item (:func:`~..compose.compose_context` of bank rows) replaces the
  context; :func:`~walklens.core.scoring.packing.packed_logliks` scores the endings after it, identical sequences once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ....analyses.concepts.compose import compose_context
from ....analyses.concepts.schemes import Scheme, normalize
from ....analyses.concepts.vectors import VectorBank
from ....base.errors import InputError
from ....core.scoring.encode import input_embeddings, n_prefix_tokens
from ....core.scoring.packing import packed_logliks
from ....core.scoring.request import ScoreRequest
from ...concepts.similarity import batched_scores, choice_ties
from .bank import NormedBank
from .plan import ItemPlan

if TYPE_CHECKING:
    from ....core.loading import LoadedModel

Tensor = torch.Tensor


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
                seg[n, e, : len(ex)] = torch.tensor(bank.rows(ex), dtype=torch.long)
                smask[n, e, : len(ex)] = True
        end = torch.tensor([bank.rows(it.endings) for it in items], dtype=torch.long)
        return cls(seg=seg, smask=smask, emask=smask.any(-1), end=end)

    def same_cut(self, other: EncLayout) -> bool:
        """Whether two encoding schemes cut every item into the very same examples and segments (e.g. all
        example-level schemes in zero-shot, where the query is the only example and one segment)."""
        return (
            self.seg.shape == other.seg.shape
            and torch.equal(self.seg, other.seg)
            and torch.equal(self.smask, other.smask)
            and torch.equal(self.end, other.end)
        )


def _masked_mean(x: Tensor, mask: Tensor, dim: int) -> Tensor:
    """Mean of ``x`` over ``dim`` counting only ``mask`` (broadcast over the trailing dims of x)."""
    m = mask.to(x.dtype)
    while m.dim() < x.dim():
        m = m.unsqueeze(-1)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def _unique_pairs(layers: Sequence[int], words: Sequence[int]) -> tuple[Tensor, Tensor, np.ndarray]:
    """Distinct (layer, word) pairs in first-seen order and, for each input pair, its position among them."""
    first: dict[tuple[int, int], int] = {}
    inv = [first.setdefault((l, w), len(first)) for l, w in zip(layers, words)]
    u = list(first)
    return (torch.tensor([k[0] for k in u]), torch.tensor([k[1] for k in u]), np.asarray(inv, dtype=np.int64))


def _seg_step(x: Tensor, smask: Tensor, emask: Tensor, norm: str | None, seg: str | None) -> tuple[Tensor, Tensor]:
    """SEGMENT_AGG of padded segment vectors ``x`` ``[n, E, S, P, D]``: the sequences ``[n, m, P, D]`` and their
    real positions ``[n, m]`` (one vector per example for ``mean``, every segment otherwise)."""
    n, E, S, P, D = x.shape
    if seg == "mean":
        return normalize(_masked_mean(x, smask, dim=2), norm), emask  # [n, E, P, D]
    return x.reshape(n, E * S, P, D), smask.reshape(n, E * S)


def _ex_step(seq: Tensor, mmask: Tensor, norm: str | None, ex: str | None) -> tuple[Tensor, Tensor]:
    """EXAMPLE_AGG of the sequences ``seq`` ``[n, m, P, D]`` (``soft_cluster`` is left to the scorer)."""
    if ex != "mean":
        return seq, mmask
    n = seq.shape[0]  # the mean only where more than one vector remains (A.6)
    avg = normalize(_masked_mean(seq, mmask, dim=1), norm).unsqueeze(1)  # [n, 1, P, D]
    first = seq[torch.arange(n), mmask.to(torch.int8).argmax(-1)].unsqueeze(1)  # the single real vector
    return (torch.where((mmask.sum(-1) > 1)[:, None, None, None], avg, first), torch.ones(n, 1, dtype=torch.bool))


@dataclass(frozen=True)
class _Bundle:
    """One bundle's fixed parts: its encoding's layout key, first scheme, distinct context pairs (``pl``, ``pw``)
    and choice encodings (``ol``, ``ow``) with each group's / scheme's position among them."""

    enc: str
    s0: Scheme
    pl: Tensor
    pw: Tensor
    p_inv: np.ndarray
    ol: Tensor
    ow: Tensor
    q_inv: np.ndarray
    pkey: tuple[object, ...]  # the bundles of equal keys share those steps
    okey: tuple[object, ...]

    @classmethod
    def of(
        cls,
        bank: VectorBank,
        enc: str,
        groups: Sequence[Sequence[Scheme]],
        layer_key: dict[str, str],
        alias: Sequence[int],
    ) -> _Bundle:
        s0 = groups[0][0]
        if s0.sim not in ("dot", "cosine"):
            raise InputError(f"invalid similarity {s0.sim!r}; use dot or cosine")
        # identical (layer, word) vectors give identical predictions: compute each distinct pair once
        pl, pw, p_inv = _unique_pairs(
            [alias[bank.layer_pos(layer_key[g[0].layer])] for g in groups], [bank.word_pos(g[0].word) for g in groups]
        )
        ol, ow, q_inv = _unique_pairs(
            [alias[bank.layer_pos(layer_key[s.out_layer_eff])] for s in groups[0]],
            [bank.word_pos(s.out_word_eff) for s in groups[0]],
        )
        return cls(
            enc=enc,
            s0=s0,
            pl=pl,
            pw=pw,
            p_inv=p_inv,
            ol=ol,
            ow=ow,
            q_inv=q_inv,
            pkey=(enc, tuple(pl.tolist()), tuple(pw.tolist())),
            okey=(enc, tuple(ol.tolist()), tuple(ow.tolist())),
        )


def _choices(nbank: NormedBank, end: Tensor, ol: Tensor, ow: Tensor) -> tuple[Tensor, list[Any]]:
    """The choice vectors ``[n, C, Q, D]`` of items' endings ``end`` ``[n, C]`` and which of them tie."""
    n, C = end.shape
    ch = nbank.pairs(end.reshape(-1), ol, ow).reshape(n, C, len(ol), -1)
    return ch, choice_ties(ch)


def test2_bundles_batched(
    bank: VectorBank,
    norm: str | None,
    layouts: dict[str, EncLayout],
    bundles: Sequence[tuple[str, Sequence[Sequence[Scheme]]]],
    layer_key: dict[str, str],
    chunk: int = 8,
    alias: Sequence[int] | None = None,
) -> list[np.ndarray]:
    """Test 2 predictions ``[groups, outs, items]`` of several bundles of one NORM, each ``(enc, groups)``: context
    groups that share (enc, seg, ex, sim) and the choice encodings (out_layer, out_word), differing in (layer,
    word); ``layouts[enc]`` is the :class:`EncLayout` of its encoding.

    Items go in chunks of ``chunk``, padding masked out; the scores are
    :func:`~walklens.lab.concepts.similarity.batched_scores`.  Within a
    chunk, each step is computed once for the bundles that share its inputs, as the very same call on the very
    same tensors, so every bundle's picks are the bits it gets alone (and those of one call per bundle, the
    sweep before batches: ``tests/test_sweep_eval.py``): the (layer, word) pairs an encoding's distinct rows
    need, read and normalised (:meth:`~.bank.NormedBank.pairs`: NORM acts on each vector by itself), the padded
    segment vectors, SEGMENT_AGG per ``seg``, EXAMPLE_AGG per ``ex``, the choice vectors and their ties per
    choice encodings.  Pairs whose bank vectors are bit-identical (``alias``:
    :meth:`~.bank.VectorBank.layer_alias`) are computed once.
    """
    alias = bank.layer_alias() if alias is None else alias
    nbank = NormedBank(bank, norm)
    plans = [_Bundle.of(bank, enc, groups, layer_key, alias) for enc, groups in bundles]
    if any(p.s0.norm != norm for p in plans):
        raise ValueError("the bundles of one call share their NORM")
    N, D = next(iter(layouts.values())).seg.shape[0], bank.vectors.shape[-1]
    preds = [np.empty((len(p.pl), len(p.ol), N), np.uint8) for p in plans]
    for a in range(0, N, chunk):
        sl = slice(a, min(N, a + chunk))
        memo: dict[tuple[object, ...], object] = {}  # this chunk's shared steps

        def once(key: tuple[object, ...], fn: Callable[[], object]) -> Any:
            if key not in memo:
                memo[key] = fn()
            return memo[key]

        for p, out in zip(plans, preds):
            lay, s0 = layouts[p.enc], p.s0
            n, E, S = lay.seg[sl].shape
            u, inv = once(("rows", p.enc), lambda: torch.unique(lay.seg[sl], return_inverse=True))
            x: Tensor = once(
                ("x", p.pkey),  # [n, E, S, P, D]; each distinct row (padding: row 0) normalised once
                lambda: nbank.pairs(u, p.pl, p.pw)[inv.reshape(-1)].reshape(n, E, S, len(p.pl), D),
            )
            seg = once(("seg", p.pkey, s0.seg), lambda: _seg_step(x, lay.smask[sl], lay.emask[sl], norm, s0.seg))
            seq, mmask = once(("ex", p.pkey, s0.seg, s0.ex), lambda: _ex_step(seg[0], seg[1], norm, s0.ex))
            ch, ties = once(("ch", p.okey), lambda: _choices(nbank, lay.end[sl], p.ol, p.ow))
            score = batched_scores(seq, mmask, ch, s0.sim, s0.ex == "soft_cluster", ties)  # [n, P, C, Q]
            out[:, :, sl] = score.numpy().argmax(2).transpose(1, 2, 0)  # [P, Q, n]; as torch's: the first max or NaN
    full = []
    for p in plans:  # each bundle's picks for its groups and choice encodings, one compact array freed at a time
        full.append(preds.pop(0)[np.ix_(p.p_inv, p.q_inv)])
    return full


def test2_bundle_batched(
    bank: VectorBank,
    nbank: NormedBank,
    layout: EncLayout,
    groups: Sequence[Sequence[Scheme]],
    layer_key: dict[str, str],
    chunk: int = 8,
    alias: Sequence[int] | None = None,
) -> np.ndarray:
    """Test 2 predictions ``[groups, outs, items]`` of one bundle (:func:`test2_bundles_batched`); ``nbank`` is the
    bank after the groups' NORM, ``layout`` the encoding's :class:`EncLayout`."""
    return test2_bundles_batched(bank, nbank.norm, {"": layout}, [("", groups)], layer_key, chunk, alias)[0]


def test1_predictions(
    lm: LoadedModel,
    bank: VectorBank,
    nbank: NormedBank,
    items: Sequence[ItemPlan],
    scheme: Scheme,
    layer_key: dict[str, str],
    conts: Sequence[Sequence[Sequence[int]]],
    memo: dict[bytes, list[float]],
) -> np.ndarray:
    """Test 1 (pyramidal generation, sec. 5.1.1) predictions ``[2, 1, items]`` (acc, acc_norm) of one scheme.

    The concept sequence of each item (from the bank; Gemma's BOS embedding in front, as
    :func:`~walklens.lab.concepts.generation.concept_sequence`) replaces the context;
    :func:`~walklens.core.scoring.packing.packed_logliks` scores the
    baseline's continuation tokens of the four endings after it, every item's request packed into shared
    forward passes.  ``memo`` maps the bytes of a concept sequence (and its continuations) to its four
    log-likelihoods, so schemes that give the same sequence (e.g. every EXAMPLE_AGG of a one-example context)
    share one pass.
    """
    if not lm.is_causal:
        raise InputError("the Test 1 sweep supports decoder-only models (use walklens hellaswag test1 for others)")
    lk, wk = bank.layer_pos(layer_key[scheme.layer]), bank.word_pos(scheme.word)
    dtype = lm.model.get_input_embeddings().weight.dtype  # type: ignore[operator]  # an HF model's method, typed by nn.Module.__getattr__
    prefix = None
    if n_prefix_tokens(lm):
        with torch.inference_mode():
            bos = torch.tensor([lm.tokenizer.bos_token_id], device=lm.device)
            prefix = input_embeddings(lm, bos).float().cpu()
    keys: list[bytes] = []
    new: dict[bytes, ScoreRequest] = {}
    for j, it in enumerate(items):
        segs = [nbank[bank.rows(e)][:, lk, wk] for e in it.contexts[scheme.enc]]  # [n_segments, D] per example
        seq = compose_context(segs, scheme.seg, scheme.ex, scheme.norm)
        if prefix is not None:
            seq = torch.cat([prefix, seq], dim=0)
        seq = seq.to(dtype).contiguous()
        key = hashlib.sha256(seq.view(torch.uint8).numpy().tobytes() + json.dumps(conts[j]).encode()).digest()
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
