"""The explorer's steering cards view (``walklens serve --card FILE``) through Starlette's test client: the cards
listed, one sent as its report's own parts, every string as JSON data; and the command's one-line refusals of a
file that is not a card.  The page drawing them as text: tests/test_explorer_browser.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from _cli import run
from _explorer import EVIL_GENERATION, EVIL_MODEL, evil_card
from walklens.base.outputs import jsonable
from walklens.lab.reports import steercard as card_report
from walklens.server import bounds
from walklens.server.app import create_app
from walklens.server.state import Explorer
from walklens.testing import tiny_model

HOST = "127.0.0.1:8765"
TOKEN = "test-token_0123456789"
H = {"X-Walklens-Token": TOKEN}


def post(client: TestClient, path: str, **body: Any) -> Any:
    return client.post(path, json=body, headers=H)


def test_steering_cards_are_the_reports_parts_and_text(tmp_path: Path) -> None:
    """``serve --card``: the cards listed, one sent as its report's own parts (reports/steercard.py ``view``, the
    builder of the HTML report), every string verbatim as JSON data (an ``<img onerror>`` generation and model
    name included; the page draws them as text: see the browser test), the HTML report escaping them; no card
    is a 404, an index out of range a 400."""
    card = evil_card(tmp_path)
    llama = tiny_model("llama")
    app = create_app(Explorer({"llama": llama}, cards=[("c.json", card)]), TOKEN, {HOST})
    with TestClient(app, base_url=f"http://{HOST}") as c:
        assert c.get("/api/info", headers=H).json()["cards"] == 1
        (listed,) = c.get("/api/cards", headers=H).json()["cards"]
        assert listed == {
            "id": 0,
            "file": "c.json",
            "model": EVIL_MODEL,
            "set": card.set_name,
            "n_cells": len(card.cells),
        }
        r = post(c, "/api/card", card=0)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        d = r.json()
        assert d["parts"] == jsonable(card_report.view(card), bounds.DIGITS)
        kinds = [q["part"] for q in d["parts"]]
        assert kinds.count("lines") == 3 * len(card_report.CURVES) and "table" in kinds  # three kinds of target
        curve = next(q for q in d["parts"] if q["part"] == "lines")
        assert {s["name"] for s in curve["spec"]["series"]} == {"add L1"} and "band" in curve["spec"]["series"][0]
        examples = d["parts"][-1]
        assert examples["headers"] == ["target", "cell", "prompt", "continuation"]
        assert examples["rows"][0][2:] == [EVIL_GENERATION, EVIL_GENERATION]
        assert post(c, "/api/card", card=1).status_code == 400
    html = card_report.build(card).render()
    assert EVIL_GENERATION not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    with TestClient(create_app(Explorer({"llama": llama}), TOKEN, {HOST}), base_url=f"http://{HOST}") as c:
        assert c.get("/api/cards", headers=H).json() == {"cards": []}
        r = post(c, "/api/card", card=0)
        assert r.status_code == 404 and "--card FILE" in r.json()["error"]


def test_serve_refuses_a_bad_card_file_in_one_line(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    for content, needle in (("{", "not valid JSON"), ('{"cells": []}', "not a steering card document")):
        bad.write_text(content, encoding="utf-8")
        rc, err = run(capfd, "serve", "--card", str(bad), "--model", "nothing-here")
        assert rc == 2 and len(err) == 1 and err[0].startswith("walklens: error: --card") and needle in err[0], err
    rc, err = run(capfd, "serve", "--card", str(tmp_path / "none.json"))
    assert rc == 2 and len(err) == 1 and "no such file" in err[0], err
