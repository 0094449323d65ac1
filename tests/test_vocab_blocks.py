"""The vocabulary matrix in row blocks (issue 52, walklens.core.vocab_blocks): when the model streams or the trace is
opened from disk, the encoding walk (raw reading and logit lens) converts the token matrix to float32 one block of
rows at a time, and its result is the walk read against the whole float32 matrix bit for bit; the walk's working
memory is bounded by a block, not by |V| x D."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import walklens
from walklens import testing
from walklens.core import vocab_blocks
from walklens.core.loading import load_model
from walklens.core.vocab_blocks import RowBlocks
from walklens.testing import tiny_model

TEXT = "the capital of france is paris and the king ran to the river"
FAMILIES = ["llama", "gpt2", "gemma2", "bert"]  # untied head, tied head, softcapped logits, a head with a transform


def bits(x: torch.Tensor) -> torch.Tensor:
    """A tensor's bits (a float's NaN equals itself, -0.0 differs from 0.0)."""
    x = x.contiguous()
    return x.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[x.element_size()]) if x.is_floating_point() else x


def differ(a: Any, b: Any) -> list[str]:
    """The fields in which two walks differ, bit for bit."""
    out = []
    for name, v in vars(a).items():
        w = getattr(b, name)
        if isinstance(v, torch.Tensor):
            if v.shape != w.shape or not torch.equal(bits(v), bits(w)):
                out.append(name)
        elif name != "encoder" and v != w:
            out.append(name)
    return out


VOCAB = 1031  # 16 blocks of 64 token rows and 7 more (the tiny tokenizer's 126 ids are the first)


def block_of(monkeypatch: pytest.MonkeyPatch, rows: int, width: int) -> None:
    """Blocks of ``rows`` token rows of ``width`` float32 values."""
    monkeypatch.setattr(vocab_blocks, "BLOCK_BYTES", rows * 4 * width)


def wide_vocab(monkeypatch: pytest.MonkeyPatch, family: str, vocab: int = VOCAB) -> Any:
    """The tiny bfloat16 ``family`` model with a vocabulary of ``vocab`` rows (many blocks)."""
    real = testing.tiny_config_of
    monkeypatch.setattr(testing, "tiny_config_of", lambda f, _v: real(f, vocab))
    lm = tiny_model(family, dtype="bfloat16")
    monkeypatch.setattr(testing, "tiny_config_of", real)
    return lm


def test_row_blocks_are_the_whole_float32_matrix() -> None:
    src = torch.randn(1001, 40).to(torch.bfloat16)
    whole, blocks = src.float(), RowBlocks(src, rows=64)
    x = torch.randn(13, 40)
    assert blocks.blocks()[-2:] == [(832, 896), (896, 1001)]  # the last 41 rows join the block before
    assert vocab_blocks.block_rows(40, 100 * 160) == 64 and vocab_blocks.block_rows(40, 200 * 160) == 192
    assert torch.equal(blocks[3:500], whole[3:500]) and blocks[3:500].data_ptr() % 64 == whole[3:500].data_ptr() % 64
    ids = torch.tensor([[0, 1000], [5, 7]])
    assert torch.equal(blocks[ids], whole[ids])
    assert torch.equal(bits(blocks.mm(x)), bits(x @ whole.t()))
    assert torch.equal(bits(blocks.mm(x, 30, 902)), bits(torch.mm(x, whole[30:902].t())))
    bias = torch.randn(1001)
    assert torch.equal(bits(blocks.linear(x, bias)), bits(torch.nn.functional.linear(x, whole, bias)))
    norms = blocks.per_block(lambda b, _0, _1: b.norm(dim=-1))
    assert torch.equal(bits(norms), bits(whole.norm(dim=-1)))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_blocked_walk_equals_the_whole_matrix_walk(family: str, tmp_path: Path, monkeypatch) -> None:
    """An opened trace (blocked, 64 token rows a block) against the trace in memory (the whole float32 matrix), in
    bfloat16 (each block converted from the model's own weight): every field bit for bit, for both readings,
    both metrics, with and without the top k and the softmax, and the bfloat16 screen."""
    lm = wide_vocab(monkeypatch, family)
    whole = walklens.capture(lm, TEXT)
    opened = walklens.capture(lm, TEXT, to=tmp_path / "t")
    block_of(monkeypatch, 64, whole.d_model)
    cases: list[dict[str, Any]] = [
        {"norm": "none", "against": "embed"},
        {"norm": "final", "metric": "cosine", "chunk_rows": 5},
        {"norm": "final", "k": 0, "probs": False, "chunk_rows": 9},
        {"norm": "none", "metric": "cosine", "k": 3, "against": "unembed"},
        {"norm": "final", "k": 0, "probs": False, "screen": True},
    ]
    for opts in cases:
        if family == "bert" and opts["norm"] == "none":
            opts["against"] = "unembed"
        a = walklens.encoding_walk(whole, progress=False, **opts)
        b = walklens.encoding_walk(opened, progress=False, **opts)
        assert differ(a, b) == [], opts


def test_a_streamed_model_walks_blocked_and_equals_the_model_in_memory(tmp_path: Path, monkeypatch) -> None:
    """A streamed model reads its matrix in blocks even from a trace in memory: the same walk as the model in
    memory, and its head's weight is its own bfloat16 tensor again after the walk."""
    folder = tmp_path / "m"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src = wide_vocab(monkeypatch, "llama")
        src.model.save_pretrained(str(folder))
        src.tokenizer.save_pretrained(str(folder))
    whole = load_model(str(folder), dtype="bfloat16", progress=False, stream=False)
    streamed = load_model(str(folder), dtype="bfloat16", progress=False, stream=True)
    block_of(monkeypatch, 128, whole.d_model)
    head = streamed.model.lm_head.weight
    before = head.data_ptr()
    for norm in ("none", "final"):
        a = walklens.encoding_walk(walklens.capture(whole, TEXT), norm=norm, progress=False, chunk_rows=6)
        b = walklens.encoding_walk(walklens.capture(streamed, TEXT), norm=norm, progress=False, chunk_rows=6)
        assert differ(a, b) == [], norm
    assert head.data_ptr() == before and head.dtype == torch.bfloat16


def peak_bytes(fn: Callable[[], Any]) -> int:
    """The most bytes held at once by the tensors ``fn`` allocates (torch's profiler: every allocation and free)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    held = peak = 0
    for _t, action, _key, size in prof._memory_profile().timeline:
        held += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("norm", ["none", "final"])
def test_the_blocked_walk_holds_a_block_not_the_matrix(norm: str, tmp_path: Path, monkeypatch) -> None:
    """Every tensor the walk allocates, counted (|V| = 16,384, D = 32, chunks of 4 rows): from the trace in memory
    the walk holds the float32 matrix on top of what the blocked walk holds; from the opened trace, in blocks of 64
    token rows, it holds a few float32 score rows of a chunk and one block; and its peak follows the block."""
    lm = wide_vocab(monkeypatch, "llama", 64 * 256)
    whole = walklens.capture(lm, TEXT)
    opened = walklens.capture(lm, TEXT, to=tmp_path / "t")
    V, D = lm.model.lm_head.weight.shape
    matrix, chunk = V * D * 4, 4 * V * 4  # the float32 matrix; one chunk's float32 scores [4, V]

    def walk(trace: Any) -> Callable[[], Any]:
        return lambda: walklens.encoding_walk(trace, norm=norm, progress=False, chunk_rows=4, points="L1.*")

    unblocked = peak_bytes(walk(whole))
    block_of(monkeypatch, 64, D)
    small = peak_bytes(walk(opened))
    block_of(monkeypatch, 4096, D)
    large = peak_bytes(walk(opened))
    assert unblocked >= small + matrix
    assert small <= 6 * chunk + 64 * D * 4 + (64 << 10), (small, chunk)
    assert large - small >= (4096 - 64) * D * 4 // 2, (large, small)
