"""The service's settings: one frozen dataclass, checked once."""
from __future__ import annotations

from dataclasses import dataclass


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
        max_body_bytes: the largest request body, in bytes (413 beyond).
        attention_decimals: attention weights are rounded to this many decimals.
    """

    max_beam: int = 16
    new_tokens_limit: int = 1024
    max_batch: int = 32
    max_wait_ms: float = 5.0
    batching: bool = True
    max_chars: int = 1000
    max_texts: int = 64
    max_body_bytes: int = 1 << 20
    attention_decimals: int = 3

    def __post_init__(self) -> None:
        for name in ("max_beam", "new_tokens_limit", "max_batch", "max_chars", "max_texts", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be at least 0, got {self.max_wait_ms}")
        if not 0 <= self.attention_decimals <= 8:
            raise ValueError(f"attention_decimals must be between 0 and 8, got {self.attention_decimals}")
