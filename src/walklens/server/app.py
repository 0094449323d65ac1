"""The explorer's ASGI application and its server: routes, the page and its assets, and :func:`serve`.

The page (``static/index.html``) and its scripts are files of this package, served as they are (no build
step) with the plotting script of the reports (``reports/assets/plots.js``) and their result renderers
(``reports/assets/results.js``: a document drawn the same way in a report and in the page); nothing is fetched
from the network.  Every request passes the :class:`~.security.Guard` first (token, Host header, body size).
:func:`serve` binds the socket itself (port 0: a free port), so the one URL it prints is exact before the
first request, then runs uvicorn on that socket until interrupted.
"""

from __future__ import annotations

import socket
import sys
from importlib import resources
from typing import Any, TextIO

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..base.precision import dtype_name
from ..core.capture import capture
from . import api_cards, api_heads, api_patching, api_power, api_sweeps, api_walks
from .bounds import (
    MAX_ALPHA,
    MAX_CELLS,
    MAX_K,
    MAX_NEW_TOKENS,
    MAX_STEER_TOKENS,
    MAX_TEXT_CHARS,
    MAX_TOKENS,
    view_tokens,
)
from .routing import api, error
from .security import Guard, allowed_hosts, asset_cookie, new_token
from .state import Explorer

#: the files the page loads: name -> (package, path inside it, media type)
ASSETS = {
    "app.css": ("walklens.server", "static/app.css", "text/css"),
    "app.js": ("walklens.server", "static/app.js", "text/javascript"),
    "walks.js": ("walklens.server", "static/walks.js", "text/javascript"),
    "views.js": ("walklens.server", "static/views.js", "text/javascript"),
    "plots.js": ("walklens.reports", "assets/plots.js", "text/javascript"),
    "results.js": ("walklens.reports", "assets/results.js", "text/javascript"),
}
PROBE = "The"  # a one-token text: captured once per model at start to list its point names


def _read(package: str, path: str) -> str:
    return resources.files(package).joinpath(path).read_text(encoding="utf-8")


def describe(explorer: Explorer) -> None:
    """Fill ``explorer.points`` (every point name each model records) with one tiny capture per model."""
    for name, lm in explorer.models.items():
        explorer.points[name] = capture(lm, PROBE).points


async def index(request: Request) -> Response:
    """The page.  Its assets' URLs carry no token (a URL shows in consoles, stack traces and logs): the first
    authenticated load sets the token as an HttpOnly, SameSite=Strict cookie limited to ``/static/``, which the
    :class:`~.security.Guard` accepts for the assets only; the API still takes the token in its header."""
    response = Response(_read("walklens.server", "static/index.html"), media_type="text/html; charset=utf-8")
    response.headers.append("set-cookie", asset_cookie(request.app.state.token, request.url.port))
    return response


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ASSETS:
        return error("no such file", 404)
    package, path, media = ASSETS[name]
    return Response(_read(package, path), media_type=f"{media}; charset=utf-8")


@api
async def info(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """-> the loaded models (name, family, layers, width, heads, dtype, kind, point names, the most tokens each
    view reads under the explorer's limits), whether a database was given, how many steering cards, and the
    limits of every argument; how many patching documents."""
    models = []
    for name, lm in ex.models.items():
        models.append(
            {
                "name": name,
                "family": lm.adapter.family,
                "n_layers": lm.n_layers,
                "d_model": lm.d_model,
                "n_heads": lm.adapter.head_weights(lm.model, 0).n_heads,
                "dtype": dtype_name(lm.dtype),
                "kind": lm.kind,
                "points": ex.points.get(name, []),
                "view_tokens": view_tokens(ex.shape(name), ex.limits),
            }
        )
    return {
        "models": models,
        "db": ex.db is not None,
        "cards": len(ex.cards),
        "patches": len(ex.patches),
        "limits": {
            "text_chars": MAX_TEXT_CHARS,
            "tokens": MAX_TOKENS,
            "k": MAX_K,
            "new_tokens": MAX_NEW_TOKENS,
            "steer_tokens": MAX_STEER_TOKENS,
            "alpha": MAX_ALPHA,
            "cells": MAX_CELLS,
            "memory_gb": ex.limits.max_memory,
            "work_tflop": ex.limits.max_work,
        },
    }


@api
async def status(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """-> how many jobs were computed, cancelled (their client left), refused or failed."""
    return dict(ex.counts)


def create_app(explorer: Explorer, token: str, hosts: set[str]) -> Guard:
    """The ASGI app: the routes behind the :class:`~.security.Guard` of ``token`` and ``hosts`` (a set the
    caller may fill once the port is known)."""
    if not explorer.points:
        describe(explorer)
    routes = [
        Route("/", index),
        Route("/static/{name}", asset),
        Route("/api/info", info),
        Route("/api/status", status),
        Route("/api/sweeps", api_sweeps.sweeps),
        Route("/api/cards", api_cards.cards),
        Route("/api/patches", api_patching.patches),
    ]
    posts = {
        "/api/walk": api_walks.walk,
        "/api/walk/cell": api_walks.walk_cell,
        "/api/decode": api_walks.decode,
        "/api/simmap": api_walks.simmap,
        "/api/attention": api_heads.attention,
        "/api/kernels": api_heads.kernels,
        "/api/power": api_power.power,
        "/api/steer": api_power.steer,
        "/api/sweeps/run": api_sweeps.sweep_run,
        "/api/card": api_cards.card,
        "/api/patch": api_patching.patch,
    }
    routes += [Route(path, fn, methods=["POST"]) for path, fn in posts.items()]
    app = Starlette(routes=routes)
    app.state.explorer = explorer
    app.state.token = token
    return Guard(app, token, hosts)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url(host: str, port: int, token: str) -> str:
    name = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{name}:{port}/?token={token}"


def _server(explorer: Explorer, host: str, sock: socket.socket, token: str) -> Any:
    import uvicorn

    app = create_app(explorer, token, allowed_hosts(host, sock.getsockname()[1]))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", ws="none")
    return uvicorn.Server(config)


def serve(
    explorer: Explorer, host: str, sock: socket.socket, out: TextIO = sys.stdout, token: str | None = None
) -> None:
    """Serve ``explorer`` on the bound ``sock`` until interrupted; prints the one URL (with its token) first."""
    token = token or new_token()
    server = _server(explorer, host, sock, token)
    out.write(url(host, sock.getsockname()[1], token) + "\n")
    out.flush()
    server.run(sockets=[sock])


class Running:
    """An explorer served from a background thread of this process (tests, benchmarks, a notebook):
    ``url`` (with the token), ``token``, ``port``; :meth:`stop` ends it."""

    def __init__(self, explorer: Explorer, host: str = "127.0.0.1", port: int = 0) -> None:
        import threading
        import time

        self.sock = bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.token = new_token()
        self.url = url(host, self.port, self.token)
        self.server = _server(explorer, host, self.sock, self.token)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True, name="walklens-serve"
        )
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the explorer did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["ASSETS", "Running", "bind", "create_app", "describe", "serve", "url"]
