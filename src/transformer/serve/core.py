"""The service core both kinds of model share: the settings, the batcher that feeds the
model from one thread, and the app around a service's routes (the guard, the error
handlers, ``/health``, ``/stats``, the explorer page, and a 404 naming this server's endpoint
for the other kind's). A kind brings its own service (:mod:`.translation`,
:mod:`.generation`) and its route set.
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path

import inspect

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from .attention_maps import Bounds, TooMuchAttention, attention_maps_tensors, maps_json
from .batching import Decode, DynamicBatcher
from .serve_config import ServeConfig
from .errors import ServeError, add_error_handlers
from .guard import STATIC_URL, Guard

STATIC = Path(str(files(__package__) / "static"))


class ServiceCore:
    """A loaded model and what the routes need of it; ``decode`` (key, rows) -> one result a
    row is what the batcher runs, in its thread only."""

    kind: str  # "translation" or "language-model": /health tells clients
    summary: str  # the OpenAPI summary

    def __init__(self, cfg: ServeConfig, decode: Decode) -> None:
        self.cfg = cfg
        self.batcher = DynamicBatcher(decode, cfg.max_batch, cfg.max_wait_ms / 1000, cfg.batching, cfg.max_queue)

    def add_routes(self, app: FastAPI) -> None:
        """The kind's route set, and a 404 for the other kind's endpoints that names these."""
        raise NotImplementedError

    def health(self) -> dict:
        """The model's shape and settings, for /health (this docstring describes the route)."""
        raise NotImplementedError

    def attention_bounds(self, model_cfg, layers: list[int] | None, heads: list[int] | None) -> Bounds:
        """The layers and heads an /attention request chose (422 outside the model), and the
        server's bound on an answer's size."""
        for name, chosen, n in (("layers", layers, model_cfg.n_layers), ("heads", heads, model_cfg.n_heads)):
            if chosen is not None and max(chosen) >= n:
                raise ServeError(422, f"{name}: {max(chosen)} is out of range; the model has {n} {name} "
                                      f"(0 to {n - 1})")
        return Bounds(layers, heads, self.cfg.max_attention)

    def attention_json(self, front, text: str, bounds: Bounds, **extra) -> str:
        """The /attention answer for ``text`` as JSON text (``extra``: more fields), built in
        the batcher's thread: the event loop only sends it. 413 when it is over ``bounds``."""
        try:
            answer = attention_maps_tensors(front, text, bounds)
        except TooMuchAttention as e:
            raise ServeError(413, f"text: {e} (the server's --max-attention)") from None
        return maps_json({**answer, **extra}, self.cfg.attention_decimals)


def check_default(value: int, limit: int, what: str, limit_name: str) -> None:
    """A model loaded with a default over the server's own limit is the caller's mistake."""
    if value > limit:
        raise ValueError(f"the {what} ({value}) is larger than {limit_name} ({limit})")


def core_app(service: ServiceCore, model_name: str) -> FastAPI:
    """The ASGI app around ``service``: its routes, then what every server has."""
    cfg = service.cfg

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.batcher.start()
        yield
        await service.batcher.stop()

    # /docs loads Swagger's script and styles from a CDN: served only when asked for (cfg.docs)
    app = FastAPI(title="transformer", summary=service.summary, lifespan=lifespan,
                  docs_url="/docs" if cfg.docs else None, redoc_url=None)
    app.state.service = service
    add_error_handlers(app)
    app.add_middleware(Guard, max_bytes=cfg.max_body_bytes, timeout=cfg.timeout, token=cfg.token,
                       allowed_hosts=cfg.allowed_hosts)
    service.add_routes(app)

    @app.get("/health", description=inspect.getdoc(service.health))
    async def health() -> dict:
        return {"status": "ok", "kind": service.kind, "model": model_name, **service.health()}

    @app.get("/stats")
    async def stats() -> dict:
        """Batching counters since start-up: decode_calls < requests means requests shared decodes;
        refused: turned away with 503 (the queue was full); abandoned: dropped before decoding
        (the client left, or the deadline passed); waiting: in the queue now."""
        return {**service.batcher.stats.as_dict(), "waiting": service.batcher.waiting, "batching": cfg.batching,
                "max_batch": cfg.max_batch, "max_wait_ms": cfg.max_wait_ms, "max_queue": cfg.max_queue,
                "timeout": cfg.timeout}

    # The page and its files hold no data, so a server with a token serves them without it
    # (see guard.OPEN_PATHS); the page's script sends the token on every API call.
    @app.get("/", include_in_schema=False)
    async def explorer() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount(STATIC_URL, StaticFiles(directory=STATIC), name="static")
    return app
