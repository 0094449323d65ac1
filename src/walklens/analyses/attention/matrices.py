"""The filters of one attention module (seed 000, A.3): W_vo,h and W_qk,h of every head, kept factored
(:class:`HeadMatrices`, with the bias terms of :mod:`walklens.analyses.attention`), and their per-head summaries
computed
from the factors (:class:`HeadStats`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...base.delegate import Delegated
from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import Columns, DataFrame, concat_columns, frame, long_table, pick
from ...core.ov import FactoredMatrix
from ...models.base import HeadWeights

if TYPE_CHECKING:
    from ...core.loading import LoadedModel


@dataclass(frozen=True)
class HeadMatrices(Shown, view="head_matrices"):
    """W_vo,h and W_qk,h of every head of one attention module (seed 000, A.3), kept factored.

    ``weights`` are the module's per-head weights in row convention (:class:`~walklens.models.HeadWeights`).
    ``W_vo,h = W_v,kv(h) W_o,h`` [D, D] and ``W_qk,h = W_q,h W_k,kv(h)^T`` [D, D]; the softmax argument is
    ``scale * x W_qk,h y^T`` plus the bias terms described in :mod:`walklens.analyses.attention` and any position bias.
    For cross-attention (T5 decoder) the key/value side is the encoder's final output.
    """

    layer: int
    stack: str
    cross: bool
    family: str
    weights: HeadWeights

    n_heads = Delegated[int]("weights")
    d_head = Delegated[int]("weights")
    d_model = Delegated[int]("weights")
    kv_head = Delegated[tuple[int, ...]]("weights")
    scale = Delegated[float]("weights")

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
        hw = lm.head_weights(layer, spec_name, cross)
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
