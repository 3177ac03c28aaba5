"""The HTTP service: a JSON API over one loaded model, and the explorer page. The model is a
translation model (a :class:`Translator`) or a language model (a :class:`Generator`); the
run's config says which (``transformer serve`` reads it), and ``/health`` tells clients.

    Translation model:
    POST /translate   {"text": "..."} or {"texts": [...]}, optional "beam", "n_best"
    POST /attention   {"text": "..."}: tokens, translation and every attention weight
    Language model (see :mod:`.generation`, :mod:`.lm_routes`):
    POST /generate    {"prompt": "..."}, optional "max_new_tokens", "temperature", "top_k",
                      "top_p", "seed": the continuation as JSON, or with "Accept:
                      text/event-stream" (or "stream": true) as server-sent events, one per token
    POST /attention   {"text": "..."}: the tokens and every causal self-attention weight
    Both:
    GET  /health      liveness, the kind of model ("translation" or "language-model") and its shape
    GET  /stats       batching counters (requests, decode calls, largest batch)
    GET  /            the explorer (static/: plain HTML, JS and CSS, no external URLs)
    GET  /openapi.json, /docs

Every error is JSON ``{"error": "..."}``: 400 for a body that is not UTF-8, 401 without the
token (when the server has one; ``/health`` never wants it), 404 for the other kind of model's
endpoint (the message names this one's), 408 for a body that does not arrive in time, 413 for
a body, text or list over the limits, 415 for a body not sent as JSON, 422 for anything else
malformed, 503 with ``Retry-After`` when the queue is full, 504 past the deadline (see
:mod:`.guard`). The model is called from one thread only (see :mod:`.batching`).
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from ..generator import Generator
from ..translator import Translation, Translator
from .attention import attention_maps
from .batching import DynamicBatcher
from .config import ServeConfig
from .errors import ERRORS, ServeError, add_error_handlers, refuse_elsewhere
from .generation import LMService
from .guard import Guard
from .lm_routes import add_generation_routes
from .schemas import AttentionRequest, AttentionResponse, Candidate, TranslateRequest, TranslateResponse

STATIC = Path(str(files(__package__) / "static"))


class Service:
    """The loaded translation model and what the routes need of it: one Translator per beam size
    (sharing the model), and the batcher that feeds them. ``translator``, ``_decode`` and
    ``attention`` use the model, so they run in the batcher's thread only.

    Only the server's own beam may build a compiled step (``transformer serve`` builds it at
    start-up, see ``prepare_compiled``); a request for another beam decodes with a step built
    already or eagerly, never waiting minutes for a build (``compile: on`` -> ``auto``)."""

    kind = "translation"

    def __init__(self, translator: Translator, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.base = translator
        if translator.decoding.beam > cfg.max_beam:
            raise ValueError(f"the translator's beam ({translator.decoding.beam}) is larger than max_beam "
                             f"({cfg.max_beam})")
        self._by_beam: dict[int, Translator] = {translator.decoding.beam: translator}
        self.batcher = DynamicBatcher(self._decode, cfg.max_batch, cfg.max_wait_ms / 1000, cfg.batching,
                                      cfg.max_queue)

    def translator(self, beam: int) -> Translator:
        if beam not in self._by_beam:
            compile = "auto" if self.base.decoding.compile == "on" else self.base.decoding.compile
            self._by_beam[beam] = self.base.with_decoding(beam=beam, n_best=1, compile=compile)
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


def create_app(model: Translator | Generator, cfg: ServeConfig | None = None, model_name: str = "") -> FastAPI:
    """The ASGI app serving ``model`` (already loaded: a Translator, or a language model's
    Generator) with the settings ``cfg``."""
    cfg = cfg or ServeConfig()
    service = LMService(model, cfg) if isinstance(model, Generator) else Service(model, cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.batcher.start()
        yield
        await service.batcher.stop()

    summary = ("Continue text with a from-scratch language model and look at its attention."
               if service.kind == "language-model" else
               "Translate with a from-scratch Transformer and look at its attention.")
    app = FastAPI(title="transformer", summary=summary, lifespan=lifespan, redoc_url=None)
    app.state.service = service
    add_error_handlers(app)
    app.add_middleware(Guard, max_bytes=cfg.max_body_bytes, timeout=cfg.timeout, token=cfg.token)
    if service.kind == "language-model":
        add_generation_routes(app, service, model_name)
        refuse_elsewhere(app, ["/translate"], "this server has a language model: it serves POST /generate "
                                              '(and POST /attention with {"text": ...}), not /translate')
    else:
        _add_translation_routes(app, service, model_name)
        refuse_elsewhere(app, ["/generate"], "this server has a translation model: it serves POST /translate "
                                             "(and POST /attention), not /generate")

    @app.get("/stats")
    async def stats() -> dict:
        """Batching counters since start-up: decode_calls < requests means requests shared decodes;
        refused: turned away with 503 (the queue was full); abandoned: dropped before decoding
        (the client left, or the deadline passed); waiting: in the queue now."""
        c = service.cfg
        return {**service.batcher.stats.as_dict(), "waiting": service.batcher.waiting, "batching": c.batching,
                "max_batch": c.max_batch, "max_wait_ms": c.max_wait_ms, "max_queue": c.max_queue,
                "timeout": c.timeout}

    @app.get("/", include_in_schema=False)
    async def explorer() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _add_translation_routes(app: FastAPI, service: Service, model_name: str) -> None:
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
        """Liveness, the kind of model, and its shape."""
        mcfg = service.base.model.cfg
        return {"status": "ok", "kind": service.kind, "model": model_name, "n_layers": mcfg.n_layers,
                "n_heads": mcfg.n_heads, "d_model": mcfg.d_model, "max_len": mcfg.max_len,
                "beam": service.base.decoding.beam, "max_beam": service.cfg.max_beam,
                "precision": service.base.decoding.precision}
