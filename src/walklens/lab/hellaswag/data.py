"""HellaSwag items, loaded and preprocessed exactly as lm-evaluation-harness's ``hellaswag`` task does.

Seed 000 (sec. 5.1) evaluates its concept-space tests on HellaSwag (Zellers et al. 2019) through a modified
lm-evaluation-harness, so the items here are built the harness's way:

* ``preprocess(text)``: strip; ``" [title]"`` → ``". "``; remove every ``[...]`` tag (non-greedy); replace
  ``"  "`` by ``" "`` (one pass);
* ``query = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())`` (Python's
  ``str.capitalize``, which also lower-cases the rest of ``ctx_b``);
* ``endings = [preprocess(e) for e in endings]``; ``label = int(label)``.

Three sources are accepted:

* the rowanz jsonl (``hellaswag_val.jsonl``, with ``ctx_a``/``ctx_b``): identical to the harness;
* the Hugging Face dataset ``"hf:Rowan/hellaswag"`` (needs the ``datasets`` package; identical to the harness);
* the six-lines-per-item text form (``.txt`` or ``.txt.bz2``; the package bundles the whole validation split in
  this form, see ``walklens/lab/data/README.md``): it has no ``ctx_a``/``ctx_b`` split, so the query is
  ``preprocess(first line)``; ``ctx_b`` keeps its lower-case first letter where the jsonl would capitalise it
  (about a third of the items).  Everything else matches.

Every item must be usable as it is scored: a gold label 0-3 (unlabelled items, such as the hub's test split, are
refused: every score is measured against the gold ending), four strings as endings, none empty after
``preprocess`` (``acc_norm`` divides by an ending's length).  Anything else (wrong types, missing fields, bad
UTF-8, a damaged ``.bz2``, an empty file) raises :class:`~walklens.base.errors.DataFormatError` naming the file and
line (or the hub item), before any model is loaded.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import os
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...base.errors import DataFormatError, InputError, MissingDependencyError, utf8_text

#: lm-evaluation-harness's few-shot seed (``fewshot_config.seed`` / ``--seed``'s third value).
FEWSHOT_SEED = 1234
#: lm-evaluation-harness's separator between few-shot examples and between the query and its target.
FEWSHOT_DELIMITER = "\n\n"
TARGET_DELIMITER = " "
DEFAULT_FILE = "hellaswag_val_full.txt.bz2"
HF_PREFIX = "hf:"


@dataclass(frozen=True)
class HellaswagItem:
    """One HellaSwag item as the harness sees it.

    ``ctx`` is the harness's query string (``activity_label: ctx_a Ctx_b``, preprocessed); ``endings`` are the
    four preprocessed endings without the leading space; ``label`` is the gold ending's index.  ``ctx_a`` and
    ``ctx_b`` are kept when the source has them (jsonl, hub), else None.  ``index`` is the item's position in
    its split (0-based); ``split`` names the split.
    """

    index: int
    activity_label: str
    ctx: str
    endings: tuple[str, ...]
    label: int
    ctx_a: str | None = None
    ctx_b: str | None = None
    split: str = "validation"

    @property
    def query(self) -> str:
        """The harness's ``doc_to_text`` (same as ``ctx``)."""
        return self.ctx

    def continuation(self, i: int) -> str:
        """The string scored for ending ``i``: ``" " + ending`` (the harness's target delimiter + choice)."""
        return TARGET_DELIMITER + self.endings[i]

    def solved(self) -> str:
        """The query followed by its gold ending: how a few-shot example appears in a context."""
        return self.ctx + TARGET_DELIMITER + self.endings[self.label]


def preprocess(text: str) -> str:
    """lm-evaluation-harness's ``hellaswag.utils.preprocess`` (brackets are WikiHow artifacts)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def _show(value: Any) -> str:
    """A short repr for error messages."""
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def parse_label(value: Any, where: str) -> int:
    """The gold ending's index from a label field (an int 0-3 or its string, as rowanz and the hub store it).

    An empty or missing label (an unlabelled item) is refused, as is anything else: every test scores against the
    gold ending, and a placeholder would silently count as wrong (or index ``endings[-1]`` as a few-shot gold).
    """
    if isinstance(value, str) and value.strip() in ("0", "1", "2", "3"):
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
        return value
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataFormatError(
            f"{where}: unlabelled item (label {_show(value)}): every score is measured against "
            "the gold ending, so each item needs a label 0-3 (unlabelled splits are not supported)"
        )
    raise DataFormatError(f"{where}: 'label' must be the gold ending's index 0-3, got {_show(value)}")


def clean_ending(text: str, where: str, j: int) -> str:
    """``preprocess(text)``, refused when empty or blank (``acc_norm`` divides each score by the ending's length;
    a blank ending may tokenise to nothing).  Not idempotent, as in the harness: ``"[a] x"`` gives ``" x"``."""
    ending = preprocess(text)
    if not ending.strip():
        raise DataFormatError(
            f"{where}: ending {j} is empty" + (f" after preprocessing (was {_show(text)})" if text.strip() else "")
        )
    return ending


_DOC_KEYS = ("activity_label", "ctx_a", "ctx_b", "endings", "label")


def make_item(doc: dict[str, Any], index: int, split: str = "validation", where: str | None = None) -> HellaswagItem:
    """An item from a rowanz/hub record (``activity_label``, ``ctx_a``, ``ctx_b``, ``endings``, ``label``).

    The record is checked first (``where`` names it in the :class:`~walklens.base.errors.DataFormatError`): three
    string fields, ``endings`` a list of 4 strings none empty after :func:`preprocess`, ``label`` 0-3.
    """
    where = where or f"item {index}"
    if not isinstance(doc, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    missing = [k for k in _DOC_KEYS if k not in doc]
    if missing:
        raise DataFormatError(f"{where}: missing field(s) {', '.join(missing)}")
    for k in ("activity_label", "ctx_a", "ctx_b"):
        if not isinstance(doc[k], str):
            raise DataFormatError(f"{where}: {k!r} must be a string, got {_show(doc[k])}")
    raw = doc["endings"]
    if not isinstance(raw, (list, tuple)) or len(raw) != 4 or not all(isinstance(e, str) for e in raw):
        raise DataFormatError(f"{where}: 'endings' must be a list of 4 strings, got {_show(raw)}")
    texts = {repr(k): doc[k] for k in ("activity_label", "ctx_a", "ctx_b")} | {
        f"ending {j}": e for j, e in enumerate(raw)
    }
    for name, text in texts.items():  # a JSON "\\ud800" is a lone surrogate no tokenizer takes
        utf8_text(text, f"{where}: {name}")
    label = parse_label(doc["label"], where)
    endings = tuple(clean_ending(e, where, j) for j, e in enumerate(raw))
    ctx_a, ctx_b = doc["ctx_a"], doc["ctx_b"]
    return HellaswagItem(
        index=index,
        activity_label=doc["activity_label"],
        ctx=preprocess(doc["activity_label"] + ": " + ctx_a + " " + ctx_b.capitalize()),
        endings=endings,
        label=label,
        ctx_a=ctx_a,
        ctx_b=ctx_b,
        split=split,
    )


# ---- sources ----------------------------------------------------------------------------------------------


def bundled_path() -> Path:
    """The validation split shipped inside the package (``walklens/lab/data/``, see its README.md)."""
    return Path(__file__).resolve().parent.parent / "data" / DEFAULT_FILE


def default_path() -> Path:
    """The data used when none is given: ``$WALKLENS_HELLASWAG`` if set, else :func:`bundled_path`."""
    env = os.environ.get("WALKLENS_HELLASWAG")
    return Path(env).expanduser() if env else bundled_path()


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".bz2":
        return io.TextIOWrapper(bz2.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _read_lines(path: Path) -> list[str]:
    """The file's lines, split at line feeds only (a jsonl string may hold a raw U+2028 or U+0085, which
    ``str.splitlines`` would cut), a trailing carriage return removed."""
    try:
        with _open_text(path) as f:
            text = f.read()
    except (OSError, EOFError, ValueError) as e:  # damaged .bz2, bad UTF-8 (UnicodeDecodeError is a ValueError)
        raise DataFormatError(f"{path}: cannot be read as text ({e.__class__.__name__}: {e})") from None
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _parse_text(path: Path, limit: int | None) -> list[HellaswagItem]:
    lines = _read_lines(path)
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) % 6:
        n_full = len(lines) // 6
        raise DataFormatError(
            f"{path}:{n_full * 6 + 1}: incomplete item: {len(lines) % 6} line(s) where the text "
            f"form has 6 per item (context, label, 4 endings)"
        )
    items: list[HellaswagItem] = []
    for k in range(len(lines) // 6):
        if limit is not None and len(items) >= limit:
            break
        base = 6 * k
        head = lines[base]
        if ": " not in head:
            raise DataFormatError(f"{path}:{base + 1}: expected '<activity_label>: <context>', got {_show(head)}")
        label = parse_label(lines[base + 1], f"{path}:{base + 2}")
        endings = tuple(clean_ending(lines[base + 2 + j], f"{path}:{base + 3 + j}", j) for j in range(4))
        activity, _ = head.split(": ", 1)
        items.append(
            HellaswagItem(index=k, activity_label=activity, ctx=preprocess(head), endings=endings, label=label)
        )
    return items


def _parse_jsonl(path: Path, limit: int | None, split: str) -> list[HellaswagItem]:
    items: list[HellaswagItem] = []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if limit is not None and len(items) >= limit:
            break
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFormatError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        except (ValueError, RecursionError) as e:  # a number over the int digit limit, nesting too deep
            raise DataFormatError(f"{path}:{lineno}: not valid JSON ({e.__class__.__name__})") from None
        where = f"{path}:{lineno}"
        if not isinstance(doc, dict):
            raise DataFormatError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        doc_split = doc.get("split", split)
        items.append(
            make_item(
                doc,
                index=len(items),
                split=doc_split if isinstance(doc_split, str) and doc_split else split,
                where=where,
            )
        )
    return items


def _load_hf(name: str, split: str, limit: int | None) -> list[HellaswagItem]:
    try:
        import datasets  # optional dependency, imported only here
    except ImportError:
        raise MissingDependencyError(
            "loading 'hf:...' needs the 'datasets' package; run: pip install datasets, "
            "or pass a local .jsonl / .txt(.bz2) file with --data"
        ) from None
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # network, missing split, ...: one clear line
        raise InputError(f"could not load the Hugging Face dataset {name!r} (split {split!r}): {e}") from None
    items = []
    for i, doc in enumerate(ds):
        if limit is not None and i >= limit:
            break
        items.append(make_item(doc, index=i, split=split, where=f"hf:{name} ({split} split) item {i}"))
    return items


def load_hellaswag(
    path: str | os.PathLike[str] | None = None, limit: int | None = None, split: str = "validation"
) -> list[HellaswagItem]:
    """Load HellaSwag items (``limit``: only the first ``limit``).

    ``path``: None (the bundled validation file, see :func:`default_path`), a ``.jsonl`` file (rowanz form), a
    ``.txt``/``.txt.bz2`` file (six lines per item), or ``"hf:Rowan/hellaswag"`` (``split`` picks the hub split).
    A malformed file raises :class:`~walklens.base.errors.DataFormatError` naming the file and line.
    """
    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    if path is not None and str(path).startswith(HF_PREFIX):
        return _load_hf(str(path)[len(HF_PREFIX) :], split, limit)
    p = Path(path).expanduser() if path is not None else default_path()
    if not p.is_file():
        raise InputError(f"{p}: " + ("not a regular file" if p.exists() else "no such file"))
    name = p.name.lower()
    if name.endswith((".jsonl", ".jsonl.bz2", ".json")):
        items = _parse_jsonl(p, limit, split)
    elif name.endswith((".txt", ".txt.bz2")):
        items = _parse_text(p, limit)
    else:
        raise InputError(f"{p}: unknown HellaSwag format (expected .jsonl, .txt, .txt.bz2 or hf:Rowan/hellaswag)")
    if not items and limit != 0:
        raise DataFormatError(f"{p}: no items")
    return items


def data_id(path: str | os.PathLike[str] | None) -> str:
    """A stable name for a data source, used as the ``data`` key of stored results: the file name plus the
    first 12 hex digits of its sha256 (so a changed file never resumes another file's rows), or ``hf:NAME``."""
    if path is not None and str(path).startswith(HF_PREFIX):
        return str(path)
    p = Path(path).expanduser() if path is not None else default_path()
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{p.name}:{h.hexdigest()[:12]}"


# ---- few-shot ---------------------------------------------------------------------------------------------


def fewshot_examples(
    items: Sequence[HellaswagItem], k: int, query_index: int, seed: int = FEWSHOT_SEED, query_split: str = "validation"
) -> list[HellaswagItem]:
    """``k`` few-shot examples for the query with index ``query_index``, drawn from ``items`` (the pool: the train
    split when there is one, otherwise the whole validation split), never the query itself.

    Like the harness when the few-shot split is the evaluated split, ``k + 1`` items are sampled and the query is
    dropped if drawn; unlike the harness (which shares one generator across the run, so an item's examples
    depend on which items ran before it), the generator is seeded per query (``seed``, ``query_index``), so a
    resumed or partial run sees the same examples for each item.
    """
    if k < 0:
        raise InputError(f"shots must be >= 0, got {k}")
    if k == 0:
        return []
    pool = list(items)

    def is_query(it: HellaswagItem) -> bool:
        return it.index == query_index and it.split == query_split

    n_other = sum(1 for it in pool if not is_query(it))
    if n_other < k:
        raise InputError(f"{k}-shot needs at least {k} other items in the few-shot pool, which has {n_other}")
    rnd = random.Random(seed * 1_000_003 + query_index)
    drawn = rnd.sample(range(len(pool)), min(k + 1, len(pool)))
    chosen = [pool[j] for j in drawn if not is_query(pool[j])]
    return chosen[:k]


#: the few-shot pools: ``validation`` (every item of the file but the query: gold endings of items scored in the
#: same run can appear in prompts) and ``reserved`` (the items :func:`reserved` names, never scored in a run that
#: draws from them; docs/hellaswag.md, "Few-shot pool")
POOLS = ("validation", "reserved")
#: one item in RESERVED_EVERY is reserved for few-shot examples: those whose index ends in RESERVED_EVERY - 1
RESERVED_EVERY = 10


def reserved(index: int) -> bool:
    """Whether the item with this index belongs to the reserved few-shot pool (a fixed partition of the file:
    every tenth item, indices 9, 19, 29, ...; both sources of the validation file are in it)."""
    return index % RESERVED_EVERY == RESERVED_EVERY - 1


def scored_items(items: Sequence[HellaswagItem], shots: int, pool: str = "validation") -> list[HellaswagItem]:
    """The items a run scores: with the ``reserved`` pool and shots, the items outside the pool."""
    if pool not in POOLS:
        raise InputError(f"unknown few-shot pool {pool!r}; use one of {', '.join(POOLS)}")
    return [it for it in items if not (shots and pool == "reserved" and reserved(it.index))]


def fewshot_pool(
    path: str | os.PathLike[str] | None,
    items: Sequence[HellaswagItem],
    shots: int,
    limit: int | None = None,
    pool: str = "validation",
) -> list[HellaswagItem]:
    """Where the few-shot examples of ``items`` (the first ``limit`` items of ``path``) come from: the hub's
    train split when ``path`` is ``hf:...``, else every item of the file, even when only the first ``limit``
    are evaluated (as lm-evaluation-harness samples from the whole split), or with ``pool="reserved"`` the
    file's reserved items (:func:`reserved`), which such a run never scores.  Without shots nothing is loaded
    and the pool is ``items``."""
    if not shots:
        return list(items)
    if path is not None and str(path).startswith(HF_PREFIX):
        return load_hellaswag(path, split="train")
    if pool == "reserved":
        return [it for it in load_hellaswag(path) if reserved(it.index)]
    return load_hellaswag(path) if limit is not None else list(items)


def fewshot_context(query: HellaswagItem, examples: Iterable[HellaswagItem]) -> str:
    """The harness's context string: each example as ``query + " " + gold ending``, joined and followed by
    ``"\\n\\n"``, then the query (``description`` is empty for HellaSwag)."""
    parts = [ex.solved() for ex in examples]
    return "".join(p + FEWSHOT_DELIMITER for p in parts) + query.ctx
