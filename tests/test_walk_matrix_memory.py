"""The walk's memory estimate counts the float32 token rows the walk holds: for a streamed model the largest row
block it reads (walklens.core.vocab_blocks, a short last block joined to the one before included), for a model in
memory in a low-precision dtype the float32 copies of the vocabulary matrix (walklens.analyses.walks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import walklens
import walklens.costs as C
from _toy import saved_tiny
from walklens.analyses.walks import walk_matrix_bytes
from walklens.core import vocab_blocks
from walklens.core.loading import load_model
from walklens.testing import tiny_model

TEXT = "The capital of France is Paris, and"


def test_a_streamed_walk_holds_the_block_the_estimate_counts(tmp_path: Path, monkeypatch) -> None:
    lm = load_model(str(saved_tiny("gpt2", "float32", tmp_path)), progress=False, stream=True)
    V, W = lm.embedding_matrix().shape
    assert V % vocab_blocks.ROW_UNIT  # (a remainder: the last block joins the one before)
    monkeypatch.setattr(vocab_blocks, "BLOCK_BYTES", vocab_blocks.ROW_UNIT * W * 4)  # blocks of 64 rows
    held: list[int] = []
    real = vocab_blocks._placed

    def placed(n: int, width: int, row0: int, device: Any) -> torch.Tensor:
        held.append(n * width * 4)
        return real(n, width, row0, device)

    monkeypatch.setattr(vocab_blocks, "_placed", placed)
    trace = walklens.capture(lm, TEXT)
    for norm in ("none", "final"):
        walklens.encoding_walk(trace, lm=lm, norm=norm, progress=False)
    assert held and max(held) == vocab_blocks.largest_block(V, W) * W * 4 > vocab_blocks.ROW_UNIT * W * 4
    assert walk_matrix_bytes(lm) == max(held) + V * 4


def test_in_memory_the_estimate_counts_a_float32_copy_only_in_low_precision(tmp_path: Path) -> None:
    folder = saved_tiny("llama", "bfloat16", tmp_path)
    f32 = load_model(str(folder), progress=False, stream=False)
    bf16 = load_model(str(folder), dtype="bfloat16", progress=False, stream=False)
    V, W = f32.embedding_matrix().shape
    assert walk_matrix_bytes(f32) == V * 4  # the walk reads the model's own float32 matrix
    untied = f32.model.get_output_embeddings().weight is not f32.embedding_matrix()
    assert walk_matrix_bytes(bf16) == (V * W * (2 + untied) + V) * 4  # M, and the embedding (and head) upcast


def test_walk_need_adds_the_matrix_to_the_reading() -> None:
    sh = C.model_shape(tiny_model("llama"))
    plan = C.WalkPlan(points=4, captured=4, shown=4, k=5)
    assert C.walk_need(sh, 16, plan, matrix=3e11).memory > 3e11 > C.walk_need(sh, 16, plan).memory


def test_the_explorers_walk_view_counts_the_rows_its_model_holds() -> None:
    """The explorer checks a walk view against the budget with the loaded model's own token rows: a bfloat16 model in
    memory holds the float32 copies the walk reads, which its shape now carries into the estimate."""
    from dataclasses import replace

    from walklens.server.bounds import VIEW_COSTS
    from walklens.server.state import Explorer

    lm = tiny_model("llama", dtype="bfloat16")
    sh = Explorer({"llama": lm}).shape("llama")
    assert sh.walk_rows == walk_matrix_bytes(lm) > lm.embedding_matrix().numel() * 4
    with_rows, without = VIEW_COSTS["walk"](sh, 16), VIEW_COSTS["walk"](replace(sh, walk_rows=0.0), 16)
    assert with_rows.memory - without.memory == walk_matrix_bytes(lm)
