"""The ten steps' records: for each, the formula, where the code is, the tensor shapes with
their dimension names, and a few telling numbers (text for people, a dict for --json).

The words of every step (title, Chinese title, formula, code), the language model's as well,
stand in ``step_texts.toml``; :func:`record` starts a step with them, and the builders here
and in :mod:`.records_lm` add the shapes and numbers.

Each builder takes tensors that :func:`transformer.viz.walkthrough.walk` computed with the
model's own sub-modules; nothing here runs the model.
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor



@dataclass
class Record:
    number: str  # the article's step: "1" .. "10", sub-steps "3a" .. "3c"
    title: str
    title_zh: str
    formula: str
    code: str  # file and function that do it
    shapes: list[str] = field(default_factory=list)  # "name: (S=9 source tokens, d_model=128)"
    numbers: dict[str, Any] = field(default_factory=dict)  # for --json
    lines: list[str] = field(default_factory=list)  # the same numbers, as text


TEXTS = tomllib.loads((files(__package__) / "step_texts.toml").read_text(encoding="utf-8"))


def record(walk: str, number: str, *cases: str | None, **fill: str) -> Record:
    """A new step ``number`` of ``walk`` ("translation" or "lm") with its words from
    ``step_texts.toml``: title, Chinese title, formula and code, each case's words (its
    sub-table; a None case is skipped) over the step's, ``{name}`` filled in from ``fill``."""
    table = TEXTS[walk][number]
    words = {k: v for k, v in table.items() if isinstance(v, str)}
    for case in filter(None, cases):
        words.update(table[case])
    for name, value in fill.items():
        words = {k: v.replace("{" + name + "}", value) for k, v in words.items()}
    return Record(number, **words)


def dims(*named: tuple[str, int, str | None]) -> str:
    """ ("S", 9, "source tokens"), ("d_model", 128, None) -> "(S=9 source tokens, d_model=128)" """
    return "(" + ", ".join(f"{n}={v}" + (f" {what}" if what else "") for n, v, what in named) + ")"


def clip(items: list[str], sep: str, most: int = 30) -> str:
    """Join for display, at most ``most`` items (the JSON keeps them all)."""
    shown = sep.join(items[:most])
    return shown if len(items) <= most else f"{shown}{sep}... ({len(items) - most} more)"


def rounded(x: float, n: int = 4) -> float:
    """``x`` as a float rounded to ``n`` decimals (what a walkthrough records)."""
    return round(float(x), n)


def row_sum_error(w: Tensor) -> float:
    """The largest |sum of a row - 1| of weights or probabilities (..., N): softmax's check."""
    return rounded((w.sum(-1) - 1).abs().max(), 8)


def above_diagonal(w: Tensor) -> float:
    """The largest of the weights (H, T, T) on a later position: 0.0 under a causal mask."""
    return float(torch.triu(w, diagonal=1).abs().max()) if w.size(-1) > 1 else 0.0


def row_norm(x: Tensor) -> float:
    """The mean norm of the rows of x (1, T, C)."""
    return rounded(x[0].norm(dim=-1).mean())


def top_pieces(p: Tensor, show, k: int) -> list[tuple[str, float]]:
    """The ``k`` most probable tokens of one distribution ``p`` (V,): (piece, probability)."""
    q, i = p.topk(k)
    return [(show(int(j)), v) for v, j in zip(q.tolist(), i.tolist())]


def norm_stats(norm, s: Tensor) -> dict[str, float]:
    """LayerNorm's effect on the residual sum ``s`` (1, T, C), averaged over positions."""
    mean, std = s.mean(-1), s.std(-1, unbiased=False)
    z = (s - mean[..., None]) / torch.sqrt(s.var(-1, unbiased=False, keepdim=True) + norm.eps)
    out = norm(s)
    return {"before_mean": rounded(mean.mean()), "before_std": rounded(std.mean()),
            "normalised_mean_max_abs": rounded(z.mean(-1).abs().max(), 8), "normalised_std": rounded(z.std(-1, unbiased=False).mean()),
            "after_gain_bias_mean": rounded(out.mean(-1).mean()), "after_gain_bias_std": rounded(out.std(-1, unbiased=False).mean())}


def strongest_links(w: Tensor, rows: list[str], cols: list[str], skip_diagonal: bool) -> list[str]:
    """Per head, the strongest row -> column weight (w: (H, rows, cols))."""
    out = []
    for h in range(w.size(0)):
        m = w[h].clone()
        if skip_diagonal and m.size(0) == m.size(1) and m.size(0) > 1:
            m.fill_diagonal_(-1.0)
        i, j = divmod(int(m.argmax()), m.size(1))
        out.append(f"head {h + 1}: {rows[i]} -> {cols[j]} ({float(w[h, i, j]):.2f})")
    return out


def projection_dims(cfg, kv: bool = False) -> str:
    """The shape of W^Q (d_model, H*d_k), or with ``kv`` of W^K and W^V (d_model, H_kv*d_k)."""
    heads = ("H_kv*d_k", cfg.kv_heads * cfg.d_head, None) if kv else ("H*d_k", cfg.n_heads * cfg.d_head, None)
    return dims(("d_model", cfg.d_model, None), heads)


def head_shapes(cfg, names: str, q_dims, k_dims) -> list[str]:
    """The shapes of one attention's per-head tensors ``names`` (H, rows, d_k) and its scores."""
    h_dims = ("H", cfg.n_heads, "heads")
    return [f"{names}: {dims(h_dims, q_dims, ('d_k', cfg.d_head, None))}", f"Score: {dims(h_dims, q_dims, k_dims)}"]


def embedding_step(cfg, scale: float, looked_up: Tensor, x_embed: Tensor, src_p, src_ids, s_dims) -> Record:
    """(1): looked_up = E[x] (1, S, C), x_embed = looked_up * sqrt(d_model)."""
    C = cfg.d_model
    pe_norm = math.sqrt(C / 2)
    st = record("translation", "1")
    st.shapes = [f"E: {dims(('V', cfg.vocab_size, 'subwords'), ('d_model', C, None))}",
                 f"X_embed: {dims(s_dims, ('d_model', C, None))}"]
    st.numbers = {"pieces": src_p, "ids": src_ids, "sqrt_d_model": rounded(scale),
                  "row_norm_before": rounded(looked_up.norm(dim=-1).mean()),
                  "row_norm_after": rounded(x_embed.norm(dim=-1).mean()), "pe_row_norm": rounded(pe_norm)}
    st.lines = [f"source pieces: {clip(src_p, ' ')}",
                f"mean row norm of E[x]: {st.numbers['row_norm_before']:.3f} -> x sqrt({C}) = {scale:.2f} "
                f"-> {st.numbers['row_norm_after']:.3f} (a PE row has norm sqrt(d_model/2) = {pe_norm:.2f})"]
    return st


def positions_step(cfg, pe: Tensor, s_dims) -> Record:
    """(2): pe = the rows of the positional table added, (S, C)."""
    S, C = pe.size(0), cfg.d_model
    cos = lambda a, b: float(F.cosine_similarity(a, b, dim=0))  # noqa: E731
    st = record("translation", "2")
    st.shapes = [f"PE[:S]: {dims(s_dims, ('d_model', C, None))}", f"X_input: {dims(s_dims, ('d_model', C, None))}"]
    st.numbers = {"layout": cfg.sinusoid_layout, "pe_pos0_first4": [rounded(v) for v in pe[0, :4]],
                  "pe_pos1_first4": [rounded(v) for v in pe[1, :4]] if S > 1 else []}
    st.lines = [f"PE[0, :4] = {st.numbers['pe_pos0_first4']}   ({cfg.sinusoid_layout} sin/cos layout)"]
    if S > 1:
        st.lines.append(f"PE[1, :4] = {st.numbers['pe_pos1_first4']}")
    if S > 3:
        st.numbers["cos_sim_pe1_pe2"] = rounded(cos(pe[1], pe[2]))
        st.numbers["cos_sim_pe1_peLast"] = rounded(cos(pe[1], pe[S - 1]))
        st.lines.append(f"nearby positions look alike: cos(PE[1], PE[2]) = {st.numbers['cos_sim_pe1_pe2']:.3f}, "
                        f"cos(PE[1], PE[{S - 1}]) = {st.numbers['cos_sim_pe1_peLast']:.3f}")
    return st


def attention_steps(cfg, a, rows, cols, q_dims, k_dims, where: str) -> list[Record]:
    """(3a)-(3c) from one opened-up attention (``engine.AttentionParts``)."""
    H, D, C = cfg.n_heads, cfg.d_head, cfg.d_model
    h_dims, d_dims = ("H", H, "heads"), ("d_k", D, None)
    w = a.weights[0]  # (H, S, S)
    st_a = record("translation", "3a")
    st_a.shapes = [f"W^Q, W^K, W^V: {projection_dims(cfg)} each "
                   f"(H={H} blocks W_i of d_model x d_k={D})",
                   *head_shapes(cfg, "Q, K, V", q_dims, k_dims)]
    raw = a.raw_scores[0]
    st_a.numbers = {"where": where, "score_std": rounded(raw.std()), "score_min": rounded(raw.min()), "score_max": rounded(raw.max())}
    st_a.lines = [f"{where}: Q K^T ranges {raw.min():.2f} .. {raw.max():.2f} (std {raw.std():.2f})"]
    unscaled = a.raw_scores[0].softmax(-1)
    st_b = record("translation", "3b")
    st_b.shapes = [f"weights: {dims(h_dims, q_dims, k_dims)}"]
    st_b.numbers = {"sqrt_d_k": rounded(math.sqrt(D)), "scaled_score_std": rounded((raw / math.sqrt(D)).std()),
                    "row_sum_max_abs_err": row_sum_error(w),
                    "mean_max_weight": rounded(w.amax(-1).mean()), "mean_max_weight_unscaled": rounded(unscaled.amax(-1).mean()),
                    "strongest_links": strongest_links(w, rows, cols, skip_diagonal=True)}
    st_b.lines = [f"divide by sqrt(d_k) = {math.sqrt(D):.2f}: score std {raw.std():.2f} -> {st_b.numbers['scaled_score_std']:.2f}",
                  f"rows sum to 1 (largest error {st_b.numbers['row_sum_max_abs_err']:.1e}); mean largest weight per row "
                  f"{st_b.numbers['mean_max_weight']:.2f} (without the scaling it would be {st_b.numbers['mean_max_weight_unscaled']:.2f})",
                  "strongest link to another token, per head: " + "; ".join(st_b.numbers["strongest_links"])]
    st_c = record("translation", "3c")
    st_c.shapes = [f"head_i: {dims(q_dims, d_dims)} x {H}", f"Concat: {dims(q_dims, ('H*d_k', H * D, None))}",
                   f"W_O: {dims(('d_model', C, None), ('d_model', C, None))}", f"output: {dims(q_dims, ('d_model', C, None))}"]
    st_c.numbers = {"concat_norm": row_norm(a.concat), "output_norm": row_norm(a.out)}
    st_c.lines = [f"mean row norm: concat {st_c.numbers['concat_norm']:.3f} -> after W_O {st_c.numbers['output_norm']:.3f}"]
    return [st_a, st_b, st_c]


def add_norm_step(block, x_in: Tensor, y: Tensor, s: Tensor, s_dims, C: int) -> Record:
    """(4): x_in the sub-layer's input, y its output, s the residual sum."""
    st = record("translation", "4", "pre-norm" if block.norm_first else None)
    st.shapes = [f"X + MultiHead(X): {dims(s_dims, ('d_model', C, None))}"]
    ratio = float(y[0].norm(dim=-1).mean() / x_in[0].norm(dim=-1).mean())
    st.numbers = {"sublayer_to_input_norm_ratio": rounded(ratio), **norm_stats(block.norm, s if not block.norm_first else x_in)}
    n = st.numbers
    st.lines = [f"|MultiHead(X)| / |X| = {ratio:.2f} (the residual path carries X through unchanged)",
                f"LayerNorm{' (of the next input)' if block.norm_first else ''}: per-token mean {n['before_mean']:.3f}, "
                f"std {n['before_std']:.3f} -> normalised mean {n['normalised_mean_max_abs']:.1e}, "
                f"std {n['normalised_std']:.3f}; after the learned gain and bias: mean {n['after_gain_bias_mean']:.3f}, "
                f"std {n['after_gain_bias_std']:.3f}"]
    return st


FFN_FORMULA = {"relu": "FFN(x) = max(0, x W1 + b1) W2 + b2", "gelu": "FFN(x) = GELU(x W1 + b1) W2 + b2",
               "silu": "FFN(x) = SiLU(x W1 + b1) W2 + b2", "swiglu": "FFN(x) = ((x W1) * SiLU(x W_gate)) W2"}


def zeroed(ffn: dict[str, Tensor]) -> float:
    """The fraction of an FFN's hidden units (``engine.ffn_parts``) that are exactly 0."""
    return float((ffn["hidden"] == 0).float().mean())


def ffn_step(cfg, layer, ffn: dict[str, Tensor], s: Tensor, s_dims) -> Record:
    """(5): ffn = the FFN's parts (``engine.ffn_parts``), s the residual sum."""
    act = cfg.ffn_activation
    st = record("translation", "5", ffn=FFN_FORMULA[act])
    st.shapes = [f"x W1 + b1: {dims(s_dims, ('d_ff', cfg.d_ff, None))}", f"FFN(x): {dims(s_dims, ('d_model', cfg.d_model, None))}"]
    zero = zeroed(ffn)
    st.numbers = {"activation": act, "fraction_zeroed": rounded(zero)}
    if not cfg.norm_first:
        st.numbers.update({f"norm_{k}": v for k, v in norm_stats(layer.ffn_block.norm, s).items()})
    st.lines = [f"{act}: {zero:.1%} of the {cfg.d_ff} hidden units are exactly 0 (averaged over the {s.size(1)} tokens)"]
    return st


def masked_step(cfg, a, tgt_p, t_dims) -> Record:
    w = a.weights[0]  # (H, T, T)
    above = above_diagonal(w)
    st = record("translation", "6")
    h_dims = ("H", cfg.n_heads, "heads")
    st.shapes = [f"target input (<s> + translation): {dims(t_dims, ('d_model', cfg.d_model, None))}",
                 f"mask: {dims(('T', t_dims[1], None), ('T', t_dims[1], None))}", f"weights: {dims(h_dims, t_dims, t_dims)}"]
    st.numbers = {"pieces": tgt_p, "max_weight_above_diagonal": above,
                  "row_sum_max_abs_err": row_sum_error(w),
                  "first_row_self_weight": rounded(w[:, 0, 0].mean()),
                  "strongest_links": strongest_links(w, tgt_p, tgt_p, skip_diagonal=True)}
    st.lines = [f"decoder reads: {clip(tgt_p, ' ')}",
                f"largest weight above the diagonal (on a future token): {above} ; rows sum to 1 "
                f"(largest error {st.numbers['row_sum_max_abs_err']:.1e}); position 1 (<s>) can only attend to itself: "
                f"weight {st.numbers['first_row_self_weight']:.2f}"]
    return st


def cross_step(cfg, a, tgt_p, src_p, t_dims, s_dims) -> Record:
    h_dims, d_dims = ("H", cfg.n_heads, "heads"), ("d_k", cfg.d_head, None)
    w = a.weights[0]  # (H, T, S)
    st = record("translation", "7")
    st.shapes = [f"Q: {dims(h_dims, t_dims, d_dims)}", f"K, V (computed once, cached): {dims(h_dims, s_dims, d_dims)}",
                 f"weights: {dims(h_dims, t_dims, s_dims)}"]
    st.numbers = {"row_sum_max_abs_err": row_sum_error(w),
                  "strongest_links": strongest_links(w, tgt_p, src_p, skip_diagonal=False)}
    st.lines = [f"rows sum to 1 (largest error {st.numbers['row_sum_max_abs_err']:.1e})",
                "layer 1, strongest target -> source link per head: " + "; ".join(st.numbers["strongest_links"])]
    return st


def decoder_ffn_step(cfg, ffn: dict[str, Tensor], t_dims) -> Record:
    zero = zeroed(ffn)
    st = record("translation", "8", ffn=FFN_FORMULA[cfg.ffn_activation])
    st.shapes = [f"hidden: {dims(t_dims, ('d_ff', cfg.d_ff, None))}", f"decoder output: {dims(t_dims, ('d_model', cfg.d_model, None))}"]
    st.numbers = {"fraction_zeroed": rounded(zero)}
    st.lines = [f"{cfg.ffn_activation}: {zero:.1%} of the hidden units are exactly 0 in decoder layer 1"]
    return st


def alignment(w: Tensor, tgt_ids, id_to_piece, src_p, eos_id) -> list[str]:
    """For each predicted token, the source piece it attends to most (w: (H, T, S), mean of heads)."""
    mean = w.mean(0)  # (T, S)
    predicted = [id_to_piece(i) for i in [*tgt_ids, eos_id]]
    return [f"{p}<-{src_p[int(mean[t].argmax())]}" for t, p in enumerate(predicted)]


def output_shapes(cfg, matrix: str, note: str, t_dims, v_dims) -> list[str]:
    """The output projection's shapes: ``matrix`` (d_model, V), then ``note`` (what it is
    when tied to the embedding), and the logits (T, V)."""
    return [f"{matrix}: {dims(('d_model', cfg.d_model, None), v_dims)}{note}", f"Logits: {dims(t_dims, v_dims)}"]


def linear_step(cfg, model, logits, t_dims, V) -> Record:
    tied = model.out_proj is None
    st = record("translation", "9", "bias" if cfg.output_bias else None)
    st.shapes = output_shapes(cfg, "W_vocab", " = E^T, the embedding table shared (tied)" if tied else "", t_dims,
                              ("V", V, "subwords"))
    st.numbers = {"tied": tied, "logit_min": rounded(logits.min()), "logit_max": rounded(logits.max())}
    st.lines = [f"logits range {logits.min():.2f} .. {logits.max():.2f}" + ("; W_vocab is the embedding table E" if tied else "")]
    return st


def softmax_step(cfg, logits, tgt_p, tgt_ids, id_to_piece, t_dims, V) -> Record:
    probs = logits[0].float().softmax(-1)  # (T, V)
    st = record("translation", "10")
    st.shapes = [f"P: {dims(t_dims, ('V', V, 'subwords'))}"]

    def top5(t: int) -> list[list]:
        return [[piece, rounded(q)] for piece, q in top_pieces(probs[t], id_to_piece, min(5, V))]

    wanted = [*tgt_ids, cfg.eos_id]
    agree = sum(int(probs[t].argmax()) == wanted[t] for t in range(len(wanted)))
    last = len(wanted) - 1
    st.numbers = {"row_sum_max_abs_err": row_sum_error(probs),
                  "top5_first": top5(0), "top5_last": top5(last), "argmax_agrees": agree, "positions": len(wanted)}
    fmt = lambda rows: ", ".join(f"{p} {q:.3f}" for p, q in rows)  # noqa: E731
    st.lines = [f"rows sum to 1 (largest error {st.numbers['row_sum_max_abs_err']:.1e})",
                f"after {tgt_p[0]}: top-5 {fmt(st.numbers['top5_first'])}",
                f"after {tgt_p[last]} (position {last + 1}): top-5 {fmt(st.numbers['top5_last'])}",
                f"the most probable token is the translation's own token at {agree} of {len(wanted)} positions"]
    return st
