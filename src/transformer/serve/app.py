"""The HTTP service: a JSON API over one loaded model, and the explorer page. The model is a
translation model (a :class:`Translator`) or a language model (a :class:`Generator`); the
run's config says which (``transformer serve`` reads it), and ``/health`` tells clients.

    Translation model (see :mod:`.translation`):
    POST /translate   {"text": "..."} or {"texts": [...]}, optional "beam", "n_best"
    POST /attention   {"text": "..."}: tokens, translation and every attention weight
    Language model (see :mod:`.generation`):
    POST /generate    {"prompt": "..."}, optional "max_new_tokens", "temperature", "top_k",
                      "top_p", "seed": the continuation as JSON, or with "Accept:
                      text/event-stream" (or "stream": true) as server-sent events, one per token
    POST /attention   {"text": "..."}: the tokens and every causal self-attention weight
    Both (see :mod:`.inspect`):
    POST /lens        {"text": "..."}: the logit lens (layers x positions: the top tokens, and the
                      probability of the final choice)
    POST /heads       {"text": "...", optional "corrupt", "token", "vs", "ablate", "layers"}: each
                      head's change of the score, ablated or patched in from "corrupt"
    GET  /health      liveness, the kind of model ("translation" or "language-model") and its shape
    GET  /stats       batching counters (requests, decode calls, largest batch)
    GET  /            the explorer (static/: plain HTML, JS and CSS, no external URLs)
    GET  /openapi.json   the API's description (and /docs, Swagger's page from a CDN, with ServeConfig.docs)

Every error is JSON ``{"error": "..."}``: 400 for a body that is not UTF-8, 401 without the
token (when the server has one; ``/health`` and the page's files never want it), 404 for the other kind of model's
endpoint (the message names this one's), 408 for a body that does not arrive in time, 413 for
a body, text or list over the limits, 415 for a body not sent as JSON, 422 for anything else
malformed, 503 with ``Retry-After`` when the queue is full, 504 past the deadline (see
:mod:`.guard`). The model is called from one thread only (see :mod:`.batching`).
"""
from __future__ import annotations

from fastapi import FastAPI

from ..inference.generator import Generator
from ..inference.translator import Translator
from .serve_config import ServeConfig
from .core import core_app
from .generation import LMService
from .translation import TranslationService


def create_app(model: Translator | Generator, cfg: ServeConfig | None = None, model_name: str = "") -> FastAPI:
    """The ASGI app serving ``model`` (already loaded: a Translator, or a language model's
    Generator) with the settings ``cfg``: the service core (:mod:`.core`) with the kind's
    route set (:mod:`.translation`, :mod:`.generation`)."""
    cfg = cfg or ServeConfig()
    service = LMService(model, cfg) if isinstance(model, Generator) else TranslationService(model, cfg)
    return core_app(service, model_name)
