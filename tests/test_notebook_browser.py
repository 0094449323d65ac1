"""Notebook views in a real browser (docs/notebooks.md, "Views"): one page holding two copies of every result's
view, opened in headless Chromium with no network.  Every view draws, no script fails, nothing is fetched, the
two copies of a view with a heatmap answer the pointer each on its own, and a model token made of markup shows
as text.

Chromium comes from the ``chromium`` fixture (tests/conftest.py); Playwright drives it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.browser  # Chromium through Playwright

MARKUP = '<img src=x onerror="alert(1)">'

#: in every frame: canvases with painted pixels, line charts with paths, result blocks drawn, the tooltip's state
_DRAWN = """() => {
  const painted = [...document.querySelectorAll('.wl-heatmap canvas.wl-canvas')].map(c => {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
    return n;
  });
  return {
    heatmaps: document.querySelectorAll('.wl-heatmap').length, painted,
    lines: document.querySelectorAll('.wl-lines').length,
    paths: [...document.querySelectorAll('.wl-lines')].map(e => e.querySelectorAll('path, polyline').length),
    results: [...document.querySelectorAll('.wl-result')].map(e => e.children.length),
    tables: document.querySelectorAll('table').length,
    text: document.body.innerText.length,
    injected: document.querySelectorAll('img[src="x"]').length,
  };
}"""
_TIP = "() => [...document.querySelectorAll('.wl-tip')].some(t => getComputedStyle(t).display !== 'none')"


def _page(results: dict[str, Any], path: Path) -> list[str]:
    """A page of every view twice; returns the name of each view in order."""
    walk = results["EncodingWalk"]
    marked = dataclasses.replace(walk, tokens=[MARKUP] + walk.tokens[1:])
    names = [*results, *(f"{n} (2)" for n in results), "EncodingWalk (markup)"]
    views = [*results.values(), *results.values(), marked]
    body = "\n".join(f"<h2>{n}</h2>{v._repr_html_()}" for n, v in zip(names, views))
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{body}</body></html>")
    return names


@pytest.fixture(scope="module")
def opened(chromium: str, every_result: dict[str, Any], tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("nbviews") / "views.html"
    names = _page(every_result, path)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=["--no-sandbox", "--disable-gpu", "--disable-features=IsolateSandboxedIframes"],
            proxy={"server": "http://127.0.0.1:9"},  # a dead proxy: nothing could leave even if asked
        )
        ctx = browser.new_context(viewport={"width": 1200, "height": 900})
        asked: list[str] = []

        def route(r: Any) -> None:
            asked.append(r.request.url)
            (r.continue_() if r.request.url == path.as_uri() else r.abort())

        ctx.route("**/*", route)
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("dialog", lambda d: (errors.append("dialog: " + d.message), d.dismiss()))
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        page.wait_for_timeout(500)
        frames = [f.content_frame() for f in page.query_selector_all("iframe.walklens-frame")]
        yield names, page, frames, asked, errors
        browser.close()


def test_every_view_draws_offline_without_errors(opened) -> None:
    names, page, frames, asked, errors = opened
    assert len(frames) == len(names) and all(f is not None for f in frames)
    assert errors == []
    assert [u for u in asked if not u.startswith("file:")] == []  # srcdoc frames ask for nothing
    for name, frame in zip(names, frames):
        d = frame.evaluate(_DRAWN)
        assert d["text"] > 0, name
        assert all(n > 100 for n in d["painted"]) and len(d["painted"]) == d["heatmaps"], (name, d)
        assert all(n > 0 for n in d["paths"]), (name, d)
        assert all(n > 0 for n in d["results"]), (name, d)
        assert d["heatmaps"] + d["lines"] + len(d["results"]) + d["tables"] > 0, (name, d)
        assert d["injected"] == 0, name
    heights = [f.frame_element().evaluate("e => e.style.height") for f in frames]
    assert len(set(heights)) > 1  # each frame sized to its page


def test_two_copies_of_a_view_answer_the_pointer_on_their_own(opened) -> None:
    names, page, frames, _, errors = opened
    hovered = []
    for name in names[: len(names) // 2]:
        first, second = frames[names.index(name)], frames[names.index(f"{name} (2)")]
        canvas = ".wl-heatmap canvas.wl-canvas"
        if not first.locator(canvas).count():
            continue  # tables and line charts only: nothing answers the pointer
        for here, there in ((second, first), (first, second)):
            box = here.locator(canvas).first.evaluate("c => [c.width, c.height]")
            here.locator(canvas).first.hover(position={"x": box[0] - 15, "y": box[1] - 15})  # the last cell
            page.wait_for_timeout(50)
            assert here.evaluate(_TIP) and not there.evaluate(_TIP), name
        hovered.append(name)
    assert {"Trace", "EncodingWalk", "SimilarityMap", "SelfMass"} <= set(hovered), hovered
    assert errors == []


def test_a_markup_token_shows_as_text(opened) -> None:
    names, _, frames, _, errors = opened
    frame = frames[names.index("EncodingWalk (markup)")]
    assert MARKUP in frame.evaluate("() => document.body.innerText")
    assert frame.evaluate("() => document.querySelectorAll('img').length") == 0
    assert not [e for e in errors if "dialog" in e]
