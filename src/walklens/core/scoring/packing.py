"""Packed scoring: many (context, four endings) requests in one forward pass, every token computed once.

HellaSwag scores each ending by the summed log-probability of its tokens after the context (seed 000,
sec. 5.1.1).  :func:`~.encode.continuation_logliks` runs one request at a time (the context once, its past
key/values shared by the endings).  Here each request becomes one row of a batch: the context, then the
endings' input tokens (each ending minus its last token) as a prefix tree, so that a prefix two endings share
(``" the man"`` ...) is one set of positions:

    context c_1..c_C | tree nodes of the endings' inputs, each parent before its children

with position ids ``0..C-1`` for the context and ``C + depth`` for a node, and a 4-D attention mask in which
a context token sees the context before it and a node sees the whole context and its own ancestors and
itself (never a sibling branch).  Every position therefore computes exactly what it computes in the ending's
own full sequence ``context + ending`` (the lm-evaluation-harness way), but each distinct token of a request
is computed once, no padding sits between real tokens, and many requests share each matrix product.  Rows
are sorted by length and batched under a token budget (padding only at a row's end, masked).

Only the positions that predict an ending token reach the LM head (a pre-hook on the model's own output
embedding picks them), so the ``[tokens, vocab]`` logits of the context are never formed, and the
log-softmax normaliser runs over a few rows at a time (in float32 whatever the model's dtype).  The model's own
forward runs unchanged; nothing of it is re-implemented.  No attention probabilities are needed, so the
forward passes use PyTorch's SDPA kernel where the model can switch to it
(:func:`~walklens.core.interventions.attention_kernel`; it takes the same 4-D masks; eager attention is set back
afterwards): equal to eager attention to float rounding, and faster, most of all in bfloat16.

Requests are :class:`~.request.ScoreRequest`s (checked by :func:`~.request.check_request`, shared with the
one-at-a-time scorer).  Packing is exact for causal LMs whose positions come from position ids (learned
absolute or rotary).  ALiBi (distances derived from the layout), encoder-decoder and masked LMs fall back to
:func:`~.encode.continuation_logliks`, request by request; so does GPT-Neo when a row is longer than its
local-attention window (that window is counted in the layout, not in position ids).  Sliding-window layers
(Gemma 3) get a mask of their own, with the window counted in position ids.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ...base.hooks import Hooks
from ..interventions import attention_kernel, prepacked_linears
from .encode import continuation_logliks
from .request import ScoreRequest, check_request

if TYPE_CHECKING:
    from ..loading import LoadedModel

#: Largest batch, in rows x row length, of one packed forward pass.
MAX_TOKENS = 1024
#: Largest logits tensor of one packed forward pass, in floats (needed positions x vocabulary).
MAX_LOGITS = 1 << 26
#: Rows of logits normalised at a time (a [rows, vocab] float32 block that stays in cache, faster than one
#: logsumexp over every row, whose multi-MB temporaries cost page faults; measured in docs/dtype.md).
LSE_ROWS = 16


def prepack_default() -> bool:
    """Whether packed scoring runs its linear layers from prepacked weights
    (:func:`~walklens.core.interventions.prepacked_linears`, bit for bit the same products): on unless
    ``WALKLENS_PREPACK=0``."""
    return os.environ.get("WALKLENS_PREPACK", "1") != "0"


def _local_window(lm: LoadedModel) -> int | None:
    """GPT-Neo's local-attention window (counted in the layout), or None."""
    cfg = lm.config
    if "local" in (getattr(cfg, "attention_layers", None) or ()):
        return int(cfg.window_size)
    return None


def _sliding_window(lm: LoadedModel) -> tuple[int, bool] | None:
    """(window, whether only some layers slide) for sliding-window attention counted in positions, or None."""
    cfg = lm.config
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    types = getattr(cfg, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    return int(window), types is not None


def can_pack(lm: LoadedModel) -> bool:
    """Whether :func:`packed_logliks` packs requests for this model (else it scores them one by one)."""
    return lm.is_causal and lm.adapter.position_scheme(lm.config) in ("learned", "rotary")


def plan_batches(
    requests: Sequence[ScoreRequest], vocab: int, max_tokens: int = MAX_TOKENS, max_logits: int = MAX_LOGITS
) -> list[list[int]]:
    """Request indices grouped into batches: longest rows first, each batch within ``max_tokens`` (rows x
    longest row) and ``max_logits`` (needed positions x vocabulary); a request larger than both runs alone."""
    order = sorted(range(len(requests)), key=lambda i: -requests[i].row_len)
    batches: list[list[int]] = []
    cur: list[int] = []
    width = needed = 0
    for i in order:
        r = requests[i]
        w = max(width, r.row_len)
        if cur and (w * (len(cur) + 1) > max_tokens or (needed + r.n_needed) * vocab > max_logits):
            batches.append(cur)
            cur, width, needed = [], 0, 0
            w = r.row_len
        cur.append(i)
        width, needed = w, needed + r.n_needed
    if cur:
        batches.append(cur)
    return batches


def _row(r: ScoreRequest) -> tuple[list[int], np.ndarray, list[tuple[int, int, int]]]:
    """One request's row: position ids, the ``[n, n]`` may-attend matrix (context: causal; a tree node: the
    context, its ancestors and itself) and the targets ``(row index predicting it, token, continuation)``."""
    C = r.context_len
    tokens, parents, depths = r.tree
    n = C + len(tokens)
    allowed = np.zeros((n, n), dtype=bool)
    allowed[:C, :C] = np.tril(np.ones((C, C), dtype=bool))
    for i, p in enumerate(parents):
        q = C + i
        allowed[q] = allowed[C + p] if p >= 0 else False
        allowed[q, :C] = True
        allowed[q, q] = True
    targets = []
    index = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}
    for k, c in enumerate(r.continuations):
        targets.append((C - 1, int(c[0]), k))
        node = -1
        for j in range(1, len(c)):
            node = index[(node, int(c[j - 1]))]
            targets.append((C + node, int(c[j]), k))
    return list(range(C)) + [C + d for d in depths], allowed, targets


def _masks(
    allowed: torch.Tensor,
    pos: torch.Tensor,
    dtype: torch.dtype,
    sliding: tuple[int, bool] | None,
    boolean: bool = False,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive ``[B, 1, T, T]`` masks from the may-attend matrices (padding sees only itself); sliding layers
    also need ``pos_q - pos_k < window``.  ``boolean``: the may-attend matrices themselves (True = attend),
    which SDPA takes directly (~20 % faster in its CPU kernel than an additive mask); eager attention adds
    the mask to the scores, so it needs the additive form."""
    T = allowed.shape[1]
    eye = torch.eye(T, dtype=torch.bool)[None]
    allowed = allowed | eye
    neg = torch.finfo(dtype).min

    def additive(a: torch.Tensor) -> torch.Tensor:
        if boolean:
            return a[:, None]
        return torch.zeros(a.shape, dtype=dtype).masked_fill_(~a, neg)[:, None]

    if sliding is None:
        return additive(allowed)
    window, some_layers = sliding
    slide = additive(allowed & (((pos[:, :, None] - pos[:, None, :]) < window) | eye))
    if not some_layers:
        return slide
    return {"full_attention": additive(allowed), "sliding_attention": slide}


@dataclass
class _Packed:
    """The rows of one packed batch: token ids [B, T] (a context given as embeddings is padding there, its vectors
    in ``embeds`` as (row, [C, D])), which position of a row may attend to which [B, T, T], the position ids
    [B, T], and per target token its row, its index in the row, its token id and its output (request,
    continuation; ``n_out`` outputs in all)."""

    ids: torch.Tensor
    allowed: np.ndarray
    pos: torch.Tensor
    tgt_b: list[int]
    tgt_t: list[int]
    tgt_tok: list[int]
    tgt_out: list[int]
    n_out: int
    embeds: list[tuple[int, torch.Tensor]]


def _pack(reqs: Sequence[ScoreRequest], T: int, pad: int) -> _Packed:
    """Each request of ``reqs`` laid out as one row of ``T`` positions (:func:`_row`), padded with ``pad``."""
    B = len(reqs)
    ids = torch.full((B, T), pad, dtype=torch.long)
    allowed = np.zeros((B, T, T), dtype=bool)
    pos = torch.zeros((B, T), dtype=torch.long)
    tgt_b: list[int] = []  # per target token: row, index in the row, token id, output (request, continuation)
    tgt_t: list[int] = []
    tgt_tok: list[int] = []
    tgt_out: list[int] = []
    n_out = 0
    embeds_ctx: list[tuple[int, torch.Tensor]] = []
    for b, r in enumerate(reqs):
        p, a, targets = _row(r)
        C, n = r.context_len, len(p)
        pos[b, :n] = torch.tensor(p)
        allowed[b, :n, :n] = a
        if r.context_ids is not None:
            ids[b, :C] = torch.tensor(list(r.context_ids), dtype=torch.long)
        else:
            assert r.context_embeds is not None  # a request has ids or embeddings
            embeds_ctx.append((b, r.context_embeds))
        ids[b, C:n] = torch.tensor(r.tree[0], dtype=torch.long)
        for t, tok, k in targets:
            tgt_b.append(b)
            tgt_t.append(t)
            tgt_tok.append(tok)
            tgt_out.append(n_out + k)
        n_out += len(r.continuations)
    return _Packed(ids, allowed, pos, tgt_b, tgt_t, tgt_tok, tgt_out, n_out, embeds_ctx)


@torch.inference_mode()
def _packed_batch(lm: LoadedModel, reqs: Sequence[ScoreRequest]) -> list[list[float]]:
    model = lm.hf
    dev = lm.device
    T = max(r.row_len for r in reqs)
    use_embeds = any(r.context_embeds is not None for r in reqs)
    embed = model.get_input_embeddings()
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    pk = _pack(reqs, T, pad)
    dtype = cast(torch.Tensor, embed.weight).dtype
    if use_embeds:
        x = embed(pk.ids.to(dev))
        for b, e in pk.embeds:
            x[b, : e.shape[0]] = e.to(device=dev, dtype=x.dtype)
        inputs: dict[str, Any] = {"inputs_embeds": x}
    else:
        inputs = {"input_ids": pk.ids.to(dev)}
    sdpa = lm.config._attn_implementation == "sdpa"
    mask = _masks(torch.from_numpy(pk.allowed), pk.pos, dtype, _sliding_window(lm), boolean=sdpa)
    mask = {k: v.to(dev) for k, v in mask.items()} if isinstance(mask, dict) else mask.to(dev)
    # the positions that predict some target, each once, in row-major order
    flat = torch.tensor(pk.tgt_b) * T + torch.tensor(pk.tgt_t)
    needed, where = torch.unique(flat, return_inverse=True)
    sel_b, sel_t = (needed // T).to(dev), (needed % T).to(dev)

    def pick(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0][sel_b, sel_t][None],) + tuple(args[1:])

    with Hooks() as hooks:
        hooks.pre(model.get_output_embeddings(), pick)
        logits = model(**inputs, attention_mask=mask, position_ids=pk.pos.to(dev), use_cache=False).logits[0]
    rows = where.to(dev)
    tok_lp = logits[rows, torch.tensor(pk.tgt_tok, device=dev)].float() - _logsumexp_rows(logits)[rows]
    sums = torch.zeros(pk.n_out, dtype=torch.float64, device=dev).index_add_(
        0, torch.tensor(pk.tgt_out, device=dev), tok_lp.double()
    )
    out, k = [], 0
    for r in reqs:
        out.append([float(v) for v in sums[k : k + len(r.continuations)]])
        k += len(r.continuations)
    return out


def _logsumexp_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logsumexp`` of each row in float32 (as ``torch.logsumexp``: shifted by the row's max, or by 0 where
    that max is infinite), :data:`LSE_ROWS` rows at a time in one reused buffer (no allocation per block)."""
    n = logits.shape[0]
    buf = torch.empty((min(n, LSE_ROWS), logits.shape[1]), dtype=torch.float32, device=logits.device)
    out = torch.empty(n, dtype=torch.float32, device=logits.device)
    for i in range(0, n, LSE_ROWS):
        b = buf[: min(LSE_ROWS, n - i)]
        b.copy_(logits[i : i + LSE_ROWS])
        m = b.amax(dim=-1, keepdim=True)
        m.masked_fill_(m.isinf(), 0.0)
        out[i : i + b.shape[0]] = b.sub_(m).exp_().sum(dim=-1).log_().add_(m[:, 0])
    return out


def packed_logliks(
    lm: LoadedModel, requests: Sequence[ScoreRequest], *, max_tokens: int = MAX_TOKENS
) -> list[list[float]]:
    """Per request, the summed log-probability of each continuation after its context (the order given).

    Equal to :func:`~.encode.continuation_logliks` per request (tested on every causal family to 1e-4, in
    float32, with SDPA where the model switches to it), but requests are packed into batched rows (module
    docstring); models that cannot be packed are scored one request at a time.
    """
    for r in requests:
        check_request(lm, r)
    if not can_pack(lm):
        return [
            continuation_logliks(lm, r.continuations, context_ids=r.context_ids, context_embeds=r.context_embeds)
            for r in requests
        ]
    local = _local_window(lm)
    out: list[list[float] | None] = [None] * len(requests)
    packable = []
    for i, r in enumerate(requests):
        if local is not None and r.row_len > local:
            out[i] = continuation_logliks(
                lm, r.continuations, context_ids=r.context_ids, context_embeds=r.context_embeds
            )
        else:
            packable.append(i)
    sub = [requests[i] for i in packable]
    vocab = lm.hf.get_output_embeddings().weight.shape[0]
    with attention_kernel(lm, "sdpa"), prepacked_linears(lm, prepack_default()):
        for batch in plan_batches(sub, vocab, max_tokens):
            for j, ll in zip(batch, _packed_batch(lm, [sub[j] for j in batch])):
                out[packable[j]] = ll
    return out  # type: ignore[return-value]  # every slot is filled: unpackable requests above, the rest by the batches
