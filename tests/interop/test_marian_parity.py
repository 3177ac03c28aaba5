"""Hugging Face Marian import/export: the same logits and the same search results as
``transformers.MarianMTModel``, on tiny randomly initialised models.

Ids follow Marian: EOS = 0, PAD = the last id, and decoding starts from PAD.
"""
import pytest
import torch
from hf_checkpoints import randomize_marian
from transformers import MarianConfig, MarianMTModel
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from transformer import ModelConfig, Transformer
from transformer.decode import beam_search, greedy_search
from transformer.interop import from_marian, load_marian, save_marian, to_marian
from transformer.model.embedding import sinusoid_table

V, PAD, EOS = 60, 59, 0
TOL = 1e-5


def marian_config(**overrides) -> MarianConfig:
    kwargs = dict(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="relu",
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=64,
        scale_embedding=True, pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=EOS,
        forced_eos_token_id=EOS,
    )
    return MarianConfig(**{**kwargs, **overrides})


@torch.no_grad()
def tiny_marian(seed: int = 0, std: float = 0.1, **overrides) -> MarianMTModel:
    """A MarianMTModel in eval mode with weights drawn from our own generator
    (:func:`hf_checkpoints.randomize_marian`)."""
    hf = MarianMTModel(marian_config(**overrides)).eval()
    randomize_marian(hf, seed, std)
    return hf


def padded_sources(seed: int = 1, lengths=(9, 5, 2, 7, 12, 3), vocab: int = V) -> torch.Tensor:
    """(B, S) ids without PAD or EOS inside, right-padded with PAD."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    s = int(lengths.max())
    src = torch.randint(1, min(vocab, PAD), (len(lengths), s), generator=g)
    src[torch.arange(s)[None, :] >= lengths[:, None]] = PAD
    return src


def hf_logits(hf: MarianMTModel, src: torch.Tensor, tgt: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits


def our_logits(model: Transformer, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(src, tgt)


def decoder_inputs(batch: int, length: int, start: int, vocab: int, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tgt = torch.randint(1, min(vocab, PAD), (batch, length), generator=g)
    tgt[:, 0] = start
    return tgt


# ---- positions ------------------------------------------------------------------------------
@pytest.mark.parametrize("d_model", [32, 33, 512])
def test_hf_position_table_is_our_concat_table(d_model):
    """HF's PE(pos, j) = pos / 10000^(2*(j//2)/d), sin of the even j first, then cos of the
    odd j: the same frequencies as ours, [sin | cos]. Equal bit for bit."""
    hf_table = MarianSinusoidalPositionalEmbedding(512, d_model).create_weight()
    assert torch.equal(hf_table, sinusoid_table(512, d_model, "concat"))


def test_import_rejects_a_different_position_table():
    hf = tiny_marian()
    with torch.no_grad():
        hf.model.encoder.embed_positions.weight.zero_()
    with pytest.raises(ValueError, match="position table"):
        from_marian(hf)


# ---- import: logits -------------------------------------------------------------------------
VARIANTS = {
    # shared and tied (the usual OPUS-MT layout)
    "tied-relu": dict(),
    # HF 5.x: share_encoder_decoder_embeddings=True but tie_word_embeddings=False gives
    # three independent matrices
    "shared-untied-gelu": dict(activation_function="gelu", tie_word_embeddings=False),
    # separate vocabularies, output tied to the decoder embedding, swish = silu
    "separate-vocab-swish": dict(activation_function="swish", share_encoder_decoder_embeddings=False,
                                 vocab_size=70, decoder_vocab_size=V),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_imported_model_gives_hf_logits(variant):
    hf = tiny_marian(**VARIANTS[variant])
    model = from_marian(hf)
    assert not model.training
    cfg = model.cfg
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (PAD, PAD, EOS)
    assert cfg.sinusoid_layout == "concat" and cfg.output_bias and not cfg.norm_first
    assert cfg.tie_embeddings == (variant == "tied-relu")
    src = padded_sources(vocab=hf.config.vocab_size)
    tgt = decoder_inputs(src.size(0), 8, PAD, hf.config.decoder_vocab_size)
    diff = (our_logits(model, src, tgt) - hf_logits(hf, src, tgt)).abs().max().item()
    print(f"{variant}: max abs logit diff {diff:.2e}")
    assert diff < TOL


def test_imported_model_gives_hf_eager_attention_logits():
    """HF's eager attention (matmul, additive mask, softmax) instead of its default SDPA."""
    hf = tiny_marian()
    model = from_marian(hf)
    hf.set_attn_implementation("eager")
    src = padded_sources()
    tgt = decoder_inputs(src.size(0), 8, PAD, V)
    diff = (our_logits(model, src, tgt) - hf_logits(hf, src, tgt)).abs().max().item()
    print(f"eager attention: max abs logit diff {diff:.2e}")
    assert diff < TOL


def test_tied_import_shares_one_matrix():
    model = from_marian(tiny_marian())
    assert model.tgt_embed is model.src_embed and model.out_proj is None
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == model.num_parameters()
    assert sum(1 for _ in model.parameters()) == len({id(p) for p in model.parameters()})


# ---- import: search -------------------------------------------------------------------------
MAX_NEW = 30  # generous: every hypothesis below must end with EOS well before this
SEARCH_MODELS = {
    # (seed, overrides, gain on the decoder's last LayerNorm, scale of the EOS output row,
    #  EOS logit bias), chosen so that the outputs end by EOS at varied lengths.
    "untied-a": (0, dict(tie_word_embeddings=False), 3.0, 3.0, 0.0),
    "untied-b": (1, dict(tie_word_embeddings=False), 3.0, 3.0, -2.0),
    "tied": (1, dict(), 3.0, 4.0, -2.0),
}


@torch.no_grad()
def search_model(name: str) -> MarianMTModel:
    """Random models are flat and rarely say EOS: sharpen the output distribution (a gain
    on the last LayerNorm) and give EOS a context-dependent logit (scaled output row plus
    a bias) so that hypotheses finish at different lengths."""
    seed, overrides, gain, eos_scale, eos_bias = SEARCH_MODELS[name]
    hf = tiny_marian(seed=seed, **overrides)
    hf.model.decoder.layers[-1].final_layer_norm.weight.mul_(gain)
    hf.lm_head.weight[EOS].mul_(eos_scale)
    hf.final_logits_bias[0, EOS] = eos_bias
    return hf


def hf_sequences(out: torch.Tensor) -> list[list[int]]:
    """Drop the decoder start token; cut after the first EOS (the rest is padding)."""
    seqs = []
    for row in out.tolist():
        row = row[1:]
        seqs.append(row[: row.index(EOS) + 1] if EOS in row else row)
    return seqs


@pytest.mark.parametrize("name", list(SEARCH_MODELS))
def test_beam_search_gives_hf_generate_nbest(name):
    hf = search_model(name)
    model = from_marian(hf)
    src = padded_sources()
    k = 4
    ours = beam_search(model, src, beam_size=k, alpha=0.0, n_best=k, max_len_a=0.0, max_len_b=MAX_NEW)
    out = hf.generate(
        input_ids=src, attention_mask=(src != PAD).long(), num_beams=k, num_return_sequences=k,
        length_penalty=0.0, max_new_tokens=MAX_NEW, do_sample=False, early_stopping=False,
        # HF does not block PAD for Marian by itself; OPUS-MT checkpoints ship this setting
        bad_words_ids=[[PAD]], output_scores=True, return_dict_in_generate=True,
    )
    theirs = hf_sequences(out.sequences)
    their_scores = out.sequences_scores.tolist()  # sum of log-probs when length_penalty=0

    lengths = [len(h.tokens) for hyps in ours for h in hyps]
    assert max(lengths) < MAX_NEW, "a hypothesis reached the length limit: the comparison would be unfair"
    assert len(set(lengths)) >= 3 and len({len(hyps[0].tokens) for hyps in ours}) >= 2, \
        "want hypotheses of varied lengths"
    # HF too must finish before its limit: there, forced_eos_token_id gives the forced EOS a
    # log-prob of 0 (ours keeps EOS's real log-prob), so a cut-off hypothesis can win in HF.
    assert all(s[-1] == EOS and EOS not in s[:-1] and len(s) < MAX_NEW for s in theirs)

    worst = 0.0
    for b, hyps in enumerate(ours):
        for j, h in enumerate(hyps):
            assert h.tokens == theirs[b * k + j], f"sentence {b}, hypothesis {j}"
            worst = max(worst, abs(h.logprob - their_scores[b * k + j]))
    print(f"{name}: best lengths {[len(h[0].tokens) for h in ours]}, max |logprob diff| {worst:.2e}")
    assert worst < 1e-4


@pytest.mark.parametrize("name", list(SEARCH_MODELS))
def test_greedy_search_gives_hf_greedy(name):
    hf = search_model(name)
    model = from_marian(hf)
    src = padded_sources()
    ours = [h[0].tokens for h in greedy_search(model, src, max_len_a=0.0, max_len_b=MAX_NEW)]
    out = hf.generate(input_ids=src, attention_mask=(src != PAD).long(), num_beams=1, do_sample=False,
                      max_new_tokens=MAX_NEW, bad_words_ids=[[PAD]])
    assert ours == hf_sequences(out)


# ---- export -----------------------------------------------------------------------------------
def test_round_trip_gives_identical_logits():
    hf = tiny_marian(tie_word_embeddings=False)
    back = to_marian(from_marian(hf))
    src = padded_sources()
    tgt = decoder_inputs(src.size(0), 8, PAD, V)
    diff = (hf_logits(back, src, tgt) - hf_logits(hf, src, tgt)).abs().max().item()
    print(f"round trip: max abs logit diff {diff:.2e}")
    assert diff < TOL
    theirs = hf.state_dict()
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name


def our_model(**overrides) -> Transformer:
    kwargs = dict(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64,
                  sinusoid_layout="concat", output_bias=True, pad_id=PAD, bos_id=1, eos_id=EOS)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**kwargs, **overrides})).eval()
    with torch.no_grad():
        model.out_bias.normal_()
    return model


@pytest.mark.parametrize("overrides", [dict(), dict(tie_embeddings=False, tgt_vocab_size=V + 5,
                                                    ffn_activation="silu")], ids=["tied", "untied"])
def test_exported_model_gives_our_logits(overrides):
    model = our_model(**overrides)
    hf = to_marian(model)
    assert not hf.training
    src = padded_sources()
    tgt = decoder_inputs(src.size(0), 8, model.cfg.bos_id, model.cfg.target_vocab_size)
    diff = (hf_logits(hf, src, tgt) - our_logits(model, src, tgt)).abs().max().item()
    print(f"export {overrides}: max abs logit diff {diff:.2e}")
    assert diff < TOL


def test_exported_generation_config_blocks_pad_and_bos():
    """With BOS != PAD both are blocked, as in our own search, so HF greedy == ours."""
    model = our_model()
    hf = to_marian(model)
    src = padded_sources()
    out = hf.generate(input_ids=src, attention_mask=(src != PAD).long(), num_beams=1, do_sample=False,
                      max_new_tokens=12)
    ours = [h[0].tokens for h in greedy_search(model, src, max_len_a=0.0, max_len_b=12)]
    assert ours == hf_sequences(out)


def test_save_and_load_directory(tmp_path):
    model = our_model()
    out_dir = save_marian(model, tmp_path / "marian")
    assert (out_dir / "config.json").is_file()
    loaded = load_marian(out_dir)
    hf = MarianMTModel.from_pretrained(out_dir, local_files_only=True).eval()
    src = padded_sources()
    tgt = decoder_inputs(src.size(0), 8, model.cfg.bos_id, V)
    expected = our_logits(model, src, tgt)
    assert (our_logits(loaded, src, tgt) - expected).abs().max().item() < TOL
    assert (hf_logits(hf, src, tgt) - expected).abs().max().item() < TOL


def test_load_marian_never_downloads(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_marian(tmp_path / "Helsinki-NLP" / "opus-mt-en-de")


# ---- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(decoder_layers=1), "decoder_layers"),
        (dict(decoder_attention_heads=2), "n_heads"),
        (dict(decoder_ffn_dim=32), "d_ff"),
        (dict(scale_embedding=False), "scale_embedding"),
        (dict(activation_function="gelu_new"), "activation_function"),
    ],
)
def test_import_rejects_what_our_model_cannot_express(overrides, match):
    with pytest.raises(ValueError, match=match):
        from_marian(MarianMTModel(marian_config(**overrides)))


def test_import_rejects_other_models():
    with pytest.raises(ValueError, match="MarianMTModel"):
        from_marian(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(norm_first=True), "post-norm"),
        (dict(final_norm=True), "final LayerNorm"),
        (dict(ffn_activation="swiglu"), "swiglu"),
        (dict(layer_norm_eps=1e-6), "eps"),
    ],
)
def test_export_rejects_what_marian_cannot_express(overrides, match):
    with pytest.raises(ValueError, match=match):
        to_marian(our_model(**overrides))
