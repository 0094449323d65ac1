"""Where walklens writes: one rule for every output file (JSON, HTML, PNG, CSV, Parquet) and folder.

- ``-`` means standard output (for single files; :func:`walklens.cli.common.write_json` handles it);
- a symbolic link is written through to its target (the link itself stays);
- an existing non-regular file (a device such as ``/dev/null``, a FIFO, a socket, or a folder where a file is
  expected) is refused with one :class:`~walklens.base.errors.InputError` line, never replaced;
- a regular file is replaced atomically: a fresh temp file in the same folder, then :func:`os.replace`, so an
  interruption never leaves half a file and a failed write never destroys the previous one.

:func:`check_file` and :func:`check_dir` test a path without writing anything, so the command line can refuse a
bad path before any model loads (:func:`walklens.cli.common.check_outputs`).

An output may never be an input of the same command: :func:`check_not_inputs` refuses an output that names an
input file (the same resolved path, or the same inode: a hard link or another mount), a database's journal
files, or a path inside an input folder (a concept cache, a model directory).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from .errors import InputError
from .records import Input, inputs_read

STDOUT = "-"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _where(path: str | os.PathLike[str], label: str | None) -> str:
    return f"{label} {path}" if label else str(path)


def _stat(target: Path, where: str) -> os.stat_result | None:
    """``stat`` of an existing path, None when nothing is there (or a component is missing / not a folder)."""
    try:
        return target.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise InputError(f"{where}: {e.strerror}") from None


def _can_write(folder: Path) -> bool:
    """Whether this process (its effective ids) may create files in ``folder``."""
    return os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids)


def _writable_parent(target: Path, where: str) -> None:
    """The folder that will hold ``target``: its nearest existing ancestor must be a writable directory."""
    p = target.parent
    while _stat(p, where) is None and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise InputError(f"{where}: {p} is not a directory")
    if not _can_write(p):
        raise InputError(f"{where}: {p} is not writable")


def check_file(path: str | os.PathLike[str], label: str | None = None) -> Path:
    """The real file an output ``path`` names (symlinks resolved), checked to be writable or creatable.

    Raises :class:`InputError` for ``-`` (the caller handles standard output), an existing non-regular file,
    a path under a regular file, or a folder that cannot be written.  ``label`` (e.g. ``"--json"``) starts
    the message."""
    where = _where(path, label)
    if str(path) == STDOUT:
        raise InputError(f"{where}: standard output is not a file here")
    target = Path(os.path.realpath(path))
    st = _stat(target, where)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise InputError(f"{where}: {_kind(st.st_mode)}; refusing to replace it")
    _writable_parent(target, where)
    return target


def check_dir(path: str | os.PathLike[str], label: str | None = None) -> Path:
    """The real folder an output ``path`` names, checked to be (or to be creatable as) a writable directory."""
    where = _where(path, label)
    if str(path) == STDOUT:
        raise InputError(f"{where}: needs a folder; standard output cannot hold it")
    target = Path(os.path.realpath(path))
    st = _stat(target, where)
    if st is None:
        _writable_parent(target, where)
    elif not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{where}: exists and is not a directory")
    elif not _can_write(target):
        raise InputError(f"{where}: not writable")
    return target


def make_dir(path: str | os.PathLike[str], label: str | None = None) -> Path:
    """:func:`check_dir`, then create the folder (and its parents)."""
    target = check_dir(path, label)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{_where(path, label)}: cannot create the folder: {e.strerror}") from None
    return target


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file: equal once resolved (symbolic links followed; for a file not made
    yet too), or the same inode (a hard link, the same folder mounted twice)."""
    ra, rb = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    if ra == rb:
        return True
    ia = _inode(ra)
    return ia is not None and ia == _inode(rb)


def _inside(path: Path, folder: Path) -> bool:
    """Whether the resolved ``path`` lies in ``folder`` (by name, or by the inode of one of its ancestors)."""
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    if real == top or top in real.parents:
        return True
    ino = _inode(top)
    return ino is not None and any(_inode(p) == ino for p in real.parents)


def check_not_inputs(path: str | os.PathLike[str], label: str | None, inputs: Iterable[Input]) -> None:
    """Refuse, with one :class:`InputError` line, an output ``path`` that would replace an input: the same file
    as one, or inside an input folder."""
    where = _where(path, label)
    for inp in inputs:
        if inp.folder and _inside(Path(path), inp.path):
            what = "is" if same_file(path, inp.path) else "is inside"
            raise InputError(
                f"{where}: {what} the {inp.label} folder {inp.path}, an input of this command; "
                "an output may never replace an input"
            )
        if not inp.folder and same_file(path, inp.path):
            raise InputError(
                f"{where}: is the {inp.label} file {inp.path}, an input of this command; an output "
                "may never replace an input"
            )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str],
    mode: str = "w",
    label: str | None = None,
    replaces_input: bool = False,
    **kwargs: Any,
) -> Iterator[IO[Any]]:
    """Open a temp file beside the real target of ``path``; on success it replaces the target atomically.

    ``mode`` is ``"w"`` (text, UTF-8 unless ``encoding`` is given) or ``"wb"``.  On an exception the temp file
    is removed and the old file is untouched.  The target is refused when it is, or lies inside, an input the
    command has read (:func:`walklens.base.records.inputs_read`; the check at write time catches a link planted inside
    an output folder); ``replaces_input``: a cache rewriting its own entry, the one writer allowed to."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', not {mode!r}")
    target = check_file(path, label)
    if not replaces_input:
        check_not_inputs(target, label or "output", inputs_read())
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise InputError(f"{_where(path, label)}: {e.strerror}") from None
    try:
        if "b" not in mode:
            kwargs.setdefault("encoding", "utf-8")
        with open(fd, mode, **kwargs) as f:
            yield f
        try:
            keep = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            keep = 0o666 & ~_umask()
        os.chmod(tmp, keep)
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise InputError(f"{_where(path, label)}: {e.strerror or e}") from None
        raise


def write_atomic(
    path: str | os.PathLike[str], data: str | bytes, label: str | None = None, replaces_input: bool = False
) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` by the rule above; returns ``path``."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", label, replaces_input) as f:
        f.write(data)
    return Path(path)


#: How a spreadsheet cell starts a formula (CSV injection): ``= + - @``, a tab, a carriage return or a line feed.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")


def csv_cell(value: Any) -> Any:
    """``value`` as a CSV cell a spreadsheet never runs: a string that starts (after any spaces) as a formula
    does gets a leading single quote, as CSV-injection guidance says; numbers and everything else stay as
    they are (so ``-0.5`` the float is still a number)."""
    if isinstance(value, str) and value.lstrip(" ").startswith(FORMULA_START):
        return "'" + value
    return value


def csv_row(values: Any) -> Any:
    """:func:`csv_cell` of every value of a row: a mapping (``csv.DictWriter``) or a sequence (``csv.writer``)."""
    if isinstance(values, dict):
        return {k: csv_cell(v) for k, v in values.items()}
    return [csv_cell(v) for v in values]


def jsonable(x: Any, digits: int | None = None) -> Any:
    """``x`` as plain JSON values, the one converter of every JSON walklens writes (``--json``, report specs,
    ``summary.json``): tensors and NumPy arrays or scalars as (nested) lists of numbers, complex numbers as
    ``[re, im]``, NaN and infinities as None (JSON has neither), dataclasses as dicts of their public fields,
    mappings with string keys, tuples as lists.  ``digits``: floats rounded to that many decimals."""
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # torch.Tensor, numpy array or scalar
        x = x.tolist()
    if isinstance(x, float):
        return None if not math.isfinite(x) else (x if digits is None else round(x, digits))
    if isinstance(x, complex):
        return [jsonable(x.real, digits), jsonable(x.imag, digits)]
    if isinstance(x, dict):
        return {str(k): jsonable(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v, digits) for v in x]
    if hasattr(x, "__dataclass_fields__") and not isinstance(x, type):
        return {k: jsonable(getattr(x, k), digits) for k in x.__dataclass_fields__ if not k.startswith("_")}
    return x


def json_text(data: Any) -> str:
    """The text of every ``--json`` file: :func:`jsonable` of ``data``, compact (no spaces after separators)."""
    return json.dumps(jsonable(data), separators=(",", ":"))


__all__ = [
    "STDOUT",
    "FORMULA_START",
    "atomic_open",
    "check_dir",
    "check_file",
    "check_not_inputs",
    "csv_cell",
    "csv_row",
    "json_text",
    "jsonable",
    "make_dir",
    "same_file",
    "write_atomic",
]
