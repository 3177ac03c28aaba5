"""What the Hugging Face causal-LM parity tests (``test_gpt2_parity.py``,
``test_llama_parity.py``) share: random weights, padded batches, HF's and our greedy
continuations, and the checks that the two models agree (logits, greedy runs, weights).

Padding. Our model reads the id ``pad`` as padding wherever it occurs; HF reads
``attention_mask``. Prompts never contain PAD, and :func:`randomize` zeroes PAD's output
row so that neither model ever *generates* it (a generated PAD would be real to HF and
padding to us). HF's ``generate`` derives ``position_ids`` from the mask (``cumsum - 1``),
as our model does from the ids; a plain HF forward does not, so the left-padded forward in
:func:`check_logits` passes them.
"""
from __future__ import annotations

import torch
from hf_checkpoints import randomize as randomize_weights

from transformer.decode import generate

TOL = 1e-4  # max abs logit difference
NEW = 12  # new tokens per greedy continuation


@torch.no_grad()
def randomize(module: torch.nn.Module, seed: int, pad: int, std: float = 0.3) -> None:
    """Weights from our own generator (:func:`hf_checkpoints.randomize`: norm gains near 1,
    everything else N(0, std)); then ``pad``'s output row zero, so PAD is never the argmax."""
    randomize_weights(module, seed, std)
    head = module.get_output_embeddings().weight if hasattr(module, "get_output_embeddings") \
        else module.output_layer()[0]
    head[pad].zero_()


def left_padded(prompts, pad):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    return ids, (ids != pad).long()


def right_padded(prompts, pad):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts])
    return ids, (ids != pad).long()


@torch.no_grad()
def hf_greedy(hf, prompts, pad, eos, n=NEW):
    """HF ``generate`` greedy on the left-padded batch; each row's new tokens, cut after EOS."""
    ids, mask = left_padded(prompts, pad)
    out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=0,
                      pad_token_id=pad, eos_token_id=eos)[:, ids.size(1):].tolist()
    return [row[: row.index(eos) + 1] if eos in row else row for row in out]


def ours_greedy(model, prompts, n=NEW):
    return generate(model, prompts, n, temperature=0, stop_id=model.cfg.eos_id)


# ---- the checks -----------------------------------------------------------------------------
def check_logits(ours, hf, prompts, pad, label: str) -> None:
    """Our logits are HF's: one unpadded prompt, a right-padded and a left-padded batch."""
    with torch.no_grad():
        ids, _ = left_padded([prompts[0]], pad)
        diff = (ours(ids) - hf(ids).logits).abs().max().item()
        ids, mask = right_padded(prompts, pad)  # right padding: equal at the real positions
        real = mask.bool()
        rdiff = (ours(ids)[real] - hf(input_ids=ids, attention_mask=mask).logits[real]).abs().max().item()
        ids, mask = left_padded(prompts, pad)  # left padding, with the positions generate() would use
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        real = mask.bool()
        ldiff = (ours(ids)[real] - hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits[real]
                 ).abs().max().item()
    print(f"{label}: max abs logit diff {diff:.2e}, right-padded {rdiff:.2e}, left-padded {ldiff:.2e}")
    assert max(diff, rdiff, ldiff) < TOL


def check_greedy(model, hf, prompts, pad, eos, label: str) -> None:
    """Our greedy continuations are HF ``generate``'s, batched and for each prompt alone."""
    batched_hf = hf_greedy(hf, prompts, pad, eos)
    batched_ours = ours_greedy(model, prompts)
    print(label, batched_ours)
    assert batched_ours == batched_hf
    assert not any(pad in row for row in batched_ours)
    assert len({tuple(r) for r in batched_ours}) > 1, "the rows should differ"
    for i, p in enumerate(prompts):  # each prompt alone: the batched result, on both sides
        alone_hf, alone_ours = hf_greedy(hf, [p], pad, eos), ours_greedy(model, [p])
        assert alone_ours == alone_hf == [batched_ours[i]]


def check_same_weights(hf, back) -> None:
    """Two HF models hold the same tensors under the same names (a round trip kept every weight)."""
    theirs, ours = hf.state_dict(), back.state_dict()
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
