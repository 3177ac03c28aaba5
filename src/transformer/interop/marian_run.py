"""A Hugging Face Marian (OPUS-MT) folder -> a translation run directory that every command
reads (``translate``, ``evaluate``, ``serve``, ``info``, ``attention``, ``explain``).

What the run holds:

    best.safetensors       the weights (:func:`~transformer.interop.marian.from_marian`), with
                           their model config in the metadata, as every run's weights
    config.yaml            the languages, ``model:`` (the weights' config) and ``decoding:``
                           from ``generation_config.json`` (below)
    source.spm, target.spm, vocab.json, target_vocab.json (separate vocabularies only),
    tokenizer_config.json  the tokenizer's files, copied unchanged
                           (:class:`~transformer.data.marian_tokenizer.MarianSubwords` reads them)
    import.json            where it came from (as :mod:`.hf_import` writes it for language models)

Decoding settings. ``num_beams`` -> ``beam``; the length limit -> ``max_len_b`` with
``max_len_a = 0``, so that a translation that runs to the limit is as long as ``generate``'s
(:func:`output_limit`);
``length_penalty`` -> ``alpha`` with ``length_norm: length`` (scores divided by len ** alpha,
as HF does). The searches then pick the same tokens as ``generate`` where the two stop
alike: greedy always, beam search with ``length_penalty`` 0; with another length penalty HF
stops a search by a heuristic bound (``early_stopping=False``) where ours stops when no live
hypothesis can beat the finished ones, so ours may find a better-scored translation, and a
hypothesis that reaches the length limit differs too (HF's forced EOS scores 0, ours keeps
its log-probability). PAD is never
produced, as OPUS-MT's ``bad_words_ids = [[pad]]`` asks. import.json lists, under
``decoding_differences``, the generation settings of the folder that our search does not
follow (:func:`generation_differences`).

Reading: tensor by tensor, by name, from the folder's weight files (``model.safetensors``, its
shards, or a ``pytorch_model.bin`` under ``torch.load(weights_only=True, mmap=True)``) with
:class:`~.hf_files.HFWeights`, as the language-model import reads them. Each tensor is renamed
(:func:`~transformer.interop.marian.name_map`) and streamed into ``best.safetensors`` in blocks
of rows, so the import holds a few MB of a safetensors checkpoint's weights at a time; it builds
no ``MarianMTModel`` and no model of ours. ``config.json`` and ``generation_config.json`` are
read as ``from_pretrained`` reads them (``MarianConfig``, ``GenerationConfig``, local files
only); no code from the folder is run, and nothing outside it is read (:mod:`.hf_folder`). The
sizes of config.json are checked against the tensors' shapes before any name is listed
(:mod:`.hf_sizes`). The embeddings are those HF's tying makes of the
checkpoint (:func:`embedding_names`); a missing ``final_logits_bias`` is zeros, as in HF. HF
builds its sinusoid tables itself unless the checkpoint stores them (older OPUS-MT conversions
do): a stored one must be ours.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..data.marian_tokenizer import (MARIAN_FILES, TARGET_VOCAB, TOKENIZER_CONFIG, MarianSubwords)
from ..errors import UserError
from ..extras import require
from ..run.layout import BEST, CONFIG, IMPORT_RECORD

__all__ = ["import_marian_run", "decoding_from_generation", "output_limit", "generation_differences", "embedding_names"]

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")

# What generate() uses for a setting the generation config leaves unset (transformers 5
# stores None and applies these when generating).
_GENERATE_DEFAULTS = {"num_beams": 1, "length_penalty": 1.0}
_GENERATE_NEW_TOKENS = 20  # and, with neither max_length nor max_new_tokens, this many new tokens


def import_marian_run(source: Path, out: Path) -> None:
    """Write the run directory of the Marian folder ``source`` as ``out`` (new, or an
    empty folder), all at once: it is filled beside ``out`` and renamed into place, so a
    failed import leaves no ``out``. UserError, one line, for a folder that is not a
    complete Marian model or holds one our model cannot express."""
    from ..run.weights import FORMAT
    from .hf_files import HFWeights, write_safetensors
    from .hf_folder import copy_in, refuse_outside_links, write_new, write_run
    from .hf_sizes import check_sizes
    from .marian import check_positions, config_from_marian, name_map, tensor_shapes

    source, out = Path(source), Path(out)
    _check_folder(source)
    refuse_outside_links(source)
    tokenizer = MarianSubwords.load(source)
    weights = HFWeights(source)
    check_sizes("marian", source, weights)
    hf_config, gen = _read_configs(source)
    embeddings = embedding_names(hf_config, weights)
    try:
        cfg = config_from_marian(hf_config, _tied(hf_config, weights, embeddings), hf_config.vocab_size,
                                 _target_vocab(hf_config))
        stored = [f"model.{stack}.embed_positions.weight" for stack in ("encoder", "decoder")]
        check_positions(cfg, [weights.get(name) for name in stored if name in weights], "from_marian")
    except ValueError as e:
        raise UserError(f"{source}: {e}") from None
    _check_tokenizer(source, tokenizer, cfg)
    entries = [(ours, embeddings.get(ours, theirs)) for ours, theirs in name_map(cfg)]
    shapes = tensor_shapes(cfg)
    dtype = weights.dtype(entries[0][1])  # the model takes its embedding's dtype, as from_pretrained does
    header = [(ours, shapes[ours], dtype) for ours, _ in entries]

    def tensors():  # in blocks of rows: the embeddings are never whole in memory
        for ours, theirs in entries:
            if ours == "out_bias":  # final_logits_bias (1, V); HF starts it at zero when a checkpoint has none
                bias = weights.get(theirs) if theirs in weights else torch.zeros(shapes[ours])
                yield ours, bias.reshape(-1).to(dtype)
            else:
                for block in weights.row_blocks(theirs):
                    yield ours, block.to(dtype)

    files = [name for name in (*MARIAN_FILES, TARGET_VOCAB, TOKENIZER_CONFIG)
             if (source / name).is_file() and (name != TARGET_VOCAB or tokenizer.separate)]
    record = {"source": str(source), "family": "marian", "model_type": "marian", "tokenizer": files,
              "weights": sorted(name for name in _WEIGHT_FILES if (source / name).is_file()),
              "pad_id": cfg.pad_id, "tie_embeddings": cfg.tie_embeddings,
              "decoding_differences": generation_differences(gen, cfg.pad_id)}
    meta = {"model_config": json.dumps(cfg.to_dict()), "format": FORMAT, "imported_from": "marian"}

    def fill(tmp: Path) -> None:
        write_safetensors(tmp / BEST, header, tensors(), meta)
        for name in files:
            copy_in(source / name, tmp / name)
        write_new(tmp / CONFIG, _run_config(source, gen, cfg))
        write_new(tmp / IMPORT_RECORD, json.dumps(record, indent=1) + "\n")

    write_run(out, fill)


def embedding_names(hf_config, weights) -> dict[str, str]:
    """Our embeddings and head (``src_embed.weight``, ``tgt_embed.weight``, ``out_proj.weight``)
    -> the checkpoint's tensor that ``MarianMTModel.from_pretrained`` puts there. With
    ``tie_word_embeddings`` HF ties them (transformers 5): all three to ``model.shared`` when
    the encoder and decoder share embeddings, else the head to the decoder's embedding; a tied
    group takes its first tensor the checkpoint has. Otherwise each has its own."""
    from .marian import EMBEDDINGS

    names = dict(EMBEDDINGS)
    if getattr(hf_config, "tie_word_embeddings", False):
        src, tgt, head = EMBEDDINGS.values()
        group = ["model.shared.weight", src, tgt, head] if _shared(hf_config) else [tgt, head]
        found = next((name for name in group if name in weights), group[0])
        names.update({ours: found for ours, theirs in EMBEDDINGS.items() if theirs in group})
    return names


def _shared(hf_config) -> bool:
    return bool(getattr(hf_config, "share_encoder_decoder_embeddings", True))


def _target_vocab(hf_config) -> int:
    """The decoder's vocabulary as HF sizes it: the source's when the embeddings are shared."""
    return int(hf_config.vocab_size if _shared(hf_config) else hf_config.decoder_vocab_size)


def _tied(hf_config, weights, names: dict[str, str]) -> bool:
    """Whether our model ties its embeddings: HF's three matrices are one tensor, or hold the
    same values (read two at a time)."""
    src, tgt, head = (names[ours] for ours in ("src_embed.weight", "tgt_embed.weight", "out_proj.weight"))
    if src == tgt == head:
        return True
    if hf_config.vocab_size != _target_vocab(hf_config):
        return False

    def same(a: str, b: str) -> bool:
        return a == b or torch.equal(weights.get(a), weights.get(b))
    return same(src, tgt) and same(tgt, head)


def _setting(gen, name: str):
    """A ``GenerationConfig`` setting as ``generate`` applies it (its default when unset)."""
    value = getattr(gen, name, None)
    return _GENERATE_DEFAULTS.get(name) if value is None else value


def output_limit(gen, max_len: int, eos_id: int) -> int:
    """Our ``max_len_b`` for ``generate``'s length limit: the most tokens a translation gets,
    the EOS that ours forces at the limit included.

    ``generate`` makes at most N new tokens: ``max_new_tokens``; else ``max_length`` less the
    start token it counts; else, unset, 20 new tokens with the start within
    ``max_position_embeddings`` (our ``max_len``). With ``forced_eos_token_id`` (OPUS-MT's) the
    N-th is EOS, as ours is at a limit of N; without it, the N-th is a word and the output stops
    there, so ours gets N + 1 (N words, then the EOS that is not shown)."""
    if getattr(gen, "max_new_tokens", None):
        n = int(gen.max_new_tokens)
    elif getattr(gen, "max_length", None) is not None:
        n = int(gen.max_length) - 1
    else:
        n = min(_GENERATE_NEW_TOKENS, max_len - 1)
    forced = getattr(gen, "forced_eos_token_id", None)
    ends_with_eos = forced == eos_id or (isinstance(forced, (list, tuple)) and eos_id in forced)
    return max(1, min(n if ends_with_eos else n + 1, max_len))


def decoding_from_generation(gen, max_len: int, eos_id: int) -> dict:
    """Our ``decoding:`` settings for a ``transformers.GenerationConfig`` (module docstring);
    ``max_len``: the model's, which caps the output length; ``eos_id``: the model's EOS."""
    return {"beam": max(int(_setting(gen, "num_beams")), 1), "alpha": float(_setting(gen, "length_penalty")),
            "length_norm": "length", "max_len_a": 0.0, "max_len_b": output_limit(gen, max_len, eos_id)}


def generation_differences(gen, pad_id: int) -> list[str]:
    """The settings of a ``GenerationConfig`` that our search does not follow, in a few words
    each (import.json lists them): where ``generate`` can give other output than ours."""
    found = []
    if _setting(gen, "num_beams") > 1 and _setting(gen, "length_penalty") != 0 and _setting(gen, "early_stopping") \
            is not True:
        found.append("early_stopping: HF stops a beam search by a heuristic bound (a length penalty makes it "
                     "inexact), ours when no live hypothesis can beat the finished ones")
    if _setting(gen, "do_sample"):
        found.append("do_sample: translation searches, it does not sample")
    if _setting(gen, "renormalize_logits"):
        found.append("renormalize_logits: ours does not renormalise after blocking PAD")
    # early_stopping: False and "never" find the best hypothesis as ours does; True stops at
    # the first num_beams finished ones
    for name, neutral in (("no_repeat_ngram_size", (0,)), ("repetition_penalty", (1.0,)), ("min_length", (0,)),
                          ("min_new_tokens", (0,)), ("num_beam_groups", (1,)), ("early_stopping", (False, "never"))):
        value = _setting(gen, name)
        if value is not None and value not in neutral:
            found.append(f"{name}={value!r}: not carried over")
    if _setting(gen, "bad_words_ids") not in (None, [[pad_id]]):
        found.append(f"bad_words_ids={_setting(gen, 'bad_words_ids')!r}: ours blocks PAD only")
    return found


def _check_folder(source: Path) -> None:
    if not source.is_dir():
        raise UserError(f"{source}: not a folder; give a Hugging Face Marian folder (config.json, weights, "
                        "source.spm, target.spm, vocab.json)")
    if not (source / "config.json").is_file():
        raise UserError(f"{source}: no config.json; not a Hugging Face model folder")
    if not any((source / name).is_file() for name in _WEIGHT_FILES):
        raise UserError(f"{source}: no weights (model.safetensors or pytorch_model.bin)")
    for name in MARIAN_FILES:
        if not (source / name).is_file():
            raise UserError(f"{source}: no {name}; a Marian model's tokenizer needs {', '.join(MARIAN_FILES)}")


def _read_configs(source: Path):
    """The folder's ``MarianConfig`` and ``GenerationConfig``, as ``MarianMTModel.from_pretrained``
    reads them: generation_config.json, else the generation settings of config.json."""
    require("transformers", "interop", "importing a Marian model")
    from transformers import GenerationConfig, MarianConfig

    try:
        hf_config = MarianConfig.from_pretrained(source, local_files_only=True)
        try:
            gen = GenerationConfig.from_pretrained(source, local_files_only=True)
        except OSError:  # no generation_config.json
            gen = GenerationConfig.from_pretrained(source, config_file_name="config.json", _from_model_config=True,
                                                   local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{source}: cannot read the Marian model ({first})") from None
    return hf_config, gen


def _check_tokenizer(source: Path, tok: MarianSubwords, cfg) -> None:
    """The tokenizer's ids must be the model's: the same EOS and PAD, and no id beyond the
    embeddings."""
    if (tok.eos_id, tok.pad_id) != (cfg.eos_id, cfg.pad_id):
        raise UserError(f"{source}: the tokenizer's </s> and <pad> are ids {tok.eos_id} and {tok.pad_id}, the "
                        f"model's eos_token_id and pad_token_id {cfg.eos_id} and {cfg.pad_id}")
    for side, size, limit in (("source", tok.source_vocab_size, cfg.vocab_size),
                              ("target", tok.vocab_size, cfg.target_vocab_size)):
        if size > limit:
            raise UserError(f"{source}: the {side} vocabulary has ids up to {size - 1}, the model only {limit}")


def _run_config(source: Path, gen, cfg) -> str:
    """config.yaml: a training config's keys only (so that every command that reads one,
    ``explain --training`` and ``init_from`` among them, reads this one): the languages, the
    model and the decoding settings. Where it came from is in import.json."""
    import yaml

    tokenizer = {}
    if (source / TOKENIZER_CONFIG).is_file():
        tokenizer = json.loads((source / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
    config = {"src_lang": tokenizer.get("source_lang"), "tgt_lang": tokenizer.get("target_lang"),
              "model": cfg.to_dict(), "decoding": decoding_from_generation(gen, cfg.max_len, cfg.eos_id)}
    header = ("# A Marian model imported by `transformer import`: the model's config, and decoding settings from\n"
              "# its generation_config.json (alpha and length_norm: HF's length_penalty).\n")
    return header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
