"""The route set of a language-model server: ``/generate`` (JSON, or server-sent events as
the tokens come) and ``/attention`` (the causal self-attention over a text); the service
core (:mod:`.core`) adds ``/health`` and the rest."""
from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request
from starlette.responses import Response

from .errors import ERRORS, ServeError, refuse_elsewhere
from .schemas import GenerateRequest, GenerateResponse, LMAttentionRequest, LMAttentionResponse

EVENT_STREAM = "text/event-stream"
if TYPE_CHECKING:  # pragma: no cover
    from .generation import LMService

STREAM_DOC = ('one event per token, `data: {"text": "...", "token": id}` (the text it adds, possibly "" while a '
              'character is incomplete), then `event: done` with the JSON answer (or `event: error`)')


def add_generation_routes(app: FastAPI, service: "LMService") -> None:
    @app.post("/generate", responses={200: {"model": GenerateResponse,
                                            "content": {EVENT_STREAM: {"schema": {"type": "string"},
                                                                       "example": STREAM_DOC}}},
                                      **ERRORS})
    async def generate(req: GenerateRequest, request: Request) -> Response:
        """Continue a prompt. Settings a request does not give come from the run's decoding
        section; the same seed gives the same text, whatever else is batched with it. With
        "Accept: text/event-stream" (or "stream": true) the tokens come as server-sent events."""
        key, row = service.request(req)
        streaming = req.stream if req.stream is not None else EVENT_STREAM in request.headers.get("accept", "")
        if streaming:  # queued now: a full queue is a 503, not an error event in a 200 stream
            return StreamingResponse(service.events(key, row), media_type=EVENT_STREAM,
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return JSONResponse(await service.complete(key, row))

    @app.post("/attention", responses={200: {"model": LMAttentionResponse}, **ERRORS})
    async def attention(req: LMAttentionRequest) -> Response:
        """The tokens of a text (a prompt and its continuation) and every causal self-attention
        weight (per layer and head, or those of "layers" and "heads"), rounded; a text longer
        than the context: its end. An answer over the server's --max-attention weights is a 413."""
        if len(req.text) > service.cfg.max_chars:
            raise ServeError(413, f"the text is {len(req.text)} characters long; the limit is {service.cfg.max_chars}")
        bounds = service.attention_bounds(service.generator.model.cfg, req.layers, req.heads)
        # JSON made in the batcher's thread, not validated through the response model: the maps are large
        body = await service.batcher.run_exclusive(service.attention, req.text, bounds)
        return Response(body, media_type="application/json")
    refuse_elsewhere(app, ["/translate"], "this server has a language model: it serves POST /generate "
                                          '(and POST /attention with {"text": ...}), not /translate')
