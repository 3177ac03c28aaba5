"""int8's agreement with fp32: how many test sentences an int8 variant translates exactly as fp32
does, its BLEU and its CPU time; with ``--ct2``, CTranslate2's int8 against its own float32 on
the same weights (our exporter) as the reference.

The variants (the model's int8 copy, :func:`~transformer.decode.precision.for_inference`, then):

    int8            as it is (each layer's kernel measured fastest)
    int8-head-fp32  the output projection left unquantised, fp32 (likewise ``-bf16``)
    int8-rowact     per-row activation scales (``torch._int_mm``) where fbgemm's per-tensor ones were chosen
    int8-mse        each weight row's scale clipped to the least squared quantisation error

The 1,000 test_2016_flickr sentences of the run's languages, beam 4, length penalty 0.6 (each
system its own), ``translate``'s batches, one thread.

    TRANSFORMER_DATA=DATA_DIR OMP_NUM_THREADS=1 .venv/bin/python -W ignore benchmarks/decode/int8_agreement.py \\
        --run RUN [--variants int8,int8-head-fp32,...] [--ct2]
"""
from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a translation run trained here")
    ap.add_argument("--variants", default="int8,int8-head-fp32,int8-head-bf16,int8-rowact,int8-mse")
    ap.add_argument("--ct2", action="store_true", help="also CTranslate2 int8 against CTranslate2 float32")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.6)
    args = ap.parse_args()

    import torch
    from torch import nn

    from transformer import hardware
    from transformer.data import load_multi30k
    from transformer.decode.int8 import Int8Linear
    from transformer.decode.precision import for_inference
    from transformer.evaluation.translation import score
    from transformer.inference.translator import Translator, load_translator
    from transformer.run.layout import read_run_config

    class Cast(nn.Module):
        """The projection's input in its weight's dtype (the residual stream is float32 under int8)."""

        def __init__(self, dtype):
            super().__init__()
            self.dtype = dtype

        def forward(self, h):
            return h.to(self.dtype)

    torch.set_num_threads(1)
    print(f"machine: {hardware.describe_line()}; 1 thread", flush=True)
    config = read_run_config(args.run)
    pairs = load_multi30k("test_2016_flickr", config.get("src_lang", "en"), config.get("tgt_lang", "de"),
                          download=False)
    src, ref = [s for s, _ in pairs], [t for _, t in pairs]
    base = load_translator(args.run, warn=False, beam=args.beam, alpha=args.alpha, precision="fp32", compile="off")

    def timed(translate) -> tuple[list[str], float]:
        start = time.process_time()
        out = translate()
        return out, time.process_time() - start

    def report(name: str, out: list[str], seconds: float, against: list[str]) -> None:
        same = sum(a == b for a, b in zip(out, against))
        print(f"{name}: the same as its fp32 on {same} of {len(out)}; BLEU {score(out, ref).bleu:.2f}; "
              f"{seconds:.1f} s CPU", flush=True)

    fp32, seconds = timed(lambda: base.translate(src))
    report("fp32", fp32, seconds, fp32)
    original = Int8Linear.from_linear.__func__
    for variant in args.variants.split(","):
        if variant == "int8-mse":
            Int8Linear.from_linear = classmethod(_least_squares_rows)
        try:
            model = for_inference(copy.deepcopy(base.model), "int8")
        finally:
            Int8Linear.from_linear = classmethod(original)
        if variant == "int8-rowact":
            for m in model.modules():
                if isinstance(m, Int8Linear) and m.kernel == "fbgemm":
                    m.kernel = "int_mm"
        # (fp32 asked of a model whose parameters are float32: the Translator decodes this very model)
        translator = Translator(model, base.subwords, base.decoding.replace(precision="fp32"), warn=False)
        if variant.startswith("int8-head-"):  # set afterwards: a bf16 head would have been converted to fp32
            dtype = torch.float32 if variant.endswith("fp32") else torch.bfloat16
            weight = base.model.output_layer()[0].detach().to(dtype)
            head = nn.utils.skip_init(nn.Linear, weight.size(1), weight.size(0), bias=False, dtype=dtype)
            head.weight = nn.Parameter(weight.clone(), requires_grad=False)
            translator.model.out_proj = nn.Sequential(Cast(dtype), head)
        out, seconds = timed(lambda: translator.translate(src))
        report(variant, out, seconds, fp32)
    if args.ct2:
        outs = _ct2(base, src, args)
        report("ct2-float32 (against ours fp32)", outs["float32"][0], outs["float32"][1], fp32)
        report("ct2-int8 (against ct2 float32)", outs["int8"][0], outs["int8"][1], outs["float32"][0])
    print(f"load average {os.getloadavg()[0]:.1f}")


def _least_squares_rows(cls, linear, kernel="weight-only-bf16"):
    """An Int8Linear whose row scales are clipped (between half and all of the row's largest |w|)
    to the least squared quantisation error."""
    import torch

    w = linear.weight.detach().float()
    amax = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny)
    best_err = best_scale = None
    for ratio in torch.linspace(0.5, 1.0, 26):
        scale = amax * ratio / 127
        err = ((torch.round(w / scale[:, None]).clamp(-127, 127) * scale[:, None] - w) ** 2).sum(1)
        better = err < best_err if best_err is not None else torch.ones_like(err, dtype=torch.bool)
        best_err = err if best_err is None else torch.where(better, err, best_err)
        best_scale = scale if best_scale is None else torch.where(better, scale, best_scale)
    q = torch.round(w / best_scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return cls(q, best_scale, None if linear.bias is None else linear.bias.detach().float().clone(), kernel)


def _ct2(base, src: list[str], args) -> dict:
    """CTranslate2 float32 and int8 on our export of the fp32 model, in translate's batches."""
    import ctranslate2

    from transformer.interop.ctranslate2 import save_ctranslate2

    sw, d = base.subwords, base.decoding
    vocab = [sw.id_to_piece(i) for i in range(sw.vocab_size)]
    index = {p: i for i, p in enumerate(vocab)}
    folder = Path(tempfile.mkdtemp(prefix="ct2.")) / "model"
    save_ctranslate2(base.model, folder, vocab)
    encoded = [base.encode(line) for line in src]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    batches, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * len(encoded[order[end]]) <= d.max_tokens:
            end += 1
        batches.append(order[start:end])
        start = end
    outs = {}
    for compute_type in ("float32", "int8"):
        translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type, intra_threads=1)
        out = [""] * len(src)
        begin = time.process_time()
        for batch in batches:
            limit = int(d.max_len_a * max(len(encoded[i]) for i in batch) + d.max_len_b)
            results = translator.translate_batch([[vocab[t] for t in encoded[i][:-1]] for i in batch],
                                                 beam_size=args.beam, length_penalty=args.alpha, max_batch_size=0,
                                                 max_decoding_length=limit)
            for i, r in zip(batch, results):
                out[i] = sw.decode([index[p] for p in r.hypotheses[0]])
        outs[compute_type] = (out, time.process_time() - begin)
    return outs


if __name__ == "__main__":
    main()
