"""The :class:`Trace`: every size-D vector of one forward pass (seed 000, Figure 1), labelled.

Point names (one scheme for every family, TransformerLens-style):

- ``embed``                 token embedding w_t as it enters the stack (Gemma: already scaled by sqrt(D);
                            ALBERT: mapped from E to D)
- ``L{l}.resid_pre``        input of layer l
- ``L{l}.attn_out``         what self-attention adds to the residual (post-norm: the W_o projection added
                            before the norm)
- ``L{l}.resid_mid``        residual after self-attention (not for parallel-block families)
- ``L{l}.cross_out``, ``L{l}.resid_cross``   cross-attention contribution and residual after it (T5 decoder)
- ``L{l}.mlp_out``          what the feed-forward block adds
- ``L{l}.resid_post``       output of layer l
- ``final``                 the final normed output (c_t for an encoder, d_t for a decoder; eq. 8)

A T5 trace holds the decoder stack in ``hidden`` and the encoder stack as ``trace.encoder`` (a Trace).

Storage: :meth:`Trace.save` / :meth:`Trace.load`, one safetensors file read whole; or a trace folder written point by
point as the forward pass computes them (``capture(..., to=DIR)``, :mod:`walklens.core.tracewrite`) and opened
lazily by :meth:`Trace.open`, whose ``hidden`` reads one point at a time (:class:`~walklens.core.tracedir.PointStack`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ..base.display import Shown
from ..base.errors import InputError
from ..base.frames import Columns, DataFrame, concat_columns, frame, long_table, pick
from .tracedir import PointStack, TraceFolder, open_folder

if TYPE_CHECKING:
    from .loading import LoadedModel

_LAYER_POINT = re.compile(r"^L(\d+)\.(\w+)$")


@dataclass
class Trace(Shown, view="trace"):
    """Captured vectors of one text. ``hidden`` is [points, tokens, D]; ``points`` labels its first axis."""

    tokens: list[str]
    token_ids: torch.Tensor
    points: list[str]
    hidden: torch.Tensor
    model_name: str = ""
    family: str = ""
    stack: str = ""
    n_layers: int = 0
    attentions: dict[str, torch.Tensor] = field(default_factory=dict)
    attn_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    encoder: Trace | None = None
    lm: LoadedModel | None = field(default=None, repr=False, compare=False)
    #: The dtype the model ran in (``hidden`` has the record dtype, float32 by default).
    model_dtype: str = "float32"

    def _headline(self) -> str:
        """The head line of its text repr (:mod:`walklens.base.display`)."""
        return f"{self.model_name} · {len(self.tokens)} tokens × {len(self.points)} points"

    def __post_init__(self) -> None:
        if self.hidden.dim() != 3:
            raise ValueError(f"hidden must be [points, tokens, D], got {tuple(self.hidden.shape)}")
        if self.hidden.shape[0] != len(self.points):
            raise ValueError(f"{len(self.points)} point labels for {self.hidden.shape[0]} captured points")
        if self.hidden.shape[1] != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} tokens for {self.hidden.shape[1]} positions")

    # --- lookup ------------------------------------------------------------------------------------------
    @property
    def d_model(self) -> int:
        return self.hidden.shape[-1]

    def point_index(self, name: str | tuple[str, int]) -> int:
        """Index of a point; accepts ``"L3.resid_pre"``, ``("resid_pre", 3)`` or ``("resid_post", -1)``."""
        if isinstance(name, tuple):
            kind, layer = name
            if layer < 0:
                layer += self.n_layers
            name = f"L{layer}.{kind}"
        try:
            return self.points.index(name)
        except ValueError:
            raise InputError(
                f"no captured point {name!r}; captured: {', '.join(self.points[:8])}"
                f"{' ...' if len(self.points) > 8 else ''}"
            ) from None

    def __getitem__(self, name: str | tuple[str, int]) -> torch.Tensor:
        """The [tokens, D] vectors of one point."""
        return self.hidden[self.point_index(name)]

    def layer_of(self, point: str) -> int | None:
        m = _LAYER_POINT.match(point)
        return int(m.group(1)) if m else None

    def kind_of(self, point: str) -> str:
        m = _LAYER_POINT.match(point)
        return m.group(2) if m else point

    def residual_points(self) -> list[str]:
        """Points on the residual stream in walk order (embed, resid_pre/mid/cross/post ..., final)."""
        keep = ("resid_pre", "resid_mid", "resid_cross", "resid_post")
        out = [p for p in self.points if p in ("embed", "final") or self.kind_of(p) in keep]
        return out

    # --- numbers -----------------------------------------------------------------------------------------
    def logits(self, point: str = "final") -> torch.Tensor:
        """Logits recomputed from a captured point through the model's own unembedding (eq. 12), in the model's
        dtype (a bfloat16 model's head runs in bfloat16, as in its own forward pass), returned as float32."""
        if self.lm is None:
            raise InputError("this trace is not attached to a model; pass lm= when loading it")
        x = self[point].float()
        with torch.no_grad():
            return self.lm.adapter.logits(self.lm.model, x.to(self.lm.device)).float().cpu()

    # --- storage -----------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write to one safetensors file (tensors) with JSON metadata; no pickle involved."""
        from safetensors.torch import save_file

        path = Path(path)
        tensors: dict[str, torch.Tensor] = {}
        meta: dict[str, Any] = {}

        def put(prefix: str, tr: Trace) -> None:
            tensors[f"{prefix}hidden"] = tr.hidden.contiguous()
            tensors[f"{prefix}token_ids"] = tr.token_ids.contiguous()
            for k, v in tr.attentions.items():
                tensors[f"{prefix}attn/{k}"] = v.contiguous()
            for k, v in tr.attn_inputs.items():
                tensors[f"{prefix}attn_in/{k}"] = v.contiguous()
            meta[prefix or "main"] = json.dumps(
                {
                    "tokens": tr.tokens,
                    "points": tr.points,
                    "model_name": tr.model_name,
                    "family": tr.family,
                    "stack": tr.stack,
                    "n_layers": tr.n_layers,
                    "model_dtype": tr.model_dtype,
                }
            )

        put("", self)
        if self.encoder is not None:
            put("encoder/", self.encoder)
        meta["walklens_trace"] = "1"
        save_file(tensors, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path, lm: LoadedModel | None = None) -> Trace:
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: no such trace file")
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("walklens_trace") != "1":
                raise InputError(f"{path}: not a walklens trace")
            tensors = {k: f.get_tensor(k) for k in f.keys()}

        def get(prefix: str) -> Trace:
            m = json.loads(meta[prefix or "main"])
            att = {k[len(prefix) + 5 :]: v for k, v in tensors.items() if k.startswith(prefix + "attn/")}
            ain = {k[len(prefix) + 8 :]: v for k, v in tensors.items() if k.startswith(prefix + "attn_in/")}
            return cls(
                tokens=m["tokens"],
                token_ids=tensors[prefix + "token_ids"],
                points=m["points"],
                hidden=tensors[prefix + "hidden"],
                model_name=m["model_name"],
                family=m["family"],
                stack=m["stack"],
                n_layers=m["n_layers"],
                attentions=att,
                attn_inputs=ain,
                lm=lm,
                model_dtype=m.get("model_dtype", "float32"),
            )

        tr = get("")
        if "encoder/" in meta:
            tr.encoder = get("encoder/")
        return tr

    @classmethod
    def open(
        cls, folder: str | os.PathLike[str] | TraceFolder, lm: LoadedModel | None = None, *, item: int | None = None
    ) -> Trace:
        """The trace in a trace folder (``capture(..., to=folder)``), read lazily: its ``hidden`` reads each point
        from its memory-mapped shard when asked for (each shard's checksum checked the first time), so an analysis
        that needs only the trace and the token matrix or head (:func:`~walklens.analyses.walks.encoding_walk`)
        runs without the model's layers.  ``lm``: attached, refused when the folder was captured from another
        model.  ``item``: which text of a folder of several (``capture_texts``)."""
        source = folder if isinstance(folder, TraceFolder) else open_folder(folder, lm)
        if item is None and source.texts > 1:
            raise InputError(f"{source.where}: holds {source.texts} texts; pass item= (0 to {source.texts - 1})")
        if item is not None and not 0 <= item < source.texts:
            raise InputError(f"{source.where}: holds {source.texts} texts, no item {item}")
        m, i = source.manifest, item or 0
        traces = [
            cls(
                tokens=list(s["texts"][i]["tokens"]),
                token_ids=torch.tensor(s["texts"][i]["token_ids"], dtype=torch.long),
                points=list(s["points"]),
                hidden=cast(torch.Tensor, PointStack(source, s["name"], i)),
                model_name=m["model"]["name"],
                family=str(m["model"].get("family", "")),
                stack=s["name"],
                n_layers=s["n_layers"],
                lm=lm,
                model_dtype=m["model_dtype"],
            )
            for s in m["stacks"]
        ]
        main = traces[-1]
        main.encoder = traces[0] if len(traces) > 1 else None
        return main

    # --- tables ------------------------------------------------------------------------------------------
    def _columns(self, table: str = "hidden") -> Columns:
        """The plain columns of :meth:`to_pandas` (encoder rows first on an encoder-decoder model)."""
        parts = ([self.encoder] if self.encoder is not None else []) + [self]

        def hidden(tr: Trace) -> Columns:
            return long_table(
                [("point", tr.points), ("position", range(len(tr.tokens))), ("dim", range(tr.d_model))],
                {"value": tr.hidden.float()},
                constants={"stack": tr.stack},
                by_axis={
                    "point": {"layer": [tr.layer_of(p) for p in tr.points], "kind": [tr.kind_of(p) for p in tr.points]},
                    "position": {"token": tr.tokens, "token_id": tr.token_ids.reshape(-1)},
                },
            )

        def attentions(tr: Trace) -> list[Columns]:
            return [
                long_table(
                    [("head", range(a.shape[0])), ("position", range(a.shape[1])), ("key_position", range(a.shape[2]))],
                    {"prob": a.float()},
                    constants={"stack": tr.stack, "module": name, "layer": tr.layer_of(name), "kind": tr.kind_of(name)},
                )
                for name, a in tr.attentions.items()
            ]

        return pick(
            table,
            {
                "hidden": lambda: concat_columns([hidden(tr) for tr in parts]),
                "attentions": lambda: concat_columns([c for tr in parts for c in attentions(tr)]),
            },
            "a Trace",
        )

    def to_pandas(self, table: str = "hidden") -> DataFrame:
        """The trace as a long table (pandas; docs/notebooks.md, "Tables"): ``hidden`` one row per (stack, point,
        position, dim) with the vector's ``value``; ``attentions`` one row per (stack, module, head, position,
        key_position) with ``prob`` (captured with ``attentions=True``)."""
        return frame(
            self._columns(table), {"model": self.model_name, "family": self.family, "model_dtype": self.model_dtype}
        )


__all__ = ["Trace"]
