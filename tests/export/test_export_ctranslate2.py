"""CTranslate2 export: the same log-probabilities, and the same greedy and beam-4 outputs
(token ids) as our own searches, in float32.

Settings that make the two searches rank alike: CTranslate2's ``length_penalty`` divides
by len ** p, ours by ((5 + len) / 6) ** alpha; both are raw log-probability at 0, so the
beam comparison uses ``length_penalty=0`` / ``alpha=0``. Ours never emits PAD or BOS, by
setting their log-probabilities to -inf *after* the softmax. CTranslate2's
``suppress_sequences`` masks them *before* its softmax, which renormalises every step's
log-probabilities (by ~1e-3 per sentence for the trained toy model, where label smoothing
left PAD and BOS some mass) and can reorder close beam hypotheses. So the searches are
compared without it, and the test checks that CTranslate2 then emits neither.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")

from export_models import VARIANTS, VOCAB, random_model, random_sources  # noqa: E402
from transformer.data import Subwords  # noqa: E402
from transformer.decode import beam_search, greedy_search, pad_batch  # noqa: E402
from transformer.interop.ctranslate2 import save_ctranslate2, to_ctranslate2_spec  # noqa: E402
from transformer.run import load_model  # noqa: E402

SUPPRESS = [["<pad>"], ["<s>"]]  # only for random models, which give PAD and BOS real mass
MAX_LEN = 60  # far above any output below: CT2 and ours treat the length limit differently


def ct2_translator(path) -> "ctranslate2.Translator":
    return ctranslate2.Translator(str(path), device="cpu", compute_type="float32", intra_threads=1)


def our_logprobs(model, src: list[int], out: list[int]) -> np.ndarray:
    """Log-probability of each token of ``out`` (ids, EOS last) given ``src`` (no EOS)."""
    cfg = model.cfg
    with torch.no_grad():
        logits = model(torch.tensor([src + [cfg.eos_id]]), torch.tensor([[cfg.bos_id] + out[:-1]]))[0]
    lp = torch.log_softmax(logits, dim=-1)
    return lp[torch.arange(len(out)), torch.tensor(out)].numpy()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exported_model_gives_our_logprobs_and_greedy_output(variant, tmp_path):
    model = random_model(**VARIANTS[variant])
    save_ctranslate2(model, tmp_path / "ct2", VOCAB)
    translator = ct2_translator(tmp_path / "ct2")
    srcs = random_sources()
    src = pad_batch([s + [model.cfg.eos_id] for s in srcs], model.cfg.pad_id)
    n = 12  # a random model rarely says EOS: compare the first n - 1 tokens (ours forces EOS at n)
    ours = [h[0].tokens for h in greedy_search(model, src, max_len_a=0.0, max_len_b=n)]
    res = translator.translate_batch([[VOCAB[i] for i in s] for s in srcs], beam_size=1, max_decoding_length=n,
                                     suppress_sequences=SUPPRESS)
    theirs = [[VOCAB.index(t) for t in r.hypotheses[0]] for r in res]
    for o, t in zip(ours, theirs):
        cut = o[:-1] if o[-1] == model.cfg.eos_id else o
        assert t[: len(cut)] == cut
    # teacher-forced scores of our outputs, EOS included
    scored = translator.score_batch([[VOCAB[i] for i in s] for s in srcs],
                                    [[VOCAB[i] for i in o[:-1]] for o in ours])
    worst = max(np.abs(np.array(r.log_probs) - our_logprobs(model, s, o)).max()
                for s, o, r in zip(srcs, ours, scored))
    print(f"{variant}: max |log-prob diff| {worst:.2e}")
    assert worst < 1e-4


def test_interleaved_positions_are_exported_as_they_are():
    """Our table is registered explicitly: no layout conversion, CT2's own table unused."""
    model = random_model()
    spec = to_ctranslate2_spec(model, VOCAB)
    table = spec.encoder.position_encodings.encodings.numpy()
    assert np.array_equal(table, model.positions.pe.numpy())
    assert np.array_equal(spec.decoder.position_encodings.encodings.numpy(), table)


def test_post_norm_with_final_norm_is_refused():
    with pytest.raises(ValueError, match="final LayerNorm"):
        to_ctranslate2_spec(random_model(final_norm=True), VOCAB)


def test_vocabulary_must_fit():
    with pytest.raises(ValueError, match="vocabulary"):
        to_ctranslate2_spec(random_model(), VOCAB[:-1])


# ---- the trained run, through the command line ------------------------------------------------
@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    from transformer.cli import main

    out = tmp_path_factory.mktemp("ct2") / "model"
    assert main(["export", "--model", str(trained.run), "--format", "ctranslate2", "--out", str(out)]) == 0
    model, _ = load_model(trained.run)
    return out, model, Subwords.load(trained.run / "subwords.model")


def test_export_directory_holds_model_vocabulary_and_subwords(exported, trained):
    out, model, subwords = exported
    assert {"model.bin", "config.json", "shared_vocabulary.json", "subwords.model", "README.txt"} <= \
        {p.name for p in out.iterdir()}
    assert (out / "subwords.model").read_bytes() == (trained.run / "subwords.model").read_bytes()
    assert json.loads((out / "shared_vocabulary.json").read_text(encoding="utf-8")) == subwords.vocab()
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert (config["decoder_start_token"], config["bos_token"], config["eos_token"], config["unk_token"]) == \
        ("<s>", "<s>", "</s>", "<unk>")
    assert config["add_source_eos"] and not config["add_source_bos"]
    assert subwords.vocab()[:4] == ["<pad>", "<s>", "</s>", "<unk>"]


def _compare(exported, trained, beam: int):
    out, model, subwords = exported
    lines = trained.sources(20)
    src = pad_batch([subwords.encode(s) + [model.cfg.eos_id] for s in lines], model.cfg.pad_id)
    if beam == 1:
        ours = greedy_search(model, src, max_len_a=0.0, max_len_b=MAX_LEN)
    else:
        ours = beam_search(model, src, beam_size=beam, alpha=0.0, max_len_a=0.0, max_len_b=MAX_LEN)
    ours = [h[0].tokens for h in ours]
    assert all(o[-1] == model.cfg.eos_id and len(o) < MAX_LEN for o in ours), "an output hit the length limit"
    res = ct2_translator(out).translate_batch([subwords.pieces(s) for s in lines], beam_size=beam,
                                              length_penalty=0.0, max_decoding_length=MAX_LEN,
                                              return_end_token=True)
    piece_id = {p: i for i, p in enumerate(subwords.vocab())}
    theirs = [[piece_id[t] for t in r.hypotheses[0]] for r in res]
    assert not any(t in (model.cfg.pad_id, model.cfg.bos_id) for hyp in theirs for t in hyp)
    assert len({len(o) for o in ours}) >= 3, "want outputs of varied lengths"
    return ours, theirs


def test_greedy_translations_equal_ours(exported, trained):
    ours, theirs = _compare(exported, trained, beam=1)
    assert theirs == ours


def test_beam4_translations_equal_ours(exported, trained):
    ours, theirs = _compare(exported, trained, beam=4)
    assert theirs == ours


def test_int8_export_is_smaller_and_translates(trained, tmp_path, cli):
    r = cli("export", "--model", trained.run, "--format", "ctranslate2", "--quantization", "int8",
            "--out", tmp_path / "int8")
    assert r.code == 0, r.err
    assert "int8" in r.out
    model, _ = load_model(trained.run)
    fp32 = save_ctranslate2(model, tmp_path / "fp32", Subwords.load(trained.run / "subwords.model").vocab())
    assert (tmp_path / "int8" / "model.bin").stat().st_size < 0.6 * (fp32 / "model.bin").stat().st_size
    subwords = Subwords.load(tmp_path / "int8" / "subwords.model")
    lines = trained.sources(5)
    res = ct2_translator(tmp_path / "int8").translate_batch([subwords.pieces(s) for s in lines], beam_size=4)
    assert all(r.hypotheses[0] for r in res)
