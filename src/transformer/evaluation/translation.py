"""Translation quality with sacreBLEU: detokenised, cased BLEU and chrF on the untouched
references, plus two lower-cased BLEU figures for comparison with published Multi30k results.

Published Multi30k BLEU is computed the way the shared task prepared its data: lower-case,
normalise punctuation, Moses-tokenise, then multi-bleu.perl on the tokens. ``bleu_tok_lc``
does exactly that (sacremoses for the Moses steps, sacreBLEU with ``tokenize="none"`` for the
count, which equals multi-bleu.perl's corpus BLEU). ``bleu_lc`` is sacreBLEU's own 13a
tokenisation with ``lowercase=True``; the two usually agree within a few hundredths.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

import sacrebleu

from ..errors import UserError


@dataclass(frozen=True)
class Scores:
    bleu: float  # sacreBLEU, cased, 13a tokenisation of detokenised text
    chrf: float
    bleu_lc: float  # the same, lower-cased
    bleu_signature: str
    chrf_signature: str
    n_sentences: int
    bleu_tok_lc: float | None = None  # lower-cased, Moses-tokenised (the published Multi30k metric)
    tok_lc_signature: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        tok = "" if self.bleu_tok_lc is None else f"  lower-cased tokenised BLEU {self.bleu_tok_lc:.2f}"
        return (f"BLEU {self.bleu:.2f}  chrF {self.chrf:.2f}  lower-cased BLEU {self.bleu_lc:.2f}{tok}  "
                f"({self.n_sentences} sentences; {self.bleu_signature})")


def score(hypotheses: list[str], references: list[str], lang: str | None = None) -> Scores:
    """Score detokenised hypotheses against the untouched references (same order).

    ``lang`` (the target language, e.g. ``"de"``) also computes ``bleu_tok_lc``.
    """
    if len(hypotheses) != len(references):
        raise UserError(f"{len(hypotheses)} translations but {len(references)} references; "
                        "the files must have one line per sentence")
    bleu = sacrebleu.BLEU()
    bleu_lc = sacrebleu.BLEU(lowercase=True)
    chrf = sacrebleu.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    lc = bleu_lc.corpus_score(hypotheses, [references])
    tok_lc, tok_sig = (None, None) if lang is None else tokenized_lc_bleu(hypotheses, references, lang)
    return Scores(b.score, c.score, lc.score, str(bleu.get_signature()), str(chrf.get_signature()),
                  len(hypotheses), tok_lc, tok_sig)


def moses_lc_tokenize(line: str, lang: str) -> str:
    """Lower-case, normalise punctuation and Moses-tokenise one line (the Multi30k task's
    ``lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl -l L``), unescaped."""
    normalizer, tokenizer = _moses(lang)
    return tokenizer.tokenize(normalizer.normalize(line.lower()), escape=False, return_str=True)


def tokenized_lc_bleu(hypotheses: list[str], references: list[str], lang: str) -> tuple[float, str]:
    """Corpus BLEU of the lower-cased, Moses-tokenised text (multi-bleu.perl's convention)
    and a signature naming the steps."""
    hyp = [moses_lc_tokenize(h, lang) for h in hypotheses]
    ref = [moses_lc_tokenize(r, lang) for r in references]
    bleu = sacrebleu.BLEU(tokenize="none", lowercase=True, force=True)  # already lower-cased
    result = bleu.corpus_score(hyp, [ref])
    return result.score, f"moses-lc:{lang}|{bleu.get_signature()}"


@lru_cache(maxsize=8)
def _moses(lang: str):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
