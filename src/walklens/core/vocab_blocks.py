"""A token matrix read in float32 row blocks (docs/scale.md): the vocabulary matrix of a model larger than memory is
never held whole in float32 -- each block of rows is converted from the model's own weight when a product needs
it and dropped after, so an encoding walk's memory is bounded by a block, not by |V| x D.

Exactness.  A bfloat16 or float16 number converts to float32 exactly, so a block holds the very values the whole
float32 copy holds, placed at the alignment its rows have in that copy; a row's norm is a reduction over that row
alone.  A product of rows ``x`` with a block is the block's columns of the product with the whole matrix only when
the block is wide enough for the kernel the whole product uses: on this CPU's float32 kernels (MKL/oneDNN, AVX-512)
a product with 17 or fewer token rows takes another kernel and sums in another order (last bits differ), while
blocks of a multiple of :data:`ROW_UNIT` rows, the last one taking in a remainder of fewer than :data:`ROW_UNIT`,
gave the whole product's columns bit for bit for every case tried (1 to 512 rows of x, D = 40 to 5,120,
|V| = 1,000 to 4,099 with remainders 0 to 80; 1 and 2 threads).  tests/test_vocab_blocks.py checks it where it
runs, and that :func:`walklens.analyses.walks.encoding_walk` reads blocked and unblocked alike, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

BLOCK_BYTES = 64 << 20  # a float32 block of token rows holds at most this many bytes (one block alive at a time)
ROW_UNIT = 64  # a block's rows are a multiple of this (a narrower product takes another kernel: see above)


def block_rows(width: int, block_bytes: int | None = None) -> int:
    """Token rows of ``width`` float32 values per block: as many as ``block_bytes`` (:data:`BLOCK_BYTES`) hold,
    rounded down to a multiple of :data:`ROW_UNIT` (at least one unit)."""
    rows = (BLOCK_BYTES if block_bytes is None else block_bytes) // (4 * max(1, width))
    return max(ROW_UNIT, rows // ROW_UNIT * ROW_UNIT)


def spans(v0: int, stop: int, rows: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` row spans of blocks of ``rows`` rows covering rows ``v0 .. stop - 1``; a last block of
    fewer than :data:`ROW_UNIT` rows joins the one before (never a product narrow enough to take another kernel)."""
    out = [(b0, min(b0 + rows, stop)) for b0 in range(v0, stop, rows)]
    if len(out) > 1 and out[-1][1] - out[-1][0] < ROW_UNIT:
        out[-2:] = [(out[-2][0], stop)]
    return out


def largest_block(n_rows: int, width: int) -> int:
    """The most rows one block of a [n_rows, width] matrix holds (:meth:`RowBlocks.blocks` of the whole matrix)."""
    return max((b1 - b0 for b0, b1 in spans(0, n_rows, block_rows(width))), default=0)


def _placed(n: int, width: int, row0: int, device: torch.device) -> torch.Tensor:
    """An empty float32 [n, width] tensor whose first row lies at the 64-byte alignment row ``row0`` has in a
    64-byte aligned [V, width] tensor (a kernel may sum in another order at another address)."""
    shift = row0 * width * 4 % 64
    if device.type != "cpu" or shift == 0:
        return torch.empty(n, width, device=device)
    raw = torch.empty(n * width * 4 + 64, dtype=torch.uint8, device=device)
    off = (shift - raw.data_ptr()) % 64
    return raw[off : off + n * width * 4].view(torch.float32).view(n, width)


class RowBlocks:
    """The rows of ``source`` [V, D] (any floating dtype) as float32 on ``device``, read ``rows`` at a time.

    Indexing gives float32 copies: a slice ``[v0:v1]`` (the block as the whole copy would hold it), an index
    tensor (the gathered rows).  :meth:`mm` and :meth:`linear` give products with the whole matrix one block at a
    time, into one [n, v1 - v0] output."""

    def __init__(self, source: torch.Tensor, device: torch.device | str = "cpu", rows: int | None = None) -> None:
        self.source = source.detach()
        self.device = torch.device(device)
        self.rows = max(1, int(rows if rows is not None else block_rows(source.shape[1])))  # rows per block
        self.shape = torch.Size(source.shape)
        self.dtype = torch.float32

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: slice | torch.Tensor) -> torch.Tensor:
        if isinstance(index, slice):
            v0, v1, step = index.indices(self.shape[0])
            if step != 1:
                raise ValueError("RowBlocks: a slice of consecutive rows")
            out = _placed(max(0, v1 - v0), self.shape[1], v0, self.device)
            return out.copy_(self.source[v0:v1])
        return self.source[index.to(self.source.device)].to(device=self.device, dtype=torch.float32)

    def blocks(self, v0: int = 0, v1: int | None = None) -> list[tuple[int, int]]:
        """The ``(start, stop)`` row spans of the blocks covering rows ``v0 .. v1 - 1``; a last block of fewer than
        :data:`ROW_UNIT` rows joins the one before (never a product narrow enough to take another kernel)."""
        return spans(v0, self.shape[0] if v1 is None else v1, self.rows)

    def mm(self, x: torch.Tensor, v0: int = 0, v1: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ M[v0:v1].T`` [n, v1 - v0], one block at a time (``out``: where it goes)."""
        stop = self.shape[0] if v1 is None else v1
        res = out if out is not None else torch.empty(x.shape[0], stop - v0, device=x.device)
        for b0, b1 in self.blocks(v0, stop):
            torch.mm(x, self[b0:b1].t(), out=res[:, b0 - v0 : b1 - v0])
        return res

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``torch.nn.functional.linear(x, M, bias)``, one block of M (and of the bias) at a time."""
        out = torch.empty(*x.shape[:-1], self.shape[0], device=x.device)
        for b0, b1 in self.blocks():
            out[..., b0:b1] = F.linear(x, self[b0:b1], None if bias is None else bias[b0:b1])
        return out

    def per_block(self, fn: Callable[[torch.Tensor, int, int], torch.Tensor]) -> torch.Tensor:
        """``fn(block, b0, b1)`` of every block, concatenated along the rows (a derived tensor, e.g. the rows'
        norms; never a float32 copy of the whole matrix)."""
        return torch.cat([fn(self[b0:b1], b0, b1) for b0, b1 in self.blocks()])


#: a matrix an encoding walk reads: a float32 tensor, or its rows in blocks
TokenRows = torch.Tensor | RowBlocks


__all__ = ["BLOCK_BYTES", "ROW_UNIT", "RowBlocks", "TokenRows", "block_rows", "largest_block", "spans"]
