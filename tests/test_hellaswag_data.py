"""HellaSwag loading: lm-evaluation-harness preprocessing, the three file forms, malformed files, few-shot."""

from __future__ import annotations

import bz2
import json
import sys

import pytest

from walklens.concepts.data import (HellaswagItem, data_id, default_path, fewshot_context, fewshot_examples,
                                    load_hellaswag, make_item, preprocess)
from walklens.errors import DataFormatError, InputError, MissingDependencyError

# The first item of rowanz's hellaswag_val.jsonl (ind 24), as stored in the dataset.
ROOF = {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
        "ctx": "A man is sitting on a roof. he", "split": "val", "split_type": "indomain", "label": 3,
        "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                    "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
        "source_id": "activitynet~v_-JhWjGDPHMY"}


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
    t.write_bytes(bz2.compress(("Roof shingle removal: A man is sitting on a roof. he\n3\n" +
                                "\n".join(ROOF["endings"]) + "\n").encode()))
    (it,) = load_hellaswag(t)
    assert it.ctx == "Roof shingle removal: A man is sitting on a roof. he"  # no ctx_b split in the text form
    assert it.activity_label == "Roof shingle removal" and it.endings == tuple(ROOF["endings"]) and it.label == 3
    assert load_hellaswag(j, limit=1)[0].index == 0 and len(load_hellaswag(j, limit=1)) == 1


@pytest.mark.parametrize("content,where", [
    ("ctx: a b\n7\ne0\ne1\ne2\ne3\n", ":2:"),           # label out of range
    ("ctx: a b\n1\ne0\ne1\ne2\n", ":1:"),               # incomplete item
    ("no colon here\n1\ne0\ne1\ne2\ne3\n", ":1:"),      # no activity label
    ("ctx: a\n0\ne0\ne1\ne2\ne3\nctx: b\n0\ne0\n\ne2\ne3\n", ":10:"),  # empty ending
])
def test_malformed_text_names_file_and_line(tmp_path, content, where):
    p = tmp_path / "bad.txt"
    p.write_text(content)
    with pytest.raises(DataFormatError) as e:
        load_hellaswag(p)
    assert "bad.txt" in str(e.value) and where in str(e.value)


@pytest.mark.parametrize("line,msg", [("{not json", "not valid JSON"), ('{"ctx_a": "x"}', "missing field"),
                                      (json.dumps(dict(ROOF, endings=["a"])), "4 strings"),
                                      (json.dumps(dict(ROOF, label=9)), "label")])
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


def test_bundled_file_and_env(tmp_path, monkeypatch):
    p = default_path()
    items = load_hellaswag(limit=3)
    assert items[0].ctx.startswith("Roof shingle removal: A man is sitting on a roof.") and items[0].label == 3
    assert data_id(None) == data_id(p) and data_id(None).startswith("hellaswag_val_full.txt.bz2:")
    monkeypatch.setenv("WALKLENS_HELLASWAG", str(tmp_path / "none.txt"))
    with pytest.raises(InputError, match="no such file"):
        load_hellaswag()


def _pool(n: int) -> list[HellaswagItem]:
    return [HellaswagItem(index=i, activity_label="A", ctx=f"A: item {i}.", endings=("e0", "e1", "e2", "e3"),
                          label=i % 4) for i in range(n)]


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
