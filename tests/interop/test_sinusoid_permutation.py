"""Changing the sinusoid layout by permuting d_model keeps every logit."""
import pytest
import torch

from transformer import ModelConfig, Transformer
from transformer.interop import to_concat_layout, to_marian
from transformer.model.embedding import sinusoid_table
from transformer.interop.sinusoid_permutation import interleaved_to_concat


def test_permutation_maps_the_tables():
    inter = sinusoid_table(50, 16, "interleaved")
    concat = sinusoid_table(50, 16, "concat")
    assert torch.equal(inter[:, interleaved_to_concat(16)], concat)


@pytest.mark.parametrize("opts", [dict(), dict(ffn_activation="swiglu", norm_first=True),
                                  dict(tie_embeddings=False, tgt_vocab_size=23, output_bias=True)])
def test_concat_layout_model_computes_the_same_logits(opts):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=19 if opts.get("tgt_vocab_size") else 23, d_model=16, n_heads=2, d_ff=16,
                      n_layers=2, dropout=0.0, **opts)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # make every parameter matter, biases and norms included
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    other = to_concat_layout(model)
    assert other.cfg.sinusoid_layout == "concat" and model.cfg.sinusoid_layout == "interleaved"
    src = torch.tensor([[4, 5, 6, 2, 0], [7, 8, 9, 10, 2]])
    tgt = torch.tensor([[1, 4, 5], [1, 6, 7]])
    assert (model(src, tgt) - other(src, tgt)).abs().max() < 1e-5


def test_marian_export_of_a_paper_layout_model():
    torch.manual_seed(1)
    model = Transformer(ModelConfig(vocab_size=30, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0)).eval()
    hf = to_marian(model).eval()
    src = torch.tensor([[4, 5, 6, 2, 0], [7, 8, 9, 10, 2]])
    tgt = torch.tensor([[1, 4, 5], [1, 6, 7]])
    theirs = hf(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt).logits
    assert (model(src, tgt) - theirs).abs().max() < 1e-5
