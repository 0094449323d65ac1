"""Options and helpers shared by the sub-commands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..base import records
from ..base.errors import InputError, utf8_text
from ..base.numbers import COUNT, FINITE, POSITIVE, POSITIVE_INT, SEED
from ..base.outputs import STDOUT, check_dir, check_file, check_not_inputs, json_text, write_atomic
from ..base.precision import DEFAULT_DTYPE, DEVICES, DTYPES
from ..base.records import Input
from ..core.loading import DEFAULT_MODEL, NAMED_MODEL_SOURCES, LoadedModel, cache_dir, load_model
from ..costs import free_memory
from ..costs.planning import check_budget, model_memory


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"short name, .gguf path, local directory or hub id (default: {DEFAULT_MODEL}, that is "
        f"{NAMED_MODEL_SOURCES[DEFAULT_MODEL]})",
    )
    add_dtype_device_args(
        p, DEFAULT_DTYPE, f"the dtype the model runs in (default: {DEFAULT_DTYPE}; see docs/dtype.md)"
    )
    add_stream_arg(p)


def add_dtype_device_args(
    p: argparse.ArgumentParser, default: str, dtype_help: str, device_help: str = "where the model runs (default: cpu)"
) -> None:
    """``--dtype`` (one of the dtypes, ``default``) and ``--device`` (default cpu), with their help texts."""
    p.add_argument("--dtype", choices=tuple(DTYPES), default=default, help=dtype_help)
    p.add_argument("--device", choices=DEVICES, default="cpu", help=device_help)


def add_stream_arg(p: argparse.ArgumentParser) -> None:
    """``--stream/--no-stream`` (default None: decided by the memory budget, :func:`load_within`)."""
    p.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read each layer's weights from disk as it runs (a model larger than memory; docs/scale.md); "
        "--no-stream: every weight in memory (default: layer by layer when the weights do not fit --max-memory)",
    )


def add_model_arg(p: argparse.ArgumentParser) -> None:
    """The model as a positional argument, with ``--dtype`` (default float32) and ``--device``: the commands about
    the model itself (``verify``, ``adapter``)."""
    p.add_argument("model", help="short name, .gguf path, local directory or hub id")
    add_dtype_device_args(p, "float32", "the dtype (default float32)")


def add_output_args(p: argparse.ArgumentParser, out: bool = True) -> None:
    p.add_argument("--json", metavar="FILE", help="write every number to this JSON file")
    if out:
        p.add_argument("--out", metavar="DIR", help="write a self-contained HTML report (and PNGs) here")


def add_text_args(p: argparse.ArgumentParser, name: str = "text") -> None:
    p.add_argument(name, help="the text (use @FILE to read it from a file)")
    p.add_argument("--truncate", action="store_true", help="cut a text longer than the model's context")


SEED_LIMIT = 2**63  # torch.manual_seed and numpy accept 0 <= seed < 2**63 (and more, but not for both)

# argparse ``type=`` of the numeric options: the shared ranges of :mod:`walklens.base.numbers` (one line on refusal)
seed_arg = SEED.arg("a seed")  # an integer 0 <= seed < 2**63
positive_arg = POSITIVE_INT.arg()  # a count that must be at least 1 (--limit)
count_arg = COUNT.arg()  # a count that may be 0 (--shots)
finite_arg = FINITE.arg()  # a finite number (nan and inf refused)
positive_number_arg = POSITIVE.arg()  # a finite number > 0


def add_fewshot_seed_arg(p: argparse.ArgumentParser) -> None:
    """``--seed``: the few-shot sampling seed (default :data:`~walklens.lab.hellaswag.data.FEWSHOT_SEED`)."""
    from ..lab.hellaswag.data import FEWSHOT_SEED

    p.add_argument(
        "--seed",
        type=seed_arg,
        default=FEWSHOT_SEED,
        metavar="S",
        help=f"few-shot sampling seed (default {FEWSHOT_SEED})",
    )


def add_hellaswag_args(p: argparse.ArgumentParser, json_help: str) -> None:
    """The options of every HellaSwag command (``walklens hellaswag baseline|test1|test2|sweep``): the model,
    the data, the items, the few-shot examples, the results database, ``--json`` and the progress bar."""
    add_model_args(p)
    p.add_argument(
        "--data",
        metavar="PATH",
        default=None,
        help="HellaSwag .jsonl (rowanz), .txt/.txt.bz2 (6 lines per item) or hf:Rowan/hellaswag "
        "(default: $WALKLENS_HELLASWAG, else the bundled validation set)",
    )
    p.add_argument("--limit", type=positive_arg, default=None, metavar="N", help="only the first N items")
    p.add_argument("--shots", type=count_arg, default=0, metavar="K", help="few-shot examples per item (default 0)")
    add_fewshot_seed_arg(p)
    p.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help="results database (default: $WALKLENS_DB or the user data dir's walklens/results.sqlite)",
    )
    p.add_argument("--json", metavar="FILE", help=json_help)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_pool_arg(p: argparse.ArgumentParser) -> None:
    """``--pool``: where few-shot examples come from (``walklens.lab.hellaswag.data.POOLS``; docs/hellaswag.md)."""
    p.add_argument(
        "--pool",
        choices=("validation", "reserved"),
        default="validation",
        help="few-shot examples from the whole file (validation, as before) or from the reserved tenth of it "
        "(items 9, 19, ...), which the run then never scores (docs/hellaswag.md)",
    )


def add_summary_args(p: argparse.ArgumentParser) -> None:
    """The options of the commands that re-score a committed sweep (``walklens hellaswag folds|selection``): its
    report's ``summary.json``, the test and the run's model name in it."""
    p.add_argument("--summary", metavar="FILE", required=True, help="the sweep report's summary.json")
    p.add_argument("--test", type=int, choices=(1, 2), required=True, help="Test 1 or Test 2")
    p.add_argument("--summary-model", metavar="NAME", default=None, help="the run's model in the summary")


def check_db(path: str | os.PathLike[str] | None) -> Path:
    """The results database ``--db`` (default: ``$WALKLENS_DB`` or the user data dir's), checked before any
    model loads: a regular file that can be written or created, and, when it exists, a walklens database both
    stores can read (opened read-only: nothing is created or changed here)."""
    from ..lab.hellaswag.store import ResultStore, SweepStore, default_db_path

    db = Path(path).expanduser() if path else default_db_path()
    check_file(db, "--db")
    if db.exists():
        for store in (ResultStore, SweepStore):
            store(db, readonly=True).close()
    return db


def db_origin(given: str | os.PathLike[str] | None) -> str:
    """How the results database was chosen, said beside its path on every run that reads or writes it (so that
    reuse from a database the user did not name is never silent)."""
    if given:
        return "--db"
    if os.environ.get("WALKLENS_DB"):
        return "$WALKLENS_DB"
    return "the default database; --db PATH for another"


#: The largest ``@FILE`` text read (far beyond any model's context; the size limits then refuse it by tokens).
MAX_TEXT_FILE = 16 * 2**20


def read_text(value: str) -> str:
    """A literal text, or the contents of FILE when given as ``@FILE``; a text argument holding undecodable bytes
    (a lone surrogate in Python's argv) is refused in one line."""
    if value.startswith("@"):
        path = Path(value[1:])
        if not path.exists():
            raise InputError(f"{path}: no such file")
        return records.read_text(path, "@FILE", MAX_TEXT_FILE)
    return utf8_text(value)


#: Options that name a file or folder a command reads, when the path exists (``--model smollm2-135m`` and
#: ``--grid full`` are names, not paths); ``--db`` and ``--cache`` are inputs even before they exist.
PATH_INPUTS = {
    "data": "--data",
    "model": "--model",
    "grid": "--grid",
    "file": "FILE",
    "corpus": "--corpus",
    "summary": "--summary",
    "vector": "--vector",
    "disk": "--disk",
}
#: The files SQLite keeps beside a database while it is open.
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


def _db_inputs(path: str | os.PathLike[str], label: str = "--db") -> Iterator[Input]:
    """A database and the journal files SQLite keeps beside it."""
    db = Path(path).expanduser()
    yield Input(label, db)
    for suffix in SQLITE_SIDECARS:
        yield Input(label, db.with_name(db.name + suffix))


def _at_files(value: Any) -> Iterator[str]:
    """The ``@FILE`` paths among a text option's value (a string or a list of them)."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, str) and v.startswith("@") and len(v) > 1:
            yield v[1:]


def command_inputs(args: argparse.Namespace) -> list[Input]:
    """Every path the command of ``args`` reads: ``PATH_INPUTS`` that exist, the data it defaults to, the
    results database (``--db``, or the default one, unless ``--no-db``) with its journals, the concept cache
    folder, the walklens cache folder (derived adapters, de-quantized GGUFs: no output may be or lie inside it),
    and every ``@FILE`` text."""
    found: list[Input] = []
    opts = vars(args)
    for key, label in PATH_INPUTS.items():
        value = opts.get(key)
        if isinstance(value, str) and value and os.path.exists(os.path.expanduser(value)):
            p = Path(value).expanduser()
            found.append(Input(label, p, folder=p.is_dir()))
    if "data" in opts and opts["data"] is None:
        from ..lab.hellaswag.data import default_path

        found.append(Input("--data", default_path()))
    if "db" in opts and not opts.get("no_db"):
        from ..lab.hellaswag.store import default_db_path

        found += _db_inputs(opts["db"] or default_db_path())
    if opts.get("cache"):
        found.append(Input("--cache", Path(opts["cache"]).expanduser(), folder=True))
    try:
        found.append(Input("walklens cache", cache_dir(), folder=True))
    except InputError:  # a cache root that is no folder: nothing is read from it (a load refuses it in one line)
        pass
    for key, value in opts.items():
        found += [Input(f"@FILE ({key})", Path(f).expanduser()) for f in _at_files(value)]
    return found


def check_outputs(args: argparse.Namespace, *, out_file: bool = False, inputs: Iterable[Input] = ()) -> None:
    """Refuse bad output paths (``--json`` FILE or ``-``, ``--out`` DIR, or FILE with ``out_file``, ``--cache``
    DIR) before any model loads or any computation: one :class:`InputError` line naming the option (rules:
    :mod:`walklens.base.outputs`), also for an output that would replace an input of the command
    (:func:`command_inputs` and ``inputs``)."""
    outs: list[tuple[str, str]] = []
    js = getattr(args, "json", None)
    if js and js != STDOUT:
        check_file(js, "--json")
        outs.append((js, "--json"))
    out = getattr(args, "out", None)
    if out:
        (check_file if out_file else check_dir)(out, "out" if out_file else "--out")
        outs.append((out, "out" if out_file else "--out"))
    cache = getattr(args, "cache", None)
    if cache:
        check_dir(cache, "--cache")
    if outs:
        ins = [*command_inputs(args), *inputs]
        for path, label in outs:
            check_not_inputs(path, label, ins)


def load(args: argparse.Namespace) -> LoadedModel:
    """Check the output paths, then load ``--model`` in ``--dtype`` on ``--device`` within the memory budget
    (:func:`load_within`; a GGUF's first load draws a progress bar on stderr unless ``--no-progress``).  The
    budget (``--max-memory``, else the memory free now) and what the model holds of it are kept in ``args``
    (``max_memory``, ``model_bytes``), which the commands' limits are checked against."""
    check_outputs(args)
    dtype, device = model_options(args).values()
    lm = load_within(
        args.model,
        memory_budget(args),
        dtype=dtype,
        device=device,
        stream=getattr(args, "stream", None),
        progress=not getattr(args, "no_progress", False),
    )
    args.model_bytes = model_memory(lm)
    return lm


def memory_budget(args: argparse.Namespace) -> float:
    """The memory budget in GB: ``--max-memory``, else the memory free now (read once: kept as ``args.max_memory``)."""
    if getattr(args, "max_memory", None) is None:
        args.max_memory = free_memory()
    return float(args.max_memory)


def load_within(
    spec: str, budget: float, *, dtype: str, device: str, stream: bool | None = None, progress: bool = True
) -> LoadedModel:
    """Load ``spec`` within a budget of ``budget`` GB: refused first, in one line naming the smallest budget that
    would do, when it cannot hold the model (:func:`walklens.costs.planning.check_budget`, from the files alone),
    then in memory when its weights fit, else layer by layer (``stream`` overrides)."""
    check_budget(spec, budget, dtype=dtype, device=device, stream=stream)
    return load_model(spec, dtype=dtype, device=device, progress=progress, stream=stream, max_memory=budget)


def model_options(args: argparse.Namespace) -> dict[str, str]:
    """``load_model``'s ``dtype`` and ``device`` from ``--dtype`` and ``--device`` (:func:`add_model_args`)."""
    return {"dtype": getattr(args, "dtype", DEFAULT_DTYPE), "device": getattr(args, "device", "cpu")}


def write_json(path: str | os.PathLike[str], data: Any) -> Path | None:
    """Write JSON (:func:`walklens.base.outputs.json_text` of ``data``) to standard output (``-``) or to a file by the
    rules of :mod:`walklens.base.outputs` (atomic replace of a regular file, symlinks written through,
    devices/FIFOs/folders refused)."""
    text = json_text(data)
    if str(path) == STDOUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return None
    return write_atomic(path, text, "--json")
