"""Steering a model toward a direction u of token space (seed 002, last sentence of the abstract: "the analogy
also suggests a method to steer the output of the transformer towards an arbitrary desired direction").

**Eigen-steering** (:func:`steer`, ``method="eigen"``): a rank-one edit of each chosen layer's W_O so that
F = W_V W_O becomes ``F' = F + alpha w u^T`` (row convention, seed 000 A.3), with u the unit target direction
and ``w = P u`` its orthogonal projection on the layer's value space col(A), A = [W_v,kv(0) | ... ] (see
:mod:`walklens.core.ov`).  Then ``u F' = u F + alpha |P u|^2 u``: for large alpha u becomes F's principal left
eigenvector, the direction the power step tilts tokens toward, and the layer writes ``alpha (x . w) u`` more
for a token x.  Why w and not u: only W_O is edited, so ``F' - F = A dB`` has its rows' read-side in col(A).
When u lies in col(A) (multi-head attention with an invertible W_V, e.g. GPT-2, BERT, ALBERT) w = u and the
edit is exactly ``F + alpha u u^T``; with grouped-query attention col(A) has dimension H_kv d < D and
``reach = |P u|`` says how much of u the layer can read.  ``dB = alpha A^+ w u^T`` (minimum norm), split
into the per-head blocks of W_O, which is right for grouped-query attention because A's block h is the
value matrix of h's key/value head.  The realised F' - F is recomputed from the edited weights and its
error reported.

**Activation addition** (``method="add"``, the default): forward hooks add ``alpha u`` to the residual stream at
the output of the same layers (the usual steering-vector method; the one the steering card's held-out verdict
favours on token and topic targets, docs/power.md).

**The sign.**  Eigen-steering is sign-blind: the edit writes ``alpha (x . w) u``, so whether a positive alpha
moves a text toward u depends on the sign of ``x . w``.  So that ``toward`` means toward, :func:`steer` and
:func:`steering_sweep` choose the sign of the edit on texts: the one of ``+alpha`` and ``-alpha`` under which
the target's mean log-probability (the next token after each prompt; every position of the neutral texts
:data:`NEUTRAL` when no prompts are given) is the larger, and report it (``sign``; ``sign=+1`` or ``-1`` applies
the seed's edit as given).

**Coherence** is measured as the steering card measures it: the KL(unsteered || steered) of the next-token
distribution on :data:`NEUTRAL` (mean over positions and texts), the share of repeated 3-grams of a continuation
and its distinct-2 (distinct bigrams over bigrams); the continuation's perplexity under the unsteered model is
kept beside them.

Both are interventions of :mod:`walklens.core.interventions` (:func:`~walklens.core.interventions.eigen_edit`,
:func:`~walklens.core.interventions.add_to_residual`): context managers that restore the model exactly on exit
(weights copied back bit for bit; hooks removed), even on error.  Ranks are 0-based (0 = the most probable
token), as everywhere in walklens.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..base.display import Shown
from ..base.errors import InputError, NonFiniteWarning, UnsupportedFamilyError, WalklensWarning, utf8_text
from ..base.frames import Columns, DataFrame, frame, pick, record_table
from ..base.hooks import Hooks, distinct, first_output
from ..core.capture import capture, tokenize
from ..core.interventions import SteerEdit, add_to_residual, eigen_edit, resolve_layers
from ..core.ov import ov_factors, value_projection

if TYPE_CHECKING:
    from ..core.loading import LoadedModel


@dataclass
class SteerResult(Shown, view="steering_edit"):
    """What a :func:`steer` context did: the unit direction ``u``, its label and target token id, and for
    eigen-steering one :class:`SteerEdit` per edited module.  ``sign``: the sign the seed's edit was applied
    with (its alpha is ``sign * alpha``; always 1 for activation addition); ``chosen_on``: where it was chosen
    (``"prompts"``, ``"neutral texts"``, or ``"given"``); ``gain``: the mean change of the target's log-probability
    (a vector target: of the last hidden state along u) on those texts at that sign (NaN when given)."""

    method: str
    alpha: float
    layers: list[int]
    u: torch.Tensor
    label: str
    target_id: int | None
    edits: list[SteerEdit] = field(default_factory=list)
    sign: int = 1
    chosen_on: str = "given"
    gain: float = math.nan


def direction(lm: LoadedModel, toward: str | torch.Tensor) -> tuple[torch.Tensor, int | None, str]:
    """Unit direction u [D] (float64) for a token (its row of V), a text (the mean of its tokens' rows of V,
    a concept vector) or a given vector; plus the target token id (the text's first token) and a label."""
    if isinstance(toward, torch.Tensor):
        u = toward.detach().double().flatten().cpu()
        if u.shape[0] != lm.d_model and u.shape[0] != _resid_dim(lm):
            raise InputError(f"the direction has {u.shape[0]} entries; the model's residual has {_resid_dim(lm)}")
        if not bool(torch.isfinite(u).all()):
            raise InputError("the direction holds NaN or infinite numbers")
        if not 0 < float(u.norm()) < math.inf:  # entries near 1e308 (or 1e-320): the norm overflows (underflows)
            u = u / u.abs().max() if bool(u.any()) else u
        if u.norm() == 0:
            raise InputError("the direction is the zero vector")
        return u / u.norm(), None, "vector"
    if not isinstance(toward, str) or not toward.strip():
        raise InputError("--toward needs a token or a text")
    utf8_text(toward, "the text to steer toward")
    ids = lm.tokenizer(toward, add_special_tokens=False)["input_ids"]
    if not ids:
        raise InputError(f"{toward!r} tokenises to nothing")
    V = lm.embedding_matrix().detach().double().cpu()
    if V.shape[1] != _resid_dim(lm):
        raise UnsupportedFamilyError(
            f"{lm.adapter.family}: token embeddings live in a {V.shape[1]}-dim space, the "
            f"residual in {_resid_dim(lm)}; pass a vector instead of a token"
        )
    u = V[ids].mean(0)
    return u / u.norm(), int(ids[0]), toward


def _resid_dim(lm: LoadedModel) -> int:
    hw = lm.adapter.head_weights(lm.model, 0)
    return hw.d_model


#: the steering card's neutral sentences (src/walklens/lab/data/steering/*.jsonl, type "neutral"; a test keeps
#: them equal): where the KL of the coherence check is read and, without prompts, eigen-steering's sign chosen
NEUTRAL = (
    "The committee will meet again on Thursday to review the budget.",
    "He put the keys on the table and went upstairs.",
    "Water boils at a lower temperature at high altitude.",
    "The library is open from nine in the morning until six.",
    "She wrote the numbers down in a small notebook.",
    "The train was a few minutes late because of the weather.",
    "Most of the shops in the town close early on Sunday.",
    "The report describes how the software was tested.",
)


@contextmanager
def steer(
    lm: LoadedModel,
    toward: str | torch.Tensor,
    layers: int | Sequence[int],
    alpha: float,
    method: str = "add",
    *,
    prompts: str | Sequence[str] | None = None,
    sign: int | None = None,
) -> Iterator[SteerResult]:
    """Steer ``lm`` toward ``toward`` (a token, a text or a [D] vector) at ``layers`` with strength ``alpha``
    inside a ``with`` block (seed 002).  ``method="add"`` (default): activation addition of alpha u at the
    layers' outputs; ``"eigen"``: the rank-one W_O edit F' = F + alpha w u^T (module docstring), its sign chosen
    so that the target's log-probability rises on ``prompts`` (default: the neutral texts :data:`NEUTRAL`), or
    ``sign=+1``/``-1`` as given.  Everything is restored exactly on exit, even on error.  On a shared-weight
    stack (ALBERT) one edit or hook acts at every depth."""
    if method not in ("eigen", "add"):
        raise InputError(f"unknown steering method {method!r}; choose add or eigen")
    if not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise InputError(f"alpha must be a finite number, got {alpha!r}")
    if sign not in (None, 1, -1):
        raise InputError(f"sign must be 1, -1 or None (chosen on the prompts), got {sign!r}")
    ls = resolve_layers(lm, layers)
    u, tid, label = direction(lm, toward)
    res = SteerResult(method=method, alpha=float(alpha), layers=ls, u=u.float(), label=label, target_id=tid)
    if method == "eigen":
        if sign is None and alpha != 0:
            texts = NEUTRAL if prompts is None else _prompt_list(prompts)
            res.sign, res.gain = choose_sign(lm, ls, u, tid, float(alpha), texts, last=prompts is not None)
            res.chosen_on = "neutral texts" if prompts is None else "prompts"
            if not res.gain > 0:
                warnings.warn(
                    f"eigen-steering at layers {ls} with alpha {alpha:g} lowers {label!r} on the {res.chosen_on} "
                    f"whichever its sign (the better sign changes its mean log-probability by {res.gain:+.3g}); "
                    "try another layer or strength, or method='add'",
                    WalklensWarning,
                    stacklevel=3,
                )
        elif sign is not None:
            res.sign = sign
        with eigen_edit(lm, ls, u, res.sign * float(alpha)) as edits:
            res.edits = edits
            yield res
    else:
        with add_to_residual(lm, ls, u, float(alpha)):
            yield res


@torch.no_grad()
def target_score(lm: LoadedModel, texts: Sequence[str], u: torch.Tensor, tid: int | None, last: bool) -> float:
    """The mean log-probability of token ``tid`` as the next token (a vector target, ``tid`` None: the mean
    projection of the last hidden state on ``u``) over ``texts``: at each text's last position (``last``) or at
    every position; NaN when a pass is not finite."""
    vals = []
    for t in texts:
        out = lm.model(input_ids=tokenize(lm, t).to(lm.device), use_cache=False, output_hidden_states=tid is None)
        if tid is None:
            x = out.hidden_states[-1][0].double().cpu() @ u
        else:
            x = torch.log_softmax(out.logits[0].double().cpu(), -1)[:, tid]
        vals.append(x[-1:] if last else x)
    v = torch.cat(vals)
    return float(v.mean()) if bool(torch.isfinite(v).all()) else math.nan


def choose_sign(
    lm: LoadedModel,
    layers: list[int],
    u: torch.Tensor,
    tid: int | None,
    alpha: float,
    texts: Sequence[str],
    last: bool,
    base: float | None = None,
) -> tuple[int, float]:
    """Eigen-steering's sign (module docstring, "The sign"): +1 or -1, whichever edit ``sign * alpha`` gives the
    larger :func:`target_score` on ``texts`` (+1 on a tie or where neither is finite), and the gain it gives
    over the unsteered score (``base``: that score, when the caller has it)."""
    if not lm.is_causal:
        raise UnsupportedFamilyError("eigen-steering's sign is chosen on a causal LM's next token; pass sign=1 or -1")
    base = target_score(lm, texts, u, tid, last) if base is None else base
    scores = {}
    for sg in (1, -1):
        with eigen_edit(lm, layers, u, sg * alpha):
            scores[sg] = target_score(lm, texts, u, tid, last)
    best = -1 if math.isfinite(scores[-1]) and not scores[1] >= scores[-1] else 1
    return best, scores[best] - base


def activation_addition(
    lm: LoadedModel, toward: str | torch.Tensor, layers: int | Sequence[int], alpha: float
) -> contextlib.AbstractContextManager[SteerResult]:
    """:func:`steer` with ``method="add"`` (alpha u added to the residual at the layers' outputs)."""
    return steer(lm, toward, layers, alpha, method="add")


# ---- sweeps ----------------------------------------------------------------------------------------------------


@dataclass
class SteerRow:
    """One (method, layers, alpha, prompt) run.  Target numbers are for the next token after the prompt
    (steered model); ``target_rank``: 0-based (0 = the target is the most probable token); ``text``: greedy
    continuation; ``perplexity``: of that continuation under the unsteered
    model; ``push``: (steered - unsteered) state at the first steered layer's output, last position, projected
    on u (signed; activation addition gives exactly alpha), ``injection``: its norm.  ``sign``: eigen-steering's
    edit ran with ``sign * alpha``, the sign chosen on the sweep's prompts so that a positive alpha raises the
    target (1 for activation addition); coherence as the steering card measures it: ``kl``, KL(unsteered ||
    steered) of the next-token distribution on :data:`NEUTRAL` (mean over positions and texts; the same for every
    prompt of a method, layers and alpha), ``repetition`` the share of the continuation's repeated 3-grams and
    ``distinct`` its distinct-2 (NaN where it has none)."""

    method: str
    layers: list[int]
    alpha: float
    prompt: str
    target_logit: float
    target_prob: float
    target_rank: int | None  # None when the logits are not finite (target_prob is then NaN)
    top_token: str
    text: str
    perplexity: float
    push: float
    injection: float
    sign: int = 1
    kl: float = math.nan
    repetition: float = math.nan
    distinct: float = math.nan


@dataclass
class SteeringSweep(Shown, view="steering_sweep"):
    """Eigen-steering and activation addition across alphas, layer sets and prompts."""

    model_name: str
    toward: str
    target_token: str
    reach: dict[int, float]
    prompts: list[str]
    alphas: list[float]
    add_alphas: list[float]
    layer_sets: list[list[int]]
    methods: list[str]
    rows: list[SteerRow]

    def curve(
        self, method: str, layers: Sequence[int], metric: str = "target_prob", stat: str = "mean"
    ) -> tuple[list[float], list[float]]:
        """(alphas, mean or median over prompts of ``metric``) for one method and layer set."""
        sel = [r for r in self.rows if r.method == method and list(r.layers) == list(layers)]
        al = sorted({r.alpha for r in sel})
        ys = []
        for a in al:
            v = torch.tensor([_value(getattr(r, metric)) for r in sel if r.alpha == a], dtype=torch.float64)
            ys.append(float(v.mean() if stat == "mean" else v.median()))
        return al, ys

    def _columns(self, table: str = "rows") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        names = (
            "method",
            "layers",
            "alpha",
            "prompt",
            "target_logit",
            "target_prob",
            "target_rank",
            "top_token",
            "text",
            "perplexity",
            "push",
            "injection",
            "sign",
            "kl",
            "repetition",
            "distinct",
        )

        def row(r: SteerRow) -> dict[str, Any]:
            d = {k: getattr(r, k) for k in names}
            d["layers"] = ",".join(str(int(layer)) for layer in r.layers)
            return d

        return pick(
            table,
            {
                "rows": lambda: record_table([row(r) for r in self.rows], names),
                "reach": lambda: record_table(
                    [{"layer": int(k), "reach": v} for k, v in self.reach.items()], ["layer", "reach"]
                ),
            },
            "a SteeringSweep",
        )

    def to_pandas(self, table: str = "rows") -> DataFrame:
        """The sweep as tables (pandas; docs/notebooks.md, "Tables"): ``rows`` one row per (method, layers,
        alpha, prompt) run (``layers`` as text, ``"10,11"``; ``target_rank`` 0-based, missing where the logits
        were not finite); ``reach`` one row per layer."""
        return frame(
            self._columns(table), {"model": self.model_name, "toward": self.toward, "target_token": self.target_token}
        )


def _value(v: float | int | None) -> float:
    """A row's number as a float: None (a rank that overflowed) is NaN."""
    return math.nan if v is None else float(v)


#: a residual state beyond this overflows the norm that reads it: norms square the state in float32 (at least),
#: and sqrt(float32's max) squared is inf
OVERFLOW = math.sqrt(torch.finfo(torch.float32).max)


@torch.no_grad()
def _greedy(lm: LoadedModel, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Greedy continuation (no cache, so steering hooks see every position); returns (new ids, first logits,
    whether the first forward pass stayed finite).  A pass whose hidden states or logits hold NaN or inf (an
    overflowing dose) ends the continuation: it has no next token."""
    x = ids.to(lm.device)
    first, finite = None, True
    for step in range(max(n, 1)):
        logits, ok = _next_logits(lm, x)
        if first is None:
            first, finite = logits, ok
        if not ok or step >= n:
            break
        nxt = int(logits.argmax())
        x = torch.cat([x, torch.tensor([[nxt]], device=x.device)], dim=1)
        if lm.tokenizer.eos_token_id is not None and nxt == lm.tokenizer.eos_token_id:
            break
    assert first is not None
    return x[0, ids.shape[1] :].cpu(), first, finite


def _next_logits(lm: LoadedModel, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The last position's next-token logits and whether the pass stayed finite: every layer's output (watched
    by hooks registered after the steering ones, so they see the steered states) below :data:`OVERFLOW`, and
    finite logits.  A final norm turns an overflowing state into finite zeros (its mean square is inf), so the
    logits alone do not tell."""
    seen = {"finite": True}

    def watch(_m: Any, _inp: Any, output: Any) -> None:
        if seen["finite"] and not bool((first_output(output).abs() <= OVERFLOW).all()):  # NaN fails too
            seen["finite"] = False

    with Hooks() as hooks:
        for m in distinct(lm.adapter.layer_modules(lm.model)):
            hooks.post(m, watch)
        logits = lm.model(input_ids=x, use_cache=False).logits[0, -1].float().cpu()
    return logits, seen["finite"] and bool(torch.isfinite(logits).all())


@torch.no_grad()
def _perplexity(lm: LoadedModel, ids: torch.Tensor, new: torch.Tensor) -> float:
    if len(new) == 0:
        return float("nan")
    full = torch.cat([ids[0].cpu(), new]).unsqueeze(0).to(lm.device)
    logp = torch.log_softmax(lm.model(input_ids=full, use_cache=False).logits[0].float().cpu(), -1)
    P = ids.shape[1]
    nll = -logp[P - 1 : -1].gather(1, new.view(-1, 1)).mean()
    return float(nll.exp())


def readout(logits: torch.Tensor, tid: int) -> tuple[float, float, int | None, int | None]:
    """The target's logit, probability and 0-based rank (tokens scoring strictly higher) and the top token of
    next-token ``logits``; when any logit is NaN or inf the numbers are NaN and the rank and top token None:
    a computation that overflowed is reported, never ranked."""
    if not bool(torch.isfinite(logits).all()):
        return math.nan, math.nan, None, None
    probs = torch.softmax(logits.double(), -1)
    return float(logits[tid]), float(probs[tid]), int((logits > logits[tid]).sum()), int(logits.argmax())


@torch.no_grad()
def _layer_sets(lm: LoadedModel, layer_sets: Sequence[Sequence[int]] | Sequence[int]) -> list[list[int]]:
    """The layer sets of a sweep as lists of resolved layers (a single layer is a set of one)."""
    sets = (
        [[int(layer_sets)]]
        if isinstance(layer_sets, int)
        else [[int(s)] if isinstance(s, int) else [int(v) for v in s] for s in layer_sets]
    )
    return [resolve_layers(lm, s) for s in sets]


def _reach(lm: LoadedModel, sets: list[list[int]], u: torch.Tensor) -> dict[int, float]:
    """Per steered layer, the norm of the direction's value projection (how far the layer's OV can carry it)."""
    reach = {}
    for s in sets:
        for l in s:
            A, _ = ov_factors(lm, l, grouped=True)
            reach[l] = float(value_projection(A, u)[1].norm())
    return reach


def _prompt_list(prompts: str | Sequence[str]) -> list[str]:
    """The sweep's prompts as a list; refuses none or an empty one."""
    out = [prompts] if isinstance(prompts, str) else list(prompts)
    if not out or not all(isinstance(p, str) and p.strip() for p in out):
        raise InputError("give at least one non-empty prompt")
    return out


def steering_sweep(
    lm: LoadedModel,
    prompts: str | Sequence[str],
    toward: str | torch.Tensor,
    layer_sets: Sequence[Sequence[int]] | Sequence[int],
    alphas: Sequence[float],
    *,
    add_alphas: Sequence[float] | None = None,
    methods: Sequence[str] = ("eigen", "add"),
    max_new_tokens: int = 12,
    progress: bool = False,
) -> SteeringSweep:
    """Eigen-steering next to activation addition (seed 002's steering method vs the usual steering vector):
    for each method, layer set, alpha and prompt the target's next-token probability and rank, a greedy
    continuation, its coherence (KL on :data:`NEUTRAL`, repetition, distinct-2) and its perplexity under the
    unsteered model.  ``add_alphas`` (default ``alphas``) is the grid for activation addition, whose alpha is in
    residual-stream units.  Eigen-steering's sign is chosen per layer set and |alpha| on the prompts (a positive
    alpha raises the target's mean log-probability, a negative one is the other sign; ``SteerRow.sign``)."""
    from tqdm.auto import tqdm

    if not lm.is_causal:
        raise UnsupportedFamilyError("steering sweeps generate text and need a causal LM")
    prompts = _prompt_list(prompts)
    sets = _layer_sets(lm, layer_sets)
    add_alphas = list(alphas if add_alphas is None else add_alphas)
    alphas = list(alphas)
    u, tid, label = direction(lm, toward)
    if tid is None:
        raise InputError("a sweep needs a token or text target (its first token is scored)")
    reach = _reach(lm, sets, u)
    rows: list[SteerRow] = []
    jobs = [
        (m, s, a, p) for m in methods for s in sets for a in (alphas if m == "eigen" else add_alphas) for p in prompts
    ]
    cache: dict[Any, Any] = {"prompts": prompts, "neutral": neutral_logprobs(lm)}
    for job in tqdm(jobs, desc="steering", disable=not progress, leave=False):
        rows.append(_sweep_row(lm, job, u, tid, max_new_tokens, cache))
    return SteeringSweep(
        model_name=lm.name,
        toward=label,
        target_token=lm.token_strings([tid])[0],
        reach=reach,
        prompts=prompts,
        alphas=alphas,
        add_alphas=add_alphas,
        layer_sets=sets,
        methods=list(methods),
        rows=rows,
    )


def _sweep_row(
    lm: LoadedModel,
    job: tuple[str, list[int], float, str],
    u: torch.Tensor,
    tid: int,
    max_new_tokens: int,
    cache: dict[Any, Any],
) -> SteerRow:
    """One row of :func:`steering_sweep`: ``job`` (method, layer set, alpha, prompt) steered along ``u``; the
    target ``tid``'s next-token logit, probability and rank, a greedy continuation, its coherence and its
    perplexity under the unsteered model, and the push along u and the injection at the set's first layer,
    against the unsteered state there.  ``cache`` holds the sweep's prompts, the unsteered neutral passes and,
    as they come, each prompt's unsteered state, each eigen sign and each KL."""
    m, s, a, p = job
    ids = tokenize(lm, p)
    pt = f"L{s[0]}.resid_post"
    if ("state", p, s[0]) not in cache:
        cache[("state", p, s[0])] = capture(lm, p, points=[pt])[pt][-1].double()
    sg = 1
    if m == "eigen" and a != 0:
        if ("sign", tuple(s), abs(a)) not in cache:
            if "base_score" not in cache:  # the unsteered score, once for the sweep
                cache["base_score"] = target_score(lm, cache["prompts"], u, tid, True)
            cache[("sign", tuple(s), abs(a))] = choose_sign(
                lm, s, u, tid, abs(a), cache["prompts"], last=True, base=cache["base_score"]
            )[0]
        sg = cache[("sign", tuple(s), abs(a))]
    with steer(lm, u, s, a, method=m, sign=sg):
        new, logits, finite = _greedy(lm, ids, max_new_tokens)
        st = capture(lm, p, points=[pt])[pt][-1].double()
        if (m, tuple(s), a) not in cache:
            cache[(m, tuple(s), a)] = neutral_kl(lm, cache["neutral"])
    d = st - cache[("state", p, s[0])]
    logit, prob, rank, top = readout(logits if finite else logits.fill_(math.nan), tid)
    if rank is None:
        warnings.warn(
            f"{m} steering at layers {s} with alpha {a:g}: the logits are not finite (NaN or inf: "
            f"the dose overflows the model's dtype); p(target) and its rank are reported as NaN",
            NonFiniteWarning,
            stacklevel=3,  # the caller of steering_sweep
        )
    return SteerRow(
        method=m,
        layers=s,
        alpha=float(a),
        prompt=p,
        target_logit=logit,
        target_prob=prob,
        target_rank=rank,
        top_token="" if top is None else lm.token_strings([top])[0],
        text=lm.tokenizer.decode(new.tolist()),
        perplexity=_perplexity(lm, ids, new),
        push=float(d @ u),
        injection=float(d.norm()),
        sign=sg,
        kl=cache[(m, tuple(s), a)],
        repetition=repetition(new.tolist()),
        distinct=distinct_n(new.tolist()),
    )


@torch.no_grad()
def neutral_logprobs(lm: LoadedModel, texts: Sequence[str] = NEUTRAL) -> list[torch.Tensor]:
    """Per text, the next-token log-probs [T, V] (float64) of the model as it is now (steered inside a
    steering block)."""
    out = []
    for t in texts:
        logits = lm.model(input_ids=tokenize(lm, t).to(lm.device), use_cache=False).logits[0]
        out.append(torch.log_softmax(logits.double().cpu(), -1))
    return out


def neutral_kl(lm: LoadedModel, base: list[torch.Tensor], texts: Sequence[str] = NEUTRAL) -> float:
    """KL(unsteered || steered) of the next-token distribution, mean over the positions of each text, then over
    the texts (the steering card's measure); ``base`` the unsteered :func:`neutral_logprobs`.  A rounding below
    0 reads 0; NaN where the steered pass is not finite."""
    kls = []
    for lb, ls in zip(base, neutral_logprobs(lm, texts)):
        kls.append(max(float((lb.exp() * (lb - ls)).sum(-1).mean()), 0.0))
    return sum(kls) / len(kls)


def repetition(ids: Sequence[int], n: int = 3) -> float:
    """The share of a continuation's ``n``-grams that repeat an earlier one (0: none; NaN when it has none):
    1 - :func:`distinct_n`."""
    return 1 - distinct_n(ids, n)


def distinct_n(ids: Sequence[int], n: int = 2) -> float:
    """Distinct-``n``: the distinct ``n``-grams of a continuation over its ``n``-grams (1: no repeat; NaN when it
    has none)."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return math.nan if not grams else len(set(grams)) / len(grams)


__all__ = [
    "NEUTRAL",
    "steer",
    "activation_addition",
    "steering_sweep",
    "direction",
    "choose_sign",
    "target_score",
    "neutral_kl",
    "repetition",
    "distinct_n",
    "SteerResult",
    "SteerRow",
    "SteeringSweep",
]
