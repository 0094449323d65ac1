"""The machine's rates the cost model counts work in: what an element-wise pass of eager attention and building
output in Python cost, in the FLOP of a matrix product on the same machine.  They are facts of the machine (its
memory bandwidth and its Python speed against its matmul rate), so they are measured here, not written in code:
``walklens calibrate`` times small runs and stores them in the walklens cache (:data:`FILE_NAME`), and
:func:`rates` reads them back, checked against :data:`SCHEMA`.  Until a machine is calibrated, or when its file is
bad (one :class:`~walklens.base.errors.StaleCacheWarning` line; the file is left for ``walklens calibrate`` to replace),
the shipped :data:`DEFAULTS` are used: conservative figures that overstate work rather than understate it.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..base.errors import InputError, StaleCacheWarning
from ..base.numbers import POSITIVE, POSITIVE_INT
from ..base.outputs import write_atomic
from ..base.records import Field, Schema, note_input, read_json
from ..core.loading import cache_dir

FILE_NAME = "calibration.json"
LABEL = "the calibration file"
MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Rates:
    """``attn_element``: operations of matmul work one attention score of an eager forward pass costs (the scale,
    mask and softmax passes over each [H, T, T] tensor); ``write_work``: operations per byte of JSON or HTML built
    in Python; ``matmul_gflops``: the matmul rate both are counted at (GFLOP per second on the threads a command
    runs), which turns work into time; ``disk_gbps`` and ``write_gbps``: the rates files are read from and written
    to disk at (GB per second; a plan's reading and trace-writing time), measured by ``walklens calibrate --disk
    DIR`` (reading a model's own files; writing a file of its own in the walklens cache, synced); ``bf16_gflops``:
    the matmul rate in bfloat16 (a plan of a bfloat16 model counts its time at it: CPUs with AVX512-BF16 or AMX
    multiply bfloat16 two or more times faster than float32)."""

    attn_element: float
    write_work: float
    matmul_gflops: float
    disk_gbps: float = 1.0
    write_gbps: float = 0.5
    bf16_gflops: float = 30.0


#: the shipped figures, used until ``walklens calibrate`` has measured a machine: an eager forward pass of
#: smollm2-135m over 500-2,000 tokens took the time of 800-1,900 FLOP per score; building JSON in Python takes
#: 1-2 us per number; one CPU core multiplies matrices at 30-100 GFLOP/s (the low end here); a plain SSD reads
#: about 1 GB/s and writes half that (assumptions until ``--disk`` measures them)
DEFAULTS = Rates(
    attn_element=1200.0, write_work=5000.0, matmul_gflops=30.0, disk_gbps=1.0, write_gbps=0.5, bf16_gflops=30.0
)

#: the rates a file may lack (one written before they were measured): their shipped figures are used
OPTIONAL = ("disk_gbps", "write_gbps", "bf16_gflops")

#: the calibration file: the rates (finite, positive) and what they were measured on
SCHEMA = Schema(
    "calibration",
    (
        *(Field(f.name, "float", POSITIVE, required=f.name not in OPTIONAL) for f in fields(Rates)),
        Field("model", "str", max_len=400),
        Field("threads", "int", POSITIVE_INT),
    ),
)

_READ: dict[tuple[str, int, int, int], Rates] = {}  # the file last read, by path and (inode, size, mtime)


def calibration_path() -> Path:
    """Where ``walklens calibrate`` stores the rates: the walklens cache (:func:`walklens.core.loading.cache_dir`)."""
    return cache_dir() / FILE_NAME


def rates() -> Rates:
    """This machine's rates: the calibration file's, checked, or :data:`DEFAULTS` when there is none (or the cache
    folder is unusable); a bad file is one :class:`StaleCacheWarning` line, then the defaults.  The file is read
    once per version (path, inode, size, modification time)."""
    try:
        path = calibration_path()
        st = os.stat(path)
    except (InputError, OSError):
        return DEFAULTS
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _READ:
        note_input(path, LABEL)  # read earlier in this process: still an input of the running command
        return _READ[key]
    try:
        record = SCHEMA.check(read_json(path, LABEL, MAX_BYTES), f"{LABEL} {path}")
        got = Rates(**{f.name: record[f.name] for f in fields(Rates) if record.get(f.name) is not None})
    except InputError as e:
        warnings.warn(
            StaleCacheWarning(" ".join(f"{e}; discarded, the shipped defaults are used (walklens calibrate)".split())),
            stacklevel=2,
        )
        got = DEFAULTS
    _READ.clear()
    _READ[key] = got
    return got


def save(measured: Rates, model: str, threads: int) -> Path:
    """Store ``measured`` (checked by :data:`SCHEMA` first: a bad measurement is refused, never written) as this
    machine's rates, replacing the calibration file atomically; returns its path."""
    record: dict[str, Any] = {**asdict(measured), "model": model, "threads": threads}
    SCHEMA.check(record, "the measured rates")
    path = write_atomic(calibration_path(), json.dumps(record, indent=1) + "\n", LABEL, replaces_input=True)
    _READ.clear()
    return path


__all__ = ["DEFAULTS", "FILE_NAME", "OPTIONAL", "Rates", "calibration_path", "rates", "save"]
