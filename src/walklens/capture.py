"""One forward pass with forward hooks on the real modules, returning a :class:`~walklens.trace.Trace`.

The model's own forward runs unchanged; hooks only copy what the named modules output (seed 000, Fig. 1).
Hooks are registered in a context manager that always removes them, even on error.
"""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch
from torch import nn

from .errors import ContextTooLongError, EmptyTextError, InputError
from .models.base import Adapter, StackSpec, get_module
from .trace import Trace

if TYPE_CHECKING:
    from .loading import LoadedModel


def _first(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x


def attention_probs(x: Any) -> torch.Tensor | None:
    """The attention probabilities in a module's output tuple: its last 4-D tensor, if any."""
    if not isinstance(x, (tuple, list)):
        return None
    for item in reversed(x[1:]):
        if isinstance(item, torch.Tensor) and item.dim() == 4:
            return item
    return None


@contextmanager
def hooks(handles: list[torch.utils.hooks.RemovableHandle]) -> Iterator[None]:
    """Remove every registered hook on exit, even on error."""
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def context_limit(lm: LoadedModel) -> int | None:
    """The model's maximum number of positions, or None when it has none (relative positions)."""
    cfg = lm.model.config
    for attr in ("n_positions", "max_position_embeddings"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def tokenize(lm: LoadedModel, text: str, truncate: bool = False, add_special_tokens: bool = True) -> torch.Tensor:
    """Token ids [1, T] of ``text``; refuses empty text and text longer than the context unless ``truncate``."""
    if not isinstance(text, str) or not text.strip():
        raise EmptyTextError("the text is empty")
    ids = lm.tokenizer(text, return_tensors="pt", add_special_tokens=add_special_tokens)["input_ids"]
    if ids.shape[1] == 0:
        raise EmptyTextError("the text tokenises to no tokens")
    limit = context_limit(lm)
    if limit is not None and ids.shape[1] > limit:
        if not truncate:
            raise ContextTooLongError(
                f"the text has {ids.shape[1]} tokens, more than the model's context of {limit} "
                f"(pass truncate=True / --truncate to keep the first {limit})")
        ids = ids[:, :limit]
    return ids


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each id decoded on its own, so labels read as text (``" Paris"``, not ``"ĠParis"``)."""
    return [tokenizer.decode([int(i)]) for i in ids]


class _Recorder:
    """Writes hook outputs straight into one preallocated [points, tokens, D] buffer per stack.

    Layer indices come from call order, so a shared layer (ALBERT) yields one entry per use.  The mid
    residual of pre-norm families (``resid_pre + attn_out``) is added inside the attention hook, while the
    layer input is still at hand; nothing else is computed.
    """

    def __init__(self, dtype: torch.dtype, residual: str) -> None:
        self.dtype = dtype
        self.residual = residual
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.names: dict[str, list[str]] = {}
        self.index: dict[str, dict[str, int]] = {}
        self.hidden: dict[str, torch.Tensor] = {}
        self.layer: dict[str, int] = {}
        self.live: dict[tuple[str, str], torch.Tensor] = {}
        self.attn_store: dict[tuple[str, str], list[torch.Tensor]] = defaultdict(list)

    def add_stack(self, stack: str, names: list[str]) -> None:
        self.names[stack] = names
        self.index[stack] = {n: i for i, n in enumerate(names)}
        self.layer[stack] = -1

    def wants(self, stack: str, name: str) -> bool:
        return name in self.index[stack]

    def put(self, stack: str, name: str, x: torch.Tensor) -> None:
        i = self.index[stack].get(name)
        if i is None:
            return
        buf = self.hidden.get(stack)
        if buf is None:
            buf = torch.empty(len(self.names[stack]), x.shape[-2], x.shape[-1], dtype=self.dtype)
            self.hidden[stack] = buf
        buf[i].copy_(x.detach()[0])

    def _hook(self, module: nn.Module, fn: Any, pre: bool = False) -> None:
        if pre:
            self.handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))
        else:
            self.handles.append(module.register_forward_hook(fn))

    def register(self, model: nn.Module, adapter: Adapter, spec: StackSpec, attentions: bool, n_layers: int) -> None:
        s = spec.name
        need_mid = self.residual == "pre_norm" and (
            self.wants(s, "L0.resid_mid") or (spec.cross_out is not None and self.wants(s, "L0.resid_cross")))

        def layer_in(_m: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs["hidden_states"]
            self.layer[s] += 1
            self.live[(s, "pre")] = x
            self.put(s, f"L{self.layer[s]}.resid_pre", x)

        def layer_out(_m: nn.Module, _i: Any, out: Any) -> None:
            self.put(s, f"L{self.layer[s]}.resid_post", _first(out))
            if not spec.final_norm and self.layer[s] == n_layers - 1:  # no final norm: final = last output
                self.put(s, "final", _first(out))

        def attn_out(_m: nn.Module, _i: Any, out: Any) -> None:
            x, l = _first(out), self.layer[s]
            self.put(s, f"L{l}.attn_out", x)
            if need_mid:
                mid = self.live[(s, "pre")] + x
                self.live[(s, "mid")] = mid
                self.put(s, f"L{l}.resid_mid", mid)

        def mid_out(_m: nn.Module, _i: Any, out: Any) -> None:
            self.put(s, f"L{self.layer[s]}.resid_mid", _first(out))

        def cross_out(_m: nn.Module, _i: Any, out: Any) -> None:
            x, l = _first(out), self.layer[s]
            self.put(s, f"L{l}.cross_out", x)
            if need_mid:
                self.put(s, f"L{l}.resid_cross", self.live[(s, "mid")] + x)

        def mlp_out(_m: nn.Module, _i: Any, out: Any) -> None:
            self.put(s, f"L{self.layer[s]}.mlp_out", _first(out))

        seen: set[int] = set()
        for layer in adapter.layer_modules(model, s):
            if id(layer) in seen:  # a shared layer's hooks fire once per use
                continue
            seen.add(id(layer))
            self._hook(layer, layer_in, pre=True)
            self._hook(layer, layer_out)
            self._hook(get_module(layer, spec.attn_out), attn_out)
            self._hook(get_module(layer, spec.mlp_out), mlp_out)
            if spec.mid:
                self._hook(get_module(layer, spec.mid), mid_out)
            if spec.cross_out:
                self._hook(get_module(layer, spec.cross_out), cross_out)
            if attentions:
                self._attn(get_module(layer, spec.attn), s, "attn")
                if spec.cross_attn:
                    self._attn(get_module(layer, spec.cross_attn), s, "cross")
        if spec.final_norm:
            self._hook(get_module(model, spec.final_norm), lambda _m, _i, out: self.put(s, "final", _first(out)))

    def embed(self, module: nn.Module, stacks: Sequence[str]) -> None:
        """Token embeddings; a module shared by several stacks feeds them in call order."""
        calls = iter(stacks)

        def hook(_m: nn.Module, _i: Any, out: Any) -> None:
            stack = next(calls, None)
            if stack is not None:
                self.put(stack, "embed", _first(out))

        self._hook(module, hook)

    def _attn(self, module: nn.Module, s: str, kind: str) -> None:
        """Attention probabilities [H, T, S] and the (normed) input X the module attends from."""

        def pre(_m: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs.get("hidden_states")
            self.attn_store[(s, kind + ".in")].append(x.detach()[0].to(torch.float32, copy=True))

        def post(_m: nn.Module, _inp: Any, output: Any) -> None:
            w = attention_probs(output)
            if w is not None:
                self.attn_store[(s, kind)].append(w.detach()[0].to(torch.float32, copy=True))

        self._hook(module, pre, pre=True)
        self._hook(module, post)


def _point_names(spec: StackSpec, residual: str, n_layers: int) -> list[str]:
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


def _select(names: list[str], patterns: Sequence[str] | None) -> list[str]:
    if not patterns:
        return names
    keep = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if "final" not in keep:
        keep.append("final")  # logits() needs it; it is one row of points
    return keep


@torch.no_grad()
def capture(lm: LoadedModel, text: str, *, points: Sequence[str] | None = None, dtype: torch.dtype = torch.float32,
            attentions: bool = False, truncate: bool = False, decoder_text: str | None = None) -> Trace:
    """Run ``text`` through the model once and capture every embedding-space vector (seed 000, Fig. 1).

    ``points``: glob patterns of point names to keep (e.g. ``["embed", "L*.resid_post"]``); ``final`` is always
    kept.  ``dtype``: storage dtype (``torch.float16`` halves memory).  ``attentions``: also keep each
    attention module's probabilities [H, T, S] and its normed input X (for the A.3 identity).
    For T5, ``decoder_text`` is the decoder's input (default: the text itself, shifted right as in training).
    """
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise InputError(f"unsupported storage dtype {dtype}")
    model, adapter, tok = lm.model, lm.adapter, lm.tokenizer
    ids = tokenize(lm, text, truncate=truncate).to(lm.device)
    n_layers = adapter.n_layers(model.config)
    residual = adapter.residual_kind(model.config)
    rec = _Recorder(dtype, residual)
    for spec in adapter.stacks:
        rec.add_stack(spec.name, _select(_point_names(spec, residual, n_layers), points))
        rec.register(model, adapter, spec, attentions, n_layers)
    for spec in adapter.stacks:
        if spec.embed_point:
            rec.embed(get_module(model, spec.embed_point), [spec.name])
    if not any(sp.embed_point for sp in adapter.stacks):
        rec.embed(get_module(model, adapter.embed), [sp.name for sp in adapter.stacks])

    kwargs: dict[str, Any] = {"input_ids": ids}
    dec_ids = None
    if adapter.auto_class == "seq2seq":
        dec_ids = tokenize(lm, decoder_text, truncate=truncate).to(lm.device) if decoder_text is not None \
            else model._shift_right(ids)
        kwargs["decoder_input_ids"] = dec_ids
    if adapter.auto_class != "masked":
        kwargs["use_cache"] = False
    with hooks(rec.handles):
        model(**kwargs)

    traces: list[Trace] = []
    for spec in adapter.stacks:
        s = spec.name
        names = rec.names[s]
        st = rec.attn_store
        att = {f"L{l}.{k}": w for k in ("attn", "cross") for l, w in enumerate(st.get((s, k), []))}
        ain = {f"L{l}.{k}": x for k in ("attn", "cross") for l, x in enumerate(st.get((s, k + ".in"), []))}
        stack_ids = (dec_ids if s == "dec" else ids)[0].cpu()
        traces.append(Trace(tokens=token_strings(tok, stack_ids.tolist()), token_ids=stack_ids, points=names,
                            hidden=rec.hidden[s], model_name=lm.name, family=adapter.family, stack=s,
                            n_layers=n_layers, attentions=att, attn_inputs=ain, lm=lm))
    main = traces[-1]
    if len(traces) > 1:
        main.encoder = traces[0]
    return main
