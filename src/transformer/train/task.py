"""What the training loop trains on: a task gives the model, the micro-batches and the
validation. The loop (trainer.py) knows a task only through this seam, so the decoder-only
language model plugs in as another task (one token stream instead of source/target pairs).

A batch needs ``inputs`` (what the model reads: ``model(*inputs, select)`` gives the logits
of the selected positions), ``tgt_out`` (the labels, ``pad_id`` where there is none) and
``n_tgt_tokens``; see :class:`transformer.data.Batch`.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ..data import Batch, TokenBatchSampler, collate, example_lengths
from ..decode.config import DecodingConfig
from ..errors import UserError
from ..evaluate import score
from ..model import Transformer
from ..translator import Translator
from .config import TrainConfig
from .distributed import Dist
from .loss import label_smoothed_nll_loss
from .prepare import PreparedData
from .step import autocast


class TranslationTask:
    """Source/target pairs: token-bucketed batches (one shard per rank), validation
    negative log-likelihood and greedy BLEU (the score that picks the best weights)."""

    score_name = "valid_bleu"

    def __init__(self, cfg: TrainConfig, data: PreparedData, dist: Dist) -> None:
        self.cfg, self.data = cfg, data
        self.sampler = TokenBatchSampler(example_lengths(data.train), cfg.max_tokens, cfg.seed,
                                         num_shards=dist.world_size, shard_index=dist.rank)
        if len(self.sampler) == 0:  # fewer batches in an epoch than ranks: nothing to train on
            raise UserError(f"the training data fills fewer batches of max_tokens={cfg.max_tokens} than there are "
                            f"ranks ({dist.world_size}); lower max_tokens or use fewer ranks")

    @property
    def has_validation(self) -> bool:
        return bool(self.data.valid)

    def build_model(self) -> Transformer:
        return Transformer(self.cfg.model_config(self.data.subwords.vocab_size))

    def batches(self, model: Transformer, device: torch.device) -> Iterator[Batch]:
        """Micro-batches, epoch after epoch, until ``max_epochs`` (the sampler continues where
        it stopped, so a resumed run sees the batches the straight run would have)."""
        c = model.cfg
        while not (self.cfg.max_epochs and self.sampler.state_dict()["epoch"] >= self.cfg.max_epochs):
            for idx in self.sampler:
                yield collate([self.data.train[i] for i in idx], c.pad_id, c.bos_id, c.eos_id).to(device)

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
            select = b.tgt_out != c.pad_id  # the vocabulary projection at real tokens only
            with autocast(device, amp_dtype):
                logits = model(*b.inputs, select)
            _, nll, k = label_smoothed_nll_loss(logits, b.tgt_out[select], 0.0, c.pad_id)
            nll_sum, n = nll_sum + float(nll), n + int(k)
        return nll_sum / max(n, 1)

    def validate(self, model: Transformer, device: torch.device, amp_dtype: torch.dtype | None) -> dict:
        """The validation record: ``valid_nll``, ``valid_ppl`` and, with ``eval_bleu``, greedy
        ``valid_bleu`` / ``valid_chrf`` (``score_name`` is the one to maximise)."""
        rec = {"valid_nll": self.validation_nll(model, device, amp_dtype)}
        rec["valid_ppl"] = math.exp(min(rec["valid_nll"], 50))
        if self.cfg.eval_bleu:
            translator = Translator(model, self.data.subwords, DecodingConfig(beam=1, device=str(device)))
            scores = score(translator.translate([s for s, _ in self.data.valid]), [t for _, t in self.data.valid])
            rec.update(valid_bleu=scores.bleu, valid_chrf=scores.chrf)
        return rec
