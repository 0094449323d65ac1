"""oneDNN prepacking: a linear layer's weight reordered once into the matrix library's own layout, and the product
computed from it, used only where it equals ``F.linear``'s bit for bit.

``F.linear`` on a CPU bfloat16/float16 weight hands oneDNN the weight as ``nn.Linear`` stores it, and oneDNN
reorders it at every call; :func:`packed_linear` reorders it once (kept while the weight is unchanged:
:func:`walklens.core.kept.kept`) and returns the layer's product from the reordered copy.  Before a packed weight is
used its products are compared with ``F.linear``'s on probe rows (:data:`PROBE_ROWS`), bit for bit; a weight whose
products differ, a float32 weight (MKL computes those, not oneDNN) or a oneDNN build without the path is never
packed.  Measured gains and the exactness gate: docs/dtype.md.

This module holds the machinery only; switching a model's layers to it (and back on exit) is
:func:`walklens.core.interventions.prepacked_linears`, beside the other context managers that change a model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from .kept import kept

#: the row count oneDNN chooses the prepacked layout for (``hellaswag.packing.MAX_TOKENS``, a packed batch)
PACK_ROWS = 1024
#: row counts each prepacked product is checked on, bit for bit, before it is used
PROBE_ROWS = (1, 7, 64)


def prepacked_product(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``x @ W^T + bias`` from ``packed``, a weight reordered by :func:`packed_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def can_prepack(w: torch.Tensor) -> bool:
    """Whether oneDNN can prepack ``w`` here: a CPU bfloat16 or float16 weight, on a CPU with that oneDNN path."""
    if w.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if w.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return w.dtype == torch.float16 and bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


def packed_weight(mod: nn.Linear) -> torch.Tensor | None:
    """``mod``'s weight reordered once for oneDNN (kept while the weight is unchanged), or ``None`` where that is
    not possible or its products are not bit-identical to ``F.linear``'s on the probe rows."""
    return kept(mod, "prepacked", mod.weight, partial(_prepack, mod))


def _prepack(mod: nn.Linear) -> torch.Tensor | None:
    w = mod.weight
    if not can_prepack(w):
        return None
    try:
        with torch.no_grad():
            cand = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)
            g = torch.Generator().manual_seed(0)
            probes = [torch.randn(r, w.shape[1], generator=g).to(w.dtype) for r in PROBE_ROWS]
            b = None if mod.bias is None else mod.bias.detach()
            if all(torch.equal(prepacked_product(cand, b, x), nn.functional.linear(x, w, b)) for x in probes):
                return cand
    except RuntimeError:  # a oneDNN build without this path: the layer stays as it is
        pass
    return None


def packed_linear(mod: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``mod``'s product computed from its prepacked weight (a ``forward`` for the layer, for passes under
    ``torch.no_grad``: no gradient flows through the packed copy), or ``None`` where :func:`packed_weight` is."""
    packed = packed_weight(mod)
    if packed is None:
        return None
    return partial(prepacked_product, packed, None if mod.bias is None else mod.bias.detach())


__all__ = ["PACK_ROWS", "PROBE_ROWS", "can_prepack", "packed_linear", "packed_weight", "prepacked_product"]
