"""The decoding walk (seed 000, sec. 2.1, eqs. 8-15; A.1): the decoding vector d_t of every generated token.

- Free generation is :func:`walklens.core.generation.generate_batch`: the model's own ``generate`` (its key/value
  cache), many prompts in left-padded batches (:func:`decoding_walks`), each walk the one its prompt gives alone.
  A :class:`~transformers.LogitsProcessor` makes each step's choice -- the greedy argmax, or a draw from P_t with
  ``temperature``/``top_k``/``top_p`` (transformers' own warpers) and the sequence's own seeded generator -- from
  the model's raw logits, records the step, and hands ``generate`` scores in which only that token is finite.  d_t
  and the raw logits are read by hooks on the final norm and the model's output, so no logits processor of the
  model's generation config changes what is recorded.
- A teacher-forced walk (``target=``, A.1) is one forward pass over the prompt and the target (minus its last
  token): position P-1+i predicts target token i.

Ranks are 0-based: rank 0 is the nearest token, the one greedy decoding picks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..base.display import Shown
from ..base.errors import ContextTooLongError, EmptyTextError, InputError, utf8_text
from ..base.frames import Columns, DataFrame, frame, long_table, pick
from ..core.capture import context_limit, record_steps, tokenize
from ..core.generation import generate_batch
from ..core.sampling import StepRecord, check_sampling, eos_ids, read_step
from .walks import labels_for

if TYPE_CHECKING:
    from ..core.loading import LoadedModel


@dataclass
class DecodingWalk(Shown, view="decoding"):
    """A decoding walk ⟨d_i⟩ (eq. 10): one decoding vector d_t per generated (or teacher-forced) token.

    ``tokens``/``token_ids``: the emitted tokens; ``ranks``: rank of each emitted token in P_t (0 = the
    nearest token, what greedy decoding picks); ``probs``: its probability P_t(w_{t+1}) (eq. 12, temperature
    1); ``top_ids``/``top_probs`` [steps, k]: d_t's nearest tokens by logit; ``greedy_ids``: the argmax at each
    step; ``d`` [steps, D]: the decoding vectors (final normed output); ``step_length``/``step_angle``: movement
    of d from the previous step (degrees; step 0 is measured from the prompt's second-to-last d).
    With a target (A.1): ``in_neighbourhood[i]`` is True when d_i lies in the target token's neighbourhood
    (the target token ranks first) and ``left_path_at`` is the first step where it does not (-1: the walk
    stays on the target path).
    """

    prompt: str
    prompt_tokens: list[str]
    prompt_ids: torch.Tensor
    tokens: list[str]
    token_ids: torch.Tensor
    ranks: torch.Tensor
    probs: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    greedy_ids: torch.Tensor
    d: torch.Tensor
    d_norm: torch.Tensor
    step_length: torch.Tensor
    step_angle: torch.Tensor
    sample: bool = False
    seed: int = 0
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    stopped_at_eos: bool = False
    target: str | None = None
    target_ids: torch.Tensor | None = None
    in_neighbourhood: torch.Tensor | None = None
    left_path_at: int = -1
    model_name: str = ""
    top_tokens: list[list[str]] = field(default_factory=list)

    def _headline(self) -> str:
        """The head line of its text repr (:mod:`walklens.base.display`)."""
        return f"{self.model_name} · {self.prompt[:24]!r} + {len(self.tokens)} tokens"

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def _columns(self, table: str = "steps") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        n = len(self.tokens)

        def steps() -> Columns:
            ids = [int(i) for i in self.token_ids.reshape(-1).tolist()]
            greedy = [int(i) for i in self.greedy_ids.reshape(-1).tolist()]
            per_step: dict[str, list[Any]] = {
                "token": list(self.tokens),
                "token_id": ids,
                "greedy_id": greedy,
                "greedy": [a == b for a, b in zip(ids, greedy)],
            }
            if self.target_ids is not None and len(self.target_ids.reshape(-1)) == n:
                per_step["target_id"] = [int(i) for i in self.target_ids.reshape(-1).tolist()]
            per_step["in_neighbourhood"] = (
                [bool(b) for b in self.in_neighbourhood.tolist()] if self.in_neighbourhood is not None else [None] * n
            )
            cols = long_table(
                [("step", range(n))],
                {
                    "rank": self.ranks,
                    "prob": self.probs,
                    "d_norm": self.d_norm,
                    "step_length": self.step_length,
                    "step_angle": self.step_angle,
                },
                by_axis={"step": per_step},
                wide={"top_id": self.top_ids, "top_prob": self.top_probs},
            )
            k = self.top_ids.shape[-1]
            if len(self.top_tokens) == n and all(len(t) >= k for t in self.top_tokens):
                for j in range(k):
                    cols[f"top_token_{j}"] = [t[j] for t in self.top_tokens]
            return cols

        def prompt() -> Columns:
            return long_table(
                [("position", range(len(self.prompt_tokens)))],
                by_axis={"position": {"token": self.prompt_tokens, "token_id": self.prompt_ids.reshape(-1)}},
            )

        def vectors() -> Columns:
            return long_table([("step", range(n)), ("dim", range(self.d.shape[-1]))], {"value": self.d.float()})

        return pick(table, {"steps": steps, "d": vectors, "prompt": prompt}, "a DecodingWalk")

    def to_pandas(self, table: str = "steps") -> DataFrame:
        """The walk as a table (pandas; docs/notebooks.md, "Tables"): ``steps`` one row per generated token
        (``rank`` 0-based, ``prob`` = P_t(w_{t+1}), the top-k as ``top_id_i``/``top_prob_i``/``top_token_i``);
        ``d`` the decoding vectors d_t, one row per (step, dim); ``prompt`` the prompt's tokens."""
        return frame(
            self._columns(table),
            {
                "model": self.model_name,
                "prompt": self.prompt,
                "text": self.text,
                "sample": self.sample,
                "seed": self.seed,
                "temperature": self.temperature,
                "top_k": self.top_k,
                "top_p": self.top_p,
                "stopped_at_eos": self.stopped_at_eos,
                "target": self.target,
                "left_path_at": self.left_path_at,
            },
        )


def _teacher_forced(
    lm: LoadedModel, ids: torch.Tensor, target_ids: torch.Tensor, k: int
) -> tuple[list[StepRecord], torch.Tensor | None]:
    """One forward pass over the prompt and the target minus its last token (A.1)."""
    P, n = ids.shape[1], len(target_ids)
    tail = target_ids[:-1].view(1, -1).to(ids.device)
    with record_steps(lm) as steps:
        if lm.is_encoder_decoder:
            dec = torch.cat([torch.tensor([[_decoder_start(lm)]], device=ids.device), tail], dim=1)
            logits = lm.model(input_ids=ids, decoder_input_ids=dec, use_cache=False).logits[0].float().cpu()
            first = 0
        else:
            logits = lm.model(input_ids=torch.cat([ids, tail], dim=1), use_cache=False).logits[0].float().cpu()
            first = P - 1
    d_all = steps[0].final
    records = [read_step(logits[first + i], int(target_ids[i]), d_all[first + i], k) for i in range(n)]
    return records, (d_all[first - 1] if first >= 1 else None)


def _decoder_start(lm: LoadedModel) -> int:
    start = lm.config.decoder_start_token_id
    return start if start is not None else (lm.config.pad_token_id or 0)


def _refuse_masked(lm: LoadedModel) -> None:
    if lm.is_masked:
        raise InputError(
            f"{lm.name} is a masked LM ({lm.adapter.family}); a decoding walk needs a causal or encoder-decoder model"
        )


@torch.no_grad()
def decoding_walk(
    lm: LoadedModel,
    prompt: str,
    max_new_tokens: int = 20,
    sample: bool = False,
    seed: int = 0,
    target: str | Sequence[int] | None = None,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    k: int = 10,
    stop_at_eos: bool = True,
    progress: bool = True,
) -> DecodingWalk:
    """Generate from ``prompt`` and record the decoding walk ⟨d_t⟩ (seed 000, sec. 2.1, eqs. 8-15).

    Generation is the model's own ``generate`` with its key/value cache; d_t is the final normed output, read
    by a hook on the final norm.  Greedy by default (reproduces ``model.generate``); ``sample=True`` draws from
    P_t with ``temperature``/``top_k``/``top_p`` and a seeded generator.  ``target="..."`` teacher-forces the
    target tokens instead (a text, or a list of token ids), in one forward pass, and reports, step by step,
    whether d_t lies in the target token's neighbourhood (A.1).  Many prompts in batches: :func:`decoding_walks`.
    """
    _refuse_masked(lm)
    if target is None:
        return decoding_walks(
            lm,
            [prompt],
            max_new_tokens,
            sample,
            seed,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            k=k,
            stop_at_eos=stop_at_eos,
            progress=progress,
        )[0]
    check_sampling(sample, temperature, top_k, top_p)
    ids = tokenize(lm, prompt).to(lm.device)
    target_ids, target_text = _target(lm, target)
    _check_context(lm, ids, len(target_ids))
    records, prompt_prev = _teacher_forced(lm, ids, target_ids, k)
    settings = _settings(False, seed, temperature, top_k, top_p)
    return _assemble(lm, prompt, ids, (records, prompt_prev, False), settings, (target_text, target_ids))


@torch.no_grad()
def decoding_walks(
    lm: LoadedModel,
    prompts: Sequence[str],
    max_new_tokens: int = 20,
    sample: bool = False,
    seeds: int | Sequence[int] = 0,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    k: int = 10,
    stop_at_eos: bool = True,
    batch_size: int | None = None,
    progress: bool = True,
) -> list[DecodingWalk]:
    """The decoding walks of many prompts, generated together in left-padded batches with the model's own
    ``generate`` and key/value cache (:func:`walklens.core.generation.generate_batch`); each walk is the one
    :func:`decoding_walk` gives its prompt alone (sampled walks too: each prompt draws from its own generator,
    ``seeds`` one for all or one per prompt).  ``batch_size``: prompts per batch (None: one batch)."""
    _refuse_masked(lm)
    if isinstance(prompts, str):
        raise InputError("decoding_walks takes a list of prompts; one prompt: decoding_walk")
    eos = eos_ids(lm) if stop_at_eos else set()
    gens = generate_batch(
        lm,
        prompts,
        max_new_tokens=max_new_tokens,
        sample=sample,
        seeds=seeds,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos=eos,
        walk=k,
        batch_size=batch_size,
        progress=progress,
    )
    return [
        _assemble(
            lm,
            p,
            torch.tensor([g.prompt_ids]),
            (g.steps, g.prompt_prev, g.stopped_at_eos),
            _settings(sample, g.seed, temperature, top_k, top_p),
        )
        for p, g in zip(prompts, gens)
    ]


def _settings(sample: bool, seed: int, temperature: float, top_k: int | None, top_p: float | None) -> dict[str, Any]:
    """The generation settings a :class:`DecodingWalk` records, by field name."""
    return dict(sample=sample, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)


def _target(lm: LoadedModel, target: str | Sequence[int]) -> tuple[torch.Tensor, str]:
    """The target path's token ids and its text (A.1): a text tokenised without special tokens, or token ids
    decoded."""
    tok = lm.tokenizer
    if isinstance(target, str):
        if not target.strip():
            raise EmptyTextError("the target is empty")
        utf8_text(target, "the target")
        target_ids = torch.tensor(tok(target, add_special_tokens=False)["input_ids"], dtype=torch.long)
        target_text = target
    else:
        target_ids = torch.tensor([int(i) for i in target], dtype=torch.long)
        target_text = tok.decode(target_ids.tolist())
    if len(target_ids) == 0:
        raise EmptyTextError("the target tokenises to no tokens")
    return target_ids, target_text


def _check_context(lm: LoadedModel, ids: torch.Tensor, n_steps: int) -> None:
    """Refuse a prompt of ``ids`` and ``n_steps`` new tokens longer than a decoder's context window."""
    limit = context_limit(lm)
    if limit is not None and not lm.is_encoder_decoder and ids.shape[1] + n_steps > limit:
        raise ContextTooLongError(
            f"prompt ({ids.shape[1]} tokens) + {n_steps} new tokens exceed the model's context of {limit}"
        )


def _assemble(
    lm: LoadedModel,
    prompt: str,
    ids: torch.Tensor,
    walked: tuple[list[StepRecord], torch.Tensor | None, bool],
    settings: dict[str, Any],
    targeted: tuple[str, torch.Tensor] | None = None,
) -> DecodingWalk:
    """The walk from its step records, the prompt's second-to-last d and whether it stopped at an end of
    sequence (``walked``), its generation ``settings`` (:func:`_settings`) and the teacher-forced target's text
    and ids (``targeted``; None: generated)."""
    records, prompt_prev, stopped = walked
    target, target_ids = targeted if targeted is not None else (None, None)
    if not records:  # a walk whose first logits were not finite (an overflowing intervention) has no step
        raise InputError("the model's first logits are not finite (NaN or inf): the walk has no step")
    tok = lm.tokenizer
    out_ids = [r.choice for r in records]
    d = torch.stack([r.d for r in records])
    prev = torch.cat([(prompt_prev if prompt_prev is not None else torch.full_like(d[0], float("nan")))[None], d[:-1]])
    step_len = (d - prev).norm(dim=-1)
    cos = torch.nn.functional.cosine_similarity(d, prev, dim=-1, eps=1e-12).clamp(-1, 1)
    ranks = torch.tensor([r.rank for r in records], dtype=torch.long)
    in_nb = (ranks == 0) if target_ids is not None else None
    left = int((~in_nb).int().argmax()) if in_nb is not None and not bool(in_nb.all()) else -1
    top_ids = torch.stack([r.top_ids for r in records])
    labels = labels_for(tok, sorted(set(top_ids.reshape(-1).tolist())))
    return DecodingWalk(
        prompt=prompt,
        prompt_tokens=lm.token_strings(ids[0].tolist()),
        prompt_ids=ids[0].cpu(),
        tokens=lm.token_strings(out_ids),
        token_ids=torch.tensor(out_ids, dtype=torch.long),
        ranks=ranks,
        probs=torch.tensor([r.prob for r in records]),
        top_ids=top_ids,
        top_probs=torch.stack([r.top_probs for r in records]),
        greedy_ids=torch.tensor([r.greedy for r in records], dtype=torch.long),
        d=d,
        d_norm=d.norm(dim=-1),
        step_length=step_len,
        step_angle=torch.rad2deg(torch.arccos(cos)),
        stopped_at_eos=stopped,
        target=target,
        target_ids=target_ids,
        in_neighbourhood=in_nb,
        left_path_at=left,
        model_name=lm.name,
        top_tokens=[[labels[int(i)] for i in row] for row in top_ids.tolist()],
        **settings,
    )


__all__ = ["DecodingWalk", "decoding_walk", "decoding_walks"]
