"""The sentencepiece subword vocabulary: special ids, determinism, lossless round trip."""

import pytest

from transformer.data import Subwords, train_subwords
from transformer.errors import UserError

VOCAB = 1000  # the size of the conftest's ``subwords`` (SAMPLE_VOCAB)


def test_special_ids_match_model_defaults(subwords):
    assert (subwords.pad_id, subwords.bos_id, subwords.eos_id, subwords.unk_id) == (0, 1, 2, 3)
    assert subwords.vocab_size == VOCAB
    assert subwords.vocab()[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert subwords.id_to_piece(3) == "<unk>"


def test_training_is_deterministic(sample, subwords, tmp_path):
    again = train_subwords(sample, tmp_path / "again", vocab_size=VOCAB)
    assert again.vocab() == subwords.vocab()
    assert [again.encode(s) for s in sample[::97]] == [subwords.encode(s) for s in sample[::97]]


def test_round_trip_on_real_sentences(sample, subwords):
    assert all(subwords.decode(subwords.encode(s)) == s for s in sample)
    # The sample holds what a lossy normaliser would damage: umlauts, ß, quotes, commas.
    for needed in ("ä", "ö", "ü", "ß", ",", '"', "-"):
        assert any(needed in s for s in sample), needed
    german = "Ein Mädchen in einem rosa Kleid klettert über große Büsche, oder nicht."
    assert subwords.decode(subwords.encode(german)) == german


@pytest.mark.parametrize("text", ["  two leading", "trailing  ", "a   b", " ", "", "ein  großer  Hund."])
def test_round_trip_keeps_spaces(subwords, text):
    assert subwords.decode(subwords.encode(text)) == text


def test_unseen_character_becomes_unknown(subwords):
    ids = subwords.encode("a 雪 b")
    assert subwords.unk_id in ids
    assert subwords.decode(ids) == "a  ⁇  b"


def test_encode_adds_no_specials_and_decode_drops_them(subwords):
    ids = subwords.encode("A man is sleeping.")
    assert not {0, 1, 2} & set(ids)
    assert subwords.decode([1, *ids, 2, 0, 0]) == "A man is sleeping."
    assert "".join(subwords.pieces("A man")).replace("▁", " ").strip() == "A man"


def test_load_and_bytes_give_the_same_model(subwords):
    for other in (Subwords.load(subwords.path), Subwords.from_bytes(subwords.to_bytes())):
        assert other.vocab() == subwords.vocab()
        assert other.encode("Zwei Hunde spielen.") == subwords.encode("Zwei Hunde spielen.")


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="missing.model.*not found"):
        Subwords.load(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(UserError, match="junk.model.*not a valid sentencepiece model"):
        Subwords.load(tmp_path / "junk.model")


def test_vocab_too_large_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="vocab_size"):
        train_subwords(["a b c", "b c d"], tmp_path / "tiny", vocab_size=5000)
    with pytest.raises(UserError, match="no non-empty"):
        train_subwords(["", ""], tmp_path / "none", vocab_size=100)



def test_cased_model_does_not_lowercase(subwords):
    assert not subwords.lowercases
    assert subwords.decode(subwords.encode("Ein Mann")) == "Ein Mann"


def test_lowercasing_model_lowercases_whatever_it_encodes(sample, tmp_path):
    low = train_subwords(sample, tmp_path / "low", vocab_size=VOCAB, lowercase=True)
    assert low.lowercases
    assert all(piece == piece.lower() for piece in low.vocab()[4:])  # it learned no upper-case pieces
    german = "Ein Mädchen in einem rosa Kleid klettert über GROSSE Büsche, oder nicht."
    assert low.decode(low.encode(german)) == german.lower()
    # str.lower(), not Unicode case folding: ß stays ß, and Ä / Ö / Ü / capital ẞ lower-case
    # even if the training text never held them in upper case.
    assert low.decode(low.encode("Straße ÄÖÜ ẞ")) == "straße äöü ß"
    assert low.decode(low.encode("  two  spaces ")) == "  two  spaces "
    # The rule is part of the saved model: a reload (as translate does) lower-cases too.
    again = Subwords.load(low.path)
    assert again.lowercases and again.encode(german) == low.encode(german.lower())
    assert Subwords.from_bytes(low.to_bytes()).encode("Ein Hund") == low.encode("ein hund")
