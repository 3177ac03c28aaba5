"""The logit lens and the head map of one sentence, for the service (``POST /lens``, ``POST
/heads``): what ``transformer lens`` and ``transformer heads`` print, as JSON. Both kinds of
model: a translation model is read on its decoder, teacher-forced on its greedy translation
(or ``target``); a language model on the text (and ``target`` written after it).

    /lens   {"text", "target"?, "top"?, "layers"?}   rows "embed", "1" .. "L" x positions
    /heads  {"text", "corrupt"?, "token"?, "vs"?, "target"?, "ablate"?, "layers"?}
            the change of the score when each head (layer x head, per kind) is ablated, or
            patched in from "corrupt"

What one request may cost is bounded before the pass that costs it: the text's characters
(``max_chars``) and tokens (the model's ``max_len``; longer is a 413, not cut, so a score is
never read off a cut sentence), the logits the lens computes (``max_lens``: layers + 1 x
positions x vocabulary) and the heads x positions the head map runs (``max_head_work``: one
batched row per head, each as long as the sentence). Everything runs in the batcher's
thread; a request's mistake (an unknown token, a layer the model lacks, a token in neither
output) is a 422 with the commands' message, its options spelt as the request's fields.
"""
from __future__ import annotations

import math
import re
from typing import Any

from fastapi.responses import JSONResponse

from ..errors import UserError
from ..inference.generator import Generator
from .errors import ERRORS, ServeError
from .schemas import HeadsRequest, HeadsResponse, LensRequest, LensResponse
from .serve_config import ServeConfig

TOP_MAX = 10  # the most tokens a /lens cell lists


def check_length(front, text: str, field: str, cfg: ServeConfig, cut: bool = False) -> None:
    """413 when ``text`` is over the characters the server takes or the tokens the model reads
    (``cut``: a language model's text is read from its end, as /attention reads it)."""
    if len(text) > cfg.max_chars:
        raise ServeError(413, f"{field}: {len(text)} characters; the limit is {cfg.max_chars}")
    if isinstance(front, Generator):
        if cut:
            return
        n, room = len(_api(front, lambda: front.tokenizer.encode(text))), front.model.cfg.max_len
    else:
        n, room = len(front.subwords.encode(text)) + 1, front.model.cfg.max_len  # with </s>
    if n > room:
        raise ServeError(413, f"{field}: {n} tokens, more than the model reads ({room}); send a shorter text")


def subject_of(front, text: str, target: str | None):
    """The commands' Subject of ``text`` on the served model (a Translator decodes greedily; a
    language model's text without ``target`` is read from its end when longer than the context)."""
    from ..cli._inspect import lm_subject, translation_subject

    if isinstance(front, Generator):
        return lm_subject(front, text, target, cut=True)
    return translation_subject(front, text, target)


def lens_answer(front, text: str, target: str | None, rows: list[int] | None, top: int,
                cfg: ServeConfig) -> dict[str, Any]:
    """The lens of ``text``: for each chosen row (0: the embeddings, i: after layer i) and each
    position, the probability of the final choice and the ``top`` most probable tokens."""
    from ..inspect import logit_lens

    subject = _api(front, lambda: subject_of(front, text, target))
    model = subject.model
    n_layers = len(model.decoder.layers)
    _check_indices(rows, n_layers + 1, "the lens has {n} rows (0: the embeddings, i: after layer i; 0 to {last})")
    vocab = _vocab(model)
    positions = len(subject.pieces)
    logits = (n_layers + 1) * positions * vocab
    if logits > cfg.max_lens:
        raise ServeError(413, f"text: the lens of {positions} positions computes {logits:,} logits ({n_layers + 1} "
                              f"rows x {positions} positions x {vocab:,} tokens); this server computes at most "
                              f"{cfg.max_lens:,} (its --max-lens): send a shorter text")
    lens = logit_lens(model, *subject.inputs, **subject.options())
    rows = list(range(n_layers + 1)) if rows is None else rows
    probs, ids = lens.top(top)
    chosen_prob = lens.chosen_prob
    show = subject.show
    return {"sentence": text, "translation": subject.translation, "truncated": subject.truncated,
            "positions": subject.pieces,
            "final_choice": [show(int(i)) for i in lens.chosen], "n_layers": n_layers,
            "layers": [lens.layers[r] for r in rows],
            "final_choice_prob": [[round(float(p), 4) for p in chosen_prob[r]] for r in rows],
            "top": [[[[show(int(i)), round(float(q), 4)] for i, q in zip(ids[r, t], probs[r, t])]
                     for t in range(positions)] for r in rows]}


def heads_answer(front, text: str, target: str | None, corrupt: str | None, token: str | None, vs: str | None,
                 ablate: str | None, layers: list[int] | None, cfg: ServeConfig) -> dict[str, Any]:
    """The head map of ``text``: each head's change of the score (``token`` vs ``vs``, else the
    output's log-probability) when it is ablated (``ablate``: zero or mean) or patched in from
    ``corrupt``; a layer not measured (``layers``) is null."""
    from ..cli._inspect import head_labels, other_input, score_of
    from ..inspect import head_effects
    from ..inspect.heads import head_kinds

    if corrupt is not None and ablate is not None:
        raise ServeError(422, '"ablate" is for ablation; "corrupt" patches each head in from the corrupted sentence '
                              "instead (send one)")
    if vs is not None and token is None:
        raise ServeError(422, '"vs" needs "token", e.g. {"token": "es", "vs": "sie"}')
    subject = _api(front, lambda: subject_of(front, text, target))
    model = subject.model
    n_layers = max(model.cfg.n_layers, len(model.decoder.layers))
    _check_indices(layers, n_layers, "the model has {n} layers (0 to {last})")
    score, what = _api(front, lambda: score_of(subject, token, vs, target))
    kinds = head_kinds(model)
    per_kind = [_stack_layers(model, k) for k in kinds]
    heads = model.cfg.n_heads * sum(n if layers is None else sum(1 for i in layers if i < n) for n in per_kind)
    positions = sum(x.size(1) for x in subject.inputs)
    work = heads * positions
    if work > cfg.max_head_work:
        fewer = 'ask for fewer "layers" (e.g. "layers": [0]), or send a shorter text' \
            if (n_layers if layers is None else len(layers)) > 1 else "send a shorter text"
        raise ServeError(413, f"text: the head map runs {heads} heads over {positions} positions ({work:,}); this "
                              f"server runs at most {cfg.max_head_work:,} for one answer (its --max-head-work): "
                              f"{fewer}")
    corrupted = None
    if corrupt is not None:
        check_length(front, corrupt, "corrupt", cfg)
        corrupted = _api(front, lambda: other_input(subject, None, corrupt, "--corrupt"))
    found = head_effects(model, subject.inputs, score, ablate=ablate or ("patch" if corrupted else "zero"),
                         corrupt=corrupted, layers=layers, **subject.options())
    labels = head_labels(subject)
    return {"sentence": text, "translation": subject.translation, "truncated": subject.truncated,
            "score": what, "mode": found.mode,
            "clean": round(found.clean, 5), "corrupt": None if found.corrupt is None else round(found.corrupt, 5),
            "n_layers": n_layers, "n_heads": model.cfg.n_heads,
            "kinds": [{"kind": k, "label": labels[k],
                       "effects": [[None if math.isnan(v) else round(v, 5) for v in row] for row in t.tolist()]}
                      for k, t in found.effects.items()],
            "skipped": {labels[k]: why for k, why in found.skipped.items()}}


def _stack_layers(model, kind: str) -> int:
    return len(model.encoder.layers) if kind.startswith("enc") else len(model.decoder.layers)


def _vocab(model) -> int:
    cfg = model.cfg
    return cfg.vocab_size if cfg.decoder_only else cfg.target_vocab_size


def _check_indices(chosen: list[int] | None, n: int, what: str) -> None:
    """422 when a chosen index of "layers" is ``n`` or more; ``what`` says the range."""
    if chosen is not None and max(chosen) >= n:
        raise ServeError(422, f"layers: {max(chosen)} is out of range; " + what.format(n=n, last=n - 1))


OPTION = re.compile(r"--(corrupt|token|vs|target)\b")


def _api(front, work):
    """``work()``, its UserError a 422 (413 for a text longer than the model reads) in the
    request's words: the commands' options as the request's fields, and no file path of the
    server's."""
    try:
        return work()
    except UserError as e:
        message = OPTION.sub(r'"\1"', str(e)).replace("the sentence", "the text")
        path = getattr(getattr(front, "tokenizer", None), "path", None)
        if path:
            message = message.replace(f" of {path}", " of this model")
        raise ServeError(413 if "longer than the model" in message else 422, message) from None


def add_inspect_routes(app, service, front) -> None:
    """``/lens`` and ``/heads`` on ``service``'s model; ``front()`` is its Translator (greedy) or
    Generator, called in the batcher's thread."""
    cfg = service.cfg

    def lens(req: LensRequest) -> dict:
        model_front = front()
        check_length(model_front, req.text, "text", cfg, cut=req.target is None)
        if req.target is not None:
            check_length(model_front, req.target, "target", cfg)
        return lens_answer(model_front, req.text, req.target, req.layers, req.top, cfg)

    def heads(req: HeadsRequest) -> dict:
        model_front = front()
        check_length(model_front, req.text, "text", cfg, cut=req.target is None)
        if req.target is not None:
            check_length(model_front, req.target, "target", cfg)
        return heads_answer(model_front, req.text, req.target, req.corrupt, req.token, req.vs, req.ablate,
                            req.layers, cfg)

    @app.post("/lens", responses={200: {"model": LensResponse}, **ERRORS})
    async def lens_route(req: LensRequest) -> JSONResponse:
        """The logit lens of one sentence: for every layer and position, what the model would
        predict if it stopped there (the probability of its final choice, and the top tokens).
        A translation model is read on its decoder, on its greedy translation (or "target").
        A text over the model's length or the server's --max-lens logits is a 413."""
        return JSONResponse(await service.batcher.run_exclusive(lens, req))

    @app.post("/heads", responses={200: {"model": HeadsResponse}, **ERRORS})
    async def heads_route(req: HeadsRequest) -> JSONResponse:
        """How much each attention head carries a prediction: the change of the score (the
        output's log-probability, or "token" against "vs") when the head is ablated, or patched
        in from "corrupt". Over the server's --max-head-work (heads x positions): a 413."""
        return JSONResponse(await service.batcher.run_exclusive(heads, req))
