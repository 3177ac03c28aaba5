"""The scores of `transformer evaluate`: the lower-cased, Moses-tokenised BLEU that published
Multi30k results use, beside sacreBLEU's detokenised cased BLEU."""
from __future__ import annotations

import math
from collections import Counter

import pytest
import sacrebleu

from transformer.evaluation.translation import moses_lc_tokenize, score, tokenized_lc_bleu


def multi_bleu(hyps: list[str], refs: list[str]) -> float:
    """multi-bleu.perl's corpus BLEU on whitespace tokens, written out: clipped n-gram
    precisions for n = 1..4, geometric mean, brevity penalty (an independent oracle)."""
    match, total = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs):
        h, r = h.split(), r.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rc = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            match[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    log_p = sum(math.log(m / t) for m, t in zip(match, total)) / 4
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_p)


def test_moses_steps_lowercase_normalise_and_split_punctuation():
    assert moses_lc_tokenize("Ein Mann, der „Äpfel“ isst.", "de") == 'ein mann , der " äpfel " isst .'
    assert moses_lc_tokenize("A dog's toy, isn't it?", "en") == "a dog 's toy , isn 't it ?"
    assert moses_lc_tokenize("L'homme  porte un T-shirt.", "fr") == "l' homme porte un t-shirt ."


def test_case_and_attached_punctuation_do_not_count():
    hyps = ["Ein Mann, der Äpfel isst.", "Zwei HUNDE spielen im Schnee!"]
    refs = ["ein Mann , der äpfel isst .", "zwei Hunde spielen im Schnee !"]
    value, signature = tokenized_lc_bleu(hyps, refs, "de")
    assert value == pytest.approx(100.0)
    assert signature.startswith("moses-lc:de|") and "tok:none" in signature and "case:lc" in signature
    assert sacrebleu.corpus_bleu(hyps, [refs]).score < 60  # cased sacreBLEU does see the difference


def test_equals_multi_bleu_on_the_tokenised_text():
    hyps = ["Ein Mann fährt mit dem Fahrrad auf einer Straße.", "Ein Hund läuft durch das hohe Gras.",
            "Zwei Frauen sitzen auf einer Bank und reden.", "Ein kleines Mädchen spielt im Sand."]
    refs = ["Ein Mann fährt Fahrrad auf der Straße.", "Ein brauner Hund rennt durch hohes Gras.",
            "Zwei Frauen sitzen auf einer Parkbank und unterhalten sich.", "Ein kleines Mädchen spielt am Strand im Sand."]
    value, _ = tokenized_lc_bleu(hyps, refs, "de")
    oracle = multi_bleu([moses_lc_tokenize(h, "de") for h in hyps], [moses_lc_tokenize(r, "de") for r in refs])
    assert 10 < value < 90
    assert value == pytest.approx(oracle, abs=1e-9)


def test_score_computes_the_tokenised_figure_only_with_a_language():
    hyps, refs = ["A man eats an apple."], ["a man eats an apple ."]
    plain = score(hyps, refs)
    assert plain.bleu_tok_lc is None and plain.tok_lc_signature is None
    assert "tokenised" not in plain.summary()
    with_lang = score(hyps, refs, lang="en")
    assert with_lang.bleu_tok_lc == pytest.approx(100.0)
    assert with_lang.bleu == plain.bleu and with_lang.bleu_lc == plain.bleu_lc
    assert "lower-cased tokenised BLEU 100.00" in with_lang.summary()
