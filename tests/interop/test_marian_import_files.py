"""The Marian import reads the folder's weight files tensor by tensor (interop/marian_run.py):
it never builds a ``MarianMTModel``, it takes HF's tied embeddings, stored position tables
and missing ``final_logits_bias`` as ``MarianMTModel.from_pretrained`` does, and a bad file is
one line. The folders are those of test_marian_import.py (a tiny random model, built here)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_marian_import import SENTENCES, build_marian
from transformers import MarianMTModel, MarianTokenizer

from transformer.cli import main
from transformer.errors import UserError
from transformer.interop.marian_run import import_marian_run
from transformer.run import load_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Marian folder with one vocabulary for both sides (tied embeddings)."""
    return build_marian(tmp_path_factory.mktemp("marian"), shared=True)


def _same_logits(folder, run) -> float:
    """Max abs difference between HF's logits for ``folder`` and ours for ``run``."""
    hf = MarianMTModel.from_pretrained(folder).eval()
    batch = MarianTokenizer.from_pretrained(folder)(SENTENCES, return_tensors="pt", padding=True)
    tgt = torch.randint(2, hf.config.decoder_vocab_size - 1, (len(SENTENCES), 7), generator=torch.Generator()
                        .manual_seed(1))
    tgt[:, 0] = hf.config.decoder_start_token_id
    model, _ = load_model(run)
    with torch.no_grad():
        return (model(batch["input_ids"], tgt) - hf(**batch, decoder_input_ids=tgt).logits).abs().max().item()


def test_import_never_builds_a_marian_model(folder, tmp_path, monkeypatch):
    """The weights come from the files: MarianMTModel (and its base) is never constructed,
    and the run computes HF's logits."""
    def refuse(*args, **kwargs):
        raise AssertionError("the import built a Hugging Face model")

    monkeypatch.setattr(MarianMTModel, "__init__", refuse)
    monkeypatch.setattr("transformers.MarianModel.__init__", refuse)
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 0
    monkeypatch.undo()
    assert _same_logits(folder, tmp_path / "run") <= 1e-5


def test_an_older_conversions_pytorch_model_bin(folder, tmp_path):
    """As the older OPUS-MT conversions saved them: every embedding name (model.shared, both
    stacks', lm_head), the position tables, no final_logits_bias (HF starts it at zero), in a
    pytorch_model.bin. The import ties the embeddings and gives HF's logits."""
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    state = load_file(old / "model.safetensors")
    shared = state["model.shared.weight"]
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        state[name] = shared.clone()
    hf = MarianMTModel.from_pretrained(folder)
    for stack in ("encoder", "decoder"):
        state[f"model.{stack}.embed_positions.weight"] = getattr(hf.model, stack).embed_positions.weight.detach()
    del state["final_logits_bias"]
    torch.save(state, old / "pytorch_model.bin")
    (old / "model.safetensors").unlink()
    import_marian_run(old, tmp_path / "run")
    model, _ = load_model(tmp_path / "run")
    assert model.cfg.tie_embeddings and torch.equal(model.out_bias, torch.zeros_like(model.out_bias))
    assert _same_logits(old, tmp_path / "run") <= 1e-5


def test_a_stored_position_table_that_is_not_ours_is_refused(folder, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    state = load_file(bad / "model.safetensors")
    hf = MarianMTModel.from_pretrained(folder)
    table = hf.model.encoder.embed_positions.weight.detach().clone()
    state["model.encoder.embed_positions.weight"] = table.roll(1, dims=1)  # [cos | sin]-ish: not Marian's
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="sinusoidal position table differs") as e:
        import_marian_run(bad, tmp_path / "run")
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_untied_equal_matrices_are_tied_and_unequal_ones_kept(folder, tmp_path):
    """tie_word_embeddings false: HF keeps three matrices; ours ties them when they hold the
    same values (as from_marian decides) and keeps them apart otherwise."""
    for equal in (True, False):
        untied = tmp_path / f"untied-{equal}"
        shutil.copytree(folder, untied)
        config = json.loads((untied / "config.json").read_text(encoding="utf-8"))
        (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}), encoding="utf-8")
        state = load_file(untied / "model.safetensors")
        shared = state["model.shared.weight"]
        for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
            state[name] = shared.clone()
        if not equal:
            state["lm_head.weight"] = shared.flip(0).contiguous()
        save_file(state, str(untied / "model.safetensors"), metadata={"format": "pt"})
        import_marian_run(untied, tmp_path / f"run-{equal}")
        model, _ = load_model(tmp_path / f"run-{equal}")
        assert model.cfg.tie_embeddings == equal
        assert _same_logits(untied, tmp_path / f"run-{equal}") <= 1e-5


def test_truncated_safetensors_is_one_line(folder, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert main(["import", str(broken), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "truncated" in err and "model.safetensors" in err
    assert not (tmp_path / "run").exists()


def test_a_tensor_missing_from_the_checkpoint_is_named(folder, tmp_path):
    """HF would start a missing weight at random (with a warning); the import refuses it."""
    short = tmp_path / "short"
    shutil.copytree(folder, short)
    state = load_file(short / "model.safetensors")
    del state["model.decoder.layers.1.fc2.weight"]
    save_file(state, str(short / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="no tensor model.decoder.layers.1.fc2.weight"):
        import_marian_run(short, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_tensor_of_the_wrong_shape_is_one_line(folder, tmp_path):
    """(a later layer's: the first layer's sizes are config.json's, checked before: test_import_hostile.py)"""
    wrong = tmp_path / "wrong"
    shutil.copytree(folder, wrong)
    state = load_file(wrong / "model.safetensors")
    state["model.encoder.layers.1.fc1.weight"] = state["model.encoder.layers.1.fc1.weight"][:-1].contiguous()
    save_file(state, str(wrong / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="does not fit") as e:
        import_marian_run(wrong, tmp_path / "run")
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("tie", [True, False])
def test_tensor_shapes_are_our_models(tie):
    """The import checks the checkpoint against tensor_shapes, not a model it builds: they must
    be our model's tensors, each once, with their shapes."""
    from transformer.model.config import ModelConfig
    from transformer.interop.marian import name_map, tensor_shapes
    from transformer.model import Transformer
    from transformer.run.weights import unique_state_dict

    cfg = ModelConfig(vocab_size=40, tgt_vocab_size=None if tie else 30, tie_embeddings=tie, d_model=16, n_layers=2,
                      n_heads=2, d_ff=24, max_len=32, norm_first=False, final_norm=False, output_bias=True,
                      sinusoid_layout="concat")
    ours = {name: tuple(t.shape) for name, t in unique_state_dict(Transformer(cfg)).items()}
    assert tensor_shapes(cfg) == ours
    assert sorted(name for name, _ in name_map(cfg)) == sorted(ours)


def test_the_import_does_not_load_torchs_compiler(folder, tmp_path):
    """What keeps the import's memory near its largest tensor: neither a Hugging Face model's
    code nor torch's compiler (some 70 MB, which a model built on the meta device or the ONNX
    exports would import) is loaded, in a fresh process."""
    probe = ("import sys; from transformer.cli import main; assert main(sys.argv[1:]) == 0; "
             "print(sorted(m for m in ('torch._dynamo', 'transformers.models.marian.modeling_marian') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, "import", str(folder), "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout.splitlines()[-1] == "[]"


def test_tensors_are_read_and_written_in_blocks_of_rows(folder, tmp_path):
    """HFWeights.row_blocks gives a tensor's rows in order, a few at a time; write_safetensors
    takes them as the one tensor, and refuses rows that fall short, in one line."""
    from transformer.interop.hf_files import HFWeights, write_safetensors

    weights = HFWeights(folder)
    name = "model.shared.weight"
    whole = weights.get(name)
    blocks = list(weights.row_blocks(name, size=whole.size(1) * 4 * 10))  # 10 rows each
    assert len(blocks) == -(-whole.size(0) // 10) and torch.equal(torch.cat(blocks), whole)
    shapes = [("embed", tuple(whole.shape), whole.dtype), ("bias", (3,), torch.float32)]
    write_safetensors(tmp_path / "w.safetensors", shapes, [*(("embed", b) for b in blocks),
                                                           ("bias", torch.ones(3))], {})
    assert torch.equal(load_file(tmp_path / "w.safetensors")["embed"], whole)
    given = rf"\({whole.size(0) - len(blocks[-1])}, {whole.size(1)}\)"
    with pytest.raises(UserError, match=rf"embed: shape {given} does not fit"):
        write_safetensors(tmp_path / "short.safetensors", shapes,
                          [*(("embed", b) for b in blocks[:-1]), ("bias", torch.ones(3))], {})
