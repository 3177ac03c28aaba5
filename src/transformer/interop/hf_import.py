"""A Hugging Face model folder (or hub id) as an ordinary run directory: ``transformer import``.

    RUN/best.safetensors        our weights with their model config (what every command reads)
    RUN/config.yaml             ``model:`` that config; ``decoding:`` from generation_config.json
    RUN/tokenizer.json          the model's own tokenizer (:mod:`transformer.data.hf_tokenizer`),
    RUN/tokenizer_config.json   or tokenizer.model (sentencepiece, Llama 2 without a tokenizer.json)
    RUN/import.json             where it came from: source, family, files

Families: GPT-2, Llama (2 and 3, with llama3 rope scaling), Mistral (no sliding window),
Qwen2 / Qwen2.5 (:mod:`.hf_lm`); ``model_type: marian`` becomes a translation run
(:mod:`.marian_run`). Anything else is refused in one line naming what is not supported.

The weights are converted one tensor at a time and streamed into the new file, so an import
holds about one tensor in memory, not the model; they keep the checkpoint's dtype. The run is
built in a folder beside RUN and renamed at the end: an import that fails leaves no RUN.
Nothing outside the folder is read (a link out of it is refused: :mod:`.hf_folder`), and
config.json's sizes are checked against the tensors before anything is built (:mod:`.hf_sizes`).

Padding: our model reads the id ``pad_id`` as padding wherever it occurs (generation marks
its padding itself, so there any id works). The import chooses an id that text does not
encode to: the first embedding row beyond the tokenizer's (Qwen pads its vocabulary), else a
special token that is neither BOS nor EOS (Llama 3's reserved ones); else the config's
``pad_token_id`` or the rule of :func:`~transformer.interop._hf.special_ids`. GPT-2 has no
such id: its ``pad_id`` is a real token (import.json names it), read as padding by a plain
forward pass over text that contains it.
"""
from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..model.config import ModelConfig
from ..data.hf_tokenizer import HF_TOKENIZER, SP_TOKENIZER, TOKENIZER_CONFIG, load_pretrained_tokenizer, read_json
from ..errors import UserError
from ..extras import require
from ..model.lm import LanguageModel
from ..run.layout import BEST, CONFIG, IMPORT_RECORD
from ..run.weights import FORMAT
from .hf_files import HFWeights, write_safetensors
from .hf_folder import copy_in, refuse_outside_links, write_new, write_run
from .hf_sizes import check_sizes
from .hf_lm import FAMILIES, LLAMA_SHAPED, name_map, tensors_from_hf

# what a hub download fetches: configs, safetensors weights, tokenizers (Marian's *.spm too);
# pytorch_model.bin only for a repository without safetensors weights (HUB_FALLBACK)
HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.spm", "*.txt"]
HUB_FALLBACK = ["pytorch_model*.bin"]
SAMPLING_DEFAULTS = dict(temperature=1.0, top_k=50, top_p=1.0)  # HF's when do_sample is on


@dataclass(frozen=True)
class Imported:
    """What :func:`import_pretrained` wrote."""

    run: Path
    family: str
    cfg: ModelConfig | None  # None for a translation run (Marian)
    tokenizer: str
    parameters: int
    notes: tuple[str, ...] = ()  # warnings: generation_config.json's values left out, unused tensors


def _read_json(path: Path) -> dict:
    data = read_json(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


def fetch(source: str) -> tuple[Path, str]:
    """The local folder for ``source`` (a folder, or a hub id downloaded with
    ``huggingface_hub.snapshot_download``) and how to name it in import.json."""
    if not source.strip():  # Path("") is the current folder
        raise UserError("SOURCE is empty; give a Hugging Face model folder or a hub id (name or owner/name)")
    path = Path(source)
    if path.is_dir():
        return path, str(path.resolve())
    if path.exists() or source.count("/") > 1 or source.startswith((".", "/")):
        raise UserError(f"{source}: not a model folder (one with config.json) or a hub id (name or owner/name)")
    hub = require("huggingface_hub", "interop", f"transformer import {source} (a hub id: {source} is no folder here)")
    try:
        folder = Path(hub.snapshot_download(repo_id=source, allow_patterns=HUB_FILES))
        if not any(folder.glob("*.safetensors")):  # an older repository: its pickled weights, read as tensors only
            folder = Path(hub.snapshot_download(repo_id=source, allow_patterns=HUB_FILES + HUB_FALLBACK))
        return folder, f"hf://{source}"
    except Exception as e:  # network, authentication, a missing repository: all one line
        raise UserError(f"{source}: cannot download from the hub ({type(e).__name__}: {str(e).splitlines()[0]})") \
            from None


def decoding_defaults(folder: Path) -> tuple[dict, list[str]]:
    """The ``decoding`` section for generation_config.json: greedy unless it samples (as HF's
    ``generate``), its temperature / top_k / top_p when it does, and max_new_tokens; and a
    note for each value our decoding refuses (a temperature "hot", top_p 1.5, max_new_tokens
    0), which is left out: the run decodes with the default, instead of every command on it
    refusing its config.yaml."""
    from ..decode.decoding_config import FIELDS, DecodingConfig

    path = folder / "generation_config.json"
    g = _read_json(path) if path.is_file() else {}
    out: dict = {"temperature": 0.0}
    given = {key: g.get(key) for key in (SAMPLING_DEFAULTS if g.get("do_sample") else ())}
    given["max_new_tokens"] = g.get("max_new_tokens")
    notes = []
    for key, value in given.items():
        if isinstance(value, float) and value.is_integer() and key in ("top_k", "max_new_tokens"):
            value = int(value)  # top_k 50.0
        if value is not None:
            try:
                value = getattr(DecodingConfig(**{key: value}), key)  # checked; an int temperature as a float
            except (ValueError, TypeError) as e:
                notes.append(f"{path}: {e}; the run decodes with {key} {SAMPLING_DEFAULTS.get(key, FIELDS[key])} "
                             f"(give --{key.replace('_', '-')} to choose)")
                value = None
        if value is None:
            value = SAMPLING_DEFAULTS.get(key)  # sampling: HF's default; max_new_tokens: ours, unwritten
        if value is not None:
            out[key] = value
    return out, notes


def stop_ids(folder: Path, hf_config, eos_id: int, vocab_size: int) -> list[int]:
    """The ids that end a generation: every ``eos_token_id`` of generation_config.json and
    config.json (Llama 3 Instruct lists three), the model's EOS first; an id outside the
    vocabulary, which no generation produces, is left out (an export names the stop tokens)."""
    path = folder / "generation_config.json"
    found = [eos_id]
    for eos in ((_read_json(path) if path.is_file() else {}).get("eos_token_id"),
                getattr(hf_config, "eos_token_id", None)):
        for i in (eos if isinstance(eos, (list, tuple)) else [eos]):
            if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size and i not in found:
                found.append(i)
    return found


# Buffers some checkpoints hold beside the weights: GPT-2's causal mask, an old rotary table.
BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def unused_tensors(weights: HFWeights, used: set[str], tied: bool) -> list[str]:
    """The checkpoint's tensors that no weight of the model comes from, buffers aside (and a
    tied model's lm_head, which HF ties to the embedding as well): a config.json that
    describes fewer layers than the checkpoint has read the first ones and said nothing."""
    used = {n.removeprefix("transformer.") for n in used}
    return sorted(n for n in weights.names() if n.removeprefix("transformer.") not in used
                  and not n.endswith(BUFFERS) and not (tied and n == "lm_head.weight"))


def _model_type(folder: Path) -> str:
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder}: no config.json; give a Hugging Face model folder")
    model_type = _read_json(folder / "config.json").get("model_type")
    if model_type is None:
        raise UserError(f"{folder / 'config.json'}: no model_type; transformer import reads the config.json "
                        f"save_pretrained writes, with model_type {', '.join(FAMILIES)} or marian")
    if model_type != "marian" and model_type not in FAMILIES:
        raise UserError(f"{folder}: model_type {model_type!r} is not supported; transformer import reads "
                        f"{', '.join(FAMILIES)} language models and marian translation models")
    return model_type


@contextmanager
def _hf_quiet():
    """transformers' own log lines kept off stderr (its "Model config: eos_token_id must be
    ... within the vocabulary" beside our one-line error saying the same)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _hf_config(folder: Path):
    require("transformers", "interop", __name__)
    from transformers import AutoConfig

    try:
        with _hf_quiet():
            return AutoConfig.from_pretrained(folder, trust_remote_code=False)  # an auto_map's code never runs
    except Exception as e:  # noqa: BLE001 (transformers' and huggingface_hub's errors for a config they refuse)
        cause = e.__cause__ or e  # a StrictDataclassClassValidationError says which check, its cause what
        raise UserError(f"{folder / 'config.json'}: {(str(cause).strip() or type(cause).__name__).splitlines()[0]}") \
            from None


def _save_tokenizer(folder: Path, into: Path) -> str:
    """Copy the model's tokenizer into the run: tokenizer.json as HF's AutoTokenizer sets it
    up (its post-processor adds what the tokenizer config asks, e.g. Llama's BOS), else the
    sentencepiece tokenizer.model; with tokenizer_config.json. Returns the file's name."""
    if (folder / TOKENIZER_CONFIG).is_file():
        copy_in(folder / TOKENIZER_CONFIG, into / TOKENIZER_CONFIG)
    if (folder / HF_TOKENIZER).is_file():
        backend = None
        try:
            from transformers import AutoTokenizer

            with _hf_quiet():
                backend = getattr(AutoTokenizer.from_pretrained(folder, trust_remote_code=False), "backend_tokenizer",
                                  None)
        except Exception:  # noqa: BLE001 (any failure there: the file as it is is the tokenizer)
            backend = None
        if backend is not None:
            write_new(into / HF_TOKENIZER, backend.to_str(pretty=True))  # as backend.save writes it
        else:
            copy_in(folder / HF_TOKENIZER, into / HF_TOKENIZER)
        return HF_TOKENIZER
    if (folder / SP_TOKENIZER).is_file():
        copy_in(folder / SP_TOKENIZER, into / SP_TOKENIZER)
        return SP_TOKENIZER
    raise UserError(f"{folder}: no tokenizer ({HF_TOKENIZER} or {SP_TOKENIZER}); the model cannot be used without "
                    "the tokenizer it was trained with")


def _padding_id(tokenizer, vocab: int, hf_config) -> int | None:
    """An id no text encodes to, for our ``pad_id``: the first embedding row beyond the
    tokenizer's, else a special token that is neither BOS nor EOS; None when there is none
    (then :func:`~transformer.interop._hf.special_ids` chooses)."""
    if tokenizer.vocab_size < vocab:
        return tokenizer.vocab_size
    eos = getattr(hf_config, "eos_token_id", None)
    eos = set(eos) if isinstance(eos, (list, tuple)) else {eos}
    pad = getattr(hf_config, "pad_token_id", None)
    if pad is not None and pad not in eos:
        return int(pad)  # the model's own padding token
    taken = eos | {getattr(hf_config, "bos_token_id", None)}
    free = [i for i in getattr(tokenizer, "special_ids", list)() if i not in taken]
    return free[0] if free else None


def _tied(hf_config, weights: HFWeights) -> bool:
    """Whether the head is the embedding: as the config says, or when the checkpoint has no
    lm_head (HF drops a tied one)."""
    return bool(getattr(hf_config, "tie_word_embeddings", False)) or "lm_head.weight" not in weights


def _config(family: str, hf_config, tie: bool, pad_id: int | None, folder: Path) -> ModelConfig:
    from .gpt2 import config_from_gpt2
    from .llama import config_from_llama

    try:
        with _hf_quiet():
            if family in LLAMA_SHAPED:
                return config_from_llama(hf_config, tie, pad_id)
            return config_from_gpt2(hf_config, tie, pad_id)
    except ValueError as e:
        what = str(e).replace("from_llama: ", "").replace("from_gpt2: ", "")
        raise UserError(f"{folder / 'config.json'}: {what}") from None


def _checked(converted, entries, shapes: dict[str, tuple[int, ...]], folder: Path):
    """``converted`` (our name, tensor), each tensor's shape checked against the model
    config.json describes: a mismatch names the checkpoint's tensor, not only ours."""
    theirs = {ours: hf for ours, hf, _ in entries}
    for name, tensor in converted:
        if tuple(tensor.shape) != shapes[name]:
            raise UserError(f"{folder}: the checkpoint's {theirs[name]} gives {name} the shape {tuple(tensor.shape)}, "
                            f"where config.json asks for {shapes[name]}; the weights and config.json do not belong "
                            "together")
        yield name, tensor


def _write_config(run: Path, cfg: ModelConfig, decoding: dict, source: str, family: str) -> None:
    import yaml

    head = (f"# A {family} model imported from {source} by `transformer import`: the model's config, and\n"
            "# decoding defaults from its generation_config.json (greedy unless it samples).\n")
    body = yaml.safe_dump({"model": cfg.to_dict(), "decoding": decoding}, sort_keys=False, allow_unicode=True)
    write_new(run / CONFIG, head + body)


def import_pretrained(source: str, out: str | Path) -> Imported:
    """Write the run directory ``out`` for the HF model ``source`` (module docstring).

    Raises:
        UserError: ``out`` exists and is not empty; the source is missing, unsupported,
            truncated, without a tokenizer, or its pytorch_model.bin asks to run code.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: a file, not a folder; give a new run directory")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out}: already exists and is not empty; give a new run directory")
    folder, where = fetch(source)
    refuse_outside_links(folder)
    family = _model_type(folder)
    if family == "marian":
        from .marian_run import import_marian_run

        import_marian_run(folder, out)
        return Imported(out, family, None, "", 0)
    weights = HFWeights(folder)
    check_sizes(family, folder, weights)  # before transformers builds its config (Qwen2 lists each layer)
    hf_config = _hf_config(folder)
    tie = _tied(hf_config, weights)
    decoding, notes = decoding_defaults(folder)
    load_pretrained_tokenizer(folder)  # a bad tokenizer file named where it is, not in the temporary folder
    result: Imported | None = None  # set by fill, once the run is complete

    def fill(tmp: Path) -> None:
        tokenizer_file = _save_tokenizer(folder, tmp)
        tokenizer = load_pretrained_tokenizer(tmp)
        vocab = int(hf_config.vocab_size)
        if tokenizer.vocab_size > vocab:
            raise UserError(f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                            f"{vocab}; they do not belong together")
        pad_id = _padding_id(tokenizer, vocab, hf_config)
        cfg = _config(family, hf_config, tie, pad_id, folder)
        with torch.device("meta"):
            shapes = {n: tuple(t.shape) for n, t in LanguageModel(cfg).state_dict().items()}
        entries = name_map(cfg, family)
        assert sorted(shapes) == sorted(ours for ours, _, _ in entries), "the name map misses a tensor"
        header = [(ours, shapes[ours], weights.dtype(theirs)) for ours, theirs, _ in entries]
        if unused := unused_tensors(weights, {theirs for _, theirs, _ in entries}, cfg.tie_embeddings):
            notes.append(f"{folder}: {len(unused)} tensor(s) of the checkpoint are not used ({', '.join(unused[:3])}"
                         f"{', ...' if len(unused) > 3 else ''}); does config.json describe these weights?")
        converted = _checked(tensors_from_hf(cfg, family, weights.get), entries, shapes, folder)
        meta = {"model_config": json.dumps(cfg.to_dict()), "format": FORMAT, "imported_from": where}
        write_safetensors(tmp / BEST, header, converted, meta)
        _write_config(tmp, cfg, decoding, where, family)
        record = {"source": where, "family": family, "model_type": family, "tokenizer": tokenizer_file,
                  "weights": sorted({p.name for p in weights.files.values()}) or ["pytorch_model.bin"],
                  "pad_id": cfg.pad_id, "tie_embeddings": cfg.tie_embeddings,
                  "stop_ids": stop_ids(folder, hf_config, cfg.eos_id, cfg.vocab_size)}
        write_new(tmp / IMPORT_RECORD, json.dumps(record, indent=1) + "\n")
        nonlocal result
        result = Imported(out, family, cfg, tokenizer_file, sum(math.prod(s) for s in shapes.values()),
                          tuple(notes))

    write_run(out, fill)
    assert result is not None
    return result
