"""Generation for the decoder-only language model: greedy (temperature 0) or sampling with
temperature, top-k and top-p (nucleus), batched on the KV cache, tokens yielded as they come.

Each row draws from its own random generator, seeded ``seed + row`` (or, given a list of
seeds, its own): the same seed gives the same text, and a row's text does not depend on the
other rows of the batch.

Context longer than the model's ``max_len``: when a row's sequence fills the positions, its
window is cut to its last ``max_len // 2`` tokens and generation goes on (a sliding window
that moves by half a context at a time; each token still sees at least ``max_len // 2``
tokens before it). Each row slides on its own: the cache is rebuilt for the batch, but the
rows that are not full keep their whole window, so a row slides where it would alone.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor

from .eager_step import EagerStep


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """(B, V) logits with every token outside the top-k and outside the nucleus set to -inf.

    The nucleus is the smallest set of most probable tokens whose probability reaches
    ``top_p`` (the token that crosses the threshold is in it, so it is never empty)."""
    if top_k and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # the probability of the tokens ranked above each
        drop = before >= top_p
        drop[:, 0] = False  # the most probable token, also for a top_p below float32's range (0 there)
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def next_tokens(logits: Tensor, temperature: float, top_k: int, top_p: float,
                generators: list[torch.Generator] | None) -> Tensor:
    """(B, V) logits of the next position -> (B,) chosen ids."""
    logits = logits.float()  # (exact from bf16; torch's argmax over bf16 took 3.5x as long: 4.4 against
    # 1.25 ms at 8 rows of a 151,936-token vocabulary, cast included)
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    overflow = ~scaled.amax(dim=-1).isfinite()  # (B,) a temperature so small (1e-30) that logits / T leave float32
    if overflow.any():  # softmax would be nan: its limit instead, the most probable token (ties share)
        top = torch.where(logits == logits.amax(dim=-1, keepdim=True), 0.0, float("-inf"))
        scaled = torch.where(overflow[:, None], top, scaled)
    probs = filter_logits(scaled, top_k, top_p).softmax(dim=-1)
    return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])


@torch.inference_mode()
def generate_stream(model, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                    top_k: int = 0, top_p: float = 1.0, seed: int | Sequence[int | None] | None = None,
                    stop_id: int | Sequence[int] | None = None, step=None) -> Iterator[Tensor]:
    """Yield the next token of every row, (B,) ids, ``max_new_tokens`` times (fewer when every
    row has produced a stop token; a finished row then repeats the first stop id).
    ``stop_id``: one id, several (Llama 3 Instruct ends a turn with one of three), or None.

    ``prompts`` are token ids, each non-empty and at most ``max_len - 1`` long (the callers
    cut longer ones from the left and start empty ones with BOS). ``seed``: one int (row
    ``i`` draws with ``seed + i``), one per row (None: a fresh one), or None (fresh ones).
    ``step``: the step every token is decoded by (:mod:`transformer.decode.eager_step`, giving
    logits; default: the model's own ``decode``, eagerly)."""
    cfg, device = model.cfg, model.embed.weight.device
    if any(not p or len(p) >= cfg.max_len for p in prompts):
        raise ValueError(f"every prompt needs 1 to {cfg.max_len - 1} tokens")
    generators = None
    if temperature > 0:
        generators = [torch.Generator(device=device).manual_seed(s) for s in row_seeds(seed, len(prompts))]
    step = EagerStep(model, logprobs=False) if step is None else step
    need = max(len(p) for p in prompts) + max_new_tokens  # positions, were there no window to slide
    history = [list(p) for p in prompts]
    cache, logits = step.prefill(history, need)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    stops = stop_tensor(stop_id, device)
    new: list[Tensor] = []  # the tokens since `history` was last brought up to date
    for i in range(max_new_tokens):
        token = _choose(logits, temperature, top_k, top_p, generators, stops, done)
        yield token
        if i == max_new_tokens - 1 or (stops is not None and bool(done.all())):
            return
        new.append(token)
        if step.full(cache):  # slide the windows of the rows whose positions are full
            for row, ts in zip(history, torch.stack(new, 1).tolist()):
                row.extend(ts)
            new.clear()
            # next_position counts the tokens of a row's window in the cache; the new token is not in it yet
            history = _windows(history, cache.next_position.tolist(), cfg.max_len)  # no more is needed again
            cache, logits = step.prefill(history, need)
        else:
            logits, cache = step(token[:, None], cache)


def stop_tensor(stop_id: int | Sequence[int] | None, device=None) -> Tensor | None:
    """The stop ids as a (K,) tensor (None: none)."""
    if stop_id is None:
        return None
    return torch.tensor([stop_id] if isinstance(stop_id, int) else list(stop_id), dtype=torch.long, device=device)


def _choose(logits: Tensor, temperature: float, top_k: int, top_p: float, generators,
            stops: Tensor | None, done: Tensor) -> Tensor:
    """The next token of every row (:func:`next_tokens`); a row that has produced a stop id
    repeats the first one, and ``done`` (B,) is updated in place."""
    token = next_tokens(logits, temperature, top_k, top_p, generators)
    if stops is not None:
        token = token.masked_fill(done, int(stops[0]))
        done |= torch.isin(token, stops)
    return token


def _windows(history: list[list[int]], in_cache: list[int], max_len: int) -> list[list[int]]:
    """What each row keeps when the cache is rebuilt: a row with ``in_cache`` tokens (its
    window, without the newest token) whose positions are full slides to its last
    ``max_len // 2`` tokens; any other row keeps its whole window and the newest token."""
    return [row[-(max_len // 2):] if n >= max_len else row[-(n + 1):] for row, n in zip(history, in_cache)]


def row_seeds(seed: int | Sequence[int | None] | None, n_rows: int) -> list[int]:
    """The seed of each row's generator: ``seed + row``, or the given one per row; a fresh
    one (``torch.seed()``) where none is given."""
    if seed is None or isinstance(seed, int):
        base = torch.seed() if seed is None else seed
        return [base + i for i in range(n_rows)]
    if len(seed) != n_rows:
        raise ValueError(f"{len(seed)} seeds for {n_rows} prompts; give one per prompt")
    return [torch.seed() if s is None else s for s in seed]


def until_stop(tokens: Iterable[Tensor], stop_id: int | Sequence[int] | None) -> Iterator[list[int | None]]:
    """:func:`generate_stream`'s tokens, each step's (B,) as a list, with None for a row that has
    stopped: a row's stop token (kept, as Hugging Face keeps EOS) is its last."""
    stops = set() if stop_id is None else {stop_id} if isinstance(stop_id, int) else set(stop_id)
    ended: list[bool] | None = None
    for token in tokens:
        ids = token.tolist()
        ended = ended or [False] * len(ids)
        yield [None if done else t for t, done in zip(ids, ended)]
        ended = [done or t in stops for t, done in zip(ids, ended)]


def generate(model, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: int | Sequence[int | None] | None = None,
             stop_id: int | Sequence[int] | None = None, step=None) -> list[list[int]]:
    """The new tokens of each row (without the prompt; cut after a stop id, which is kept);
    ``stop_id`` and ``step`` as for :func:`generate_stream`."""
    out: list[list[int]] = [[] for _ in prompts]
    for tokens in until_stop(generate_stream(model, prompts, max_new_tokens, temperature, top_k, top_p, seed,
                                             stop_id, step), stop_id):
        for row, t in zip(out, tokens):
            if t is not None:
                row.append(t)
    return out
