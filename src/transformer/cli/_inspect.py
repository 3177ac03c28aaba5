"""What ``transformer lens`` and ``transformer heads`` share (a leading underscore: not a command
module): the run loaded for inspection, one sentence made into the model's inputs, the output
that is scored, and a word made into one token id (``--token``, ``--vs``).

A translation model reads the sentence and teacher-forces its translation (``--target``, or the
model's own greedy translation): the output is the translation and </s>, one token per decoder
position. A language model reads the sentence; its output is the next token after it (the
model's most probable one), or the tokens of ``--target`` written after it."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from ..errors import UserError
from ._lm import prompt_ids


@dataclass
class Subject:
    """One sentence ready for the trace."""

    model: object
    decoder_only: bool
    sentence: str
    translation: str | None  # a translation model's teacher-forced output
    inputs: tuple  # (src (1, S), tgt_in (1, T)) or (tokens (1, T),)
    pieces: list[str]  # what each position of the output stack reads
    outputs: list[int]  # the token each scored position is scored on
    scored: list[int]  # those positions
    show: Callable[[int], str]  # id -> printable token
    encode_output: Callable[[str], list[int]]  # text -> ids of the output side
    unk_id: int | None
    encode_source: Callable[[str], list[int]] | None = None  # a translation model's source side
    tokenizer: object = None  # a language model's
    truncated: bool = False  # a language model's text was longer than its context: its end is read

    def options(self) -> dict:
        """The trace's options: a language model's every token is real (an imported GPT-2's
        padding id is a real token's)."""
        import torch  # on first use: the parser and --help load no torch
        if not self.decoder_only:
            return {}
        return {"real": torch.ones_like(self.inputs[0], dtype=torch.bool)}

    def header(self) -> str:
        if self.decoder_only:
            return f"prompt: {self.sentence!r} ({self.inputs[0].size(1)} tokens)"
        return f"source:      {self.sentence}\ntranslation: {self.translation}"


def add_input_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("sentence", help="the source sentence (translation model) or the text (language model)")
    p.add_argument("--model", required=True, help="run directory or .safetensors file (trained here or imported)")
    p.add_argument("--target", help="translation model: teacher-force this translation instead of the model's own "
                                    "greedy one; language model: score these words written after the text")


def load_subject(args: argparse.Namespace, sentence: str, target: str | None, options: dict) -> Subject:
    """The run of ``args.model`` in fp32 (the exact arithmetic), with ``sentence`` as its input."""
    from ..run import read_model_config

    if read_model_config(args.model).decoder_only:
        return _language_model(args.model, sentence, target, options)
    return _translation(args.model, sentence, target, options)


def other_input(subject: Subject, args: argparse.Namespace, sentence: str, option: str) -> tuple:
    """The inputs of ``sentence`` read as ``subject``'s is (a translation model: teacher-forced on
    the same translation), for patching; a language model's must have as many tokens."""
    import torch
    if subject.decoder_only:
        ids = _lm_ids(subject, sentence, option)
        n = subject.inputs[0].size(1)
        if len(ids) != n:
            raise UserError(f"{option} is {len(ids)} tokens long and the sentence {n}: patching a language model "
                            "reads both at the same positions; give sentences with as many tokens")
        return (torch.tensor([ids], device=subject.inputs[0].device),)
    model = subject.model
    src = _source_ids(model, subject.encode_source, sentence, option)
    return torch.tensor([src], device=subject.inputs[0].device), subject.inputs[1]


def token_id(subject: Subject, word: str, option: str) -> int:
    """``word`` as one token id of the output vocabulary (a language model's mid-sentence form,
    " word", first); an exact token's own spelling ("▁es") is taken as it is. More than one
    token, or one the vocabulary does not know: a UserError."""
    if not word.strip():
        raise UserError(f"{option} is empty; give a token")
    texts = [" " + word, word] if subject.decoder_only and not word.startswith(" ") else [word]
    first = None
    for text in texts:
        ids = [i for i in subject.encode_output(text) if i not in _specials(subject)]
        first = ids if first is None else first
        if len(ids) == 1 and ids[0] != subject.unk_id:
            return ids[0]
    exact = [i for i in range(_vocab_size(subject)) if subject.show(i) == word]
    if exact:
        return exact[0]
    if len(first) > 1 and subject.unk_id not in first:
        pieces = [subject.show(i) for i in first]
        raise UserError(f"{option} {word} is {len(first)} tokens ({' '.join(pieces)}), not one; give a single "
                        f"token, e.g. {option} {pieces[0]}")
    raise UserError(f"{option} {word} is not in the model's vocabulary; give a word the model knows")


def check_layer(layer: int | None, n_layers: int, option: str = "--layer") -> int | None:
    """``layer`` counted from 1 -> from 0 (None stays None); out of range: a UserError."""
    if layer is None:
        return None
    if not 1 <= layer <= n_layers:
        raise UserError(f"{option} {layer} is out of range: the model has {n_layers} layers (1..{n_layers})")
    return layer - 1


# ---- the two kinds ---------------------------------------------------------------------------

def _translation(path, sentence: str, target: str | None, options: dict) -> Subject:
    from ..inference.translator import load_translator

    translator = load_translator(path, warn=False, **{**options, "precision": "fp32", "beam": 1, "compile": "off"})
    return translation_subject(translator, sentence, target)


def translation_subject(translator, sentence: str, target: str | None) -> Subject:
    """``sentence`` as the inputs of a loaded Translator's model (its greedy translation, or
    ``target``, teacher-forced); the service's /lens and /heads read a sentence through it too."""
    import torch
    from ..viz.maps import prepare_pair

    model, subwords = translator.model, translator.subwords
    encode_source = subwords.encode
    _source_ids(model, encode_source, sentence, "the sentence")
    encode_output = getattr(subwords, "encode_target", subwords.encode)
    if target is not None and len(encode_output(target)) + 1 > model.cfg.max_len:
        raise UserError(f"--target is {len(encode_output(target))} subwords long, longer than the model's "
                        f"{model.cfg.max_len - 1} target positions; shorten it")
    pair = prepare_pair(translator, sentence, target)
    device = next(model.parameters()).device
    cfg = model.cfg
    tgt_in = [cfg.bos_id, *pair.tgt_ids]
    subject = Subject(model, False, sentence, pair.translation,
                      (torch.tensor([pair.src_ids], device=device), torch.tensor([tgt_in], device=device)),
                      [subwords.id_to_piece(i) for i in tgt_in], [*pair.tgt_ids, cfg.eos_id],
                      list(range(len(tgt_in))), subwords.id_to_piece, encode_output, getattr(subwords, "unk_id", None),
                      encode_source)
    return subject


def _source_ids(model, encode, sentence: str, option: str) -> list[int]:
    if not sentence.strip():
        raise UserError(f"{option} is empty; give some text to look at")
    if "\n" in sentence:
        raise UserError(f"{option} holds a line break; give one sentence")
    ids = encode(sentence)
    if len(ids) + 1 > model.cfg.max_len:
        raise UserError(f"{option} is {len(ids) + 1} subwords long (with </s>), longer than the model's max_len of "
                        f"{model.cfg.max_len}; shorten it")
    return [*ids, model.cfg.eos_id]


def _language_model(path, sentence: str, target: str | None, options: dict) -> Subject:
    from ._lm import load_language_model

    return lm_subject(load_language_model(path, options), sentence, target)


def lm_subject(generator, sentence: str, target: str | None, cut: bool = False) -> Subject:
    """``sentence`` (and ``target`` written after it) as the input of a loaded Generator's model;
    with ``cut`` (and no ``target``), a sentence longer than the context is read from its last
    ``max_len`` tokens (as ``/attention`` and ``/generate`` read it), else it is a UserError."""
    import torch
    from ..viz.walkthrough_lm import token_shower

    model, tokenizer = generator.model, generator.tokenizer
    subject = Subject(model, True, sentence, None, (), [], [], [], token_shower(tokenizer), tokenizer.encode,
                      getattr(tokenizer, "unk_id", None), tokenizer=tokenizer)
    if cut and target is None and len(ids := tokenizer.encode(sentence)) > model.cfg.max_len:
        ids, subject.truncated = ids[-model.cfg.max_len:], True
    else:
        ids = _lm_ids(subject, sentence, "the sentence")
    n = len(ids)
    scored = [n - 1]
    if target is not None:
        full = _lm_ids(subject, sentence + target, "the sentence and --target")
        if full[:n] != ids or len(full) == n:
            raise UserError("--target must add whole tokens after the sentence (its first one merges with the "
                            "sentence's last); start it with a space, e.g. --target ' was tired'")
        scored = list(range(n - 1, len(full) - 1))
        ids = full
    tokens = torch.tensor([ids], device=next(model.parameters()).device)
    subject.inputs = (tokens,)
    subject.pieces = [subject.show(i) for i in ids]
    subject.scored = scored
    if target is None:
        with torch.no_grad():
            subject.outputs = [int(model(tokens, **subject.options())[0, -1].argmax())]
    else:
        subject.outputs = ids[n:]
    return subject


def _lm_ids(subject: Subject, text: str, option: str) -> list[int]:
    return prompt_ids(subject, text, option)


def _specials(subject: Subject) -> set[int]:
    cfg = subject.model.cfg
    return {cfg.bos_id, cfg.eos_id} if not subject.decoder_only else {cfg.bos_id}


def _vocab_size(subject: Subject) -> int:
    cfg = subject.model.cfg
    return cfg.vocab_size if subject.decoder_only else cfg.target_vocab_size


def score_of(subject: Subject, token: str | None, vs: str | None, target: str | None):
    """The Score of ``subject``'s output and a line saying what it is: with ``token`` (``--token
    T [--vs U]``) log p(T) - log p(U) where the output has T or U, else the log-probability of
    the whole output (``target``: the text given after a language model's sentence)."""
    from ..inspect import Score

    show = subject.show
    if token is None:
        tokens = list(subject.outputs)
        shown = " ".join(show(i) for i in tokens) if len(tokens) <= 12 else f"the {len(tokens)} output tokens"
        kind = "the translation" if not subject.decoder_only else ("--target" if target else "the next token")
        return Score(subject.scored, tokens), f"log p({kind}: {shown})"
    chosen = token_id(subject, token, "--token")
    other = None if vs is None else token_id(subject, vs, "--vs")
    if other == chosen:
        raise UserError(f"--token {token} and --vs {vs} are the same token; give two different ones")
    outputs = subject.outputs
    at = next((t for t, o in zip(subject.scored, outputs) if o in (chosen, other)), None)
    if at is None:
        if subject.decoder_only and target is None:
            at = subject.scored[-1]  # the next token after the text
        else:
            words = token if vs is None else f"{token} nor {vs}"
            raise UserError(f"neither {words} is in the {'translation' if not subject.decoder_only else '--target'} "
                            f"({' '.join(show(o) for o in outputs)}); give --target with one of them")
    where = f"at position {at + 1} (after {subject.pieces[at]!r})"
    what = f"log p({show(chosen)})" + ("" if other is None else f" - log p({show(other)})") + f" {where}"
    return Score([at], [chosen], None if other is None else [other]), what


def head_labels(subject: Subject) -> dict[str, str]:
    """How the map names each kind of head: a language model's only kind is its self-attention."""
    from ..inspect.heads import KIND_LABELS

    return {k: ("self-attention" if subject.decoder_only else KIND_LABELS[k]) for k in KIND_LABELS}
