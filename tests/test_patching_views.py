"""The patching views (docs/patching.md): the grid, path patching's grid and the walk beside the test, each drawn from
its document by one function of results.js in the report, the notebook view and the explorer (``serve --patch``);
the documents checked on their way in, every string as text."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from _cli import run
from test_schemas import mismatches
from walklens.analyses import patch, path_patch, walk_beside_patch
from walklens.base.errors import InputError
from walklens.base.outputs import jsonable
from walklens.reports import notebook
from walklens.reports import patching as view
from walklens.reports.schemas import DOCUMENTS
from walklens.server import bounds
from walklens.server.app import Running, create_app
from walklens.server.state import Explorer
from walklens.testing import tiny_model

ROOT = Path(__file__).resolve().parents[1]
EVIL = "<img src=x onerror=alert(1)>"
HOST, TOKEN = "127.0.0.1:8765", "test-token_0123456789"
H = {"X-Walklens-Token": TOKEN}


@pytest.fixture(scope="module")
def lm() -> Any:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def beside(lm: Any) -> Any:
    return walk_beside_patch(lm, "the cat runs", "the dog runs", " runs", " cat")


@pytest.fixture(scope="module")
def path(lm: Any) -> Any:
    return path_patch(lm, "the cat runs", "the dog runs", sender="L0.H1", receivers=["L1.resid_pre", "L1.H0.v"])


def evil(doc: dict[str, Any]) -> dict[str, Any]:
    """A patching document with markup in every string a model or a user gives: tokens, model, metric, notes."""
    return {
        **doc,
        "tokens": [EVIL] * len(doc["tokens"]),
        "model": EVIL,
        "metric": EVIL,
        "notes": [EVIL],
        "points": [EVIL, *doc["points"][1:]],
    }


def embedded(page: str) -> list[tuple[str, Any]]:
    """The documents a page embeds for results.js: (kind, document)."""
    found = re.findall(r"data-result='(\w+)' data-doc='([^']*)'", page)
    return [(kind, json.loads(html.unescape(d))) for kind, d in found]


def test_the_walk_beside_the_test_is_its_grid_and_its_walks(beside: Any, lm: Any) -> None:
    """The restoration curve is the grid's column at the last position; the ranks are the walk's at each layer's
    input (the vector the grid restores); the first layers and the table agree with them."""
    d = beside.document()
    last = d["patch"]["positions"].index(d["position"])
    assert d["position"] == len(beside.patch.positions) - 1 and d["layers"] == [0, 1]
    assert d["restored"] == [float(v) for v in np.asarray(beside.patch.values)[:, last]]
    assert d["restored_raw"] == [float(v) for v in np.asarray(beside.patch.raw)[:, last]]
    for r, w in zip(d["readings"], beside.walks):
        assert r["ranks"] == [w.ranks[w.points.index(f"L{lay}.resid_pre")] for lay in d["layers"]]
        assert (r["point"], r["layer"], r["reading"]) == (w.point, w.layer, w.reading)
    for lv in d["levels"]:
        want = next((lay for lay, v in zip(d["layers"], d["restored"]) if v >= lv["level"]), None)
        assert lv["layer"] == want
    df = beside.to_pandas()
    assert list(df["restored"]) == d["restored"] and list(df["rank_final"]) == d["readings"][1]["ranks"]
    assert mismatches(DOCUMENTS["walk_beside"], jsonable(d)) == []
    with pytest.raises(InputError, match="at least one reading"):
        walk_beside_patch(lm, "the cat runs", "the dog runs", " runs", " cat", readings=())


def test_the_pages_embed_the_document_and_escape_every_string(beside: Any, path: Any) -> None:
    """The grid's page, the walk beside the test's page and the notebook views hold the documents results.js draws
    (no second renderer in Python), every string escaped: no markup of a token, a model or a metric reaches the
    page."""
    grid = evil(path.document())
    page = view.build(grid).render()
    assert embedded(page) == [("patching", jsonable(grid, 6))]
    assert EVIL not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "function patching(parent, doc)" in page  # drawn by the page's own script
    page = view.build_beside([beside, beside.document()]).render()
    assert [k for k, _ in embedded(page)] == ["walk_beside", "walk_beside"]
    for r in (path, beside):
        frame = r._repr_html_()
        assert "data-result=" in html.unescape(frame) and notebook.report(r).title in html.unescape(frame)
    bad = dataclasses.replace(beside, answer=EVIL, model_name=EVIL)
    page = view.build_beside(bad).render()
    assert EVIL not in page and embedded(page)[0][1]["answer"] == EVIL


def test_path_patching_is_labelled_by_its_sender_and_receivers(path: Any, lm: Any) -> None:
    d = path.document()
    assert d["method"] == "path" and d["sender"] == "L0.H1" and d["points"] == ["L1.resid_pre", "L1.H0.v"]
    assert view.title(d) == "Path patching (denoise) from L0.H1"
    assert view.subtitle(d).endswith(f"2 receivers x {len(d['positions'])} positions, kl")
    exact = jsonable(patch(lm, "the cat runs", "the dog runs").document())
    assert exact["sender"] is None and view.title(exact) == "Exact patching (denoise)"
    assert "points x" in view.subtitle(exact)
    js = (ROOT / "src/walklens/reports/assets/results.js").read_text(encoding="utf-8")
    assert "rows the receivers, columns the position of" in js  # the heatmap's title for method "path"


def test_a_document_that_is_not_a_patching_grid_is_refused_in_one_line(beside: Any) -> None:
    good = jsonable(beside.document())
    assert view.checked([good, good["patch"]]) == [good, good["patch"]]
    short = {**good["patch"], "values": good["patch"]["values"][:1]}
    for doc, needle in (
        ({"kind": "walk"}, "not a patching document (kind 'walk'"),
        ([], "an empty list"),
        ({k: v for k, v in good.items() if k != "restored"}, "no field 'restored'"),
        (short, "values is not a grid of"),
        ({**good["patch"], "values": [[0.0]] * len(good["patch"]["points"])}, "values is not a grid of"),
        ({**good["patch"], "values": [0.0] * len(good["patch"]["points"])}, "values is not a grid of"),
        ({**good, "patch": {**good["patch"], "raw": [1]}}, "raw is not a grid of"),
        ({**good["patch"], "positions": 3}, "positions is not a list"),
        ({**good["patch"], "tokens": good["patch"]["tokens"][1:]}, "tokens is not a list of"),
        ({**good, "readings": [{**good["readings"][0], "ranks": [0]}]}, "readings[0]: ranks is not a list of 2"),
        ({**good, "readings": [1]}, "readings[0]: not a JSON object"),
        ({**good, "restored": good["restored"][:1]}, "restored is not a list of 2"),
    ):
        with pytest.raises(InputError, match=re.escape(needle)) as e:
            view.checked(doc, "--patch f.json")
        assert "\n" not in str(e.value) and str(e.value).startswith("--patch f.json")


def test_the_committed_walk_beside_the_test_holds_both_real_models() -> None:
    docs = view.checked(json.loads((ROOT / "docs/results/walk_beside_patch.json").read_text(encoding="utf-8")))
    assert {d["model"] for d in docs} == {"smollm2-135m", "gemma3-270m"}
    for d in docs:
        assert mismatches(DOCUMENTS["walk_beside"], d) == []
        assert len(d["layers"]) == len(d["patch"]["points"]) and len(d["patch"]["positions"]) > 1  # the full grid


def test_the_explorer_sends_each_document_as_it_is(beside: Any, path: Any, lm: Any) -> None:
    """``serve --patch``: the documents listed and one sent under its kind, verbatim (markup as JSON data); an index
    out of range or not an integer is a 400 in one line, no document a 404."""
    grid, bes = jsonable(evil(path.document())), jsonable(beside.document())
    app = create_app(Explorer({"llama": lm}, patches=[("g.json", grid), ("b.json", bes)]), TOKEN, {HOST})
    with TestClient(app, base_url=f"http://{HOST}") as c:
        assert c.get("/api/info", headers=H).json()["patches"] == 2
        listed = c.get("/api/patches", headers=H).json()["patches"]
        assert [(p["id"], p["file"], p["kind"]) for p in listed] == [
            (0, "g.json", "patching"),
            (1, "b.json", "walk_beside"),
        ]
        assert listed[0]["title"] == "Path patching (denoise) from L0.H1"
        d = c.post("/api/patch", json={"patch": 0}, headers=H).json()
        assert d["patching"] == jsonable(grid, bounds.DIGITS) and d["patching"]["tokens"][0] == EVIL
        assert "walk_beside" not in d and d["file"] == "g.json"
        assert c.post("/api/patch", json={"patch": 1}, headers=H).json()["walk_beside"] == jsonable(bes, bounds.DIGITS)
        for body in ({"patch": 2}, {"patch": "0"}, {}):
            r = c.post("/api/patch", json=body, headers=H)
            assert r.status_code == 400 and "\n" not in r.json()["error"], body
    with TestClient(create_app(Explorer({"llama": lm}), TOKEN, {HOST}), base_url=f"http://{HOST}") as c:
        assert c.get("/api/patches", headers=H).json() == {"patches": []}
        r = c.post("/api/patch", json={"patch": 0}, headers=H)
        assert r.status_code == 404 and "--patch FILE" in r.json()["error"]


def test_serve_refuses_a_bad_patch_file_in_one_line(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    for content, needle in (("{", "not valid JSON"), ('{"kind": "walk"}', "not a patching document")):
        bad.write_text(content, encoding="utf-8")
        rc, err = run(capfd, "serve", "--patch", str(bad), "--model", "nothing-here")
        assert rc == 2 and len(err) == 1 and err[0].startswith("walklens: error: --patch") and needle in err[0], err
    rc, err = run(capfd, "serve", "--patch", str(tmp_path / "none.json"))
    assert rc == 2 and len(err) == 1 and "no such file" in err[0], err


@pytest.mark.browser
def test_the_explorer_and_the_report_draw_the_same_grid_as_text(chromium: str, beside: Any, path: Any, lm: Any) -> None:
    """In Chromium: the explorer's patching view draws a grid whose tokens hold markup, and the walk beside the test,
    with the report's functions: the same heatmap (cells, labels) as the report's page, the raw metric on hover,
    no element or dialog from the markup, and no request but the explorer's."""
    sync_api = pytest.importorskip("playwright.sync_api")
    grid, bes = jsonable(evil(path.document())), jsonable(beside.document())
    with Running(Explorer({"llama": lm}, patches=[("g.json", grid), ("b.json", bes)])) as srv:
        with sync_api.sync_playwright() as p:
            b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = b.new_page()
            dialogs: list[str] = []
            errors: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(srv.url)
            page.wait_for_selector("body[data-ready='1']")
            page.click("#tabs button[data-view=patching]")
            page.wait_for_selector("#patching-out[data-rendered='1'] .wl-heatmap canvas")
            geo = page.eval_on_selector("#patching-out .wl-heatmap", "e => [e.dataset.rows, e.dataset.cols]")
            assert geo == [str(len(grid["points"])), str(len(grid["positions"]))]
            box = page.eval_on_selector("#patching-out canvas", "c => c.getBoundingClientRect().toJSON()")
            left, top = (
                int(v)
                for v in page.eval_on_selector("#patching-out .wl-heatmap", "e => [e.dataset.left, e.dataset.top]")
            )
            page.mouse.move(box["x"] + left + 3, box["y"] + top + 3)
            tip = page.inner_text("#patching-out .wl-tip")
            assert EVIL in tip and f"{EVIL} = " in tip and "receiver" in tip  # the metric's raw value, as text
            assert page.locator("#patching-out img").count() == 0
            assert "Path patching (denoise) from L0.H1" in page.inner_text("#patching-out h2")
            page.select_option("#patching-doc", "1")
            page.wait_for_selector("#patching-out[data-rendered='1'] .wl-lines svg .wl-dot")
            assert page.locator("#patching-out .wl-heatmap").count() == 1
            report = b.new_page()
            report.set_content(view.build(grid).render())
            report.wait_for_selector(".wl-heatmap[data-rendered='1']")
            same = report.eval_on_selector(".wl-heatmap", "e => [e.dataset.rows, e.dataset.cols, e.dataset.cell]")
            assert same[:2] == geo and report.locator("img").count() == 0
            assert dialogs == [] and errors == []
            b.close()
