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


def _attn_weights(x: Any) -> torch.Tensor | None:
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
    """Collects hook outputs per (stack, role), in call order (so a shared layer yields one entry per use)."""

    def __init__(self, dtype: torch.dtype, keep_attn: bool) -> None:
        self.store: dict[tuple[str, str], list[torch.Tensor]] = defaultdict(list)
        self.dtype = dtype
        self.keep_attn = keep_attn
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def _put(self, key: tuple[str, str], t: torch.Tensor) -> None:
        self.store[key].append(t.detach()[0].to(dtype=self.dtype, device="cpu", copy=True))

    def out(self, module: nn.Module, key: tuple[str, str]) -> None:
        def hook(_m: nn.Module, _inp: Any, output: Any) -> None:
            self._put(key, _first(output))

        self.handles.append(module.register_forward_hook(hook))

    def inp(self, module: nn.Module, key: tuple[str, str]) -> None:
        def hook(_m: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs.get("hidden_states")
            self._put(key, x)

        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def attn(self, module: nn.Module, key: tuple[str, str]) -> None:
        """Attention probabilities [H, T, S] and the (normed) input X the module attends from."""

        def pre(_m: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs.get("hidden_states")
            self.store[(key[0], key[1] + ".in")].append(x.detach()[0].to(torch.float32, copy=True).cpu())

        def post(_m: nn.Module, _inp: Any, output: Any) -> None:
            w = _attn_weights(output)
            if w is not None:
                self.store[key].append(w.detach()[0].to(torch.float32, copy=True).cpu())

        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(module.register_forward_hook(post))


def _point_names(spec: StackSpec, residual: str, n_layers: int, has_final: bool) -> list[str]:
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
    if has_final:
        names.append("final")
    return names


def _select(names: list[str], patterns: Sequence[str] | None) -> list[str]:
    if not patterns:
        return names
    keep = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if "final" in names and "final" not in keep:
        keep.append("final")  # logits() needs it; it is one row of points
    return keep


def _register(rec: _Recorder, model: nn.Module, adapter: Adapter, spec: StackSpec, attentions: bool) -> None:
    s = spec.name
    seen: set[int] = set()
    for layer in adapter.layer_modules(model, s):
        if id(layer) in seen:  # shared layer: one set of hooks fires once per use
            continue
        seen.add(id(layer))
        rec.inp(layer, (s, "resid_pre"))
        rec.out(layer, (s, "resid_post"))
        rec.out(get_module(layer, spec.attn_out), (s, "attn_out"))
        rec.out(get_module(layer, spec.mlp_out), (s, "mlp_out"))
        if spec.mid:
            rec.out(get_module(layer, spec.mid), (s, "resid_mid"))
        if spec.cross_out:
            rec.out(get_module(layer, spec.cross_out), (s, "cross_out"))
        if attentions:
            rec.attn(get_module(layer, spec.attn), (s, "attn"))
            if spec.cross_attn:
                rec.attn(get_module(layer, spec.cross_attn), (s, "cross"))
    if spec.final_norm:
        rec.out(get_module(model, spec.final_norm), (s, "final"))
    if spec.embed_point:
        rec.out(get_module(model, spec.embed_point), (s, "embed"))


def _assemble(rec: _Recorder, spec: StackSpec, residual: str, n_layers: int, embed: torch.Tensor,
              patterns: Sequence[str] | None) -> tuple[list[str], torch.Tensor, dict, dict]:
    s = spec.name
    st = rec.store
    vec: dict[str, torch.Tensor] = {"embed": embed}
    for l in range(n_layers):
        pre, attn, mlp, post = (st[(s, k)][l] for k in ("resid_pre", "attn_out", "mlp_out", "resid_post"))
        vec[f"L{l}.resid_pre"], vec[f"L{l}.attn_out"] = pre, attn
        vec[f"L{l}.mlp_out"], vec[f"L{l}.resid_post"] = mlp, post
        if residual == "post_norm":
            vec[f"L{l}.resid_mid"] = st[(s, "resid_mid")][l]
        elif residual == "pre_norm":
            mid = pre + attn
            vec[f"L{l}.resid_mid"] = mid
            if spec.cross_out:
                cross = st[(s, "cross_out")][l]
                vec[f"L{l}.cross_out"], vec[f"L{l}.resid_cross"] = cross, mid + cross
    if st.get((s, "final")):
        vec["final"] = st[(s, "final")][-1]
    else:
        vec["final"] = vec[f"L{n_layers - 1}.resid_post"]
    names = _select(_point_names(spec, residual, n_layers, True), patterns)
    hidden = torch.stack([vec[n] for n in names])
    att = {f"L{l}.{k}": st[(s, k)][l] for k in ("attn", "cross") for l in range(len(st.get((s, k), [])))}
    ain = {f"L{l}.{k}": st[(s, k + ".in")][l] for k in ("attn", "cross") for l in range(len(st.get((s, k + ".in"), [])))}
    return names, hidden, att, ain


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
    rec = _Recorder(dtype, attentions)
    for spec in adapter.stacks:
        _register(rec, model, adapter, spec, attentions)
    if not any(sp.embed_point for sp in adapter.stacks):
        rec.out(get_module(model, adapter.embed), ("*", "embed"))

    kwargs: dict[str, Any] = {"input_ids": ids}
    dec_ids = None
    if adapter.auto_class == "seq2seq":
        if decoder_text is not None:
            dec_ids = tokenize(lm, decoder_text, truncate=truncate).to(lm.device)
        else:
            dec_ids = model._shift_right(ids)
        kwargs["decoder_input_ids"] = dec_ids
    with hooks(rec.handles):
        model(**kwargs, use_cache=False) if adapter.auto_class != "masked" else model(**kwargs)

    embeds = rec.store.get(("*", "embed"), [])
    traces: list[Trace] = []
    for i, spec in enumerate(adapter.stacks):
        embed = rec.store[(spec.name, "embed")][0] if spec.embed_point else embeds[i]
        names, hidden, att, ain = _assemble(rec, spec, residual, n_layers, embed, points)
        stack_ids = (dec_ids if (spec.name == "dec") else ids)[0].cpu()
        traces.append(Trace(tokens=token_strings(tok, stack_ids.tolist()), token_ids=stack_ids,
                            points=names, hidden=hidden, model_name=lm.name, family=adapter.family,
                            stack=spec.name, n_layers=n_layers, attentions=att, attn_inputs=ain, lm=lm))
    main = traces[-1]
    if len(traces) > 1:
        main.encoder = traces[0]
    return main
