"""The explorer's guard: every request passes here before any route runs (a plain ASGI middleware).

- **Token.** ``secrets.token_urlsafe`` at start; a request must carry it in the ``X-Walklens-Token`` header
  (the page's API calls do) or the ``token`` query parameter (the printed URL), compared in constant time.
  Otherwise 403.  The page's assets (``GET /static/...``) may carry it instead in the cookie the page sets
  (:func:`asset_cookie`: HttpOnly, SameSite=Strict, path ``/static/``), so no asset URL holds the token.
- **Host.** The ``Host`` header must name the bound address and port (``127.0.0.1:PORT``, and
  ``localhost:PORT`` when bound to a loopback address): a page on another domain that re-binds its DNS name to
  127.0.0.1 (DNS rebinding) sends its own name and is refused (403).  An ``Origin`` header, when present, must
  be the same origin.
- **Body size.** A request body over :data:`~.bounds.MAX_BODY` bytes is refused (413) before it is read.
- **Headers.** Every response forbids caching, framing, MIME sniffing, referrers and any script, style,
  image or connection that is not the server itself (``Content-Security-Policy``): even a string that
  reached markup could run no inline script and load nothing from the network.

:func:`check_bind_host` refuses a non-loopback bind address unless the caller allows it explicitly.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from ..base.errors import InputError
from .bounds import MAX_BODY

TOKEN_HEADER = "x-walklens-token"
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]  # as Starlette types them (an ASGI scope and message)
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


def new_token() -> str:
    """A random access token (URL-safe, 32 bytes of entropy)."""
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind_host(host: str, allow_remote: bool) -> None:
    """Refuse (one :class:`InputError` line) to bind anything but a loopback address unless ``allow_remote``."""
    if not is_loopback(host) and not allow_remote:
        raise InputError(
            f"--host {host} is not a loopback address: the explorer would be reachable from other "
            f"machines (anyone with the URL runs models on this one); pass --allow-remote to do it "
            f"anyway"
        )


def allowed_hosts(host: str, port: int) -> set[str]:
    """The ``Host`` header values accepted for a server bound to ``host:port``."""
    name = f"[{host}]" if ":" in host and not host.startswith("[") else host
    out = {f"{name}:{port}"}
    if is_loopback(host):
        out |= {f"localhost:{port}", f"127.0.0.1:{port}"}
    return out


class Guard:
    """ASGI middleware: the token, the Host and Origin headers and the body size (module docstring), then the
    security headers on every response.  ``hosts`` is a set that may be filled once the port is known."""

    def __init__(self, app: ASGIApp, token: str, hosts: set[str]) -> None:
        self.app = app
        self.token = token
        self.hosts = hosts

    async def _refuse(self, send: Callable[[Message], Awaitable[None]], status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *SECURITY_HEADERS,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _problem(self, scope: Scope) -> tuple[int, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if host not in self.hosts:
            return 403, "unexpected Host header (the explorer answers only to the address it printed)"
        origin = headers.get("origin")
        if origin is not None and origin.split("://", 1)[-1] not in self.hosts:
            return 403, "cross-origin request refused"
        if not self._authorised(scope, headers):
            return 403, "missing or wrong access token (open the URL walklens serve printed)"
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            return 413, f"request body over {MAX_BODY // 1024} KiB"
        return None

    def _authorised(self, scope: Scope, headers: dict[str, str]) -> bool:
        """The token in the header, the query, or (a ``GET /static/...`` only) the asset cookie."""
        given = headers.get(TOKEN_HEADER)
        if given is None:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            given = (query.get("token") or [None])[0]
        if given is not None:
            return self._matches(given)
        if scope.get("method") == "GET" and str(scope.get("path", "")).startswith(ASSET_PATH):
            return any(self._matches(v) for k, v in _cookies(headers.get("cookie", "")) if k.startswith(COOKIE))
        return False

    def _matches(self, given: str) -> bool:
        return bool(given) and secrets.compare_digest(given.encode("utf-8", "replace"), self.token.encode())

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # no websockets: close before accepting
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        problem = self._problem(scope)
        if problem is not None:
            await self._refuse(send, *problem)
            return
        seen = 0

        async def limited() -> Message:  # a chunked body without Content-Length is counted as it comes
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > MAX_BODY:
                    raise BodyTooLarge
            return message

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        try:
            await self.app(scope, limited, secured)
        except BodyTooLarge:
            await self._refuse(send, 413, f"request body over {MAX_BODY // 1024} KiB")


COOKIE = "walklens_token"  # the asset cookie's name, followed by the port: explorers on other ports keep theirs
ASSET_PATH = "/static/"


def asset_cookie(token: str, port: int | None) -> str:
    """The ``Set-Cookie`` value that lets the page load its assets without the token in their URLs: HttpOnly
    (no script reads it), SameSite=Strict (no other site's request carries it), path ``/static/`` (the API never
    accepts it), for this browser session only."""
    return f"{COOKIE}_{port or 0}={token}; Path={ASSET_PATH}; HttpOnly; SameSite=Strict"


def _cookies(header: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of a ``Cookie`` header."""
    out = []
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            out.append((name.strip(), value.strip()))
    return out


class BodyTooLarge(Exception):
    """A streamed request body passed :data:`~.bounds.MAX_BODY`."""
