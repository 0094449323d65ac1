"""Fuzzing the HellaSwag loaders (hypothesis): whatever the bytes, ``load_hellaswag`` returns valid items or raises
:class:`~walklens.base.errors.InputError` (never another exception), and the CLI answers a bad ``--data`` with one
``walklens: error:`` line and exit code 2 before any model is loaded.

Bounded and deterministic: every test has ``max_examples``, ``derandomize=True`` and no example database.
"""

from __future__ import annotations

import bz2
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from walklens.base.errors import DataFormatError, InputError
from walklens.lab.hellaswag.data import HellaswagItem, bundled_path, load_hellaswag, preprocess

FUZZ = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
SUFFIXES = (".txt", ".txt.bz2", ".jsonl", ".jsonl.bz2")
GOOD = {
    "activity_label": "Roof shingle removal",
    "ctx_a": "A man is sitting on a roof.",
    "ctx_b": "he",
    "endings": [
        "is using wrap to wrap a pair of skis.",
        "is ripping level tiles off.",
        "is holding a rubik's cube.",
        "starts pulling up roofing on a roof.",
    ],
    "label": 3,
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def bundled_bytes() -> bytes:
    return bundled_path().read_bytes()


def _write(workdir: Path, suffix: str, content: bytes) -> Path:
    p = workdir / f"data{suffix}"
    p.write_bytes(bz2.compress(content) if suffix.endswith(".bz2") else content)
    return p


def _check_valid(items: list[HellaswagItem]) -> None:
    """What every loaded item must be: a label 0-3, four non-blank string endings, a query.  (``preprocess`` is not
    idempotent, as in the harness: ``"[a] x"`` becomes ``" x"``.)"""
    assert items
    for i, it in enumerate(items):
        assert it.index == i and isinstance(it.ctx, str) and ":" in it.ctx
        assert type(it.label) is int and 0 <= it.label <= 3
        assert len(it.endings) == 4 and all(isinstance(e, str) and e.strip() for e in it.endings)


def _load_or_input_error(path: Path, **kw: Any) -> list[HellaswagItem] | InputError:
    try:
        items = load_hellaswag(path, **kw)
    except InputError as e:  # any other exception fails the test
        assert "\n" not in str(e) and str(e).startswith(str(path))
        event("refused")
        return e
    _check_valid(items)
    event("loaded")
    return items


# ---- raw bytes ---------------------------------------------------------------------------------------------

# Bytes that are sometimes close to a real file: fragments of the text form and of jsonl, glued at random.
FRAGMENTS = [
    b"A: b c",
    b"\n",
    b"\r\n",
    b"0",
    b"3",
    b"7",
    b"-1",
    b"",
    b" ",
    b"[step]",
    b"[title]",
    b"\xff",
    b"\xc3",
    b"\xe2\x80\xa8",
    b"{",
    b"}",
    b"[",
    b"]",
    b'"label": ',
    b'"endings": ',
    b'"x"',
    b",",
    b"null",
    b"1e999",
    json.dumps(GOOD).encode(),
]
noisy_bytes = st.one_of(st.binary(max_size=400), st.lists(st.sampled_from(FRAGMENTS), max_size=60).map(b"".join))


@settings(max_examples=120, **FUZZ)
@given(suffix=st.sampled_from(SUFFIXES), content=noisy_bytes)
def test_random_bytes_load_or_raise_input_error(workdir, suffix, content):
    _load_or_input_error(_write(workdir, suffix, content))


@settings(max_examples=40, **FUZZ)
@given(suffix=st.sampled_from((".txt", ".txt.bz2", ".jsonl.bz2")), content=st.binary(max_size=400))
def test_random_bytes_as_the_compressed_stream(workdir, suffix, content):
    """The file's own bytes are random (not a bz2 stream when the name says .bz2)."""
    p = workdir / f"raw{suffix}"
    p.write_bytes(content)
    _load_or_input_error(p)


@pytest.mark.slow
@settings(max_examples=12, **FUZZ)
@given(frac=st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_truncated_bundled_file_is_refused(workdir, bundled_bytes, frac):
    """Any strict prefix of the bundled .bz2 is refused: never a silently shorter data set."""
    p = workdir / "cut.txt.bz2"
    p.write_bytes(bundled_bytes[: int(frac * len(bundled_bytes))])
    with pytest.raises(DataFormatError):
        load_hellaswag(p, limit=2)


@pytest.mark.slow
@settings(max_examples=8, **FUZZ)
@given(pos=st.integers(min_value=0), byte=st.integers(min_value=0, max_value=255))
def test_corrupted_bundled_file_loads_or_raises(workdir, bundled_bytes, pos, byte):
    """One byte of the bundled .bz2 replaced: bz2's CRCs catch it (or it was a padding bit)."""
    data = bytearray(bundled_bytes)
    data[pos % len(data)] = byte
    p = workdir / "flip.txt.bz2"
    p.write_bytes(bytes(data))
    out = _load_or_input_error(p, limit=2)
    if isinstance(out, list):  # undetected (a padding bit): the items are intact
        assert [it.label for it in out] == [3, 3] and out[0].ctx.startswith("Roof shingle removal: A man")


# ---- structured jsonl and text ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=5), c, max_size=4),
    max_leaves=8,
)
endings_text = st.text(alphabet=st.sampled_from(list("ab [step]\u2028\x85 ")), max_size=10)
label_values = st.one_of(
    st.sampled_from(["", " ", "0", "1", "2", "3", " 2 ", "4", "1.0", "x", None, True]),
    st.integers(-5, 8),
    st.floats(allow_nan=True),
    st.text(max_size=3),
)


def _field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, json_values)


docs = st.fixed_dictionaries(
    {
        "activity_label": _field(st.text(max_size=8)),
        "ctx_a": _field(st.text(max_size=8)),
        "ctx_b": _field(st.text(max_size=8)),
        "endings": _field(st.lists(endings_text, min_size=3, max_size=5)),
        "label": label_values,
    },
).flatmap(
    lambda d: st.sets(st.sampled_from(sorted(d)), max_size=2).map(
        lambda drop: {k: v for k, v in d.items() if k not in drop}
    )
)


def _expected_label(doc: dict[str, Any]) -> int | None:
    """The specification, written independently of the loader: the label a valid record has, else None."""
    if not all(k in doc for k in ("activity_label", "ctx_a", "ctx_b", "endings", "label")):
        return None
    if not all(isinstance(doc[k], str) for k in ("activity_label", "ctx_a", "ctx_b")):
        return None
    e = doc["endings"]
    if not (isinstance(e, list) and len(e) == 4 and all(isinstance(x, str) and preprocess(x).strip() for x in e)):
        return None
    lab = doc["label"]
    if isinstance(lab, str) and lab.strip() in {"0", "1", "2", "3"}:
        return int(lab)
    return lab if type(lab) is int and 0 <= lab <= 3 else None


@settings(max_examples=150, **FUZZ)
@given(doc=docs, suffix=st.sampled_from((".jsonl", ".jsonl.bz2")))
def test_jsonl_records_with_wrong_types(workdir, doc, suffix):
    p = _write(workdir, suffix, (json.dumps(GOOD) + "\n" + json.dumps(doc, ensure_ascii=False) + "\n").encode())
    out = _load_or_input_error(p)
    label = _expected_label(doc)
    if label is None:
        assert isinstance(out, DataFormatError) and f"{p}:2: " in str(out)
    else:
        assert isinstance(out, list) and len(out) == 2 and out[1].label == label
        assert out[1].endings == tuple(preprocess(e) for e in doc["endings"])


any_line = st.text(max_size=10).filter(lambda t: "\n" not in t)
valid_block = st.tuples(
    st.sampled_from(["A: b", "Act: ctx [header] more", "Roof: a [title] b"]),
    st.sampled_from(["0", "1", "3", " 2", "2\r"]),
    *[st.sampled_from(["e", "e [title] f", "[a] x", "\u2028 y", "f\x85"])] * 4,
)
bad_line = st.one_of(
    st.sampled_from(["x", ": ", "A:b", "", " ", "4", "-1", "1.0", "\u0663", "[step]", "[a] [b]"]), any_line
)


def _mutate(block: tuple[str, ...], change: tuple[int, str] | None) -> list[str]:
    lines = list(block)
    if change is not None:
        lines[change[0]] = change[1]
    return lines


blocks = st.builds(_mutate, valid_block, st.one_of(st.none(), st.tuples(st.integers(0, 5), bad_line)))
text_files = st.tuples(st.lists(blocks, max_size=3), st.lists(bad_line, max_size=1)).map(
    lambda bl: [line for b in bl[0] for line in b] + bl[1]
)


@settings(max_examples=150, **FUZZ)
@given(lines=text_files, suffix=st.sampled_from((".txt", ".txt.bz2")))
def test_text_form_with_random_lines(workdir, lines, suffix):
    """Six-line blocks of plausible and random lines (plus stray lines): loaded only when every item is valid."""
    p = _write(workdir, suffix, "\n".join(lines).encode())
    out = _load_or_input_error(p)
    if isinstance(out, list):
        while lines and not lines[-1].strip():  # trailing blank lines are ignored
            lines.pop()
        assert len(lines) == 6 * len(out)
        assert [it.label for it in out] == [int(lines[6 * k + 1]) for k in range(len(out))]
        assert [it.endings for it in out] == [
            tuple(map(preprocess, lines[6 * k + 2 : 6 * k + 6])) for k in range(len(out))
        ]


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
@settings(max_examples=50, **FUZZ)
@given(label=label_values)
def test_labels_out_of_range(workdir, suffix, label):
    if suffix == ".txt":
        content = ("A: b\n" + str(label) + "\n" + "\n".join(GOOD["endings"]) + "\n").encode()
    else:
        content = (json.dumps(dict(GOOD, label=label)) + "\n").encode()
    out = _load_or_input_error(_write(workdir, suffix, content))
    text = str(label).strip()
    ok = text in {"0", "1", "2", "3"} and (suffix == ".txt" or type(label) in (int, str))
    assert isinstance(out, list) == ok
    if ok:
        assert out[0].label == int(text)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("content", [b"", b"\n", b"  \n\t\n\n"])
def test_empty_files(workdir, suffix, content):
    with pytest.raises(DataFormatError, match="no items"):
        load_hellaswag(_write(workdir, suffix, content))


# ---- the command line ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def no_model_load():
    """Fails the test if the command gets as far as loading a model (the data must be refused first)."""
    import walklens.cli.hellaswag as hs

    mp = pytest.MonkeyPatch()
    mp.setattr(hs, "load", lambda args: (_ for _ in ()).throw(AssertionError("model loaded")))
    yield
    mp.undo()


@settings(max_examples=25, **FUZZ)
@given(suffix=st.sampled_from(SUFFIXES), content=noisy_bytes)
def test_cli_bad_data_is_one_line_and_exit_2(workdir, no_model_load, suffix, content):
    from walklens.cli import main

    p = _write(workdir, suffix, content)
    try:
        load_hellaswag(p, limit=2)
    except InputError:
        pass
    else:
        return  # the bytes happened to form a valid file: nothing to refuse
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["hellaswag", "baseline", "--data", str(p), "--limit", "2", "--no-db", "--no-progress"])
    lines = err.getvalue().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("walklens: error: ") and str(p) in lines[0]
    assert out.getvalue() == ""


@pytest.mark.slow
def test_cli_subprocess_truncated_bundled_file(tmp_path, bundled_bytes):
    """The installed entry point, in a fresh process: a truncated copy of the bundled file."""
    p = tmp_path / "cut.txt.bz2"
    p.write_bytes(bundled_bytes[: len(bundled_bytes) // 3])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "walklens",
            "hellaswag",
            "baseline",
            "--data",
            str(p),
            "--limit",
            "2",
            "--no-db",
            "--model",
            str(tmp_path / "no-model-here"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"walklens: error: {p}: cannot be read as text (EOFError")
