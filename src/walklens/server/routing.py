"""How an API route reads its request and answers: a JSON object in, a JSON object out (through
:func:`walklens.outputs.jsonable`: NaN as null, map values rounded to :data:`~.bounds.DIGITS` decimals), every
refusal ``{"error": "..."}`` with a 4xx status, a job whose client left 499, and anything unexpected one line
with status 500 (never a traceback)."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..outputs import jsonable
from .bounds import DIGITS, ApiError
from .state import Cancelled, Explorer

log = logging.getLogger("walklens.server")
Handler = Callable[[Request, Explorer, dict[str, Any]], Awaitable[Any]]


def reply(data: Any, status: int = 200, digits: int | None = DIGITS) -> Response:
    """A compact JSON response of ``data``, floats rounded to ``digits`` decimals (None: exact)."""
    body = json.dumps(jsonable(data, digits), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return Response(body, status_code=status, media_type="application/json")


def error(message: str, status: int) -> Response:
    return JSONResponse({"error": message}, status_code=status)


async def read_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (GET: its query parameters, token excluded)."""
    if request.method == "GET":
        return {k: v for k, v in request.query_params.items() if k != "token"}
    raw = await request.body()
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ApiError("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


def api(handler: Handler | None = None, *, exact: bool = False) -> Any:
    """A Starlette endpoint around ``handler(request, explorer, body)``, which returns the reply's data.
    ``@api(exact=True)``: floats are sent exactly (small replies whose probabilities may be tiny); otherwise
    rounded to :data:`~.bounds.DIGITS` decimals (maps)."""
    if handler is None:
        return lambda h: api(h, exact=exact)

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        try:
            body = await read_body(request)
            return reply(await handler(request, request.app.state.explorer, body), digits=None if exact else DIGITS)
        except ApiError as e:
            return error(e.message, e.status)
        except Cancelled:
            return Response(status_code=499)
        except Exception as e:  # one line, never a traceback in the page
            log.exception("internal error")
            return error(f"internal error: {e.__class__.__name__}: {' '.join(str(e).split())[:300]}", 500)

    return endpoint
