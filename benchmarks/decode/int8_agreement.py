"""int8's agreement with fp32: how many test sentences a variant translates exactly as fp32 does,
its BLEU and its CPU time; where it differs, whether the two outputs were near a tie under the
fp32 model; with ``--ct2``, CTranslate2's int8 against its own float32 on the same weights (our
exporter) as the reference.

The reference is fp32 (``Translator``, ``precision="fp32"``), in ``translate``'s batches. The
variants (``--variants``, comma-separated):

  the noise floor, nothing quantised:
    fp32-single     fp32, each sentence translated alone (a batch of one: no padding, other shapes)
    fp32-onednn     fp32, every linear layer and the output projection through oneDNN's matmul
                    (the reference: each shape through the kernel measured faster on this machine)
    bf16            ``precision="bf16"``
    margins         not a variant: fp32's two best finished hypotheses (``n_best`` 2), how far
                    apart their scores are
  what int8 does, one half at a time (fp32's decoding copy and kernels otherwise):
    int8-weights    every weight, the output projection's included, quantised per output row
                    as ``Int8Linear`` does, dequantised: float32 activations (the best any
                    per-row int8 weights can do); intB-weights: to B bits (int10, int12, ...);
                    int8-weights-gG: a scale per G inputs of a row (G 32, 64, ...)
    int8-acts       the float32 weights; every linear layer's input quantised to int8 and back,
                    per row, as ``torch._int_mm``'s path does (``int8.quantise_rows``); intB-acts
    int8-acts-tensor  the same per tensor, asymmetric uint8, as fbgemm's dynamic linear does
    intB-both       both: weights and inputs quantised per row to B bits (an ideal per-row int8 GEMM)
  the int8 model (``for_inference(model, "int8")``, each layer's kernel measured fastest):
    int8            as it is
    int8-single     as it is, each sentence alone (fbgemm's activation scale is the batch's)
    int8-head-fp32  the output projection left unquantised, fp32 (likewise ``-bf16``)
    int8-rowact     per-row activation scales (``torch._int_mm``) where fbgemm's per-tensor ones were
                    chosen; ``-rowact`` after any int8 variant does the same to it
    int8-mse        each weight row's scale clipped to the least squared quantisation error
    int8-only-G+G   int8 in these groups of layers only, the rest float32: enc (the encoder),
                    enc-attn, enc-ffn, dec-self (the decoder's self-attention), cross, dec-ffn,
                    ffn (every feed-forward layer), dec (the whole decoder), head (the output projection)

Near ties: each sentence a variant translates otherwise is scored under the fp32 model, both
outputs (their token ids, EOS included, teacher-forced): the length-normalised score the beam
ranks by (log-probability / the length penalty), and how many differ by less than 0.01 and 0.1;
"fp32 search error" counts those where the variant's output scores higher under fp32 than
fp32's own beam output did; "higher or within 0.01 (0.1)": those, and the ones that score at
most that much lower.

The 1,000 test_2016_flickr sentences of the run's languages (``--n``: the first N), beam 4,
length penalty 0.6, one thread.

    TRANSFORMER_DATA=DATA_DIR OMP_NUM_THREADS=1 .venv/bin/python -W ignore benchmarks/decode/int8_agreement.py \\
        --run RUN [--variants fp32-single,int8-weights,int8-acts,int8,...] [--ct2]
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from transformer import hardware
from transformer.data import load_multi30k
from transformer.decode import choose, decoding_copy
from transformer.decode.int8 import Int8Attention, Int8Linear
from transformer.decode.precision import _own_output_layer, for_inference
from transformer.decode.scoring import length_penalty
from transformer.evaluation.translation import score
from transformer.inference.translator import Translation, Translator, load_translator
from transformer.model.attention import MultiHeadAttention
from transformer.run import load_model, read_run_config

DEFAULT_VARIANTS = ("margins,fp32-single,fp32-onednn,bf16,int8-weights,int8-acts,int8-acts-tensor,int8,int8-single,"
                    "int8-head-fp32,int8-only-enc,int8-only-dec-self,int8-only-cross,int8-only-dec-ffn,int8-only-head")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a translation run trained here")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--ct2", action="store_true", help="also CTranslate2 int8 against CTranslate2 float32")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.6)
    ap.add_argument("--n", type=int, default=0, help="the first N test sentences only (0: all)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    print(f"machine: {hardware.describe_line()}; 1 thread", flush=True)
    config = read_run_config(args.run)
    pairs = load_multi30k("test_2016_flickr", config.get("src_lang", "en"), config.get("tgt_lang", "de"),
                          download=False)
    pairs = pairs[:args.n] if args.n else pairs
    src, ref = [s for s, _ in pairs], [t for _, t in pairs]
    raw = load_model(args.run)[0]  # the float32 model as trained: every variant is made from it
    base = load_translator(args.run, warn=False, beam=args.beam, alpha=args.alpha, precision="fp32", compile="off")
    print_kernels(raw)
    scorer = Fp32Scorer(raw, base, args.alpha)

    fp32, seconds = timed(lambda: translations(base, src))
    report("fp32", fp32, seconds, fp32, ref)
    check_scorer(scorer, src, fp32)
    done = {"fp32": fp32}
    for variant in args.variants.split(","):
        if variant == "margins":
            margins(base, src, fp32)
            continue
        name, single = (variant[:-len("-single")], True) if variant.endswith("-single") else (variant, False)
        translator = base if name == "fp32" else decoding_with(base, build(name, raw))
        out, seconds = timed(lambda: translations(translator, src, single))
        report(variant, out, seconds, fp32, ref, done.get(name) if single else None)
        near_ties(scorer, src, out, fp32)
        done[variant] = out
    overlaps(done, fp32)
    if args.ct2:
        texts = [t.text for t in fp32]
        outs = _ct2(base, raw, src, args)
        report_texts("ct2-float32 (against ours fp32)", outs["float32"][0], outs["float32"][1], texts, ref)
        report_texts("ct2-int8 (against ct2 float32)", outs["int8"][0], outs["int8"][1], outs["float32"][0], ref)
    print(f"load average {os.getloadavg()[0]:.1f}")


# --- decoding and reporting ---------------------------------------------------------------------

def timed(translate):
    """``translate()`` and the CPU seconds it took."""
    start = time.process_time()
    out = translate()
    return out, time.process_time() - start


def translations(translator: Translator, src: list[str], single: bool = False) -> list[Translation]:
    """Each line's best translation (text, score, token ids): in ``translate``'s batches by
    length, or with ``single`` each line alone."""
    if single:
        return [translator.translate_nbest([line], 1)[0][0] for line in src]
    return [r[0] for r in translator.translate_nbest(src, 1)]


def decoding_with(base: Translator, model: nn.Module) -> Translator:
    """``base``'s settings and subwords decoding ``model`` as it is (no conversion: each
    variant makes its own decoding copy)."""
    translator = copy.copy(base)
    translator.model = model.eval()
    return translator


def report(name: str, out: list[Translation], seconds: float, fp32: list[Translation], ref: list[str],
           batched: list[Translation] | None = None) -> None:
    report_texts(name, [t.text for t in out], seconds, [t.text for t in fp32], ref)
    gaps = [abs(a.score - b.score) for a, b in zip(out, fp32) if a.tokens == b.tokens]
    print(f"  where the same: the beam's scores differ from fp32's by at most {max(gaps, default=0):.2e}, "
          f"mean {sum(gaps) / max(len(gaps), 1):.2e}", flush=True)
    if batched is not None:
        same = sum(a.text == b.text for a, b in zip(out, batched))
        print(f"  {name}: the same as its own batched translation on {same} of {len(out)}", flush=True)


def report_texts(name: str, out: list[str], seconds: float, against: list[str], ref: list[str]) -> None:
    same = sum(a == b for a, b in zip(out, against))
    print(f"{name}: the same as its fp32 on {same} of {len(out)}; BLEU {score(out, ref).bleu:.2f}; "
          f"{seconds:.1f} s CPU", flush=True)


def print_kernels(raw: nn.Module) -> None:
    """The kernels this machine measured fastest for the model's shapes: what fp32 and int8 run."""
    shapes = sorted({*choose.decoder_shapes(raw), *decoding_copy.fused_shapes(raw)})
    fp32 = choose.float_kernels(shapes, "fp32")
    print("fp32 kernels: " + ", ".join(f"{i}x{o} {fp32.get((i, o), 'F.linear')}" for i, o in shapes))
    int8 = for_inference(raw, "int8")
    kernels = sorted({(m.in_features, m.out_features, m.kernel) for m in int8.modules() if isinstance(m, Int8Linear)})
    print("int8 kernels: " + ", ".join(f"{i}x{o} {k}" for i, o, k in kernels), flush=True)


# --- near ties: both outputs scored under fp32 ------------------------------------------------------

class Fp32Scorer:
    """The fp32 model's teacher-forced score of a token sequence (ids without EOS; EOS is
    scored too): its log-probability and the length-normalised score beam search ranks by."""

    def __init__(self, raw: nn.Module, base: Translator, alpha: float) -> None:
        self.model, self.encode, self.alpha = raw, base.encode, alpha
        self.norm, self.cfg = base.decoding.length_norm, raw.cfg

    @torch.inference_mode()
    def __call__(self, line: str, tokens: list[int]) -> tuple[float, float]:
        src = torch.tensor([self.encode(line)])
        tgt = torch.tensor([[self.cfg.bos_id, *tokens]])
        gold = torch.tensor([*tokens, self.cfg.eos_id])
        lp = torch.log_softmax(self.model(src, tgt)[0].float(), dim=-1)
        logprob = lp.gather(1, gold[:, None]).sum().item()
        return logprob, logprob / length_penalty(len(gold), self.alpha, self.norm)


def check_scorer(scorer: Fp32Scorer, src: list[str], fp32: list[Translation], n: int = 50) -> None:
    """The scorer against the beam's own scores of fp32's outputs (the first ``n``)."""
    gap = max(abs(scorer(line, t.tokens)[1] - t.score) for line, t in zip(src[:n], fp32))
    print(f"scorer: fp32's beam scores re-scored teacher-forced, largest difference {gap:.2e} (first {n})",
          flush=True)


def near_ties(scorer: Fp32Scorer, src: list[str], out: list[Translation], fp32: list[Translation]) -> None:
    """For the sentences whose text differs from fp32's: the fp32 score of the variant's
    output minus that of fp32's own, counted by size and sign."""
    deltas = [scorer(line, v.tokens)[1] - scorer(line, f.tokens)[1]
              for line, v, f in zip(src, out, fp32) if v.text != f.text]
    if not deltas:
        return
    small = sum(abs(d) < 0.01 for d in deltas)
    tenth = sum(abs(d) < 0.1 for d in deltas)
    higher = sum(d > 0 for d in deltas)
    print(f"  near ties of the {len(deltas)} that differ (fp32 score, normalised): |d| < 0.01: {small}, "
          f"< 0.1: {tenth}; the variant's output scores higher (fp32 search error): {higher}; "
          f"higher or within 0.01: {sum(d > -0.01 for d in deltas)}, within 0.1: {sum(d > -0.1 for d in deltas)}; "
          f"median |d| {sorted(map(abs, deltas))[len(deltas) // 2]:.3f}", flush=True)


def overlaps(done: dict[str, list[Translation]], fp32: list[Translation]) -> None:
    """For each variant, how many of the sentences it translates otherwise than fp32 int8
    translates otherwise too: whether they are the same few fragile sentences."""
    def differing(out):
        return {i for i, (a, b) in enumerate(zip(out, fp32)) if a.text != b.text}

    if "int8" not in done:
        return
    int8 = differing(done["int8"])
    every = set().union(*(differing(out) for out in done.values()))
    print(f"overlap: int8 differs on {len(int8)}; all variants together on {len(every)}")
    for name, out in done.items():
        if name not in ("fp32", "int8") and (theirs := differing(out)):
            print(f"  {name}: differs on {len(theirs)}, int8 too on {len(theirs & int8)} of them")


def margins(base: Translator, src: list[str], fp32: list[Translation]) -> None:
    """fp32's best two finished hypotheses (``n_best`` 2): how many sentences have them within
    0.01, 0.1 and 0.3 of each other in the normalised score."""
    two = base.translate_nbest(src, 2)
    gaps = [r[0].score - r[1].score for r in two]
    moved = sum(r[0].text != f.text for r, f in zip(two, fp32))
    print(f"margins: fp32's best and second-best finished hypotheses (n_best 2) within 0.01 on "
          f"{sum(g < 0.01 for g in gaps)}, 0.1 on {sum(g < 0.1 for g in gaps)}, 0.3 on {sum(g < 0.3 for g in gaps)} "
          f"of {len(gaps)}; n_best 2's best differs from n_best 1's on {moved}", flush=True)


# --- the variants ---------------------------------------------------------------------------------

def build(name: str, raw: nn.Module) -> nn.Module:
    """The decoding model of variant ``name``, made from the float32 model ``raw``."""
    if name.endswith("-rowact"):
        return per_row_activations(build(name[:-len("-rowact")], raw))
    if name == "fp32-onednn":
        return fp32_through_onednn(raw)
    if name == "bf16":
        return for_inference(raw, "bf16")
    if m := re.fullmatch(r"int(\d+)-weights(?:-g(\d+))?", name):
        return for_inference(quantise_weights(untied(raw), int(m[1]), int(m[2] or 0)), "fp32")
    if m := re.fullmatch(r"int(\d+)-acts", name):
        return quantised_activations(raw, int(m[1]))
    if m := re.fullmatch(r"int(\d+)-both", name):
        return quantised_activations(quantise_weights(untied(raw), int(m[1])), int(m[1]))
    if name == "int8-acts-tensor":
        return quantised_activations(raw, 8, "tensor")
    if name.startswith("int8-only-"):
        return int8_only(raw, set(name[len("int8-only-"):].split("+")))
    if name == "int8-mse":
        return int8_least_squares(raw)
    model = for_inference(raw, "int8")
    if name.startswith("int8-head-"):
        dtype = torch.float32 if name.endswith("fp32") else torch.bfloat16
        model.out_proj = nn.Sequential(Cast(dtype), float_copy(nn_linear_of(raw), dtype))
    elif name != "int8":
        raise SystemExit(f"unknown variant {name!r}")
    return model


def per_row_activations(model: nn.Module) -> nn.Module:
    """In place: the int8 layers measured fastest with fbgemm's GEMM (its input quantised per
    tensor) multiply with ``torch._int_mm`` instead (the input quantised per row)."""
    for m in model.modules():
        if isinstance(m, Int8Linear) and m.kernel == "fbgemm":
            m.kernel = "int_mm"
    return model


def fp32_through_onednn(raw: nn.Module) -> nn.Module:
    """fp32's decoding copy with every shape, the projection's included, through oneDNN."""
    shapes = {*choose.decoder_shapes(raw), *decoding_copy.fused_shapes(raw)}
    return decoding_copy.prepare(decoding_copy.shallow_copy(raw).eval(), shapes)


def untied(raw: nn.Module) -> nn.Module:
    """A float32 copy of ``raw`` whose output projection is a layer of its own (an
    ``nn.Linear`` copy of the embedding it is tied to), as int8 quantises it."""
    model = copy.deepcopy(raw).float().eval()
    if model.out_proj is None:
        _own_output_layer(model)
    return model


def nn_linear_of(raw: nn.Module) -> nn.Linear:
    return untied(raw).out_proj


def float_copy(linear: nn.Linear, dtype: torch.dtype) -> nn.Linear:
    out = copy.deepcopy(linear).to(dtype)
    out.requires_grad_(False)
    return out


class Cast(nn.Module):
    """The projection's input in its weight's dtype (the residual stream is float32 under int8)."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, h):
        return h.to(self.dtype)


def rows_quantised(x: torch.Tensor, bits: int, group: int = 0) -> torch.Tensor:
    """``x`` (rows, k) quantised symmetrically per row to ``bits`` (the row's largest |x| at
    2 ** (bits - 1) - 1) and back to float32: at 8 bits the arithmetic of ``Int8Linear.from_linear``
    (then ``weight()``) and of ``int8.quantise_rows``. ``group``: a scale for each ``group``
    consecutive values of a row instead (0: the whole row)."""
    shape = x.shape
    x = x.reshape(-1, group) if group else x
    levels = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / levels
    return (torch.round(x / scale).clamp_(-levels, levels) * scale).view(shape)


@torch.no_grad()
def quantise_weights(model: nn.Module, bits: int, group: int = 0) -> nn.Module:
    """In place: every ``nn.Linear`` weight of ``model`` (the projection's too, once
    :func:`untied`) quantised per output row to ``bits`` and back (at 8 bits what
    ``Int8Linear`` holds, the product its weight-only-fp32 kernel forms; ``group``: a scale
    per ``group`` inputs of a row). Returns ``model``."""
    for m in model.modules():
        if type(m) is nn.Linear:
            m.weight.copy_(rows_quantised(m.weight.float(), bits, group))
    return model


class QuantisedInput(nn.Linear):
    """A float32 linear layer whose input is first quantised and back: per row to ``bits``
    (symmetric, the row's largest |x| at the top level: at 8 bits ``torch._int_mm``'s path),
    or (``per`` "tensor") to uint8 over the whole call's input, asymmetric, as fbgemm's
    dynamic linear does."""

    per, bits = "row", 8

    def forward(self, x):
        rows = x.reshape(-1, x.size(-1)).float().contiguous()
        if self.per == "row":
            rows = rows_quantised(rows, self.bits)
        else:
            with warnings.catch_warnings():  # quantised tensors are deprecated in torch 2.13
                warnings.simplefilter("ignore")
                rows = torch.quantize_per_tensor_dynamic(rows, torch.quint8, False).dequantize()
        return F.linear(rows.view_as(x), self.weight, self.bias)


def quantised_activations(raw: nn.Module, bits: int, per: str = "row") -> nn.Module:
    """``raw``'s float32 weights, every linear layer (the projection's too) quantising its
    input (:class:`QuantisedInput`); each attention applies its projections one by one."""
    model = untied(raw)
    for m in model.modules():
        if type(m) is nn.Linear:
            m.__class__, m.per, m.bits = QuantisedInput, per, bits
        elif type(m) is MultiHeadAttention:
            m.__class__ = Int8Attention  # (its projections called one by one, not concatenated)
    return model


#: which groups a linear layer (its name in the model) belongs to
def groups_of(name: str) -> set[str]:
    if name == "out_proj":
        return {"head"}
    part, _, rest = name.partition(".layers.")
    sub = rest.split(".")[1]  # self_attn, cross_attn or ffn
    if part == "encoder":
        return {"enc", "enc-ffn" if sub == "ffn" else "enc-attn"} | ({"ffn"} if sub == "ffn" else set())
    return {"dec", {"self_attn": "dec-self", "cross_attn": "cross", "ffn": "dec-ffn"}[sub]} | (
        {"ffn"} if sub == "ffn" else set())


class FloatLinear(nn.Linear):
    """An ``nn.Linear`` that ``for_inference(..., "int8")`` leaves float32 (it quantises
    layers whose type is exactly ``nn.Linear``)."""


def int8_only(raw: nn.Module, groups: set[str]) -> nn.Module:
    """``for_inference(model, "int8")`` with only the linear layers of ``groups`` quantised;
    the others stay float32 (``F.linear``), the projection too unless ``head`` is asked."""
    model = untied(raw)
    known = set().union(*(groups_of(n) for n, m in model.named_modules() if type(m) is nn.Linear))
    if groups - known:
        raise SystemExit(f"unknown groups {sorted(groups - known)}: expected some of {sorted(known)}")
    for name, m in model.named_modules():
        if type(m) is nn.Linear and not groups & groups_of(name):
            m.__class__ = FloatLinear
    return for_inference(model, "int8")


def int8_least_squares(raw: nn.Module) -> nn.Module:
    """The int8 model with each weight row's scale clipped to the least squared error."""
    original = Int8Linear.from_linear.__func__
    Int8Linear.from_linear = classmethod(_least_squares_rows)
    try:
        return for_inference(raw, "int8")
    finally:
        Int8Linear.from_linear = classmethod(original)


def _least_squares_rows(cls, linear, kernel="weight-only-bf16"):
    """An Int8Linear whose row scales are clipped (between half and all of the row's largest |w|)
    to the least squared quantisation error."""
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


def _ct2(base, raw, src: list[str], args) -> dict:
    """CTranslate2 float32 and int8 on our export of the fp32 model, in translate's batches."""
    import ctranslate2

    from transformer.interop.ctranslate2 import save_ctranslate2

    sw, d = base.subwords, base.decoding
    vocab = [sw.id_to_piece(i) for i in range(sw.vocab_size)]
    index = {p: i for i, p in enumerate(vocab)}
    folder = Path(tempfile.mkdtemp(prefix="ct2.")) / "model"
    save_ctranslate2(raw, folder, vocab)
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
