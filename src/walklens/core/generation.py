"""Batched generation with the model's own key/value cache, one result per sequence as if it had been generated alone.

- The model's own ``generate`` runs once per batch (its key/value cache, its position ids from the attention mask,
  its cache layout), the prompts **left-padded** with their attention mask.  A ``LogitsProcessor`` makes each
  row's choice from that row's raw logits (read by a hook on the model's output, before any processor of the
  model's generation config) and leaves ``generate`` scores in which only that token is finite.
- **Greedy**: the row's argmax.  **Sampled**: a draw from the row's P_t (``temperature``/``top_k``/``top_p``,
  transformers' own warpers) with the sequence's own ``torch.Generator``, seeded once from its own seed and drawn
  once per step of that sequence: the sequences that share its batch never change its draws.
- A sequence ends at an end-of-sequence id (``eos``) or after ``max_new_tokens``; a row whose logits hold NaN or
  +inf (an overflowing intervention) ends there, unranked (``finite`` False).  An ended row is fed the pad id
  until its batch ends, masked: it changes no other row.
- ``walk=k``: per step of each sequence the decoding walk's record (seed 000, eqs. 10-12): d_t (the final normed
  output at the new position, read by a hook on the final norm), the emitted token's 0-based rank and probability
  in P_t, and the k nearest tokens.
- ``points=``: capture during generation.  Capture's recorder (:mod:`walklens.core.capture`) runs on the model's
  own forward with its cache, one record per call: the prompt's positions, then one position per generated token,
  so no position of the prefix is computed again.  One more call feeds each sequence's last token; each sequence's
  positions, joined, are a :class:`~walklens.core.trace.Trace` of its finished text.
- ``within=``: a context manager per batch, given the batch's rows (indices into ``prompts``), e.g. an intervention
  with per-sequence doses (:func:`~walklens.core.interventions.add_to_residual` with one alpha per row).

**Equal to one at a time** (tests/test_generation.py, every tiny family; tests/test_generation_real.py): left
padding and the attention mask leave each row's numbers as they are up to the kernels, which depend on the batch's
shape.  In float32 on CPU the logits differ by about 1e-6 and every token is the same.  In bfloat16 most tiny
families' logits are the same bits (Phi, GPT-J, CodeGen, BLOOM, Gemma 2 and Qwen3-MoE: up to one bfloat16 step);
on SmolLM2 and Gemma 3 a few steps (3.3e-2 and 1.8e-2 of the largest logit), so a near-tie may pick another token
(one greedy sequence of four on each): the tests then compare the logits within bfloat16's tolerance.  A family
whose rotary scaling depends on the length of the padded batch (LongRoPE, dynamic NTK: Phi-3's long-context
variants) is batched by prompt length, each batch without padding.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..base.errors import ContextTooLongError, EmptyTextError, InputError, UnsupportedFamilyError
from ..base.hooks import Hooks, first_output
from ..base.numbers import POSITIVE_INT, SEED
from ..base.precision import dtype_name
from ..models.base import get_module
from .capture import Recorder, check_written, context_limit, point_names, record_dtype, select_points, tokenize
from .sampling import StepRecord, check_sampling, eos_ids, read_step, sampler
from .trace import Trace

if TYPE_CHECKING:
    from .loading import LoadedModel

#: rotary scalings that read the length of the whole (padded) sequence: such a model is batched by prompt length
LENGTH_DEPENDENT_ROPE = ("longrope", "dynamic")


# ---- results ---------------------------------------------------------------------------------------------------


@dataclass
class Generation:
    """One generated sequence: its prompt's ids, the new ``token_ids`` (the end-of-sequence id included when it
    ended there: ``stopped_at_eos``), ``finite`` False when it ended at non-finite logits, ``seed`` its own
    sampling seed.  ``logits``: the raw logits [V] (float32, on the model's device) of its first steps (``logits=n``);
    ``steps``: the decoding walk's record per new token (``walk=k``) and ``prompt_prev`` the prompt's
    second-to-last d (None for a one-token prompt); ``trace``: every captured point of the finished text
    (``points=``)."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    stopped_at_eos: bool = False
    finite: bool = True
    seed: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    prompt_prev: torch.Tensor | None = None
    trace: Trace | None = None

    @property
    def ids(self) -> list[int]:
        """The finished text's ids: the prompt's, then the new tokens."""
        return self.prompt_ids + self.token_ids


@dataclass(frozen=True)
class _Plan:
    """What every batch of one call does: ``n`` new tokens at most, the sampling rule (None: greedy), the ids that
    end a sequence, the walk's k (None: no walk), the captured points (None: none) and their record dtype, the
    number of first steps whose logits are kept, and the pad id."""

    n: int
    sampling: tuple[float, int | None, float | None] | None
    eos: frozenset[int]
    walk: int | None
    points: list[str] | None
    dtype: torch.dtype
    logits: int
    pad: int


# ---- one batch -------------------------------------------------------------------------------------------------


class _Batch:
    """The state of one batch while ``generate`` runs: each row's choices, what the hooks read at the last call of
    the model (its raw logits and d at the new positions), and each call's captured points."""

    def __init__(self, plan: _Plan, gens: list[Generation]) -> None:
        self.plan, self.gens = plan, gens
        self.done = [False] * len(gens)
        self.fed = [False] * len(gens)
        s = plan.sampling
        self.picks = [None if s is None else sampler(s[0], s[1], s[2], g.seed) for g in gens]
        self.logits: torch.Tensor | None = None
        self.d: torch.Tensor | None = None
        self.calls: list[torch.Tensor] = []
        self.bar: Any = None

    def choose(self, scores: torch.Tensor) -> torch.Tensor:
        """The processor: each live row's token from its own raw logits; an ended row gets the pad id."""
        logits = self.logits
        assert logits is not None  # the model's output hook ran for this call
        bad = (torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1)).tolist()
        greedy = logits.argmax(-1).tolist()  # each row's argmax (the same as the row's own)
        forced = torch.full_like(scores, float("-inf"))
        live = 0
        for b, g in enumerate(self.gens):
            if self.done[b]:
                self.fed[b] = True  # this call consumed the row's last token
                forced[b, self.plan.pad] = 0.0
                continue
            if len(g.token_ids) < self.plan.logits:
                g.logits.append(logits[b].clone())
            forced[b, self._step(b, g, None if bad[b] else int(greedy[b]))] = 0.0
            live += 1
        if self.bar is not None:
            self.bar.update(live)
        return forced

    def _step(self, b: int, g: Generation, greedy: int | None) -> int:
        """Row ``b``'s token at this step, recorded (``greedy``: its argmax; None when its logits are not finite: the
        row ends there, with the pad id); marks the row ended at an end-of-sequence id or at ``n`` tokens."""
        if greedy is None:
            g.finite, self.done[b] = False, True
            return self.plan.pad
        assert self.logits is not None
        pick = self.picks[b]
        choice = greedy if pick is None else pick(self.logits[b].cpu())
        if self.plan.walk is not None:
            assert self.d is not None
            g.steps.append(read_step(self.logits[b].cpu(), choice, self.d[b].cpu(), self.plan.walk))
        g.token_ids.append(choice)
        if choice in self.plan.eos:
            g.stopped_at_eos = True
        self.done[b] = g.stopped_at_eos or len(g.token_ids) >= self.plan.n
        return choice

    def stopped(self) -> torch.Tensor:
        """The stopping criterion: a row stops when it has ended and, when capturing, its last token was fed."""
        capturing = self.plan.points is not None
        return torch.tensor([d and (f or not capturing) for d, f in zip(self.done, self.fed)])


def _hf_parts(batch: _Batch) -> tuple[Any, Any]:
    """The batch's choice as transformers' LogitsProcessorList and its end as a StoppingCriteriaList."""
    from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    class Chooser(LogitsProcessor):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            return batch.choose(scores)  # type: ignore[return-value]  # full_like of a FloatTensor is one

    class Ended(StoppingCriteria):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
            return batch.stopped().to(input_ids.device)  # type: ignore[return-value]  # a bool tensor

    return LogitsProcessorList([Chooser()]), StoppingCriteriaList([Ended()])


def _d_module(lm: LoadedModel) -> nn.Module:
    """The module whose output is d (the final normed output): the last stack's final norm, or its last layer
    for a model with none (post-norm OPT), as capture's ``final`` point."""
    spec = lm.adapter.stack()
    if spec.final_norm:
        return get_module(lm.model, spec.final_norm)
    return lm.adapter.layer_modules(lm.model, spec.name)[-1]


def _watch(hooks: Hooks, lm: LoadedModel, batch: _Batch) -> None:
    """Hooks that hand the batch each call's raw logits at the last position and d at the new positions (and at the
    prompt's second-to-last, on the first call)."""

    def final(_m: nn.Module, _i: Any, out: Any) -> None:
        h = first_output(out).detach()
        if batch.d is None and h.shape[1] >= 2:
            for b, g in enumerate(batch.gens):
                if len(g.prompt_ids) >= 2:
                    g.prompt_prev = h[b, -2].float().cpu()
        batch.d = h[:, -1].float()

    def logits(_m: nn.Module, _i: Any, out: Any) -> None:
        batch.logits = out.logits[:, -1].detach().float()

    if batch.plan.walk is not None:
        hooks.post(_d_module(lm), final)
    hooks.post(lm.model, logits)


class _CallRecorder(Recorder):
    """Capture's recorder, reading a module output flattened to [B*T, D] (OPT's feed-forward) as [B, T, D]."""

    def put(self, stack: str, name: str, x: torch.Tensor) -> None:
        buf = self.hidden.get(stack)
        if buf is not None and x.dim() == 2 and buf.dim() == 4:
            x = x.reshape(buf.shape[1:])
        super().put(stack, name, x)


class _Calls:
    """Capture's recorder on the decoder stack, emptied before each call of the model and read after it: one record
    [points, B, new positions, D] per call."""

    def __init__(self, lm: LoadedModel, names: list[str], dtype: torch.dtype, batch: _Batch) -> None:
        self.lm, self.names, self.batch = lm, names, batch
        self.spec = lm.adapter.stack()
        self.rec = _CallRecorder(dtype, lm.adapter.residual_kind(lm.config))
        self.rec.add_stack(self.spec.name, names)

    def register(self, hooks: Hooks) -> None:
        lm, s = self.lm, self.spec.name
        hooks.pre(lm.model, lambda *_: self._begin())
        self.rec.register(hooks, lm.model, lm.adapter, self.spec, False, lm.n_layers)
        embed = get_module(lm.model, self.spec.embed_point or lm.adapter.embed)
        hooks.post(embed, lambda _m, _i, out: self.rec.put(s, "embed", first_output(out)))
        hooks.post(lm.model, lambda *_: self._end())

    def _begin(self) -> None:
        s, rec = self.spec.name, self.rec
        rec.layer[s] = -1
        rec.hidden.clear()
        rec.live.clear()
        rec.missing = {(s, n) for n in self.names}

    def _end(self) -> None:
        check_written(self.rec)
        self.batch.calls.append(self.rec.hidden[self.spec.name].cpu())


def _left_padded(seqs: Sequence[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Id lists as one left-padded batch and its attention mask (1 = real token)."""
    P = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), P), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), P), dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, P - len(q) :] = torch.tensor(q, dtype=torch.long)
        mask[i, P - len(q) :] = 1
    return ids.to(device), mask.to(device)


def _generation_config(lm: LoadedModel, plan: _Plan) -> Any:
    """``generate``'s settings: greedy over the scores the processor leaves (it has chosen already), the cache, no
    end-of-sequence of its own (the batch ends rows itself), one more step when capturing (to feed the last token)."""
    from transformers import GenerationConfig

    cfg: dict[str, Any] = dict(
        max_new_tokens=plan.n + (1 if plan.points is not None else 0),
        do_sample=False,
        num_beams=1,
        use_cache=True,
        eos_token_id=[],
        pad_token_id=plan.pad,
    )
    if lm.is_encoder_decoder:
        start = lm.config.decoder_start_token_id
        cfg["decoder_start_token_id"] = start if start is not None else (lm.config.pad_token_id or 0)
    return GenerationConfig(**cfg)


def _run(lm: LoadedModel, plan: _Plan, gens: list[Generation], bar: Any) -> None:
    """One batch through the model's own ``generate``; fills ``gens``."""
    batch = _Batch(plan, gens)
    batch.bar = bar
    processors, criteria = _hf_parts(batch)
    ids, mask = _left_padded([g.prompt_ids for g in gens], plan.pad, lm.device)
    with Hooks() as hooks:
        if plan.points is not None:
            _Calls(lm, plan.points, plan.dtype, batch).register(hooks)
        _watch(hooks, lm, batch)
        lm.hf.generate(  # type: ignore[operator]  # GenerationMixin, not in PreTrainedModel's type
            input_ids=ids,
            attention_mask=mask,
            generation_config=_generation_config(lm, plan),
            logits_processor=processors,
            stopping_criteria=criteria,
        )
    if plan.points is not None:
        for b, g in enumerate(gens):
            g.trace = _trace(lm, plan.points, batch.calls, b, g)


def _trace(lm: LoadedModel, points: list[str], calls: list[torch.Tensor], b: int, g: Generation) -> Trace:
    """Row ``b``'s positions, each from the last call that computed it, joined: the trace of its finished text.  A
    call computes the last positions of the (padded) sequence so far: the prompt's, then one new position per call
    (Phi-3's LongRoPE computes the whole sequence again once, where it switches to its long factors)."""
    L, m = len(g.prompt_ids), len(g.token_ids)
    P = calls[0].shape[2]
    hidden = torch.empty(calls[0].shape[0], P + m, calls[0].shape[-1], dtype=calls[0].dtype)
    for c, rec in enumerate(calls[: m + 1]):
        hidden[:, P + c - rec.shape[2] : P + c] = rec[:, b]
    return Trace(
        tokens=lm.token_strings(g.ids),
        token_ids=torch.tensor(g.ids, dtype=torch.long),
        points=points,
        hidden=hidden[:, P - L :],
        model_name=lm.name,
        family=lm.adapter.family,
        stack=lm.adapter.stack().name,
        n_layers=lm.n_layers,
        lm=lm,
        model_dtype=dtype_name(lm.dtype),
    )


# ---- the batches -----------------------------------------------------------------------------------------------


def _prompt_ids(lm: LoadedModel, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Each prompt's ids: a text tokenised as capture does (empty or over-long text: one line), or ids checked."""
    if isinstance(prompts, str) or not len(prompts):
        raise InputError("give a list of at least one prompt")
    vocab = int(lm.embedding_matrix().shape[0])
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            try:
                out.append([int(t) for t in tokenize(lm, p)[0].tolist()])
            except InputError as e:
                raise type(e)(f"prompt {i}: {e}") from None
            continue
        ids = [int(t) for t in p]
        if not ids:
            raise EmptyTextError(f"prompt {i} has no tokens")
        if any(not 0 <= t < vocab for t in ids):
            raise InputError(f"prompt {i}: a token id outside the vocabulary of {vocab}")
        out.append(ids)
    return out


def _check_length(lm: LoadedModel, seqs: list[list[int]], n: int) -> None:
    """Refuse ``n`` new tokens after the longest prompt beyond a decoder's context (one line, before any work)."""
    limit = context_limit(lm)
    longest = max(len(q) for q in seqs)
    if limit is not None and not lm.is_encoder_decoder and longest + n > limit:
        raise ContextTooLongError(
            f"a prompt of {longest} tokens + {n} new tokens exceed the model's context of {limit} "
            f"(at most {max(limit - longest, 0)} new tokens fit)"
        )


def length_dependent(lm: LoadedModel) -> bool:
    """Whether the model's rotary scaling reads the padded sequence's length (:data:`LENGTH_DEPENDENT_ROPE`)."""
    cfg = lm.config
    for name in ("rope_parameters", "rope_scaling"):
        rp = getattr(cfg, name, None)
        if isinstance(rp, dict) and rp.get("rope_type", rp.get("type")) in LENGTH_DEPENDENT_ROPE:
            return True
    return False


def batches(lm: LoadedModel, seqs: Sequence[list[int]], size: int | None) -> list[list[int]]:
    """The rows of each batch: at most ``size`` prompts (None: all), prompts of like length together (less padding);
    a model whose rotary scaling reads the padded length (:func:`length_dependent`) batches each prompt length apart."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    groups: list[list[int]] = []
    if length_dependent(lm):
        for n in sorted({len(q) for q in seqs}):
            groups.append([i for i in order if len(seqs[i]) == n])
    else:
        groups.append(order)
    step = size or len(seqs)
    return [g[j : j + step] for g in groups for j in range(0, len(g), step)]


def _seeds(seeds: int | Sequence[int], n: int) -> list[int]:
    """One seed per prompt: ``seeds`` for every one, or one each."""
    given = [seeds] * n if isinstance(seeds, int) else list(seeds)
    if len(given) != n:
        raise InputError(f"{len(given)} seeds for {n} prompts: give one seed, or one per prompt")
    return [int(SEED.check(s, "a seed")) for s in given]


@torch.no_grad()
def generate_batch(
    lm: LoadedModel,
    prompts: Sequence[str | Sequence[int]],
    *,
    max_new_tokens: int = 20,
    sample: bool = False,
    seeds: int | Sequence[int] = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos: Collection[int] | None = None,
    walk: int | None = None,
    points: Sequence[str] | None = None,
    dtype: torch.dtype | None = torch.float32,
    logits: int = 0,
    batch_size: int | None = None,
    within: Callable[[list[int]], AbstractContextManager[Any]] | None = None,
    progress: bool = False,
) -> list[Generation]:
    """Generate from every prompt (texts, or token-id lists) in left-padded batches with the model's own ``generate``
    and key/value cache; one :class:`Generation` per prompt, in order, each as if generated alone (module docstring).

    Greedy by default; ``sample=True`` draws with ``temperature``/``top_k``/``top_p`` from each sequence's own
    generator (``seeds``: one for all, or one per prompt).  ``eos``: the ids that end a sequence (None: the model's;
    empty: none).  ``walk=k``: the decoding walk's record per step; ``points``: capture's points (glob patterns,
    ``["*"]`` for all; ``final`` always kept) of every position of the finished text, recorded in ``dtype``;
    ``logits=n``: keep each sequence's raw logits of its first n steps.  ``batch_size``: prompts per batch (None:
    one batch); ``within``: a context manager entered around each batch, given its rows (indices into ``prompts``)."""
    if not lm.is_causal and not lm.is_encoder_decoder:
        raise UnsupportedFamilyError(f"{lm.name} is a masked LM ({lm.adapter.family}); it generates nothing")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}")
    check_sampling(sample, temperature, top_k, top_p)
    if walk is not None:
        POSITIVE_INT.check(walk, "walk")
    if batch_size is not None:
        POSITIVE_INT.check(batch_size, "batch_size")
    seqs = _prompt_ids(lm, prompts)
    _check_length(lm, seqs, max_new_tokens)
    sampling = (temperature, top_k, top_p) if sample else None
    plan = _plan(lm, max_new_tokens, sampling, eos, walk, points, dtype, logits)
    gens = [Generation(prompt_ids=q, seed=s) for q, s in zip(seqs, _seeds(seeds, len(seqs)))]
    with _bar(len(seqs) * max_new_tokens, progress) as bar:
        for rows in batches(lm, seqs, batch_size):
            with within(rows) if within is not None else nullcontext():
                _run(lm, plan, [gens[i] for i in rows], bar)
    return gens


def _plan(
    lm: LoadedModel,
    n: int,
    sampling: tuple[float, int | None, float | None] | None,
    eos: Collection[int] | None,
    walk: int | None,
    points: Sequence[str] | None,
    dtype: torch.dtype | None,
    logits: int,
) -> _Plan:
    """The call's :class:`_Plan`; refuses capture on an encoder-decoder model (one line)."""
    ends = frozenset(eos_ids(lm) if eos is None else {int(e) for e in eos})
    names = None
    if points is not None:
        if lm.is_encoder_decoder:
            raise UnsupportedFamilyError(
                f"{lm.adapter.family}: capture during generation reads a decoder-only model; capture the finished "
                "text instead (capture(lm, text, decoder_text=...))"
            )
        pts = [points] if isinstance(points, str) else list(points)
        spec = lm.adapter.stack()
        names = select_points(point_names(spec, lm.adapter.residual_kind(lm.config), lm.n_layers), pts)
    pad = lm.tokenizer.pad_token_id
    pad = int(pad) if pad is not None else min(ends, default=0)
    rec = record_dtype(lm, dtype)
    return _Plan(n=n, sampling=sampling, eos=ends, walk=walk, points=names, dtype=rec, logits=logits, pad=pad)


def _bar(total: int, progress: bool) -> AbstractContextManager[Any]:
    """A progress bar over new tokens (a context manager; off unless ``progress`` and 16 tokens or more)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total, desc="generating", unit="tok", disable=not progress or total < 16, file=sys.stderr, leave=False
    )


__all__ = ["Generation", "generate_batch", "batches", "length_dependent"]
