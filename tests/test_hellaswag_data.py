"""HellaSwag loading: lm-evaluation-harness preprocessing, the three file forms, malformed files, few-shot."""

from __future__ import annotations

import bz2
import hashlib
import json
import sys
from pathlib import Path

import pytest

from walklens.base.errors import DataFormatError, InputError, MissingDependencyError
from walklens.lab.hellaswag.data import (
    HellaswagItem,
    bundled_path,
    data_id,
    default_path,
    fewshot_context,
    fewshot_examples,
    load_hellaswag,
    make_item,
    preprocess,
)

# The first item of rowanz's hellaswag_val.jsonl (ind 24), as stored in the dataset.
ROOF = {
    "ind": 24,
    "activity_label": "Roof shingle removal",
    "ctx_a": "A man is sitting on a roof.",
    "ctx_b": "he",
    "ctx": "A man is sitting on a roof. he",
    "split": "val",
    "split_type": "indomain",
    "label": 3,
    "endings": [
        "is using wrap to wrap a pair of skis.",
        "is ripping level tiles off.",
        "is holding a rubik's cube.",
        "starts pulling up roofing on a roof.",
    ],
    "source_id": "activitynet~v_-JhWjGDPHMY",
}


def test_preprocess_follows_the_harness():
    # strip; " [title]" -> ". "; every [...] removed (non-greedy); "  " -> " " once
    raw = "  How to get rid of ants [title] Clean your kitchen. [step] Wipe counters.  "
    assert preprocess(raw) == "How to get rid of ants. Clean your kitchen. Wipe counters."
    assert preprocess("a [header] b [substeps] c") == "a b c"
    assert preprocess("x [a] [b] y") == "x  y"  # "x   y" (3 spaces): one replace pass leaves two, as in the harness
    assert preprocess("p    q") == "p  q"  # a single replace pass halves runs of spaces, as the harness does


def test_query_is_built_like_the_harness():
    it = make_item(ROOF, index=0)
    # lm-eval: activity_label + ": " + ctx_a + " " + ctx_b.capitalize()
    assert it.ctx == "Roof shingle removal: A man is sitting on a roof. He"
    assert it.endings[1] == "is ripping level tiles off." and it.label == 3
    assert it.continuation(0) == " is using wrap to wrap a pair of skis."
    # str.capitalize lower-cases the rest, exactly as the harness's Python does
    odd = dict(ROOF, ctx_b="the NASA crew")
    assert make_item(odd, 0).ctx.endswith("roof. The nasa crew")
    # empty ctx_b (WikiHow items): the trailing space is stripped by preprocess
    assert make_item(dict(ROOF, ctx_b=""), 0).ctx == "Roof shingle removal: A man is sitting on a roof."


def test_jsonl_and_text_forms(tmp_path):
    j = tmp_path / "v.jsonl"
    j.write_text(json.dumps(ROOF) + "\n\n" + json.dumps(dict(ROOF, label="1")) + "\n")
    items = load_hellaswag(j)
    assert len(items) == 2 and items[1].label == 1 and items[0].ctx_a == ROOF["ctx_a"]
    t = tmp_path / "v.txt.bz2"
    t.write_bytes(
        bz2.compress(
            ("Roof shingle removal: A man is sitting on a roof. he\n3\n" + "\n".join(ROOF["endings"]) + "\n").encode()
        )
    )
    (it,) = load_hellaswag(t)
    assert it.ctx == "Roof shingle removal: A man is sitting on a roof. he"  # no ctx_b split in the text form
    assert it.activity_label == "Roof shingle removal" and it.endings == tuple(ROOF["endings"]) and it.label == 3
    assert load_hellaswag(j, limit=1)[0].index == 0 and len(load_hellaswag(j, limit=1)) == 1


@pytest.mark.parametrize(
    "content,where",
    [
        ("ctx: a b\n7\ne0\ne1\ne2\ne3\n", ":2:"),  # label out of range
        ("ctx: a b\n1\ne0\ne1\ne2\n", ":1:"),  # incomplete item
        ("no colon here\n1\ne0\ne1\ne2\ne3\n", ":1:"),  # no activity label
        ("ctx: a\n0\ne0\ne1\ne2\ne3\nctx: b\n0\ne0\n\ne2\ne3\n", ":10:"),  # empty ending
    ],
)
def test_malformed_text_names_file_and_line(tmp_path, content, where):
    p = tmp_path / "bad.txt"
    p.write_text(content)
    with pytest.raises(DataFormatError) as e:
        load_hellaswag(p)
    assert "bad.txt" in str(e.value) and where in str(e.value)


@pytest.mark.parametrize(
    "line,msg",
    [
        ("{not json", "not valid JSON"),
        ('{"ctx_a": "x"}', "missing field"),
        (json.dumps(dict(ROOF, endings=["a"])), "4 strings"),
        (json.dumps(dict(ROOF, label=9)), "label"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, line, msg):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(ROOF) + "\n" + line + "\n")
    with pytest.raises(DataFormatError) as e:
        load_hellaswag(p)
    assert "bad.jsonl:2:" in str(e.value) and msg in str(e.value)


def test_hub_needs_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails even if installed
    with pytest.raises(MissingDependencyError, match="datasets"):
        load_hellaswag("hf:Rowan/hellaswag")


BUNDLED_TEXT_SHA256 = "d572539320eb2050e858ca34b495bbe2103e3b3f1391a9c3bcdf215b0bb93bd1"  # data/README.md


def test_bundled_file_and_env(tmp_path, monkeypatch):
    """The validation split ships inside the package (no folder outside the repository is searched)."""
    import walklens

    monkeypatch.delenv("WALKLENS_HELLASWAG", raising=False)
    p = default_path()
    assert p == bundled_path() and p.is_file() and p.name == "hellaswag_val_full.txt.bz2"
    assert p.parent.parent == Path(walklens.__file__).resolve().parent / "lab"  # walklens/lab/data/, inside the package
    assert hashlib.sha256(bz2.decompress(p.read_bytes())).hexdigest() == BUNDLED_TEXT_SHA256
    items = load_hellaswag()
    assert len(items) == 10_042 and [it.index for it in items] == list(range(10_042))
    assert items[0].ctx.startswith("Roof shingle removal: A man is sitting on a roof.") and items[0].label == 3
    assert {it.label for it in items} == {0, 1, 2, 3} and all(len(it.endings) == 4 for it in items)
    # results are keyed by file name + sha256 prefix of the .bz2 bytes: the bundled copy must keep both
    assert data_id(None) == data_id(p) == "hellaswag_val_full.txt.bz2:50b637899e42"
    # WALKLENS_HELLASWAG overrides the bundled file
    own = tmp_path / "own.txt"
    own.write_text("Roof shingle removal: A man is sitting on a roof. he\n3\n" + "\n".join(ROOF["endings"]) + "\n")
    monkeypatch.setenv("WALKLENS_HELLASWAG", str(own))
    assert default_path() == own and len(load_hellaswag()) == 1 and data_id(None).startswith("own.txt:")
    monkeypatch.setenv("WALKLENS_HELLASWAG", str(tmp_path / "none.txt"))
    with pytest.raises(InputError, match="no such file"):
        load_hellaswag()


def test_no_code_refers_to_a_shared_folder():
    """The project reads nothing outside its repository: no search for a sibling ``shared`` folder."""
    import re

    import walklens

    pattern = re.compile(r"""\.\./shared|shared[/]data|["']shared["']\s*/|/\s*["']shared["']""")
    pkg = Path(walklens.__file__).resolve().parent
    hits = [
        f"{f}:{n}"
        for f in sorted(pkg.rglob("*.py"))
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


@pytest.mark.parametrize(
    "doc,msg",
    [
        (dict(ROOF, label=""), "unlabelled item"),  # was label -1: acc 0, endings[-1] as gold
        (dict(ROOF, label=None), "unlabelled item"),
        (dict(ROOF, label=" "), "unlabelled item"),
        (dict(ROOF, label=-1), "0-3, got -1"),
        (dict(ROOF, label=4), "0-3, got 4"),
        (dict(ROOF, label="1.0"), "0-3"),
        (dict(ROOF, label=1.0), "0-3"),
        (dict(ROOF, label=True), "0-3"),
        (dict(ROOF, label=[1]), "0-3"),
        (dict(ROOF, endings=[1, 2, 3, 4]), "4 strings"),  # was accepted as "1".."4"
        (dict(ROOF, endings="abcd"), "4 strings"),
        (dict(ROOF, endings=ROOF["endings"] + ["x"]), "4 strings"),
        (dict(ROOF, endings=["a", "b", None, "d"]), "4 strings"),
        (dict(ROOF, endings=["a", "b", "", "d"]), "ending 2 is empty"),  # was ZeroDivisionError in picks (acc_norm)
        (dict(ROOF, endings=["a", "[step]", "c", "d"]), "ending 1 is empty after preprocessing"),
        (dict(ROOF, endings=["a", "b", "c", "[a] [b]"]), "ending 3 is empty after preprocessing"),  # blank: " "
        (dict(ROOF, ctx_a=None), "'ctx_a' must be a string"),
        (dict(ROOF, ctx_b=3), "'ctx_b' must be a string"),
        (dict(ROOF, activity_label=["x"]), "'activity_label' must be a string"),
        ({k: v for k, v in ROOF.items() if k != "label"}, "missing field(s) label"),
    ],
)
def test_jsonl_items_are_checked(tmp_path, doc, msg):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(ROOF) + "\n" + json.dumps(doc) + "\n")
    with pytest.raises(DataFormatError) as e:
        load_hellaswag(p)
    assert str(e.value).startswith(f"{p}:2: ") and msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "lines,where,msg",
    [
        (["A: b", "", "e0", "e1", "e2", "e3"], ":2:", "unlabelled item"),
        (["A: b", "1", "e0", "[title]", "e2", "e3"], ":4:", "ending 1 is empty after preprocessing"),
        (["A: b", "-1", "e0", "e1", "e2", "e3"], ":2:", "0-3"),
    ],
)
def test_text_items_are_checked(tmp_path, lines, where, msg):
    p = tmp_path / "bad.txt"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError) as e:
        load_hellaswag(p)
    assert f"bad.txt{where}" in str(e.value) and msg in str(e.value)


def test_make_item_checks_records():
    """acc_norm divides by the ending's length (``baseline.picks``): an empty ending is refused at load."""
    with pytest.raises(DataFormatError, match="^item 5: ending 1 is empty$"):
        make_item(dict(ROOF, endings=["a", "", "c", "d"]), 5)
    with pytest.raises(DataFormatError, match="^item 0: unlabelled item"):
        make_item(dict(ROOF, label=""), 0)


@pytest.mark.parametrize(
    "name,content,msg",
    [
        ("empty.txt", b"", "no items"),
        ("blank.jsonl", b"\n \n\t\n", "no items"),
        ("empty.txt.bz2", bz2.compress(b""), "no items"),
        ("latin1.txt", "A: caf\xe9\n1\ne\ne\ne\ne\n".encode("latin-1"), "UnicodeDecodeError"),
        ("plain.txt.bz2", b"A: b\n1\ne\ne\ne\ne\n", "cannot be read"),  # not bz2 at all
        ("cut.txt.bz2", bz2.compress(b"A: b\n1\ne\ne\ne\ne\n" * 50)[:-10], "EOFError"),
        ("deep.jsonl", b"[" * 100_000, "not valid JSON"),  # was RecursionError
        ("bigint.jsonl", b"1" * 5000, "not valid JSON"),  # was ValueError (int digit limit)
        ("list.jsonl", b"[1, 2]", "expected a JSON object"),
    ],
)
def test_unreadable_files_are_one_data_format_error(tmp_path, name, content, msg):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(DataFormatError) as e:
        load_hellaswag(p)
    assert str(e.value).startswith(str(p)) and msg in str(e.value) and "\n" not in str(e.value)


def test_directory_is_not_a_data_file(tmp_path):
    (tmp_path / "d.txt").mkdir()
    with pytest.raises(InputError, match="not a regular file"):
        load_hellaswag(tmp_path / "d.txt")


def test_jsonl_lines_split_only_at_newline(tmp_path):
    """A raw U+2028 / U+0085 inside a JSON string is valid JSON; ``str.splitlines`` used to cut the line there."""
    p = tmp_path / "u.jsonl"
    doc = dict(ROOF, endings=["a\u2028b", "c\x85d", "e", "f"])
    p.write_text(json.dumps(doc, ensure_ascii=False) + "\r\n" + json.dumps(ROOF) + "\r\n", encoding="utf-8")
    items = load_hellaswag(p)
    assert len(items) == 2 and items[0].endings[:2] == ("a\u2028b", "c\x85d") and items[1].label == 3


def _pool(n: int) -> list[HellaswagItem]:
    return [
        HellaswagItem(index=i, activity_label="A", ctx=f"A: item {i}.", endings=("e0", "e1", "e2", "e3"), label=i % 4)
        for i in range(n)
    ]


def test_fewshot_never_the_query_and_deterministic():
    pool = _pool(6)
    for q in range(6):
        ex = fewshot_examples(pool, 5, q)
        assert len(ex) == 5 and q not in [e.index for e in ex] and len({e.index for e in ex}) == 5
        assert ex == fewshot_examples(pool, 5, q)  # per-query seeding: the same examples every time
    assert fewshot_examples(pool, 0, 0) == []
    with pytest.raises(InputError):
        fewshot_examples(pool, 6, 0)


def test_fewshot_context_joins_like_the_harness():
    pool = _pool(3)
    ctx = fewshot_context(pool[2], [pool[0], pool[1]])
    # each example: query + " " + gold ending; joined by "\n\n", then "\n\n" + the query
    assert ctx == "A: item 0. e0\n\nA: item 1. e1\n\nA: item 2."
    assert fewshot_context(pool[2], []) == "A: item 2."


def test_hub_form_with_a_stub_datasets(monkeypatch):
    """The hub path builds items the harness's way and uses the train split for few-shot examples."""
    import types

    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        rows = [dict(ROOF, label=str(i % 4), ctx_b="he") for i in range(3)]
        return rows if split == "validation" else [dict(r, activity_label="Train") for r in rows]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    val = load_hellaswag("hf:Rowan/hellaswag", limit=2)
    train = load_hellaswag("hf:Rowan/hellaswag", split="train")
    assert calls == [("Rowan/hellaswag", "validation"), ("Rowan/hellaswag", "train")]
    assert len(val) == 2 and val[0].ctx == "Roof shingle removal: A man is sitting on a roof. He" and val[1].label == 1
    ex = fewshot_examples(train, 3, query_index=0, query_split="validation")
    assert {e.split for e in ex} == {"train"} and len(ex) == 3  # the train item 0 is not the query
    assert data_id("hf:Rowan/hellaswag") == "hf:Rowan/hellaswag"


def test_hub_test_split_is_refused_as_unlabelled(monkeypatch):
    """The hub's test split has label "": it used to load as label -1 (acc 0, endings[-1] as few-shot gold)."""
    import types

    rows = [dict(ROOF, label="")]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda name, split: rows))
    with pytest.raises(DataFormatError, match=r"^hf:Rowan/hellaswag \(test split\) item 0: unlabelled item"):
        load_hellaswag("hf:Rowan/hellaswag", split="test")
