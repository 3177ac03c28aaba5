"""The vocabulary shortlist (decode/shortlist.py): with every token in it the search is the full
search bit for bit; a token outside it is never produced; the file round-trips and a bad one is
refused in one line."""
from __future__ import annotations

import pytest
import torch

from transformer.decode import beam_search, greedy_search
from transformer.decode.precision import for_inference
from transformer.decode.shortlist import (Shortlist, build_shortlist, load_shortlist, save_shortlist,
                                          search_shortlisted)
from transformer.errors import UserError

V = 13  # the tiny models' vocabulary (pad 0, bos 1, eos 2)


def whole(vocab: int = V, target: int | None = None) -> Shortlist:
    """A shortlist holding every target token for every source token."""
    target = vocab if target is None else target
    return Shortlist(torch.zeros(vocab + 1, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                     torch.arange(target), target)


def only(tokens: list[int], vocab: int = V) -> Shortlist:
    """Every sentence restricted to ``tokens`` (and the ids the search needs)."""
    return Shortlist(torch.zeros(vocab + 1, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                     torch.tensor(tokens), vocab)


def search(model, src, shortlist, beam, n_best=1):
    if shortlist is None:
        if beam == 1:
            return greedy_search(model, src, 1.0, 6)
        return beam_search(model, src, beam, 0.6, n_best, 1.0, 6)
    return search_shortlisted(model, src, shortlist, beam, 0.6, n_best, 1.0, 6)


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_a_shortlist_of_every_token_gives_the_full_search(variant_model, ragged_src, beam, precision):
    model = for_inference(variant_model, precision)
    n_best = 1 if beam == 1 else 3
    full = search(model, ragged_src, None, beam, n_best)
    listed = search(model, ragged_src, whole(model.cfg.vocab_size, model.cfg.target_vocab_size), beam, n_best)
    assert [[(h.tokens, h.score, h.logprob) for h in hs] for hs in listed] == \
           [[(h.tokens, h.score, h.logprob) for h in hs] for hs in full]


@pytest.mark.parametrize("beam", [1, 4])
def test_a_token_outside_the_shortlist_is_never_produced(decoder_model, ragged_src, beam):
    full = {t for hs in search(decoder_model, ragged_src, None, beam, 2 if beam > 1 else 1) for h in hs
            for t in h.tokens}
    allowed = sorted(full)[: len(full) // 2] + [2]  # half of what the full search produces, and EOS
    assert set(full) - set(allowed), "the full search must produce a token the shortlist leaves out"
    found = search(decoder_model, ragged_src, only(allowed), beam, 2 if beam > 1 else 1)
    produced = {t for hs in found for h in hs for t in h.tokens}
    assert produced and produced <= set(allowed)
    assert all(h.tokens[-1] == 2 for hs in found for h in hs)  # each still ends with EOS


def test_a_batch_takes_the_union_of_its_tokens_candidates():
    pairs = [([3, 4], [7, 8]), ([3, 5], [7, 9]), ([6], [10])] * 3
    shortlist = build_shortlist(pairs, V, V, eos_id=2, shared=False, per_source=1, frequent=0)
    # 3 always with 7; 4 with 8 (7 ties with it on count, 8's Dice is higher); 5 with 9; 6 with 10
    assert shortlist.for_batch(torch.tensor([[3, 0]])).tolist() == [2, 7]
    assert shortlist.for_batch(torch.tensor([[4, 0], [6, 5]])).tolist() == [2, 8, 9, 10]
    shared = build_shortlist(pairs, V, V, eos_id=2, shared=True, per_source=1, frequent=1)
    assert shared.for_batch(torch.tensor([[11]])).tolist() == [2, 7, 11]  # itself, the most frequent, EOS
    assert 7 in shared.always.tolist() and 2 in shared.always.tolist()


def test_the_file_round_trips(tmp_path):
    pairs = [([3, 4, 5], [6, 7]), ([4, 8], [9, 7, 7]), ([12], [11])]
    shortlist = build_shortlist(pairs, V, 11 + 1, eos_id=2, shared=False, per_source=2, frequent=1)
    path = save_shortlist(shortlist, tmp_path / "shortlist.safetensors")
    back = load_shortlist(path, V, 12)
    for name in ("offsets", "targets", "always"):
        assert torch.equal(getattr(back, name), getattr(shortlist, name)), name
    assert (back.target_vocab, back.per_source, back.frequent) == (12, 2, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["shortlist.safetensors"]  # no temporary file left


def test_a_link_is_replaced_not_written_through(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (tmp_path / "run").mkdir()
    link = tmp_path / "run" / "shortlist.safetensors"
    link.symlink_to(outside)
    with pytest.raises(UserError, match="symbolic link"):
        load_shortlist(link, V, V)  # never read through
    save_shortlist(whole(), link)
    assert outside.read_text() == "keep" and not link.is_symlink()


@pytest.mark.parametrize("content, says", [
    (None, "no vocabulary shortlist there"),
    (b"not a safetensors file", "truncated or corrupt"),
    ("other-kind", "another kind"),
    ("other-vocab", "belongs to another model"),
    ("out-of-range", "inconsistent"),
])
def test_a_bad_file_is_refused_in_one_line(tmp_path, content, says):
    from safetensors.torch import save_file

    path = tmp_path / "shortlist.safetensors"
    if content == "other-kind":
        save_file({"weight": torch.zeros(2)}, str(path))
    elif content == "other-vocab":
        save_shortlist(whole(V + 1), path)
    elif content == "out-of-range":
        save_shortlist(only([2, V + 5]), path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=says) as e:
        load_shortlist(path, V, V)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
