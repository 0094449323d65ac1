"""CodeGen: GPT-J's block (parallel, one ``ln_1``, interleaved partial rotary) with one fused ``qkv_proj`` laid out
for the ``mp_num`` = 4 model-parallel shards it was trained with: its output rows are ``mp_num`` shards, each
[q | v | k] of ``D / mp_num`` rows (note: v before k); a head's features are the concatenated shards' slices."""

from __future__ import annotations

from typing import Any

from . import gptj
from .base import HeadWeights, HFModule, variant
from .heads import from_splits, rows, split_rows


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H, D = config.n_head, config.n_embd
    d, mp = D // H, getattr(attn, "mp_num", 4)
    w, b = rows(attn.qkv_proj)
    w, b = w.reshape(mp, 3, D // mp, D), b.reshape(mp, 3, D // mp)  # rows: shard, (q, v, k), local feature
    # each of q, v, k in feature order, as the module reshapes them
    q, v, k = (split_rows(w[:, i].reshape(D, D), b[:, i].reshape(D), H, d) for i in range(3))
    return from_splits(q, k, v, rows(attn.out_proj), attn.scaling, notes=gptj.rotary_notes(config))


ADAPTER = variant(gptj.ADAPTER, "codegen", head_weights_fn=head_weights)
