"""The base the two front doors share (:mod:`transformer.inference.front_door`): a run's kind checked with
one line, the vocabulary rule, the precision asked for and the one resolved, the compiled
step each search asks for, and the truncation policy (translation keeps a line's first
tokens, generation a prompt's last)."""
from __future__ import annotations

import warnings

import pytest
import torch

from transformer import ModelConfig, Transformer
from transformer import compiled
from transformer.compiled.search_step import CompiledStep
from transformer.decode.eager_step import EagerStep
from transformer.decode.decoding_config import DecodingConfig
from transformer.errors import UserError
from transformer.inference.front_door import FrontDoor, open_model, run_decoding, vocabulary_fits
from transformer.inference.generator import Generator
from transformer.model import LanguageModel
from transformer.run import save_weights
from transformer.inference.translator import Translator, load_translator
from transformer.inference.translator import run_decoding as translator_run_decoding

V = 20


class Letters:
    """A stand-in tokenizer: one id per letter (a = 3), any text of letters."""

    vocab_size = V

    def encode(self, text: str) -> list[int]:
        return [3 + ord(c) - ord("a") for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i - 3) for i in ids if i >= 3)


def translation_model(max_len: int = 8) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0, max_len=max_len)
    return Transformer(cfg).eval()


def language_model(max_len: int = 8) -> LanguageModel:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**ModelConfig.preset("nanogpt-char", vocab_size=V).to_dict(), "d_model": 16,
                         "n_heads": 2, "d_ff": 32, "n_layers": 1, "dropout": 0.0, "max_len": max_len})
    return LanguageModel(cfg).eval()


def test_both_front_doors_are_one_base_and_run_decoding_is_one_function():
    assert issubclass(Translator, FrontDoor) and issubclass(Generator, FrontDoor)
    assert translator_run_decoding is run_decoding  # cli/ still imports it from the translator


@pytest.mark.parametrize("kind", ["translation", "language"])
def test_the_other_kind_of_model_is_one_line_error(tmp_path, kind):
    path = tmp_path / "m.safetensors"
    save_weights(translation_model() if kind == "translation" else language_model(), path)
    decoding = DecodingConfig(precision="fp32")
    assert open_model(path, decoding, language_model=kind == "language").cfg.decoder_only == (kind == "language")
    with pytest.raises(UserError) as refused:
        open_model(path, decoding, language_model=kind == "translation")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(str(path))
    assert ("a translation model; generate needs" if kind == "translation"
            else "a language model; translate needs") in message


def test_translating_with_a_language_model_names_the_kind(tmp_path, cli, one_line_error):
    save_weights(language_model(), tmp_path / "m.safetensors")
    with pytest.raises(UserError, match="a language model; translate needs a translation model"):
        load_translator(tmp_path / "m.safetensors")
    (tmp_path / "in.txt").write_text("a line\n")
    r = cli("translate", "--model", tmp_path / "m.safetensors", "--input", tmp_path / "in.txt")
    one_line_error(r, "translate", "m.safetensors", "a language model", "use generate")


@pytest.mark.parametrize("tokens, rows, imported, fits", [
    (20, 20, False, True), (19, 20, False, False), (21, 20, False, False),
    (20, 20, True, True), (19, 20, True, True), (21, 20, True, False)])
def test_the_vocabulary_rule(tokens, rows, imported, fits):
    assert vocabulary_fits(tokens, rows, imported=imported) is fits


def test_a_line_keeps_its_first_tokens_and_a_prompt_its_last():
    translator = Translator(translation_model(), Letters(), DecodingConfig(precision="fp32"), warn=False)
    generator = Generator(language_model(), Letters(), DecodingConfig(precision="fp32"), warn=False)
    line = "abcdefghij"  # 10 ids, the models take 7 (max_len 8, one position left)
    assert translator.encode(line) == Letters().encode("abcdefg") + [translator.model.cfg.eos_id]
    assert generator.encode(line) == Letters().encode("defghij")
    assert translator.encode("abc") == Letters().encode("abc") + [translator.model.cfg.eos_id]
    assert generator.encode("abc") == Letters().encode("abc")
    assert (translator.truncated, generator.truncated) == (1, 1)


def test_a_cut_warns_unless_asked_not_to():
    for warn in (True, False):
        translator = Translator(translation_model(), Letters(), DecodingConfig(precision="fp32"), warn=warn)
        generator = Generator(language_model(), Letters(), DecodingConfig(precision="fp32"), warn=warn)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            translator.encode("abcdefghij")
            generator.encode("abcdefghij")
        expected = ["a line of 10 subwords is longer than the model's limit (7); translating its first 7 subwords only",
                    "a prompt of 10 tokens is longer than the model's context; continuing its last 7 tokens"]
        assert [str(w.message) for w in seen] == (expected if warn else [])


def test_the_precision_asked_for_and_the_one_resolved():
    for front in (Translator(translation_model(), Letters()), Generator(language_model(), Letters())):
        assert front.requested_precision == "auto"
        assert front.decoding.precision in ("fp32", "bf16") and front.device == torch.device("cpu")
    model = translation_model()
    int8 = Translator(model, Letters(), DecodingConfig(precision="int8"))
    assert int8.requested_precision == int8.decoding.precision == "int8"
    assert int8.model is not model and all(p.dtype == torch.float32 for p in model.parameters())  # a copy converted


@pytest.mark.parametrize("front", ["translation", "language"])
def test_with_decoding_keeps_the_converted_model(front):
    made = Translator(translation_model(), Letters(), DecodingConfig(precision="fp32"), warn=False) \
        if front == "translation" else Generator(language_model(), Letters(), DecodingConfig(precision="fp32"),
                                                 warn=False)
    made.encode("abcdefghij")
    other = made.with_decoding(compile="off")
    assert type(other) is type(made) and other.model is made.model and other.truncated == 0
    assert other.decoding.compile == "off" and made.decoding.compile != "off"
    with pytest.raises(ValueError, match=f"need a new {type(made).__name__}"):
        made.with_decoding(precision="bf16")


def test_each_search_asks_for_its_own_compiled_step(monkeypatch):
    """Translation: a row per beam and log-probabilities; generation: one row and logits,
    with the number of new tokens (auto compiles a long generation)."""
    asked = []
    monkeypatch.setattr(compiled, "is_built", lambda model, group, logprobs: asked.append(
        ("built", dict(group=group, logprobs=logprobs))) or False)
    monkeypatch.setattr(CompiledStep, "prepare", lambda step: asked.append(("prepare", dict(logprobs=step.logprobs))))
    translator = Translator(translation_model(), Letters(), DecodingConfig(precision="fp32", beam=4, compile="on"))
    generator = Generator(language_model(), Letters(), DecodingConfig(precision="fp32", max_new_tokens=50_000))
    for front in (translator, generator):
        assert front.compiles() == (True, True)
        front.prepare()
    assert asked == [("built", dict(group=4, logprobs=True)), ("prepare", dict(logprobs=True)),
                     ("built", dict(group=1, logprobs=False)), ("prepare", dict(logprobs=False))]


def test_the_step_a_search_runs_is_the_front_doors_one_decision_with_the_real_batch(monkeypatch):
    """The front door hands each batch's search its step: compiled where ``compiles`` says so
    for the rows it will really decode, else the eager one; the searches never decide."""
    translator = Translator(translation_model(), Letters(), DecodingConfig(precision="fp32", beam=4, compile="on"))
    assert isinstance(translator.search_step(64), CompiledStep) and translator.search_step(64).logprobs
    assert isinstance(translator.search_step(65), EagerStep)  # more rows than MAX_COMPILED_ROWS: eager is as fast
    assert isinstance(translator.with_decoding(compile="off").search_step(1), EagerStep)
    monkeypatch.setattr(compiled, "is_built", lambda *a: False)
    assert isinstance(translator.with_decoding(compile="auto").search_step(4), EagerStep)  # auto: only a built step
    generator = Generator(language_model(), Letters(), DecodingConfig(precision="fp32", compile="on"))
    step = generator.search_step(1000)  # (a language model's rows never decide)
    assert isinstance(step, CompiledStep) and not step.logprobs


def test_compile_off_asks_for_nothing():
    for front in (Translator(translation_model(), Letters(), DecodingConfig(precision="fp32", compile="off")),
                  Generator(language_model(), Letters(), DecodingConfig(precision="fp32", compile="off"))):
        assert front.compiles() == (False, False)


def test_compiled_steps_are_kept_for_a_run_and_in_memory_without_one(tmp_path, monkeypatch):
    kept = []
    monkeypatch.setattr(compiled, "keep_for_run", lambda model, root: kept.append(root))
    front = Translator(translation_model(), Letters(), DecodingConfig(precision="fp32"))
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("decoding: {beam: 2}\n")
    front.keep_compiled_steps(tmp_path / "run" / "checkpoints" / "m.safetensors")
    front.keep_compiled_steps(tmp_path / "elsewhere.safetensors")
    assert kept == [tmp_path / "run"]
