"""Attention as *filter, then cluster & aggregate* (seed 000, sec. 2.2.1, Result 2, derivation in A.3).

Vectors are rows.  Head h of an attention layer computes (A.3)

    O_h = A_h V_h W_o,h = A_h X W_v,h W_o,h = A_h X W_vo,h,        W_vo,h = W_v,h W_o,h  (D x D, rank <= d)
    A_h = softmax(X W_q,h W_k,h^T X^T * scale + B) = softmax(X W_qk,h X^T * scale + B)

and the layer outputs ``O = sum_h O_h + b_o``.  This module gives

- :class:`~walklens.ov.FactoredMatrix` (in :mod:`walklens.ov`) -- a D x D matrix kept as two thin factors
  (``A`` [D, d] @ ``B`` [d, D]); norms, SVD and eigenvalues come from d x d products, never from the dense matrix;
- :func:`head_matrices` -- W_vo,h and W_qk,h of every head of one attention module (grouped-query attention:
  query head h uses key/value head ``kv_head[h]``), with their bias terms;
- :func:`attention_identity` -- the A.3 identity checked numerically against the module's real output;
- :func:`cluster_view` and :func:`self_mass` -- the cluster & aggregate reading of one query position (its
  soft-cluster memberships, the centroid it moves to, and the self-association pull of A.2).

**Biases.**  With biases the value path is ``A_h (X W_v,h + 1 b_v,h) W_o,h = A_h X W_vo,h + 1 (b_v,h W_o,h)``
because every row of A_h sums to 1: b_v passes through the attention unchanged and contributes the constant
row ``b_v,h W_o,h`` (:meth:`HeadMatrices.vo_bias`); ``b_o`` is added once per layer, not per head.  On the
query/key side ``(x W_q + b_q)(y W_k + b_k)^T = x W_qk y^T + x (W_q b_k^T) + (b_q W_k^T) y^T + b_q b_k^T``:
the terms that depend only on the query (x W_q b_k^T and b_q b_k^T) are the same for every key and cancel in
the softmax; the key-side term ``(b_q W_k^T) y^T`` (:meth:`HeadMatrices.qk_key_bias`) does change attention.
Rotary models rotate q and k by position, so their W_qk is the position-0 (no rotation) form; Gemma 3
normalises q and k per head, so W_qk is only a direction-level summary there (``HeadWeights.qk_norm``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .capture import capture
from .display import Shown
from .errors import InputError
from .frames import Columns, DataFrame, concat_columns, frame, long_table, pick, record_table
from .hooks import Hooks, distinct, first_output
from .models.base import HeadWeights, get_module
from .ov import FactoredMatrix
from .precision import IDENTITY_REL_TOL, dtype_name, is_low_precision, parse_dtype

if TYPE_CHECKING:
    from .loading import LoadedModel
    from .trace import Trace


# ---- per-head matrices ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadMatrices(Shown, view="head_matrices"):
    """W_vo,h and W_qk,h of every head of one attention module (seed 000, A.3), kept factored.

    ``weights`` are the module's per-head weights in row convention (:class:`~walklens.models.HeadWeights`).
    ``W_vo,h = W_v,kv(h) W_o,h`` [D, D] and ``W_qk,h = W_q,h W_k,kv(h)^T`` [D, D]; the softmax argument is
    ``scale * x W_qk,h y^T`` plus the bias terms described in the module docstring and any position bias.
    For cross-attention (T5 decoder) the key/value side is the encoder's final output.
    """

    layer: int
    stack: str
    cross: bool
    family: str
    weights: HeadWeights

    @property
    def n_heads(self) -> int:
        return self.weights.n_heads

    @property
    def d_head(self) -> int:
        return self.weights.d_head

    @property
    def d_model(self) -> int:
        return self.weights.d_model

    @property
    def kv_head(self) -> tuple[int, ...]:
        return self.weights.kv_head

    @property
    def scale(self) -> float:
        return self.weights.scale

    def to(self, dtype: torch.dtype) -> HeadMatrices:
        """A copy with every weight cast to ``dtype`` (the identity check recomputes in float64)."""
        cast = _map_tensors(self.weights, lambda t: t.to(dtype))
        return HeadMatrices(self.layer, self.stack, self.cross, self.family, cast)

    def _check(self, h: int) -> int:
        if not -self.n_heads <= h < self.n_heads:
            raise InputError(f"head {h} out of range: this layer has {self.n_heads} heads")
        return h % self.n_heads

    def _kv_index(self) -> torch.Tensor:
        return torch.tensor(self.kv_head, dtype=torch.long)

    # factored forms
    def vo(self, h: int | None = None) -> FactoredMatrix:
        """W_vo (factored): one head, or all heads stacked ([H, D, d] @ [H, d, D]) when ``h`` is None."""
        w = self.weights
        if h is None:
            return FactoredMatrix(w.w_v[self._kv_index()], w.w_o)
        h = self._check(h)
        return FactoredMatrix(w.w_v[w.kv_head[h]], w.w_o[h])

    def qk(self, h: int | None = None) -> FactoredMatrix:
        """W_qk = W_q W_k^T (factored, unscaled): one head, or all heads stacked when ``h`` is None."""
        w = self.weights
        if h is None:
            return FactoredMatrix(w.w_q, w.w_k[self._kv_index()].transpose(-1, -2))
        h = self._check(h)
        return FactoredMatrix(w.w_q[h], w.w_k[w.kv_head[h]].transpose(-1, -2))

    # dense forms (the names the acceptance checks use)
    def w_vo(self, h: int) -> torch.Tensor:
        """Dense W_vo,h = W_v,h W_o,h [D, D] (rank <= d_head)."""
        return self.vo(h).dense()

    def w_qk(self, h: int) -> torch.Tensor:
        """Dense W_qk,h = W_q,h W_k,h^T [D, D] (unscaled; multiply by ``scale`` for the softmax argument)."""
        return self.qk(h).dense()

    # bias terms
    def vo_bias(self, h: int | None = None) -> torch.Tensor:
        """``b_v,h W_o,h`` [D] (or [H, D]): the constant row the value bias adds to head h's output."""
        w = self.weights
        if h is None:
            return torch.einsum("hd,hdD->hD", w.b_v[self._kv_index()], w.w_o)
        h = self._check(h)
        return w.b_v[w.kv_head[h]] @ w.w_o[h]

    @property
    def b_o(self) -> torch.Tensor:
        """The output bias [D], added once per layer."""
        return self.weights.b_o

    def qk_key_bias(self, h: int) -> torch.Tensor:
        """``W_k,h b_q,h^T`` [D]: the key-side score term ``y . (W_k b_q^T)`` that survives the softmax."""
        w = self.weights
        h = self._check(h)
        return w.w_k[w.kv_head[h]] @ w.b_q[h]

    # the filter -> cluster & aggregate computation
    def head_outputs(self, A: torch.Tensor, X_kv: torch.Tensor) -> torch.Tensor:
        """O_h = A_h X W_vo,h + b_v,h W_o,h for every head: [H, T, D] from A [H, T, S] and X_kv [S, D].

        Computed as in A.3: cluster & aggregate in input space (``A_h @ X``, the soft-cluster centroids),
        then the filter W_vo,h through its factors.  ``sum_h O_h + b_o`` is the module's output.
        """
        if A.dim() != 3 or A.shape[0] != self.n_heads:
            raise InputError(f"attention must be [H={self.n_heads}, T, S], got {tuple(A.shape)}")
        if X_kv.shape != (A.shape[2], self.d_model):
            raise InputError(f"X must be [S={A.shape[2]}, D={self.d_model}], got {tuple(X_kv.shape)}")
        w = self.weights
        A = A.to(w.w_v.dtype)
        centroids = A @ X_kv.to(w.w_v.dtype)  # [H, T, D]
        return self.vo().apply(centroids) + self.vo_bias()[:, None, :]

    def output(self, A: torch.Tensor, X_kv: torch.Tensor) -> torch.Tensor:
        """The module output ``sum_h O_h + b_o`` [T, D] (A.3)."""
        return self.head_outputs(A, X_kv).sum(0) + self.b_o

    def _columns(self, table: str = "heads") -> Columns:
        """The plain columns of :meth:`to_pandas`."""

        def heads() -> Columns:
            vo, qk = self.vo(), self.qk()
            return long_table(
                [("head", range(self.n_heads))],
                {
                    "vo_norm": vo.norm().float(),
                    "qk_norm": qk.norm().float(),
                    "vo_sigma1": vo.singular_values()[..., 0].float(),
                    "vo_copying": vo.copying_score().float(),
                },
                by_axis={"head": {"kv_head": list(self.kv_head)}},
                constants={"stack": self.stack, "layer": self.layer, "cross": self.cross},
            )

        def weights() -> Columns:
            w, parts = self.weights, []
            for name in ("w_q", "w_k", "w_v", "w_o"):
                t = getattr(w, name)
                parts.append(
                    long_table(
                        [("head", range(t.shape[0])), ("row", range(t.shape[1])), ("col", range(t.shape[2]))],
                        {"value": t.float()},
                        constants={"matrix": name},
                    )
                )
            for name in ("b_q", "b_k", "b_v"):
                t = getattr(w, name)
                parts.append(
                    long_table(
                        [("head", range(t.shape[0])), ("col", range(t.shape[1]))],
                        {"value": t.float()},
                        constants={"matrix": name},
                    )
                )
            parts.append(
                long_table([("col", range(w.b_o.shape[0]))], {"value": w.b_o.float()}, constants={"matrix": "b_o"})
            )
            return concat_columns(parts)

        return pick(table, {"heads": heads, "weights": weights}, "HeadMatrices")

    def to_pandas(self, table: str = "heads") -> DataFrame:
        """One attention module as a table (pandas; docs/notebooks.md, "Tables"): ``heads`` one row per head
        (W_vo,h and W_qk,h norms, sigma_1 and copying score of W_vo,h, from the factors); ``weights`` every weight
        in row convention, one row per (matrix, head, row, col) (``head`` of ``w_k``/``w_v``/``b_k``/``b_v`` is
        the key/value head; biases have no ``row``, ``b_o`` no ``head``)."""
        return frame(
            self._columns(table),
            {"family": self.family, "scale": self.scale, "qk_norm": self.weights.qk_norm, "notes": self.weights.notes},
        )


def _stack_name(lm: LoadedModel, stack: str | None) -> str:
    try:
        return lm.adapter.stack(stack).name
    except KeyError as e:
        raise InputError(str(e.args[0])) from None


def head_matrices(lm: LoadedModel, layer: int, stack: str | None = None, cross: bool = False) -> HeadMatrices:
    """W_vo,h and W_qk,h of every head of one layer's attention (seed 000, A.3), in factored form.

    ``layer`` may be negative (from the top).  ``stack``: ``"enc"``/``"dec"`` for T5 (default: the last stack,
    the decoder); ``cross=True``: the T5 decoder's cross-attention (keys and values from the encoder output).
    The weights are copied to the CPU in float32 (traces live there too; exact from a bfloat16 or float16 model,
    so norms, SVDs and eigenvalues of W_vo,h and W_qk,h are float32 computations from the model's own weights).
    """
    spec_name = _stack_name(lm, stack)
    n = lm.adapter.n_layers(lm.model.config)
    if not -n <= layer < n:
        raise InputError(f"layer {layer} out of range: the model has {n} layers")
    layer %= n
    try:
        hw = lm.adapter.head_weights(lm.model, layer, spec_name, cross)
    except KeyError as e:
        raise InputError(str(e.args[0])) from None
    hw = _map_tensors(hw, lambda t: t.detach().float().cpu() if isinstance(t, torch.Tensor) else t)
    return HeadMatrices(layer=layer, stack=spec_name, cross=cross, family=lm.adapter.family, weights=hw)


def _map_tensors(hw: HeadWeights, fn: Callable[[torch.Tensor], torch.Tensor]) -> HeadWeights:
    """``hw`` with ``fn`` applied to each of its eight weights and biases (the other fields as they are)."""
    return dataclasses.replace(
        hw,
        w_q=fn(hw.w_q),
        w_k=fn(hw.w_k),
        w_v=fn(hw.w_v),
        w_o=fn(hw.w_o),
        b_q=fn(hw.b_q),
        b_k=fn(hw.b_k),
        b_v=fn(hw.b_v),
        b_o=fn(hw.b_o),
    )


# ---- the A.3 identity --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdentityCheck:
    """One attention module: max |recomputed - real| and the scale of the real output."""

    name: str
    stack: str
    layer: int
    kind: str  # "attn" (self) or "cross"
    max_abs_error: float
    max_abs_output: float

    @property
    def rel_error(self) -> float:
        """max |error| / max |real output|: fp32 rounding of the model itself is ~1e-7 to 1e-6 of this scale."""
        return self.max_abs_error / self.max_abs_output if self.max_abs_output > 0 else float("inf")


@dataclass(frozen=True)
class IdentityResult(Shown, Mapping[str, float], view="identity"):
    """Max absolute error of the A.3 identity per attention module, keyed ``"L{l}.attn"`` (``"enc.L0.attn"``,
    ``"dec.L0.cross"`` for T5), in layer order.  Behaves as a read-only dict name -> error (``res[0]`` is the
    first module's error); ``checks`` has the details, ``trace`` the captured forward pass, ``model_dtype`` the
    dtype the model ran in."""

    checks: tuple[IdentityCheck, ...]
    model_name: str = ""
    tokens: tuple[str, ...] = ()
    trace: Trace | None = field(default=None, repr=False, compare=False)
    model_dtype: str = "float32"

    def __getitem__(self, key: str | int) -> float:
        """Error of module ``key`` (``"L3.attn"``), or of the ``key``-th checked module when an int."""
        if isinstance(key, int):
            return self.checks[key].max_abs_error
        for c in self.checks:
            if c.name == key:
                return c.max_abs_error
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (c.name for c in self.checks)

    def __len__(self) -> int:
        return len(self.checks)

    @property
    def max_error(self) -> float:
        return max(c.max_abs_error for c in self.checks)

    @property
    def max_rel_error(self) -> float:
        """The largest :attr:`IdentityCheck.rel_error` (error over the scale of the module's real output)."""
        return max(c.rel_error for c in self.checks)

    def holds(self, tol: float | None = None) -> bool:
        """Whether the identity holds: ``max_error <= tol`` when ``tol`` is given; else, for a float32 model,
        ``max_error <= 1e-4``, and for a bfloat16 / float16 model ``max_rel_error <=``
        :data:`~walklens.precision.IDENTITY_REL_TOL` (8 unit roundoffs of its dtype: 2**-5 in bfloat16)."""
        if tol is not None:
            return self.max_error <= tol
        dtype = parse_dtype(self.model_dtype)
        if is_low_precision(dtype):
            return self.max_rel_error <= IDENTITY_REL_TOL[dtype]
        return self.max_error <= 1e-4

    def _columns(self, table: str = "checks") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        return pick(
            table,
            {
                "checks": lambda: record_table(
                    [
                        {
                            "name": c.name,
                            "stack": c.stack,
                            "layer": c.layer,
                            "kind": c.kind,
                            "max_abs_error": c.max_abs_error,
                            "max_abs_output": c.max_abs_output,
                            "rel_error": c.rel_error,
                        }
                        for c in self.checks
                    ]
                )
            },
            "an IdentityResult",
        )

    def to_pandas(self, table: str = "checks") -> DataFrame:
        """The A.3 identity's errors, one row per attention module (pandas; docs/notebooks.md, "Tables")."""
        return frame(self._columns(table), {"model": self.model_name, "model_dtype": self.model_dtype})


MatricesFn = Callable[[str, int, bool], HeadMatrices]


def _identity_key(lm: LoadedModel, stack: str, layer: int, kind: str) -> str:
    return f"{stack}.L{layer}.{kind}" if len(lm.adapter.stacks) > 1 else f"L{layer}.{kind}"


@torch.no_grad()
def attention_identity(
    lm: LoadedModel,
    text: str,
    *,
    decoder_text: str | None = None,
    truncate: bool = False,
    matrices: MatricesFn | None = None,
) -> IdentityResult:
    """Check the A.3 identity ``O = sum_h A_h X W_vo,h + sum_h b_v,h W_o,h + b_o`` on every attention module.

    One forward pass captures, per module, its input X (already normed), its attention probabilities A_h and
    its real output before any post-norm or residual add (``StackSpec.attn_proj_path``: the raw ``self_attn``
    output for Gemma 3, the W_o projection before the LayerNorm for BERT/ALBERT).  The recomputation runs in
    float64 from the captured tensors (recorded in float32, exact for a bfloat16 or float16 model too) and from
    the weights converted to float64 (exact from any dtype), so the error measures the model's own rounding.
    For T5 cross-attention X for keys and values is the encoder's final output.  Returns the max absolute error
    per module (fp32 models hold it to ~1e-6; bfloat16 models to about one bfloat16 unit roundoff, 2**-8, of
    the output's scale: :meth:`IdentityResult.holds` knows the tolerance of each dtype).
    ``matrices(stack, layer, cross)`` overrides where W_vo comes from (tests use it to show a wrong W_vo fails).
    """
    get = matrices or (lambda s, l, c: head_matrices(lm, l, s, c))
    raw: dict[tuple[str, str], list[torch.Tensor]] = {}

    def keep(key: tuple[str, str]) -> Callable[[torch.nn.Module, object, object], None]:
        def hook(_m: torch.nn.Module, _inp: object, out: object) -> None:
            raw.setdefault(key, []).append(first_output(out).detach()[0].float().cpu())

        return hook

    with Hooks() as hooks:
        for spec in lm.adapter.stacks:
            for layer_mod in distinct(lm.adapter.layer_modules(lm.model, spec.name)):  # shared: once per use
                hooks.post(get_module(layer_mod, spec.attn_proj_path), keep((spec.name, "attn")))
                if spec.cross_proj_path:
                    hooks.post(get_module(layer_mod, spec.cross_proj_path), keep((spec.name, "cross")))
        trace = capture(lm, text, attentions=True, truncate=truncate, decoder_text=decoder_text)

    checks: list[IdentityCheck] = []
    traces = {
        spec.name: (trace.encoder if (trace.encoder is not None and spec is not lm.adapter.stacks[-1]) else trace)
        for spec in lm.adapter.stacks
    }
    for spec in lm.adapter.stacks:
        tr = traces[spec.name]
        for kind in ("attn", "cross"):
            outs = raw.get((spec.name, kind), [])
            for l, real in enumerate(outs):
                A = tr.attentions[f"L{l}.{kind}"]
                X_q = tr.attn_inputs[f"L{l}.{kind}"]
                X_kv = X_q if kind == "attn" else traces[lm.adapter.stacks[0].name]["final"].float()
                hm = get(spec.name, l, kind == "cross")
                rec = hm.to(torch.float64).output(A.double(), X_kv.double())  # float64: only the model rounds
                err = (rec - real.double()).abs().max().item()
                checks.append(
                    IdentityCheck(
                        _identity_key(lm, spec.name, l, kind), spec.name, l, kind, err, real.abs().max().item()
                    )
                )
    if not checks:
        raise InputError(f"{lm.name}: no attention module outputs were captured")
    return IdentityResult(tuple(checks), lm.name, tuple(trace.tokens), trace, model_dtype=dtype_name(lm.dtype))


# ---- cluster & aggregate view ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterView(Shown, view="cluster"):
    """Head h at query position t read as cluster & aggregate (seed 000, sec. 2.2.1 and A.2).

    ``memberships`` [S]: the attention row A_h[t] (soft-cluster membership of every key position).
    ``centroid`` [D]: ``A_h[t] X``, the membership-weighted mean of the (normed) inputs the query moves to;
    ``filtered_centroid`` [D]: the head's output ``centroid W_vo,h + b_v,h W_o,h`` added to the residual.
    ``self_mass``: ``A_h[t, t]`` (0 for cross-attention, where the query is not among the keys);
    ``foreign_mass = 1 - self_mass``.  Because ``centroid - x_t = foreign_mass * (foreign_centroid - x_t)``,
    the query moves ``move_fraction = foreign_mass`` of the way from x_t to the centroid of the *foreign*
    positions: the self-association pull of A.2 is exactly the self mass.  ``move_distance`` =
    ||centroid - x_t||, ``foreign_distance`` = ||foreign_centroid - x_t||, ``cos_query_centroid`` the cosine
    between x_t and the centroid.
    """

    layer: int
    head: int
    position: int
    kind: str
    tokens: tuple[str, ...]
    memberships: torch.Tensor
    centroid: torch.Tensor
    filtered_centroid: torch.Tensor
    self_mass: float
    foreign_mass: float
    move_fraction: float
    move_distance: float
    foreign_distance: float
    cos_query_centroid: float
    top_members: tuple[tuple[int, str, float], ...] = field(default=())

    def _columns(self, table: str = "members") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        ident = {"layer": self.layer, "head": self.head, "position": self.position, "kind": self.kind}
        scalars = {
            k: getattr(self, k)
            for k in (
                "self_mass",
                "foreign_mass",
                "move_fraction",
                "move_distance",
                "foreign_distance",
                "cos_query_centroid",
            )
        }
        S = len(self.memberships)

        def members() -> Columns:
            return long_table(
                [("key_position", range(S))],
                {"membership": self.memberships.float()},
                by_axis={"key_position": {"key_token": list(self.tokens)[:S]}},
                constants={**ident, **scalars},
            )

        def vectors() -> Columns:
            return long_table(
                [("dim", range(len(self.centroid)))],
                {"centroid": self.centroid.float(), "filtered_centroid": self.filtered_centroid.float()},
                constants=ident,
            )

        return pick(table, {"members": members, "vectors": vectors}, "a ClusterView")

    def to_pandas(self, table: str = "members") -> DataFrame:
        """The view as a table (pandas; docs/notebooks.md, "Tables"): ``members`` one row per key position with
        its ``membership`` A_h[t, s] and the view's scalars repeated (so views concatenate); ``vectors`` the
        centroid and the filtered centroid, one row per dim."""
        return frame(self._columns(table))


def cluster_view(trace: Trace, hm: HeadMatrices, head: int, position: int = -1, *, top: int = 5) -> ClusterView:
    """The cluster & aggregate view of one head at one query position, from a trace captured with
    ``attentions=True`` and the layer's :class:`HeadMatrices` (self- or cross-attention)."""
    kind = "cross" if hm.cross else "attn"
    key = f"L{hm.layer}.{kind}"
    if key not in trace.attentions:
        raise InputError(f"the trace has no attention {key!r}; capture with attentions=True")
    A = trace.attentions[key].float()
    X_q = trace.attn_inputs[key].float()
    if hm.cross:
        if trace.encoder is None:
            raise InputError("cross-attention needs the encoder trace")
        X_kv, key_tokens = trace.encoder["final"].float(), tuple(trace.encoder.tokens)
    else:
        X_kv, key_tokens = X_q, tuple(trace.tokens)
    h = hm._check(head)
    T = A.shape[1]
    if not -T <= position < T:
        raise InputError(f"position {position} out of range for {T} tokens")
    t = position % T
    row = A[h, t]
    centroid = row @ X_kv
    filtered = hm.vo(h).apply(centroid) + hm.vo_bias(h)
    x = X_q[t]
    self_mass = float(row[t]) if not hm.cross else 0.0
    foreign = 1.0 - self_mass
    if hm.cross:
        fc = centroid
    else:
        w = row.clone()
        w[t] = 0
        fc = (w @ X_kv) / w.sum() if w.sum() > 0 else x
    cos = torch.nn.functional.cosine_similarity(x, centroid, dim=0).item()
    order = torch.argsort(row, descending=True)[:top]
    members = tuple((int(j), key_tokens[int(j)], float(row[j])) for j in order)
    return ClusterView(
        layer=hm.layer,
        head=h,
        position=t,
        kind=kind,
        tokens=key_tokens,
        memberships=row,
        centroid=centroid,
        filtered_centroid=filtered,
        self_mass=self_mass,
        foreign_mass=foreign,
        move_fraction=foreign,
        move_distance=float((centroid - x).norm()),
        foreign_distance=float((fc - x).norm()),
        cos_query_centroid=cos,
        top_members=members,
    )


@dataclass(frozen=True)
class SelfMass(Shown, view="self_mass"):
    """Mean attention mass a query puts on itself, per layer and head (the self-association pull, A.2).

    ``mass`` [L, H]: mean over query positions of A_h[t, t]; ``uniform`` [L, H]: the same mean for uniform
    attention over the visible keys (1/(t+1) causal, 1/T bidirectional), so ``mass / uniform`` < 1 means
    the head attenuates self relative to chance.  Causal stacks skip t = 0 (it can only attend to itself).
    """

    stack: str
    mass: torch.Tensor
    uniform: torch.Tensor
    positions: int
    sink_removed: bool = False

    @property
    def ratio(self) -> torch.Tensor:
        return self.mass / self.uniform

    def _columns(self, table: str = "heads") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        L, H = self.mass.shape
        return pick(
            table,
            {
                "heads": lambda: long_table(
                    [("layer", range(L)), ("head", range(H))],
                    {"mass": self.mass.float(), "uniform": self.uniform.float(), "ratio": self.ratio.float()},
                    constants={"stack": self.stack},
                )
            },
            "a SelfMass",
        )

    def to_pandas(self, table: str = "heads") -> DataFrame:
        """Self mass per (layer, head), next to uniform attention (pandas; docs/notebooks.md, "Tables")."""
        return frame(self._columns(table), {"positions": self.positions})


def self_mass(trace: Trace, causal: bool | None = None, sink: bool = False) -> SelfMass:
    """Self-attention mass per layer and head from a trace captured with ``attentions=True``.

    ``sink``: the attention-sink control: key position 0 is removed and each row renormalised over the other
    keys (``A[t, t] / sum_{j >= 1} A[t, j]``; uniform becomes 1/t causal, 1/(T-1) bidirectional), so a head that dumps
    its mass on the first token is compared with chance over the keys it has left; queries start at 1 (causal:
    at 2, where a second key remains)."""
    keys = sorted((k for k in trace.attentions if k.endswith(".attn")), key=lambda k: int(k[1:].split(".")[0]))
    if not keys:
        raise InputError("the trace has no self-attention probabilities; capture with attentions=True")
    if causal is None:
        causal = bool(torch.triu(trace.attentions[keys[0]][0], 1).abs().max() == 0) and len(trace.tokens) > 1
    T = len(trace.tokens)
    if sink and T < (3 if causal else 2):
        raise InputError(f"the attention-sink control needs at least {3 if causal else 2} tokens, got {T}")
    masses, unif = [], []
    for k in keys:
        A = trace.attentions[k].float()
        T = A.shape[-1]
        diag = torch.diagonal(A, dim1=-2, dim2=-1)  # [H, T]
        t = torch.arange(T, dtype=torch.float32)
        if sink:
            diag = diag / A[..., 1:].sum(-1).clamp_min(1e-30)  # the other keys' own sum: 1 - A[t, 0] loses digits
            start, u = (2, 1.0 / t.clamp_min(1)) if causal else (1, torch.full((T,), 1.0 / (T - 1)))
        else:
            start = 1 if (causal and T > 1) else 0
            u = 1.0 / (t + 1) if causal else torch.full((T,), 1.0 / T)
        masses.append(diag[:, start:].mean(-1))
        unif.append(u[start:].mean().expand(A.shape[0]))
    return SelfMass(
        stack=trace.stack,
        mass=torch.stack(masses),
        uniform=torch.stack(unif),
        positions=len(trace.tokens),
        sink_removed=sink,
    )


@dataclass(frozen=True)
class HeadStats(Shown, view="head_stats"):
    """Per layer and head summaries of the filters, all computed from the factors: ``vo_norm``/``qk_norm``
    [L, H] Frobenius norms, ``vo_sigma1`` the largest singular value of W_vo,h, ``vo_copying`` the copying
    score ``sum Re(eig) / sum |eig|`` of W_vo,h (:meth:`FactoredMatrix.copying_score`).  ``qk_note``: where the
    family breaks ``qk_bilinear`` (q/k norms, soft-capped scores), why ||W_qk,h|| is only a summary of the raw
    projections and not the scale of the scores; else empty."""

    stack: str
    cross: bool
    layers: list[int]
    vo_norm: torch.Tensor
    qk_norm: torch.Tensor
    vo_sigma1: torch.Tensor
    vo_copying: torch.Tensor
    qk_note: str = ""

    def _columns(self, table: str = "heads") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        return pick(
            table,
            {
                "heads": lambda: long_table(
                    [("layer", list(self.layers)), ("head", range(self.vo_norm.shape[1]))],
                    {k: getattr(self, k).float() for k in ("vo_norm", "qk_norm", "vo_sigma1", "vo_copying")},
                    constants={"stack": self.stack, "cross": self.cross},
                )
            },
            "HeadStats",
        )

    def to_pandas(self, table: str = "heads") -> DataFrame:
        """Per (layer, head) filter statistics (pandas; docs/notebooks.md, "Tables")."""
        return frame(self._columns(table), {"qk_note": self.qk_note})


def head_stats(
    lm: LoadedModel, stack: str | None = None, cross: bool = False, layers: list[int] | None = None
) -> HeadStats:
    """:class:`HeadStats` of every (or the given) layer of one stack."""
    name = _stack_name(lm, stack)
    layers = list(range(lm.n_layers)) if layers is None else layers
    vo_n, qk_n, s1, cp = [], [], [], []
    for l in layers:
        hm = head_matrices(lm, l, name, cross)
        vo, qk = hm.vo(), hm.qk()
        vo_n.append(vo.norm())
        qk_n.append(qk.norm())
        s1.append(vo.singular_values()[..., 0])
        cp.append(vo.copying_score())
    why = lm.adapter.broken(lm.model.config).get("qk_bilinear", "")
    note = f"||W_qk,h|| summarises the raw projections, not the scores: {why}" if why else ""
    return HeadStats(
        name, cross, layers, torch.stack(vo_n), torch.stack(qk_n), torch.stack(s1), torch.stack(cp), qk_note=note
    )


__all__ = [
    "HeadStats",
    "head_stats",
    "HeadMatrices",
    "head_matrices",
    "attention_identity",
    "IdentityResult",
    "IdentityCheck",
    "ClusterView",
    "cluster_view",
    "SelfMass",
    "self_mass",
]
