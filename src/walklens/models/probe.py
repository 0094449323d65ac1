"""The data-flow probe and the identities it checks, shared by derived adapters (:mod:`.derive`) and the parity
card (:mod:`walklens.analyses.parity`): one forward pass records chosen modules' inputs, outputs and attention
probabilities; :func:`close` compares two tensors to a dtype's tolerance; :func:`scores_error` rebuilds attention
from W_q, W_k at position 0; :func:`identity_ok` checks the A.3 identity on one attention module.

The model's own forward pass on the probe's token ids (:func:`own_forward`; at every load, :func:`check_forward`)
is the first check of a checkpoint: when it fails, the checkpoint or its config is inconsistent, said in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from ..base.errors import UnknownModelError, WalklensError
from ..base.hooks import Hooks
from ..base.precision import UNIT_ROUNDOFF
from .base import HeadWeights, get_module, has_module, soft_cap

#: names of the q and k norm modules inside an attention module, in (q, k) pairs
QK_NORM_NAMES = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "q_ln", "k_ln")
#: a fixed probe: token ids cycled through the vocabulary, long enough to see attention mix positions
PROBE_LEN = 12
#: config attributes that bound a model's positions (a probe longer than one of them is cut to it)
POSITION_LIMITS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")
T = TypeVar("T")


def probe_ids(model: nn.Module) -> torch.Tensor:
    """The probe's token ids [1, T] on the model's device: :data:`PROBE_LEN` ids cycled through the vocabulary (at
    most as many as the config's positions)."""
    embed: Any = model.get_input_embeddings()  # type: ignore[operator]  # an nn.Module attribute, typed as a Tensor
    limits = [getattr(model.config, a, None) for a in POSITION_LIMITS]
    n = min([PROBE_LEN, *(v for v in limits if isinstance(v, int) and not isinstance(v, bool) and v > 0)])
    ids = (torch.arange(n) * 7 + 3) % int(embed.weight.shape[0])
    return ids[None].to(embed.weight.device)


def own_forward(run: Callable[[], T], model_type: str) -> T:
    """``run()``, the model's own forward pass on the probe; its failure (any exception but a walklens error) is
    one :class:`~walklens.base.errors.UnknownModelError` line: the checkpoint or its config is inconsistent."""
    try:
        return run()
    except WalklensError:
        raise
    except Exception as e:  # the model's own code fails: shapes, indices, dtypes its config does not fit
        lines = str(e).strip().splitlines()
        first = " ".join(lines[0].split())[:200] if lines else ""
        raise UnknownModelError(
            f"the checkpoint or its config is inconsistent: the {model_type} model's own forward pass fails on "
            f"a few token ids ({type(e).__name__}{': ' + first if first else ''})"
        ) from None


def check_forward(model: nn.Module, auto_class: str) -> None:
    """One forward pass of the model on the probe's token ids (``auto_class``: ``causal``, ``seq2seq`` or
    ``masked``), refused in one line when it fails (:func:`own_forward`)."""
    ids = probe_ids(model)
    kw: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if auto_class == "seq2seq":
        kw["decoder_input_ids"] = ids
    if auto_class != "masked":
        kw["use_cache"] = False
    with torch.no_grad():
        own_forward(lambda: model(**kw), str(getattr(model.config, "model_type", "?")))


class Probe:
    """Inputs and outputs of the watched modules over one forward pass (first call of each)."""

    def __init__(self, modules: dict[str, nn.Module], tol: float) -> None:
        self.modules = modules
        self.tol = tol
        self.ins: dict[str, torch.Tensor] = {}
        self.outs: dict[str, torch.Tensor] = {}
        self.extra: dict[str, Any] = {}

    def run(self, model: nn.Module, **kwargs: Any) -> Any:
        with Hooks() as hooks, torch.no_grad():
            for name, mod in self.modules.items():
                hooks.pre(mod, self._pre(name), with_kwargs=True)
                hooks.post(mod, self._post(name))
            return model(**kwargs)

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs.get("hidden_states", kwargs.get("input"))
            if isinstance(x, torch.Tensor) and name not in self.ins:
                self.ins[name] = x.detach().float()

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _i: Any, out: Any) -> None:
            if name in self.outs:
                return
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, torch.Tensor):
                self.outs[name] = first.detach().float()
            if isinstance(out, (tuple, list)):  # attention probabilities: the last 4-D tensor of the tuple
                probs = [t for t in out[1:] if isinstance(t, torch.Tensor) and t.dim() == 4]
                if probs:
                    self.extra[name] = probs[-1].detach().double()

        return hook


#: relative tolerance of the probe's comparisons, per model dtype: float32 rounding is far below 1e-4; a 16-bit
#: model rounds each sum to its unit roundoff (8 of them leave room without hiding a wrong role).
PROBE_TOL = {torch.float32: 1e-4, **{dt: 8 * UNIT_ROUNDOFF[dt] for dt in (torch.bfloat16, torch.float16)}}


def close(a: torch.Tensor | None, b: torch.Tensor | None, rel: float) -> bool:
    """``a`` equals ``b`` to ``rel`` of b's scale."""
    if a is None or b is None or a.shape != b.shape:
        return False
    scale = max(float(b.abs().max()), 1e-6)
    return float((a - b).abs().max()) <= rel * scale


def scores_error(
    hw: HeadWeights,
    X: torch.Tensor,
    A: torch.Tensor,
    q_norm: nn.Module | None = None,
    k_norm: nn.Module | None = None,
    softcap: float | None = None,
) -> float:
    """Max |attention probability rebuilt from W_q, W_k - the model's|, for X and A [H, T, T] recorded with every
    position id 0: softmax(scale * q k^T + mask), with the family's own q/k norm modules applied to q and k (per
    head, or over the full width, as their weights say) and its score soft-cap, where it has them.  The mask is
    causal plus the model's own: entries its attention leaves at exactly 0 (a sliding window) stay masked."""
    w = hw
    X = X.double()
    q = torch.einsum("td,hde->hte", X, w.w_q.double()) + w.b_q.double()[:, None]
    k = torch.einsum("td,hde->hte", X, w.w_k.double()) + w.b_k.double()[:, None]
    q, k = _normed(q, q_norm), _normed(k, k_norm)
    k = k[list(w.kv_head)]
    s = (q @ k.transpose(1, 2)) * w.scale
    s = soft_cap(s, softcap)
    T = X.shape[0]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1) | (A == 0), float("-inf"))
    return float((s.softmax(-1) - A.double()).abs().max())


def _normed(x: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
    """[n, T, d] through a q/k norm module, laid out as its weight says: [d] per head (Qwen 3, Gemma 3; StableLM's
    list of per-head norms), [n*d] over the full width (OLMo 2), [n, d] one weight row per head (Cohere)."""
    if norm is None:
        return x
    n, T, d = x.shape
    p = next(norm.parameters(), None)
    dt = p.dtype if p is not None else torch.float32
    with torch.no_grad():
        if p is not None and p.dim() == 1 and p.numel() == n * d:
            return norm(x.transpose(0, 1).reshape(T, n * d).to(dt)).double().reshape(T, n, d).transpose(0, 1)
        if p is not None and p.dim() == 2:
            return norm(x.transpose(0, 1).to(dt)).double().transpose(0, 1)
        return norm(x[None].to(dt))[0].double()  # [1, n, T, d]: StableLM's per-head norms split dim 1


def identity_ok(hw: HeadWeights, X: torch.Tensor, A: torch.Tensor, out: torch.Tensor, tol: float) -> bool:
    """The A.3 identity as the analyses use it: sum_h (A_h X W_vo,h + b_v,h W_o,h) + b_o equals the attention
    output, the value bias passing unchanged because every row of A_h sums to 1 (attention sinks, which keep
    part of a row's mass out of A, break it)."""
    X, A = X.double(), A.double()
    v = torch.einsum("td,hde->hte", X, hw.w_v.double())[list(hw.kv_head)]
    heads = A @ v + hw.b_v.double()[list(hw.kv_head)][:, None]  # [H, T, d]
    rec = torch.einsum("hte,heD->tD", heads, hw.w_o.double()) + hw.b_o.double()
    return close(rec, out.double(), tol)


def rows_sum_to_one(A: torch.Tensor, tol: float) -> bool:
    """Whether every attention row sums to 1 (a sink column kept out of A makes rows sum to less)."""
    return bool((A.double().sum(-1) - 1).abs().max() <= tol)


def qk_norms(attn: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """An attention module's own q and k norms, if it has them."""
    pairs = [(q, k) for q, k in zip(QK_NORM_NAMES[::2], QK_NORM_NAMES[1::2]) if has_module(attn, q)]
    return (get_module(attn, pairs[0][0]), get_module(attn, pairs[0][1])) if pairs else (None, None)


def score_softcap(config: Any) -> float | None:
    """The soft-cap of attention scores in the config (Gemma 2), if any."""
    cap = getattr(config, "attn_logit_softcapping", None)
    return float(cap) if cap else None


__all__ = [
    "PROBE_LEN",
    "PROBE_TOL",
    "QK_NORM_NAMES",
    "Probe",
    "check_forward",
    "close",
    "identity_ok",
    "own_forward",
    "probe_ids",
    "qk_norms",
    "rows_sum_to_one",
    "score_softcap",
    "scores_error",
]
