"""Decoding with a restricted output vocabulary, side by side with the whole vocabulary.

The trained model of a run, and the same weights restricted (``ModelConfig.output_vocab_size``
/ ``set_output_ids``) to the subwords of its target training text and EOS: every other id
gets -inf, and the vocabulary projection computes only the kept rows. Both go through
``for_inference`` as ``translate`` does, and decode the first N test sentences in turns,
round after round (beam 5 with alpha 1.0, the recipe's search, and greedy; batch 1 and 32);
the table gives median sentences/s, the ratio, and how many outputs differ. A model trained with ``restrict_output`` is restricted already: pass a
run trained without it.

    TRANSFORMER_DATA=/work/shared/data .venv/bin/python benchmarks/decode/restrict_output.py \\
        --run runs/multi30k-en-de [--n 128] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from transformer.data import Subwords, clean_pairs, load_multi30k
from transformer.decode import beam_search, greedy_search, pad_batch
from transformer.decode.precision import for_inference
from transformer.train.checkpoint import load_model
from transformer.train.config import load_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    run = Path(args.run)
    cfg = load_config(run / "config.yaml", [])
    model, _ = load_model(run)
    if model.output_ids is not None:
        raise SystemExit(f"{run}: its model is restricted already; pass a run trained without restrict_output")
    sw = Subwords.load(run / "subwords.model")
    train, _ = clean_pairs(load_multi30k("train", cfg.src_lang, cfg.tgt_lang))
    ids = sorted({i for _, t in train for i in sw.encode(t)} | {model.cfg.eos_id})
    test = load_multi30k("test_2016_flickr", cfg.src_lang, cfg.tgt_lang)[: args.n]
    srcs = [sw.encode(s) + [model.cfg.eos_id] for s, _ in test]
    # as translate / evaluate decode them: through for_inference, which gives the restricted
    # (tied) model a projection holding its output rows once
    systems = {"whole vocabulary": for_inference(model),
               f"restricted ({len(ids)} of {sw.vocab_size})": for_inference(model.with_output_ids(ids))}
    settings = [("beam 5", 5, 1), ("beam 5", 5, 32), ("greedy", 1, 1), ("greedy", 1, 32)]

    @torch.inference_mode()
    def decode(m, beam, batch):
        out = []
        for i in range(0, len(srcs), batch):
            src = pad_batch(srcs[i:i + batch], m.cfg.pad_id)
            hyps = (greedy_search(m, src) if beam == 1 else beam_search(m, src, beam_size=beam, alpha=1.0))
            out += [h[0].tokens for h in hyps]
        return out

    print(f"{run}: {len(srcs)} test sentences, {args.rounds} rounds, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| search | batch | " + " | ".join(f"{name}, sentences/s" for name in systems)
          + " | ratio | outputs differing |")
    print("|---|---|" + "---|" * (len(systems) + 2))
    for label, beam, batch in settings:
        times = {name: [] for name in systems}
        outs = {}
        for _ in range(args.rounds):
            for name, m in systems.items():
                t = time.perf_counter()
                outs[name] = decode(m, beam, batch)
                times[name].append(time.perf_counter() - t)
        rates = [len(srcs) / statistics.median(times[name]) for name in systems]
        a, b = outs.values()
        differ = sum(x != y for x, y in zip(a, b))
        print(f"| {label} | {batch} | " + " | ".join(f"{r:.1f}" for r in rates)
              + f" | {rates[1] / rates[0]:.3f}x | {differ} of {len(srcs)} |")


if __name__ == "__main__":
    main()
