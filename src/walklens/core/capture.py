"""Every forward pass that records: hooks on the real modules copy what the named modules output (seed 000, Fig. 1).

- :func:`capture` -- one text, every point (or a subset), optionally attention probabilities: a
  :class:`~walklens.core.trace.Trace`;
- :func:`capture_batch` -- many token-id sequences as one right-padded batch through one stack, keeping only the
  points asked for and stopping the forward pass right after the last of them is written (the hook of the
  last needed point raises a private exception that ends the pass), e.g. the hidden states of segment texts
  (:func:`walklens.core.scoring.encode.hidden_states`);
- :func:`capture_texts` -- several texts as one right-padded batch, in one forward pass, every point written to a
  trace folder as it is computed (``to=``; :func:`capture` and :func:`capture_batch` take ``to=`` too): memory
  holds one point's activations at a time, an interrupted capture resumes (:mod:`walklens.core.tracewrite`), and
  the traces are read back lazily (:meth:`~walklens.core.trace.Trace.open`);
- :func:`record_steps` -- inside a ``with`` block, the final normed output d and the logits of every call of
  the model, e.g. one per generated token in ``model.generate`` (the decoding walk, :mod:`walklens.analyses.decoding`).

The model's own forward runs unchanged.  Hooks are registered through :class:`~walklens.base.hooks.Hooks`,
which removes them on exit, even on error.

The model's dtype (``load_model(..., dtype=)``) and the dtype the vectors are recorded in (``dtype=`` here) are
independent: by default vectors are recorded in float32, so a bfloat16 or float16 model's vectors are kept
exactly (each of their numbers is a float32 number) while the model runs at its own speed; ``dtype=None``
records in the model's dtype (half the memory of float32).  Attention probabilities and attention inputs are
always recorded in float32.
"""

from __future__ import annotations

import fnmatch
import os
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..base.errors import ContextTooLongError, EmptyTextError, InputError, WalklensError, utf8_text
from ..base.hooks import Hooks, distinct, first_output
from ..base.precision import dtype_name
from ..models.base import Adapter, StackSpec, get_module
from .tlnames import TRANSFORMERLENS, naming, to_transformerlens
from .tlnames import select as tl_select
from .trace import Trace
from .tracedir import PointStack, open_folder
from .tracewrite import new_manifest, trace_writer

if TYPE_CHECKING:
    from .loading import LoadedModel


def attention_probs(x: Any) -> torch.Tensor | None:
    """The attention probabilities in a module's output tuple: its last 4-D tensor, if any."""
    if not isinstance(x, (tuple, list)):
        return None
    for item in reversed(x[1:]):
        if isinstance(item, torch.Tensor) and item.dim() == 4:
            return item
    return None


def context_limit(lm: LoadedModel) -> int | None:
    """The model's maximum number of positions, or None when it has none (relative positions)."""
    cfg = lm.model.config
    for attr in ("n_positions", "max_position_embeddings"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def tokenize(lm: LoadedModel, text: str, truncate: bool = False, add_special_tokens: bool = True) -> torch.Tensor:
    """Token ids [1, T] of ``text``; refuses empty text, text UTF-8 cannot carry (a lone surrogate) and text
    longer than the context unless ``truncate``."""
    if not isinstance(text, str) or not text.strip():
        raise EmptyTextError("the text is empty")
    utf8_text(text)
    ids = lm.tokenizer(text, return_tensors="pt", add_special_tokens=add_special_tokens)["input_ids"]
    if ids.shape[1] == 0:
        raise EmptyTextError("the text tokenises to no tokens")
    limit = context_limit(lm)
    if limit is not None and ids.shape[1] > limit:
        if not truncate:
            raise ContextTooLongError(
                f"the text has {ids.shape[1]} tokens, more than the model's context of {limit} "
                f"(pass truncate=True / --truncate to keep the first {limit})"
            )
        ids = ids[:, :limit]
    return ids


class _Stop(Exception):
    """Raised by the hook that writes the last needed point, to end the forward pass there (caught below)."""


class Recorder:
    """Writes hook outputs straight into one preallocated [points, batch, tokens, D] buffer per stack, or, with a
    ``sink`` (a trace folder's writer), hands each point to it as it is computed and keeps nothing.

    Layer indices come from call order, so a shared layer (ALBERT) yields one entry per use.  The mid
    residual of pre-norm families (``resid_pre + attn_out``) is added inside the attention hook, while the
    layer input is still at hand; nothing else is computed.  With ``stop_early`` the hook that writes the
    last missing point raises :class:`_Stop`, so nothing after it runs.
    """

    def __init__(
        self,
        dtype: torch.dtype,
        residual: str,
        device: torch.device | str = "cpu",
        stop_early: bool = False,
        sink: Callable[[str, str, torch.Tensor], None] | None = None,
    ) -> None:
        self.dtype = dtype
        self.residual = residual
        self.device = device
        self.stop_early = stop_early
        self.sink = sink
        self.names: dict[str, list[str]] = {}
        self.index: dict[str, dict[str, int]] = {}
        self.hidden: dict[str, torch.Tensor] = {}
        self.layer: dict[str, int] = {}
        self.live: dict[tuple[str, str], torch.Tensor] = {}
        self.attn_store: dict[tuple[str, str], list[torch.Tensor]] = defaultdict(list)
        self.missing: set[tuple[str, str]] = set()

    def add_stack(self, stack: str, names: list[str]) -> None:
        self.names[stack] = names
        self.index[stack] = {n: i for i, n in enumerate(names)}
        self.layer[stack] = -1
        self.missing |= {(stack, n) for n in names}

    def wants_kind(self, stack: str, kind: str) -> bool:
        return any(n.endswith("." + kind) for n in self.names[stack])

    def put(self, stack: str, name: str, x: torch.Tensor) -> None:
        i = self.index[stack].get(name)
        if i is None:
            return
        if self.sink is not None:
            self.sink(stack, name, x.detach())
        else:
            buf = self.hidden.get(stack)
            if buf is None:
                buf = torch.empty(len(self.names[stack]), *x.shape, dtype=self.dtype, device=self.device)
                self.hidden[stack] = buf
            buf[i].copy_(x.detach())
        self.missing.discard((stack, name))
        if self.stop_early and not self.missing:
            raise _Stop

    def register(
        self, hooks: Hooks, model: nn.Module, adapter: Adapter, spec: StackSpec, attentions: bool, n_layers: int
    ) -> None:
        s = spec.name
        need_mid = self.residual == "pre_norm" and (
            self.wants_kind(s, "resid_mid") or (spec.cross_out is not None and self.wants_kind(s, "resid_cross"))
        )

        def layer_in(_m: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs["hidden_states"]
            self.layer[s] += 1
            self.live[(s, "pre")] = x
            self.put(s, f"L{self.layer[s]}.resid_pre", x)

        def layer_out(_m: nn.Module, _i: Any, out: Any) -> None:
            self.put(s, f"L{self.layer[s]}.resid_post", first_output(out))
            if not spec.final_norm and self.layer[s] == n_layers - 1:  # no final norm: final = last output
                self.put(s, "final", first_output(out))

        def attn_out(_m: nn.Module, _i: Any, out: Any) -> None:
            x, l = first_output(out), self.layer[s]
            self.put(s, f"L{l}.attn_out", x)
            if need_mid:
                mid = self.live[(s, "pre")] + x
                self.live[(s, "mid")] = mid
                self.put(s, f"L{l}.resid_mid", mid)

        def mid_out(_m: nn.Module, _i: Any, out: Any) -> None:
            self.put(s, f"L{self.layer[s]}.resid_mid", first_output(out))

        def cross_out(_m: nn.Module, _i: Any, out: Any) -> None:
            x, l = first_output(out), self.layer[s]
            self.put(s, f"L{l}.cross_out", x)
            if need_mid:
                self.put(s, f"L{l}.resid_cross", self.live[(s, "mid")] + x)

        def mlp_out(_m: nn.Module, _i: Any, out: Any) -> None:
            self.put(s, f"L{self.layer[s]}.mlp_out", first_output(out))

        for layer in distinct(adapter.layer_modules(model, s)):  # a shared layer's hooks fire once per use
            hooks.pre(layer, layer_in, with_kwargs=True)
            hooks.post(layer, layer_out)
            hooks.post(get_module(layer, spec.attn_out), attn_out)
            hooks.post(get_module(layer, spec.mlp_out), mlp_out)
            if spec.mid:
                hooks.post(get_module(layer, spec.mid), mid_out)
            if spec.cross_out:
                hooks.post(get_module(layer, spec.cross_out), cross_out)
            if attentions:
                self._attn(hooks, get_module(layer, spec.attn), s, "attn")
                if spec.cross_attn:
                    self._attn(hooks, get_module(layer, spec.cross_attn), s, "cross")
        if spec.final_norm:
            hooks.post(get_module(model, spec.final_norm), lambda _m, _i, out: self.put(s, "final", first_output(out)))

    def embed(self, hooks: Hooks, module: nn.Module, stacks: Sequence[str]) -> None:
        """Token embeddings; a module shared by several stacks feeds them in call order."""
        calls = iter(stacks)

        def hook(_m: nn.Module, _i: Any, out: Any) -> None:
            stack = next(calls, None)
            if stack is not None:
                self.put(stack, "embed", first_output(out))

        hooks.post(module, hook)

    def _attn(self, hooks: Hooks, module: nn.Module, s: str, kind: str) -> None:
        """Attention probabilities [H, T, S] and the (normed) input X the module attends from."""

        def pre(_m: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs.get("hidden_states")
            assert x is not None  # attention modules take hidden_states
            self.attn_store[(s, kind + ".in")].append(x.detach()[0].to(torch.float32, copy=True))

        def post(_m: nn.Module, _inp: Any, output: Any) -> None:
            w = attention_probs(output)
            if w is not None:
                self.attn_store[(s, kind)].append(w.detach()[0].to(torch.float32, copy=True))

        hooks.pre(module, pre, with_kwargs=True)
        hooks.post(module, post)


def point_names(spec: StackSpec, residual: str, n_layers: int) -> list[str]:
    """Every point :func:`capture` records in a stack of ``n_layers`` layers of kind ``residual``, in order."""
    names = ["embed"]
    for l in range(n_layers):
        names.append(f"L{l}.resid_pre")
        names.append(f"L{l}.attn_out")
        if residual != "parallel":
            names.append(f"L{l}.resid_mid")
        if spec.cross_out:
            names += [f"L{l}.cross_out", f"L{l}.resid_cross"]
        names.append(f"L{l}.mlp_out")
        names.append(f"L{l}.resid_post")
    names.append("final")
    return names


def select_points(names: list[str], patterns: Sequence[str] | None) -> list[str]:
    if not patterns:
        return names
    keep = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if "final" not in keep:
        keep.append("final")  # logits() needs it; it is one row of points
    return keep


def _register(
    rec: Recorder, hooks: Hooks, lm: LoadedModel, specs: Sequence[StackSpec], attentions: bool, n_layers: int
) -> None:
    """The recorder's hooks on every module of ``specs`` and on the token embeddings (a module shared by
    several stacks, T5's, feeds them in call order)."""
    model, adapter = lm.model, lm.adapter
    for spec in specs:
        rec.register(hooks, model, adapter, spec, attentions, n_layers)
    for spec in specs:
        if spec.embed_point:
            rec.embed(hooks, get_module(model, spec.embed_point), [spec.name])
    if not any(sp.embed_point for sp in specs):
        rec.embed(hooks, get_module(model, adapter.embed), [sp.name for sp in specs])


def check_written(rec: Recorder) -> None:
    if rec.missing:
        names = ", ".join(sorted(f"{s}:{n}" if len(rec.names) > 1 else n for s, n in rec.missing))
        raise WalklensError(f"the forward pass never produced the point(s) {names}")


def record_dtype(lm: LoadedModel, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype vectors are recorded in: ``dtype``, or the model's own when None."""
    dtype = lm.dtype if dtype is None else dtype
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise InputError(f"unsupported storage dtype {dtype}")
    return dtype


def _forward_inputs(
    lm: LoadedModel, ids: torch.Tensor, decoder_text: str | None, truncate: bool
) -> tuple[dict[str, Any], torch.Tensor | None]:
    """The keyword arguments of the one forward pass over ``ids``, and the decoder's input ids of an
    encoder-decoder model (``decoder_text``, default the text shifted right as in training; else None)."""
    model = lm.model
    kwargs: dict[str, Any] = {"input_ids": ids}
    dec_ids = None
    if lm.is_encoder_decoder:
        dec_ids = (
            tokenize(lm, decoder_text, truncate=truncate).to(lm.device)
            if decoder_text is not None
            else model._shift_right(ids)  # type: ignore[operator]  # T5's own method; nn.Module types it a Tensor
        )
        kwargs["decoder_input_ids"] = dec_ids
    if not lm.is_masked:
        kwargs["use_cache"] = False
    return kwargs, dec_ids


def _stack_ids(stack: str, ids: torch.Tensor, dec_ids: torch.Tensor | None) -> torch.Tensor:
    """The token ids the stack ``stack`` reads: the decoder's own, else the text's."""
    return dec_ids if stack == "dec" and dec_ids is not None else ids


@dataclass
class _Pass:
    """One forward pass recorded into a trace folder: its stacks, the points of each, each stack's token ids per
    text (unpadded), the call that runs it, and whether it stops right after the last point it needs."""

    specs: list[StackSpec]
    names: dict[str, list[str]]
    ids: dict[str, list[list[int]]]
    run: Callable[[], Any]
    stop_early: bool = True


def _record_to(lm: LoadedModel, to: str | os.PathLike[str], p: _Pass, dtype: torch.dtype) -> None:
    """Run ``p`` with each point it records written to the trace folder ``to`` as it is computed: only the points
    an interrupted capture left (nothing runs when none is missing)."""
    n_layers, residual = lm.adapter.n_layers(lm.config), lm.adapter.residual_kind(lm.config)
    with trace_writer(to, new_manifest(lm, p.names, p.ids, dtype)) as writer:
        missing = {s.name: writer.missing(s.name) for s in p.specs}
        if any(missing.values()):
            rec = Recorder(dtype, residual, stop_early=p.stop_early, sink=writer.write)
            for s in p.specs:
                rec.add_stack(s.name, missing[s.name])
            with Hooks() as hooks:
                _register(rec, hooks, lm, p.specs, False, n_layers)
                try:
                    p.run()
                except _Stop:
                    pass
            check_written(rec)
        writer.finish()


def _traces(
    lm: LoadedModel, rec: Recorder, ids: torch.Tensor, dec_ids: torch.Tensor | None, n_layers: int
) -> list[Trace]:
    """One :class:`Trace` per stack of what ``rec`` recorded (T5: the encoder's, then the decoder's)."""
    adapter = lm.adapter
    traces: list[Trace] = []
    model_dtype = lm.dtype
    for spec in adapter.stacks:
        s = spec.name
        stack_points = rec.names[s]
        st = rec.attn_store
        att = {f"L{l}.{k}": w for k in ("attn", "cross") for l, w in enumerate(st.get((s, k), []))}
        ain = {f"L{l}.{k}": x for k in ("attn", "cross") for l, x in enumerate(st.get((s, k + ".in"), []))}
        stack_ids = _stack_ids(s, ids, dec_ids)[0].cpu()
        traces.append(
            Trace(
                tokens=lm.token_strings(stack_ids.tolist()),
                token_ids=stack_ids,
                points=stack_points,
                hidden=rec.hidden[s][:, 0],
                model_name=lm.name,
                family=adapter.family,
                stack=s,
                n_layers=n_layers,
                attentions=att,
                attn_inputs=ain,
                lm=lm,
                model_dtype=dtype_name(model_dtype),
            )
        )
    return traces


@torch.no_grad()
def capture(
    lm: LoadedModel,
    text: str,
    *,
    points: Sequence[str] | None = None,
    dtype: torch.dtype | None = torch.float32,
    attentions: bool = False,
    truncate: bool = False,
    decoder_text: str | None = None,
    names: str = "walklens",
    to: str | os.PathLike[str] | None = None,
) -> Trace:
    """Run ``text`` through the model once and capture every embedding-space vector (seed 000, Fig. 1).

    ``points``: glob patterns of point names to keep (e.g. ``["embed", "L*.resid_post"]``); ``final`` is always
    kept.  ``dtype``: the dtype the vectors are recorded in, whatever the model's (default float32: exact for a
    bfloat16 or float16 model too; ``torch.float16`` halves memory; None: the model's dtype).  ``attentions``: also
    keep each attention module's probabilities [H, T, S] and its normed input X (for the A.3 identity).  For T5,
    ``decoder_text`` is the decoder's input (default: the text itself, shifted right as in training).
    ``names="transformerlens"``: ``points`` are TransformerLens hook names (``"blocks.*.hook_resid_post"``) and the
    Trace is labelled by them, without ``final`` (:mod:`walklens.core.tlnames`, docs/ecosystem.md).
    ``to``: a folder to write each point to as it is computed (a trace folder, :mod:`walklens.core.tracedir`; memory
    holds one point at a time); the Trace returned reads it lazily (:meth:`~walklens.core.trace.Trace.open`), and
    a rerun into the folder of an interrupted capture writes only the missing points.  Not with ``attentions`` or
    TransformerLens names.
    """
    tl = naming(names) == TRANSFORMERLENS
    if to is not None and (attentions or tl):
        raise InputError("to= writes the points under walklens names, without attention maps: capture those in memory")
    dtype = record_dtype(lm, dtype)
    model, adapter = lm.model, lm.adapter
    ids = tokenize(lm, text, truncate=truncate).to(lm.device)
    n_layers = adapter.n_layers(model.config)
    residual = adapter.residual_kind(model.config)
    rec = Recorder(dtype, residual)
    for spec in adapter.stacks:
        every = point_names(spec, residual, n_layers)
        rec.add_stack(spec.name, tl_select(lm, every, points) if tl else select_points(every, points))

    kwargs, dec_ids = _forward_inputs(lm, ids, decoder_text, truncate)
    if to is not None:
        seqs = {s.name: [_stack_ids(s.name, ids, dec_ids)[0].tolist()] for s in adapter.stacks}
        _record_to(lm, to, _Pass(list(adapter.stacks), rec.names, seqs, lambda: model(**kwargs)), dtype)
        return Trace.open(to, lm)
    with Hooks() as hooks:
        _register(rec, hooks, lm, adapter.stacks, attentions, n_layers)
        model(**kwargs)
    check_written(rec)

    traces = _traces(lm, rec, ids, dec_ids, n_layers)
    main = traces[-1]
    if len(traces) > 1:
        main.encoder = traces[0]
    return to_transformerlens(main) if tl else main


# ---- batches, stopped early ------------------------------------------------------------------------------------


@dataclass
class Batch:
    """The vectors of a right-padded batch at the captured points: ``hidden`` [points, B, T, D] (on the
    model's device), ``mask`` [B, T] (1 = real token), ``token_ids`` [B, T] (padding: the pad id)."""

    points: list[str]
    hidden: torch.Tensor
    mask: torch.Tensor
    token_ids: torch.Tensor
    stack: str = ""

    def __getitem__(self, name: str) -> torch.Tensor:
        """The [B, T, D] vectors of one point."""
        try:
            return self.hidden[self.points.index(name)]
        except ValueError:
            raise InputError(f"no captured point {name!r}; captured: {', '.join(self.points)}") from None


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into ``ids [B, T]`` and ``mask [B, T]`` (1 = real token)."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def _stack_body(lm: LoadedModel, spec: StackSpec) -> nn.Module:
    """The module that runs one stack alone: the encoder of an encoder-decoder model, else the model body
    without its head."""
    if lm.is_encoder_decoder:
        if spec.name != lm.reading_stack.name:
            raise InputError(f"{lm.adapter.family}: a batch runs the encoder stack only, not {spec.name!r}")
        return cast(nn.Module, lm.hf.get_encoder())
    return lm.hf.base_model


@torch.no_grad()
def capture_batch(
    lm: LoadedModel,
    seqs: Sequence[Sequence[int]],
    points: Sequence[str],
    *,
    stack: str | None = None,
    dtype: torch.dtype | None = torch.float32,
    stop_early: bool = True,
    to: str | os.PathLike[str] | None = None,
) -> Batch:
    """Token-id sequences as one right-padded batch (with its attention mask) through one stack, keeping the
    points matching ``points`` (glob patterns; nothing is added).  With ``stop_early`` (default) the forward
    pass ends right after the last needed point is written: asking for ``L3.resid_pre`` runs the embeddings
    and layers 0-2 only, and no head runs.  ``stack``: default the one that reads text (``lm.reading_stack``;
    encoder-decoder models run their encoder alone).  ``dtype``: the record dtype, as in :func:`capture`.
    ``to``: each point written to this trace folder as it is computed, as in :func:`capture`; the Batch's
    ``hidden`` then reads the folder lazily (a :class:`~walklens.core.tracedir.PointStack`)."""
    dtype = record_dtype(lm, dtype)
    points = [points] if isinstance(points, str) else list(points)
    if not seqs or any(len(s) == 0 for s in seqs):
        raise EmptyTextError("a sequence of the batch is empty")
    model, adapter = lm.model, lm.adapter
    try:
        spec = adapter.stack(stack) if stack is not None else lm.reading_stack
    except KeyError as e:
        raise InputError(str(e.args[0])) from None
    n_layers = adapter.n_layers(model.config)
    residual = adapter.residual_kind(model.config)
    names = [n for n in point_names(spec, residual, n_layers) if any(fnmatch.fnmatchcase(n, p) for p in points)]
    if not names:
        raise InputError(f"no point matches {', '.join(points)}")
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    ids, mask = pad_batch(seqs, pad)
    body = _stack_body(lm, spec)

    def run() -> None:
        body(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device), use_cache=False)

    if to is not None:
        listed = {spec.name: [[int(t) for t in s] for s in seqs]}
        _record_to(lm, to, _Pass([spec], {spec.name: names}, listed, run, stop_early), dtype)
        hidden = PointStack(open_folder(to, lm, "to"), spec.name, None)
        return Batch(points=names, hidden=cast(torch.Tensor, hidden), mask=mask, token_ids=ids, stack=spec.name)
    rec = Recorder(dtype, residual, device=lm.device, stop_early=stop_early)
    rec.add_stack(spec.name, names)
    with Hooks() as hooks:
        _register(rec, hooks, lm, [spec], False, n_layers)
        try:
            run()
        except _Stop:
            pass
    check_written(rec)
    return Batch(points=names, hidden=rec.hidden[spec.name], mask=mask, token_ids=ids, stack=spec.name)


def capture_texts(
    lm: LoadedModel,
    texts: Sequence[str],
    *,
    to: str | os.PathLike[str],
    points: Sequence[str] | None = None,
    dtype: torch.dtype | None = torch.float32,
    truncate: bool = False,
) -> list[Trace]:
    """Several texts through the stack that reads text as one right-padded batch, in ONE forward pass (a streamed
    model reads each weight once for all of them), each point of every text written to the trace folder ``to`` as
    it is computed; one :class:`~walklens.core.trace.Trace` per text, read lazily from the folder.  ``points``,
    ``dtype``, ``truncate``: as in :func:`capture` (``final`` always kept); an interrupted capture resumes."""
    if isinstance(texts, str) or not texts:
        raise InputError("capture_texts takes a list of texts (capture takes one)")
    seqs = [tokenize(lm, t, truncate=truncate)[0].tolist() for t in texts]
    spec = lm.reading_stack
    every = point_names(spec, lm.adapter.residual_kind(lm.config), lm.n_layers)
    capture_batch(lm, seqs, select_points(every, points), stack=spec.name, dtype=dtype, to=to)
    source = open_folder(to, lm, "to")
    return [Trace.open(source, lm, item=i) for i in range(len(seqs))]


# ---- one record per call (generation) ----------------------------------------------------------------------------


@dataclass
class Step:
    """One call of the model: ``final`` [T, D], the final normed output (d) at every position the call
    computed, and ``logits`` [V], the model's own logits at its last position (float32, CPU)."""

    final: torch.Tensor
    logits: torch.Tensor


@contextmanager
def record_steps(lm: LoadedModel) -> Iterator[list[Step]]:
    """Inside the block, append one :class:`Step` per call of the whole model (``model.generate`` makes one
    per new token; a T5 encoder pass is not a call of the model).  d is read by a hook on the final norm of the
    last stack (the decoder), or, for a model with no final norm (post-norm OPT), on its last layer (as the
    ``final`` point is captured), the logits by a hook on the model's output, before any logits processor."""
    spec = lm.adapter.stack()
    d_module = (
        get_module(lm.model, spec.final_norm) if spec.final_norm else lm.adapter.layer_modules(lm.model, spec.name)[-1]
    )
    steps: list[Step] = []
    finals: list[torch.Tensor] = []

    def final(_m: nn.Module, _i: Any, out: Any) -> None:
        finals.append(first_output(out)[0].detach().float().cpu())

    def model_out(_m: nn.Module, _i: Any, out: Any) -> None:
        steps.append(Step(final=finals[-1], logits=out.logits[0, -1].detach().float().cpu()))
        finals.clear()

    with Hooks() as hooks:
        hooks.post(d_module, final)
        hooks.post(lm.model, model_out)
        yield steps


__all__ = ["capture", "capture_batch", "capture_texts", "record_steps", "Batch", "Step"]
