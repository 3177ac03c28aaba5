"""What the training loop trains on: a task gives the model, the micro-batches and the
validation. The loop (trainer.py) knows a task only through this seam, so the decoder-only
language model plugs in as another task (one token stream instead of source/target pairs):
:func:`make_task` picks the task the prepared data calls for.

A batch needs ``inputs`` (what the model reads: ``model(*inputs, select)`` gives the logits
of the selected positions), ``tgt_out`` (the labels, ``pad_id`` where there is none) and
``n_tgt_tokens``; see :class:`transformer.data.Batch`.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator

import torch

from ..model.config import ModelConfig
from ..data import Batch, TokenBatchSampler, collate, example_lengths
from ..data.chars import Chars
from ..data.text import NOT_SCORED, TextBatch, WindowSampler, validation_windows, windows
from ..decode import greedy_search, length_batches, pad_batch
from ..decode.decoding_config import GPU_MAX_TOKENS, MAX_TOKENS, DecodingConfig
from ..decode.precision import for_inference
from ..errors import UserError
from ..evaluation.translation import score
from ..model import LanguageModel, Transformer, build_model
from .train_config import TrainConfig
from .distributed import Dist
from .loss import label_smoothed_nll_loss
from .prepare import PreparedData, PreparedText
from .update import autocast


def on_device(batch, device: torch.device):
    """A training batch, made on the host, on ``device``. To a GPU from pinned (page-locked)
    memory, ``non_blocking``: the copy is queued behind the update in flight and the host goes
    on (a copy from ordinary memory would wait for every kernel queued before it). The loop
    never waits for the GPU within an update, so the host makes the next batch while the GPU
    computes the last one: batches are prepared ahead without a thread or a queue that would
    draw from the sampler beyond what a checkpoint records."""
    if device.type == "cuda":
        return batch.pin_memory().to(device, non_blocking=True)
    return batch.to(device)


def scored_nll(model, inputs: tuple, labels: torch.Tensor, pad: int, device: torch.device,
               amp_dtype: torch.dtype | None, options: dict | None = None) -> tuple[float, int]:
    """Validation's forward pass and -log p: the summed negative log-likelihood of the
    non-``pad`` ``labels`` (B, T) and their count. The vocabulary projection runs at those
    positions only (``model(*inputs, select, **options)``)."""
    select = labels != pad
    with autocast(device, amp_dtype):
        logits = model(*inputs, select, **(options or {}))  # (N, V)
    _, nll, k = label_smoothed_nll_loss(logits, labels[select], 0.0, pad)
    return float(nll), int(k)


class Scores:
    """How a task words its validation score (``score_name``, the one to maximise): ``score_text``
    says a value; ``best_summary`` the best, or ``no_score`` when there was none."""

    no_score: str

    @staticmethod
    def score_text(score: float) -> str:
        raise NotImplementedError

    def best_summary(self, best: float) -> str:
        return f"best {self.score_text(best)}" if math.isfinite(best) else self.no_score


class TranslationTask(Scores):
    """Source/target pairs: token-bucketed batches (one shard per rank), validation
    negative log-likelihood and greedy BLEU (the score that picks the best weights)."""

    score_name, no_score = "valid_bleu", "no validation BLEU"

    def __init__(self, cfg: TrainConfig, data: PreparedData, dist: Dist,
                 model_config: Callable[[int], ModelConfig] | None = None) -> None:
        self.cfg, self.data = cfg, data
        self.model_config = model_config or cfg.model_config  # vocab_size -> the model to build
        self.sampler = TokenBatchSampler(example_lengths(data.train), cfg.max_tokens, cfg.seed,
                                         num_shards=dist.world_size, shard_index=dist.rank)
        if len(self.sampler) == 0:  # fewer batches in an epoch than ranks: nothing to train on
            raise UserError(f"the training data fills fewer batches of max_tokens={cfg.max_tokens} than there are "
                            f"ranks ({dist.world_size}); lower max_tokens or use fewer ranks")

    @property
    def has_validation(self) -> bool:
        return bool(self.data.valid)

    def batch_summary(self, world: int, accum: int) -> str:
        return (f"global batch: {world} rank(s) x {accum} micro-batch(es) x max_tokens {self.cfg.max_tokens} "
                f"= up to {world * accum * self.cfg.max_tokens} padded tokens per update")

    @staticmethod
    def score_text(score: float) -> str:
        return f"validation BLEU {score:.2f}"

    def build_model(self) -> Transformer:
        return Transformer(self.model_config(self.data.subwords.vocab_size))

    def batches(self, model: Transformer, device: torch.device) -> Iterator[Batch]:
        """Micro-batches, epoch after epoch, until ``max_epochs`` (the sampler continues where
        it stopped, so a resumed run sees the batches the straight run would have)."""
        c = model.cfg
        while not (self.cfg.max_epochs and self.sampler.state_dict()["epoch"] >= self.cfg.max_epochs):
            for idx in self.sampler:
                yield on_device(collate([self.data.train[i] for i in idx], c.pad_id, c.bos_id, c.eos_id), device)

    @torch.no_grad()
    def validation_nll(self, model: Transformer, device: torch.device, amp_dtype: torch.dtype | None) -> float:
        """Mean negative log-likelihood per target token of the validation pairs."""
        sw, c = self.data.subwords, model.cfg
        pairs = [(sw.encode(s)[: c.max_len - 1], sw.encode(t)[: c.max_len - 1]) for s, t in self.data.valid]
        sampler = TokenBatchSampler(example_lengths(pairs), self.cfg.max_tokens, 0, shuffle=False, length_noise=0)
        nll_sum, n = 0.0, 0
        model.eval()
        for idx in sampler:
            b = collate([pairs[i] for i in idx], c.pad_id, c.bos_id, c.eos_id).to(device)
            nll, k = scored_nll(model, b.inputs, b.tgt_out, c.pad_id, device, amp_dtype)
            nll_sum, n = nll_sum + nll, n + k
        return nll_sum / max(n, 1)

    def validate(self, model: Transformer, device: torch.device, amp_dtype: torch.dtype | None) -> dict:
        """The validation record: ``valid_nll``, ``valid_ppl`` and, with ``eval_bleu``, greedy
        ``valid_bleu`` / ``valid_chrf`` (``score_name`` is the one to maximise)."""
        rec = {"valid_nll": self.validation_nll(model, device, amp_dtype)}
        rec["valid_ppl"] = math.exp(min(rec["valid_nll"], 50))
        if self.cfg.eval_bleu:
            hyps = greedy_translations(model, self.data.subwords, [s for s, _ in self.data.valid], device)
            scores = score(hyps, [t for _, t in self.data.valid])
            rec.update(valid_bleu=scores.bleu, valid_chrf=scores.chrf)
        return rec


@torch.inference_mode()
def greedy_translations(model: Transformer, subwords, lines: list[str], device: torch.device) -> list[str]:
    """``lines`` translated by greedy search as ``transformer translate --beam 1 --precision
    fp32`` translates them (the default length limits and batches, eagerly): fp32 whatever the
    machine, so the scores that pick the best checkpoint are the same everywhere. A line longer
    than the model takes is cut to its first ``max_len - 1`` subwords, with a warning."""
    model = for_inference(model, "fp32")  # the model itself (in eval mode) when it is float32 already
    cfg, decoding = model.cfg, DecodingConfig(beam=1)
    room = cfg.max_len - 1
    todo = []
    for i, line in enumerate(lines):
        if line.strip():
            ids = subwords.encode(line)
            if len(ids) > room:
                warnings.warn(f"a validation line of {len(ids)} subwords is longer than the model's limit ({room}); "
                              f"translating its first {room} subwords only", stacklevel=2)
            todo.append((i, ids[:room] + [cfg.eos_id]))
    out = [""] * len(lines)  # an empty line's translation is empty
    max_tokens = GPU_MAX_TOKENS if device.type == "cuda" else MAX_TOKENS
    for batch in length_batches([len(ids) for _, ids in todo], max_tokens):
        chunk = [todo[j] for j in batch]
        src = pad_batch([ids for _, ids in chunk], cfg.pad_id, device)
        for (i, _), (hyp,) in zip(chunk, greedy_search(model, src, decoding.max_len_a, decoding.max_len_b)):
            out[i] = subwords.decode([t for t in hyp.tokens if t != cfg.eos_id])
    return out


class LanguageModelTask(Scores):
    """A decoder-only language model on one token stream: micro-batches of ``batch_size``
    windows of the context length drawn at random from the training stream (one shard of
    the draws per rank, see :class:`WindowSampler`); validation on fixed windows that score
    every validation token once (:func:`validation_windows`), so the loss is exact and the
    same at every evaluation, where nanoGPT estimates it from ``eval_iters`` random batches."""

    score_name = "valid_score"  # -valid_nll: best.safetensors keeps the lowest validation loss
    no_score = "no validation"
    eval_windows = 64  # windows per forward pass in validation

    def __init__(self, cfg: TrainConfig, data: PreparedText, dist: Dist,
                 model_config: Callable[[int], ModelConfig] | None = None) -> None:
        self.cfg, self.data = cfg, data
        self.model_config = model_config or cfg.model_config
        self.context = cfg.context or self.model_config(data.tokenizer.vocab_size).max_len
        self.sampler = WindowSampler(len(data.train), self.context, cfg.batch_size, cfg.seed,
                                     num_shards=dist.world_size, shard_index=dist.rank)
        self._valid_chars: int | None = None

    @property
    def has_validation(self) -> bool:
        return len(self.data.valid) > 0

    def batch_summary(self, world: int, accum: int) -> str:
        n = world * accum * self.cfg.batch_size
        return (f"global batch: {world} rank(s) x {accum} micro-batch(es) x batch_size {self.cfg.batch_size} "
                f"= {n} windows of {self.context} tokens ({n * self.context} tokens) per update")

    @staticmethod
    def score_text(score: float) -> str:  # (the score is -valid_nll)
        return f"validation loss {-score:.4f} nats/token"

    def build_model(self) -> LanguageModel:
        return build_model(self.model_config(self.data.tokenizer.vocab_size))

    def batches(self, model: LanguageModel, device: torch.device) -> Iterator[TextBatch]:  # noqa: ARG002
        """Micro-batches without end (max_steps, max_minutes or a signal ends the run)."""
        while True:
            yield on_device(windows(self.data.train, self.sampler.next_starts(), self.context), device)

    @torch.no_grad()
    def validate(self, model: LanguageModel, device: torch.device, amp_dtype: torch.dtype | None) -> dict:
        """``valid_nll`` (nats per token), ``valid_ppl``, ``valid_bpc`` (bits per character of
        the scored text: for characters, valid_nll / ln 2), for BPE ``valid_nll_per_char``,
        and ``valid_score`` = -valid_nll, the score to maximise."""
        pad, valid, spans = NOT_SCORED, self.data.valid, validation_windows(len(self.data.valid), self.context)
        nll_sum, n = 0.0, 0
        model.eval()
        for i in range(0, len(spans), self.eval_windows):
            chunk = spans[i: i + self.eval_windows]
            b = windows(valid, torch.tensor([start for start, _ in chunk]), self.context)
            for row, (_, first) in enumerate(chunk):
                b.y[row, :first] = pad  # scored by the window before
            b = b.to(device)
            nll, k = scored_nll(model, (b.x,), b.y, pad, device, amp_dtype, b.options)
            nll_sum, n = nll_sum + nll, n + k
        if self._valid_chars is None:  # the characters the scored tokens (all but the first) stand for
            self._valid_chars = len(self.data.tokenizer.decode(valid[1:].tolist()))
        rec = {"valid_nll": nll_sum / max(n, 1)}
        rec["valid_ppl"] = math.exp(min(rec["valid_nll"], 50))
        rec["valid_bpc"] = nll_sum / max(self._valid_chars, 1) / math.log(2)
        if not isinstance(self.data.tokenizer, Chars):
            rec["valid_nll_per_char"] = nll_sum / max(self._valid_chars, 1)
        rec["valid_score"] = -rec["valid_nll"]
        return rec


def make_task(cfg: TrainConfig, data: PreparedData | PreparedText, dist: Dist,
              model_config: Callable[[int], ModelConfig] | None = None):
    """The task the prepared data is for: a language model's text or translation pairs.
    ``model_config`` (vocab_size -> ModelConfig; default the config's own) says what
    model to build: a fine-tune's is its source's (see train/reuse.py)."""
    if isinstance(data, PreparedText):
        return LanguageModelTask(cfg, data, dist, model_config)
    return TranslationTask(cfg, data, dist, model_config)
