"""A language model's score on a text (transformer/evaluation/lm.py, ``transformer evaluate
--text``): the windows score every token once, the sums equal a token-by-token computation
with the model's forward, the figures equal Hugging Face's loss on the same ids, and bad input
is one line, exit 2."""
from __future__ import annotations

import json
import math
import random

import pytest
import torch
from torch.nn import functional as F

from transformer import ModelConfig
from transformer.data.chars import Chars
from transformer.evaluation.lm import default_stride, score_ids, score_text, score_windows
from transformer.model.lm import LanguageModel

torch.set_num_threads(1)

WORDS = "the a cat dog sat ran on under mat log and then quickly slowly café naïve".split()


def make_text(n_lines: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + ".\n" for _ in range(n_lines))


@torch.no_grad()
def tiny_lm(vocab_size: int, max_len: int = 16, seed: int = 0, **overrides) -> LanguageModel:
    """A 2-layer char-sized model with weights far from the uniform prediction."""
    cfg = ModelConfig.preset("nanogpt-char", vocab_size=vocab_size, **{"d_model": 32, "n_heads": 2, "d_ff": 64,
                                                                         "n_layers": 2, "max_len": max_len,
                                                                         **overrides})
    torch.manual_seed(seed)
    model = LanguageModel(cfg)
    for p in model.parameters():
        p.mul_(10.0)
    return model.eval()


@torch.no_grad()
def reference_nll(model, ids: list[int], stride: int) -> float:
    """Token by token: token p's window ends where the windows first reach p (the first
    window ends at L - 1, each next one ``stride`` later, the last at the end) and holds the L
    tokens up to there; its nll is read from the full forward of that window."""
    n, length = len(ids), min(model.cfg.max_len, len(ids))
    total = 0.0
    for p in range(1, n):
        end = length - 1 if p <= length - 1 else min(length - 1 + math.ceil((p - length + 1) / stride) * stride, n - 1)
        start = end - (length - 1)
        logits = model(torch.tensor([ids[start: end + 1]]), padded=False)[0]  # (L, V)
        total -= F.log_softmax(logits[p - start - 1].double(), -1)[ids[p]].item()
    return total


# ---- the windows ---------------------------------------------------------------------------
def test_windows_by_hand():
    # 10 tokens, context 4, stride 2: tokens 1-3, then 4-5, 6-7, 8-9, each window 4 long
    assert score_windows(10, 4, 2) == [(0, 0), (2, 1), (4, 1), (6, 1)]
    # stride 3 = context - 1: windows share one token; the last ends at the end of the stream
    assert score_windows(10, 4, 3) == [(0, 0), (3, 0), (6, 0)]
    assert score_windows(11, 4, 3) == [(0, 0), (3, 0), (6, 0), (7, 2)]
    assert score_windows(3, 8, 4) == [(0, 0)]  # shorter than the context: one window of the whole text
    assert default_stride(1024) == 512


@pytest.mark.parametrize("n, context, stride", [(2, 2, 1), (50, 8, 1), (50, 8, 4), (50, 8, 7), (51, 16, 5),
                                                (7, 16, 3), (100, 9, 8)])
def test_windows_score_every_token_once_with_the_promised_context(n, context, stride):
    length = min(context, n)
    scored = []
    for k, (start, first) in enumerate(score_windows(n, context, stride)):
        assert 0 <= start and start + length <= n
        tokens = list(range(start + first + 1, start + length))
        assert tokens, "a window that scores nothing"
        if k:  # after the first window: at least context - stride tokens before each scored token
            assert first + 1 >= length - stride
        scored += tokens
    assert scored == list(range(1, n))


@pytest.mark.parametrize("n, context, stride", [(1, 8, 4), (10, 8, 8), (10, 8, 0)])
def test_windows_refuse_what_cannot_be_scored(n, context, stride):
    with pytest.raises(ValueError):
        score_windows(n, context, stride)


# ---- the score -----------------------------------------------------------------------------
def test_a_text_shorter_than_the_context_is_one_forward():
    model = tiny_lm(30)
    ids = [5, 9, 3, 3, 17, 0, 28, 11, 4]  # 0 (pad_id) is a token like any other here
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([ids]), padded=False)[0].double(), -1)
    nll = -sum(logp[i, ids[i + 1]].item() for i in range(len(ids) - 1))
    score = score_ids(model, ids)
    assert score.tokens == len(ids) - 1 and score.windows == 1 and score.context == len(ids)
    assert score.nll == pytest.approx(nll, rel=1e-6)
    assert score.cross_entropy == pytest.approx(nll / (len(ids) - 1), rel=1e-6)
    assert score.perplexity == pytest.approx(math.exp(nll / (len(ids) - 1)), rel=1e-6)
    assert score.cross_entropy > 0.5  # the weights predict unevenly, far from log(30)
    assert abs(score.cross_entropy - math.log(30)) > 0.1


@pytest.mark.parametrize("stride", [1, 5, 8, 15])
def test_a_long_text_equals_the_token_by_token_computation(stride):
    model = tiny_lm(30, seed=1)
    ids = torch.randint(3, 30, (61,), generator=torch.Generator().manual_seed(0)).tolist()
    expected = reference_nll(model, ids, stride)
    for max_tokens in (1, 40, 10_000):  # one window per batch, a few, all: the same sum
        score = score_ids(model, ids, stride, max_tokens=max_tokens)
        assert score.tokens == 60 and score.context == 16
        assert score.nll == pytest.approx(expected, rel=1e-6)


def test_bits_per_byte_counts_the_texts_utf8_bytes():
    text = make_text(12, seed=3)
    tokenizer = Chars.learn(text)
    model = tiny_lm(tokenizer.vocab_size, seed=2)
    score = score_text(model, tokenizer, text)
    assert len(text.encode("utf-8")) > len(text)  # é, ï: two bytes each
    assert score.bytes == len(text.encode("utf-8")) and score.tokens == len(text) - 1
    assert score.bits_per_byte == pytest.approx(score.nll / math.log(2) / score.bytes, rel=1e-12)
    assert score.nll == pytest.approx(reference_nll(model, tokenizer.encode(text), default_stride(16)), rel=1e-6)
    record = score.to_dict()
    assert record["cross_entropy"] == score.cross_entropy and record["bits_per_byte"] == score.bits_per_byte


def test_bf16_scores_close_to_fp32():
    from transformer.decode.precision import for_inference

    model = tiny_lm(30, seed=4)
    ids = torch.randint(3, 30, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    fp32, bf16 = score_ids(model, ids), score_ids(for_inference(model, "bf16"), ids)
    assert bf16.cross_entropy == pytest.approx(fp32.cross_entropy, rel=0.05)


# ---- Hugging Face's loss on the same ids ---------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_pair():
    pytest.importorskip("transformers", reason="the parity check needs transformers (the interop extra)")
    from transformers import GPT2Config, GPT2LMHeadModel

    from transformer.interop.gpt2 import from_gpt2

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=89, n_embd=32, n_layer=2, n_head=4, n_positions=24, resid_pdrop=0.0,
                                    embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=88, eos_token_id=88)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3) if p.dim() > 1 else p.add_(0.1 * torch.randn_like(p))
    return hf, from_gpt2(hf).eval()


@torch.no_grad()
def test_equals_hugging_faces_loss_within_the_context(gpt2_pair):
    hf, ours = gpt2_pair
    ids = torch.randint(0, 89, (1, 24), generator=torch.Generator().manual_seed(2))
    ids[0, 3] = 0  # the id our import takes for padding: scored as a token, as HF does
    hf_loss = hf(ids, labels=ids).loss.item()
    score = score_ids(ours, ids[0].tolist())
    assert score.windows == 1
    assert abs(score.cross_entropy - hf_loss) <= 1e-5
    assert abs(hf_loss - math.log(89)) > 0.1  # a model that predicts something


@torch.no_grad()
def test_equals_hugging_faces_loss_window_by_window(gpt2_pair):
    """A text longer than the context: HF's loss of each window, its earlier tokens masked
    with -100 (the perplexity guide's recipe), summed, is our total."""
    hf, ours = gpt2_pair
    ids = torch.randint(0, 89, (70,), generator=torch.Generator().manual_seed(3))
    stride = 10
    total = 0.0
    for start, first in score_windows(len(ids), 24, stride):
        window = ids[start: start + 24][None]
        labels = window.clone()
        labels[0, : first + 1] = -100  # label j is predicted at position j - 1
        n = int((labels != -100).sum())
        total += hf(window, labels=labels).loss.item() * n
    score = score_ids(ours, ids.tolist(), stride)
    assert score.windows > 4
    assert abs(score.cross_entropy - total / 69) <= 1e-5


# ---- the command ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    """A tiny character-level run trained for 20 updates."""
    from transformer.train.train_config import load_config
    from transformer.train.trainer import Trainer

    root = tmp_path_factory.mktemp("score-run")
    (root / "train.txt").write_text(make_text(120, seed=0), encoding="utf-8")
    cfg = load_config(None, [
        "dataset=text", f"text_files=[{root / 'train.txt'}]", "tokenizer=chars", "model.preset=nanogpt-char",
        "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1", "model.max_len=16",
        "batch_size=4", "lr_schedule=cosine", "peak_lr=0.01", "warmup=2", "precision=fp32", "progress=false",
        "threads=1", "max_steps=20", "eval_every=20", "save_every=20"])
    Trainer(cfg, root / "run", log=lambda *a: None).train()
    return root / "run"


def test_the_command_prints_the_scores_of_score_text(cli, char_run, tmp_path):
    from transformer.data.text import load_tokenizer
    from transformer.run import load_model

    text = tmp_path / "other.txt"
    text.write_text(make_text(20, seed=9), encoding="utf-8")
    r = cli("evaluate", "--model", char_run, "--text", text, "--json")
    assert r.code == 0, r.err
    record = json.loads(r.out)
    model, _ = load_model(char_run)
    expected = score_text(model, load_tokenizer(char_run), text.read_text(encoding="utf-8"))
    assert record["precision"] == "fp32"  # not the run's decoding precision (auto)
    assert record["stride"] == 8 and record["context"] == 16
    for key in ("cross_entropy", "perplexity", "bits_per_byte", "tokens", "bytes"):
        assert record[key] == pytest.approx(getattr(expected, key), rel=1e-9), key
    assert record["cross_entropy"] < math.log(load_tokenizer(char_run).vocab_size)  # it learned something

    r = cli("evaluate", "--model", char_run, "--text", text, "--stride", "15")
    assert r.code == 0, r.err
    assert "cross-entropy" in r.out and "perplexity" in r.out and "bits per byte" in r.out and "stride 15" in r.out


def test_a_gzip_text_scores_as_the_plain_one(cli, one_line_error, char_run, tmp_path):
    """--text FILE.gz is read gunzipped, as --src and --ref are: the same scores; a damaged
    stream, or an archive of nothing but blanks, is one line."""
    import gzip

    text = make_text(20, seed=9)
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    plain, packed = (cli("evaluate", "--model", char_run, "--text", tmp_path / name, "--json")
                     for name in ("t.txt", "t.txt.gz"))
    assert plain.code == 0 and packed.code == 0, plain.err + packed.err
    scores = [json.loads(r.out) for r in (plain, packed)]
    for s in scores:
        del s["seconds"], s["text"]
    assert scores[0] == scores[1] and scores[0]["tokens"] > 100
    (tmp_path / "bad.txt.gz").write_bytes(gzip.compress(text.encode("utf-8"))[:-20])
    one_line_error(cli("evaluate", "--model", char_run, "--text", tmp_path / "bad.txt.gz"), "evaluate",
                   "bad.txt.gz", "not a valid gzip file")
    (tmp_path / "blank.txt.gz").write_bytes(gzip.compress(b" \n\n"))
    one_line_error(cli("evaluate", "--model", char_run, "--text", tmp_path / "blank.txt.gz"), "evaluate",
                   "blank.txt.gz", "holds no text")


def test_bad_input_is_one_line(cli, one_line_error, char_run, tmp_path):
    from transformer import Transformer
    from transformer.run.weights import save_weights

    good = tmp_path / "good.txt"
    good.write_text(make_text(5, seed=1), encoding="utf-8")
    one_line_error(cli("evaluate", "--model", char_run, "--text", tmp_path / "nowhere.txt"), "evaluate",
                   "nowhere.txt", "not found")
    for name, content in (("empty.txt", ""), ("blank.txt", " \n\n")):
        (tmp_path / name).write_text(content, encoding="utf-8")
        one_line_error(cli("evaluate", "--model", char_run, "--text", tmp_path / name), "evaluate",
                       name, "holds no text")
    (tmp_path / "greek.txt").write_text("the cat\nsat λ\n", encoding="utf-8")
    # the file, line and column (it named the run's chars.json alone)
    one_line_error(cli("evaluate", "--model", char_run, "--text", tmp_path / "greek.txt"), "evaluate",
                   f"{tmp_path / 'greek.txt'}:2:5: character 'λ'", "not in the character vocabulary")
    one_line_error(cli("evaluate", "--model", char_run, "--text", good, "--stride", "16"), "evaluate",
                   "stride", "15")
    one_line_error(cli("evaluate", "--model", char_run, "--text", good, "--src", good), "evaluate",
                   "--src is for translation")
    one_line_error(cli("evaluate", "--model", char_run, "--text", good, "--src", good, "--limit", "3"), "evaluate",
                   "--src, --limit are for translation")
    (tmp_path / "one.txt").write_text("a", encoding="utf-8")
    one_line_error(cli("evaluate", "--model", char_run, "--text", tmp_path / "one.txt"), "evaluate",
                   f"{tmp_path / 'one.txt'}: a text of 1 token(s) has nothing to score", "give a longer text")
    mt = tmp_path / "mt.safetensors"
    save_weights(Transformer(ModelConfig(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=1)), mt)
    one_line_error(cli("evaluate", "--model", mt, "--text", good), "evaluate", "translation model")
