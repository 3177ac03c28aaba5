"""Generation for the language model: greedy equals a loop over the full forward pass,
top-k / top-p never sample outside their set (a hand-made distribution), a seed gives the
same text (one seed per row too), a row's text does not depend on its batch, before or after
its window slides, and the sliding window goes past the model's positions."""
from __future__ import annotations

import pytest
import torch

from transformer import ModelConfig
from transformer.decode import filter_logits, generate
from transformer.decode.sample import next_tokens
from transformer.model import LanguageModel

V = 19


def lm(**over) -> LanguageModel:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("llama-char", vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=24, **over)
    return LanguageModel(cfg).eval()


def naive_greedy(model, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(prompt):]


PROMPTS = [[5, 6, 7, 8, 9], [3], [10, 4, 12]]


def test_greedy_is_the_argmax_of_the_full_forward_at_every_step():
    model = lm()
    out = generate(model, PROMPTS, 10, temperature=0)
    assert out == [naive_greedy(model, p, 10) for p in PROMPTS]


def test_hand_made_distribution_top_k_and_top_p_sets():
    probs = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]])
    logits = probs.log()
    kept = lambda lg: (~torch.isinf(lg[0])).nonzero().flatten().tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [0, 1]
    assert kept(filter_logits(logits, top_p=0.5)) == [0]  # 0.5 reaches 0.5 alone
    assert kept(filter_logits(logits, top_p=0.6)) == [0, 1]  # the token crossing the threshold is in
    assert kept(filter_logits(logits, top_p=0.85)) == [0, 1, 2]
    assert kept(filter_logits(logits, top_p=1.0)) == [0, 1, 2, 3, 4]
    assert kept(filter_logits(logits, top_k=3, top_p=0.6)) == [0, 1]
    gens = [torch.Generator().manual_seed(i) for i in range(2000)]
    for top_k, top_p, allowed in [(2, 1.0, {0, 1}), (0, 0.6, {0, 1}), (0, 0.85, {0, 1, 2}), (1, 1.0, {0})]:
        drawn = next_tokens(logits.expand(2000, -1), 1.0, top_k, top_p, gens)
        assert set(drawn.tolist()) == allowed, (top_k, top_p)  # all of the set, nothing outside it
    # within the set, in proportion: top_k=2 renormalises 0.5 / 0.2 to 0.714 / 0.286
    drawn = next_tokens(logits.expand(2000, -1), 1.0, 2, 1.0, gens)
    assert abs(float((drawn == 0).float().mean()) - 0.5 / 0.7) < 0.04


def test_the_same_seed_gives_the_same_text_and_rows_do_not_depend_on_the_batch():
    model = lm()
    a = generate(model, PROMPTS, 12, temperature=1.0, top_k=10, seed=7)
    assert generate(model, PROMPTS, 12, temperature=1.0, top_k=10, seed=7) == a
    assert generate(model, PROMPTS, 12, temperature=1.0, top_k=10, seed=8) != a
    assert generate(model, PROMPTS[:1], 12, temperature=1.0, top_k=10, seed=7) == a[:1]  # row 0 alone


def test_sampling_at_low_temperature_is_greedy():
    model = lm()
    assert generate(model, PROMPTS, 8, temperature=1e-4, seed=1) == generate(model, PROMPTS, 8, temperature=0)


@pytest.mark.parametrize("top_p", [1e-30, 1e-50, 1e-300])
def test_a_top_p_so_small_that_float32_makes_it_0_keeps_the_most_probable_token(top_p):
    """top_p 1e-300 is 0 next to float32 probabilities, so every token was dropped: softmax
    was nan and multinomial raised (a 500 from /generate, a traceback from generate). The
    nucleus is never empty: its limit is the most probable token."""
    logits = torch.tensor([[1.0, 3.0, -2.0, 0.0], [-5.0, -4.0, -7.0, -6.0]])
    assert (~torch.isinf(filter_logits(logits, top_p=top_p))).nonzero().tolist() == [[0, 1], [1, 1]]
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    assert next_tokens(logits, 1.0, 0, top_p, gens).tolist() == [1, 1]


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 1e-300])
def test_a_temperature_so_small_that_logits_overflow_is_its_limit(temperature):
    """logits / 1e-30 leaves float32 (1e-300 is 0 there): softmax was nan and multinomial
    raised; the limit is the most probable token, shared between tied ones. Rows that do not
    overflow sample as before."""
    logits = torch.tensor([[1.0, 3.0, -2.0, 3.0], [-5.0, -4.0, -7.0, -6.0], [0.0, -1.0, -1.0, -1.0]])
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    picks = torch.stack([next_tokens(logits, temperature, 0, 1.0, gens) for _ in range(40)])  # (40, 3)
    assert set(picks[:, 0].tolist()) == {1, 3}  # the two tied best, both drawn
    assert set(picks[:, 1].tolist()) == {1} and set(picks[:, 2].tolist()) == {0}
    gens = [torch.Generator().manual_seed(7)]
    ordinary = logits[:1] * 1e-3  # / 1e-30 stays finite: sampled as ever
    expected = torch.multinomial((ordinary / 1e-30).softmax(-1)[0], 1, generator=torch.Generator().manual_seed(7))
    assert next_tokens(ordinary, 1e-30, 0, 1.0, gens).tolist() == expected.tolist()


def test_generation_goes_past_the_positions_with_a_sliding_window():
    model = lm()
    out = generate(model, [[5, 6, 7]], 60, temperature=0)[0]  # max_len 24
    assert len(out) == 60
    # up to the first slide it is the plain greedy continuation
    assert out[:21] == naive_greedy(model, [5, 6, 7], 21)


def test_past_the_slide_a_row_still_does_not_depend_on_its_batch():
    """Rows of different lengths fill their positions at different steps; each slides where
    it would alone (rebuilding every row's window at the first row's slide changed the rest)."""
    model = lm()
    with torch.no_grad():  # sharper weights: the next token depends on the whole window
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    prompts = [[5, 6, 7], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [9]]  # max_len 24
    for temperature, seed in ((0.0, None), (1.0, 11)):
        together = generate(model, prompts, 50, temperature=temperature, seed=seed)
        seeds = [None] * 3 if seed is None else [seed + i for i in range(3)]
        alone = [generate(model, [p], 50, temperature=temperature, seed=s)[0] for p, s in zip(prompts, seeds)]
        assert together == alone, temperature


def test_a_long_generation_holds_no_more_than_its_windows(monkeypatch):
    """Past the slides the rows keep only what a later slide can need (their windows): the
    whole history grew with every token, so a stream of 10**12 tokens ran out of memory."""
    from transformer.decode import sample

    seen = []
    windows = sample._windows
    monkeypatch.setattr(sample, "_windows", lambda history, *a: seen.append(max(map(len, history))) or
                        windows(history, *a))
    model = lm()  # max_len 24
    generate(model, PROMPTS, 400, temperature=1.0, seed=5)
    assert len(seen) > 20 and max(seen) <= 24 + 1


def test_one_seed_per_row():
    model = lm()
    batch = generate(model, PROMPTS, 12, temperature=1.0, seed=[40, 3, 40])
    assert batch[0] == generate(model, PROMPTS[:1], 12, temperature=1.0, seed=40)[0]
    assert batch[1] == generate(model, PROMPTS[1:2], 12, temperature=1.0, seed=3)[0]
    assert batch[2] == generate(model, PROMPTS[2:], 12, temperature=1.0, seed=[40])[0]
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        generate(model, PROMPTS, 3, temperature=1.0, seed=[1, 2])


def test_stop_id_ends_a_row():
    model = lm()
    first = generate(model, PROMPTS, 6, temperature=0)
    stop = first[0][2]
    out = generate(model, PROMPTS, 6, temperature=0, stop_id=stop)
    assert out[0] == first[0][: first[0].index(stop) + 1]


def test_prompts_must_fit():
    model = lm()
    with pytest.raises(ValueError, match="1 to 23 tokens"):
        generate(model, [[]], 3)
    with pytest.raises(ValueError, match="1 to 23 tokens"):
        generate(model, [[4] * 24], 3)
