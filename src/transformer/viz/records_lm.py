"""The decoder-only language model's steps as records (formula, code, named shapes, telling
numbers), in the article's terms: We, positions (or the rotation of q and k), masked
self-attention, Add & Norm, the gated FFN's W_gate / W_up / W_down, the final norm, Whead,
softmax and the choice of the next token. Their words stand in ``step_texts.toml`` beside the
translation model's (:func:`~transformer.viz.records.record`).

Each builder takes tensors that :func:`transformer.viz.walkthrough_lm.walk_lm` computed with
the model's own sub-modules; nothing here runs the model. Shape legend: T prompt tokens,
H heads, d_k = d_model / H, V vocabulary, d_ff the FFN's inner width.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..decode.sample import filter_logits
from ..model.rotary import apply_rotary
from .records import (Record, above_diagonal, clip, dims, head_shapes, output_shapes, projection_dims, record,
                      rounded, row_norm, row_sum_error, strongest_links, top_pieces)

D_MODEL = "d_model"


def _sig(x: float, digits: int = 6) -> float:
    """``x`` to ``digits`` significant digits (a slow pair's angle is a few 1e-5 rad)."""
    return float(f"{x:.{digits}g}")


def _vec(x: Tensor, n: int = 4) -> list[float]:
    return [rounded(v) for v in x[:n].tolist()]


def embedding_step(cfg, scale: float, looked_up: Tensor, x: Tensor, pieces: list[str], ids: list[int], t_dims) -> Record:
    """(1): looked_up = We[x] (1, T, C); x = looked_up * scale (1.0 for GPT and Llama)."""
    C = cfg.d_model
    scaled = scale != 1.0
    st = record("lm", "1", "scaled" if scaled else None)
    st.shapes = [f"We: {dims(('V', cfg.vocab_size, 'tokens'), (D_MODEL, C, None))}",
                 f"X: {dims(t_dims, (D_MODEL, C, None))}"]
    st.numbers = {"pieces": pieces, "ids": ids, "scale": rounded(scale), "row_norm": row_norm(looked_up),
                  "first_row_first4": _vec(x[0, 0])}
    st.lines = [f"tokens: {clip(pieces, ' ')}", f"ids:    {clip([str(i) for i in ids], ' ')}",
                f"We[{ids[0]}][:4] = {st.numbers['first_row_first4']} (the row of '{pieces[0]}'); mean row norm "
                f"{st.numbers['row_norm']:.3f}" + (f", x sqrt({C}) = {scale:.2f}" if scaled else "; not scaled "
                                                   "(GPT and Llama look the row up as it is)")]
    return st


def learned_positions_step(cfg, wpos: Tensor, x_embed: Tensor, t_dims) -> Record:
    """(2), GPT-2: a trained row Wpos[p] added to each token's row; wpos (T, C)."""
    T = wpos.size(0)
    st = record("lm", "2")
    st.shapes = [f"Wpos: {dims(('max_len', cfg.max_len, 'positions'), (D_MODEL, cfg.d_model, None))}",
                 f"Wpos[:T]: {dims(t_dims, (D_MODEL, cfg.d_model, None))}"]
    st.numbers = {"wpos_row_norm": rounded(wpos.norm(dim=-1).mean()), "we_row_norm": row_norm(x_embed)}
    st.lines = [f"mean row norm: Wpos[p] {st.numbers['wpos_row_norm']:.3f} against We[x] {st.numbers['we_row_norm']:.3f}"]
    if T > 2:
        st.numbers["cos_wpos0_wpos1"] = rounded(F.cosine_similarity(wpos[0], wpos[1], dim=0))
        st.numbers["cos_wpos1_wpos2"] = rounded(F.cosine_similarity(wpos[1], wpos[2], dim=0))
        st.lines.append(f"learned, not a formula: cos(Wpos[0], Wpos[1]) = {st.numbers['cos_wpos0_wpos1']:.3f}, "
                        f"cos(Wpos[1], Wpos[2]) = {st.numbers['cos_wpos1_wpos2']:.3f}")
    return st


def rotary_step(cfg, rotary, q: Tensor, k: Tensor, q_rot: Tensor, t_dims) -> Record:
    """(2), Llama: nothing is added to X; layer l's queries and keys are rotated instead.
    q (1, H, T, D), k (1, H_kv, T, D): layer 1's before the rotation, q_rot after it; the
    angles are the model's own (``rotary``'s tables, Llama 3's scaling included)."""
    D, T = cfg.d_head, q.size(2)
    p, half = T - 1, D // 2
    scaling = cfg.rope_scaling
    st = record("lm", "2", "rotary", "rotary-llama3" if scaling else None,
                **{name: f"{value:g}" for name, value in (scaling or {}).items()})
    st.shapes = [f"cos, sin tables: {dims(('max_len', cfg.max_len, 'positions'), ('d_k', D, None))}",
                 f"q, k of one head: {dims(t_dims, ('d_k', D, None))}"]
    freq, at_p = pair_angles(rotary, p)  # (D/2,) radians per position, and at position p
    fast, slow = float(at_p[0]), float(at_p[half - 1])
    q0, q1 = q[0, 0, p], q_rot[0, 0, p]  # head 1's query of the last token, before and after the turn
    before, after = [rounded(q0[0]), rounded(q0[half])], [rounded(q1[0]), rounded(q1[half])]
    st.numbers = n = {"position": p, "theta": cfg.rope_theta, "angle_fastest_pair": _sig(fast),
                      "angle_slowest_pair": _sig(slow), "q_pair0_before": before, "q_pair0_after": after,
                      "q_norm_before": rounded(q0.norm()), "q_norm_after": rounded(q1.norm())}
    st.lines = [f"layer 1, head 1, the last token (position p = {p}): pair 0 turns by p * {float(freq[0]):.4g} = "
                f"{fast:.6g} rad, the slowest pair (i = {half - 1}) by {slow:.4g} rad",
                f"q pair 0 ({before[0]:.3f}, {before[1]:.3f}) -> ({after[0]:.3f}, {after[1]:.3f}); "
                f"|q| {n['q_norm_before']:.4f} -> {n['q_norm_after']:.4f} (a rotation keeps the length)"]
    if scaling:
        st.lines.append(scaling_line(cfg, freq, n))
    if T > 1:
        shift = relative_shift(rotary, q[0, 0, p], k[0, 0, 0], p, 0, 3)
        n["score_p_0"], n["score_shifted"] = rounded(shift[0], 5), rounded(shift[1], 5)
        st.lines.append(f"q.k depends on the distance only: q at {p} with k at 0 gives {shift[0]:.5f}; the same "
                        f"vectors at {p + 3} and 3 give {shift[1]:.5f}")
    return st


def pair_angles(rotary, p: int) -> tuple[Tensor, Tensor]:
    """How far each pair of a head turns, read off the model's own cos / sin tables (Llama 3's
    scaling included): per position (D/2,), from position 1's angles (each at most 1 rad, so
    atan2 gives it whole), and at position ``p`` (D/2,), position p's angles unwrapped by it."""
    cos, sin = rotary(torch.tensor([1, p], device=rotary.cos.device))  # (2, D): each angle twice, i and i + D/2
    half = cos.size(-1) // 2
    angle = torch.atan2(sin[:, :half].double(), cos[:, :half].double()).cpu()  # (2, D/2) in (-pi, pi]
    step, seen = angle[0], angle[1]
    return step, seen + 2 * math.pi * torch.round((p * step - seen) / (2 * math.pi))


def scaling_line(cfg, freq: Tensor, numbers: dict) -> str:
    """What Llama 3's scaling did to the frequencies ``freq`` (D/2,): how many pairs turn
    ``factor`` times slower than theta^(-2i/d_k), how many are unchanged, how many blended."""
    D, factor = cfg.d_head, cfg.rope_scaling["factor"]
    seed = cfg.rope_theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # the unscaled formula
    ratio = freq / seed
    slowed = int(torch.isclose(ratio, torch.tensor(1 / factor, dtype=torch.float64), rtol=1e-5).sum())
    kept = int(torch.isclose(ratio, torch.ones((), dtype=torch.float64), rtol=1e-5).sum())
    numbers.update(rope_scaling=dict(cfg.rope_scaling), pairs_slowed=slowed, pairs_unchanged=kept,
                   pairs_blended=len(freq) - slowed - kept,
                   unscaled_angle_slowest_pair=_sig(numbers["position"] * float(seed[-1])))
    return (f"Llama 3 scaling: {slowed} of the {len(freq)} pairs turn {factor:g} times slower than theta^(-2i/d_k), "
            f"{kept} as before, {numbers['pairs_blended']} in between; unscaled, the slowest pair would have turned "
            f"by {numbers['unscaled_angle_slowest_pair']:.4g} rad")


def relative_shift(rotary, q: Tensor, k: Tensor, m: int, n: int, s: int) -> tuple[float, float]:
    """(rot(q, m) . rot(k, n), rot(q, m+s) . rot(k, n+s)) for one head's (D,) vectors q, k,
    with the run's own cos/sin tables (RoPE makes the two equal up to rounding)."""
    def turned(x: Tensor, pos: int) -> Tensor:
        cos, sin = rotary(torch.tensor([pos], device=x.device))
        return apply_rotary(x[None, None, None], cos, sin)[0, 0, 0]

    top = min(m + s, rotary.max_len - 1) - m  # stay inside the table
    return float(turned(q, m) @ turned(k, n)), float(turned(q, m + top) @ turned(k, n + top))


def scores_step(cfg, a, pieces: list[str], t_dims) -> Record:
    """(3a): a is layer 1's opened-up attention (``engine.AttentionParts``)."""
    D = cfg.d_head
    raw = a.raw_scores[0]  # (H, T, T)
    st = record("lm", "3a")
    st.shapes = [f"WQ: {projection_dims(cfg)}; WK, WV: {projection_dims(cfg, kv=True)}",
                 *head_shapes(cfg, "Q", t_dims, t_dims)]
    last = (raw[0, -1] / math.sqrt(D)).tolist()
    st.numbers = {"sqrt_d_k": rounded(math.sqrt(D)), "score_std": rounded((raw / math.sqrt(D)).std()),
                  "head1_last_row_scaled": [rounded(v, 3) for v in last]}
    q, k, v = (t[0, 0, -1] for t in (a.q, a.k, a.v))  # head 1, the last token
    st.numbers.update(head1_last_q_first4=_vec(q), head1_last_k_first4=_vec(k), head1_last_v_first4=_vec(v))
    st.lines = [f"layer 1, head 1, the last token '{pieces[-1]}': q[:4] = {_vec(q)}, k[:4] = {_vec(k)}, v[:4] = {_vec(v)}",
                f"layer 1: scaled scores have std {st.numbers['score_std']:.2f} "
                f"(divided by sqrt(d_k) = {math.sqrt(D):.2f})",
                f"head 1, the last token '{pieces[-1]}' against each key: "
                + clip([f"{p}:{v:.2f}" for p, v in zip(pieces, last)], " ", 24)]
    if raw.size(-1) > 1:
        st.lines.append(f"head 1, row 1 ('{pieces[0]}') has keys beyond it too: Score[1, 2] = "
                        f"{float(raw[0, 0, 1]) / math.sqrt(D):.2f}, which the mask removes in the next step")
    return st


def mask_softmax_step(cfg, a, pieces: list[str], t_dims) -> Record:
    """(3b): the causal mask and softmax of layer 1."""
    w = a.weights[0]  # (H, T, T)
    T = w.size(-1)
    st = record("lm", "3b")
    st.shapes = [f"M: {dims(('T', T, None), ('T', T, None))}",
                 f"weights: {dims(('H', cfg.n_heads, 'heads'), t_dims, t_dims)}"]
    above = above_diagonal(w)
    last = w[0, -1].tolist()
    st.numbers = {"max_weight_above_diagonal": above, "row_sum_max_abs_err": row_sum_error(w),
                  "first_row_self_weight": rounded(w[:, 0, 0].mean()), "head1_last_row": [rounded(v, 3) for v in last],
                  "strongest_links": strongest_links(w, pieces, pieces, skip_diagonal=True)}
    n = min(T, 4)
    corner = " ".join("[" + " ".join("0" if j <= i else "-inf" for j in range(n)) + "]" for i in range(n))
    st.lines = [f"M for the first {n} tokens: {corner}",
                f"largest weight on a later token: {above}; rows sum to 1 (largest error "
                f"{st.numbers['row_sum_max_abs_err']:.1e}); the first token can only attend to itself: weight "
                f"{st.numbers['first_row_self_weight']:.2f}",
                "head 1, the last token's weights: " + clip([f"{p}:{v:.2f}" for p, v in zip(pieces, last)], " ", 24),
                "layer 1, strongest link to an earlier token, per head: " + "; ".join(st.numbers["strongest_links"])]
    return st


def concat_step(cfg, a, t_dims) -> Record:
    """(3c): heads concatenated, then WO."""
    C = cfg.d_model
    st = record("lm", "3c")
    st.shapes = [f"Concat: {dims(t_dims, ('H*d_k', cfg.n_heads * cfg.d_head, None))}",
                 f"WO: {dims(('H*d_k', cfg.n_heads * cfg.d_head, None), (D_MODEL, C, None))}",
                 f"output: {dims(t_dims, (D_MODEL, C, None))}"]
    st.numbers = {"concat_norm": row_norm(a.concat), "output_norm": row_norm(a.out)}
    st.lines = [f"mean row norm: concat {st.numbers['concat_norm']:.3f} -> after WO {st.numbers['output_norm']:.3f}"]
    return st


NORM_FORMULA = {"rms": "RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g",
                "layer": "LayerNorm(x) = (x - mean) / sqrt(var + eps) * g + b"}


def norm_name(cfg) -> str:
    return "RMSNorm" if cfg.norm == "rms" else "LayerNorm"


def norm_effect(norm, s: Tensor) -> dict[str, float]:
    """What RMSNorm or LayerNorm does to ``s`` (1, T, C), averaged over the tokens: the
    statistic it divides by, the normalised rows, and the rows after the learned gain."""
    out = norm(s)
    if isinstance(norm, torch.nn.RMSNorm):
        ms = s.pow(2).mean(-1, keepdim=True)  # (1, T, 1) mean square of each token's row
        divided = s / (ms + norm.eps).sqrt()
        return {"rms_before": rounded(ms.sqrt().mean()), "rms_normalised": rounded(divided.pow(2).mean(-1).sqrt().mean()),
                "rms_after_gain": rounded(out.pow(2).mean(-1).sqrt().mean())}
    z = (s - s.mean(-1, keepdim=True)) / torch.sqrt(s.var(-1, unbiased=False, keepdim=True) + norm.eps)
    return {"mean_before": rounded(s.mean(-1).mean()), "std_before": rounded(s.std(-1, unbiased=False).mean()),
            "std_normalised": rounded(z.std(-1, unbiased=False).mean()),
            "std_after_gain": rounded(out.std(-1, unbiased=False).mean())}


def describe_norm(cfg, stats: dict[str, float]) -> str:
    if cfg.norm == "rms":
        return (f"RMSNorm: per-token RMS {stats['rms_before']:.3f} -> {stats['rms_normalised']:.3f} after dividing, "
                f"{stats['rms_after_gain']:.3f} after the learned gain g")
    return (f"LayerNorm: per-token mean {stats['mean_before']:.3f}, std {stats['std_before']:.3f} -> std "
            f"{stats['std_normalised']:.3f} after normalising, {stats['std_after_gain']:.3f} after the learned gain "
            "and bias")


def add_norm_step(cfg, block, x_in: Tensor, y: Tensor, s: Tensor, t_dims) -> Record:
    """(4): x_in the attention sub-layer's input, y its output, s = x_in + y."""
    pre = block.norm_first
    nm = norm_name(cfg)
    st = record("lm", "4", "pre-norm" if pre else None, norm=nm, definition=NORM_FORMULA[cfg.norm])
    st.shapes = [f"X + MultiHead: {dims(t_dims, (D_MODEL, cfg.d_model, None))}"]
    ratio = float(y[0].norm(dim=-1).mean() / x_in[0].norm(dim=-1).mean())
    st.numbers = {"pre_norm": pre, "sublayer_to_input_norm_ratio": rounded(ratio), **norm_effect(block.norm, x_in if pre else s)}
    st.lines = [f"|MultiHead| / |X| = {ratio:.2f}: the residual path carries X through and the sub-layer adds to it",
                ("on the sub-layer's input, " if pre else "on the sum, ") + describe_norm(cfg, st.numbers)]
    return st


def ffn_step(cfg, parts: dict[str, Tensor], t_dims) -> Record:
    """(5): parts holds layer 1's FFN tensors: "up" (x W_up), "gate" (x W_gate, gated only),
    "hidden" (after the activation), "out"."""
    d_ff, C = cfg.d_ff, cfg.d_model
    ff = ("d_ff", d_ff, None)
    if cfg.ffn_activation == "swiglu":
        st = record("lm", "5", "swiglu")
        st.shapes = [f"W_gate, W_up: {dims((D_MODEL, C, None), ff)} each", f"W_down: {dims(ff, (D_MODEL, C, None))}",
                     f"gate, up, h: {dims(t_dims, ff)}", f"FFN(x): {dims(t_dims, (D_MODEL, C, None))}"]
        gate, h = parts["gate"], parts["hidden"]
        energy = h.flatten().pow(2).sort(descending=True).values
        top = max(1, energy.numel() // 100)
        st.numbers = {"gate_negative": rounded((gate < 0).float().mean()), "silu_gate_max": rounded(F.silu(gate).max()),
                      "h_top1pct_share": rounded(energy[:top].sum() / energy.sum()),
                      "up_norm": row_norm(parts["up"]), "h_norm": row_norm(h), "out_norm": row_norm(parts["out"])}
        n = st.numbers
        st.lines = [f"{n['gate_negative']:.1%} of the gate values are negative, where SiLU(gate) lies in (-0.278, 0): "
                    f"those units pass at most 0.278 x up; the largest SiLU(gate) is {n['silu_gate_max']:.2f}",
                    f"mean row norm: up {n['up_norm']:.3f} -> h = SiLU(gate) * up {n['h_norm']:.3f} -> "
                    f"h W_down {n['out_norm']:.3f}; the largest 1% of h's entries hold {n['h_top1pct_share']:.1%} "
                    "of its sum of squares"]
        return st
    act = cfg.ffn_activation
    st = record("lm", "5", activation=act)
    st.shapes = [f"W_up: {dims((D_MODEL, C, None), ff)}", f"W_down: {dims(ff, (D_MODEL, C, None))}",
                 f"h: {dims(t_dims, ff)}"]
    zero = float((parts["hidden"] <= 0).float().mean())
    st.numbers = {"activation": act, "fraction_not_positive": rounded(zero), "out_norm": row_norm(parts["out"])}
    st.lines = [f"{act}: {zero:.1%} of the {d_ff} hidden units are 0 or below (averaged over the {t_dims[1]} tokens)"]
    return st


def layers_step(cfg, final_norm, before: Tensor, later: list[str], t_dims) -> Record:
    """(6): the other layers, then the final norm; ``before`` (1, T, C) the last layer's output."""
    nm = norm_name(cfg)
    st = record("lm", "6", None if final_norm is None else "final-norm", norm=nm)
    st.shapes = [f"H: {dims(t_dims, (D_MODEL, cfg.d_model, None))}"]
    st.numbers = {"later_layers": later}
    st.lines = [f"{cfg.n_layers} layers" + "".join("; " + line for line in later)]
    if final_norm is not None:
        st.numbers.update(norm_effect(final_norm, before))
        st.lines.append("final " + describe_norm(cfg, st.numbers))
    return st


def head_step(cfg, model, logits: Tensor, t_dims) -> Record:
    """(7): logits (1, T, V) = H Whead."""
    tied = model.out_proj is None
    V = cfg.vocab_size
    st = record("lm", "7", "bias" if cfg.output_bias else None)
    st.shapes = output_shapes(cfg, "Whead", " = We^T (tied: the embedding table is reused)" if tied else
                              " (its own matrix, untied from We)", t_dims, ("V", V, "tokens"))
    last = logits[0, -1]
    st.numbers = {"tied": tied, "last_logit_min": rounded(last.min()), "last_logit_max": rounded(last.max())}
    st.lines = [f"last token's logits range {last.min():.2f} .. {last.max():.2f} over the {V} tokens"]
    return st


def softmax_step(logits: Tensor, ids: list[int], show, t_dims, V: int) -> Record:
    """(8): P = softmax(logits); the prompt scored by the model it is fed to."""
    probs = logits[0].float().softmax(-1)  # (T, V)
    st = record("lm", "8")
    st.shapes = [f"P: {dims(t_dims, ('V', V, 'tokens'))}"]
    T = probs.size(0)
    top = top_pieces(probs[-1], show, min(5, V))
    st.numbers = {"row_sum_max_abs_err": row_sum_error(probs),
                  "top5_last": [[p, rounded(q)] for p, q in top]}
    st.lines = [f"rows sum to 1 (largest error {st.numbers['row_sum_max_abs_err']:.1e})",
                "after the last token: top-5 " + ", ".join(f"{p} {q:.3f}" for p, q in top)]
    if T > 1:
        nxt = torch.tensor(ids[1:])
        p_next = probs[:-1].gather(1, nxt[:, None].to(probs.device))[:, 0]
        agree = int((probs[:-1].argmax(-1).cpu() == nxt).sum())
        st.numbers.update(prompt_mean_nll=rounded(-p_next.log().mean()), prompt_argmax_agrees=agree, prompt_positions=T - 1)
        st.lines.append(f"inside the prompt, the real next token is the most probable one at {agree} of {T - 1} "
                        f"positions; mean -log p of the prompt's own next tokens: {st.numbers['prompt_mean_nll']:.3f}")
    return st


def choice_step(logits: Tensor, show, decoding) -> Record:
    """(9): the next token: greedy, and what sampling at ``decoding``'s temperature, top-k
    and top-p would draw (the run's own settings unless the command line changes them)."""
    last = logits[0, -1:].float()  # (1, V)
    greedy = int(last.argmax())
    p = last.softmax(-1)[0]
    t, k, top_p = decoding.temperature, decoding.top_k, decoding.top_p
    st = record("lm", "9")
    st.numbers = {"greedy": show(greedy), "greedy_p": rounded(p[greedy]), "temperature": t, "top_k": k, "top_p": top_p}
    st.lines = [f"greedy (temperature 0) takes '{show(greedy)}' (p = {float(p[greedy]):.3f})"]
    if t == 0:
        st.lines.append("the run decodes greedily (temperature 0): no sampling")
        return st
    q = filter_logits(last / t, k, top_p).softmax(-1)[0]
    kept = int((q > 0).sum())
    top = top_pieces(q, show, min(5, kept))
    st.numbers.update(sample_candidates=kept, sample_top5=[[a, rounded(b)] for a, b in top], sample_greedy_p=rounded(q[greedy]))
    st.lines.append(f"sampling at temperature {t:g}, top-k {k or 'off'}, top-p {top_p:g}: {kept} candidates; "
                    + ", ".join(f"{a} {b:.3f}" for a, b in top)
                    + f"; it picks the greedy token with probability {float(q[greedy]):.3f}")
    return st
