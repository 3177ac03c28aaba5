"""Marian export through the command line: the saved Hugging Face directory translates
exactly as ours (token ids), greedy and beam 4. HF's ``length_penalty`` divides by len ** p,
ours by ((5 + len) / 6) ** alpha: both searches rank by raw log-probability at 0."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformer.data import Subwords  # noqa: E402
from transformer.decode import beam_search, greedy_search, pad_batch  # noqa: E402
from transformer.run import load_model  # noqa: E402

MAX_NEW = 60


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    from transformer.cli import main

    out = tmp_path_factory.mktemp("marian") / "model"
    assert main(["export", "--model", str(trained.run), "--format", "marian", "--out", str(out)]) == 0
    return out


def test_directory_holds_weights_subwords_and_readme(exported, trained):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "generation_config.json", "subwords.model", "README.txt"} <= names
    assert any(n.endswith(".safetensors") for n in names)
    assert (exported / "subwords.model").read_bytes() == (trained.run / "subwords.model").read_bytes()
    assert "MarianMTModel.from_pretrained" in (exported / "README.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("beam", [1, 4])
def test_hf_generate_equals_ours(beam, exported, trained):
    model, _ = load_model(trained.run)
    cfg = model.cfg
    subwords = Subwords.load(exported / "subwords.model")
    hf = transformers.MarianMTModel.from_pretrained(exported, local_files_only=True).eval()
    src = pad_batch([subwords.encode(s) + [cfg.eos_id] for s in trained.sources(20)], cfg.pad_id)
    if beam == 1:
        ours = greedy_search(model, src, max_len_a=0.0, max_len_b=MAX_NEW)
    else:
        ours = beam_search(model, src, beam_size=beam, alpha=0.0, max_len_a=0.0, max_len_b=MAX_NEW)
    ours = [h[0].tokens for h in ours]
    assert all(len(o) < MAX_NEW for o in ours) and len({len(o) for o in ours}) >= 3
    with torch.no_grad():
        out = hf.generate(input_ids=src, attention_mask=(src != cfg.pad_id).long(), num_beams=beam,
                          length_penalty=0.0, early_stopping=False, do_sample=False, max_new_tokens=MAX_NEW)
    theirs = []
    for row in out.tolist():
        row = row[1:]  # the decoder start token (BOS)
        theirs.append(row[: row.index(cfg.eos_id) + 1] if cfg.eos_id in row else row)
    assert theirs == ours
