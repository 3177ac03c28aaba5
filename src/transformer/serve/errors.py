"""How the service refuses: every error is JSON ``{"error": "..."}`` with a 4xx status, or 503
(busy) and 504 (too slow) (see :mod:`.app` for which), one line that says what to change."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import Request

from .batching import QueueFull
from .schemas import ErrorResponse

ERRORS = {code: {"model": ErrorResponse}  # for the OpenAPI description
          for code in (400, 401, 408, 413, 415, 422, 503, 504)}


class ServeError(Exception):
    """A request the service refuses: becomes ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, e: ServeError) -> JSONResponse:
        return JSONResponse({"error": e.message}, status_code=e.status)

    @app.exception_handler(QueueFull)
    async def _busy(request: Request, e: QueueFull) -> JSONResponse:
        return JSONResponse({"error": str(e)}, status_code=503, headers={"Retry-After": str(e.retry_after)})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        kind = request.headers.get("content-type", "")
        if kind and not _is_json(kind):  # FastAPI read the body as bytes, not JSON
            return JSONResponse({"error": f'send the body as JSON with "Content-Type: application/json" '
                                          f'(got "{kind}")'}, status_code=415)
        example = '{"prompt": "..."}' if request.url.path == "/generate" else '{"text": "..."}'
        return JSONResponse({"error": validation_message(e.errors(), example)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(e.detail)}, status_code=e.status_code, headers=e.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> JSONResponse:  # never expected; still JSON
        return JSONResponse({"error": f"internal error: {type(e).__name__}"}, status_code=500)


def refuse_elsewhere(app: FastAPI, paths: list[str], message: str) -> None:
    """POST to ``paths`` (the other kind of model's endpoints) answers 404 with ``message``,
    which says what this server serves instead."""
    async def refuse() -> JSONResponse:
        return JSONResponse({"error": message}, status_code=404)

    for path in paths:
        app.add_api_route(path, refuse, methods=["POST"], include_in_schema=False)


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


MAX_SHOWN = 5  # errors a 422 spells out; the rest are counted


def validation_message(errors: list[dict], example: str = '{"text": "..."}') -> str:
    """Pydantic's error list as one readable line, e.g. ``texts[1]: Input should be a valid string``:
    the first MAX_SHOWN errors and how many more there are, each place named in at most 40
    characters a part (the answer stays short whatever the body held)."""
    parts = []
    for err in errors[:MAX_SHOWN]:
        if err.get("type") == "json_invalid":
            return f"malformed JSON: {err.get('ctx', {}).get('error', 'cannot parse the body')}"
        loc = [p if isinstance(p, int) else _short(str(p)) for p in err.get("loc", ()) if p != "body"]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if not where and err.get("type") in ("missing", "model_attributes_type", "dict_type"):
            msg = f"the body must be a JSON object, e.g. {example}"
        parts.append(f"{where}: {msg}" if where else msg)
    if len(errors) > MAX_SHOWN:
        parts.append(f"and {len(errors) - MAX_SHOWN:,} more ({len(errors):,} errors)")
    return "; ".join(parts) or "invalid request"


def _short(name: str, most: int = 40) -> str:
    return name if len(name) <= most else name[:most - 3] + "..."
