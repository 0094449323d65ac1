"""The interventions: the one place where walklens changes a model, each change undone on exit (seed 002).

Hook plumbing is not here: every hook walklens registers, these interventions' included, goes through
:class:`~walklens.base.hooks.Hooks` (:mod:`walklens.base.hooks`, at the bottom of the layers), which removes every
one of them on exit, even on error.  Each intervention is a context manager that restores the model **bit for bit** on
exit, even when the body raises (every parameter and buffer ``torch.equal`` to before; no hook left; layer list and
config back):

  * :func:`ablate_mlps` -- every feed-forward contribution (``mlp_out``) zeroed (seed 002's simplified layer
    "disregarding the feedforward neural network");
  * :func:`add_to_residual` -- activation addition: ``alpha v`` added to the residual at some layers' outputs
    (also the mean-difference steering of contrastive pairs, with ``v`` their mean residual difference); a batch of
    doses in one pass takes one ``alpha`` (and/or one ``v``) per sequence of the batch;
  * :func:`ablate_direction` -- projection ablation: the residual's component along a unit ``u`` removed at
    some layers' outputs (the steering card's control);
  * :func:`edit_weights` -- in-place additions to parameters, copied back on exit; :func:`edit_named` the same by
    parameter name, which also edits a streamed model's layers (each time a layer is read from disk; the files are
    never written); :func:`eigen_edit` uses it for eigen-steering's rank-one W_O edit ``F' = F + alpha w u^T``
    (seed 002; :mod:`walklens.analyses.steering`);
  * :func:`tied_layers` -- one layer's module applied n times (seed 002's shared-weight case);
  * :func:`upcast` -- some parameters and buffers held in a wider dtype (a bfloat16 model's head read in
    float32, :mod:`walklens.analyses.walks`);
  * :func:`attention_kernel` -- the model's attention computed by PyTorch's SDPA instead of eager attention,
    for forward passes that report no attention probabilities (packed scoring, :mod:`walklens.core.scoring.packing`);
  * :func:`prepacked_linears` -- a bfloat16/float16 model's linear layers run from weights reordered once for
    the matrix library, bit for bit the same products (packed scoring; docs/dtype.md); the machinery,
    oneDNN's reordered weights and their exactness check, is :mod:`walklens.core.prepack`.

During batched generation (:func:`walklens.core.generation.generate_batch`) every intervention acts on each
sequence of the batch as on that sequence alone (tests/test_generation_interventions.py); a weight edit
(:func:`edit_weights`, :func:`eigen_edit`) is one model for the whole batch, so one dose per pass.

On a streamed model (:mod:`walklens.core.streaming`) every intervention acts on the layers as they are read, bit
for bit as in memory (tests/test_streaming_interventions.py); a parameter of a streamed layer is on ``meta``
between forward passes, so :func:`edit_weights` and :func:`upcast` refuse it in one line (:func:`edit_named`
edits it).

Layers are 0-based and may be negative (from the top).  A shared-weight stack (ALBERT) has one module at
every depth, which is hooked or edited once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..base.errors import InputError, UnsupportedFamilyError
from ..base.hooks import Hooks, distinct, first_output, replace_first
from ..models.base import get_module
from .ov import ov_factors, value_projection
from .prepack import packed_linear

if TYPE_CHECKING:
    from .loading import LoadedModel


def resolve_layers(lm: LoadedModel, layers: int | Sequence[int]) -> list[int]:
    """Layer indices as a list of distinct non-negative ints (negative: from the top); refuses out-of-range."""
    L = lm.n_layers
    given = [layers] if isinstance(layers, int) else list(layers)
    if not given:
        raise InputError("no layers given")
    out: list[int] = []
    for l in given:
        l = int(l) + L if int(l) < 0 else int(l)
        if not 0 <= l < L:
            raise InputError(f"layer {l} out of range: the model has {L} layers")
        if l not in out:
            out.append(l)
    return out


# ---- hook interventions ----------------------------------------------------------------------------------------


@contextmanager
def ablate_mlps(lm: LoadedModel) -> Iterator[None]:
    """Zero every layer's feed-forward contribution (the ``mlp_out`` module's output) inside the block."""
    spec = lm.adapter.stack()

    def zero(_m: nn.Module, _inp: Any, output: Any) -> Any:
        return replace_first(output, torch.zeros_like(first_output(output)))

    with Hooks() as hooks:
        for layer in distinct(lm.adapter.layer_modules(lm.model)):
            hooks.post(get_module(layer, spec.mlp_out), zero)
        yield


@contextmanager
def add_to_residual(
    lm: LoadedModel, layers: int | Sequence[int], vector: torch.Tensor, alpha: float | Sequence[float] = 1.0
) -> Iterator[None]:
    """Activation addition: ``alpha * vector`` ([D]) added to the residual stream at the output of ``layers``
    (every position), inside the block.  A batch of doses in one pass: ``alpha`` one number per sequence of the
    batch and/or ``vector`` one row per sequence ([B, D]); sequence b gets ``alpha[b] * vector[b]``, the very
    numbers it gets alone with its own dose (and a batch of another size is refused in one line)."""
    mods = lm.adapter.layer_modules(lm.model)
    ls = resolve_layers(lm, layers)
    delta = _deltas(vector, alpha)

    def add(_m: nn.Module, _inp: Any, output: Any) -> Any:
        h = first_output(output)
        if delta.dim() == 3 and delta.shape[0] != h.shape[0]:
            raise InputError(f"{delta.shape[0]} per-sequence doses for a batch of {h.shape[0]} sequences")
        return replace_first(output, h + delta.to(dtype=h.dtype, device=h.device))

    with Hooks() as hooks:
        for m in distinct(mods[l] for l in ls):
            hooks.post(m, add)
        yield


def _deltas(vector: torch.Tensor, alpha: float | Sequence[float]) -> torch.Tensor:
    """``alpha * vector`` [D], or one row per sequence [B, 1, D] when ``alpha`` is a sequence or ``vector`` [B, D]:
    each row computed as its sequence's own scalar dose would be (the same bits)."""
    if isinstance(alpha, (int, float)):
        if vector.dim() == 1:
            return alpha * vector
        alphas = [float(alpha)] * vector.shape[0]
    else:
        alphas = [float(a) for a in alpha]
    vectors = list(vector) if vector.dim() == 2 else [vector] * len(alphas)
    if len(alphas) != len(vectors):
        raise InputError(f"{len(alphas)} doses for {len(vectors)} vectors: give one dose, or one per vector")
    if not alphas:
        raise InputError("no per-sequence dose given")
    return torch.stack([a * v for a, v in zip(alphas, vectors)])[:, None, :]


@contextmanager
def ablate_direction(lm: LoadedModel, layers: int | Sequence[int], u: torch.Tensor) -> Iterator[None]:
    """Projection ablation: ``h - (h . u) u`` (``u`` a unit [D] vector) at the output of ``layers`` (every
    position), inside the block; the component along ``u`` is computed in float32 at least."""
    mods = lm.adapter.layer_modules(lm.model)
    ls = resolve_layers(lm, layers)
    unit = u.detach().flatten() / u.detach().flatten().norm()

    def ablate(_m: nn.Module, _inp: Any, output: Any) -> Any:
        h = first_output(output)
        v = unit.to(dtype=torch.promote_types(h.dtype, torch.float32), device=h.device)
        hv = h.to(v.dtype)
        return replace_first(output, (hv - (hv @ v).unsqueeze(-1) * v).to(h.dtype))

    with Hooks() as hooks:
        for m in distinct(mods[l] for l in ls):
            hooks.post(m, ablate)
        yield


# ---- weight edits ----------------------------------------------------------------------------------------------


@contextmanager
def edit_weights(deltas: Sequence[tuple[nn.Parameter, torch.Tensor]]) -> Iterator[None]:
    """Add each delta to its parameter in place (cast to the parameter's dtype and device) inside the block;
    on exit every edited parameter gets its saved copy back, bit for bit, even on error.  A parameter on ``meta``
    (a streamed layer's) is refused in one line: :func:`edit_named` edits it."""
    if any(p.device.type == "meta" for p, _ in deltas):
        raise InputError(
            "a streamed layer's parameter is read from disk when the layer runs and cannot be edited in place; "
            "edit it by name (edit_named)"
        )
    saved: list[tuple[nn.Parameter, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for p, d in deltas:
                saved.append((p, p.detach().clone()))
                p.add_(d.to(dtype=p.dtype, device=p.device))
        yield
    finally:
        with torch.no_grad():
            for p, old in reversed(saved):
                p.copy_(old)


def _streamed_layer(lm: LoadedModel, name: str) -> str | None:
    """The path of the streamed layer the parameter ``name`` lies in, or None (in memory, or resident)."""
    if lm.stream is None:
        return None
    return next((path for path in lm.stream.layers if name.startswith(path + ".")), None)


@contextmanager
def edit_named(lm: LoadedModel, deltas: Sequence[tuple[str, torch.Tensor]]) -> Iterator[None]:
    """:func:`edit_weights` with each parameter named by its path in ``lm.model``
    (``model.layers.1.self_attn.o_proj.weight``).  On a streamed model a streamed layer's parameter gets its
    delta each time the layer is read (:meth:`~walklens.core.streaming.LayerStream.edited`), the same numbers as in
    memory; released, the edit is gone with the weights; the files are never written."""
    params = dict(lm.model.named_parameters(remove_duplicate=False))
    direct: list[tuple[nn.Parameter, torch.Tensor]] = []
    streamed: list[tuple[str, str, torch.Tensor]] = []
    for name, d in deltas:
        if name not in params:
            raise InputError(f"the model has no parameter {name[:80]!r}")
        layer = _streamed_layer(lm, name)
        if layer is None:
            direct.append((params[name], d))
        else:
            streamed.append((layer, name[len(layer) + 1 :], d))
    with ExitStack() as stack:
        for layer, name, d in streamed:
            assert lm.stream is not None
            stack.enter_context(lm.stream.edited(layer, name, d))
        stack.enter_context(edit_weights(direct))
        yield


@dataclass
class SteerEdit:
    """One edited attention module: its first layer, the edited parameter, ``reach`` = |P u| (1: u is in the
    layer's value space) and ``error`` = max |(F' - F) - alpha w u^T| / max |alpha w u^T| measured on the
    edited weights (float32 rounding only)."""

    layer: int
    param: str
    reach: float
    error: float
    shared_with: list[int] = field(default_factory=list)


def _out_param(attn: nn.Module, B: torch.Tensor) -> tuple[str, nn.Parameter, bool]:
    """The parameter of ``attn`` that stores B ([H d, D], row convention) as-is or transposed (exact match)."""
    found = []
    for name, p in attn.named_parameters():
        if p.dim() != 2:
            continue
        pd = p.detach().double().cpu()
        if pd.shape == B.shape and torch.equal(pd, B):
            found.append((name, p, False))
        elif pd.shape == B.T.shape and torch.equal(pd, B.T):
            found.append((name, p, True))
    if len(found) != 1:
        raise UnsupportedFamilyError(f"could not locate W_O uniquely in {type(attn).__name__} ({len(found)} matches)")
    return found[0]


@contextmanager
def eigen_edit(
    lm: LoadedModel, layers: int | Sequence[int], u: torch.Tensor, alpha: float
) -> Iterator[list[SteerEdit]]:
    """Eigen-steering's weight edit (seed 002): W_O of each layer gets ``dB = alpha A^+ w u^T`` (minimum norm)
    so that ``F' = F + alpha w u^T`` with ``w = P u`` (:func:`~walklens.core.ov.value_projection`); ``u`` is a unit
    direction [D] (float64).  Yields one :class:`SteerEdit` per edited module, its error measured on the
    edited weights.  Weights are restored bit for bit on exit (:func:`edit_weights`)."""
    mods = lm.adapter.layer_modules(lm.model)
    plan: list[tuple[int, str, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # layer, param, A, B, w
    deltas: list[tuple[str, torch.Tensor]] = []
    paths = {id(m): path for path, m in lm.model.named_modules()}
    by_module: dict[int, list[int]] = {}
    for l in resolve_layers(lm, layers):
        if id(mods[l]) in by_module:
            by_module[id(mods[l])].append(l)
            continue
        by_module[id(mods[l])] = [l]
        with lm.held(l):  # (a streamed layer's weights read for the block)
            hw = lm.adapter.head_weights(lm.model, l)
            A, B = ov_factors(lm, l, hw=hw)
            attn = lm.adapter.attention_module(lm.model, l)
            name, _, transposed = _out_param(attn, B)
        z, w = value_projection(A, u)
        dB = alpha * torch.outer(z, u)  # A dB = alpha w u^T
        deltas.append((f"{paths[id(attn)]}.{name}", dB.T if transposed else dB))
        plan.append((l, name, A, B, w))
    with edit_named(lm, deltas):
        edits = []
        for l, name, A, B, w in plan:
            A2, B2 = ov_factors(lm, l, grouped=True)
            target = alpha * torch.outer(w, u)
            realised = A2 @ B2 - A @ B
            scale = target.abs().max().item()
            err = (realised - target).abs().max().item() / scale if scale > 0 else realised.abs().max().item()
            edits.append(
                SteerEdit(layer=l, param=name, reach=float(w.norm()), error=err, shared_with=by_module[id(mods[l])])
            )
        yield edits


# ---- layer tying -----------------------------------------------------------------------------------------------


@contextmanager
def tied_layers(lm: LoadedModel, layer: int, n_layers: int) -> Iterator[LoadedModel]:
    """Temporarily turn the model into a weight-tied one: layer ``layer``'s module applied ``n_layers`` times
    (seed 002's shared-weight case).  For an already shared stack (ALBERT) only the depth changes.  Inside the
    block the model runs without a key/value cache by default (``config.use_cache = False``: every use of the
    one module has the same cache index).  The layer list and config are restored on exit, even on error; no
    weight is copied or changed."""
    spec = lm.adapter.stack()
    cfg = lm.config
    layer = resolve_layers(lm, layer)[0]
    if n_layers < 1:
        raise InputError("n_layers must be at least 1")
    if lm.is_encoder_decoder:
        raise UnsupportedFamilyError("weight-tied variants of encoder-decoder models are not supported")
    saved_n, had_cache, saved_cache = cfg.num_hidden_layers, hasattr(cfg, "use_cache"), getattr(cfg, "use_cache", None)
    saved_types = getattr(cfg, "layer_types", None)
    parent_path, _, attr = spec.layers.rpartition(".")
    parent = get_module(lm.model, parent_path) if parent_path else lm.model
    old_list = getattr(parent, attr)
    try:
        if not spec.shared_layer:
            setattr(parent, attr, nn.ModuleList([old_list[layer]] * n_layers))
            if isinstance(saved_types, list):
                cfg.layer_types = [saved_types[layer]] * n_layers
        cfg.num_hidden_layers = n_layers
        cfg.use_cache = False
        yield lm
    finally:
        setattr(parent, attr, old_list)
        cfg.num_hidden_layers = saved_n
        if had_cache:
            cfg.use_cache = saved_cache
        else:
            del cfg.use_cache
        if isinstance(saved_types, list):
            cfg.layer_types = saved_types


# ---- precision and attention kernels ------------------------------------------------------------------------------


def outside_layers(lm: LoadedModel) -> list[torch.Tensor]:
    """Every parameter and buffer of the model outside its layer stacks: the embeddings, the final norms and
    the head (what reads a captured vector against the vocabulary)."""
    inside = tuple(spec.layers + "." for spec in lm.adapter.stacks)
    named = list(lm.model.named_parameters()) + list(lm.model.named_buffers())
    return list({id(t): t for name, t in named if not name.startswith(inside)}.values())


@contextmanager
def upcast(tensors: Iterable[torch.Tensor], dtype: torch.dtype = torch.float32) -> Iterator[None]:
    """Each floating-point parameter or buffer in ``tensors`` holds its values in ``dtype`` inside the block
    (a bfloat16 or float16 number converts to float32 exactly), so modules that use them compute in ``dtype``;
    on exit each gets its original storage back, bit for bit, even on error.  Shared (tied) tensors change
    once, wherever they are used.  A tensor on ``meta`` (a streamed layer's, read when the layer runs) is refused in
    one line."""
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    distinct_tensors = {id(t): t for t in tensors}
    if any(t.device.type == "meta" for t in distinct_tensors.values()):
        raise InputError(
            "a streamed layer's weights are read from disk when the layer runs: upcast holds only tensors in "
            "memory (the embeddings, final norm and head)"
        )
    try:
        for t in distinct_tensors.values():
            if t.is_floating_point() and t.dtype != dtype:
                saved.append((t, t.data))
                t.data = t.data.to(dtype)
        yield
    finally:
        for t, data in reversed(saved):
            t.data = data


def sdpa_possible(lm: LoadedModel) -> bool:
    """Whether the model's attention can be switched to SDPA at run time (transformers' attention interface)."""
    model = lm.hf
    return bool(getattr(model, "_supports_sdpa", False) and model._can_set_attn_implementation())


@contextmanager
def attention_kernel(lm: LoadedModel, kernel: str = "sdpa") -> Iterator[bool]:
    """Inside the block the model's attention runs as ``kernel`` (``"sdpa"``: PyTorch's fused
    scaled-dot-product attention, which takes the same 4-D float masks; it returns no attention
    probabilities, so only forward passes that need none may use it).  Yields whether the switch happened (a
    model whose attention cannot be switched stays as it is); the previous implementation is set back on exit,
    even on error."""
    model = lm.hf
    before = lm.config._attn_implementation
    if kernel == before or not sdpa_possible(lm):
        yield kernel == before
        return
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model.set_attn_implementation(kernel)
    finally:
        hf_logging.set_verbosity(level)
    try:
        yield True
    finally:
        hf_logging.set_verbosity_error()
        try:
            model.set_attn_implementation(before)
        finally:
            hf_logging.set_verbosity(level)


@contextmanager
def prepacked_linears(lm: LoadedModel, enabled: bool = True) -> Iterator[int]:
    """Inside the block every plain ``nn.Linear`` of a CPU bfloat16/float16 model computes its product from a
    weight reordered once for oneDNN (:func:`walklens.core.prepack.packed_linear`), instead of reordering it at every
    call (``F.linear``).  A layer is switched only where its products equal ``F.linear``'s bit for bit on probe
    rows; float32 (MKL's products) never is.  Hooks on the layers still run; no parameter changes; the layers'
    own ``forward`` is back on exit, even on error.  Yields the number of layers switched.  For forward passes
    under ``torch.no_grad`` (no gradient flows through the prepacked weight)."""
    switched: list[tuple[nn.Linear, Any]] = []
    try:
        if enabled:
            for mod in [m for m in lm.hf.modules() if isinstance(m, nn.Linear) and type(m) is nn.Linear]:
                product = packed_linear(mod)
                if product is not None:
                    switched.append((mod, mod.__dict__.get("forward")))
                    mod.forward = product  # type: ignore[method-assign,assignment]  # an instance's forward, undone below
        yield len(switched)
    finally:
        for mod, own in switched:
            if own is None:
                del mod.forward
            else:
                mod.forward = own  # type: ignore[method-assign]  # the instance's own forward back


__all__ = [
    "prepacked_linears",
    "ablate_mlps",
    "add_to_residual",
    "ablate_direction",
    "edit_weights",
    "edit_named",
    "eigen_edit",
    "tied_layers",
    "SteerEdit",
    "upcast",
    "outside_layers",
    "attention_kernel",
]
