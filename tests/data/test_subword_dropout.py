"""BPE-dropout: the merges reproduce sentencepiece, the epochs are seeded, lossless and the
same in any process, and a larger dropout cuts words into more pieces."""
import json
import random
import subprocess
import sys

import pytest

from transformer.data.subword_dropout import SubwordDropout, bpe_merge


@pytest.fixture(scope="module")
def texts(sample):
    """The conftest's Multi30k sample (3,000 English and 3,000 German lines)."""
    return sample


@pytest.fixture(scope="module")
def encoded(subwords, texts):
    """The texts in their usual pieces, which SubwordDropout starts from."""
    return [subwords.encode(t) for t in texts]


@pytest.fixture(scope="module")
def dropout(subwords, encoded):
    return SubwordDropout(subwords, encoded, 0.1, seed=5)


def test_without_dropout_the_merges_are_sentencepieces(subwords, texts, dropout):
    """Every distinct word of the text: our merges with p = 0 give sentencepiece's pieces,
    so no word had to fall back to its fixed segmentation."""
    assert dropout.n_words > 1000
    assert dropout.n_kept_fixed == 0


def test_epochs_are_seeded_lossless_and_differ(subwords, texts, encoded, dropout):
    first = dropout.epoch(0)
    assert first == dropout.epoch(0)
    assert first != dropout.epoch(1)
    assert first != SubwordDropout(subwords, encoded, 0.1, seed=6).epoch(0)
    assert [subwords.decode(ids) for ids in first] == texts
    fixed = [subwords.encode(t) for t in texts]
    assert sum(map(len, first)) > sum(map(len, fixed))
    # Most words keep their usual pieces at p = 0.1, so most short sentences are unchanged.
    assert 0.1 < sum(a == b for a, b in zip(first, fixed)) / len(texts) < 0.9


def test_more_dropout_more_pieces(subwords, encoded):
    n = {p: sum(map(len, SubwordDropout(subwords, encoded, p, seed=1).epoch(0))) for p in (0.05, 0.1, 0.3)}
    assert n[0.05] < n[0.1] < n[0.3]


def test_bpe_merge_drops_merges():
    scores = {"a": 0.0, "b": 0.0, "ab": -1.0, "abab": -2.0}
    assert bpe_merge("abab", scores) == ["abab"]
    rng = random.Random(0)
    seen = {tuple(bpe_merge("abab", scores, 0.5, rng)) for _ in range(200)}
    assert seen == {("abab",), ("ab", "ab"), ("ab", "a", "b"), ("a", "b", "ab"), ("a", "b", "a", "b")}
    assert bpe_merge("abc", scores) is None  # "c" is not a piece


def test_a_word_with_an_unknown_character_keeps_its_pieces(subwords, texts):
    fixed = subwords.encode("ein ☃ Hund")
    assert subwords.unk_id in fixed
    sd = SubwordDropout(subwords, [fixed] * 40, 0.5, seed=0)
    unknown_word = fixed[fixed.index(subwords.unk_id) - 1: fixed.index(subwords.unk_id) + 1]
    for ids in sd.epoch(0):
        i = ids.index(subwords.unk_id)
        assert ids[i - 1: i + 1] == unknown_word
    assert len({tuple(ids) for ids in sd.epoch(0)}) > 1  # the other words still vary


def test_the_same_in_another_process(subwords, texts, dropout, tmp_path):
    """Ranks of a data-parallel run and a resumed run are other processes."""
    (tmp_path / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    code = (
        "import json; from transformer.data import Subwords; "
        "from transformer.data.subword_dropout import SubwordDropout; "
        f"sw = Subwords.load({str(subwords.path)!r}); "
        f"texts = json.load(open({str(tmp_path / 'texts.json')!r}, encoding='utf-8')); "
        "print(json.dumps(SubwordDropout(sw, [sw.encode(t) for t in texts], 0.1, seed=5).epoch(3)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == dropout.epoch(3)


@pytest.mark.parametrize("p", [0.0, 1.0, -0.2])
def test_dropout_outside_0_1_is_refused(subwords, p):
    with pytest.raises(ValueError, match="dropout"):
        SubwordDropout(subwords, [subwords.encode("a b")], p, seed=0)
