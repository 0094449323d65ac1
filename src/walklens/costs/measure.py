"""The timed runs of ``walklens calibrate`` (:mod:`walklens.costs.calibration` stores what they measure): a float32
matrix product (the rate work is counted at), eager forward passes of a model at two lengths (what an attention
score costs beyond the matrix products, from the difference: what is paid once per pass cancels) and the
``--json`` writer and a report's heatmap writing the same scores (what a byte of output costs).  Each timing is the
fastest of several runs, interleaved so a busy spell slows them alike.  With ``--disk DIR``, the rate a model's own
files are read from disk at."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..base.errors import InputError
from . import attention_scores, forward_work, model_shape
from . import calibration as machine

if TYPE_CHECKING:
    from ..core.loading import LoadedModel

MATMUL_SIZE = 512  # the side of the square float32 product the matmul rate is timed on
MIN_SECONDS = 0.2  # each timing repeats its run for at least this long, and keeps the fastest
OUTPUT_SCORES = (64, 1024)  # the scores the writers are timed on


def fastest(*runs: Callable[[], Any], min_seconds: float = MIN_SECONDS) -> list[float]:
    """The fastest time of each of ``runs``, called in turn (interleaved, so a busy spell slows them alike) at
    least three times each and for at least ``min_seconds``, after one warm-up each."""
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    start = time.perf_counter()
    while len(times[0]) < 3 or time.perf_counter() - start < min_seconds:
        for run, took in zip(runs, times):
            t0 = time.perf_counter()
            run()
            took.append(time.perf_counter() - t0)
    return [min(took) for took in times]


def matmul_rate(n: int = MATMUL_SIZE, dtype: torch.dtype = torch.float32) -> float:
    """FLOP per second of an [n, n] x [n, n] product in ``dtype``."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    return 2 * n**3 / fastest(lambda: torch.mm(a, b))[0]


def tiny_llama() -> LoadedModel:
    """A random Llama small enough that the attention's element-wise passes dominate its forward pass."""
    import transformers

    from ..core.loading import wrap
    from ..models.tiny import tiny_config

    # the tiny sizes' 2 layers and 4 heads, wider (4 key/value heads of 64) and with room for the long pass
    sizes = dict(hidden_size=256, intermediate_size=512, num_key_value_heads=4, head_dim=64)
    cfg = tiny_config("llama", 512, max_position_embeddings=4096, **sizes)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    return wrap(model, None, name="a tiny random Llama")


def attention_element(lm: LoadedModel, tokens: int, rate: float) -> float:
    """Matrix-product operations per attention score of an eager forward pass: the time two passes (``tokens``
    and half as many) differ by, at ``rate``, less the difference of their matrix products, per score more."""
    from ..core.capture import context_limit

    sh = model_shape(lm)
    limit = context_limit(lm)
    long = min(tokens, limit) if limit else tokens
    if long < 32:
        raise InputError(f"--model: a context of {limit} positions is too short to time (32 needed)")
    short = long // 2
    g = torch.Generator().manual_seed(0)
    ids = {t: torch.randint(0, sh.vocab, (1, t), generator=g) for t in (short, long)}

    def forward(t: int) -> Callable[[], Any]:
        both = {"decoder_input_ids": ids[t]} if lm.is_encoder_decoder else {}  # T5: the decoder reads as many

        def run() -> Any:
            with torch.no_grad():
                return lm.model(input_ids=ids[t], **both)

        return run

    def matmuls(t: int) -> float:  # the estimate without its attention scores' element-wise share
        return forward_work(sh, t) - machine.rates().attn_element * attention_scores(sh, t)

    fast, slow = fastest(forward(short), forward(long))
    paid = (slow - fast) * rate - (matmuls(long) - matmuls(short))
    if paid <= 0:
        raise InputError(
            f"the attention of {long} tokens took no time beyond its matrix products ({slow - fast:.3g} s more than "
            f"{short} tokens): the machine is too busy to time it; run walklens calibrate again, or with more --tokens"
        )
    return paid / (attention_scores(sh, long) - attention_scores(sh, short))


def write_work(rate: float, shape: tuple[int, int] = OUTPUT_SCORES) -> float:
    """Matrix-product operations per byte written by the ``--json`` writer and a report's heatmap, on the same
    float32 scores."""
    from ..base.outputs import json_text
    from ..reports.html import Report

    scores = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    size = len(json_text({"scores": scores})) + len(Report("").heatmap(scores).parts[-1])
    took = sum(fastest(lambda: json_text({"scores": scores}), lambda: Report("").heatmap(scores)))
    return took * rate / size


#: the most bytes ``disk_rate`` reads (a few seconds of a disk)
DISK_PROBE_BYTES = 4 * 2**30


def disk_rate(folder: Path, limit: int = DISK_PROBE_BYTES) -> float:
    """The rate (GB per second) the safetensors files of ``folder`` are read at, 1 MiB reads as the stream reads,
    each file first dropped from the page cache (``posix_fadvise``: its clean pages; a cache below this system's,
    a virtual machine's host, may still serve some), at most ``limit`` bytes."""
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        raise InputError(f"{folder}: no .safetensors files to time reading")
    buf, n, took = bytearray(2**20), 0, 0.0
    for path in files:
        try:
            with open(path, "rb", buffering=0) as f:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                t0 = time.perf_counter()
                while n < limit and (k := f.readinto(buf)):
                    n += k
                took += time.perf_counter() - t0
        except OSError as e:
            raise InputError(f"{path}: cannot be read ({e.strerror or e})") from None
        if n >= limit:
            break
    if n == 0 or took <= 0:
        raise InputError(f"{folder}: its .safetensors files are empty")
    return n / took / 1e9


#: the bytes ``write_rate`` writes
WRITE_PROBE_BYTES = 256 * 2**20


def write_rate(folder: Path, size: int = WRITE_PROBE_BYTES) -> float:
    """The rate (GB per second) a file of ``size`` bytes is written to ``folder`` at, 1 MiB writes synced to disk
    (as a trace folder's shards are), the file removed after."""
    block = os.urandom(2**20)
    path = folder / f".walklens-write-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(path, "wb", buffering=0) as f:
            for _ in range(max(size // len(block), 1)):
                f.write(block)
            os.fsync(f.fileno())
        took = time.perf_counter() - t0
    except OSError as e:
        raise InputError(f"{folder}: cannot time writing to it ({e.strerror or e})") from None
    finally:
        path.unlink(missing_ok=True)
    return max(size // len(block), 1) * len(block) / took / 1e9


def measure(
    lm: LoadedModel, tokens: int, disk_gbps: float | None = None, write_gbps: float | None = None
) -> machine.Rates:
    """This machine's rates, timed on ``lm``, with the disk's read and write rates ``disk_gbps`` (:func:`disk_rate`)
    and ``write_gbps`` (:func:`write_rate`; None: the rates stored before, or the shipped ones)."""
    rate = matmul_rate()
    return machine.Rates(
        attn_element=attention_element(lm, tokens, rate),
        write_work=write_work(rate),
        matmul_gflops=rate / 1e9,
        bf16_gflops=matmul_rate(dtype=torch.bfloat16) / 1e9,
        disk_gbps=machine.rates().disk_gbps if disk_gbps is None else disk_gbps,
        write_gbps=machine.rates().write_gbps if write_gbps is None else write_gbps,
    )


__all__ = [
    "attention_element",
    "disk_rate",
    "write_rate",
    "fastest",
    "matmul_rate",
    "measure",
    "tiny_llama",
    "write_work",
]
