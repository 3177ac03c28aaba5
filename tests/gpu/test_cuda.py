"""What holds on a CUDA GPU as on the CPU: decoding in bf16 gives fp32's translations (but for
ties), a training update gives the CPU's weights (within float tolerance), an update never makes
the host wait for the GPU (torch.cuda.set_sync_debug_mode("error")), the language model's
training windows reach the flash kernel, and a query without keys stays finite.

Skipped without a GPU (CI has none); benchmarks/gpu/check.sh runs this file on one. The CPU
side of the same logic is tested elsewhere: the read-back schedule and the host-read count in
tests/train/test_host_reads.py, the fused attention against the readable one in
tests/model/test_attention.py."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tiny_corpus import toy_overrides, write_corpus
from transformer import ModelConfig, Transformer
from transformer.data import collate
from transformer.data.text import windows
from transformer.model import LanguageModel, masks
from transformer.model.attention import attention
from transformer.train.train_config import load_config
from transformer.train.update import make_optimizer, train_step
from transformer.train.task import on_device
from transformer.train.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (benchmarks/gpu/check.sh runs these on one)")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 matrix products in fp32, not TF32, so that the GPU's numbers can be held to the CPU's."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """The toy translation model, trained on the GPU (bf16, the default there) for 300 updates."""
    base = tmp_path_factory.mktemp("cuda-run")
    corpus = write_corpus(base / "corpus")
    cfg = load_config(None, [*toy_overrides(corpus), "max_steps=300", "peak_lr=0.005", "warmup=40",
                             "log_every=100", "eval_every=300", "save_every=300", "max_tokens=512"])
    Trainer(cfg, base / "run", device="cuda", log=lambda *a: None).train()
    return base / "run", corpus


def test_bf16_decoding_gives_the_fp32_translations(trained_run):
    """The public Translator on the GPU, beam 4 and greedy: bf16 and fp32 agree on at least 95%
    of the sentences (a sentence may differ where two continuations tie within bf16's precision)."""
    from transformer.inference.translator import Translator

    run, corpus = trained_run
    lines = corpus["valid_src"].read_text(encoding="utf-8").splitlines() + \
        corpus["train_src"].read_text(encoding="utf-8").splitlines()[:180]
    for beam in (4, 1):
        out = {p: Translator.from_pretrained(run, device="cuda", precision=p, beam=beam).translate(lines)
               for p in ("fp32", "bf16")}
        same = sum(a == b for a, b in zip(out["fp32"], out["bf16"]))
        assert same >= 0.95 * len(lines), f"beam {beam}: {same} of {len(lines)} alike"
        assert sum(bool(t.strip()) for t in out["bf16"]) >= 0.95 * len(lines)  # and they say something


def tiny_models():
    torch.manual_seed(0)
    mt = Transformer(ModelConfig(vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64))
    torch.manual_seed(0)
    lm = LanguageModel(ModelConfig.preset("nanogpt-char", vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                          max_len=32, dropout=0.0))
    return {"translation": mt, "language model": lm}


def batches_for(kind: str, n: int) -> list:
    g = torch.Generator().manual_seed(1)
    if kind == "language model":
        stream = torch.randint(3, 40, (2000,), generator=g)
        return [windows(stream, torch.randint(0, 2000 - 33, (8,), generator=g), 32) for _ in range(n)]
    out = []
    for _ in range(n):
        lengths = torch.randint(2, 14, (12, 2), generator=g).tolist()
        out.append(collate([(torch.randint(4, 40, (s,), generator=g).tolist(),
                             torch.randint(4, 40, (t,), generator=g).tolist()) for s, t in lengths], 0, 1, 2))
    return out


@pytest.mark.parametrize("kind", ["translation", "language model"])
@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_three_updates_on_the_gpu_give_the_cpus_weights(kind, optimizer):
    cpu = tiny_models()[kind].train()
    gpu = copy.deepcopy(cpu).to(CUDA)
    opts = {m: make_optimizer(m, optimizer, 0.01, [0.9, 0.98]) for m in (cpu, gpu)}
    for b in batches_for(kind, 3):
        s_cpu = train_step(cpu, [b], opts[cpu], 1e-3, clip_norm=1.0).read()
        s_gpu = train_step(gpu, [on_device(b, CUDA)], opts[gpu], 1e-3, clip_norm=1.0).read()
        assert s_gpu.n_tokens == s_cpu.n_tokens and not s_gpu.skipped
        assert s_gpu.loss == pytest.approx(s_cpu.loss, rel=1e-5)
        assert s_gpu.grad_norm == pytest.approx(s_cpu.grad_norm, rel=1e-4)
    for (name, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("kind", ["translation", "language model"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_update_never_waits_for_the_gpu(kind, precision):
    """train_step (the batch's copy included) under sync_debug_mode "error": any synchronising
    call (.item(), a bool of a GPU tensor, a blocking copy, a data-dependent shape) raises. A
    non-finite update is skipped without one too."""
    model = tiny_models()[kind].to(CUDA).train()
    opt = make_optimizer(model, "adamw", 0.01, [0.9, 0.98])
    amp = torch.bfloat16 if precision == "bf16" else None
    host = batches_for(kind, 4)
    train_step(model, [on_device(host[0], CUDA)], opt, 1e-3, clip_norm=1.0, amp_dtype=amp)  # warm-up: state made
    stats = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for b in host[1:]:
            stats.append(train_step(model, [on_device(b, CUDA)], opt, 1e-3, clip_norm=1.0, amp_dtype=amp))
        broken = lambda *args, **kw: model(*args, **kw) * float("nan")  # noqa: E731
        stats.append(train_step(model, [on_device(host[1], CUDA)], opt, 1e-3, forward=broken, amp_dtype=amp))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    read = [s.read() for s in stats]
    assert [s.skipped for s in read] == [False, False, False, True]


def test_a_training_run_on_the_gpu_makes_no_read_between_read_backs(tmp_path, monkeypatch):
    """The Trainer's loop from the end of its first update (the optimizer's state is made then)
    on, batches and bookkeeping included, under sync_debug_mode "error" but for its read-backs."""
    import transformer.train.trainer as trainer_module

    corpus = write_corpus(tmp_path / "corpus")
    cfg = load_config(None, [*toy_overrides(corpus), "max_steps=12", "log_every=6", "eval_every=1000",
                             "save_every=1000"])
    trainer = Trainer(cfg, tmp_path / "run", device="cuda", log=lambda *a: None)
    real_read, real_update, reads = trainer_module.read_back, trainer.update, []

    def update(micro):
        out = real_update(micro)
        torch.cuda.set_sync_debug_mode("error")  # until the next read-back
        return out

    def read_back(stats):
        torch.cuda.set_sync_debug_mode(0)
        reads.append(len(stats))
        return real_read(stats)

    monkeypatch.setattr(trainer, "update", update)
    monkeypatch.setattr(trainer_module, "read_back", read_back)
    try:
        assert trainer.train()["step"] == 12
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert reads == [6, 6]


def test_language_model_windows_reach_the_flash_kernel():
    """Only the flash kernel allowed: an explicit mask tensor would have no kernel to run on."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = tiny_models()["language model"].to(CUDA).train()
    x = windows(torch.randint(3, 40, (500,)), torch.arange(8) * 50, 32).to(CUDA)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        model(x.x, padded=False).float().sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_query_without_keys_is_zero_and_finite_on_the_gpu(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g).to(CUDA, dtype).requires_grad_() for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool, device=CUDA)
    mask[0, :, 2] = False  # query 2 of row 0 may attend to nothing
    out, _ = attention(q, k, v, mask)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and not out[0, :, 2].any()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    causal, _ = attention(q, k, v, masks.CAUSAL)
    explicit, _ = attention(q, k, v, masks.causal_mask(5, 5, CUDA))
    torch.testing.assert_close(causal, explicit, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-2)
