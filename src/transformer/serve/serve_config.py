"""The service's settings: one frozen dataclass, checked once."""
from __future__ import annotations

from dataclasses import dataclass, field

TOKEN_ENV = "TRANSFORMER_SERVE_TOKEN"  # where `transformer serve` reads the token when --token is not given


@dataclass(frozen=True)
class ServeConfig:
    """How the HTTP service batches and what it accepts. How it decodes (the beam, or the
    sampling settings, when a request names none; length penalty, precision) is the model's
    DecodingConfig.

    Args:
        max_beam: the largest beam a request may ask for.
        max_batch: the most texts decoded in one call (dynamic batching).
        max_wait_ms: how long the first request of a batch waits for company, in milliseconds.
        batching: False decodes each request alone, as it comes (for comparison).
        new_tokens_limit: the most tokens a /generate request may ask for (max_new_tokens).
        max_chars: the longest text (or prompt) accepted, in characters (413 beyond).
        max_texts: the most texts in one request (413 beyond).
        max_work: the most work one translation request (``/translate``, or ``/attention``'s
            translation) may ask for, in source tokens x beam: its texts' subword tokens (each
            at most the model's length) summed, times the beam. 413 beyond, naming what to lower.
            A ``/generate`` request is one prompt, bounded by new_tokens_limit.
        max_body_bytes: the largest request body, in bytes (413 beyond).
        attention_decimals: attention weights are rounded to this many decimals.
        max_attention: the most attention weights one /attention answer may return (its
            layers x heads x the cells of its maps); the model may compute
            ``serve.attention_maps.COMPUTE_FACTOR`` times as many for it. A text over it is a 413
            that says to ask for fewer layers or heads, or to send a shorter text.
        max_lens: the most logits one /lens request may compute (the lens's rows, layers + 1, x
            the positions x the vocabulary); a text over it is a 413 that says to send a
            shorter text.
        max_head_work: the most heads x positions one /heads request may run (each head
            measured is one batched row over the sentence's positions, source and output);
            over it is a 413 that says to ask for fewer layers, or to send a shorter text.
        max_queue: the most requests waiting for the model; one more gets 503 with
            Retry-After at once.
        timeout: seconds a request may take from its arrival until its answer starts (its
            body read, its wait in the queue, its decoding); 504 past it, and it is
            dropped from the queue. A stream's answer starts with its first token (a stream
            still queued at the deadline gets the 504); one that has started is not cut.
        header_timeout: seconds a connection has to send a request's headers, from its opening
            or its last answer; it is closed past them, however slowly they trickle in.
        idle_per_client: the most connections one client address may hold waiting for a
            request's headers; one more closes its oldest. Such connections do not count
            against ``connection_limit``.
        token: when set, every route but ``/health`` and the explorer page (``/`` and its
            static files, which hold no data) wants ``Authorization: Bearer TOKEN`` (401
            without it); the page takes the token from ``#token=`` in its address. Kept out
            of the repr.
        allowed_hosts: the host names a request's ``Host`` header may give (any port); others
            get 403, as a page elsewhere reaching a local server through DNS rebinding would.
            A tuple holding an unspecified address (``0.0.0.0``, ``::``: a server listening on
            every address) also admits any IP address: a page reaching a server through DNS
            rebinding names its own domain, never an address. None: any name.
        docs: serve FastAPI's API pages (``/docs``, ``/redoc``), which load their scripts and
            styles from a CDN (the browser needs the network, and tells that site). Off, only
            ``/openapi.json`` describes the API.
    """

    max_beam: int = 16
    new_tokens_limit: int = 1024
    max_batch: int = 32
    max_wait_ms: float = 5.0
    batching: bool = True
    max_chars: int = 1000
    max_texts: int = 64
    max_work: int = 20_000
    max_body_bytes: int = 1 << 20
    attention_decimals: int = 3
    max_attention: int = 2_000_000
    max_lens: int = 20_000_000
    max_head_work: int = 20_000
    max_queue: int = 128
    timeout: float = 60.0
    token: str | None = field(default=None, repr=False)
    allowed_hosts: tuple[str, ...] | None = None
    header_timeout: float = 10.0
    idle_per_client: int = 128
    docs: bool = False

    def __post_init__(self) -> None:
        for name in ("max_beam", "new_tokens_limit", "max_batch", "max_chars", "max_texts", "max_work",
                     "max_body_bytes", "max_queue", "max_attention", "max_lens", "max_head_work", "idle_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("timeout", "header_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")
        # A lone request waits max_wait_ms for company: as long as the timeout, every one would get 504.
        if not 0 <= self.max_wait_ms < self.timeout * 1000:
            raise ValueError(f"max_wait_ms must be at least 0 and below the timeout ({self.timeout:g} s), "
                             f"got {self.max_wait_ms:g}")
        if self.token is not None and not (self.token.isascii() and self.token.isprintable()
                                           and " " not in self.token and self.token):
            raise ValueError("token must be printable ASCII without spaces (it travels in an HTTP header), "
                             "and not empty")
        if not 0 <= self.attention_decimals <= 8:
            raise ValueError(f"attention_decimals must be between 0 and 8, got {self.attention_decimals}")

    @property
    def connection_limit(self) -> int:
        """uvicorn's ``limit_concurrency``: beyond this many connections with a request under
        way, or running requests, uvicorn itself answers 503 (connections waiting for a request's
        headers are bounded apart: header_timeout, idle_per_client; see serve.connections).
        Above what the queue and one batch hold, so the JSON 503 of a full queue comes first; a
        backstop against a flood of requests, each of which would cost memory before the queue
        sees it."""
        return self.max_queue + self.max_batch + 64
