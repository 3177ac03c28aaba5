"""The two text tokenizers: characters (nanoGPT's shakespeare_char, offset by the three
reserved ids) and BPE over a text stream (EOS stands for the newline)."""
from __future__ import annotations

import pytest

from transformer.data import train_subwords
from transformer.data.chars import Chars
from transformer.data.text import LineSubwords
from transformer.errors import UserError

from lm_text import make_text


def test_chars_are_the_sorted_set_offset_by_three():
    chars = Chars.learn("hello\nworld")
    assert chars.chars == sorted(set("hello\nworld")) == ["\n", "d", "e", "h", "l", "o", "r", "w"]
    assert chars.vocab_size == 3 + 8
    assert chars.encode("\nd") == [3, 4]
    assert (chars.pad_id, chars.bos_id, chars.eos_id) == (0, 1, 2)


def test_chars_round_trip_and_reload(tmp_path):
    text = "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.\n  tabs\tand spaces  \n"
    chars = Chars.learn(text)
    assert chars.decode(chars.encode(text)) == text
    assert chars.decode([0, 1, 2, *chars.encode("ab")]) == "ab"  # pad / bos / eos dropped
    loaded = Chars.load(chars.save(tmp_path / "chars.json"))
    assert loaded.chars == chars.chars and loaded.encode(text) == chars.encode(text)


def test_an_unknown_character_is_a_one_line_error(tmp_path):
    chars = Chars.learn("abc")
    chars.save(tmp_path / "chars.json")
    with pytest.raises(UserError, match=r"'é' \(U\+00E9\) is not in the character vocabulary of .*chars.json"):
        chars.encode("abé")


def test_a_bad_chars_file_is_a_user_error(tmp_path):
    (tmp_path / "chars.json").write_text('{"chars": ["ab"]}')
    with pytest.raises(UserError, match="single characters"):
        Chars.load(tmp_path / "chars.json")
    with pytest.raises(UserError, match="not found"):
        Chars.load(tmp_path / "missing.json")


def test_bpe_stream_round_trip_keeps_newlines(tmp_path):
    text = make_text(60)
    bpe = LineSubwords(train_subwords(text.split("\n"), tmp_path / "subwords", vocab_size=60))
    for sample in (text, "the cat\n\n  sat on the mat\n", "no newline at the end", "\n"):
        ids = bpe.encode(sample)
        assert bpe.decode(ids) == sample
    assert bpe.encode("a\nb").count(bpe.eos_id) == 1  # EOS stands for the newline
    assert bpe.vocab_size == 60


def test_a_run_gives_back_its_tokenizer(tmp_path):
    from transformer.data.text import load_tokenizer

    run = tmp_path / "run"
    (run / "checkpoints" / "step-0000001").mkdir(parents=True)
    Chars.learn("abc").save(run / "chars.json")
    for path in (run, run / "checkpoints" / "step-0000001" / "model.safetensors"):
        assert load_tokenizer(path).chars == ["a", "b", "c"]
    with pytest.raises(UserError, match="no chars.json or subwords.model"):
        load_tokenizer(tmp_path)
