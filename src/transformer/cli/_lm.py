"""What the commands that look inside a language model share (a leading underscore: not a
command module): loading the run for inspection, and a prompt's ids."""
from __future__ import annotations

from ..errors import UserError


def load_language_model(path, options: dict):
    """A Generator for ``path``: the model in fp32 (the exact arithmetic that is explained),
    its tokenizer, and the run's decoding settings overridden by ``options`` (the sampling
    and device fields; others are ignored)."""
    from ..inference.generator import Generator

    options = {k: v for k, v in options.items() if k in ("temperature", "top_k", "top_p", "device")}
    return Generator.from_pretrained(path, warn=False, precision="fp32", **options)


def prompt_ids(generator, prompt: str, name: str = "the prompt") -> list[int]:
    """The prompt's token ids. Empty, or longer than the model's context: a UserError naming
    it as ``name`` (the prompt is shown whole, never cut as generation would cut it).
    ``generator``: anything with the run's ``tokenizer`` and ``model``."""
    if not prompt.strip():
        raise UserError(f"{name} is empty; give some text to look at")
    ids = generator.tokenizer.encode(prompt)
    n = generator.model.cfg.max_len
    if len(ids) > n:
        raise UserError(f"{name} is {len(ids)} tokens long, longer than the model's context of {n} tokens; "
                        "shorten it")
    return ids


def token_pieces(generator, ids: list[int]) -> list[str]:
    """The printable token of each id (a space as "\u2581", a newline as "\\n")."""
    from ..viz.walkthrough_lm import token_shower

    show = token_shower(generator.tokenizer)
    return [show(i) for i in ids]
