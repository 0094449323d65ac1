"""The cost model: working memory, work and the size of each file written by every command and explorer view,
estimated from the model's shape and the input's size *before* anything is computed.

One rule refuses what is too large, in the command line (:mod:`walklens.cli.limits`: ``--max-memory GB``,
``--max-output MB``, ``--max-work TFLOP``) and in the explorer (:mod:`walklens.server.bounds`: ``walklens serve
--max-memory GB --max-work TFLOP``): :meth:`Need.over` of an estimate here against :class:`Limits`.  So changing
what an analysis allocates means one edit, in the estimate below; the analyses' own sizes (the encoding walk's
score block, the positions the walk report shows) are imported from them, never copied.

``--max-memory`` is the memory budget of the whole process, the model included (default: the memory free at start,
:func:`free_memory`); ``memory`` is the working memory an estimate needs beside the loaded model, checked against
the budget less what the model holds (:attr:`Limits.model_bytes`: its weights in memory, or for a model streamed
layer by layer its resident tensors and one layer, :func:`.planning.model_memory`); ``files`` the size of each file
written (the ``--json`` file, the ``--out`` report's index.html); ``work`` counts floating-point operations (a
multiply-add is 2; element-wise passes and Python-built output are counted at their cost in matmul FLOP, by the
machine's rates of :mod:`.calibration`: measured by ``walklens calibrate``, conservative defaults until then).  The
estimates follow what the analyses allocate (eager attention keeps two [H, T, T] score tensors per layer while it
runs, the logits are [T, vocab], the A.3 check keeps every layer's attention probabilities, ...), with the sizes of
:mod:`.sizes` derived from the writers' formats; tests/test_limits.py checks them against measured sizes (within a
factor 2).  1 GB = 10^9 bytes, 1 MB = 10^6.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from ..analyses.walks import walk_chunk_rows, walk_matrix_bytes  # rows scored at once; token rows a walk holds
from ..core.streaming import available_memory
from ..reports.walk import MAX_COLS as WALK_COLS  # positions the walk report shows
from .calibration import rates
from .sizes import (
    FIGURE_MEMORY,
    HTML_ATTN_CELL,
    HTML_FIXED,
    HTML_MAP_CELL,
    JSON_ATTN,
    JSON_FLOAT,
    PY_NUMBER,
    WALK_HTML_CELL,
    json_int,
)

if TYPE_CHECKING:
    from ..core.loading import LoadedModel
    from ..models.base import Adapter

MAX_OUTPUT_MB = 100.0
MAX_WORK_TFLOP = 5.0
GB, MB, TFLOP = 1e9, 1e6, 1e12


def fmt_bytes(n: float) -> str:
    """``"1.2 GB"`` or ``"35 MB"``."""
    return f"{n / GB:.3g} GB" if n >= 0.95 * GB else f"{n / MB:.3g} MB"


def free_memory() -> float:
    """The memory this process may use now, in GB (:func:`walklens.core.streaming.available_memory`: MemAvailable or
    a cgroup's limit), rounded down to 0.01 GB: the default memory budget, read when a command starts."""
    return math.floor(available_memory() / GB * 100) / 100


# ---- limits, needs, the one rule ---------------------------------------------------------------------------------


class LimitValues(Protocol):
    """What a request may use, in the options' units: a :class:`Limits` or a command's parsed options (whose
    ``max_memory`` and ``model_bytes`` :func:`walklens.cli.common.load` sets)."""

    @property
    def max_memory(self) -> float: ...  # GB: the budget of the whole process

    @property
    def model_bytes(self) -> float: ...  # bytes of the budget the loaded model(s) hold

    @property
    def max_work(self) -> float: ...  # TFLOP

    @property
    def max_output(self) -> float: ...  # MB


@dataclass(frozen=True)
class Limits:
    """The limits of the explorer (``walklens serve --max-memory/--max-work``), with the commands' defaults: the
    memory budget ``max_memory`` (GB; default the memory free when made), of which the loaded models hold
    ``model_bytes``."""

    max_memory: float = field(default_factory=free_memory)
    max_work: float = MAX_WORK_TFLOP
    max_output: float = MAX_OUTPUT_MB
    model_bytes: float = 0.0


@dataclass
class Need:
    """An estimate: working memory (bytes), work (FLOP) and the size of each file written (bytes)."""

    memory: float = 0.0
    work: float = 0.0
    files: dict[str, float] = field(default_factory=dict)

    def over(self, limits: LimitValues) -> list[str]:
        """What exceeds its limit, as short phrases naming the option that raises it."""
        out = []
        held = limits.model_bytes
        if self.memory > limits.max_memory * GB - held:
            beside = f" beside the model's {fmt_bytes(held)}" if held else ""
            out.append(f"~{fmt_bytes(self.memory)} of memory{beside} (--max-memory {limits.max_memory:g})")
        if self.work > limits.max_work * TFLOP:
            out.append(f"~{self.work / TFLOP:.3g} TFLOP of work (--max-work {limits.max_work:g})")
        for name, size in self.files.items():
            if size > limits.max_output * MB:
                out.append(f"a {name} file of ~{fmt_bytes(size)} (--max-output {limits.max_output:g})")
        return out

    def fits(self, limits: LimitValues) -> bool:
        return not self.over(limits)


def refusal(need: Need, limits: LimitValues, what: str, hint: str) -> str | None:
    """The one line refusing ``need`` (what it would need, and what reduces it), or None when it fits."""
    over = need.over(limits)
    return f"{what} would need {' and '.join(over)}; {hint}" if over else None


def tokens_that_fit(need_at: Callable[[int], Need], limits: LimitValues, T: int) -> int:
    """The longest text (in tokens, at most T) whose need fits the limits; 0 if none does."""
    lo, hi = 0, T
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need_at(mid).fits(limits):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_hint(need_at: Callable[[int], Need], limits: LimitValues, T: int, noun: str = "text") -> str:
    """``"a text of at most N tokens fits"`` (or that none does)."""
    n = tokens_that_fit(need_at, limits, T)
    return f"a {noun} of at most {n} tokens fits" if n else f"no {noun} fits these limits"


def block_for(rows: int, cols: int, cells: int, *, square: bool = True, per_col: int = 1, gap: int = 0) -> int:
    """The smallest block b of positions such that a [rows, cols] map reduced by b holds at most ``cells`` cells:
    its columns grouped by b, and its rows too when ``square`` (a [T, T] map averaged over b x b blocks);
    ``per_col`` such maps side by side (the heads of an attention map), each ``gap`` columns wider (a report's
    separator).  At most the block that leaves one group (of columns, and of rows when ``square``): the one rule of
    the reports' heatmaps (:func:`walklens.cli.limits.block_size`) and the explorer's maps
    (:func:`walklens.server.bounds.block_for`)."""

    def size(b: int) -> int:
        return (math.ceil(rows / b) if square else rows) * per_col * (math.ceil(cols / b) + gap)

    lo, hi = 1, max(1, max(rows, cols) if square else cols)
    while lo < hi:  # size(b) never grows with b: the first b that fits, by bisection
        mid = (lo + hi) // 2
        if size(mid) <= cells:
            hi = mid
        else:
            lo = mid + 1
    return lo


# ---- the model's shape and one forward pass ------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What the estimates need of a model: depth, heads, widths, vocabulary, parameters, captured points."""

    layers: int
    heads: int
    kv_heads: int
    d_model: int
    d_ff: int
    vocab: int
    params: int
    stacks: int
    points: int  # captured points per stack (all of them)
    causal: bool
    walk_rows: float = 0.0  # float32 token rows a walk of the loaded model holds (walks.walk_matrix_bytes); 0: unknown


def model_shape(lm: LoadedModel) -> Shape:
    """The :class:`Shape` of a loaded model, read from its config, its V and its parameters, with the float32 token
    rows its walk holds (:func:`~walklens.analyses.walks.walk_matrix_bytes`)."""
    sh = config_shape(
        lm.config,
        lm.adapter,
        vocab=int(lm.embedding_matrix().shape[0]),
        params=sum(p.numel() for p in lm.model.parameters()),
        width=lm.d_model,
    )
    return replace(sh, walk_rows=float(walk_matrix_bytes(lm)))


def config_shape(cfg: Any, adapter: Adapter | None, *, vocab: int, params: int, width: int) -> Shape:
    """The :class:`Shape` of a model of config ``cfg``: depth, heads and widths from the config (``width``: D when
    the config names none), its ``vocab`` and ``params``, its points from ``adapter``'s stacks (None, a family
    without an adapter file: one pre-norm decoder stack, 2 + 5 per layer) - the same for a loaded model and for
    the plan of one from its files (:mod:`.planning`)."""
    from ..core.capture import point_names
    from ..models.checkpoint import LAYER_FIELDS

    def get(*names: str, default: int = 0) -> int:
        for n in names:
            v = getattr(cfg, n, None)
            if isinstance(v, int) and v > 0:
                return v
        return default

    d = get("hidden_size", "d_model", "n_embd", default=width)
    heads = get("num_attention_heads", "n_head", "num_heads", default=1)
    layers = adapter.n_layers(cfg) if adapter is not None else get(*LAYER_FIELDS, default=1)
    spec = adapter.stacks[-1] if adapter is not None else None
    return Shape(
        layers=layers,
        heads=heads,
        kv_heads=get("num_key_value_heads", "num_kv_heads", default=heads),
        d_model=d,
        d_ff=get("intermediate_size", "n_inner", "d_ff", "ffn_dim", default=4 * d),
        vocab=vocab,
        params=params,
        stacks=len(adapter.stacks) if adapter is not None else 1,
        points=len(point_names(spec, adapter.residual_kind(cfg), layers)) if adapter and spec else 2 + 5 * layers,
        causal=bool(spec.causal) if spec is not None else True,
    )


def _attention_sets(sh: Shape) -> int:
    return 3 if sh.stacks > 1 else 1  # T5: encoder, decoder and cross-attention


def forward_memory(sh: Shape, T: int, batch: int = 1) -> float:
    """Transient memory of one eager forward pass of ``batch`` x ``T`` tokens: two [H, T, T] fp32 score
    tensors of the running layer, the mask, the logits [T, vocab] and the layer's activations."""
    scores = 2 * batch * sh.heads * T * T * 4 * (2 if _attention_sets(sh) > 1 else 1) + batch * T * T * 4
    return scores + batch * T * sh.vocab * 4 + batch * T * (8 * sh.d_model + 3 * sh.d_ff) * 4


def attention_scores(sh: Shape, T: int, batch: int = 1) -> float:
    """The attention scores of one forward pass of ``batch`` x ``T`` tokens: [H, T, T] per layer and attention."""
    return batch * _attention_sets(sh) * sh.layers * sh.heads * T * T


def forward_work(sh: Shape, T: int, batch: int = 1) -> float:
    """Floating-point operations of one forward pass: the weights, the attention matmuls, the logits, and the
    eager attention's element-wise passes over every [H, T, T] score tensor (scale, mask, softmax, each a
    fresh allocation), counted at the machine's rate (:attr:`.calibration.Rates.attn_element` operations per score)."""
    body = max(sh.params - sh.vocab * sh.d_model, 0)
    matmuls = 2 * T * body + _attention_sets(sh) * sh.layers * T * T * 4 * sh.d_model + 2 * T * sh.vocab * sh.d_model
    return batch * matmuls + rates().attn_element * attention_scores(sh, T, batch)


def attention_trace_memory(sh: Shape, T: int) -> float:
    """A trace that keeps every attention module's probabilities [H, T, T] (``capture(attentions=True)``), with
    every point's vectors and each layer's queries and keys."""
    sets = _attention_sets(sh)
    return (
        sh.layers * sets * sh.heads * T * T * 4
        + sh.points * T * sh.d_model * 4 * sh.stacks
        + 2 * sh.layers * sets * T * sh.d_model * 4
    )


# ---- what each command and view needs ------------------------------------------------------------------------------


def _need(memory: float, work: float, json: bool, out: bool, js: float, html: float) -> Need:
    """A :class:`Need` with the files written (``--json`` when ``json``, the page when ``out``) and the work
    of writing them (:attr:`.calibration.Rates.write_work` operations per byte)."""
    files = {**({"--json": js} if json else {}), **({"--out index.html": html} if out else {})}
    return Need(memory, work + rates().write_work * sum(files.values()), files)


@dataclass(frozen=True)
class WalkPlan:
    """What an encoding walk reads: ``points`` per stack out of ``captured`` ones, ``shown`` rows in the report,
    ``k`` nearest tokens per cell (0: ranks only), ``readings`` of each vector (2: raw and normed)."""

    points: int
    captured: int
    shown: int
    k: int
    readings: int = 1


def walk_need(
    sh: Shape, T: int, plan: WalkPlan, *, json: bool = False, out: bool = False, matrix: float | None = None
) -> Need:
    """``walklens walk`` and the explorer's walk view: the trace, then ``plan``'s readings against the
    vocabulary a block of rows at a time (:func:`walklens.encoding_walk`), beside ``matrix`` bytes of float32 token
    rows (default: the shape's ``walk_rows``; a streamed model's row block:
    :func:`walklens.analyses.walks.walk_matrix_bytes`)."""
    matrix = sh.walk_rows if matrix is None else matrix
    rows = plan.points * T * sh.stacks
    trace = plan.captured * T * sh.d_model * 4 * sh.stacks
    chunk = min(rows, walk_chunk_rows(sh.vocab))
    k, readings = plan.k, plan.readings
    outs = readings * rows * (12 * k + 60)
    json_id = json_int(sh.vocab)
    js = readings * rows * (k * (json_id + JSON_FLOAT) + 2 * json_id + 9 * JSON_FLOAT) + T * 60
    js_mem = readings * rows * (2 * k + 13) * PY_NUMBER + js if json else 0.0
    memory = trace + max(
        forward_memory(sh, T),
        4 * chunk * sh.vocab * 4 + outs + matrix,
        outs + js_mem + (FIGURE_MEMORY if out else 0.0),
    )
    work = forward_work(sh, T) + readings * rows * sh.vocab * sh.d_model * 2
    html = HTML_FIXED + readings * sh.stacks * min(T, WALK_COLS) * plan.shown * WALK_HTML_CELL
    return _need(memory, work, json, out, js, html)


def simmap_need(
    sh: Shape, T: int, *, maps: int, captured: int, block: int = 1, json: bool = False, out: bool = False
) -> Need:
    """``walklens simmap`` and the explorer's similarity map: ``maps`` [T, T] maps from ``captured`` points;
    the report averages ``block`` x ``block`` positions."""
    side = math.ceil(T / block)
    js = maps * T * T * JSON_FLOAT + T * 60
    html = HTML_FIXED + maps * (side * side * HTML_MAP_CELL + side * 40)
    html_mem = side * side * (2 * PY_NUMBER + 2 * HTML_MAP_CELL) + FIGURE_MEMORY if out else 0.0
    js_mem = maps * T * T * PY_NUMBER + js if json else 0.0
    trace = captured * T * sh.d_model * 4
    memory = trace + max(forward_memory(sh, T), maps * T * T * 4 + max(2 * T * T * 4, js_mem, html_mem))
    work = forward_work(sh, T) + maps * T * T * sh.d_model * 2
    return _need(memory, work, json, out, js, html)


def attention_need(sh: Shape, T: int) -> Need:
    """The explorer's attention view: one forward pass keeping every attention module's probabilities."""
    return Need(attention_trace_memory(sh, T) + forward_memory(sh, T), forward_work(sh, T))


def heads_need(sh: Shape, T: int, *, json_layers: int, map_layers: int, block: int, json: bool, out: bool) -> Need:
    """``walklens heads``: the A.3 check keeps every layer's attention [H, T, T]; the JSON holds
    ``json_layers`` of them, the report ``map_layers`` maps averaged over ``block`` x ``block``."""
    sets = _attention_sets(sh)
    layer_attn = sh.heads * T * T * 4
    check_mem = 2 * layer_attn + 3 * sh.heads * T * sh.d_model * 8  # A in float64, the head outputs
    js = json_layers * sets * sh.heads * T * T * JSON_ATTN + T * 60 + 2 * sh.layers * sh.heads * 4 * JSON_FLOAT
    js_mem = json_layers * sets * sh.heads * T * T * PY_NUMBER + js if json else 0.0
    side = math.ceil(T / block)
    cells = side * sh.heads * (side + 1)
    html = (
        HTML_FIXED + map_layers * sets * (cells * HTML_ATTN_CELL + sh.heads * side * 40) + 3 * sh.layers * sh.heads * 60
    )
    html_mem = cells * (2 * PY_NUMBER + HTML_ATTN_CELL) + (layer_attn if block > 1 else 0) if out else 0.0
    memory = attention_trace_memory(sh, T) + max(forward_memory(sh, T), check_mem, js_mem, html_mem)
    work = forward_work(sh, T) + sh.layers * sets * (
        2 * sh.heads * T * T * sh.d_model + 4 * sh.heads * T * sh.d_model**2
    )
    return _need(memory, work, json, out, js, html)


def generate_need(sh: Shape, T: int, *, steps: int, k: int, json: bool = False, out: bool = False) -> Need:
    """``walklens generate`` and the explorer's decoding walk: one forward pass over the prompt, then one token
    per step with the cache."""
    cache = 2 * sh.layers * (T + steps) * sh.d_model * sh.kv_heads // sh.heads * 4 * sh.stacks
    memory = forward_memory(sh, T) + cache
    work = forward_work(sh, T) + steps * (forward_work(sh, 1) + 4 * sh.layers * (T + steps) * sh.d_model)
    js = steps * (sh.d_model + 3 * k + 12) * JSON_FLOAT + (T + steps) * 60
    html = HTML_FIXED + steps * 400
    return _need(memory, work, json, out, js, html)


def kernels_need(
    sh: Shape, *, samples: int, length: int, window: int, json: bool, out: bool, empirical: bool = True
) -> Need:
    """``walklens kernels``: forward passes of 4 shuffled samples at a time (empirical), or the weights."""
    n = window + 1 if sh.causal else 2 * window + 1  # distances -W..0 (causal) or -W..W
    kernels = sh.layers * sh.heads * n
    js = 4 * kernels * JSON_FLOAT + kernels * 20
    html = HTML_FIXED + kernels * 90 + 3 * sh.heads * n * 2 * JSON_FLOAT
    if not empirical:
        return _need(kernels * 4 * 8, 0.0, json, out, js, html)
    batch = min(4, samples)
    rows = max(length - window, 1)
    memory = forward_memory(sh, length, batch) + batch * sh.heads * rows * n * 4 + samples * kernels * 4 * 3
    return _need(memory, math.ceil(samples / batch) * forward_work(sh, length, batch), json, out, js, html)


def power_need(
    sh: Shape,
    lengths: Sequence[int],
    *,
    heads: bool,
    dynamics: bool,
    shared: bool,
    json: bool = False,
    out: bool = False,
    shared_depth: int | None = None,
) -> Need:
    """``walklens power`` and the explorer's power view: spectra from the weights, then the alignment of every
    token of every text with 200 random directions per point (seed 002), the idealised dynamics and the
    shared-weight run."""
    L, D = sh.layers, sh.d_model
    P = 3 * L
    N, Tm = sum(lengths), max(lengths)
    align = N * P * (4 * D + 2 * (8 * L + 1600)) + Tm * P * (16 * D + 200 * 40)
    dyn = (N * L * D * 4 * 6 + Tm * L * (16 * D + 50 * 40)) if dynamics else 0.0
    Ls = shared_depth or L  # the shared-weight run's depth (--shared-depth)
    shr = N * (Ls + 1) * D * 8 * 4 if shared else 0.0
    memory = max(forward_memory(sh, Tm) + Tm * P * D * 4, align, dyn, shr, D * D * 8 * 6)
    passes = 1 + (2 if dynamics else 0) + (Ls / L if shared else 0)
    work = (
        sum(passes * forward_work(sh, t) for t in lengths)
        + 30 * L * D**3 * (1 + (sh.heads if heads else 0))
        + N * P * (L + 400) * D * 2
    )
    js = N * (P + 1) * JSON_FLOAT + N * 30 + L * (D * 4 + 200) * JSON_FLOAT * (1 + (sh.heads if heads else 0))
    html = HTML_FIXED + lengths[0] * L * 3 * 10
    return _need(memory, work, json, out, js, html)


def steer_need(
    sh: Shape, lengths: Sequence[int], *, runs: int, steps: int, json: bool = False, out: bool = False
) -> Need:
    """``walklens steer`` and the explorer's steering playground: per prompt and (method, layers, alpha) run,
    ``steps`` uncached forward passes, a capture and a perplexity pass over prompt + continuation."""
    Tm = max(lengths) + steps
    memory = forward_memory(sh, Tm) + 3 * Tm * sh.vocab * 4
    work = sum(runs * (steps + 3) * forward_work(sh, t + steps) for t in lengths)
    js = runs * len(lengths) * 400 + sum(lengths) * 60
    html = HTML_FIXED + runs * 800
    return _need(memory, work, json, out, js, html)


def patch_need(
    sh: Shape,
    T: int,
    layers: Sequence[int],
    cells: Sequence[int],
    *,
    batch: int,
    attribution: bool = False,
    json: bool = False,
    out: bool = False,
) -> Need:
    """Activation patching: two recorded runs, then each layer's ``cells[i]`` patched passes of ``T`` tokens
    run ``batch`` at a time from layer ``layers[i]`` (layers l..L-1 only); ``attribution``: one backward pass more
    (twice a forward's work) and the runs' activations kept for it."""
    L = max(sh.layers, 1)
    per_pass = max(min(batch, max(cells, default=1)), 1)
    memory = forward_memory(sh, T, per_pass) + 2 * T * sh.d_model * 4 * (6 * L + 2)
    work = 2 * forward_work(sh, T) + sum(n * forward_work(sh, T) * (L - l) / L for l, n in zip(layers, cells))
    if attribution:
        memory += forward_memory(sh, T) * L
        work += 2 * forward_work(sh, T)
    n = sum(cells)
    return _need(memory, work, json, out, n * 3 * JSON_FLOAT + n * 20, HTML_FIXED + n * 40)


@dataclass(frozen=True)
class CardPlan:
    """What a steering card runs (:func:`walklens.lab.steering_card`): the token counts of its ``prompts`` (each
    continued in every cell), ``neutral`` texts (a pass per cell and target) and ``pairs`` texts (positive and
    negative, every target's); ``cells`` (the unsteered one included), ``targets``, ``layers``, whether it
    calibrates eigen-steering (``eigen``) and reads mean differences (``meandiff``); its batches of continuations
    (``gen_batch``) and of scored continuations (``score_batch``)."""

    prompts: tuple[int, ...]
    neutral: tuple[int, ...]
    pairs: tuple[int, ...]
    cells: int
    targets: int
    layers: int
    eigen: bool
    meandiff: bool
    gen_batch: int = 32
    score_batch: int = 8


def card_need(sh: Shape, plan: CardPlan, *, steps: int, json: bool = False, out: bool = False) -> Need:
    """``walklens steer --card``: every cell continues every prompt ``steps`` greedy tokens with the cache
    (keeping each step's logits), scores prompt + continuation under the unsteered model, and passes over the
    neutral texts once per target; the plan passes over the neutral and pair texts per layer and keeps the
    unsteered neutral log-probs of each layer's two change points for the whole run."""
    Tm, Tn = max(plan.prompts), max(plan.neutral)
    B = min(plan.gen_batch, len(plan.prompts))
    S = min(plan.score_batch, len(plan.prompts))
    neutral_work = sum(forward_work(sh, t) for t in plan.neutral)
    gen = forward_work(sh, Tm) + steps * (forward_work(sh, 1) + 4 * sh.layers * (Tm + steps) * sh.d_model)
    per_prompt = gen + forward_work(sh, Tm + steps)
    calibrate = plan.targets * 2 * neutral_work if plan.eigen else 0.0
    pairs = sum(forward_work(sh, t) for t in plan.pairs) if plan.meandiff else 0.0
    plan_work = plan.layers * (3 * neutral_work + calibrate + pairs)
    work = plan.cells * (len(plan.prompts) * per_prompt + plan.targets * neutral_work) + plan_work
    cache = 2 * sh.layers * B * (Tm + steps) * sh.d_model * sh.kv_heads // sh.heads * 4
    generating = forward_memory(sh, Tm, B) + cache + B * steps * sh.vocab * 4
    scoring = forward_memory(sh, Tm + steps, S) + 2 * S * (Tm + steps) * sh.vocab * 4
    N, Tr = max(len(plan.neutral), len(plan.pairs)), max(Tn, max(plan.pairs, default=1))
    recording = forward_memory(sh, Tr, N) + 2 * N * Tr * sh.vocab * 4  # one batch; its log-probs on the CPU
    kept = plan.layers * 2 * sum(plan.neutral) * (sh.vocab + 2 * sh.d_model) * 4
    memory = kept + max(generating, scoring, recording)
    rows = plan.cells * plan.targets
    js = rows * (2 * 800 + 200 + 16 * steps)
    html = HTML_FIXED + rows * (2 * 600 + 200 + 16 * steps)
    return _need(memory, work, json, out, js, html)


__all__ = [
    "MAX_OUTPUT_MB",
    "MAX_WORK_TFLOP",
    "GB",
    "MB",
    "TFLOP",
    "fmt_bytes",
    "free_memory",
    "LimitValues",
    "Limits",
    "Need",
    "refusal",
    "tokens_that_fit",
    "fit_hint",
    "block_for",
    "Shape",
    "model_shape",
    "config_shape",
    "forward_memory",
    "attention_scores",
    "forward_work",
    "attention_trace_memory",
    "WalkPlan",
    "walk_need",
    "simmap_need",
    "attention_need",
    "heads_need",
    "generate_need",
    "kernels_need",
    "power_need",
    "steer_need",
    "patch_need",
    "CardPlan",
    "card_need",
]
