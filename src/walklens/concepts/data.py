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
* the six-lines-per-item text form (``.txt`` or ``.txt.bz2``, see ../shared/data/hellaswag/README.md): it has
  no ``ctx_a``/``ctx_b`` split, so the query is ``preprocess(first line)``; ``ctx_b`` keeps its lower-case first
  letter where the jsonl would capitalise it (about a third of the items).  Everything else matches.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import DataFormatError, InputError, MissingDependencyError

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


def make_item(doc: dict[str, Any], index: int, split: str = "validation") -> HellaswagItem:
    """An item from a rowanz/hub record (``activity_label``, ``ctx_a``, ``ctx_b``, ``endings``, ``label``)."""
    ctx_a, ctx_b = str(doc["ctx_a"]), str(doc["ctx_b"])
    ctx = ctx_a + " " + ctx_b.capitalize()
    label = doc.get("label", "")
    return HellaswagItem(
        index=index,
        activity_label=str(doc["activity_label"]),
        ctx=preprocess(str(doc["activity_label"]) + ": " + ctx),
        endings=tuple(preprocess(str(e)) for e in doc["endings"]),
        label=int(label) if str(label).strip() != "" else -1,
        ctx_a=ctx_a,
        ctx_b=ctx_b,
        split=split,
    )


# ---- sources ----------------------------------------------------------------------------------------------

def default_path() -> Path:
    """The bundled validation file: ``$WALKLENS_HELLASWAG``, else ``../shared/data/hellaswag/`` found by walking
    up from the working directory and from this package (the repository's sibling ``shared`` folder)."""
    env = os.environ.get("WALKLENS_HELLASWAG")
    if env:
        return Path(env).expanduser()
    starts = [Path.cwd(), Path(__file__).resolve().parent]
    for start in starts:
        for d in (start, *start.parents):
            for cand in (d / "shared" / "data" / "hellaswag" / DEFAULT_FILE,
                         d.parent / "shared" / "data" / "hellaswag" / DEFAULT_FILE):
                if cand.is_file():
                    return cand
    raise InputError("no HellaSwag data given and none found: pass --data FILE (a .jsonl, .txt or .txt.bz2), "
                     "'hf:Rowan/hellaswag', or set WALKLENS_HELLASWAG")


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".bz2":
        return io.TextIOWrapper(bz2.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _read_lines(path: Path) -> list[str]:
    try:
        with _open_text(path) as f:
            return f.read().splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataFormatError(f"{path}: cannot be read as text ({e.__class__.__name__}: {e})") from None


def _parse_text(path: Path, limit: int | None) -> list[HellaswagItem]:
    lines = _read_lines(path)
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) % 6:
        n_full = len(lines) // 6
        raise DataFormatError(f"{path}:{n_full * 6 + 1}: incomplete item: {len(lines) % 6} line(s) where the text "
                              f"form has 6 per item (context, label, 4 endings)")
    items: list[HellaswagItem] = []
    for k in range(len(lines) // 6):
        if limit is not None and len(items) >= limit:
            break
        base = 6 * k
        head, label_line, endings = lines[base], lines[base + 1].strip(), lines[base + 2: base + 6]
        if ": " not in head:
            raise DataFormatError(f"{path}:{base + 1}: expected '<activity_label>: <context>', got {head[:60]!r}")
        if label_line not in ("0", "1", "2", "3"):
            raise DataFormatError(f"{path}:{base + 2}: expected the gold ending's index 0-3, got {label_line[:60]!r}")
        for j, e in enumerate(endings):
            if not e.strip():
                raise DataFormatError(f"{path}:{base + 3 + j}: empty ending")
        activity, _ = head.split(": ", 1)
        items.append(HellaswagItem(index=k, activity_label=activity, ctx=preprocess(head),
                                   endings=tuple(preprocess(e) for e in endings), label=int(label_line)))
    return items


_JSONL_KEYS = ("activity_label", "ctx_a", "ctx_b", "endings", "label")


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
        if not isinstance(doc, dict):
            raise DataFormatError(f"{path}:{lineno}: expected a JSON object")
        missing = [k for k in _JSONL_KEYS if k not in doc]
        if missing:
            raise DataFormatError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
        if not isinstance(doc["endings"], list) or len(doc["endings"]) != 4:
            raise DataFormatError(f"{path}:{lineno}: 'endings' must be a list of 4 strings")
        lab = str(doc["label"]).strip()
        if lab not in ("0", "1", "2", "3", ""):
            raise DataFormatError(f"{path}:{lineno}: 'label' must be 0-3, got {doc['label']!r}")
        items.append(make_item(doc, index=len(items), split=str(doc.get("split", split)) or split))
    return items


def _load_hf(name: str, split: str, limit: int | None) -> list[HellaswagItem]:
    try:
        import datasets  # noqa: F401  (optional dependency, imported only here)
    except ImportError:
        raise MissingDependencyError("loading 'hf:...' needs the 'datasets' package; run: pip install datasets, "
                                     "or pass a local .jsonl / .txt(.bz2) file with --data") from None
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # network, missing split, ...: one clear line
        raise InputError(f"could not load the Hugging Face dataset {name!r} (split {split!r}): {e}") from None
    items = []
    for i, doc in enumerate(ds):
        if limit is not None and i >= limit:
            break
        items.append(make_item(doc, index=i, split=split))
    return items


def load_hellaswag(path: str | os.PathLike[str] | None = None, limit: int | None = None,
                   split: str = "validation") -> list[HellaswagItem]:
    """Load HellaSwag items (``limit``: only the first ``limit``).

    ``path``: None (the bundled validation file, see :func:`default_path`), a ``.jsonl`` file (rowanz form), a
    ``.txt``/``.txt.bz2`` file (six lines per item), or ``"hf:Rowan/hellaswag"`` (``split`` picks the hub split).
    A malformed file raises :class:`~walklens.errors.DataFormatError` naming the file and line.
    """
    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    if path is not None and str(path).startswith(HF_PREFIX):
        return _load_hf(str(path)[len(HF_PREFIX):], split, limit)
    p = Path(path).expanduser() if path is not None else default_path()
    if not p.is_file():
        raise InputError(f"{p}: no such file")
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

def fewshot_examples(items: Sequence[HellaswagItem], k: int, query_index: int,
                     seed: int = FEWSHOT_SEED, query_split: str = "validation") -> list[HellaswagItem]:
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


def fewshot_context(query: HellaswagItem, examples: Iterable[HellaswagItem]) -> str:
    """The harness's context string: each example as ``query + " " + gold ending``, joined and followed by
    ``"\\n\\n"``, then the query (``description`` is empty for HellaSwag)."""
    parts = [ex.solved() for ex in examples]
    return "".join(p + FEWSHOT_DELIMITER for p in parts) + query.ctx
