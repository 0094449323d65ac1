"""The explorer under hostile requests: never a 500.  A chunked body without Content-Length over the limit is a
413, a body nested deeper than the limit, a lone surrogate and a huge integer are 400s, each one line of JSON;
the access token never appears in an asset URL (the page's assets load with its HttpOnly cookie); and a
hypothesis fuzz of every endpoint with any JSON value of any size (bounded: fixed seed, max_examples)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from _explorer import TEST_TEXT, evil_card, sweep_db
from walklens.server.app import ASSETS, Running, create_app
from walklens.server.security import allowed_hosts
from walklens.server.state import Explorer
from walklens.testing import tiny_model

HOST = "127.0.0.1:8765"
TOKEN = "test-token_0123456789"
H = {"X-Walklens-Token": TOKEN}
POSTS = [
    "/api/walk",
    "/api/walk/cell",
    "/api/decode",
    "/api/simmap",
    "/api/attention",
    "/api/kernels",
    "/api/power",
    "/api/steer",
    "/api/sweeps/run",
    "/api/card",
]
GETS = ["/api/info", "/api/status", "/api/sweeps"]
FUZZ = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def explorer(tmp_path_factory: pytest.TempPathFactory) -> Explorer:
    tmp = tmp_path_factory.mktemp("db")
    return Explorer({"llama": tiny_model("llama")}, sweep_db(tmp / "r.sqlite"), cards=[("c.json", evil_card(tmp))])


@pytest.fixture(scope="module")
def client(explorer: Explorer) -> Iterator[TestClient]:
    app = create_app(explorer, TOKEN, allowed_hosts("127.0.0.1", 8765))
    with TestClient(app, base_url=f"http://{HOST}") as c:
        yield c


def one_line_error(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json") and "\n" not in r.text
    assert words in r.json()["error"], r.text


# ---- the token stays out of asset URLs ------------------------------------------------------------------------------


def test_assets_load_with_the_page_cookie_not_a_token_in_their_url(explorer: Explorer) -> None:
    """The page used to name ``/static/app.js?token=...``: the token showed in every console stack trace."""
    with Running(explorer) as srv, httpx.Client(base_url=f"http://127.0.0.1:{srv.port}") as c:
        page = c.get("/", params={"token": srv.token})
        assert page.status_code == 200 and srv.token not in page.text
        refs = [r for r in page.text.split('"') if r.startswith("/static/")]
        assert {r.rsplit("/", 1)[1] for r in refs} == set(ASSETS) and not any("?" in r for r in refs)
        cookie = page.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/static/" in cookie
        for ref in refs:  # the cookie the page set is all the browser sends
            assert c.get(ref).status_code == 200, ref
        assert c.get("/api/info").status_code == 403  # the cookie opens the assets only, never the API
        assert c.post("/api/walk", json={"model": "llama", "text": TEST_TEXT}).status_code == 403


def test_assets_without_token_or_cookie_are_refused(client: TestClient) -> None:
    client.cookies.clear()
    for name in ASSETS:
        assert client.get(f"/static/{name}").status_code == 403
        r = client.get(f"/static/{name}", headers={"Cookie": "walklens_token_8765=wrong"})
        assert r.status_code == 403
        r = client.get(f"/static/{name}", headers={"Cookie": f"walklens_token_8765={TOKEN}"})
        assert r.status_code == 200
        r = client.get(f"/static/{name}", headers={"Cookie": f"other={TOKEN}"})
        assert r.status_code == 403
    r = client.get("/", headers={"Cookie": f"walklens_token_8765={TOKEN}"})
    assert r.status_code == 403  # the page itself needs the printed URL's token


# ---- hostile bodies -------------------------------------------------------------------------------------------


def test_a_chunked_body_over_the_limit_is_413(explorer: Explorer) -> None:
    """A 300 KB body sent in chunks without Content-Length used to end in a 500 (BodyTooLarge)."""

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "llama", "text": "'
        for _ in range(300):
            yield b"a" * 1024
        yield b'"}'

    with (
        Running(explorer) as srv,
        httpx.Client(base_url=f"http://127.0.0.1:{srv.port}", headers={"X-Walklens-Token": srv.token}) as c,
    ):
        r = c.post("/api/walk", content=chunks())
        assert "content-length" not in r.request.headers
        one_line_error(r, 413, "KiB")
        assert c.get("/api/status").json().get("failed", 0) == 0


@pytest.mark.parametrize("path", POSTS)
def test_deep_nesting_surrogates_and_huge_integers_are_400(client: TestClient, path: str) -> None:
    deep = b"[" * 50_000 + b"]" * 50_000
    one_line_error(client.post(path, content=deep, headers=H), 400, "nested")
    one_line_error(client.post(path, content=b'{"a": ' + deep + b"}", headers=H), 400, "nested")
    body = {"model": "llama", "text": "the \ud800 capital", "target": "x", "layers": [0]}
    one_line_error(client.post(path, content=json.dumps(body).encode(), headers=H), 400, "lone surrogate")
    huge = (
        b'{"model": "llama", "text": "the capital", "target": " paris", "layers": [0], "alpha": '
        + b"9" * 400
        + b', "k": '
        + b"9" * 400
        + b', "run": '
        + b"9" * 400
        + b"}"
    )
    r = client.post(path, content=huge, headers=H)  # refused where the endpoint reads one of them
    assert r.status_code in (200, 400) and "\n" not in r.text, r.text


def test_the_steering_alpha_as_a_huge_integer_is_400(client: TestClient) -> None:
    """``/api/steer`` with alpha a 400-digit integer used to end in OverflowError, a 500."""
    body = b'{"model": "llama", "text": "the capital", "target": " paris", "layers": [0], "alpha": ' + b"9" * 400 + b"}"
    one_line_error(client.post("/api/steer", content=body, headers=H), 400, "alpha must be within")


# ---- the fuzz: every endpoint, any JSON value, any size -------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=40),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
KEYS = [
    "model",
    "text",
    "target",
    "norm",
    "metric",
    "show",
    "k",
    "point",
    "position",
    "max_new_tokens",
    "layer",
    "head",
    "query",
    "layers",
    "alpha",
    "method",
    "normed",
    "run",
    "filters",
    "piece",
    "provisional",
]
VALUES = st.one_of(
    JSON,
    st.sampled_from(
        [
            "llama",
            TEST_TEXT,
            " paris",
            "final",
            "cosine",
            "dot",
            "eigen",
            "add",
            "embed",
            0,
            1,
            -1,
            2,
            [0],
            [-1],
            1e300,
            10**400,
            "\ud800",
            "",
        ]
    ),
    st.text(min_size=1000, max_size=3000),
    st.integers(-3, 70),
)
BODIES = st.one_of(
    JSON, st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=8).map(lambda d: {"model": "llama", **d})
)


@pytest.mark.parametrize("path", POSTS + GETS)
@settings(max_examples=25, **FUZZ)
@given(body=BODIES)
def test_fuzz_every_endpoint_never_answers_500(client: TestClient, path: str, body: Any) -> None:
    if path in GETS:
        params = {str(k)[:20]: str(v)[:200] for k, v in body.items()} if isinstance(body, dict) else {}
        r = client.get(path, params=params, headers=H)
    else:
        raw = json.dumps(body).encode()  # NaN and Infinity as Python writes them; a lone surrogate escaped
        r = client.post(path, content=raw, headers=H)
    assert r.status_code < 500 and r.status_code != 499, (path, body, r.text[:300])
    if r.status_code >= 400:
        assert "\n" not in r.text and isinstance(r.json()["error"], str), r.text
