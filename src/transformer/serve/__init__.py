"""The service: a JSON API with dynamic batching over a translation model or a language
model, and the attention explorer page.

    app = create_app(load_translator("runs/demo"), ServeConfig(max_batch=32))
    app = create_app(Generator.from_pretrained("runs/shakespeare"))   # POST /generate
    uvicorn.run(app)                    # or: transformer serve --model runs/demo

``app`` picks the service for the model; ``core`` is what both kinds share (the batcher, the
app with ``/health``, ``/stats`` and the page) around a kind's route set: ``translation``
(the translation service and its routes) or ``generation`` (the language model's: prompts
continued in batches, their tokens streamed). ``guard`` admits each request (token, body
limits, deadline, a client gone), ``connections`` bounds the connections under them (a
deadline for a request's headers; idle ones kept out of the connection limit; used by
``transformer serve``), ``batching`` collects concurrent requests into one decoding call,
``attention`` computes the maps the explorer draws, ``inspect`` the logit lens and the head
map (``/lens``, ``/heads``), ``static/`` is the page itself.
"""
from ..extras import require

require("fastapi", "serve", "transformer.serve")  # a one-line MissingExtra, not a deep ImportError

from .app import create_app  # noqa: E402
from .serve_config import ServeConfig  # noqa: E402

__all__ = ["create_app", "ServeConfig"]
