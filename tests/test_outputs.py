"""Output safety: the one rule for written files (walklens.base.outputs), output paths refused before any model loads,
model strings escaped in every report field, and each report view shown once (PNGs linked, not repeated)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import walklens
from walklens.base.errors import InputError
from walklens.base.outputs import check_dir, write_atomic
from walklens.cli import main
from walklens.cli.common import write_json
from walklens.testing import tiny_model

EVIL = ["<img src=x onerror=\"document.title='pwned'\">", "</script><b>x</b>", "<filename>", "a&amp;b\u2028"]


# ---- the writing rule ------------------------------------------------------------------------------------------------


def test_regular_file_replaced_atomically_keeping_its_mode(tmp_path):
    p = tmp_path / "r.json"
    p.write_text("old")
    p.chmod(0o640)
    write_json(p, {"a": [1.5, float("nan")]})
    assert json.loads(p.read_text()) == {"a": [1.5, None]} and stat.S_IMODE(p.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["r.json"]  # no temp file left behind
    write_json(tmp_path / "new" / "deep" / "n.json", 1)  # missing folders are created
    assert (tmp_path / "new" / "deep" / "n.json").read_text() == "1"


def test_symlink_written_through_to_its_target(tmp_path):
    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_json(link, {"b": 2})
    assert link.is_symlink() and json.loads(target.read_text()) == {"b": 2}
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "made.json")
    write_atomic(dangling, b"x")
    assert dangling.is_symlink() and (tmp_path / "made.json").read_bytes() == b"x"


def _device(tmp_path: Path) -> Path:
    """A character device to write at: a private copy of /dev/null when we may create one, else a link to
    /dev/null (never /dev/null itself: a regression must not be able to replace the machine's device)."""
    dev = tmp_path / "null"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        dev.symlink_to("/dev/null")
    return dev


def test_devices_fifos_and_folders_are_never_replaced(tmp_path):
    dev = _device(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    to_dev = tmp_path / "to_dev.json"
    to_dev.symlink_to(dev)
    for path in (dev, fifo, to_dev, tmp_path):
        with pytest.raises(InputError, match="refusing to replace"):
            write_json(path, {"x": 1})
    assert stat.S_ISCHR(os.stat(dev).st_mode) and stat.S_ISFIFO(os.lstat(fifo).st_mode) and to_dev.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["fifo", "null", "to_dev.json"]
    (tmp_path / "file.txt").write_text("keep")
    with pytest.raises(InputError, match="file.txt is not a directory"):
        write_json(tmp_path / "file.txt" / "x.json", 1)
    assert (tmp_path / "file.txt").read_text() == "keep"


def test_dash_is_standard_output(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert write_json("-", {"t": [1, 2]}) is None
    assert json.loads(capsys.readouterr().out) == {"t": [1, 2]} and not os.listdir(tmp_path)


def test_report_save_follows_the_rule(tmp_path):
    from walklens.reports.html import Report

    rep = Report("r").p("x")
    out = tmp_path / "rep"
    out.mkdir()
    os.mkfifo(out / "index.html")
    with pytest.raises(InputError, match="FIFO"):
        rep.save(out)
    assert stat.S_ISFIFO(os.lstat(out / "index.html").st_mode)
    (out / "index.html").unlink()
    real = tmp_path / "real.html"
    (out / "index.html").symlink_to(real)
    rep.save(out)
    assert (out / "index.html").is_symlink() and "<h1>r</h1>" in real.read_text()
    (tmp_path / "plain").write_text("a file")
    with pytest.raises(InputError, match="not a directory"):
        rep.save(tmp_path / "plain")


def test_export_follows_the_rule(tmp_path):
    from walklens.lab.hellaswag.store import ResultStore

    link = tmp_path / "x.csv"
    link.symlink_to(_device(tmp_path))
    with ResultStore(tmp_path / "r.sqlite") as store:
        with pytest.raises(InputError, match="character device"):
            store.export(link)
        path = store.export(tmp_path / "runs.csv", table="runs")
    assert link.is_symlink() and path.read_text().startswith("model,")


# ---- output paths are checked before any model loads -----------------------------------------------------------------


def _one_error(capsys, argv: list[str], calls: list[str], *needles: str) -> None:
    """``main(argv)`` exits 2 with one ``walklens: error:`` line holding every needle, and loads no model."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and not calls, (code, err, calls)
    assert len(lines) == 1 and lines[0].startswith("walklens: error: "), err
    assert all(n in lines[0] for n in needles), err


@pytest.fixture
def paths(tmp_path) -> dict[str, str]:
    (tmp_path / "file.txt").write_text("keep")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    return {
        "file": str(tmp_path / "file.txt"),
        "dir": str(tmp_path / "dir"),
        "fifo": str(tmp_path / "fifo"),
        "under": str(tmp_path / "file.txt/x.json"),
        "dev": str(_device(tmp_path)),
    }


@pytest.mark.parametrize(
    "cmd",
    [
        ["walk", "hi"],
        ["generate", "hi"],
        ["simmap", "hi"],
        ["heads", "hi"],
        ["kernels"],
        ["power", "hi"],
        ["steer", "hi", "--toward", " x", "--layers", "0"],
    ],
)
@pytest.mark.parametrize(
    "opt,where,needle",
    [
        ("--out", "file", "not a directory"),
        ("--json", "dir", "directory"),
        ("--json", "under", "file.txt is not a directory"),
        ("--json", "fifo", "FIFO"),
        ("--json", "dev", "character device"),
        ("--out", "-", "standard output"),
    ],
)
def test_bad_output_paths_refused_before_loading(cmd, opt, where, needle, paths, no_model, capsys):
    _one_error(capsys, [*cmd, opt, paths.get(where, where)], no_model, f"{opt} ", needle)
    assert Path(paths["file"]).read_text() == "keep" and stat.S_ISCHR(os.stat(paths["dev"]).st_mode)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["sweep", "--test", "2", "--cache", "{file}"], "--cache"),
        (["sweep", "--test", "2", "--json", "{dir}"], "--json"),
        (["hellaswag", "baseline", "--json", "{under}"], "file.txt is not a directory"),
        (["report", "--db", "{file}", "--out", "{file}"], "--out"),
    ],
)
def test_other_commands_check_outputs_first(argv, needle, paths, no_model, capsys):
    _one_error(capsys, [a.format(**paths) for a in argv], no_model, needle)


@contextlib.contextmanager
def _unprivileged() -> Iterator[None]:
    """Run as user nobody (effective uid) when we are root, so directory permissions apply."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_read_only_folder_refused_before_loading(no_model, capsys):
    from walklens.cli import command_modules

    # found while privileged: a clone in a private folder (mktemp -d, mode 0700) is unreadable to nobody
    command_modules()

    base = Path(tempfile.mkdtemp())
    try:
        base.chmod(0o755)
        ro = base / "ro"
        ro.mkdir(mode=0o555)
        ro.chmod(0o555)
        with _unprivileged():
            with pytest.raises(InputError, match="not writable"):
                check_dir(ro / "sub")
            _one_error(capsys, ["walk", "hi", "--out", str(ro)], no_model, "--out")
            _one_error(capsys, ["walk", "hi", "--json", str(ro / "x.json")], no_model, "not writable")
    finally:
        shutil.rmtree(base)


def test_undecodable_text_file_one_line(tmp_path, no_model, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("café".encode("latin-1"))  # @FILE text that is not UTF-8
    _one_error(capsys, ["walk", f"@{bad}"], no_model, "bad.txt: not UTF-8")


# ---- every field of every report is text, not markup -----------------------------------------------------------------


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []
        self.specs: list[Any] = []
        self.docs: dict[str, Any] = {}
        self.title = ""
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in.append(tag)
        self.specs += [json.loads(v) for k, v in attrs if k == "data-spec" and v]
        named = dict(attrs)
        if named.get("data-result") and named.get("data-doc"):  # a result drawn by results.js from its document
            self.docs[named["data-result"]] = json.loads(named["data-doc"])
            self.specs.append(self.docs[named["data-result"]])  # its strings reach the page by textContent too

    def handle_endtag(self, tag: str) -> None:
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        if self._in and self._in[-1] == "title":
            self.title += data
        elif not (self._in and self._in[-1] in ("script", "style")):
            self.text.append(data)


SAFE_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "h3",
    "p",
    "table",
    "tr",
    "th",
    "td",
    "div",
    "script",
    "figure",
    "figcaption",
    "img",
    "a",
    "code",
}


def _strings(x: Any) -> Iterator[str]:
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _strings(v)


def _check(html: str, title: str) -> _Page:
    page = _Page()
    page.feed(html)
    assert set(page.tags) <= SAFE_TAGS, set(page.tags) - SAFE_TAGS
    assert page.tags.count("script") == 1 and html.count("</script") == 1  # only the plots script
    assert page.title == title
    return page


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def test_walk_and_simmap_reports_escape_every_field(llama):
    from walklens.reports import generate as generate_report
    from walklens.reports import simmap as simmap_report
    from walklens.reports import walk as walk_report
    from walklens.reports.html import show

    tr = walklens.capture(llama, "the capital of france is paris")
    toks = [EVIL[i % len(EVIL)] for i in range(len(tr.tokens))]
    walk = dataclasses.replace(walklens.encoding_walk(tr, k=3, norm="final"), tokens=toks)
    labels = {i: EVIL[i % len(EVIL)] for i in walk.label_ids()}
    page = _check(walk_report.build({"final": walk}, labels, EVIL[0], EVIL[1], figures=False).render(), EVIL[0])
    text, data = "".join(page.text), list(_strings(page.specs))
    assert all(show(e) in text for e in EVIL)  # the tables and the nearest-token grid
    # spec strings are inserted with textContent by plots.js: raw, not pre-escaped (else '&lt;' would show)
    for e in EVIL:
        assert any(show(e) in s for s in data), e  # labels and hover, from the documents drawn on the page
    assert not any("&lt;" in s for s in data)

    dw = walklens.decoding_walk(llama, "the capital of", max_new_tokens=3, stop_at_eos=False)
    dw = dataclasses.replace(dw, prompt=EVIL[0], tokens=EVIL[:3], top_tokens=[EVIL] * 3)
    page = _check(generate_report.build(dw, EVIL[1], figures=False).render(), EVIL[1])
    assert repr(EVIL[0]) in "".join(page.text) and any(show(EVIL[2]) in s for s in _strings(page.specs))

    maps = {f"embed/{EVIL[1]}": walklens.similarity_map(tr, "embed", "cosine")}
    page = _check(simmap_report.build(maps, toks, EVIL[2], EVIL[3], figures=False).render(), EVIL[2])
    data = list(_strings(page.specs))  # the map's document: its labels reach the page by textContent
    assert all(any(t in s or show(t) in s for s in data) for t in toks)
    assert EVIL[1] in "".join(page.text)


def test_power_and_heads_reports_escape_every_field(llama):
    from walklens.analyses.power import alignment, power_spectra
    from walklens.reports import power as power_report
    from walklens.reports.heads import add_attention_maps

    spectra = power_spectra(llama, nearest=4)
    spectra.model_name = EVIL[0]
    for s in spectra.layers:
        s.nearest, s.opposite = list(EVIL), list(EVIL)
    al = alignment(llama, "the cat and the dog", spectra=spectra, n_random=8, n_shuffles=4)
    al.tokens = [[EVIL[i % len(EVIL)] for i in range(len(al.tokens[0]))]]
    page = _check(power_report.build(spectra, al).render(), f"Power-method view of {EVIL[0]}")
    # the tables and charts are drawn by results.js from the embedded documents, which hold the strings raw
    # (results.js inserts them as text; tests/test_browser.py hovers the drawn page)
    assert all(s["nearest"] == EVIL and s["opposite"] == EVIL for s in page.docs["spectra"]["layers"])
    assert page.docs["alignment"]["tokens"] == [al.tokens[0]] and page.docs["spectra"]["model_name"] == EVIL[0]
    assert not any("&lt;" in s for s in _strings(page.docs))

    import torch

    from walklens.reports.html import Report

    attn = {"L0.attn": torch.full((2, 4, 4), 0.25)}
    page = _check(add_attention_maps(Report(EVIL[3]), attn, EVIL[:4]).render(), EVIL[3])
    spec = page.specs[0]
    shown = [repr(e)[1:-1] for e in EVIL]
    assert spec["row_labels"] == shown and any(shown[0] in c for c in spec["col_labels"])


# ---- each view once: PNGs of interactive views are linked, not shown again -------------------------------------------


def test_each_view_shown_once_pngs_linked(llama, tmp_path):
    from walklens.reports import simmap as simmap_report
    from walklens.reports import walk as walk_report

    tr = walklens.capture(llama, "the capital of france is paris")
    walks = {"none": walklens.encoding_walk(tr, k=3), "final": walklens.encoding_walk(tr, k=3, norm="final")}
    ids = sorted(set().union(*[set(w.label_ids()) for w in walks.values()]))
    labels = walklens.analyses.walks.labels_for(llama.tokenizer, ids)
    path = walk_report.build(walks, labels, "walk").save(tmp_path / "walk")
    html = path.read_text()
    # the rank maps are drawn on the page from their documents (results.js's rankMap, the explorer's own function)
    assert html.count("data-result='rank_map'") == len(walks) and "<img" not in html  # one per walk, both maps
    pngs = re.findall(r"<a href='([^']+\.png)'>", html)
    assert sorted(pngs) == sorted(f"rank_{w}_{k}.png" for w in ("input", "next") for k in walks)
    assert all((tmp_path / "walk" / p).stat().st_size > 1000 for p in pngs)

    sim = simmap_report.build({"embed/cosine": walklens.similarity_map(tr, "embed", "cosine")}, tr.tokens, "s")
    html = sim.save(tmp_path / "sim").read_text()
    assert html.count("data-result='simmap_view'") == 1 and "<img" not in html  # drawn from its document
    assert (tmp_path / "sim" / "simmap_embed_cosine.png").is_file() and "href='simmap_embed_cosine.png'" in html
