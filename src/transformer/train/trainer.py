"""One training loop for every task: the paper's optimizer and schedule, label smoothing,
gradient accumulation, mixed precision, validation BLEU, early stopping, checkpoints that
resume exactly, a clean stop on Ctrl-C / SIGTERM, and data-parallel training over the
ranks torchrun starts (see train/distributed.py: every rank trains, rank 0 alone writes
files and validates, and every decision to stop is taken by all ranks together)."""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from ..data import TokenBatchSampler, collate, example_lengths
from ..errors import UserError
from ..evaluate import score
from ..model import Transformer
from ..model.dropout import Dropout
from ..translator import Translator
from . import checkpoint as ckpt
from .config import TrainConfig
from .distributed import Dist, reshard_position
from .loss import compile_loss, label_smoothed_nll_loss
from .prepare import SUBWORDS, EpochExamples, PreparedData, prepare_data
from .schedule import cooldown_factor, dropout_ramp, inverse_sqrt_lr, noam_lr
from .step import autocast, paper_adam, train_step

# Options that may change when a run is resumed; any other change is refused. accum_steps may
# change so that a run resumed on another number of ranks can keep its global batch.
RESUMABLE_CHANGES = {"max_steps", "max_epochs", "max_minutes", "patience", "eval_every", "save_every",
                     "keep_last", "average_last", "log_every", "tensorboard", "progress", "threads",
                     "max_bad_steps", "data_dir", "eval_bleu", "valid_limit", "accum_steps",
                     "cooldown", "compile_loss"}
SIGNAL_CODES = {"SIGINT": 1, "SIGTERM": 2}


def _quiet(*args, **kwargs) -> None:  # noqa: ARG001 - the log of ranks other than 0
    return None


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


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
    """Args:
        cfg: the training config.
        run_dir: where the run lives; a directory holding a checkpoint is resumed.
        device: "cpu" or "cuda[:N]" for a single process (ignored when ``dist`` is given).
        log: where progress lines go (rank 0 only).
        dist: this process's place in a torchrun group (:func:`distributed.from_env`).
    """

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, device: str = "cpu", log=print,
                 dist: Dist | None = None) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.dist = dist or Dist(device=torch.device(device))
        self.device = self.dist.device
        self.log = log if self.dist.is_main else _quiet
        self.stop_signal: str | None = None
        self._check_run_dir()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        _seed_all(cfg.seed)
        probe = cfg.model_config(vocab_size=max(cfg.vocab_size, 8))  # only for max_len
        self.data: PreparedData | None = None
        self.dist.on_main(lambda: self._prepare(probe.max_len))  # learns the subwords once
        if self.data is None:  # ranks > 0 read the subwords rank 0 wrote
            self.data = prepare_data(cfg, self.run_dir, probe.max_len, _quiet)
        # Built from the same seed on every rank: identical initial weights.
        self.model = self._build_model()
        if self.dist.rank:
            _seed_all(cfg.seed + self.dist.rank)  # but each rank its own dropout masks
        self.optimizer = paper_adam(self.model.parameters(), cfg.weight_decay)
        self.amp_dtype = resolve_precision(cfg.precision, self.device)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.loss_kernels = None
        if cfg.compile_loss and self.device.type == "cpu":
            self.loss_kernels = compile_loss(dtype=self.amp_dtype or torch.float32)
            if self.loss_kernels is not None:
                self.log("loss: compiled kernels (compile_loss: true)")
        self.examples = EpochExamples(self.data, cfg.subword_dropout, cfg.seed, probe.max_len)
        if cfg.subword_dropout:
            sd = self.examples.dropout
            self.log(f"subword dropout {cfg.subword_dropout}: {sd.n_words} distinct words, {sd.variants} "
                     "segmentations drawn for each; every epoch picks one per occurrence")
        lengths = self.examples.lengths if cfg.subword_dropout else example_lengths(self.data.train)
        self.sampler = TokenBatchSampler(lengths, cfg.max_tokens, cfg.seed,
                                         num_shards=self.dist.world_size, shard_index=self.dist.rank)
        if len(self.sampler) == 0:  # fewer batches in an epoch than ranks: nothing to train on
            raise UserError(f"the training data fills fewer batches of max_tokens={cfg.max_tokens} than there are "
                            f"ranks ({self.dist.world_size}); lower max_tokens or use fewer ranks")
        self.step, self.epoch_start_step = 0, 0
        self.best_bleu, self.bad_evals, self.bad_steps, self.elapsed = -1.0, 0, 0, 0.0
        self.writer = None
        self.has_checkpoint = False
        self._resume()
        self.dist.on_main(self._repair_metrics)
        self.forward = self._wrap()
        w, a = self.dist.world_size, cfg.accum_steps
        self.log(f"global batch: {w} rank(s) x {a} micro-batch(es) x max_tokens {cfg.max_tokens} "
                 f"= up to {w * a * cfg.max_tokens} padded tokens per update")

    def _build_model(self) -> Transformer:
        """The model; with ``restrict_output``, its logits cover only the subwords of the
        target training text (and EOS): the rest could never be learned as outputs."""
        v = self.data.subwords.vocab_size
        mcfg = self.cfg.model_config(v)
        if not self.cfg.restrict_output:
            return Transformer(mcfg).to(self.device)
        ids = {i for _, t in self.data.train for i in t} | {mcfg.eos_id}
        model = Transformer(mcfg.replace(output_vocab_size=len(ids)))
        model.set_output_ids(ids)
        self.log(f"output vocabulary: {len(ids)} of {v} subwords (those of the target training text, and EOS)")
        return model.to(self.device)

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
        try:
            saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: not readable YAML ({str(e).splitlines()[0]}); "
                            "restore it or use another --out") from None
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

    def _prepare(self, max_len: int) -> None:
        """Rank 0: tidy the leftovers of a crash, read the corpus, learn or reload the
        subwords, write config.yaml."""
        ckpt.remove_stale_files(self.run_dir)
        sw = self.run_dir / SUBWORDS
        if sw.is_file():
            self.data = prepare_data(self.cfg, self.run_dir, max_len, self.log)
        else:
            # Learn the subwords in a private folder and move them in complete: a crash while
            # sentencepiece writes must not leave a truncated subwords.model to be reused.
            try:
                staging = Path(tempfile.mkdtemp(prefix=".prepare.", dir=self.run_dir))
            except OSError as e:
                raise UserError(f"{self.run_dir}: cannot write ({e.strerror or e})") from None
            try:
                log = lambda *a: self.log(" ".join(map(str, a)).replace(str(staging), str(self.run_dir)))  # noqa: E731
                self.data = prepare_data(self.cfg, staging, max_len, log)
                for name in ("subwords.vocab", SUBWORDS):  # the model last: its presence means complete
                    if (staging / name).is_file():
                        with open(staging / name, "rb") as f:
                            os.fsync(f.fileno())
                        os.replace(staging / name, self.run_dir / name)
                self.data.subwords.path = sw
            except OSError as e:
                raise UserError(f"{self.run_dir}: cannot write the subword model ({e.strerror or e})") from None
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        self._write_config()

    def _resume(self) -> None:
        """Continue from the newest checkpoint that reads. One that does not (truncated or
        corrupt, e.g. damaged after it was written) is moved aside to checkpoints/corrupt-*
        with a warning and the one before it is used; with no older one, a clear error.
        A checkpoint of another config or vocabulary is always refused."""
        dirs = ckpt.checkpoint_dirs(self.run_dir)
        for i, path in enumerate(reversed(dirs)):
            try:
                cfg, tensors, meta = ckpt.read_weights(path / ckpt.WEIGHTS)
                state = ckpt.load_training_state(path)
            except UserError as e:
                if i == len(dirs) - 1:
                    raise
                self.log(f"warning: {e}; resuming from the checkpoint before it")
                if self.dist.is_main:
                    try:
                        ckpt.set_aside(path)
                    except OSError:
                        pass  # left in place: the next save of that step replaces it
                continue
            self._restore(path, cfg, tensors, meta, state)
            return

    def _restore(self, path: Path, cfg, tensors: dict, meta: dict, state: dict) -> None:
        if cfg != self.model.cfg:
            raise UserError(f"{path}: checkpoint was written for another model config or vocabulary")
        sw_sha = ckpt.file_sha256(self.run_dir / "subwords.model")
        if meta.get("subwords_sha256", sw_sha) != sw_sha:
            raise UserError(f"{path}: checkpoint was trained with another subwords.model")
        ckpt.load_weights_into(self.model, tensors, path)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self._restore_position(state)
            self.step, self.best_bleu = state["step"], state["best_bleu"]
            self.bad_evals, self.elapsed = state["bad_evals"], state["elapsed"]
            self._restore_rng(state)
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise UserError(f"{path / ckpt.STATE}: training state does not fit this run "
                            f"({type(e).__name__}: {e})") from None
        self.has_checkpoint = True
        self.log(f"resumed from {path} (step {self.step})")

    def _restore_position(self, state: dict) -> None:
        """The data position, mapped onto this run's number of ranks (see reshard_position)."""
        old_world, world = int(state.get("world_size", 1)), self.dist.world_size
        position = state["sampler"]
        if old_world != world:
            position, skipped = reshard_position(position, old_world, world)
            note = f" ({skipped} batch(es) skipped)" if skipped else ""
            self.log(f"resuming on {world} rank(s) a run saved on {old_world}: epoch {position['epoch']} "
                     f"continues at batch {position['batch_in_epoch'] * world}{note}")
        old_batch = old_world * int(state.get("accum_steps", self.cfg.accum_steps))
        if old_batch != world * self.cfg.accum_steps:
            self.log(f"warning: the global batch changes from {old_batch} to {world * self.cfg.accum_steps} "
                     "micro-batches per update (ranks x accum_steps); keep the product to keep the trajectory")
        self.sampler.load_state_dict(position)

    def _restore_rng(self, state: dict) -> None:
        per_rank = state.get("rng_per_rank") or [state["rng"]]
        if self.dist.rank < len(per_rank):
            ckpt.set_rng_state(per_rank[self.dist.rank], self.device)
        else:  # a rank the saved run did not have
            _seed_all(self.cfg.seed + self.dist.rank)

    def _repair_metrics(self) -> None:
        dropped, torn = ckpt.repair_metrics(self.run_dir / "metrics.jsonl", self.step)
        if dropped or torn:
            self.log(f"metrics.jsonl: removed {dropped} record(s) of steps after {self.step}, which this run "
                     "repeats" + (", and a torn last line left by a crash" if torn else ""))

    def _wrap(self):
        """The DistributedDataParallel wrapper train_step runs forward through (None: one process)."""
        if not self.dist.enabled:
            return None
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        # The only buffer is the constant positional-encoding table: nothing to sync each step.
        return DistributedDataParallel(self.model, device_ids=ids, forward_sync_buffers=False)

    def save(self) -> Path:
        """Write a checkpoint (rank 0; every rank must call this: it gathers their RNG states).
        A failure (full disk, unwritable folder) is a UserError on every rank; the previous
        checkpoint is intact."""
        rngs = self.dist.gather(ckpt.rng_state(self.device))

        def write() -> Path:
            state = {
                "step": self.step, "optimizer": self.optimizer.state_dict(), "sampler": self.sampler.state_dict(),
                "best_bleu": self.best_bleu, "bad_evals": self.bad_evals, "elapsed": self.elapsed,
                "rng": rngs[0], "rng_per_rank": rngs, "world_size": self.dist.world_size,
                "accum_steps": self.cfg.accum_steps,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            }
            try:
                sha = ckpt.file_sha256(self.run_dir / "subwords.model")
                return ckpt.save_checkpoint(self.run_dir, self.model, state, self.step, self.cfg.keep_last,
                                            {"subwords_sha256": sha})
            except OSError as e:
                raise UserError(f"{self.run_dir}: could not save a checkpoint ({e.strerror or e}); "
                                "the previous checkpoint is intact") from None

        path = self.dist.on_main(write)
        self.has_checkpoint = True
        return path

    # ---- the loop ---------------------------------------------------------------------
    def lr(self, step: int) -> float:
        c = self.cfg
        if c.lr_schedule == "noam":
            base = noam_lr(step, self.model.cfg.d_model, c.warmup, c.lr_scale)
        else:
            base = inverse_sqrt_lr(step, c.peak_lr, c.warmup)
        return base * cooldown_factor(step, c.max_steps, c.cooldown)

    def _set_dropout(self, step: int) -> float:
        """The ramped dropout for update ``step`` on every P_drop site (embeddings and
        sub-layer outputs; attention-weight dropout keeps model.attn_dropout), returned. A
        function of the step alone, so a resumed run continues exactly and every rank agrees."""
        c = self.cfg
        p = dropout_ramp(step, c.dropout_start, self.model.cfg.dropout, c.dropout_ramp)
        for m in self.model.modules():
            if isinstance(m, Dropout):
                m.p = p
        return p

    def _batches(self):
        """Micro-batches, epoch after epoch (the sampler continues where it stopped)."""
        while True:
            if self.cfg.max_epochs and self.sampler.state_dict()["epoch"] >= self.cfg.max_epochs:
                return
            for idx in self.sampler:  # while it yields, sampler.epoch is the batch's epoch
                examples = self.examples(self.sampler.epoch)
                yield collate([examples[i] for i in idx], self.model.cfg.pad_id,
                              self.model.cfg.bos_id, self.model.cfg.eos_id).to(self.device)

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self.stop_signal = signal.Signals(signum).name

    def _agreed_stop(self, early_stop: bool) -> str | None:
        """Why to stop now, the same answer on every rank (a signal or the clock may reach
        one rank first; rank 0 alone validates)."""
        c = self.cfg
        over_time = bool(c.max_minutes) and self.elapsed >= c.max_minutes * 60
        early, sig, over = self.dist.any([int(early_stop), SIGNAL_CODES.get(self.stop_signal or "", 0), int(over_time)])
        if early:
            return "early_stop"
        if sig:
            return {v: k for k, v in SIGNAL_CODES.items()}[sig]
        return "max_minutes" if over else None

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
                t0 = time.perf_counter()  # the clock counts making the batches too
                micro = [b for _, b in zip(range(c.accum_steps), batches)]
                if not micro:  # every rank has the same number of batches an epoch
                    reason = "max_epochs"
                    break
                self.model.train()
                dropout = self._set_dropout(self.step + 1) if c.dropout_ramp else None
                stats = train_step(self.model, micro, self.optimizer, self.lr(self.step + 1),
                                   epsilon=c.label_smoothing, clip_norm=c.clip_norm or None,
                                   amp_dtype=self.amp_dtype, grad_scaler=self.scaler, forward=self.forward,
                                   loss_kernels=self.loss_kernels)
                self.elapsed += time.perf_counter() - t0
                early_stop = False
                if stats.skipped:  # on every rank alike: train_step all-reduces the verdict
                    self.bad_steps += 1
                    self._metrics({"event": "skipped_step", "step": self.step, "loss": stats.loss})
                    if self.bad_steps >= c.max_bad_steps:
                        saved = self.save()  # skipped updates leave the weights as they were: good
                        raise UserError(f"{self.bad_steps} consecutive updates had a non-finite loss or "
                                        f"gradient; stopping. The last good checkpoint is {saved}; "
                                        "try a lower learning rate or precision=fp32")
                else:
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
                        if dropout is not None:
                            rec["dropout"] = dropout
                        self._metrics(rec)
                        if bar is not None:
                            bar.set_postfix(loss=f"{stats.loss:.3f}", tok_s=f"{tps:,.0f}", lr=f"{stats.lr:.2e}")
                        window_tokens, window_start = 0, now
                    if self.step % c.eval_every == 0:
                        early_stop = self.evaluate() == "early_stop"
                    if self.step % c.save_every == 0:
                        self.save()
                        last_saved = self.step
                stop = self._agreed_stop(early_stop)
                if stop:
                    reason = stop
                    break
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if bar is not None:
                bar.close()
        # The last evaluation comes before the last save, so that the checkpoint holds its BLEU
        # (a resumed run must not take a worse model for the best one).
        final_eval = reason not in ("SIGINT", "SIGTERM") and bool(self.data.valid) and self.step % c.eval_every != 0
        if final_eval:
            self.evaluate()
        if self.step != last_saved or not self.has_checkpoint or final_eval:
            self.save()
        if not self.dist.is_main:
            return {"step": self.step, "reason": reason, "best_bleu": self.best_bleu,
                    "train_minutes": self.elapsed / 60}
        if reason not in ("SIGINT", "SIGTERM") and c.average_last > 1:
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
            gold = m.output_positions(b.tgt_out).masked_fill(b.tgt_out == m.cfg.pad_id, -1)
            with autocast(self.device, self.amp_dtype):  # ids outside the output vocabulary: left out
                logits = m(b.src, b.tgt_in, gold >= 0)
            _, nll, k = label_smoothed_nll_loss(logits, gold[gold >= 0], 0.0, -1)
            nll_sum, n = nll_sum + float(nll), n + int(k)
        return nll_sum / max(n, 1)

    def evaluate(self) -> str | None:
        """Validation loss and greedy BLEU, on rank 0 with the unwrapped model (the other
        ranks wait); "early_stop" when patience has run out."""
        if not self.data.valid or not self.dist.is_main:
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
        if not self.dist.is_main:
            return
        try:
            with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:
            raise UserError(f"{self.run_dir / 'metrics.jsonl'}: cannot write ({e.strerror or e})") from None
        if self.writer is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.writer.add_scalar(k, v, rec.get("step", self.step))

    def _open_writer(self) -> None:
        if not self.cfg.tensorboard or not self.dist.is_main:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("tensorboard=true needs the tensorboard package: pip install tensorboard") from None
        self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    def _progress(self):
        if not self.cfg.progress or not self.dist.is_main:
            return None
        from tqdm import tqdm

        return tqdm(total=self.cfg.max_steps, initial=self.step, unit="step", dynamic_ncols=True, mininterval=1.0)

    def _plot(self) -> None:
        from .plots import plot_learning_curve

        try:
            plot_learning_curve(self.run_dir / "metrics.jsonl", self.run_dir / "learning_curve.png")
        except Exception as e:  # noqa: BLE001 - a plot must never lose a finished run
            self.log(f"warning: could not draw the learning curve ({e})")
