"""The parity card: every recomputation walklens makes, measured against the model itself (``walklens verify``).

A reading is never wrong in silence: each check below recomputes something an analysis relies on and compares
it with what the model computes, on a few fixed texts, with a tolerance per dtype.

- ``logits``: logits recomputed from the ``final`` point through the adapter's head (eq. 12, with any soft-cap
  or logit scale) against the model's own logits: max |Δlogit| / max |logit|, and KL(model || lens) in nats;
- ``hidden_states``: the captured layer inputs and ``final`` against ``output_hidden_states``;
- ``residual``: each layer's points add up to its output (``resid_pre + attn_out + mlp_out = resid_post``; the
  norms for post-norm families) and each layer's output is the next layer's input;
- ``attention_identity``: the A.3 identity on every attention module (:func:`walklens.attention_identity`);
- ``attention_scores``: per-head attention rebuilt as softmax(scale (X W_q + b_q)(X W_k + b_k)^T + causal mask)
  with every position id 0 (no rotation, one learned position), against the model's attention; not measurable
  where the position scheme adds a bias (ALiBi, T5 buckets) or the family breaks ``qk_bilinear``;
- ``decoding_walk``: the greedy decoding walk (:func:`walklens.decoding_walk`) against ``model.generate``, and
  each step's token probability recomputed from d_t through the head;
- ``mlp_activation``: the adapter's MLP activation against the model's own activation module.

:func:`verify` returns a :class:`ParityCard`; ``quick=True`` runs the first four (what a derived adapter is
accepted on, :mod:`walklens.models.derive`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from ..base.display import WIDTH, Shown, headline
from ..base.frames import Columns, DataFrame, attribute_table, frame, pick, record_table
from ..base.precision import UNIT_ROUNDOFF, dtype_name
from ..core.capture import capture
from ..models.base import get_module, has_module
from ..models.derive import ACT_NAMES, MLP_NAMES
from ..models.probe import Probe, qk_norms, score_softcap, scores_error
from .attention import attention_identity, head_matrices
from .decoding import decoding_walk

if TYPE_CHECKING:
    from transformers.generation.utils import GenerationMixin

    from ..core.loading import LoadedModel
    from ..core.trace import Trace

TEXTS = (
    "the capital of france is paris and the king ran to the river",
    "The quick brown fox jumps over the lazy dog. 1, 2, 3, 4!",
)
#: Relative tolerance per check in float32 (16-bit dtypes: :func:`tolerance`).
FLOAT32_TOL = {
    "logits": 1e-5,
    "hidden_states": 1e-6,
    "residual": 1e-5,
    "attention_identity": 1e-5,
    "attention_scores": 1e-5,
    "decoding_walk": 1e-4,
    "mlp_activation": 1e-6,
}
QUICK = ("logits", "residual", "attention_identity", "attention_scores")


def tolerance(check: str, dtype: torch.dtype) -> float:
    """The check's tolerance: :data:`FLOAT32_TOL`, or 8 unit roundoffs of a 16-bit dtype (each recomputation
    rounds a few times in the model's dtype; a wrong role errs by the order of the value itself)."""
    if dtype == torch.float32 or check == "hidden_states":  # captured points are the model's tensors, exactly
        return FLOAT32_TOL[check]
    return 8 * UNIT_ROUNDOFF[dtype]


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


@dataclass(frozen=True)
class ParityCheck:
    """One check: ``error`` against ``tolerance`` (``passed`` None: not measurable here, ``note`` says why)."""

    name: str
    what: str
    error: float | None
    tolerance: float
    passed: bool | None
    note: str = ""
    detail: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ParityCard(Shown, view="parity"):
    """Every check of one model in one dtype (``checks`` in the order of :data:`FLOAT32_TOL`)."""

    model_name: str
    family: str
    derived: bool
    dtype: str
    texts: tuple[str, ...]
    checks: tuple[ParityCheck, ...]
    limits: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when no check failed (a check not measurable here does not fail the card)."""
        return all(c.passed is not False for c in self.checks)

    def __getitem__(self, name: str) -> ParityCheck:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.passed is False]

    def _headline(self) -> str:
        """The head line of its text repr (:mod:`walklens.base.display`)."""
        return f"{self.model_name}, {self.dtype}, {'pass' if self.passed else 'FAIL'}"

    def __repr__(self) -> str:
        """80 columns: the head line, then each check's verdict, error and tolerance."""
        lines = [headline(self)]
        for c in self.checks:
            mark = "ok" if c.passed else "n/a" if c.passed is None else "FAIL"
            lines.append(f"  {c.name:<16} {mark:<4} error {_g(c.error)} tol {_g(c.tolerance)}"[:WIDTH])
        return "\n".join(lines)

    def _columns(self, table: str = "checks") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        return pick(
            table,
            {
                "checks": lambda: attribute_table(
                    self.checks, ("name", "what", "error", "tolerance", "passed", "note")
                ),
                "detail": lambda: record_table(
                    [{"check": c.name, "key": k, "value": v} for c in self.checks for k, v in c.detail.items()],
                    ["check", "key", "value"],
                ),
            },
            "a ParityCard",
        )

    def to_pandas(self, table: str = "checks") -> DataFrame:
        """The card as tables (pandas; docs/notebooks.md, "Tables"): ``checks`` one row per check (``passed``
        missing: not measurable here, ``note`` says why); ``detail`` each check's further numbers, one row per
        (check, key)."""
        return frame(
            self._columns(table),
            {
                "model": self.model_name,
                "family": self.family,
                "derived": self.derived,
                "dtype": self.dtype,
                "passed": self.passed,
                "texts": list(self.texts),
                "limits": dict(self.limits),
            },
        )


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-12))


def _reference(lm: LoadedModel, tr: Trace) -> Any:
    """The model's own forward pass over the trace's tokens, with its hidden states (a causal LM)."""
    with torch.no_grad():
        return lm.model(tr.token_ids[None].to(lm.device), output_hidden_states=True, use_cache=False)


def _logits(lm: LoadedModel, tr: Trace, out: Any) -> tuple[float, dict[str, float]]:
    lens, ref = tr.logits().double(), out.logits[0].double().cpu()
    kl = (
        torch.nn.functional.kl_div(lens.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="none")
        .sum(-1)
        .max()
    )
    return _rel(lens, ref), {"max_abs_dlogit": float((lens - ref).abs().max()), "max_kl": float(kl)}


def _hidden(tr: Trace, out: Any) -> tuple[float, dict[str, float]]:
    hs = out.hidden_states
    errs = [_rel(tr[("resid_pre", l)], hs[l][0].cpu()) for l in range(tr.n_layers)]
    errs.append(_rel(tr["final"], hs[tr.n_layers][0].cpu()))
    return max(errs), {"points": float(len(errs))}


def _residual(lm: LoadedModel, tr: Trace) -> tuple[float, dict[str, float]]:
    kind = lm.adapter.residual_kind(lm.model.config)
    spec = lm.adapter.stack()
    errs = []
    for l in range(tr.n_layers):
        pre, post = tr[("resid_pre", l)], tr[("resid_post", l)]
        attn, mlp = tr[("attn_out", l)], tr[("mlp_out", l)]
        if kind == "post_norm":
            mod = lm.adapter.layer_modules(lm.model)[l]
            ln1, ln2 = spec.norm_module(mod, "attn"), spec.norm_module(mod, "mlp")
            assert ln1 is not None and ln2 is not None, "a post-norm family names its attention and MLP norms"
            mid = tr[("resid_mid", l)]
            with torch.no_grad():
                dev, dt = lm.device, lm.dtype
                errs.append(_rel(ln1((pre + attn).to(dev, dt)).float().cpu(), mid))
                errs.append(_rel(ln2((mid + mlp).to(dev, dt)).float().cpu(), post))
        else:
            errs.append(_rel(pre + attn + mlp, post))
        if l + 1 < tr.n_layers:
            errs.append(_rel(post, tr[("resid_pre", l + 1)]))
    return max(errs), {"layers": float(tr.n_layers)}


def _scores(lm: LoadedModel, text: str) -> tuple[float | None, str]:
    """Scores rebuilt from W_q, W_k at position 0, with the family's q/k norms and score soft-cap applied exactly;
    not measurable where the family breaks ``qk_bilinear`` in another way, or a position bias is added."""
    cfg = lm.model.config
    broken = lm.adapter.broken(cfg)
    why = broken.get("qk_rebuild") or broken.get("qk_bilinear")
    scheme = lm.adapter.position_scheme(cfg)
    layers = lm.adapter.layer_modules(lm.model)
    attns = {f"L{l}": get_module(m, lm.adapter.stack().attn) for l, m in enumerate(layers)}
    softcap = score_softcap(cfg)
    if why and ("qk_rebuild" in broken or not (softcap or qk_norms(attns["L0"])[0] is not None)):
        return None, f"the family breaks {'qk_rebuild' if 'qk_rebuild' in broken else 'qk_bilinear'}: {why}"
    if scheme in ("alibi", "t5_relative") or not lm.is_causal:
        return None, f"position scheme {scheme!r} adds a bias that W_q, W_k do not hold"
    probe = Probe(attns, 0.0)
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"].to(lm.device)
    try:
        probe.run(
            lm.model,
            input_ids=ids,
            position_ids=torch.zeros_like(ids),
            attention_mask=torch.ones_like(ids),
            use_cache=False,
        )
    except TypeError:
        return None, "the model takes no position ids"
    errs = []
    for l, name in enumerate(attns):
        if name in probe.extra and name in probe.ins:
            with lm.held(l):  # its q/k norms too (read from disk for a streamed model)
                hw = head_matrices(lm, l).weights
                X, A = probe.ins[name][0], probe.extra[name][0]
                errs.append(scores_error(hw, X, A, *qk_norms(attns[name]), softcap=softcap))
    if not errs:
        return None, "the attention modules return no probabilities"
    return max(errs), ""


def _decoding(lm: LoadedModel, text: str) -> tuple[float | None, str, dict[str, float]]:
    if not lm.is_causal:
        return None, "a decoding walk of a causal LM (this model is not one)", {}
    n = 4
    dw = decoding_walk(lm, text, max_new_tokens=n, stop_at_eos=False, progress=False)
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"].to(lm.device)
    pad = lm.tokenizer.pad_token_id
    with torch.no_grad():
        out = cast("GenerationMixin", lm.model).generate(  # a causal LM (checked above): it has generate()
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad if pad is not None else 0,
        )
    assert isinstance(out, torch.Tensor)  # the token ids (return_dict_in_generate is off)
    gen = out[0, ids.shape[1] :].cpu()
    m = min(len(gen), len(dw.token_ids))  # generate stops at an end-of-sequence token; the walk goes on
    same = int((gen[:m] == dw.token_ids[:m]).sum())
    with torch.no_grad():
        lens = lm.adapter.logits(lm.model, dw.d.to(lm.device, lm.dtype)).double().softmax(-1).cpu()
    p = lens[torch.arange(len(dw.token_ids)), dw.token_ids]
    err = float((p - dw.probs.double()).abs().max())
    if same != m:
        return float("inf"), f"{same} of {m} generated tokens agree with model.generate", {}
    return err, "", {"tokens": float(m)}


def _mlp_activation(lm: LoadedModel) -> tuple[float | None, str]:
    """The adapter's activation against the MLP's own (a module or a function held by the MLP, or by its first
    expert), on the same random inputs (both are elementwise)."""
    if lm.adapter.mlp_act_fn is None:
        return None, "the adapter registers no MLP activation"
    layer = lm.adapter.layer_modules(lm.model)[0]
    mlp = get_module(layer, next((n for n in MLP_NAMES if has_module(layer, n)), lm.adapter.stack().mlp_out))
    holders = [mlp] + [m for n, m in mlp.named_modules() if n.endswith("experts.0") or n == "experts"]
    own = next((getattr(h, a) for h in holders for a in ACT_NAMES if callable(getattr(h, a, None))), None)
    if own is None:
        return None, "the MLP holds no activation to compare with"
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)).mul(3).to(lm.device, lm.dtype)
    with torch.no_grad():
        return _rel(lm.adapter.mlp_activation(lm.model, 0)(x).float(), own(x).float()), ""


def verify(
    lm: LoadedModel,
    *,
    texts: tuple[str, ...] = TEXTS,
    quick: bool = False,
    progress: bool | Callable[[str], None] | None = None,
) -> ParityCard:
    """The parity card of ``lm`` in its own dtype (see the module docstring).  ``progress``: True draws a
    ``tqdm.auto`` bar over the texts; a callable is called with each text before it is checked."""
    from tqdm.auto import tqdm

    dt = lm.dtype
    found: dict[str, list[tuple[float | None, str, dict[str, float]]]] = {}
    for text in tqdm(
        texts, desc="parity card", unit="text", file=sys.stderr, leave=False, disable=progress is not True
    ):
        if callable(progress):
            progress(text)
        for name, err, note, detail in _text_checks(lm, text, quick):
            found.setdefault(name, []).append((err, note, detail))
    checks = [_parity_check(name, runs, dt) for name, runs in found.items()]
    return ParityCard(
        lm.name,
        lm.adapter.family,
        lm.adapter.family.startswith("derived:"),
        dtype_name(dt),
        tuple(texts),
        tuple(checks),
        lm.adapter.broken(lm.model.config),
    )


def _text_checks(lm: LoadedModel, text: str, quick: bool) -> list[tuple[str, float | None, str, dict[str, float]]]:
    """Every check of :func:`verify` on one text, in order: (name, error (None: not checked), note, detail)."""
    done: list[tuple[str, float | None, str, dict[str, float]]] = []

    def add(name: str, err: float | None, note: str = "", detail: dict[str, float] | None = None) -> None:
        done.append((name, err, note, detail or {}))

    tr = capture(lm, text, truncate=True)
    out = _reference(lm, tr) if lm.is_causal else None
    if out is not None:
        logits_err, logits_detail = _logits(lm, tr, out)
        add("logits", logits_err, "", logits_detail)
        if not quick:
            add("hidden_states", *_hidden(tr, out)[:1])
    else:
        add("logits", None, "checked for causal LMs (tests/test_capture.py covers the others)")
    add("residual", _residual(lm, tr)[0])
    ident = attention_identity(lm, text, truncate=True)
    add("attention_identity", ident.max_rel_error)
    add("attention_scores", *_scores(lm, text))
    if not quick:
        walk_err, note, det = _decoding(lm, text)
        add("decoding_walk", walk_err, note, det)
        add("mlp_activation", *_mlp_activation(lm))
    return done


def _parity_check(name: str, runs: list[tuple[float | None, str, dict[str, float]]], dt: torch.dtype) -> ParityCheck:
    """One line of the card: the largest error of check ``name`` over the texts against its tolerance in ``dt``,
    the first note, and the largest value of each detail."""
    errs = [e for e, _, _ in runs if e is not None]
    err = max(errs) if errs else None
    tol = tolerance(name, dt)
    detail: dict[str, float] = {}
    for _, _, d in runs:
        for k, v in d.items():
            detail[k] = max(detail.get(k, v), v)
    return ParityCheck(
        name,
        _WHAT[name],
        err,
        tol,
        None if err is None else err <= tol,
        next((n for _, n, _ in runs if n), ""),
        detail,
    )


_WHAT = {
    "logits": "logits from `final` through the head = the model's logits (max |Δ| / max |logit|)",
    "hidden_states": "captured layer inputs and `final` = output_hidden_states",
    "residual": "resid_pre + attn_out + mlp_out = resid_post; resid_post = next resid_pre",
    "attention_identity": "A.3: sum_h A_h X W_vo,h + b = the attention output (relative)",
    "attention_scores": "softmax(scale X W_qk X^T + mask) at position 0 = the model's attention",
    "decoding_walk": "greedy decoding walk = model.generate; P(token) from d_t through the head",
    "mlp_activation": "the adapter's MLP activation = the model's activation module",
}

__all__ = ["verify", "ParityCard", "ParityCheck", "TEXTS", "tolerance"]
