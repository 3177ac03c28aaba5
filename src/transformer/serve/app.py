"""The HTTP service: a JSON API over one loaded :class:`Translator`, and the explorer page.

    POST /translate   {"text": "..."} or {"texts": [...]}, optional "beam", "n_best"
    POST /attention   {"text": "..."}: tokens, translation and every attention weight
    GET  /health      liveness and the model's shape
    GET  /stats       batching counters (requests, decode calls, largest batch)
    GET  /            the attention explorer (static/: plain HTML, JS and CSS, no external URLs)
    GET  /openapi.json, /docs

Every error is JSON ``{"error": "..."}``: 400 for a body that is not UTF-8, 413 for a body,
text or list over the limits, 415 for a body not sent as JSON, 422 for anything else
malformed. The model is called from one
thread only (see :mod:`.batching`).
"""
from __future__ import annotations

import json
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.requests import Request

from ..translator import Translation, Translator
from .attention import attention_maps
from .batching import DynamicBatcher
from .config import ServeConfig
from .schemas import AttentionRequest, AttentionResponse, Candidate, ErrorResponse, TranslateRequest, TranslateResponse

STATIC = Path(str(files(__package__) / "static"))
ERRORS = {code: {"model": ErrorResponse} for code in (400, 413, 415, 422)}


class ServeError(Exception):
    """A request the service refuses: becomes ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Service:
    """The loaded model and what the routes need of it: one Translator per beam size
    (sharing the model), and the batcher that feeds them. ``translator``, ``_decode`` and
    ``attention`` use the model, so they run in the batcher's thread only."""

    def __init__(self, translator: Translator, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.base = translator
        if translator.decoding.beam > cfg.max_beam:
            raise ValueError(f"the translator's beam ({translator.decoding.beam}) is larger than max_beam "
                             f"({cfg.max_beam})")
        self._by_beam: dict[int, Translator] = {translator.decoding.beam: translator}
        self.batcher = DynamicBatcher(self._decode, cfg.max_batch, cfg.max_wait_ms / 1000, cfg.batching)

    def translator(self, beam: int) -> Translator:
        if beam not in self._by_beam:
            self._by_beam[beam] = self.base.with_decoding(beam=beam, n_best=1)
        return self._by_beam[beam]

    def _decode(self, key: tuple[int, int], texts: list[str]) -> list[list[Translation]]:
        beam, n_best = key  # n_best changes when beam search may stop, so it is part of the key
        return self.translator(beam).translate_nbest(texts, n_best)

    def attention(self, beam: int, text: str) -> dict:
        return attention_maps(self.translator(beam), text, self.cfg.attention_decimals)

    def too_long(self, text: str) -> bool:
        """Whether the Translator will cut ``text`` to the model's length limit."""
        return len(self.base.subwords.encode(text)) > self.base.model.cfg.max_len - 1

    def check(self, texts: list[str], beam: int | None, n_best: int = 1) -> int:
        """Refuse what is over the limits; return the beam to use."""
        cfg = self.cfg
        if len(texts) > cfg.max_texts:
            raise ServeError(413, f"{len(texts)} texts in one request; the limit is {cfg.max_texts}")
        for i, t in enumerate(texts):
            if len(t) > cfg.max_chars:
                where = f"text {i}" if len(texts) > 1 else "the text"
                raise ServeError(413, f"{where} is {len(t)} characters long; the limit is {cfg.max_chars}")
        beam = self.base.decoding.beam if beam is None else beam
        if beam > cfg.max_beam:
            raise ServeError(422, f"beam must be at most {cfg.max_beam}, got {beam}")
        if n_best > beam:
            raise ServeError(422, f"n_best must be at most the beam size ({beam}), got {n_best}")
        return beam


def create_app(translator: Translator, cfg: ServeConfig | None = None, model_name: str = "") -> FastAPI:
    """The ASGI app serving ``translator`` (already loaded) with the settings ``cfg``."""
    service = Service(translator, cfg or ServeConfig())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.batcher.start()
        yield
        await service.batcher.stop()

    app = FastAPI(title="transformer", summary="Translate with a from-scratch Transformer and look at its attention.",
                  lifespan=lifespan, redoc_url=None)
    app.state.service = service
    _add_error_handlers(app)
    app.add_middleware(BodyGuard, max_bytes=service.cfg.max_body_bytes)

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True, responses=ERRORS)
    async def translate(req: TranslateRequest) -> TranslateResponse:
        """Translate one text or several, in input order; n-best with scores."""
        texts = req.lines()
        beam = service.check(texts, req.beam, req.n_best)
        results = await service.batcher.submit((beam, req.n_best), texts)
        return TranslateResponse(
            translation=results[0][0].text if req.text is not None else None,
            translations=[r[0].text for r in results],
            n_best=[[Candidate(text=t.text, score=round(t.score, 4)) for t in r] for r in results],
            beam=beam,
            truncated=[i for i, t in enumerate(texts) if service.too_long(t)],
        )

    @app.post("/attention", responses={200: {"model": AttentionResponse}, **ERRORS})
    async def attention(req: AttentionRequest) -> JSONResponse:
        """The translation of one text with its tokens and every attention weight (encoder
        self, decoder self, cross; per layer and head), rounded."""
        beam = service.check([req.text], req.beam)
        maps = await service.batcher.run_exclusive(service.attention, beam, req.text)
        # Plain JSON, not validated through the response model: the maps are large.
        return JSONResponse({**maps, "truncated": service.too_long(req.text)})

    @app.get("/health")
    async def health() -> dict:
        """Liveness, and the model's shape."""
        mcfg = service.base.model.cfg
        return {"status": "ok", "model": model_name, "n_layers": mcfg.n_layers, "n_heads": mcfg.n_heads,
                "d_model": mcfg.d_model, "max_len": mcfg.max_len, "beam": service.base.decoding.beam,
                "max_beam": service.cfg.max_beam, "precision": service.base.decoding.precision}

    @app.get("/stats")
    async def stats() -> dict:
        """Batching counters since start-up: decode_calls < requests means requests shared decodes."""
        c = service.cfg
        return {**service.batcher.stats.as_dict(), "batching": c.batching, "max_batch": c.max_batch,
                "max_wait_ms": c.max_wait_ms}

    @app.get("/", include_in_schema=False)
    async def explorer() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, e: ServeError) -> JSONResponse:
        return JSONResponse({"error": e.message}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        kind = request.headers.get("content-type", "")
        if kind and not _is_json(kind):  # FastAPI read the body as bytes, not JSON
            return JSONResponse({"error": f'send the body as JSON with "Content-Type: application/json" '
                                          f'(got "{kind}")'}, status_code=415)
        return JSONResponse({"error": validation_message(e.errors())}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(e.detail)}, status_code=e.status_code, headers=e.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> JSONResponse:  # never expected; still JSON
        return JSONResponse({"error": f"internal error: {type(e).__name__}"}, status_code=500)


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def validation_message(errors: list[dict]) -> str:
    """Pydantic's error list as one readable line, e.g. ``texts[1]: Input should be a valid string``."""
    parts = []
    for err in errors:
        if err.get("type") == "json_invalid":
            return f"malformed JSON: {err.get('ctx', {}).get('error', 'cannot parse the body')}"
        loc = [p for p in err.get("loc", ()) if p != "body"]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if not where and err.get("type") in ("missing", "model_attributes_type", "dict_type"):
            msg = 'the body must be a JSON object, e.g. {"text": "..."}'
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or "invalid request"


class BodyGuard:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 and one that is not UTF-8
    gets 400 (JSON must be UTF-8), both as ``{"error": ...}``, before the app sees them.

    An oversized body is still read (and dropped, up to ``DRAIN_LIMIT`` bytes) before the
    answer: a client still sending when the server closes often sees a reset, not the 413.
    """

    DRAIN_LIMIT = 64 << 20

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body, size, more = bytearray(), 0, True
        while more and size <= self.DRAIN_LIMIT:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.max_bytes:
                body += chunk
            more = message.get("more_body", False)
        if size > self.max_bytes:
            return await self._refuse(send, 413, f"request body {'over ' if more else 'of '}{size} bytes; "
                                                 f"the limit is {self.max_bytes}")
        try:
            bytes(body).decode("utf-8")
        except UnicodeDecodeError as e:
            return await self._refuse(send, 400, f"request body is not valid UTF-8 (byte 0x{body[e.start]:02x} "
                                                 f"at offset {e.start}); send JSON encoded as UTF-8")
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: wait for a disconnect
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send, status: int, message: str) -> None:
        payload = json.dumps({"error": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})
