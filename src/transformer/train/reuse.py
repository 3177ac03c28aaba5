"""What a new run takes from earlier work: a trained run's weights, vocabulary and
architecture (``init_from``: fine-tuning, with a fresh optimizer and schedule), and for
translation a subword model (``subwords_from``) or pretrained word vectors (``embedding_init``).

A language model's fine-tune (``init_from`` on dataset text, tinyshakespeare or
multi30k-mono) starts from a decoder-only run of ours or an imported one, and trains on the
new text with the source's tokenizer: every tokenizer file of the source run
(:data:`TOKENIZER_FILES`) is copied into the new run, and no vocabulary is learned.

Everything but the word vectors is read and checked before the run directory is written to.
A resumed run reads none of it again: its checkpoint holds the weights (and, in their
metadata, the model config), its directory the copied vocabulary; so resuming cannot
re-apply init_from over the resumed weights, stays exact, and needs no source any more.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from ..model.config import PRESETS, ModelConfig
from ..data import Subwords
from ..data.text import load_tokenizer
from ..data.word_vectors import init_from_word_vectors
from ..errors import UserError
from ..model import Transformer
from ..run import files, layout, weights
from .train_config import TrainConfig
from .prepare import MAIN_TOKENIZER_FILES, TOKENIZER_FILES

# ModelConfig fields a fine-tune may change: the weights fit either way (the positional
# table is computed, not trained; learned positions keep max_len, see finetune_model_config).
FREE = ("dropout", "attn_dropout", "max_len")


@dataclass(frozen=True)
class Source:
    """``init_from``, read: the weights it stands for and the subword model of their run."""

    given: str  # the path as the config gives it
    weights: Path
    model: ModelConfig
    tensors: dict[str, torch.Tensor]
    subwords: Path | None  # a translation run's
    tokenizer: dict[str, Path] = dataclasses.field(default_factory=dict)  # a language model's files, by name


@dataclass(frozen=True)
class Start:
    """How a run's model starts. ``base_model``: the model a fine-tune continues (init_from's
    config, or when resuming one, its checkpoint's); None builds the config's own model."""

    cfg: TrainConfig
    resuming: bool
    source: Source | None = None  # init_from, on a new run
    subwords: Path | None = None  # the subword model to copy in, on a new run
    base_model: ModelConfig | None = None

    @property
    def tokenizer_files(self) -> dict[str, Path]:
        """A new language-model fine-tune: its source's tokenizer files to copy in, by name."""
        return self.source.tokenizer if self.source is not None and not self.resuming else {}

    @classmethod
    def resolve(cls, cfg: TrainConfig, run_dir: Path) -> "Start":
        """Read and check init_from and subwords_from (a new run) or the checkpoint's model
        config (a resumed fine-tune). Raises UserError naming the option."""
        resuming = layout.latest_checkpoint(run_dir) is not None
        if cfg.is_language_model and not cfg.init_from:
            return cls(cfg, resuming)
        if resuming:
            return cls(cfg, True, base_model=checkpoint_model(run_dir) if cfg.init_from else None)
        if cfg.is_language_model:
            source = read_lm_source(cfg.init_from)
            start = cls(cfg, False, source, None, source.model)
            model = start.model_config(source.model.vocab_size)  # a conflicting architecture is refused now
            if cfg.context > model.max_len:
                raise UserError(f"config: context {cfg.context} is longer than the positions of init_from "
                                f"{cfg.init_from} allow (max_len {model.max_len}); lower context")
            return start
        source = read_source(cfg.init_from) if cfg.init_from else None
        subwords = subwords_file(cfg, source)
        if subwords is not None:
            check_vocabulary(cfg, subwords, source)
        start = cls(cfg, False, source, subwords, source.model if source else None)
        if source is not None:
            start.model_config(source.model.vocab_size)  # a conflicting architecture is refused now
        return start

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The config of the model to build for ``vocab_size`` subwords."""
        if self.base_model is None:
            return self.cfg.model_config(vocab_size)
        return finetune_model_config(self.cfg, self.base_model)

    def initialise(self, model: torch.nn.Module, subwords: Subwords | None, log=print) -> None:
        """A new run: init_from's weights, or embedding_init's vectors, into ``model``."""
        if self.resuming:
            return
        if self.source is not None:
            weights.load_weights_into(model, self.source.tensors, self.source.weights)
            log(f"init_from: the weights of {self.source.weights}; a fresh optimizer and learning-rate schedule")
        elif self.cfg.embedding_init:
            init_embeddings(model, self.cfg, subwords, log)


def read_source(given: str) -> Source:
    """init_from's weights (a run directory: averaged, else best, else its latest checkpoint)
    and their run's subword model, checked against each other."""
    try:
        path = layout.resolve_weights(given)
        model, tensors, meta = weights.read_weights(path)
        subwords = layout.find_subwords(path)
    except UserError as e:
        raise UserError(f"init_from: {e}") from None
    if model.decoder_only:
        raise UserError(f"init_from: {path} is a decoder-only language model; fine-tuning takes a translation model")
    sha = meta.get(f"{Path(layout.SUBWORDS).stem}_sha256")
    if sha is not None and sha != files.file_sha256(subwords):
        raise UserError(f"init_from: {path} was trained with another subword model than {subwords}; "
                        "restore the run's own subwords.model")
    return Source(given, path, model, tensors, subwords)


def read_lm_source(given: str) -> Source:
    """init_from's weights for a language model (a run of ours or an imported one) and the
    tokenizer files of their run, checked against each other."""
    try:
        path = layout.resolve_weights(given)
        model, tensors, meta = weights.read_weights(path)
        if not model.decoder_only:
            raise UserError(f"{path} is a translation model; a language model (dataset text, tinyshakespeare, "
                            "multi30k-mono) fine-tunes a decoder-only one")
        tokenizer = load_tokenizer(path)
    except UserError as e:
        raise UserError(f"init_from: {e}") from None
    found = tokenizer_files(path)
    main = next(found[name] for name in MAIN_TOKENIZER_FILES if name in found)
    sha = meta.get(f"{main.stem}_sha256")
    if sha is not None and sha != files.file_sha256(main):
        raise UserError(f"init_from: {path} was trained with another {main.name} than {main}; "
                        f"restore the run's own {main.name}")
    if tokenizer.vocab_size > model.vocab_size:
        raise UserError(f"init_from: {main} holds {tokenizer.vocab_size} tokens but {path} has embedding rows for "
                        f"{model.vocab_size}; the weights and the tokenizer are of different runs")
    return Source(given, path, model, tensors, None, found)


def tokenizer_files(path: Path) -> dict[str, Path]:
    """The tokenizer files of the run that ``path`` belongs to, by name: those of
    :data:`TOKENIZER_FILES` in the folder of its main one (chars.json, subwords.model, ...)."""
    main = layout.run_file(path, *MAIN_TOKENIZER_FILES)  # the nearest folder's
    if main is None:
        raise UserError(f"init_from: {path}: no tokenizer ({', '.join(MAIN_TOKENIZER_FILES)}) beside the weights")
    return {name: main.parent / name for name in TOKENIZER_FILES if (main.parent / name).is_file()}


def subwords_file(cfg: TrainConfig, source: Source | None) -> Path | None:
    """The subword model a new run copies in: init_from's, or subwords_from's (the two must
    be the same model); None: learn one."""
    own = _subwords_path(cfg.subwords_from) if cfg.subwords_from else None
    if source is None:
        return own
    if own is not None and files.file_sha256(own) != files.file_sha256(source.subwords):
        raise UserError(f"subwords_from {own} and init_from {source.given} name different subword models; "
                        f"leave subwords_from out (init_from brings {source.subwords})")
    return source.subwords


def _subwords_path(given: str) -> Path:
    path = Path(given)
    if not path.exists():
        raise UserError(f"subwords_from: {path}: no such file or run directory")
    if path.is_file() and path.suffix != ".safetensors":
        return path
    try:
        return layout.find_subwords(path)
    except UserError as e:
        raise UserError(f"subwords_from: {e}") from None


def check_vocabulary(cfg: TrainConfig, path: Path, source: Source | None) -> None:
    """The reused subword model agrees with lowercase and init_from's embeddings. (vocab_size
    sizes a vocabulary to learn; a reused one has its own size.)"""
    option = "init_from" if source is not None else "subwords_from"
    try:
        sw = Subwords.load(path)
    except UserError as e:
        raise UserError(f"{option}: {e}") from None
    rows = {source.model.vocab_size, source.model.target_vocab_size} if source is not None else {sw.vocab_size}
    if rows != {sw.vocab_size}:
        raise UserError(f"init_from: {source.weights} has embedding rows for {' and '.join(map(str, sorted(rows)))} "
                        f"pieces but {path} holds {sw.vocab_size}; the weights and the subword model are of "
                        "different runs")
    if sw.lowercases != cfg.lowercase:
        raise UserError(f"{option}: {path} {'lower-cases' if sw.lowercases else 'keeps case'} but the config "
                        f"says lowercase: {str(cfg.lowercase).lower()}; set lowercase: {str(sw.lowercases).lower()}")


def finetune_model_config(cfg: TrainConfig, base: ModelConfig) -> ModelConfig:
    """``base`` (the source's model) with the model section's dropout, attn_dropout and
    max_len. Every other key the section sets, itself or through its preset, must agree."""
    section = dict(cfg.model)
    preset = section.pop("preset", None)
    unknown = sorted(set(section) - {f.name for f in dataclasses.fields(ModelConfig)})
    if unknown:
        raise UserError(f"config: model: unknown keys {unknown}")
    wanted = {**(PRESETS[preset] if preset else {}), **section}
    free = FREE if base.positions != "learned" else tuple(k for k in FREE if k != "max_len")  # a table of max_len rows
    for key, value in wanted.items():
        if key in free or key == "vocab_size" or getattr(base, key) == value:
            continue
        named = f"model.{key} is {value!r}" if key in section else f"model.preset {preset!r} has {key} {value!r}"
        raise UserError(f"config: {named} but init_from {cfg.init_from} was trained with {key} "
                        f"{getattr(base, key)!r}; leave the model section out to take init_from's architecture "
                        f"(only {', '.join(free)} may change)")
    try:
        return base.replace(**{k: v for k, v in wanted.items() if k in free})
    except (TypeError, ValueError) as e:
        raise UserError(f"config: model: {e}") from None


def checkpoint_model(run_dir: Path) -> ModelConfig:
    """The model config of a run's newest checkpoint that reads (resuming a fine-tune)."""
    error: UserError | None = None
    for path in reversed(layout.checkpoint_dirs(run_dir)):
        try:
            return weights.read_model_config(path / layout.WEIGHTS)
        except UserError as e:
            error = error or e
    raise error or UserError(f"{run_dir}: no checkpoint to resume")


def init_embeddings(model: Transformer, cfg: TrainConfig, subwords: Subwords, log=print) -> None:
    """embedding_init's vectors into the embedding rows of the pieces they hold: the one shared
    matrix of a tied model (encoder, decoder and output), else the source and target tables."""
    vocab = [subwords.id_to_piece(i) if subwords.is_normal(i) else None for i in range(subwords.vocab_size)]
    tables = list({id(t): t for t in (model.src_embed, model.tgt_embed)}.values())
    try:
        for table in tables:
            coverage = init_from_word_vectors(table, cfg.embedding_init, vocab, seed=cfg.seed)
    except (ValueError, OSError) as e:
        raise UserError(f"embedding_init: {e}") from None
    if coverage.found == 0:
        raise UserError(f"embedding_init: {cfg.embedding_init}: none of the {coverage.total:,} pieces of the subword "
                        f"model has a vector there; are these vectors of {cfg.src_lang}/{cfg.tgt_lang} words?")
    d, dim = model.cfg.d_model, coverage.dim
    size = ("" if dim == d else f"; {dim}-dim vectors reduced to their {d} principal directions" if dim > d
            else f"; {dim}-dim vectors mapped orthogonally to {d} dimensions")
    shared = "the shared embedding" if len(tables) == 1 else "the source and target embeddings"
    log(f"embedding_init: {coverage} in {cfg.embedding_init} ({shared}{size})")
