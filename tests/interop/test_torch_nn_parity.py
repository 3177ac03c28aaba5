"""Our encoder/decoder stacks == torch.nn.Transformer with the same weights, on the same
embedded input, in train mode (dropout 0, the plain Python path) and in eval mode under
no_grad (PyTorch's fast path: fused kernels and nested tensors for the padded source)."""
import pytest
import torch
from torch import nn

from transformer import ModelConfig, Transformer
from transformer.interop import load_from_torch_nn
from transformer.model import masks

D_MODEL, N_HEADS, D_FF, N_LAYERS = 32, 4, 64, 2
PAD = 0
TOL = 1e-5

pytestmark = [
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage"),
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True, but self.use_nested_tensor is False"),
]


def build_pair(norm_first: bool, activation: str = "relu", seed: int = 0):
    torch.manual_seed(seed)
    ref = nn.Transformer(D_MODEL, N_HEADS, num_encoder_layers=N_LAYERS, num_decoder_layers=N_LAYERS,
                         dim_feedforward=D_FF, dropout=0.0, activation=activation,
                         batch_first=True, norm_first=norm_first)
    with torch.no_grad():  # make the LayerNorm affine parameters non-trivial too
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    cfg = ModelConfig(vocab_size=11, d_model=D_MODEL, n_heads=N_HEADS, d_ff=D_FF, n_layers=N_LAYERS,
                      dropout=0.0, norm_first=norm_first, final_norm=True, ffn_activation=activation,
                      pad_id=PAD)
    model = Transformer(cfg)
    load_from_torch_nn(model, ref)
    return model, ref


def inputs(seed: int = 1):
    """Embedded source and target, and source ids whose padding gives the source mask."""
    g = torch.Generator().manual_seed(seed)
    src_len = torch.tensor([7, 4, 1])  # sentence 0 is full length, the others padded
    s, t = int(src_len.max()), 5
    src = torch.randint(1, 11, (3, s), generator=g)
    src[torch.arange(s)[None, :] >= src_len[:, None]] = PAD
    src_emb = torch.randn(3, s, D_MODEL, generator=g)
    tgt_emb = torch.randn(3, t, D_MODEL, generator=g)
    return src, src_emb, tgt_emb


def run_ours(model: Transformer, src, src_emb, tgt_emb):
    memory, _ = model.encoder(src_emb, model.src_mask(src))
    out, _, _ = model.decoder(tgt_emb, model.start_cache(memory, src))
    return memory, out


def run_ref(ref: nn.Transformer, src, src_emb, tgt_emb):
    pad = masks.to_key_padding_mask(masks.padding_mask(src, PAD))  # (B, S) True = padding
    causal = nn.Transformer.generate_square_subsequent_mask(tgt_emb.size(1))  # float, -inf above the diagonal
    memory = ref.encoder(src_emb, src_key_padding_mask=pad)
    out = ref(src_emb, tgt_emb, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad)
    return memory, out


def max_diffs(model, ref, mode: str):
    src, src_emb, tgt_emb = inputs()
    real = src != PAD  # (B, S)
    model.train(mode == "train")
    ref.train(mode == "train")
    with torch.set_grad_enabled(mode == "train"):
        mem_ours, out_ours = run_ours(model, src, src_emb, tgt_emb)
        mem_ref, out_ref = run_ref(ref, src, src_emb, tgt_emb)
    # In eval mode torch.nn's nested-tensor path writes zeros at padded source positions;
    # nothing downstream reads them (they are masked), so compare real positions only.
    mem_diff = (mem_ours - mem_ref)[real].abs().max().item()
    out_diff = (out_ours - out_ref).abs().max().item()
    return mem_diff, out_diff


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_same_output_as_torch_nn_transformer(norm_first, mode):
    model, ref = build_pair(norm_first)
    mem_diff, out_diff = max_diffs(model, ref, mode)
    print(f"norm_first={norm_first} mode={mode}: encoder {mem_diff:.2e}, decoder {out_diff:.2e}")
    assert mem_diff < TOL
    assert out_diff < TOL


def test_gelu_parity():
    model, ref = build_pair(norm_first=False, activation="gelu", seed=3)
    mem_diff, out_diff = max_diffs(model, ref, "eval")
    assert mem_diff < TOL and out_diff < TOL


def test_eval_mode_really_takes_the_fast_path():
    """Guard for the test above: only on its fast path does torch.nn's encoder run the layers
    on a nested tensor, which comes back with zeros at padded positions; the final LayerNorm
    then turns those zeros into its bias. So this shows the eval case exercises that path."""
    _, ref = build_pair(norm_first=False)
    src, src_emb, _ = inputs()
    pad = src == PAD
    ref.eval()
    with torch.no_grad():
        memory = ref.encoder(src_emb, src_key_padding_mask=pad)
    assert torch.equal(memory[pad], ref.encoder.norm.bias.expand(int(pad.sum()), -1))


def test_padding_positions_do_not_change_the_decoder_output():
    model, _ = build_pair(norm_first=False)
    model.eval()
    src, src_emb, tgt_emb = inputs()
    _, out = run_ours(model, src, src_emb, tgt_emb)
    src_emb2 = src_emb.clone()
    src_emb2[src == PAD] = 100.0  # garbage at padded positions
    _, out2 = run_ours(model, src, src_emb2, tgt_emb)
    assert torch.allclose(out, out2, atol=1e-6)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(d_ff=48), "ffn.fc1.weight"),
        (dict(n_layers=3), "decoder layers"),
        (dict(final_norm=False), "final_norm=True"),
        (dict(norm_first=True), "norm_first"),
        (dict(ffn_activation="gelu"), "activation"),
        (dict(n_heads=2), "heads"),
        (dict(layer_norm_eps=1e-6), "eps"),
    ],
)
def test_mismatch_raises_a_clear_error(change, match):
    ref = nn.Transformer(D_MODEL, N_HEADS, N_LAYERS, N_LAYERS, D_FF, dropout=0.0, batch_first=True)
    base = dict(vocab_size=11, d_model=D_MODEL, n_heads=N_HEADS, d_ff=D_FF, n_layers=N_LAYERS,
                dropout=0.0, final_norm=True)
    model = Transformer(ModelConfig(**{**base, **change}))
    with pytest.raises(ValueError, match=match):
        load_from_torch_nn(model, ref)


def test_d_model_mismatch_raises():
    ref = nn.Transformer(16, 4, N_LAYERS, N_LAYERS, D_FF, dropout=0.0, batch_first=True)
    model = Transformer(ModelConfig(vocab_size=11, d_model=D_MODEL, n_heads=N_HEADS, d_ff=D_FF,
                                    n_layers=N_LAYERS, final_norm=True))
    with pytest.raises(ValueError, match="d_model"):
        load_from_torch_nn(model, ref)
