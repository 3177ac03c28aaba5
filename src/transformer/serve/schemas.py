"""Request and response bodies of the JSON API (they also make the OpenAPI description):
translation (``/translate``, ``/attention``) and language model (``/generate``, ``/attention``).

Types are strict (``"beam": "4"`` is an error, not 4) and unknown fields are refused, so a
typo such as ``"txt"`` gets a clear 422 instead of a silently empty translation. Limits that
depend on the server's settings (text length, batch size, beam) are checked by the app.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ..decode.decoding_config import SEED_MAX


def _valid_unicode(text: str) -> str:
    """JSON can spell lone UTF-16 surrogates (``"\\ud800"``), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"contains an unpaired surrogate {text[e.start]!a} at character {e.start}; "
                         "send valid Unicode") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]  # a string a tokenizer can encode


def _given(what: str):
    """A validator: a text that is empty or only white space (nothing to translate or look at) is
    a 422 that says so, not a 200 with an empty answer."""
    def check(text: str) -> str:
        if not text.strip():
            raise ValueError(f"{'empty' if not text else 'only white space'}; give {what}")
        return text

    return AfterValidator(check)


MAX_UNKNOWN = 3  # more unknown fields than this are one error, not one each


class _Strict(BaseModel):
    """Strict types, unknown fields refused; a list stops at its first bad item (``fail_fast``),
    and many unknown fields are one error: a 1 MB body of 90,000 unknown keys was 90,000
    errors, built on the event loop (0.7 s), into a 3.6 MB answer."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_fields(cls, data):
        if isinstance(data, dict):
            fields = cls.model_fields  # a property: read once
            unknown = [key for key in data if key not in fields]
            if len(unknown) > MAX_UNKNOWN:
                shown = ", ".join(repr(key[:40]) for key in unknown[:MAX_UNKNOWN])
                raise ValueError(f"{len(unknown):,} unknown fields ({shown}, ...); the fields are "
                                 f"{', '.join(fields)}")
        return data


class TranslateRequest(_Strict):
    """Give ``text`` (one sentence) or ``texts`` (several), not both."""

    text: Annotated[Text, _given("a sentence to translate")] | None = Field(
        None, description="one sentence (not blank)", examples=["A dog runs in the park."])
    texts: list[Text] | None = Field(None, fail_fast=True,
                                     description="several sentences, translated in order (a blank one as a "
                                                 "blank line, as the translate command does)")
    beam: int | None = Field(None, ge=1, description="beam size (1 = greedy); default: the server's")
    n_best: int = Field(1, ge=1, description="translations per sentence, best first (at most the beam size)")

    @model_validator(mode="after")
    def _one_of(self) -> TranslateRequest:
        if (self.text is None) == (self.texts is None):
            raise ValueError('give exactly one of "text" (a string) or "texts" (a list of strings)')
        return self

    def lines(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])


class Candidate(BaseModel):
    text: str
    score: float = Field(description="length-normalised log-probability (higher is better)")


class TranslateResponse(BaseModel):
    translation: str | None = Field(None, description='the best translation, when "text" was given')
    translations: list[str] = Field(description="the best translation of each text, in input order")
    n_best: list[list[Candidate]] = Field(description="for each text, its n_best translations, best first")
    beam: int
    truncated: list[int] = Field(description="indices of texts longer than the model's limit, "
                                             "translated from their beginning only")


def _indices(values: list[int] | None) -> list[int] | None:
    if values is not None and (not values or len(set(values)) != len(values)):
        raise ValueError("give each index once, at least one (leave the field out for all)")
    return values


# Layers or heads of an /attention answer: 0-based, none twice (the model's range is checked by the service).
Indices = Annotated[list[Annotated[int, Field(ge=0)]] | None, Field(fail_fast=True), AfterValidator(_indices)]


class _ChoosesMaps(_Strict):
    """What both kinds of /attention request may choose."""

    layers: Indices = Field(None, description="the layers to return (0-based, in this order); default: all")
    heads: Indices = Field(None, description="the heads to return (0-based, in this order); default: all")


class AttentionRequest(_ChoosesMaps):
    text: Annotated[Text, _given("a sentence to look at")] = Field(description="one sentence (not blank)",
                                                                   examples=["A dog runs in the park."])
    beam: int | None = Field(None, ge=1, description="beam size for the translation; default: the server's")


Maps = list[list[list[list[float]]]]  # [layer][head][query][key]


class _HoldsMaps(BaseModel):
    """What both kinds of /attention answer say of the maps they hold."""

    n_layers: int
    n_heads: int
    layers: list[int] | None = Field(None, description="the layers the maps hold, when the request chose them")
    heads: list[int] | None = Field(None, description="the heads the maps hold, when the request chose them")


class AttentionResponse(_HoldsMaps):
    translation: str
    score: float
    source_tokens: list[str] = Field(description="source subwords and </s> (S)")
    target_tokens: list[str] = Field(description="produced subwords and </s> (T): the query rows of the decoder maps")
    target_input_tokens: list[str] = Field(description="<s> and the produced subwords (T): the key columns "
                                                       "of decoder_self")
    encoder_self: Maps = Field(description="[layer][head][S][S]")
    decoder_self: Maps = Field(description="[layer][head][T][T]")
    cross: Maps = Field(description="[layer][head][T][S]")
    truncated: bool = Field(False, description="the text was longer than the model's limit and was cut")


class GenerateRequest(_Strict):
    """A prompt to continue; every other field defaults to the run's ``decoding`` settings."""

    prompt: Text = Field(description="the text to continue", examples=["the cat sat"])
    max_new_tokens: int | None = Field(None, ge=1, description="tokens to generate (at most the server's "
                                                                "new_tokens_limit)")
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False, description="sampling temperature; 0 = greedy")
    top_k: int | None = Field(None, ge=0, description="sample among the k most probable tokens (0 = all)")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus: the smallest set of most probable tokens "
                                                             "whose probability reaches top_p (1 = all)")
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="the same seed gives the same text, alone or "
                                                                  "batched with other requests (default: a fresh "
                                                                  "one, returned in the answer)")
    stream: bool | None = Field(None, description="answer with server-sent events, one per token (default: "
                                                  "when the request accepts text/event-stream)")

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, v: str) -> str:
        if not v:
            raise ValueError("empty; give some text to continue")
        return v


class GenerateResponse(BaseModel):
    text: str = Field(description="the continuation (without the prompt)")
    tokens: int = Field(description="tokens generated")
    prompt_tokens: int = Field(description="tokens of the prompt the model saw")
    truncated: bool = Field(description="the prompt was longer than the model's context: its end was continued")
    seed: int = Field(description="the seed the continuation was sampled with (give it again for the same text)")


class LMAttentionRequest(_ChoosesMaps):
    text: Annotated[Text, _given("some text to look at")] = Field(description="a prompt and its continuation "
                                                                  "(not blank)", examples=["the cat sat on the mat"])


class LMAttentionResponse(_HoldsMaps):
    tokens: list[str] = Field(description="the text's tokens (T), as the model reads them")
    self_attention: Maps = Field(description="[layer][head][T][T]: token t looks at token u (causal: u <= t)")
    truncated: bool = Field(description="the text was longer than the model's context: its last max_len "
                                        "tokens are shown")


class _InspectRequest(_Strict):
    """What /lens and /heads both read: one sentence (a language model's text), and the output
    to teacher-force or score."""

    text: Annotated[Text, _given("a sentence to look at")] = Field(description="one sentence (not blank)",
                                                                   examples=["A dog runs in the park."])
    target: Text | None = Field(None, description="translation model: teacher-force this translation instead of "
                                                  "the greedy one; language model: the words after the text")


class LensRequest(_InspectRequest):
    top: int = Field(3, ge=1, le=10, description="the most probable tokens listed per layer and position")
    layers: Indices = Field(None, description="the lens's rows to return (0: the embeddings, i: after layer i); "
                                              "default: all")


class HeadsRequest(_InspectRequest):
    corrupt: Annotated[Text, _given("a corrupted sentence")] | None = Field(
        None, description="patch each head in from this sentence instead of ablating it")
    token: Text | None = Field(None, description='score log p(token) - log p(vs) where the output has either '
                                                 '(default: the log-probability of the whole output)',
                               examples=["es"])
    vs: Text | None = Field(None, description="the token scored against", examples=["sie"])
    ablate: Literal["zero", "mean"] | None = Field(None, description="a head's output set to 0 (the default "
                                                                     "without corrupt) or to its mean")
    layers: Indices = Field(None, description="measure these layers' heads only (0-based); default: all")


class LensResponse(BaseModel):
    sentence: str
    translation: str | None = Field(description="the teacher-forced translation (translation model)")
    truncated: bool = Field(description="a language model's text was longer than its context: its end is read")
    positions: list[str] = Field(description="what each position of the decoder reads (T)")
    final_choice: list[str] = Field(description="the model's own prediction at each position (the last row's)")
    n_layers: int
    layers: list[str] = Field(description='the rows: "embed", then "1" .. "L" (after each layer)')
    final_choice_prob: list[list[float]] = Field(description="[row][position]: the probability of the final choice")
    top: list[list[list[tuple[str, float]]]] = Field(description="[row][position][k]: [token, probability]")


class HeadKind(BaseModel):
    kind: str = Field(description='"enc.attn", "dec.attn" or "dec.cross"')
    label: str
    effects: list[list[float | None]] = Field(description="[layer][head]: the score's change (null: not measured)")


class HeadsResponse(BaseModel):
    sentence: str
    translation: str | None
    truncated: bool = Field(description="a language model's text was longer than its context: its end is read")
    score: str = Field(description="what the score is, and where it is read")
    mode: str = Field(description='"zero", "mean" or "patch"')
    clean: float = Field(description="the score of the sentence as it is")
    corrupt: float | None = Field(description="the score of the corrupted sentence (patch)")
    n_layers: int
    n_heads: int
    kinds: list[HeadKind]
    skipped: dict[str, str] = Field(description="kinds not patched, and why")


class ErrorResponse(BaseModel):
    error: str
