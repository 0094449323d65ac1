"""One document per result: the dict a report module's ``document()`` writes as ``--json`` is what the report's
page embeds for its script (``reports/assets/results.js``) and what the explorer's API sends its views, so a
field is added in one place.  Each test plants a field in one place (a result dataclass, or a document
function) and finds it in every reader: ``--json``, the report's embedded documents and the API's replies."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

import walklens
from _explorer import TEST_TEXT
from walklens.analyses.power import Alignment
from walklens.analyses.walks import EncodingWalk
from walklens.lab.reports import curves as compaction_report
from walklens.lab.reports import sweep as sweep_report
from walklens.reports import generate as generate_report
from walklens.reports import heads as heads_report
from walklens.reports import kernels as kernels_report
from walklens.reports import power as power_report
from walklens.reports import simmap as simmap_report
from walklens.reports import steer as steer_report
from walklens.reports import walk as walk_report
from walklens.reports.html import DIGITS
from walklens.server import api_power, api_walks
from walklens.server.app import create_app
from walklens.server.security import allowed_hosts
from walklens.server.state import Explorer
from walklens.testing import tiny_model

HOST = "127.0.0.1:8765"
TOKEN = "test-token_0123456789"
H = {"X-Walklens-Token": TOKEN}


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture
def client(llama):
    """A fresh explorer per test: its caches never hold a result computed before a test planted its field."""
    app = create_app(Explorer({"llama": llama}), TOKEN, allowed_hosts("127.0.0.1", 8765))
    with TestClient(app, base_url=f"http://{HOST}") as c:
        yield c


def post(client: TestClient, path: str, **body: Any) -> dict[str, Any]:
    r = client.post(path, json=body, headers=H)
    assert r.status_code == 200, r.text
    return r.json()


def embedded(page: str) -> dict[str, dict[str, Any]]:
    """The documents a report's page embeds for results.js: kind -> document."""
    return {
        m[1]: json.loads(html.unescape(m[2]))
        for m in re.finditer(r"<div class='wl-result' data-result='([^']*)' data-doc='([^']*)'>", page)
    }


def jsonify(x: Any) -> Any:
    return json.loads(json.dumps(walklens.base.outputs.jsonable(x)))


# ---- a field added to a result dataclass reaches every reader, with no other edit ---------------------------------


@dataclasses.dataclass
class PlantedWalk(EncodingWalk):
    """An encoding walk with one more per-cell field (a [points, positions] map)."""

    planted: torch.Tensor | None = None


@dataclasses.dataclass
class PlantedAlignment(Alignment):
    """An alignment with one more per-point field."""

    planted: list[float] = dataclasses.field(default_factory=list)


def _planted_walk(w: EncodingWalk) -> PlantedWalk:
    P, T = w.rank_of_input.shape
    values = {f.name: getattr(w, f.name) for f in dataclasses.fields(w)}
    return PlantedWalk(**values, planted=1000 + 100 * torch.arange(P)[:, None] + torch.arange(T)[None, :])


def test_a_field_added_to_the_encoding_walk_reaches_json_and_every_walk_reply(client, llama, monkeypatch):
    real = api_walks.encoding_walk
    monkeypatch.setattr(api_walks, "encoding_walk", lambda *a, **k: _planted_walk(real(*a, **k)))
    w = _planted_walk(walklens.encoding_walk(walklens.capture(llama, TEST_TEXT), k=3, progress=False))
    doc = jsonify(walk_report.document({"none": w}, {}, "llama", TEST_TEXT))
    assert doc["walks"]["none"]["planted"] == w.planted.tolist()  # --json

    d = post(client, "/api/walk", model="llama", text=TEST_TEXT, fields=["points", "planted"])
    assert set(d) == {
        "model",
        "n_vocab",
        "block",
        "columns",
        "points",
        "planted",
        "final",
        "provisional",
        "point_index",
    }
    P = len(d["points"])
    assert d["planted"] == (1000 + 100 * torch.arange(P)[:, None] + torch.arange(6)[None, :]).tolist()
    assert d["final"]["planted"] == [1000 + t for t in range(6)]  # the point `final` read on its own: row 0
    c = post(client, "/api/walk/cell", model="llama", text=TEST_TEXT, point=2, position=3)
    assert c["planted"] == 1003  # from the full reading of that one point (its row 0)


def test_a_field_added_to_a_walk_is_reduced_by_blocks_like_the_rank_maps(client, monkeypatch):
    from walklens.server import bounds

    real = api_walks.encoding_walk
    monkeypatch.setattr(api_walks, "encoding_walk", lambda *a, **k: _planted_walk(real(*a, **k)))
    monkeypatch.setattr(bounds, "MAX_CELLS", 8)
    d = post(client, "/api/walk", model="llama", text=TEST_TEXT, fields=["planted", "rank_of_next"])
    assert d["block"] == 3 and [row[1] for row in d["planted"]] == [1000 + 100 * p + 3 for p in range(4)]


def test_a_field_added_to_alignment_reaches_json_the_report_page_and_the_explorer(client, llama, monkeypatch):
    def planted(al: Alignment) -> PlantedAlignment:
        return PlantedAlignment(
            **{f.name: getattr(al, f.name) for f in dataclasses.fields(al)},
            planted=[0.5 + i for i in range(len(al.points))],
        )

    real = api_power.alignment
    monkeypatch.setattr(api_power, "alignment", lambda *a, **k: planted(real(*a, **k)))
    spectra = walklens.power_spectra(llama, heads=False, nearest=3)
    al = planted(walklens.alignment(llama, TEST_TEXT, spectra=spectra, n_random=8, n_shuffles=4))
    want = [0.5 + i for i in range(len(al.points))]
    assert jsonify(power_report.document(spectra, al, texts=[TEST_TEXT]))["alignment"]["planted"] == want
    page = power_report.build(spectra, al).render()
    assert embedded(page)["alignment"]["planted"] == want
    assert post(client, "/api/power", model="llama", text=TEST_TEXT)["alignment"]["planted"] == want


# ---- each reply is its report's document: a field planted in the document function is in the reply -----------------


def _plant(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> None:
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: {**real(*a, **k), "planted": f"{module.__name__}.{name}"})


REPLIES = [  # (report module, document function, API path, request, where the planted field is in the reply)
    (power_report, "alignment_document", "/api/power", {}, ("alignment",)),
    (power_report, "spectra_document", "/api/power", {}, ("spectra",)),
    (
        steer_report,
        "document",
        "/api/steer",
        {"target": " paris", "layers": [1], "alpha": 4.0, "max_new_tokens": 2},
        (),
    ),
    (walk_report, "walk_document", "/api/walk", {}, ()),
    (walk_report, "cell_document", "/api/walk/cell", {"point": 1, "position": 2}, ()),
    (generate_report, "document", "/api/decode", {"max_new_tokens": 2}, ()),
    (simmap_report, "document", "/api/simmap", {"point": "L1.resid_mid"}, ()),
    (heads_report, "cluster_document", "/api/attention", {}, ("cluster",)),
    (heads_report, "self_mass_document", "/api/attention", {}, ("self_mass",)),
    (heads_report, "head_stats_document", "/api/attention", {}, ("head_stats",)),
    (kernels_report, "stack_document", "/api/kernels", {}, ("stacks", 0)),
]


@pytest.mark.parametrize(
    "module, name, path, body, where", REPLIES, ids=[f"{m.__name__.rsplit('.', 1)[1]}.{n}" for m, n, *_ in REPLIES]
)
def test_each_explorer_reply_is_its_reports_document(client, monkeypatch, module, name, path, body, where):
    _plant(monkeypatch, module, name)
    d = post(client, path, model="llama", text=TEST_TEXT, **body)
    for key in where:
        d = d[key]
    assert d["planted"] == f"{module.__name__}.{name}"


def test_the_steering_json_and_page_are_the_document(llama, tmp_path, monkeypatch):
    """``walklens steer --json`` writes :func:`steer.document`, and the page's table of runs is drawn from it."""
    from walklens.cli import main

    _plant(monkeypatch, steer_report, "document")
    d = tmp_path / "m"
    llama.model.save_pretrained(str(d), safe_serialization=True)
    llama.tokenizer.save_pretrained(str(d))
    js, out = tmp_path / "s.json", tmp_path / "rep"
    assert (
        main(
            [
                "steer",
                "the dog and the",
                "--toward",
                " cat",
                "--layers",
                "1",
                "--alpha",
                "0,4",
                "--method",
                "add",
                "--max-new-tokens",
                "2",
                "--model",
                str(d),
                "--json",
                str(js),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(js.read_text())
    assert doc["planted"] == "walklens.reports.steer.document" and len(doc["rows"]) == 2
    page = embedded((out / "index.html").read_text(encoding="utf-8"))
    assert page["steering"] == walklens.base.outputs.jsonable(doc, DIGITS)  # the page's numbers: 6 decimals


def test_a_curve_added_to_a_document_reaches_the_png_and_the_page(llama, monkeypatch):
    """The alignment's curves are named once (:data:`power.ALIGNMENT_CURVES`): the PNG and the page's script
    (results.js, which the explorer runs too) draw what the document names."""
    curves = (*power_report.ALIGNMENT_CURVES, {"name": "planted curve", "y": "std"})
    monkeypatch.setattr(power_report, "ALIGNMENT_CURVES", curves)
    spectra = walklens.power_spectra(llama, heads=False, nearest=3)
    al = walklens.alignment(llama, TEST_TEXT, spectra=spectra, n_random=8, n_shuffles=4)
    doc = power_report.alignment_document(al)
    assert [c["name"] for c in embedded(power_report.build(spectra, al).render())["alignment"]["curves"]][
        -1
    ] == "planted curve"
    fig = power_report.alignment_figure(doc)
    assert "planted curve" in [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    line = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "planted curve"][0]
    sel = [i for i, p in enumerate(al.points) if p.endswith(".resid_pre")]
    assert list(line.get_ydata()) == pytest.approx([al.std[i] for i in sel])


# ---- the documents of every report; the requests' fields ------------------------------------------------------------

TOPICS = ("walk", "generate", "simmap", "heads", "kernels", "power", "steer", "lab.reports.sweep", "lab.reports.curves")


def test_every_report_has_a_document() -> None:
    import importlib

    from test_reports import report_module

    for topic in TOPICS:
        assert callable(importlib.import_module(report_module(topic)).document), topic


def test_the_sweep_and_compaction_files_hold_their_documents(tmp_path) -> None:
    from walklens.lab.experiments.curves import CurvePoint, CurveSet

    point = CurvePoint(
        shots=0,
        what="examples",
        strategy="full",
        ratio=None,
        spec="",
        n=4,
        acc=0.5,
        acc_norm=0.5,
        acc_ci=(0.1, 0.9),
        acc_norm_ci=(0.1, 0.9),
        kept_acc=None,
        kept_acc_ci=(None, None),
        kept_acc_norm=None,
        kept_acc_norm_ci=(None, None),
        tokens_per_vector=None,
        inputs=10,
        inputs_full=10,
        seconds={},
    )
    curves = CurveSet(model="m", n_items=4, n_tune=0, tuned={}, points=[point])
    doc = jsonify(compaction_report.document(curves))
    assert doc == jsonify(curves) and json.loads(compaction_report.build(curves).files["curves.json"]) == doc
    rep = sweep_report.build([], source="r.sqlite")
    assert jsonify(sweep_report.document([], "r.sqlite")) == {"source": "r.sqlite", "runs": []} and not rep.files


@pytest.mark.parametrize(
    "fields, message",
    [
        ("rank_of_input", "fields must be a list"),
        ([], "fields must be a list"),
        ([3], "fields must be a list"),
        (["x" * 65], "fields must be a list"),
        (["rank_of_input", "<b>nope</b>"], "not a field of this document"),
    ],
)
def test_fields_are_checked_and_never_echoed(client, fields, message):
    r = client.post("/api/walk", json={"model": "llama", "text": TEST_TEXT, "fields": fields}, headers=H)
    assert r.status_code == 400 and message in r.json()["error"] and "<b>" not in r.json()["error"]
    if "not a field" in message:
        assert "rank_of_next" in r.json()["error"]  # it lists the document's fields
