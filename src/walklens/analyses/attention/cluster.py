"""Attention read as cluster & aggregate (seed 000, sec. 2.2.1, A.2): one query position's soft-cluster
memberships and the centroid it moves to (:class:`ClusterView`), and the self-association pull, the mass each
head's queries put on themselves against chance (:class:`SelfMass`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import Columns, DataFrame, frame, long_table, pick
from .matrices import HeadMatrices

if TYPE_CHECKING:
    from ...core.trace import Trace


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
