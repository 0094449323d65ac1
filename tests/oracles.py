"""Reference implementations the tests compare walklens against (slow and plain on purpose; not shipped).

- :func:`eigen_dense`: the eigen-structure of a dense F [D, D] (O(D^3)), for
:func:`walklens.core.ov.eigen_factored`,
  which works through the small product B A.
- :func:`reference_logliks`: lm-evaluation-harness's own way of scoring continuations, each (context,
  continuation) pair as one full sequence with no sharing, for the one-context-pass and packed scorers.
- :func:`reference_test2_bundle` (with :func:`score_batch`): Test 2 of a bundle of sweep groups item by item,
  with a plain einsum and an explicit soft-cluster context vector per choice, for the sweep's batched scorer.
- :func:`test2_bundle_v1`: the sweep's batched Test 2 as it was before bundles shared their work (each bundle
  re-reads and re-normalises every row of every item chunk), for the bit-identity of the shared evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from walklens.analyses.concepts.compose import compose_context
from walklens.analyses.concepts.schemes import Scheme, normalize
from walklens.analyses.concepts.vectors import VectorBank
from walklens.core.ov import Eigen, eig, is_complex_pair, phase_fix, real_basis
from walklens.lab.concepts.similarity import batched_scores, tie_identical
from walklens.lab.experiments.sweep import EncLayout, ItemPlan, NormedBank

if TYPE_CHECKING:
    from walklens.core.loading import LoadedModel


def eigen_dense(F: torch.Tensor) -> Eigen:
    """The quantities of :func:`walklens.core.ov.eigen_factored` from a dense [D, D] F."""
    F = F.double()
    ev, Y = eig(F.T)
    order = torch.argsort(ev.abs(), descending=True, stable=True)
    ev, Y = ev[order], Y[:, order]
    lam1 = ev[0]
    pair = is_complex_pair(lam1)
    basis = real_basis(phase_fix(Y[:, 0]), pair)
    ev_r, Z = eig(F)
    j = int(torch.argmin((ev_r - lam1).abs()))
    right = real_basis(phase_fix(Z[:, j]), pair)[0]
    mods = ev.abs()
    nxt = 2 if pair else 1
    gap = float(mods[nxt] / mods[0]) if mods[0] > 0 else float("nan")
    return Eigen(eigenvalues=ev, v1=basis[0].clone(), basis=basis, v1_right=right, complex_pair=pair, gap=gap)


@torch.inference_mode()
def reference_logliks(
    lm: LoadedModel, context_ids: Sequence[int], continuations: Sequence[Sequence[int]]
) -> list[float]:
    """Each (context, continuation) pair as one full sequence, with no sharing (causal: input
    ``(ctx + cont)[:-1]``, the last ``len(cont)`` logits; encoder-decoder: the context into the encoder and the
    continuation as the decoder's labels)."""
    out = []
    dev = lm.device
    for cont in continuations:
        if lm.adapter.auto_class == "seq2seq":
            logits = lm.model(
                input_ids=torch.tensor([list(context_ids)], device=dev), labels=torch.tensor([list(cont)], device=dev)
            ).logits[0]
        else:
            inp = torch.tensor([list(context_ids) + list(cont)[:-1]], device=dev)
            logits = lm.model(input_ids=inp, use_cache=False).logits[0, -len(cont) :]
        lp = torch.log_softmax(logits.float(), dim=-1)
        out.append(float(lp.gather(-1, torch.tensor(list(cont), device=dev)[:, None]).sum()))
    return out


def score_batch(ctx: torch.Tensor, choices: torch.Tensor, sim: str, soft_cluster: bool) -> torch.Tensor:
    """Test 2 scores ``[P, Q, C]`` of choice vectors ``[Q, C, D]`` against context sequences ``[P, m, D]``:
    the best match over the sequence, ``max_j sim(k_j, e_c)``; with ``soft_cluster`` the sequence is first
    averaged with weights ``softmax_j(k_j · e_c)`` (one context vector per choice, formed explicitly) and
    compared once.  ``sim``: ``dot`` or ``cosine``."""
    assert sim in ("dot", "cosine"), sim
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


def reference_test2_bundle(
    bank: VectorBank,
    nbank: NormedBank,
    items: Sequence[ItemPlan],
    groups: Sequence[Sequence[Scheme]],
    layer_key: dict[str, str],
) -> tuple[np.ndarray, np.ndarray]:
    """Test 2 of context groups that share (enc, norm, seg, ex, sim) and the choice encodings (out_layer,
    out_word), differing in (layer, word), one item at a time: predictions ``[groups, outs, items]`` and the
    scores they were picked from ``[groups, outs, items, C]`` (after
    :func:`~walklens.lab.concepts.similarity.tie_identical`).

    ``nbank`` is the bank after the groups' NORM.  Per item, the context sequences ``[P, m, D]`` are composed by
    :func:`~walklens.analyses.concepts.compose.compose_context` and scored with :func:`score_batch`."""
    s0 = groups[0][0]
    pl = torch.tensor([bank.layer_pos(layer_key[g[0].layer]) for g in groups])
    pw = torch.tensor([bank.word_pos(g[0].word) for g in groups])
    ol = torch.tensor([bank.layer_pos(layer_key[s.out_layer_eff]) for s in groups[0]])
    ow = torch.tensor([bank.word_pos(s.out_word_eff) for s in groups[0]])
    scores = []
    for it in items:
        segs = [nbank[bank.rows(e)][:, pl, pw].transpose(0, 1) for e in it.contexts[s0.enc]]  # [P, n, D] each
        ctx = compose_context(segs, s0.seg, s0.ex, s0.norm)  # [P, m, D]
        choice = nbank[bank.rows(it.endings)][:, ol, ow].transpose(0, 1)  # [Q, C, D]
        sc = score_batch(ctx, choice, s0.sim, s0.ex == "soft_cluster")  # [P, Q, C]
        scores.append(tie_identical(sc, choice.unsqueeze(0), 2, 2).numpy())
    out = np.stack(scores, axis=2)  # [P, Q, items, C]
    return out.argmax(-1).astype(np.uint8), out


def _v1_masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    m = mask.to(x.dtype)
    while m.dim() < x.dim():
        m = m.unsqueeze(-1)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def _v1_pairs(layers: Sequence[int], words: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    first: dict[tuple[int, int], int] = {}
    inv = [first.setdefault((l, w), len(first)) for l, w in zip(layers, words)]
    return (torch.tensor([k[0] for k in first]), torch.tensor([k[1] for k in first]), np.asarray(inv, dtype=np.int64))


def _v1_normed(bank: VectorBank, norm: str | None, rows: torch.Tensor) -> torch.Tensor:
    """``NormedBank.__getitem__`` as it was: whole rows ``[rows, layers, words, D]``, NORM on all (not ``last``)."""
    x = bank.vectors[rows]
    if norm is None:
        return x
    out = normalize(x, norm)
    if "last" in bank.words:
        out[..., bank.word_pos("last"), :] = x[..., bank.word_pos("last"), :]
    return out


def test2_bundle_v1(
    bank: VectorBank,
    norm: str | None,
    layout: EncLayout,
    groups: Sequence[Sequence[Scheme]],
    layer_key: dict[str, str],
    chunk: int = 8,
    alias: Sequence[int] | None = None,
) -> np.ndarray:
    """Predictions ``[groups, outs, items]`` of one bundle, exactly as ``test2_bundle_batched`` computed them
    before the bundles of one NORM shared their work (walklens 12e298f): per chunk of ``chunk`` items, the whole
    rows read, normalised, the (layer, word) pairs picked, composed with masked padding, scored."""
    s0 = groups[0][0]
    alias = bank.layer_alias() if alias is None else alias
    pl, pw, p_inv = _v1_pairs(
        [alias[bank.layer_pos(layer_key[g[0].layer])] for g in groups], [bank.word_pos(g[0].word) for g in groups]
    )
    ol, ow, q_inv = _v1_pairs(
        [alias[bank.layer_pos(layer_key[s.out_layer_eff])] for s in groups[0]],
        [bank.word_pos(s.out_word_eff) for s in groups[0]],
    )
    N, D = layout.seg.shape[0], bank.vectors.shape[-1]
    preds = np.empty((len(pl), len(ol), N), np.uint8)
    for a in range(0, N, chunk):
        sl = slice(a, min(N, a + chunk))
        idx = layout.seg[sl]
        n, E, S = idx.shape
        x = _v1_normed(bank, norm, idx.reshape(-1))[:, pl, pw].reshape(n, E, S, len(pl), D)
        smask, emask = layout.smask[sl], layout.emask[sl]
        if s0.seg == "mean":
            seq, mmask = normalize(_v1_masked_mean(x, smask, dim=2), norm), emask
        else:
            seq, mmask = x.reshape(n, E * S, len(pl), D), smask.reshape(n, E * S)
        if s0.ex == "mean":
            avg = normalize(_v1_masked_mean(seq, mmask, dim=1), norm).unsqueeze(1)
            first = seq[torch.arange(n), mmask.to(torch.int8).argmax(-1)].unsqueeze(1)
            seq = torch.where((mmask.sum(-1) > 1)[:, None, None, None], avg, first)
            mmask = torch.ones(n, 1, dtype=torch.bool)
        ch = _v1_normed(bank, norm, layout.end[sl].reshape(-1))[:, ol, ow].reshape(n, -1, len(ol), D)
        score = batched_scores(seq, mmask, ch, s0.sim, s0.ex == "soft_cluster")
        preds[:, :, sl] = score.argmax(2).permute(1, 2, 0).numpy()
    return preds[p_inv][:, q_inv]
