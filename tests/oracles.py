"""Reference implementations the tests compare walklens against (slow and plain on purpose; not shipped).

- :func:`eigen_dense`: the eigen-structure of a dense F [D, D] (O(D^3)), for :func:`walklens.ov.eigen_factored`,
  which works through the small product B A.
- :func:`reference_logliks`: lm-evaluation-harness's own way of scoring continuations, each (context,
  continuation) pair as one full sequence with no sharing, for the one-context-pass and packed scorers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from walklens.ov import Eigen, eig, is_complex_pair, phase_fix, real_basis

if TYPE_CHECKING:
    from walklens.loading import LoadedModel


def eigen_dense(F: torch.Tensor) -> Eigen:
    """The quantities of :func:`walklens.ov.eigen_factored` from a dense [D, D] F."""
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
def reference_logliks(lm: LoadedModel, context_ids: Sequence[int], continuations: Sequence[Sequence[int]]
                      ) -> list[float]:
    """Each (context, continuation) pair as one full sequence, with no sharing (causal: input
    ``(ctx + cont)[:-1]``, the last ``len(cont)`` logits; encoder-decoder: the context into the encoder and the
    continuation as the decoder's labels)."""
    out = []
    dev = lm.device
    for cont in continuations:
        if lm.adapter.auto_class == "seq2seq":
            logits = lm.model(input_ids=torch.tensor([list(context_ids)], device=dev),
                              labels=torch.tensor([list(cont)], device=dev)).logits[0]
        else:
            inp = torch.tensor([list(context_ids) + list(cont)[:-1]], device=dev)
            logits = lm.model(input_ids=inp, use_cache=False).logits[0, -len(cont):]
        lp = torch.log_softmax(logits.float(), dim=-1)
        out.append(float(lp.gather(-1, torch.tensor(list(cont), device=dev)[:, None]).sum()))
    return out
