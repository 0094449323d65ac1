"""Every public result shows itself in a notebook (docs/notebooks.md, "Views"): ``_repr_html_`` is its report's view
in a sandboxed frame, everything inline, model strings as text, bounded in size; ``repr`` fits 80 columns.

The browser half (two views of one type on a page, each interactive; nothing fetched) is
tests/test_notebook_browser.py.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import walklens
from walklens.base.display import MAX_LINES, WIDTH, Shown, registered_views, text
from walklens.reports import notebook

#: public classes that are not results of their own: parts of a result, settings, the model, stores, errors
PARTS = {
    "Batch": "capture's batch, read through its traces",
    "Step": "one step of record_steps",
    "Generation": "one sequence of generate_batch, shown through its decoding walk and its trace",
    "CompactSpec": "a setting",
    "Eigen": "ov maths, part of PowerSpectra",
    "FactoredMatrix": "ov maths, part of PowerSpectra",
    "LayerSpectrum": "part of PowerSpectra",
    "HeadSpectrum": "part of PowerSpectra",
    "KernelClass": "part of PositionKernels",
    "StackKernels": "part of PositionKernels",
    "IdentityCheck": "part of IdentityResult",
    "ParityCheck": "part of ParityCard",
    "SteerRow": "part of SteeringSweep",
    "SteerEdit": "part of SteerResult",
    "LoadedModel": "the model",
    "ConceptCache": "a store",
    "Hooks": "hook plumbing",
    "CardCell": "part of SteeringCard",
    "CardChoice": "part of SteeringCard",
    "CardExample": "part of SteeringCard",
    "SteeringSet": "a steering card's input data",
    "ClassContrast": "part of BlockContrast",
    "Correlation": "part of Cooccurrence",
}

MARKUP = '<img src=x onerror="alert(1)">&amp;'


@pytest.fixture(scope="module")
def results(every_result: dict[str, Any]) -> dict[str, Any]:
    return every_result


@pytest.fixture(scope="module")
def outputs(results: dict[str, Any]) -> dict[str, str]:
    """Each result's notebook output (drawn once)."""
    return {name: r._repr_html_() for name, r in results.items()}


class _Tags(HTMLParser):
    """Every start tag of a document with its attributes, and its script bodies."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


def tags(doc: str) -> _Tags:
    p = _Tags()
    p.feed(doc)
    return p


def frame_page(output: str) -> str:
    """The page inside a view's one sandboxed frame (checking the frame as it goes)."""
    outer = tags(output)
    frames = [a for t, a in outer.tags if t == "iframe"]
    assert len(frames) == 1, output[:300]
    assert frames[0]["sandbox"] == "allow-scripts"  # no allow-same-origin: the page cannot reach the notebook
    assert {t for t, _ in outer.tags} <= {"div", "iframe", "script"}, outer.tags
    srcdoc = frames[0]["srcdoc"]
    assert srcdoc is not None and srcdoc.startswith("<!doctype html>")
    return srcdoc


def offline(doc: str) -> None:
    """Nothing in the page asks for a resource outside it: no src/href but data: URIs and fragments, no link tags,
    no script loaders."""
    parsed = tags(doc)
    for tag, attrs in parsed.tags:
        assert tag not in ("link", "base", "object", "embed", "iframe"), tag
        for name in ("src", "href", "srcset", "action", "data"):
            value = attrs.get(name)
            assert value is None or value.startswith(("data:", "#")), (tag, name, value)
        if tag == "script":
            assert "src" not in attrs
    body = "\n".join(parsed.scripts).replace("http://www.w3.org/2000/svg", "")  # a name, not a request
    assert not re.search(r"\brequire\s*\(|importScripts|fetch\s*\(|XMLHttpRequest|https?://", body)


def test_every_public_result_type_shows_itself() -> None:
    from walklens import lab
    from walklens.lab.experiments import curves, runner, summary

    groups = (walklens, walklens.core, walklens.analyses, lab)
    classes = {n: getattr(g, n) for g in groups for n in g.__all__ if inspect.isclass(getattr(g, n))}
    classes = {n: c for n, c in classes.items() if not issubclass(c, BaseException)}
    # results of the HellaSwag study, reached through walklens.lab.experiments
    classes.update({"runner.RunSummary": runner.RunSummary, "summary.RunSummary": summary.RunSummary})
    classes["CurveSet"] = curves.CurveSet
    shown = {n: c for n, c in classes.items() if n not in PARTS}
    assert set(PARTS) <= set(classes), set(PARTS) - set(classes)
    missing = [n for n, c in shown.items() if not issubclass(c, Shown) or c._view not in notebook.VIEWS]
    assert not missing, f"public result types with no notebook view: {missing}"
    assert len({c._view for c in shown.values()}) == len(shown)  # one view per type
    assert {c._view for c in shown.values()} >= set(notebook.VIEWS)  # no view without a type
    assert all(not issubclass(classes[n], Shown) for n in PARTS)


def test_every_view_registers_itself_with_the_display_protocol() -> None:
    """The results never import the views: each view registers its renderer (walklens.base.display.register_view)."""
    assert registered_views() == {name: notebook.html for name in notebook.VIEWS}

    class Unseen(Shown, view="no_such_view"):
        pass

    with pytest.raises(TypeError, match="Unseen has no notebook view"):
        Unseen()._repr_html_()


def test_a_result_module_imported_alone_shows_itself() -> None:
    """``import walklens.analyses.controlvectors`` alone, in a fresh interpreter: the package root runs first and
    registers
    every view, so the result draws its view."""
    code = (
        "import torch\n"
        "from walklens.analyses.controlvectors import ControlVector\n"
        "out = ControlVector({1: torch.ones(8), 2: -torch.ones(8)}, 'llama', 'add', 2.0, 'cat')._repr_html_()\n"
        "assert 'srcdoc' in out and 'ControlVector' in out, out[:300]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]


def test_fixture_holds_every_shown_type(results: dict[str, Any]) -> None:
    views = {type(r)._view for r in results.values()}
    assert views == set(notebook.VIEWS), set(notebook.VIEWS) - views


def test_each_view_is_its_report_offline_in_a_sandboxed_frame(results: dict[str, Any], outputs: dict[str, str]) -> None:
    for name, r in results.items():
        page = frame_page(outputs[name])
        offline(page)
        assert page.count("<script>") >= 2, name  # the report's plots and results scripts, inline
        assert notebook.report(r).title in html.unescape(page), name  # the report's own page


def test_the_same_builder_draws_the_command_page_and_the_view(results: dict[str, Any]) -> None:
    from walklens.reports import walk

    w = results["EncodingWalk"]
    command = walk.build({w.norm: w}, w.labels, f"Encoding walk of {w.model_name}", figures=False).render()
    assert notebook.page(w).startswith(command.split("<script>")[0])


def test_plain_text_repr_fits_80_columns(results: dict[str, Any]) -> None:
    for name, r in results.items():
        lines = repr(r).splitlines()
        assert lines[0].startswith(type(r).__name__), name
        assert max(map(len, lines)) <= WIDTH and len(lines) <= MAX_LINES, (name, lines)


def test_text_repr_cuts_long_fields_and_many_of_them() -> None:
    @dataclasses.dataclass(repr=False)
    class Wide(Shown):
        model_name: str
        a_rather_long_field_name_indeed: list[str]

    many = dataclasses.make_dataclass("Many", [(f"f{i}", int) for i in range(40)], bases=(Shown,))
    w = Wide("m" * 200, ["x" * 50] * 30)
    assert all(len(line) <= WIDTH for line in repr(w).splitlines())
    lines = text(many(*range(40))).splitlines()
    assert len(lines) == MAX_LINES and lines[-1].startswith("  … 18 more fields")


def _parsed_text(page: str) -> str:
    """Every attribute value and text of a page, unescaped once (what a browser hands its scripts)."""
    parsed = tags(page)
    return " ".join(str(v) for _, a in parsed.tags for v in a.values()) + " ".join(parsed.scripts)


def test_model_strings_reach_the_view_as_text(results: dict[str, Any]) -> None:
    w = dataclasses.replace(results["EncodingWalk"], model_name=MARKUP)
    w.tokens = [MARKUP] * len(w.tokens)
    w.labels = {i: MARKUP for i in w.labels}
    dw = dataclasses.replace(
        results["DecodingWalk"], prompt=MARKUP, tokens=[MARKUP] * len(results["DecodingWalk"].tokens)
    )
    m = results["SimilarityMap"]
    smap = type(m).of(m.plain(), [MARKUP] * len(m.tokens), m.point, m.metric, m.normed, MARKUP)
    for r in (w, dw, smap):
        output = r._repr_html_()
        outer, page = tags(output), frame_page(output)
        inner = tags(page)
        for parsed in (outer, inner):
            assert not [t for t, a in parsed.tags if t == "img" and a.get("src") == "x"]
            assert not [n for _, a in parsed.tags for n in a if n.startswith("on")]
        assert MARKUP in html.unescape(_parsed_text(page)) or MARKUP in html.unescape(page)


def test_a_view_over_the_limit_is_a_summary_with_a_note(
    results: dict[str, Any], outputs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    r, full = results["PowerSpectra"], outputs["PowerSpectra"]
    monkeypatch.setattr(notebook, "LIMIT_MB", 0.05)
    small = r._repr_html_()
    assert len(full) > 100_000 > len(small)
    page = html.unescape(frame_page(small))
    assert "over walklens.reports.notebook.LIMIT_MB = 0.05" in page and "walklens.reports.notebook.save" in page
    assert text(r).splitlines()[1] in page  # the text repr
    offline(frame_page(small))
    assert notebook.html(r, limit_mb=10).count("srcdoc") == 1


def test_save_writes_the_full_report(results: dict[str, Any], tmp_path: Path) -> None:
    path = notebook.save(results["Dynamics"], tmp_path / "dynamics")
    assert path.name == "index.html" and (tmp_path / "dynamics" / "dynamics.png").is_file()  # linked: not in a view
    assert "dynamics.png" not in html.unescape(frame_page(results["Dynamics"]._repr_html_()))


def test_similarity_map_stays_a_tensor(results: dict[str, Any]) -> None:
    import torch

    m = results["SimilarityMap"]
    assert isinstance(m, torch.Tensor) and m.shape == (len(m.tokens), len(m.tokens))
    assert type(m * 2) is torch.Tensor and type(m[0]) is torch.Tensor  # arithmetic gives plain tensors
    assert m.view(-1).shape == (len(m.tokens) ** 2,)  # the tensor's own view method, not the display's
    import copy
    import pickle

    for again in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(again.plain(), m.plain()) and again.tokens == m.tokens
