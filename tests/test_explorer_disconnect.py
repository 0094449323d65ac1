"""A client that leaves mid-body (its connection closes before the request body has all arrived) is logged by the
explorer as one line, a disconnect, never an "internal error" with a traceback; the server answers nobody and stays
up (the next request is served)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from walklens.server.app import create_app
from walklens.server.security import allowed_hosts
from walklens.server.state import Explorer
from walklens.testing import tiny_model

TOKEN = "test-token_0123456789"
POSTS = ["/api/walk", "/api/decode", "/api/simmap", "/api/attention", "/api/power", "/api/steer", "/api/card"]


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app(Explorer({"llama": tiny_model("llama")}), TOKEN, allowed_hosts("127.0.0.1", 8765))


def _call(app: Any, path: str, chunks: list[bytes], declared: int | None) -> list[dict[str, Any]]:
    """``POST path`` straight through the ASGI app: the body's ``chunks`` arrive (more to come), then the client
    disconnects; returns what the app sent."""
    headers = [
        (b"host", b"127.0.0.1:8765"),
        (b"x-walklens-token", TOKEN.encode()),
        (b"content-type", b"application/json"),
    ]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8765),
    }
    messages: Iterator[dict[str, Any]] = iter(
        [{"type": "http.request", "body": c, "more_body": True} for c in chunks] + [{"type": "http.disconnect"}]
    )
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(("walklens", "uvicorn", "starlette"))]


def test_a_client_leaving_mid_body_is_one_line_not_an_internal_error(
    app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _call(app, "/api/walk", [b'{"model": "llama", "te'], declared=400)
    records = _records(caplog)
    assert records, "the disconnect is logged"
    assert not [r for r in records if "internal error" in r.getMessage() or r.exc_info], [
        r.getMessage() for r in records
    ]
    assert all("\n" not in r.getMessage() for r in records)
    assert any("disconnected" in r.getMessage() and "/api/walk" in r.getMessage() for r in records)


@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(
    path=st.sampled_from(POSTS),
    chunks=st.lists(st.binary(max_size=64), max_size=4),
    declared=st.one_of(st.none(), st.integers(0, 4096)),
)
def test_fuzz_disconnects_never_log_an_internal_error(
    app: Any, path: str, chunks: list[bytes], declared: int | None
) -> None:
    """Any endpoint, any partial body (any bytes, any declared length): at most one log line, never a traceback."""
    handler = _Lines()
    logger = logging.getLogger("walklens")
    logger.addHandler(handler)
    try:
        sent = _call(app, path, chunks, declared)
    finally:
        logger.removeHandler(handler)
    assert not [r for r in handler.records if "internal error" in r.getMessage() or r.exc_info]
    assert len(handler.records) <= 1
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    assert all(s < 500 for s in statuses), statuses


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_explorer_serves_after_a_disconnect(app: Any) -> None:
    from starlette.testclient import TestClient

    _call(app, "/api/decode", [b"{"], declared=100)
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        r = c.get("/api/status", headers={"X-Walklens-Token": TOKEN})
        assert r.status_code == 200
