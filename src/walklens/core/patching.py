"""Activation patching's interventions: a vector put in at a (point, position) cell of each sequence of a batch, and a
forward pass started at a layer from a stored residual.  A sibling of :mod:`walklens.core.interventions`
(that module would pass the 600-line rule with these), with the same contract: each is a context manager whose hooks
go through :class:`~walklens.base.hooks.Hooks` and which restores the model **bit for bit** on exit, even on error.

  * :func:`patched` -- row b of the batch gets ``cells[b].value`` at ``cells[b].position`` of ``cells[b].site``:
    a residual point (``resid_pre``, ``resid_mid``, ``resid_post``), a sublayer's output (``attn_out``, ``mlp_out``)
    or one head's share of the attention output, ``z_h`` at the output projection's input, whose product with
    W_o,h is the head's A.3 contribution ``A_h X W_vo,h`` (seed 000, A.3);
  * :func:`start_at` -- the layer list cut to layers ``l..L-1`` and layer l's input replaced by a stored residual:
    a patch at layer l reruns only what it can change (the incremental grid of :mod:`walklens.analyses.patching`);
  * :func:`record` -- one pass recording the vectors of some sites (cloned, or kept in the autograd graph for
    attribution patching) and the logits at one position.

``resid_mid`` of a pre-norm family is no module's output (the layer adds ``resid_pre + attn_out`` inside its forward):
it is patched through ``attn_out`` (``value - resid_pre``), so the layer's sum gives the value within one rounding.
Decoder-only (causal) models without a shared layer stack only; the others are refused in one line.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..base.errors import InputError, UnsupportedFamilyError
from ..base.hooks import Hooks, first_output, replace_first
from ..models.base import get_module

if TYPE_CHECKING:
    from .loading import LoadedModel

#: the point kinds a cell may name, in the order of a layer; ``head`` is one head's z_h (its A.3 contribution)
KINDS = ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post", "head")

_NAME = re.compile(r"^L(\d+)\.(?:(resid_pre|attn_out|resid_mid|mlp_out|resid_post)|H(\d+))$")


@dataclass(frozen=True)
class Site:
    """A place of the forward pass: a layer and a point kind, or a layer and a head (``kind == "head"``)."""

    layer: int
    kind: str
    head: int | None = None

    @property
    def name(self) -> str:
        """``L3.resid_pre`` or ``L3.H2``: capture's point names, heads as ``H{h}``."""
        return f"L{self.layer}.H{self.head}" if self.kind == "head" else f"L{self.layer}.{self.kind}"


@dataclass
class Cell:
    """One row's patch: ``value`` ([D], or [d] for a head) at ``position`` of ``site``."""

    site: Site
    position: int
    value: torch.Tensor


def check_model(lm: LoadedModel) -> None:
    """Refuse, in one line, a model patching does not run on: not decoder-only, one shared layer (ALBERT), or one
    streamed layer by layer (a cell's pass finds its projection modules by their weights and starts at its layer
    from stored state: the weights must be in memory)."""
    spec = lm.adapter.stack()
    if not lm.is_causal or lm.is_encoder_decoder or spec.shared_layer:
        raise UnsupportedFamilyError(f"{lm.adapter.family}: patching runs on decoder-only models without shared layers")
    if lm.stream is not None:
        raise InputError(
            f"{lm.name}: patching runs on a model held in memory, not streamed layer by layer: load it with "
            "stream=False (--no-stream) and a budget that holds its weights"
        )


def parse_site(lm: LoadedModel, name: str) -> Site:
    """The :class:`Site` of ``L{l}.{kind}`` or ``L{l}.H{h}``; refuses a name, layer, head or kind the model lacks."""
    m = _NAME.match(name)
    if m is None:
        raise InputError(f"no point {name!r}: give L<layer>.<{'|'.join(KINDS[:-1])}> or L<layer>.H<head>")
    layer = int(m.group(1))
    if layer >= lm.n_layers:
        raise InputError(f"point {name}: layer {layer} out of range (the model has {lm.n_layers} layers)")
    if m.group(3) is not None:
        head, n = int(m.group(3)), n_heads(lm)
        if head >= n:
            raise InputError(f"point {name}: head {head} out of range (layer {layer} has {n} heads)")
        return Site(layer, "head", head)
    kind = m.group(2)
    if kind == "resid_mid" and lm.adapter.residual_kind(lm.config) == "parallel":
        raise InputError(f"point {name}: a parallel block (attention and MLP side by side) has no resid_mid")
    return Site(layer, kind)


def n_heads(lm: LoadedModel) -> int:
    """Query heads per layer."""
    return lm.head_shape[0]


def out_projection(lm: LoadedModel, layer: int) -> nn.Module:
    """The attention module's output projection: the module holding W_o ([H d, D] as-is, or transposed), whose input is
    the heads' outputs z_h side by side."""
    hw = lm.head_weights(layer)
    w_o = hw.w_o.detach().reshape(-1, hw.d_model)
    found = []
    for module in lm.adapter.attention_module(lm.model, layer).modules():
        w = getattr(module, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype == w_o.dtype:
            if (w.shape == w_o.shape and torch.equal(w, w_o)) or (w.shape == w_o.T.shape and torch.equal(w, w_o.T)):
                found.append(module)
    if len(found) != 1:
        raise UnsupportedFamilyError(f"{lm.adapter.family}: no unique attention output projection ({len(found)} found)")
    return found[0]


@dataclass
class _Modules:
    """The modules of one layer a site's hook sits on."""

    layer: nn.Module
    attn_out: nn.Module
    mlp_out: nn.Module
    mid: nn.Module | None
    out_proj: nn.Module | None = None


def _modules(lm: LoadedModel, layer: int, heads: bool) -> _Modules:
    spec = lm.adapter.stack()
    mod = lm.adapter.layer_modules(lm.model)[layer]
    return _Modules(
        layer=mod,
        attn_out=get_module(mod, spec.attn_out),
        mlp_out=get_module(mod, spec.mlp_out),
        mid=get_module(mod, spec.mid) if spec.mid else None,
        out_proj=out_projection(lm, layer) if heads else None,
    )


def _hidden_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple[Any, ...], kwargs: dict[str, Any], x: torch.Tensor) -> tuple[Any, dict[str, Any]]:
    if args:
        return (x, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": x}


@dataclass
class _Put:
    """The rows, positions and values one hook writes (rows of the batch, in order)."""

    rows: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    batch: int = 1

    def write(self, x: torch.Tensor, start: int = 0, minus: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` with each row's value at its position (columns ``start:start+len(value)``; ``minus``: minus that
        tensor's vector there, for resid_mid through attn_out)."""
        flat = x.dim() == 2  # OPT's MLP runs on [B*T, D]
        out = (x.reshape(self.batch, -1, x.shape[-1]) if flat else x).clone()
        for b, p, v in zip(self.rows, self.positions, self.values):
            v = v.to(dtype=x.dtype, device=x.device)
            if minus is not None:
                v = v - minus[b, p]
            out[b, p, start : start + v.shape[0]] = v
        return out.reshape(x.shape) if flat else out


def _pre(put: _Put) -> Any:
    def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _with_hidden(args, kwargs, put.write(_hidden_arg(args, kwargs)))

    return hook


def _post(put: _Put) -> Any:
    def hook(_m: nn.Module, _i: Any, out: Any) -> Any:
        return replace_first(out, put.write(first_output(out)))

    return hook


@contextmanager
def patched(lm: LoadedModel, cells: Sequence[Cell | None]) -> Iterator[None]:
    """Inside the block, row b of every batch the model runs gets ``cells[b]`` (None: row b runs unpatched); a
    batch of another size than ``len(cells)`` would be patched wrongly, so give one cell (or None) per row."""
    check_model(lm)
    puts: dict[tuple[int, str, int], _Put] = {}
    for b, c in enumerate(cells):
        if c is not None:
            key = (c.site.layer, c.site.kind, c.site.head if c.site.head is not None else -1)
            put = puts.setdefault(key, _Put(batch=len(cells)))
            put.rows.append(b)
            put.positions.append(int(c.position))
            put.values.append(c.value.detach())
    residual = lm.adapter.residual_kind(lm.config)
    with Hooks() as hooks:
        live: dict[int, torch.Tensor] = {}
        for (layer, kind, head), put in puts.items():
            mods = _modules(lm, layer, kind == "head")
            if kind == "resid_pre":
                hooks.pre(mods.layer, _pre(put), with_kwargs=True)
            elif kind == "resid_post":
                hooks.post(mods.layer, _post(put))
            elif kind == "attn_out":
                hooks.post(mods.attn_out, _post(put))
            elif kind == "mlp_out":
                hooks.post(mods.mlp_out, _post(put))
            elif kind == "head":
                d = int(lm.head_weights(layer).d_head)

                def head_hook(_m: nn.Module, args: tuple[Any, ...], put: _Put = put, s: int = head * d) -> Any:
                    return (put.write(args[0], start=s), *args[1:])

                assert mods.out_proj is not None
                hooks.pre(mods.out_proj, head_hook)
            elif mods.mid is not None:  # resid_mid of a post-norm family: its module's output
                hooks.post(mods.mid, _post(put))
            elif residual == "pre_norm":  # resid_mid = resid_pre + attn_out, written through attn_out
                _mid_hooks(hooks, mods, put, live, layer)
            else:
                raise InputError(f"L{layer}.resid_mid: a parallel block has no resid_mid")
        yield


def _mid_hooks(hooks: Hooks, mods: _Modules, put: _Put, live: dict[int, torch.Tensor], layer: int) -> None:
    """resid_mid of a pre-norm layer: the layer's input kept, and attn_out set to ``value - resid_pre``."""

    def keep(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        live[layer] = _hidden_arg(args, kwargs)

    def write(_m: nn.Module, _i: Any, out: Any) -> Any:
        return replace_first(out, put.write(first_output(out), minus=live[layer]))

    hooks.pre(mods.layer, keep, with_kwargs=True)
    hooks.post(mods.attn_out, write)


@contextmanager
def start_at(lm: LoadedModel, layer: int, resid: torch.Tensor) -> Iterator[None]:
    """Inside the block the model runs layers ``layer..L-1`` only, layer ``layer`` reading ``resid`` ([B, T, D] or
    [T, D], the model's dtype: the stored input of that layer) instead of what the embeddings give; the layer list,
    ``num_hidden_layers`` and ``layer_types`` are restored on exit, even on error (as :func:`tied_layers` does)."""
    with _fed(lm, layer, resid), _cut(lm, layer):
        yield


@contextmanager
def _fed(lm: LoadedModel, layer: int, resid: torch.Tensor) -> Iterator[None]:
    """Layer ``layer`` reads ``resid`` instead of its input (a pre-hook, registered before any other of that layer)."""
    check_model(lm)
    if not 0 <= layer < lm.n_layers:
        raise InputError(f"layer {layer} out of range: the model has {lm.n_layers} layers")

    def feed(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = _hidden_arg(args, kwargs)
        return _with_hidden(args, kwargs, resid.to(dtype=x.dtype, device=x.device).expand_as(x))

    with Hooks() as hooks:
        hooks.pre(lm.adapter.layer_modules(lm.model)[layer], feed, with_kwargs=True)
        yield


@contextmanager
def _cut(lm: LoadedModel, layer: int) -> Iterator[None]:
    """The layer list cut to ``layer..L-1`` (with ``num_hidden_layers`` and ``layer_types``), restored on exit."""
    spec, cfg = lm.adapter.stack(), lm.config
    parent_path, _, attr = spec.layers.rpartition(".")
    parent = get_module(lm.model, parent_path) if parent_path else lm.model
    old_list = getattr(parent, attr)
    saved_n, saved_types = cfg.num_hidden_layers, getattr(cfg, "layer_types", None)
    try:
        if layer:
            setattr(parent, attr, nn.ModuleList(list(old_list)[layer:]))
            cfg.num_hidden_layers = saved_n - layer
            if isinstance(saved_types, list):
                cfg.layer_types = saved_types[layer:]
        yield
    finally:
        setattr(parent, attr, old_list)
        cfg.num_hidden_layers = saved_n
        if isinstance(saved_types, list):
            cfg.layer_types = saved_types


def run_logits(lm: LoadedModel, ids: torch.Tensor, position: int) -> torch.Tensor:
    """The model's own logits [B, V] (float32 at least) at ``position`` of each row of ``ids`` [B, T]: one call of the
    whole model, without a key/value cache (only the last position's logits computed when that is the one asked for)."""
    kwargs: dict[str, Any] = {"input_ids": ids.to(lm.device), "use_cache": False}
    T = ids.shape[1]
    if position in (-1, T - 1) and "logits_to_keep" in inspect.signature(lm.model.forward).parameters:
        kwargs["logits_to_keep"] = 1
        position = -1
    logits = lm.model(**kwargs).logits[:, position]
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


QKV = ("q", "k", "v")


def projection_slice(lm: LoadedModel, layer: int, which: str, head: int) -> tuple[nn.Module, slice]:
    """The module of layer ``layer``'s attention whose output holds head ``head``'s query, key or value (``which``), and
    the columns that hold it: found by its weight (as-is or transposed, a fused q|k|v projection too) equal to the
    head's W_q,h / W_k / W_v of :meth:`~walklens.models.base.Adapter.head_weights`.  With grouped-query attention a key
    or value belongs to the head's key/value head, shared by its group."""
    hw = lm.head_weights(layer)
    w = {"q": hw.w_q[head], "k": hw.w_k[hw.kv_head[head]], "v": hw.w_v[hw.kv_head[head]]}[which].detach()
    d = w.shape[1]
    for module in lm.adapter.attention_module(lm.model, layer).modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype != w.dtype:
            continue
        for rows in (weight, weight.T):  # row convention [D, out]: a Conv1D's weight, a Linear's transposed
            if rows.shape[0] != w.shape[0]:
                continue
            for c in range(0, rows.shape[1] - d + 1, d):
                if torch.equal(rows[:, c : c + d], w):
                    return module, slice(c, c + d)
    raise UnsupportedFamilyError(f"{lm.adapter.family}: no projection holds head {head}'s {which} at layer {layer}")


@contextmanager
def head_input(lm: LoadedModel, layer: int, which: str, head: int, delta: torch.Tensor) -> Iterator[None]:
    """Inside the block head ``head`` of layer ``layer`` computes its query, key or value (``which``) from the layer's
    input plus ``delta`` ([B, T, D], one row per sequence of the batch), through the layer's attention norm and the
    model's own projection module; every other head, and the rest of the layer, reads the input unchanged (path
    patching's receiver: Wang et al. 2022, sec. 3.1)."""
    check_model(lm)
    if which not in QKV:
        raise InputError(f"receiver input {which!r}: give q, k or v")
    module, cols = projection_slice(lm, layer, which, head)
    mod = lm.adapter.layer_modules(lm.model)[layer]
    norm = lm.adapter.stack().norm_module(mod, "attn")
    if norm is None:
        raise UnsupportedFamilyError(f"{lm.adapter.family}: no attention norm found to feed one head's {which}")
    live: dict[str, Any] = {"busy": False}

    def keep(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        live["x"] = _hidden_arg(args, kwargs)

    def swap(m: nn.Module, _i: Any, out: Any) -> Any:
        if live["busy"]:
            return None
        live["busy"] = True
        try:
            x = live["x"]
            alt = m(norm(x + delta.to(dtype=x.dtype, device=x.device)))
        finally:
            live["busy"] = False
        y = first_output(out).clone()
        y[..., cols] = first_output(alt)[..., cols]
        return replace_first(out, y)

    with Hooks() as hooks:
        hooks.pre(mod, keep, with_kwargs=True)
        hooks.post(module, swap)
        yield


@dataclass
class Recorded:
    """One pass's vectors at some sites (``vectors[name]`` [T, D], or [T, H d] for a layer's heads under
    ``L{l}.heads``), the input of every layer (``resid_pre[l]`` [T, D]) and the logits at one position [V]; with
    ``graph``, ``grad_of[name]`` is the tensor of the graph whose gradient is the site's (resid_mid of a pre-norm
    layer: attn_out's), shared by the rows of one batched pass: this run is row ``row`` of it."""

    vectors: dict[str, torch.Tensor]
    resid_pre: list[torch.Tensor]
    logits: torch.Tensor
    grad_of: dict[str, torch.Tensor] = field(default_factory=dict)
    row: int = 0


def record(lm: LoadedModel, ids: torch.Tensor, sites: Sequence[Site], position: int, graph: bool = False) -> Recorded:
    """Run ``ids`` [1, T] once, recording the vectors of ``sites`` (a head site records its layer's z under
    ``L{l}.heads``) and every layer's input, in the model's dtype, cloned; with ``graph`` (attribution patching) the
    embeddings' output becomes a leaf that requires grad, the vectors stay in the autograd graph and the logits
    keep their grad_fn."""
    return record_rows(lm, ids, sites, position, graph)[0]


def record_rows(
    lm: LoadedModel, ids: torch.Tensor, sites: Sequence[Site], position: int, graph: bool = False
) -> list[Recorded]:
    """:func:`record` of every row of ``ids`` [B, T] in one batched pass (rows of one length: no padding); a row's
    vectors equal its own pass's to the batch's rounding, not bit for bit."""
    check_model(lm)
    residual = lm.adapter.residual_kind(lm.config)
    B, T = int(ids.shape[0]), int(ids.shape[1])
    vectors: list[dict[str, torch.Tensor]] = [{} for _ in range(B)]
    grad_of: dict[str, torch.Tensor] = {}
    pre: dict[int, torch.Tensor] = {}

    def keep(name: str, x: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        rows = x.reshape(B, T, x.shape[-1])  # OPT's MLP runs on [B*T, D]
        for b in range(B):
            vectors[b][name] = rows[b] if graph else rows[b].detach().clone()
        if graph:
            grad_of[name] = x if grad is None else grad  # the graph's own tensor (a view of it gets no gradient)

    layers = sorted({s.layer for s in sites} | set(range(lm.n_layers)))
    kinds = {(s.layer, "heads" if s.kind == "head" else s.kind) for s in sites}
    with Hooks() as hooks:
        if graph:
            hooks.post(get_module(lm.model, lm.adapter.embed), lambda _m, _i, o: o.detach().requires_grad_(True))
        for l in layers:
            mods = _modules(lm, l, (l, "heads") in kinds)
            _record_layer(hooks, mods, l, kinds, residual, keep, pre)
        with torch.enable_grad() if graph else torch.no_grad():
            logits = run_logits(lm, ids, position)
    for s in sites:
        if (s.name if s.kind != "head" else f"L{s.layer}.heads") not in vectors[0]:
            raise InputError(f"the forward pass never produced {s.name}")
    return [
        Recorded(
            vectors=vectors[b],
            resid_pre=[pre[l][b] if graph else pre[l][b].detach().clone() for l in range(lm.n_layers)],
            logits=logits[b],
            grad_of=grad_of,
            row=b,
        )
        for b in range(B)
    ]


def _record_layer(
    hooks: Hooks,
    mods: _Modules,
    l: int,
    kinds: set[tuple[int, str]],
    residual: str,
    keep: Any,
    pre: dict[int, torch.Tensor],
) -> None:
    """The recording hooks of one layer (see :func:`record`)."""

    def layer_in(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = _hidden_arg(args, kwargs)
        pre[l] = x
        if (l, "resid_pre") in kinds:
            keep(f"L{l}.resid_pre", x)

    def attn(_m: nn.Module, _i: Any, out: Any) -> None:
        x = first_output(out)
        if (l, "attn_out") in kinds:
            keep(f"L{l}.attn_out", x)
        if (l, "resid_mid") in kinds and mods.mid is None and residual == "pre_norm":
            keep(f"L{l}.resid_mid", pre[l] + x, grad=x)

    hooks.pre(mods.layer, layer_in, with_kwargs=True)
    hooks.post(mods.attn_out, attn)
    if (l, "resid_post") in kinds:
        hooks.post(mods.layer, lambda _m, _i, o: keep(f"L{l}.resid_post", first_output(o)))
    if (l, "mlp_out") in kinds:
        hooks.post(mods.mlp_out, lambda _m, _i, o: keep(f"L{l}.mlp_out", first_output(o)))
    if (l, "resid_mid") in kinds and mods.mid is not None:
        hooks.post(mods.mid, lambda _m, _i, o: keep(f"L{l}.resid_mid", first_output(o)))
    if (l, "heads") in kinds and mods.out_proj is not None:
        hooks.pre(mods.out_proj, lambda _m, a: keep(f"L{l}.heads", a[0]))


@contextmanager
def patched_from(
    lm: LoadedModel, layer: int | None, resid: torch.Tensor | None, cells: Sequence[Cell | None]
) -> Iterator[None]:
    """:func:`patched` inside :func:`start_at` (``layer`` None: the whole model runs)."""
    with ExitStack() as stack:
        if layer is not None and resid is not None:
            stack.enter_context(_fed(lm, layer, resid))
        stack.enter_context(patched(lm, cells))  # its modules found before the list is cut
        if layer is not None and resid is not None:
            stack.enter_context(_cut(lm, layer))
        yield


__all__ = [
    "KINDS",
    "Site",
    "Cell",
    "check_model",
    "parse_site",
    "n_heads",
    "out_projection",
    "patched",
    "start_at",
    "patched_from",
    "QKV",
    "projection_slice",
    "head_input",
    "record",
    "record_rows",
    "Recorded",
    "run_logits",
]
