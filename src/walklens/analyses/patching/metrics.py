"""The metrics a patched run is scored by, each a function of one position's logits (docs/patching.md).

- ``logitdiff:A,B`` -- logit(A) - logit(B) (Wang et al. 2022, "Interpretability in the Wild", sec. 3: the IOI logit
  difference);
- ``logprob:T`` -- log p(T);
- ``rank:T`` -- T's rank among the vocabulary (0: the top token; ties counted against T); no gradient;
- ``kl`` -- KL(p_clean || p_patched) in nats (Heimersheim & Nanda 2024, "How to use and interpret activation
  patching", sec. 4: a metric of the whole distribution);
- a callable ``f(logits [V] float32) -> scalar`` (a 0-dim tensor for attribution patching).

Every metric is checked on every call: a non-scalar or a NaN/inf value is refused in one line.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...base.errors import InputError

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

MetricFn = Callable[[torch.Tensor, torch.Tensor], Any]  #: (logits [V], clean logits [V]) -> a scalar


@dataclass(frozen=True)
class Metric:
    """A named metric: ``fn(logits, clean_logits)``; ``differentiable`` says whether attribution patching may use it."""

    name: str
    fn: MetricFn
    differentiable: bool = True

    def tensor(self, logits: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
        """The metric as a 0-dim float tensor (kept in the autograd graph when the logits are in one); refuses a
        non-scalar or non-finite value in one line."""
        v = self.fn(logits, clean)
        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                raise InputError(f"metric {self.name} returned {v.numel()} numbers (shape {tuple(v.shape)}), not one")
            v = v.reshape(())
        else:
            try:
                v = torch.tensor(float(v), dtype=torch.float64)
            except (TypeError, ValueError):
                raise InputError(f"metric {self.name} returned a {type(v).__name__}, not a number") from None
        if not math.isfinite(float(v.detach())):
            raise InputError(f"metric {self.name} returned {float(v.detach())} (not finite)")
        return v

    def value(self, logits: torch.Tensor, clean: torch.Tensor) -> float:
        return float(self.tensor(logits, clean).detach())


def token_id(lm: LoadedModel, token: str) -> int:
    """The id of ``token``, which must be exactly one token of the model's vocabulary."""
    ids = lm.tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise InputError(f"metric token {token!r} is {len(ids)} tokens of this model, not one")
    return int(ids[0])


def logit_diff(a: int, b: int) -> MetricFn:
    return lambda logits, _clean: logits[a] - logits[b]


def log_prob(t: int) -> MetricFn:
    return lambda logits, _clean: torch.log_softmax(logits.float(), -1)[t]


def rank(t: int) -> MetricFn:
    return lambda logits, _clean: float((logits > logits[t]).sum().item())


def kl_to_clean(logits: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """KL(p_clean || p) in nats, in float32 at least."""
    lp = torch.log_softmax(logits.float(), -1)
    lc = torch.log_softmax(clean.float().detach(), -1)
    return (lc.exp() * (lc - lp)).sum()


def parse_metric(lm: LoadedModel, spec: str | Metric | Callable[..., Any]) -> Metric:
    """A :class:`Metric` from ``logitdiff:A,B``, ``logprob:T``, ``rank:T``, ``kl``, a Metric, or a callable of the
    logits (one argument) or of the logits and the clean logits (two)."""
    if isinstance(spec, Metric):
        return spec
    if callable(spec):
        fn = spec
        name = getattr(fn, "__name__", "callable")
        try:
            params = inspect.signature(fn).parameters.values()
            two = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) >= 2
        except (TypeError, ValueError):
            two = False
        return Metric(name, fn if two else (lambda logits, _c: fn(logits)))
    kind, _, arg = str(spec).partition(":")
    kind = kind.strip().lower()
    if kind == "kl" and not arg:
        return Metric("kl", kl_to_clean)
    if kind == "logitdiff":
        toks = _tokens(arg, 2, spec)
        return Metric(f"logitdiff:{toks[0]!r},{toks[1]!r}", logit_diff(token_id(lm, toks[0]), token_id(lm, toks[1])))
    if kind in ("logprob", "rank"):
        (tok,) = _tokens(arg, 1, spec)
        t = token_id(lm, tok)
        if kind == "logprob":
            return Metric(f"logprob:{tok!r}", log_prob(t))
        return Metric(f"rank:{tok!r}", rank(t), differentiable=False)
    raise InputError(f"metric {spec!r}: give logitdiff:A,B, logprob:TOKEN, rank:TOKEN or kl")


def _tokens(arg: str, n: int, spec: Any) -> list[str]:
    parts = _split(arg)
    if len(parts) != n or any(p == "" for p in parts):
        raise InputError(f"metric {spec!r}: needs {n} token{'s' if n > 1 else ''} after the colon")
    return parts


def _split(arg: str) -> list[str]:
    """Tokens separated by commas; a token may be quoted ("A","B") to keep its leading space."""
    out: list[str] = []
    for part in arg.split(","):
        p = part
        if len(p.strip()) >= 2 and p.strip()[0] == p.strip()[-1] and p.strip()[0] in "\"'":
            p = p.strip()[1:-1]
        out.append(p)
    return out


__all__ = ["Metric", "MetricFn", "parse_metric", "token_id", "kl_to_clean"]
