"""How an API route reads its request and answers: a JSON object in, a JSON object out (through
:func:`walklens.base.outputs.jsonable`: NaN as null, map values rounded to :data:`~.bounds.DIGITS` decimals), every
refusal ``{"error": "..."}`` with a 4xx status, a job whose client left 499 (a client that leaves before its body
has arrived too, logged as one line naming the route), and anything unexpected one line with status 500 (never a
traceback)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, overload

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ..base.outputs import jsonable
from .bounds import DIGITS, MAX_BODY, MAX_DEPTH, ApiError
from .security import BodyTooLarge
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
    """The request's JSON object (GET: its query parameters, token excluded), checked by :func:`check_json`.
    A streamed body over :data:`~.bounds.MAX_BODY` is a 413; unparsable JSON (an integer of more than 4,300
    digits included) a 400."""
    if request.method == "GET":
        body: Any = {k: v for k, v in request.query_params.items() if k != "token"}
    else:
        try:
            raw = await request.body()
        except BodyTooLarge:
            raise ApiError(f"request body over {MAX_BODY // 1024} KiB", 413) from None
        try:
            body = json.loads(raw or b"{}")
        except RecursionError:
            raise ApiError(f"the request body is nested more than {MAX_DEPTH} levels deep") from None
        except (ValueError, UnicodeDecodeError):
            raise ApiError("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    check_json(body)
    return body


def check_json(value: Any) -> None:
    """Refuse (400) a request value nested more than :data:`~.bounds.MAX_DEPTH` levels deep or holding a
    string that is not Unicode text (a lone surrogate such as ``"\ud800"``, which JSON can escape but no
    tokenizer or UTF-8 encoder accepts).  Iterative: a deep value never recurses here."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise ApiError(f"the request body is nested more than {MAX_DEPTH} levels deep")
            items = list(v.items()) if isinstance(v, dict) else [(None, x) for x in v]
            for k, x in items:
                if k is not None:
                    stack.append((k, depth))
                stack.append((x, depth + 1))
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ApiError(
                    f"a string of the request holds a lone surrogate ({v[e.start]!r} at character "
                    f"{e.start}); send Unicode text"
                ) from None


Endpoint = Callable[[Request], Awaitable[Response]]


@overload
def api(handler: Handler, *, exact: bool = False) -> Endpoint: ...
@overload
def api(handler: None = None, *, exact: bool = False) -> Callable[[Handler], Endpoint]: ...
def api(handler: Handler | None = None, *, exact: bool = False) -> Endpoint | Callable[[Handler], Endpoint]:
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
        except ClientDisconnect:  # the connection closed mid-body: nobody to answer, nothing went wrong here
            log.warning(
                "%s %s: the client disconnected before sending its whole request", request.method, request.url.path
            )
            return Response(status_code=499)
        except Exception as e:  # one line, never a traceback in the page
            log.exception("internal error")
            return error(f"internal error: {e.__class__.__name__}: {' '.join(str(e).split())[:300]}", 500)

    return endpoint
