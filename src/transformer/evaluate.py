"""Translation quality with sacreBLEU: detokenised, cased BLEU and chrF on the untouched
references, plus lower-cased BLEU for comparison with published Multi30k figures."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import sacrebleu

from .errors import UserError


@dataclass(frozen=True)
class Scores:
    bleu: float  # sacreBLEU, cased, 13a tokenisation of detokenised text
    chrf: float
    bleu_lc: float  # the same, lower-cased (closest to the published lower-cased Multi30k BLEU)
    bleu_signature: str
    chrf_signature: str
    n_sentences: int

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (f"BLEU {self.bleu:.2f}  chrF {self.chrf:.2f}  lower-cased BLEU {self.bleu_lc:.2f}  "
                f"({self.n_sentences} sentences; {self.bleu_signature})")


def score(hypotheses: list[str], references: list[str]) -> Scores:
    """Score detokenised hypotheses against the untouched references (same order)."""
    if len(hypotheses) != len(references):
        raise UserError(f"{len(hypotheses)} translations but {len(references)} references; "
                        "the files must have one line per sentence")
    bleu = sacrebleu.BLEU()
    bleu_lc = sacrebleu.BLEU(lowercase=True)
    chrf = sacrebleu.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    lc = bleu_lc.corpus_score(hypotheses, [references])
    return Scores(b.score, c.score, lc.score, str(bleu.get_signature()), str(chrf.get_signature()),
                  len(hypotheses))
