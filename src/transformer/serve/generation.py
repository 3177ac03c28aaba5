"""The language model behind the service, and its route set (``/generate``, ``/attention``): a
request is checked and encoded in the event loop, continued in a batch by the batcher's thread
through the Generator (:meth:`~transformer.inference.generator.Generator.pieces`, as ``transformer
generate`` continues a prompt), and its tokens are handed to the event loop as they come when
the client streams.

Requests with the same sampling settings (:class:`Sampling`: max_new_tokens, temperature,
top_k, top_p) share a batch, streaming or not; each row samples with its own seed, so its
text is the one it gets alone (see :mod:`transformer.decode.sample`), and the one
``transformer generate --seed S`` prints. A row ends at the model's stop id (an imported
model's EOS, or any of import.json's ``stop_ids``), as ``transformer generate`` ends it: the
stop token is its last, and the batch runs on only while some row has not stopped.
"""
from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request
from starlette.responses import Response

from ..errors import UserError
from ..inference.generator import Generator
from .attention_maps import Bounds
from .core import ServiceCore, check_default
from .errors import ERRORS, ServeError, refuse_elsewhere
from .inspect import add_inspect_routes
from .schemas import GenerateRequest, GenerateResponse, LMAttentionRequest, LMAttentionResponse
from .serve_config import ServeConfig

FRESH_SEEDS = 2**31  # a seed the server picks is below this (short to read back and type in)


@dataclass(frozen=True)
class Sampling:
    """The settings a batch shares: the batcher's key."""

    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float


@dataclass
class Row:
    """One request: its prompt's ids (cut to the context), its seed, and for a streaming
    request ``sink``, called from the decoding thread with each token's event."""

    ids: list[int]
    seed: int
    truncated: bool = False  # the prompt was longer than the context: its end is continued
    sink: Callable[[dict], None] | None = None
    cancelled: bool = False  # the client went away; a batch stops when all its rows have


@dataclass(frozen=True)
class Continuation:
    text: str
    tokens: list[int]


class LMService(ServiceCore):
    """The loaded :class:`Generator` and what the routes (:func:`add_generation_routes`) need of it.
    ``_generate`` and ``attention`` use the model, so they run in the batcher's thread only."""

    kind = "language-model"
    summary = "Continue text with a from-scratch language model and look at its attention."

    def __init__(self, generator: Generator, cfg: ServeConfig) -> None:
        check_default(generator.decoding.max_new_tokens, cfg.new_tokens_limit, "generator's max_new_tokens",
                      "new_tokens_limit")
        super().__init__(cfg, self._generate)
        self.generator = generator

    def add_routes(self, app) -> None:
        add_generation_routes(app, self)
        add_inspect_routes(app, self, lambda: self.generator)

    # ---- in the event loop ------------------------------------------------------------
    def request(self, req: GenerateRequest) -> tuple[Sampling, Row]:
        """The batch key and the row of a request; refuses what is over the limits."""
        d, limit = self.generator.decoding, self.cfg.new_tokens_limit
        n = d.max_new_tokens if req.max_new_tokens is None else req.max_new_tokens
        if n > limit:
            raise ServeError(422, f"max_new_tokens must be at most {limit}, got {n}")
        key = Sampling(n, _either(req.temperature, d.temperature), _either(req.top_k, d.top_k),
                       _either(req.top_p, d.top_p))
        seed = _either(req.seed, d.seed)
        if seed is None:
            seed = secrets.randbelow(FRESH_SEEDS)
        ids, truncated = self.encode(req.prompt)
        return key, Row(ids, seed, truncated)

    def encode(self, prompt: str) -> tuple[list[int], bool]:
        """The prompt's ids (its end, when longer than the context) and whether it was cut."""
        if len(prompt) > self.cfg.max_chars:
            raise ServeError(413, f"the prompt is {len(prompt)} characters long; the limit is {self.cfg.max_chars}")
        before = self.generator.truncated
        try:
            ids = self.generator.encode(prompt)
        except UserError as e:  # a character the vocabulary lacks
            raise ServeError(422, f"prompt: {self.client_message(e)}") from None
        return ids, self.generator.truncated > before

    def client_message(self, e: UserError) -> str:
        """The error without the server's file paths."""
        path = getattr(self.generator.tokenizer, "path", None)
        return str(e).replace(f" of {path}", " of this model") if path else str(e)

    def answer(self, row: Row, result: Continuation) -> dict:
        """The JSON answer (also the final event of a stream)."""
        return {"text": result.text, "tokens": len(result.tokens), "prompt_tokens": len(row.ids),
                "truncated": row.truncated, "seed": row.seed}

    async def complete(self, key: Sampling, row: Row) -> dict:
        try:
            result = (await self.batcher.submit(key, [row]))[0]
        finally:
            row.cancelled = True  # done, or the handler was cancelled: nobody waits for more
        return self.answer(row, result)

    async def events(self, key: Sampling, row: Row) -> AsyncIterator[str]:
        """Server-sent events: ``data: {"text": ..., "token": id}`` per token as it comes, then
        ``event: done`` with the answer (or ``event: error``). The row is queued at once, so a
        full queue raises :class:`~.batching.QueueFull` here (a 503); and this returns when the
        first token has come, so the answer (its 200) starts then: a row still waiting at the
        server's deadline gets the guard's 504 and leaves the queue, never decoded, as a
        request for JSON does (five long streams queued behind each other all got a 200 at
        once, and the last its first token 16 s past a 3 s --timeout)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict | None] = asyncio.Queue()

        def sink(event: dict) -> None:  # in the decoding thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the event loop is closed: the server is stopping
                row.cancelled = True

        row.sink = sink
        job = self.batcher.enqueue(key, [row])
        # The tokens' events were queued before the job could finish, so None comes last.
        job.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            first = await queue.get()
        except BaseException:  # cancelled: past the deadline, or the client left
            row.cancelled = True
            job.cancel()
            raise
        return self._stream(row, first, queue, job)

    async def _stream(self, row: Row, event: dict | None, queue: asyncio.Queue,
                      job: asyncio.Future) -> AsyncIterator[str]:
        try:
            while event is not None:
                yield sse(event)
                event = await queue.get()
            try:
                result = job.result()[0]
            except Exception as e:  # a bug in generation: the stream says so and ends
                yield sse({"error": f"internal error: {type(e).__name__}"}, "error")
                return
            yield sse(self.answer(row, result), "done")
        finally:  # also when the client went away and the response was cancelled
            row.cancelled = True
            job.cancel()

    # ---- in the batcher's thread ------------------------------------------------------
    def _generate(self, key: Sampling, rows: list[Row]) -> list[Continuation]:
        """The rows continued through :meth:`Generator.pieces` (as ``transformer generate``
        does), each piece handed to its row's sink as it comes; a batch stops when all its rows
        are cancelled."""
        texts, ids = [""] * len(rows), [[] for _ in rows]
        if all(row.cancelled for row in rows):
            return [Continuation(text, t) for text, t in zip(texts, ids)]
        generator = self.generator.with_decoding(max_new_tokens=key.max_new_tokens, temperature=key.temperature,
                                                 top_k=key.top_k, top_p=key.top_p)
        for step in generator.pieces([r.ids for r in rows], [r.seed for r in rows]):
            for i, (row, piece) in enumerate(zip(rows, step)):
                if piece is None or piece == (None, ""):  # stopped, or nothing held back
                    continue
                token, text = piece
                texts[i] += text
                if token is not None:
                    ids[i].append(token)
                if row.sink is not None and not row.cancelled:
                    row.sink({"text": text, "token": token})
            if all(row.cancelled for row in rows):
                break
        return [Continuation(text, t) for text, t in zip(texts, ids)]

    def attention(self, text: str, bounds: Bounds) -> str:
        try:
            return self.attention_json(self.generator, text, bounds)
        except UserError as e:
            raise ServeError(422, f"text: {self.client_message(e)}") from None

    def health(self) -> dict:
        """Liveness, the kind of model, its shape and its default sampling settings."""
        mcfg, d = self.generator.model.cfg, self.generator.decoding
        return {"n_layers": mcfg.n_layers, "n_heads": mcfg.n_heads, "d_model": mcfg.d_model, "max_len": mcfg.max_len,
                "vocab_size": mcfg.vocab_size, "max_new_tokens": d.max_new_tokens,
                "new_tokens_limit": self.cfg.new_tokens_limit, "temperature": d.temperature, "top_k": d.top_k,
                "top_p": d.top_p, "precision": d.precision}


def sse(data: dict, event: str | None = None) -> str:
    """One server-sent event (JSON on one ``data:`` line: json.dumps writes no newline)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _either(value, default):
    return default if value is None else value


EVENT_STREAM = "text/event-stream"
STREAM_DOC = ('one event per token, `data: {"text": "...", "token": id}` (the text it adds, possibly "" while a '
              'character is incomplete), then `event: done` with the JSON answer (or `event: error`)')


def add_generation_routes(app: FastAPI, service: LMService) -> None:
    """The route set of a language-model server: ``/generate`` (JSON, or server-sent events as
    the tokens come) and ``/attention`` (the causal self-attention over a text); the service
    core (:mod:`.core`) adds ``/health`` and the rest."""
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
        if streaming:  # answered at its first token: a full queue is a 503, a deadline passed in the queue a 504
            return StreamingResponse(await service.events(key, row), media_type=EVENT_STREAM,
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
