"""Position kernels and self-bias statistics (seed 000, sec. 2.2.1 "Position Weighted Bag of Words", A.2,
Figs. 6 and 8).

A head's *position kernel* k_h(delta) is how much the relative position ``delta = key - query`` adds to its
attention, like a 1-D convolution kernel.  :func:`position_kernels` gives it for every supported family:

- **T5 relative buckets** (``scheme="t5_relative"``): read straight from the weights --
  ``relative_attention_bias.weight[bucket(delta), h]`` with the model's own ``_relative_position_bucket``
  (encoder bidirectional, decoder causal).  Units: logits added to q.k.  T5 stores the bias in layer 0 of each
  stack and every layer reuses it, so there is one kernel per head and stack.
- **ALiBi** (``scheme="alibi"``; Falcon, BLOOM, MPT): ``k_h(delta) = slope_h * delta * scale``, measured, not
  assumed: one forward pass with every attention module's input set to zero removes q.k, so the attention is
  the softmax of the additive position bias alone (see :func:`position_only_attention`); each head's logit
  slope is fitted to its log-ratios.  ``slope_h`` are the slopes of the model's own ALiBi builder and
  ``scale`` is fitted to the measured slopes: BLOOM and MPT add the bias unscaled (scale 1); Falcon's
  declared scale is 1/sqrt(d), but transformers 5.x's eager Falcon path adds the ALiBi term twice (once
  inside the attention mask), so the measured scale there is 2/sqrt(d) -- walklens reports what the model
  does.
- **Rotary / learned absolute positions** (``scheme="empirical"``): no additive bias exists, so the kernel is
  estimated as the *mean attention weight by relative distance over shuffled-token inputs*:

      k_h(delta) = mean over samples s, mean over query rows i in Q of A_h^(s)[i, i + delta]

  Each sample is a random permutation of ``length`` tokens drawn from a corpus (shuffling destroys word
  order, so what remains systematic is position).  Q is the same set of rows for every delta -- rows that see
  every distance in the window and never use key position 0 (often an attention sink, an absolute-position
  effect): causal ``Q = {W+1, ..., T-1}``, bidirectional ``Q = {W, ..., T-1-W}`` for window W.  Spread: the
  standard deviation over samples of the per-sample kernel (``spread``) and a 95% confidence half-width
  ``1.96 * std / sqrt(samples)`` (``ci95``).  Units: attention weight (probability).  One kernel per layer and
  head.

**Self-bias classes** (:func:`classify_kernel`) work in logit units: T5/ALiBi kernels as they are, empirical
kernels as ``log`` of the mean weight (differences of log mean weights are log-ratios, comparable to logit
differences because every distance is averaged over the same rows).  With margin m (default 0.1 nats):

- *negative self-bias*: ``k(0) < mean(k(-1), k(+1)) - m`` (causal kernels: ``k(0) < k(-1) - m``) -- the
  query's own position is attenuated relative to its neighbours (A.2);
- *far-amplifying*: on some side, the mean over the far band ``far_from <= |delta| <= W`` exceeds the mean
  over the intermediate band ``3 <= |delta| < far_from`` by m (``far_from = max(4, W // 4)``; Fig. 8);
- *local*: the mean over ``|delta| <= 2`` exceeds the mean over ``|delta| > 2`` by m;
- *flat*: ``max k - min k < m``.

Flags are independent (a head can be both negative-self-bias and far-amplifying); ``label`` is the first of
flat, negative self-bias, far-amplifying, local, other.  Fractions are reported per stack, also for a sweep
of margins.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from .capture import attention_probs, context_limit
from .display import Shown
from .errors import InputError, utf8_text
from .frames import Columns, DataFrame, concat_columns, frame, long_table, pick, record_table
from .hooks import Hooks, distinct
from .models.base import get_module

if TYPE_CHECKING:
    from transformers.models.t5.modeling_t5 import T5Attention

    from .loading import LoadedModel

CLASSES = ("negative_self", "far_amplifying", "local", "flat")
LABELS = {
    "flat": "flat",
    "negative_self": "negative self-bias",
    "far_amplifying": "far-amplifying",
    "local": "local",
    "other": "other",
}
MARGIN_SWEEP = (0.0, 0.1, 0.25, 0.5, 1.0)

#: Default corpus for empirical kernels: plain prose (its words are shuffled, so only its vocabulary matters).
DEFAULT_CORPUS = (
    "The river runs through the old city and past the market where farmers sell bread, cheese and apples. "
    "In the morning the streets are quiet; by noon they are full of people, bicycles and small delivery vans. "
    "A teacher walks her class to the museum to look at paintings of ships, storms and distant mountains. "
    "The library on the hill keeps maps, letters and books written by travellers who crossed the sea. "
    "Children play football in the park while their parents talk about work, prices and the weather. "
    "At night the lights of the bridge shine on the water and the last train leaves the station at eleven. "
    "Scientists at the university study how plants grow in dry soil and how birds find their way home. "
    "The king and the queen of the story lived in a castle with a garden, a tower and a long stone wall. "
    "My friend bought a red car, a blue bicycle and three green chairs for the house near the forest. "
    "Every winter the lake freezes and the village holds a festival with music, food and a race on the ice."
)


# ---- classification --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelClass:
    """Flags of one kernel (see the module docstring) and its label."""

    negative_self: bool
    far_amplifying: bool
    local: bool
    flat: bool

    @property
    def label(self) -> str:
        for k in ("flat", "negative_self", "far_amplifying", "local"):
            if getattr(self, k):
                return LABELS[k]
        return LABELS["other"]


def _mean_at(k: torch.Tensor, sel: torch.Tensor) -> float | None:
    return float(k[sel].mean()) if bool(sel.any()) else None


def classify_kernel(values: torch.Tensor, distances: Sequence[int], margin: float = 0.1) -> KernelClass:
    """Classify one kernel given in logit units (``values[i]`` at ``distances[i] = key - query``)."""
    k = torch.as_tensor(values, dtype=torch.float64)
    dist = torch.as_tensor(list(distances), dtype=torch.long)
    if k.shape != dist.shape or not bool((dist == 0).any()):
        raise InputError("a kernel needs one value per distance, including distance 0")
    W = int(dist.abs().max())
    self_v = float(k[dist == 0][0])
    neigh = _mean_at(k, dist.abs() == 1)
    negative_self = neigh is not None and self_v < neigh - margin
    far_from = max(4, W // 4)
    far_amp = False
    for side in (-1, 1):
        s = dist * side
        far = _mean_at(k, (s >= far_from) & (s <= W))
        mid = _mean_at(k, (s >= 3) & (s < far_from))
        if far is not None and mid is not None and far > mid + margin:
            far_amp = True
    near = _mean_at(k, dist.abs() <= 2)
    rest = _mean_at(k, dist.abs() > 2)
    local = near is not None and rest is not None and near > rest + margin
    flat = float(k.max() - k.min()) < margin
    return KernelClass(negative_self, far_amp, local, flat)


# ---- results -----------------------------------------------------------------------------------------------


@dataclass
class StackKernels:
    """Kernels of one stack: ``values`` [K, H, n] at ``distances`` (key - query), one row per entry of
    ``layers`` (``None``: one kernel shared by every layer).  ``log_values`` are the logit-unit kernels the
    classes use; ``spread``/``ci95`` (empirical only) the std over samples and 95% CI half-width."""

    stack: str
    causal: bool
    distances: list[int]
    layers: list[int | None]
    values: torch.Tensor
    log_values: torch.Tensor
    spread: torch.Tensor | None = None
    ci95: torch.Tensor | None = None
    classes: list[list[KernelClass]] = field(default_factory=list)
    #: empirical only: the per-sample kernels [N, K, H, n] the mean, spread and self-bias tests come from
    samples: torch.Tensor | None = field(default=None, repr=False)
    #: empirical only: rows renormalised without key 0 (the attention-sink control)
    sink_removed: bool = False

    @property
    def n_heads(self) -> int:
        return self.values.shape[1]

    def fractions(self, margin: float | None = None) -> dict[str, float]:
        """Fraction of kernels (layer x head) with each flag, and per label."""
        cls = self.classes if margin is None else self._classify(margin)
        flat = [c for row in cls for c in row]
        n = max(len(flat), 1)
        out = {k: sum(getattr(c, k) for c in flat) / n for k in CLASSES}
        for lab in LABELS.values():
            out[f"label: {lab}"] = sum(c.label == lab for c in flat) / n
        return out

    def _classify(self, margin: float) -> list[list[KernelClass]]:
        return [
            [classify_kernel(self.log_values[r, h], self.distances, margin) for h in range(self.n_heads)]
            for r in range(self.values.shape[0])
        ]

    def classify(self, margin: float) -> None:
        self.classes = self._classify(margin)

    def kernel(self, head: int, layer: int | None = None) -> torch.Tensor:
        """The kernel of one head (of ``layer`` for per-layer kernels)."""
        row = 0 if self.layers == [None] else self.layers.index(layer if layer is not None else self.layers[0])
        return self.values[row, head]


@dataclass
class PositionKernels(Shown, view="kernels"):
    """Position kernels of a model, per stack, with their self-bias classes (seed 000, A.2)."""

    model_name: str
    scheme: str
    units: str
    estimator: str
    margin: float
    stacks: list[StackKernels]
    notes: str = ""
    alibi_slopes: torch.Tensor | None = None
    alibi_scale: float | None = None

    def stack(self, name: str) -> StackKernels:
        for s in self.stacks:
            if s.stack == name:
                return s
        raise InputError(f"no stack {name!r}; stacks: {[s.stack for s in self.stacks]}")

    def fractions(self, margin: float | None = None) -> dict[str, dict[str, float]]:
        """Per stack: fraction of kernels in each class (at ``margin``, default the one used)."""
        return {s.stack or "model": s.fractions(margin) for s in self.stacks}

    def margin_sweep(self, margins: Sequence[float] = MARGIN_SWEEP) -> dict[str, dict[str, dict[str, float]]]:
        """Fractions of negative-self-bias and far-amplifying kernels per stack for several margins."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for s in self.stacks:
            out[s.stack or "model"] = {
                f"{m:g}": {k: v for k, v in s.fractions(m).items() if k in ("negative_self", "far_amplifying")}
                for m in margins
            }
        return out

    def _columns(self, table: str = "kernels") -> Columns:
        """The plain columns of :meth:`to_pandas`."""

        def kernels() -> Columns:
            parts = []
            for s in self.stacks:
                cells = {"value": s.values.float(), "log_value": s.log_values.float()}
                for name in ("spread", "ci95"):
                    t = getattr(s, name)
                    cells[name] = t.float() if t is not None else torch.full(tuple(s.values.shape), math.nan)
                parts.append(
                    long_table(
                        [("layer", list(s.layers)), ("head", range(s.n_heads)), ("distance", list(s.distances))],
                        cells,
                        constants={"stack": s.stack, "causal": s.causal},
                    )
                )
            return concat_columns(parts)

        def classes() -> Columns:
            return record_table(
                [
                    {
                        "stack": s.stack,
                        "layer": layer,
                        "head": h,
                        **{k: getattr(c, k) for k in CLASSES},
                        "label": c.label,
                    }
                    for s in self.stacks
                    for layer, row in zip(s.layers, s.classes)
                    for h, c in enumerate(row)
                ]
            )

        def fractions() -> Columns:
            return record_table(
                [
                    {"stack": s.stack, "margin": self.margin, "name": k, "fraction": v}
                    for s in self.stacks
                    for k, v in s.fractions().items()
                ]
            )

        def margin_sweep() -> Columns:
            return record_table(
                [
                    {"stack": s.stack, "margin": float(m), "name": k, "fraction": v}
                    for s in self.stacks
                    for m in MARGIN_SWEEP
                    for k, v in s.fractions(m).items()
                    if k in ("negative_self", "far_amplifying")
                ]
            )

        def alibi() -> Columns:
            slopes = self.alibi_slopes if self.alibi_slopes is not None else torch.zeros(0)
            return long_table([("head", range(len(slopes)))], {"slope": slopes.float()})

        return pick(
            table,
            {
                "kernels": kernels,
                "classes": classes,
                "fractions": fractions,
                "margin_sweep": margin_sweep,
                "alibi": alibi,
            },
            "PositionKernels",
        )

    def to_pandas(self, table: str = "kernels") -> DataFrame:
        """The kernels as tables (pandas; docs/notebooks.md, "Tables"): ``kernels`` one row per (stack, layer,
        head, distance) (``layer`` missing for a kernel every layer shares); ``classes`` the self-bias classes
        per (stack, layer, head); ``fractions`` (at this margin) and ``margin_sweep`` the fractions per class;
        ``alibi`` the ALiBi slopes per head."""
        return frame(
            self._columns(table),
            {
                "model": self.model_name,
                "scheme": self.scheme,
                "units": self.units,
                "estimator": self.estimator,
                "margin": self.margin,
                "notes": self.notes,
                "alibi_scale": self.alibi_scale,
            },
        )


# ---- T5 ----------------------------------------------------------------------------------------------------


def _t5_bias_modules(lm: LoadedModel, stack: str) -> list[tuple[int, T5Attention]]:
    mods = []
    for l in range(lm.n_layers):
        attn = lm.adapter.attention_module(lm.model, l, stack)
        if getattr(attn, "has_relative_attention_bias", False):
            mods.append((l, cast("T5Attention", attn)))  # T5's attention (or a copy of its layout)
    return mods


def t5_kernel_values(attn: T5Attention, distances: Sequence[int]) -> torch.Tensor:
    """[H, n]: ``relative_attention_bias.weight[bucket(delta), h]`` via the module's own bucket function."""
    rel = torch.tensor(list(distances), dtype=torch.long)
    buckets = attn._relative_position_bucket(
        rel,
        bidirectional=not attn.is_decoder,
        num_buckets=attn.relative_attention_num_buckets,
        max_distance=attn.relative_attention_max_distance,
    )
    return attn.relative_attention_bias.weight.detach().float().cpu()[buckets].T.contiguous()


def _t5_kernels(lm: LoadedModel, max_distance: int | None) -> tuple[list[StackKernels], str]:
    out = []
    for spec in lm.adapter.stacks:
        mods = _t5_bias_modules(lm, spec.name)
        if not mods:
            continue
        W = max_distance or int(mods[0][1].relative_attention_max_distance)
        causal = bool(mods[0][1].is_decoder)
        dist = list(range(-W, 1)) if causal else list(range(-W, W + 1))
        vals = torch.stack([t5_kernel_values(m, dist) for _, m in mods])
        layers: list[int | None] = [None] if [l for l, _ in mods] == [0] else [l for l, _ in mods]
        out.append(StackKernels(spec.name, causal, dist, layers, vals, vals.clone()))
    return out, (
        "read from relative_attention_bias through the model's _relative_position_bucket; layer 0's "
        "bias is reused by every layer of its stack"
    )


# ---- position-only probe and ALiBi -------------------------------------------------------------------------


def _attention_modules(lm: LoadedModel, stack: str) -> list[torch.nn.Module]:
    spec = lm.adapter.stack(stack)
    return [get_module(layer, spec.attn) for layer in lm.adapter.layer_modules(lm.model, stack)]


@torch.no_grad()
def position_only_attention(lm: LoadedModel, length: int = 32) -> torch.Tensor:
    """Attention [L, H, T, T] of a forward pass in which every self-attention module's input is zero.

    Then q and k are constant (their biases), so q.k is the same for every key and each row is the softmax of
    the additive position bias (T5 buckets, ALiBi) plus the mask; rotary and learned-absolute models give
    uniform rows.  Decoder-only and encoder-only families.
    """
    if lm.is_encoder_decoder:
        raise InputError("the position-only probe supports decoder-only and encoder-only models")
    spec = lm.adapter.stacks[-1]
    modules = _attention_modules(lm, spec.name)
    store: list[torch.Tensor] = []

    def zero(
        _m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if args:
            return (torch.zeros_like(args[0]),) + tuple(args[1:]), kwargs
        kwargs = dict(kwargs, hidden_states=torch.zeros_like(kwargs["hidden_states"]))
        return args, kwargs

    def keep(_m: torch.nn.Module, _i: Any, out: Any) -> None:
        w = attention_probs(out)
        if w is not None:
            store.append(w.detach()[0].float().cpu())

    ids = _token_pool(lm, DEFAULT_CORPUS)[:length].unsqueeze(0).to(lm.device)
    if ids.shape[1] < length:
        ids = ids.repeat(1, math.ceil(length / ids.shape[1]))[:, :length]
    with Hooks() as hooks:
        for m in distinct(modules):  # a shared module once
            hooks.pre(m, zero, with_kwargs=True)
            hooks.post(m, keep)
        lm.model(input_ids=ids)
    return torch.stack(store)


def _declared_alibi_slopes(lm: LoadedModel, H: int) -> torch.Tensor | None:
    """The ALiBi slopes [H] from the model's own builder, when its modeling module has one transformers uses:
    ``build_alibi_tensor(mask, H, dtype)`` (BLOOM, Falcon; ``slope_h * key``) or ``build_mpt_alibi_tensor(H, T)``
    (MPT; ``slope_h * (key - T + 1)``)."""
    mod = sys.modules[type(lm.model).__module__]
    if hasattr(mod, "build_alibi_tensor"):
        return mod.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), H, torch.float32).reshape(H, 2)[:, 1].float()
    if hasattr(mod, "build_mpt_alibi_tensor"):
        return -mod.build_mpt_alibi_tensor(H, 2).reshape(H, 2)[:, 0].float()
    return None


def _alibi_kernels(lm: LoadedModel, window: int | None) -> tuple[list[StackKernels], str, torch.Tensor, float]:
    """ALiBi kernels measured on the position-only probe: each head's logit slope per position is fitted to the
    log-ratios of its attention row (exact when the bias is linear in delta), whatever the family's layout;
    the declared slopes, where the model's module has a builder, split it into slope_h * scale."""
    hw = lm.adapter.head_weights(lm.model, 0)
    H = hw.n_heads
    T = min(64, window + 2 if window else 64)
    probs = position_only_attention(lm, T)  # [L, H, T, T]
    i = T - 1
    rel = torch.arange(-i, 1, dtype=torch.float32)
    logr = probs[:, :, i, :].clamp_min(1e-30).log() - probs[:, :, i, i : i + 1].clamp_min(1e-30).log()  # [L,H,T]
    per_layer = (logr * rel).sum(-1) / (rel * rel).sum()  # [L, H] logit bias per position
    eff = per_layer.mean(0)
    declared = _declared_alibi_slopes(lm, H)
    if declared is None:
        slopes, scale, how = eff, 1.0, "slopes measured (the model's module has no ALiBi builder)"
    else:
        slopes = declared
        scale = float((eff * slopes).sum() / (slopes * slopes).sum().clamp_min(1e-30))
        how = f"declared slopes times a measured scale {scale:.6g}"
    W = window or 32
    dist = list(range(-W, 1))
    vals = (eff[:, None] * torch.tensor(dist, dtype=torch.float32)[None, :])[None]
    misfit = float((per_layer[:, :, None] * rel - logr).abs().max())
    note = (
        f"k_h(delta) = slope_h * delta * scale, {how}; q.k is scaled by {hw.scale:.6g}"
        + (
            " (the model adds ALiBi twice: measured scale = 2/sqrt(d))"
            if abs(scale - 2 * hw.scale) < 1e-3 * hw.scale
            else ""
        )
        + (f"; the position-only logits deviate from linear by up to {misfit:.3g}" if misfit > 1e-3 else "")
    )
    return [StackKernels(lm.adapter.stacks[-1].name, True, dist, [None], vals, vals.clone())], note, slopes, scale


# ---- empirical kernels -------------------------------------------------------------------------------------


def _token_pool(lm: LoadedModel, corpus: str) -> torch.Tensor:
    utf8_text(corpus, "the corpus")
    ids = lm.tokenizer(corpus, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    if ids.numel() == 0:
        raise InputError("the corpus tokenises to no tokens")
    return ids


def _shuffled_samples(pool: torch.Tensor, samples: int, length: int, seed: int) -> torch.Tensor:
    """``samples`` random permutations of ``length`` tokens of ``pool`` (a window of it, or a draw when shorter)."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(samples):
        if pool.numel() >= length:
            start = int(torch.randint(0, pool.numel() - length + 1, (1,), generator=g))
            window_ids = pool[start : start + length]
        else:
            window_ids = pool[torch.randint(0, pool.numel(), (length,), generator=g)]
        seqs.append(window_ids[torch.randperm(length, generator=g)])
    return torch.stack(seqs)


@torch.no_grad()
def empirical_kernels(
    lm: LoadedModel,
    *,
    corpus: str | None = None,
    samples: int = 16,
    length: int = 64,
    window: int | None = None,
    seed: int = 0,
    batch: int = 4,
    progress: bool = True,
    sink: bool = False,
) -> tuple[list[StackKernels], str]:
    """Mean attention weight by relative distance over shuffled-token inputs (module docstring), per layer
    and head, with the std over samples and a 95% CI half-width.  ``sink``: the attention-sink control, each
    row renormalised over keys 1.. before averaging (``A[i, j] / sum_{j' >= 1} A[i, j']``), so a head that
    dumps its mass on the first token weighs each row alike."""
    from tqdm.auto import tqdm

    if lm.is_encoder_decoder:
        raise InputError(
            "empirical kernels support decoder-only and encoder-only models (T5 kernels are read from the weights)"
        )
    spec = lm.adapter.stacks[-1]
    causal = spec.causal
    limit = context_limit(lm)
    if limit is not None and length > limit:
        length = limit
    if samples < 2:
        raise InputError("empirical kernels need at least 2 samples (the spread is over samples)")
    W = window or ((length - 2) // 2 if causal else (length - 1) // 4)
    if causal:
        rows = torch.arange(W + 1, length)
        dist = list(range(-W, 1))
    else:
        rows = torch.arange(max(W, 1), length - W)
        dist = list(range(-W, W + 1))
    if W < 2 or rows.numel() == 0:
        raise InputError(f"length {length} is too short for window {W}")
    ids = _shuffled_samples(_token_pool(lm, corpus or DEFAULT_CORPUS), samples, length, seed)
    modules = _attention_modules(lm, spec.name)
    per_layer: list[torch.Tensor] = []  # per call order: [N_chunk, H, n]
    dist_t = torch.tensor(dist)
    cols = rows[:, None] + dist_t[None, :]  # [|Q|, n]

    def keep(_m: torch.nn.Module, _i: Any, out: Any) -> None:
        w = attention_probs(out)
        if w is None:
            return
        w = w.detach().float().cpu()  # [B, H, T, T]
        if sink:
            w = w / w[..., 1:].sum(-1, keepdim=True).clamp_min(1e-30)  # the other keys' own sum (no 1 - A[i, 0])
        per_layer.append(w[:, :, rows[:, None], cols].mean(2))  # [B, H, n]

    L = lm.n_layers
    chunks: list[torch.Tensor] = []
    with Hooks() as hooks:
        for m in distinct(modules):
            hooks.post(m, keep)
        for start in tqdm(range(0, samples, batch), desc="empirical kernels", disable=not progress, leave=False):
            per_layer.clear()
            lm.model(input_ids=ids[start : start + batch].to(lm.device))
            if len(per_layer) != L:
                raise InputError(f"{lm.name}: captured {len(per_layer)} attention maps for {L} layers")
            chunks.append(torch.stack(per_layer, 1))  # [B, L, H, n]
    ks = torch.cat(chunks)  # [N, L, H, n]
    mean = ks.mean(0)
    std = ks.std(0)
    ci = 1.96 * std / math.sqrt(samples)
    sk = StackKernels(spec.name, causal, dist, list(range(L)), mean, mean.clamp_min(1e-12).log(), std, ci)
    sk.samples, sk.sink_removed = ks, sink
    est = ("position 0 removed, rows renormalised; " if sink else "") + (
        f"mean attention weight A_h[i, i+delta] over {samples} shuffled-token samples of {length} tokens "
        f"(corpus: {'user' if corpus else 'built-in'}, seed {seed}); query rows {int(rows[0])}..{int(rows[-1])} "
        f"for every delta in [{dist[0]}, {dist[-1]}]; spread = std over samples, ci95 = 1.96 std/sqrt(n)"
    )
    return [sk], est


# ---- entry point -------------------------------------------------------------------------------------------


def position_kernels(
    lm: LoadedModel,
    *,
    method: str = "auto",
    margin: float = 0.1,
    max_distance: int | None = None,
    corpus: str | None = None,
    samples: int = 16,
    length: int = 64,
    seed: int = 0,
    progress: bool = True,
    sink: bool = False,
) -> PositionKernels:
    """Every head's position kernel and its self-bias class (seed 000, A.2; Figs. 6 and 8).

    ``method``: ``"auto"`` (weights for T5 and ALiBi, else empirical), ``"weights"`` or ``"empirical"``.
    ``max_distance``: the window W of distances shown (T5 default: the model's relative_attention_max_distance;
    ALiBi default 32; empirical default (length-2)//2 causal, (length-1)//4 bidirectional).  ``margin``: the
    classification margin in nats (logit units).  ``sink``: the attention-sink control of empirical kernels
    (:func:`empirical_kernels`); kernels read from the weights have no sink to remove.
    """
    if method not in ("auto", "weights", "empirical"):
        raise InputError(f"unknown method {method!r}; use auto, weights or empirical")
    if margin < 0:
        raise InputError("the margin must be >= 0")
    scheme = lm.adapter.position_scheme(lm.config)
    if sink and (method == "weights" or (method == "auto" and scheme in ("t5_relative", "alibi"))):
        raise InputError(f"{lm.name}: the attention-sink control applies to empirical kernels, not {scheme} weights")
    slopes, scale, notes = None, None, ""
    if method in ("auto", "weights") and scheme == "t5_relative":
        stacks, est = _t5_kernels(lm, max_distance)
        kind, units = "t5_relative", "logit bias"
    elif method in ("auto", "weights") and scheme == "alibi":
        stacks, est, slopes, scale = _alibi_kernels(lm, max_distance)
        kind, units, notes = "alibi", "logit bias", est
    elif method == "weights":
        raise InputError(
            f"{lm.name}: position scheme {scheme!r} has no position bias in its weights; use the empirical method"
        )
    else:
        stacks, est = empirical_kernels(
            lm,
            corpus=corpus,
            samples=samples,
            length=length,
            window=max_distance,
            seed=seed,
            progress=progress,
            sink=sink,
        )
        kind, units = "empirical", "mean attention weight"
    if not stacks:
        raise InputError(f"{lm.name}: no position kernels found")
    for s in stacks:
        s.classify(margin)
    return PositionKernels(
        model_name=lm.name,
        scheme=kind,
        units=units,
        estimator=est,
        margin=margin,
        stacks=stacks,
        notes=notes,
        alibi_slopes=slopes,
        alibi_scale=scale,
    )


__all__ = [
    "position_kernels",
    "PositionKernels",
    "StackKernels",
    "KernelClass",
    "classify_kernel",
    "empirical_kernels",
    "position_only_attention",
    "t5_kernel_values",
    "DEFAULT_CORPUS",
]
