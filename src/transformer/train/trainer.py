"""One training loop for every task: the paper's optimizer and schedule, label smoothing,
gradient accumulation, mixed precision, validation BLEU, early stopping, checkpoints that
resume exactly, and a clean stop on Ctrl-C / SIGTERM."""
from __future__ import annotations

import json
import math
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from ..data import TokenBatchSampler, collate, example_lengths
from ..errors import UserError
from ..evaluate import score
from ..model import Transformer
from ..translator import Translator
from . import checkpoint as ckpt
from .config import TrainConfig
from .loss import label_smoothed_nll_loss
from .prepare import prepare_data
from .schedule import inverse_sqrt_lr, noam_lr
from .step import autocast, paper_adam, train_step

# Options that may change when a run is resumed; any other change is refused.
RESUMABLE_CHANGES = {"max_steps", "max_epochs", "max_minutes", "patience", "eval_every", "save_every",
                     "keep_last", "average_last", "log_every", "tensorboard", "progress", "threads",
                     "max_bad_steps", "data_dir", "eval_bleu", "valid_limit"}


def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """auto: bf16 where the hardware has it (AMX / AVX512-BF16 CPUs, Ampere+ GPUs), else fp32."""
    if name == "fp32":
        return None
    if name == "bf16":
        return torch.bfloat16
    if name == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None


class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: str | Path, device: str = "cpu", log=print) -> None:
        self.cfg, self.run_dir, self.log = cfg, Path(run_dir), log
        self.device = torch.device(device)
        self.stop_signal: str | None = None
        self._check_run_dir()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        probe = cfg.model_config(vocab_size=max(cfg.vocab_size, 8))  # only for max_len
        self.data = prepare_data(cfg, self.run_dir, probe.max_len, log)
        self._write_config()
        self.model = Transformer(cfg.model_config(self.data.subwords.vocab_size)).to(self.device)
        self.optimizer = paper_adam(self.model.parameters(), cfg.weight_decay)
        self.amp_dtype = resolve_precision(cfg.precision, self.device)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.sampler = TokenBatchSampler(example_lengths(self.data.train), cfg.max_tokens, cfg.seed)
        self.step, self.epoch_start_step = 0, 0
        self.best_bleu, self.bad_evals, self.bad_steps, self.elapsed = -1.0, 0, 0, 0.0
        self.writer = None
        self._resume()

    # ---- run directory ----------------------------------------------------------------
    def _check_run_dir(self) -> None:
        """Refuse to resume a run under a different config. Only a directory holding a
        checkpoint holds a run: a failed first attempt leaves nothing that binds."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"{self.run_dir}: cannot create the run directory ({e.strerror})") from None
        path = self.run_dir / "config.yaml"
        if not (path.is_file() and ckpt.latest_checkpoint(self.run_dir) is not None):
            return
        saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        new = self.cfg.to_dict()
        changed = sorted(k for k, v in new.items() if k not in RESUMABLE_CHANGES and k != "model" and saved.get(k) != v)
        old_model, new_model = saved.get("model") or {}, new["model"]
        changed += sorted(f"model.{k}" for k in set(old_model) | set(new_model) if old_model.get(k) != new_model.get(k))
        if changed:
            raise UserError(f"{self.run_dir}: holds a run with a different config ({', '.join(changed)}); "
                            "use another --out, or the same config to resume")

    def _write_config(self) -> None:
        from ..fileio import write_text_atomic

        write_text_atomic(self.run_dir / "config.yaml", yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))

    def _resume(self) -> None:
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is None:
            return
        cfg, tensors, meta = ckpt.read_weights(latest / ckpt.WEIGHTS)
        if cfg != self.model.cfg:
            raise UserError(f"{latest}: checkpoint was written for another model config or vocabulary")
        sw_sha = ckpt.file_sha256(self.run_dir / "subwords.model")
        if meta.get("subwords_sha256", sw_sha) != sw_sha:
            raise UserError(f"{latest}: checkpoint was trained with another subwords.model")
        ckpt.load_weights_into(self.model, tensors, latest)
        state = ckpt.load_training_state(latest)
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.step, self.best_bleu = state["step"], state["best_bleu"]
        self.bad_evals, self.elapsed = state["bad_evals"], state["elapsed"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.log(f"resumed from {latest} (step {self.step})")

    def save(self) -> Path:
        state = {
            "step": self.step, "optimizer": self.optimizer.state_dict(), "sampler": self.sampler.state_dict(),
            "best_bleu": self.best_bleu, "bad_evals": self.bad_evals, "elapsed": self.elapsed,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }
        sha = ckpt.file_sha256(self.run_dir / "subwords.model")
        try:
            return ckpt.save_checkpoint(self.run_dir, self.model, state, self.step, self.cfg.keep_last,
                                        {"subwords_sha256": sha})
        except OSError as e:
            raise UserError(f"{self.run_dir}: could not save a checkpoint ({e.strerror}); "
                            "the previous checkpoint is intact") from None

    # ---- the loop ---------------------------------------------------------------------
    def lr(self, step: int) -> float:
        c = self.cfg
        if c.lr_schedule == "noam":
            return noam_lr(step, self.model.cfg.d_model, c.warmup, c.lr_scale)
        return inverse_sqrt_lr(step, c.peak_lr, c.warmup)

    def _batches(self):
        """Micro-batches, epoch after epoch (the sampler continues where it stopped)."""
        while True:
            if self.cfg.max_epochs and self.sampler.state_dict()["epoch"] >= self.cfg.max_epochs:
                return
            for idx in self.sampler:
                yield collate([self.data.train[i] for i in idx], self.model.cfg.pad_id,
                              self.model.cfg.bos_id, self.model.cfg.eos_id).to(self.device)

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self.stop_signal = signal.Signals(signum).name

    def train(self) -> dict:
        """Train until max_steps / max_epochs / max_minutes / early stopping / a signal."""
        c = self.cfg
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self._open_writer()
        batches = self._batches()
        bar = self._progress()
        window_tokens, window_start, last_saved = 0, time.perf_counter(), self.step
        reason = "max_steps"
        try:
            while self.step < c.max_steps:
                micro = [b for _, b in zip(range(c.accum_steps), batches)]
                if not micro:
                    reason = "max_epochs"
                    break
                t0 = time.perf_counter()
                self.model.train()
                stats = train_step(self.model, micro, self.optimizer, self.lr(self.step + 1),
                                   epsilon=c.label_smoothing, clip_norm=c.clip_norm or None,
                                   amp_dtype=self.amp_dtype, grad_scaler=self.scaler)
                self.elapsed += time.perf_counter() - t0
                if stats.skipped:
                    self.bad_steps += 1
                    self._metrics({"event": "skipped_step", "step": self.step, "loss": stats.loss})
                    if self.bad_steps >= c.max_bad_steps:
                        saved = self.save()  # skipped updates leave the weights as they were: good
                        raise UserError(f"{self.bad_steps} consecutive updates had a non-finite loss or "
                                        f"gradient; stopping. The last good checkpoint is {saved}; "
                                        "try a lower learning rate or precision=fp32")
                    continue
                self.bad_steps = 0
                self.step += 1
                window_tokens += stats.n_tokens
                if bar is not None:
                    bar.update(1)
                if self.step % c.log_every == 0:
                    now = time.perf_counter()
                    tps = window_tokens / max(now - window_start, 1e-9)
                    rec = {"step": self.step, "epoch": self.sampler.state_dict()["epoch"], "loss": stats.loss,
                           "nll": stats.nll, "ppl": math.exp(min(stats.nll, 50)), "lr": stats.lr,
                           "grad_norm": stats.grad_norm, "tgt_tokens_per_s": tps,
                           "train_minutes": self.elapsed / 60}
                    self._metrics(rec)
                    if bar is not None:
                        bar.set_postfix(loss=f"{stats.loss:.3f}", tok_s=f"{tps:,.0f}", lr=f"{stats.lr:.2e}")
                    window_tokens, window_start = 0, now
                if self.step % c.eval_every == 0:
                    if self.evaluate() == "early_stop":
                        reason = "early_stop"
                        break
                if self.step % c.save_every == 0:
                    self.save()
                    last_saved = self.step
                if self.stop_signal:
                    reason = self.stop_signal
                    break
                if c.max_minutes and self.elapsed >= c.max_minutes * 60:
                    reason = "max_minutes"
                    break
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if bar is not None:
                bar.close()
        if self.step != last_saved or ckpt.latest_checkpoint(self.run_dir) is None:
            self.save()
        if reason not in ("SIGINT", "SIGTERM"):
            if c.eval_every and self.step % c.eval_every != 0:
                self.evaluate()
            if c.average_last > 1:
                dirs = ckpt.checkpoint_dirs(self.run_dir)[-c.average_last:]
                ckpt.average_checkpoints(dirs, self.run_dir / "averaged.safetensors")
                self.log(f"averaged {len(dirs)} checkpoints -> {self.run_dir / 'averaged.safetensors'}")
        self._metrics({"event": "stop", "step": self.step, "reason": reason, "train_minutes": self.elapsed / 60})
        self._plot()
        if self.writer is not None:
            self.writer.close()
        self.log(f"stopped at step {self.step} ({reason}); {self.elapsed / 60:.1f} training minutes; "
                 f"best validation BLEU {max(self.best_bleu, 0):.2f}")
        return {"step": self.step, "reason": reason, "best_bleu": self.best_bleu, "train_minutes": self.elapsed / 60}

    # ---- validation -------------------------------------------------------------------
    @torch.no_grad()
    def validation_loss(self) -> float:
        sw, m = self.data.subwords, self.model
        pairs = [(sw.encode(s), sw.encode(t)) for s, t in self.data.valid]
        pairs = [(s[: m.cfg.max_len - 1], t[: m.cfg.max_len - 1]) for s, t in pairs]
        sampler = TokenBatchSampler(example_lengths(pairs), self.cfg.max_tokens, 0, shuffle=False, length_noise=0)
        nll_sum, n = 0.0, 0
        m.eval()
        for idx in sampler:
            b = collate([pairs[i] for i in idx], m.cfg.pad_id, m.cfg.bos_id, m.cfg.eos_id).to(self.device)
            with autocast(self.device, self.amp_dtype):
                logits = m(b.src, b.tgt_in)
            _, nll, k = label_smoothed_nll_loss(logits, b.tgt_out, 0.0, m.cfg.pad_id)
            nll_sum, n = nll_sum + float(nll), n + int(k)
        return nll_sum / max(n, 1)

    def evaluate(self) -> str | None:
        if not self.data.valid:
            return None
        t0 = time.perf_counter()
        rec = {"event": "eval", "step": self.step, "valid_nll": self.validation_loss()}
        rec["valid_ppl"] = math.exp(min(rec["valid_nll"], 50))
        if self.cfg.eval_bleu:
            translator = Translator(self.model, self.data.subwords, beam_size=1, device=self.device)
            hyps = translator.translate([s for s, _ in self.data.valid])
            scores = score(hyps, [t for _, t in self.data.valid])
            rec.update(valid_bleu=scores.bleu, valid_chrf=scores.chrf)
            if scores.bleu > self.best_bleu:
                self.best_bleu, self.bad_evals = scores.bleu, 0
                ckpt.save_weights(self.model, self.run_dir / "best.safetensors",
                                  {"step": str(self.step), "valid_bleu": f"{scores.bleu:.2f}"})
                rec["best"] = True
            else:
                self.bad_evals += 1
        rec["eval_seconds"] = time.perf_counter() - t0
        self._metrics(rec)
        self.log(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))
        if self.cfg.patience and self.bad_evals >= self.cfg.patience:
            return "early_stop"
        return None

    # ---- logging ----------------------------------------------------------------------
    def _metrics(self, rec: dict) -> None:
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        if self.writer is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.writer.add_scalar(k, v, rec.get("step", self.step))

    def _open_writer(self) -> None:
        if not self.cfg.tensorboard:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("tensorboard=true needs the tensorboard package: pip install tensorboard") from None
        self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    def _progress(self):
        if not self.cfg.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=self.cfg.max_steps, initial=self.step, unit="step", dynamic_ncols=True, mininterval=1.0)

    def _plot(self) -> None:
        from .plots import plot_learning_curve

        try:
            plot_learning_curve(self.run_dir / "metrics.jsonl", self.run_dir / "learning_curve.png")
        except Exception as e:  # noqa: BLE001 - a plot must never lose a finished run
            self.log(f"warning: could not draw the learning curve ({e})")
