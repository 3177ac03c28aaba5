"""The translation model behind the service, and its route set: ``/translate`` (one text or
several, n-best with scores) and ``/attention`` (a translation with every attention weight)."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response

from ..inference.translator import Translation, Translator
from .attention_maps import Bounds
from .serve_config import ServeConfig
from .core import ServiceCore, check_default
from .errors import ERRORS, ServeError, refuse_elsewhere
from .inspect import add_inspect_routes
from .schemas import AttentionRequest, AttentionResponse, Candidate, TranslateRequest, TranslateResponse


class TranslationService(ServiceCore):
    """The loaded translation model and what the routes need of it: one Translator per beam size
    (sharing the model), and the batcher that feeds them. ``translator``, ``_decode`` and
    ``attention`` use the model, so they run in the batcher's thread only.

    Only the server's own beam may build a compiled step (``transformer serve`` builds it at
    start-up, see ``prepare_compiled``); a request for another beam decodes with a step built
    already or eagerly, never waiting minutes for a build (``compile: on`` -> ``auto``)."""

    kind = "translation"
    summary = "Translate with a from-scratch Transformer and look at its attention."

    def __init__(self, translator: Translator, cfg: ServeConfig) -> None:
        check_default(translator.decoding.beam, cfg.max_beam, "translator's beam", "max_beam")
        self.base = translator
        self._by_beam: dict[int, Translator] = {translator.decoding.beam: translator}
        super().__init__(cfg, self._decode)

    def translator(self, beam: int) -> Translator:
        if beam not in self._by_beam:
            compile = "auto" if self.base.decoding.compile == "on" else self.base.decoding.compile
            self._by_beam[beam] = self.base.with_decoding(beam=beam, n_best=1, compile=compile)
        return self._by_beam[beam]

    def _decode(self, key: tuple[int, int], texts: list[str]) -> list[list[Translation]]:
        beam, n_best = key  # n_best changes when beam search may stop, so it is part of the key
        return self.translator(beam).translate_nbest(texts, n_best)

    def attention(self, beam: int, text: str, bounds: Bounds) -> str:
        return self.attention_json(self.translator(beam), text, bounds, truncated=self.too_long(text))

    def too_long(self, text: str) -> bool:
        """Whether the Translator will cut ``text`` to the model's length limit."""
        return len(self.base.subwords.encode(text)) > self.base.model.cfg.max_len - 1

    def source_tokens(self, text: str) -> int:
        """The tokens the model reads for ``text``: its subwords, cut to the model's length, and </s>."""
        return min(len(self.base.subwords.encode(text)), self.base.model.cfg.max_len - 1) + 1

    def check(self, texts: list[str], beam: int | None, n_best: int = 1) -> int:
        """Refuse what is over the limits; return the beam to use."""
        cfg = self.cfg
        if len(texts) > cfg.max_texts:
            raise ServeError(413, f"{len(texts)} texts in one request; the limit is {cfg.max_texts}")
        for i, t in enumerate(texts):
            if len(t) > cfg.max_chars:
                where = f"text {i}" if len(texts) > 1 else "the text"
                raise ServeError(413, f"{where} is {len(t)} characters long; the limit is {cfg.max_chars}")
        beam = self.base.decoding.beam if beam is None else beam
        if beam > cfg.max_beam:
            raise ServeError(422, f"beam must be at most {cfg.max_beam}, got {beam}")
        if n_best > beam:
            raise ServeError(422, f"n_best must be at most the beam size ({beam}), got {n_best}")
        # What decoding costs grows with the source tokens times the beam (each sentence's
        # output is about as long as its source): one request of 64 texts x 1,000 characters at
        # beam 16 held the model 46 s, and every request behind it waited.
        tokens = sum(self.source_tokens(t) for t in texts)
        if tokens * beam > cfg.max_work:
            raise ServeError(413, f"this request asks for {tokens * beam:,} source tokens x beam ({tokens:,} tokens "
                                  f"x beam {beam}); the limit is {cfg.max_work:,} (the server's --max-work): send "
                                  "fewer or shorter texts, or a smaller beam")
        return beam

    def health(self) -> dict:
        """Liveness, the kind of model, its shape, and the limits on a request's beam and work."""
        mcfg = self.base.model.cfg
        return {"n_layers": mcfg.n_layers, "n_heads": mcfg.n_heads, "d_model": mcfg.d_model, "max_len": mcfg.max_len,
                "beam": self.base.decoding.beam, "max_beam": self.cfg.max_beam, "max_work": self.cfg.max_work,
                "precision": self.base.decoding.precision}

    def add_routes(self, app: FastAPI) -> None:
        add_translation_routes(app, self)
        add_inspect_routes(app, self, lambda: self.translator(1))


def add_translation_routes(app: FastAPI, service: TranslationService) -> None:
    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True, responses=ERRORS)
    async def translate(req: TranslateRequest) -> TranslateResponse:
        """Translate one text or several, in input order; n-best with scores."""
        texts = req.lines()
        beam = service.check(texts, req.beam, req.n_best)
        results = await service.batcher.submit((beam, req.n_best), texts)
        return TranslateResponse(
            translation=results[0][0].text if req.text is not None else None,
            translations=[r[0].text for r in results],
            n_best=[[Candidate(text=t.text, score=round(t.score, 4)) for t in r] for r in results],
            beam=beam,
            truncated=[i for i, t in enumerate(texts) if service.too_long(t)],
        )

    @app.post("/attention", responses={200: {"model": AttentionResponse}, **ERRORS})
    async def attention(req: AttentionRequest) -> Response:
        """The translation of one text with its tokens and every attention weight (encoder
        self, decoder self, cross; per layer and head, or those of "layers" and "heads"),
        rounded. An answer over the server's --max-attention weights is a 413."""
        beam = service.check([req.text], req.beam)
        bounds = service.attention_bounds(service.base.model.cfg, req.layers, req.heads)
        # JSON made in the batcher's thread, not validated through the response model: the maps are large
        body = await service.batcher.run_exclusive(service.attention, beam, req.text, bounds)
        return Response(body, media_type="application/json")
    refuse_elsewhere(app, ["/generate"], "this server has a translation model: it serves POST /translate "
                                         "(and POST /attention), not /generate")
