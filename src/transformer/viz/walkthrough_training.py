"""One training update in the article's formulas, on a copy of a run's model in memory (the
run's files are only read):

    forward:          p = softmax(model(batch))[right token];   Loss = mean of -log p
    backpropagation:  dLoss/dW for every matrix W
    optimizer step:   W_new = W_old - lr x gradient  (plain SGD), beside what Adam does:
                      W_new = W_old - lr x m_hat / (sqrt(v_hat) + eps)
    and the loss on the same batch after the step.

The batch is the run's own first training batch (its data, its seed, its batch size); the
learning rate is the run's schedule at the update after the weights' step, the optimizer
the run's (Adam or AdamW with its betas, eps, weight decay and gradient clipping), started
fresh: on its first step Adam's m_hat = g and v_hat = g^2, so every entry moves by about lr.
Dropout is off and the arithmetic is fp32, so the numbers repeat exactly.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import UserError
from ..run import CONFIG, load_model, run_file
from ..run.layout import IMPORT_RECORD
from ..train.distributed import Dist
from ..train.prepare import prepare_data, tokenizer_file
from ..train.reuse import finetune_model_config
from ..train.schedule import lr_at
from ..train.task import make_task
from ..train.train_config import load_config
from ..train.update import make_optimizer
from .records import Record

CODE = "src/transformer/train/"
HERE = "src/transformer/viz/walkthrough_training.py"


@dataclass
class Update:
    header: list[str]
    steps: list[Record]
    numbers: dict = field(default_factory=dict)  # everything printed, unrounded where it matters (--json, tests)


def explain_update(path: str | Path, matrix: str | None = None, lr: float | None = None,
                   from_init: bool = False) -> Update:
    """Make one update of the run at ``path`` (a run directory or a weights file in one) and
    explain it. ``matrix``: the matrix to follow (default: layer 1's WQ); ``lr``: instead of
    the schedule's; ``from_init``: start from a random initialisation (the run's seed)."""
    cfg, run_dir = _run_config(path)
    model, meta = load_model(path)
    task, data = _task(cfg, run_dir, model)
    # a fine-tune's model is its source's, with the model section's few changes (train/reuse.py)
    expected = finetune_model_config(cfg, model.cfg) if cfg.init_from else cfg.model_config(_vocab_size(data))
    if expected != model.cfg:
        raise UserError(f"{path}: the weights do not match the run's config.yaml (another model or vocabulary)")
    step = 0
    if from_init:
        with torch.random.fork_rng():  # the run's seed, as the trainer seeds before it builds the model
            torch.manual_seed(cfg.seed)
            model = task.build_model()
    else:
        step = int(meta.get("step", 0) or 0)
    model.eval()  # no dropout: the loss before and after the step is on the same function
    batch = next(task.batches(model, torch.device("cpu")))
    lr = lr_at(cfg, model.cfg.d_model, step + 1) if lr is None else lr
    if not (lr > 0 and math.isfinite(lr)):
        raise UserError(f"--lr must be a positive number, got {lr}")
    name, param = _matrix(model, matrix)
    return _update(cfg, model, batch, data, name, param, lr, step, from_init)


# ---- the run, its data and the matrix -------------------------------------------------------

def _run_config(path: str | Path):
    found = run_file(path, CONFIG)
    if found is None:
        raise UserError(f"{path}: no {CONFIG} beside the weights; --training needs the run directory")
    if (found.parent / IMPORT_RECORD).is_file():  # (interop/hf_import.py, interop/marian_run.py write it)
        raise UserError(f"{found.parent}: an imported model, with no training data of its own; --training explains "
                        "an update of a run trained here (fine-tune it with init_from, then explain that run)")
    return load_config(found), found.parent


def _task(cfg, run_dir: Path, model):
    """The run's training task on its own data, read without writing or downloading anything."""
    vocab = tokenizer_file(cfg, run_dir)
    if not vocab.is_file():
        raise UserError(f"{vocab}: not found; --training needs the run's vocabulary (give the run directory)")
    try:
        data = prepare_data(cfg, run_dir, model.cfg.max_len, log=lambda *a: None, download=False)
    except UserError as e:
        raise UserError(f"--training needs the run's training data: {e}") from None
    fine_tune = (lambda vocab_size: finetune_model_config(cfg, model.cfg)) if cfg.init_from else None
    return make_task(cfg, data, Dist(), fine_tune), data


def _vocab_size(data) -> int:
    return data.tokenizer.vocab_size if hasattr(data, "tokenizer") else data.subwords.vocab_size


SEED_NAMES = {"self_attn.q_proj": "WQ", "self_attn.k_proj": "WK", "self_attn.v_proj": "WV", "self_attn.out_proj": "WO",
              "cross_attn.q_proj": "cross WQ", "cross_attn.k_proj": "cross WK", "cross_attn.v_proj": "cross WV",
              "cross_attn.out_proj": "cross WO", "ffn.gate": "W_gate", "ffn.fc1": "W_up", "ffn.fc2": "W_down"}


def matrix_names(model) -> dict[str, str]:
    """{seed name or parameter name: parameter name} of the 2-D weights the update can follow:
    a language model's names from ``weight_matrices`` ("layer 1 WQ", "We", "Whead"), a
    translation model's "encoder layer 1 WQ", "decoder layer 2 cross WK", ..., "We", "Whead"."""
    names = {n: n for n, p in model.named_parameters() if p.dim() == 2}
    if model.cfg.decoder_only:
        from .matrices import weight_matrices

        for seed_name, param, _, _ in weight_matrices(model):
            names[seed_name] = param.split(" ")[0]  # "embed.weight (tied: We)" -> embed.weight
        return names
    for n in list(names):
        m = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)\.(.+)\.weight", n)  # encoder.layers.0.self_attn.q_proj.weight
        if m and m[3] in SEED_NAMES:
            names[f"{m[1]} layer {int(m[2]) + 1} {SEED_NAMES[m[3]]}"] = n
    names["We"] = "src_embed.weight"
    names["Whead"] = "out_proj.weight" if model.out_proj is not None else "tgt_embed.weight"
    return names


def _matrix(model, asked: str | None) -> tuple[str, torch.nn.Parameter]:
    names = matrix_names(model)
    default = "layer 1 WQ" if model.cfg.decoder_only else "encoder layer 1 WQ"
    asked = default if asked is None else " ".join(asked.split())
    key = next((k for k in names if k.lower() == asked.lower()), None)
    if key is None:
        shown = [k for k in names if k.startswith(("We", "Whead", "layer 1 ", "encoder layer 1 "))] or list(names)[:8]
        raise UserError(f"--matrix {asked!r}: no such matrix; choose e.g. {', '.join(shown)} "
                        "(or a parameter name that `transformer info` lists)")
    return key, dict(model.named_parameters())[names[key]]


# ---- the update -----------------------------------------------------------------------------

def token_losses(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """-log p of the right token at every position (B, T) (0 at padding) and the real-token mask."""
    logits = model(*batch.inputs)  # (B, T, V)
    gold = batch.tgt_out
    real = gold != getattr(batch, "not_scored", model.cfg.pad_id)
    nll = -logits.float().log_softmax(-1).gather(-1, gold.clamp(min=0)[..., None])[..., 0]
    return nll * real, real


def logits_width(model) -> int:
    """V, the number of tokens the output layer scores."""
    return model.cfg.vocab_size if model.cfg.decoder_only else model.cfg.target_vocab_size


def mean_loss(model, batch) -> torch.Tensor:
    nll, real = token_losses(model, batch)
    return nll.sum() / real.sum()


def _update(cfg, model, batch, data, name: str, param, lr: float, step: int, from_init: bool) -> Update:
    params = dict(model.named_parameters())
    nll, real = token_losses(model, batch)
    loss = nll.sum() / real.sum()
    row, t = 0, int(real[0].nonzero().max())  # the named token: row 1's last scored position
    loss.backward()
    raw_grad = param.grad.detach().clone()
    clip = cfg.clip_norm or math.inf
    total_norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), clip))  # as train_step does
    optimizer = make_optimizer(model, cfg.optimizer, cfg.weight_decay, cfg.betas)
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    pname = next(n for n, p in params.items() if p is param)
    old, grads, adam_new, after, after_sgd = _adam_and_sgd(model, optimizer, lr, batch, pname)
    g, w_old = grads[pname], old[pname]
    predicted = adam_first_step(w_old, g, lr, group, decoupled=cfg.optimizer == "adamw")
    rows = [{"index": list(i), "w_old": float(w_old[i]), "grad": float(g[i]), "sgd_new": float(w_old[i] - lr * g[i]),
             "adam_new": float(adam_new[i]), "adam_formula": float(predicted[i]),
             "adam_move_over_lr": float((adam_new[i] - w_old[i]) / lr)} for i in _entries(g)]
    show, context = _token_text(data, batch, row, t)
    nll = nll.detach()
    numbers = {
        "weights_step": step, "from_init": from_init, "lr": lr, "optimizer": cfg.optimizer,
        "betas": list(group["betas"]), "eps": group["eps"], "weight_decay": group["weight_decay"],
        "clip_norm": cfg.clip_norm, "label_smoothing": cfg.label_smoothing, "precision": cfg.precision,
        "batch_shape": list(batch.tgt_out.shape), "scored_tokens": int(real.sum()),
        "ln_V": math.log(logits_width(model)), "row": row, "position": t, "token": show, "context": context,
        "p": float(torch.exp(-nll[row, t])), "minus_log_p": float(nll[row, t]), "loss": float(loss.detach()),
        "matrix": name, "parameter": pname, "shape": list(param.shape),
        "grad_norm": float(raw_grad.norm()), "total_grad_norm": total_norm,
        "clip_factor": min(1.0, clip / (total_norm + 1e-6)) if math.isfinite(clip) else 1.0,
        "entries": rows, "adam_mean_move_over_lr": float(((adam_new - w_old).abs() / lr).mean()),
        "sgd_mean_move_over_lr": float(g.abs().mean()), "loss_after": after, "loss_after_sgd": after_sgd,
    }
    return Update(_header(numbers, model), _steps(numbers), numbers)


@torch.no_grad()
def _adam_and_sgd(model, optimizer, lr: float, batch, name: str):
    """From the gradients in ``model``: the optimizer's step, then plain SGD's step from the
    same weights. Returns the old weights and the gradients (by parameter name), the matrix
    ``name`` after the optimizer's step, and the batch loss after each step."""
    params = dict(model.named_parameters())
    old = {n: p.detach().clone() for n, p in params.items()}
    grads = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    adam_new = params[name].detach().clone()
    after = float(mean_loss(model, batch))
    for n, p in params.items():
        p.copy_(old[n] - lr * grads[n] if n in grads else old[n])
    return old, grads, adam_new, after, float(mean_loss(model, batch))


def adam_first_step(w: torch.Tensor, g: torch.Tensor, lr: float, group: dict, decoupled: bool) -> torch.Tensor:
    """Adam's first update written out: m = (1 - beta1) g, v = (1 - beta2) g^2, the bias
    corrections make m_hat = g and v_hat = g^2, so W_new = W - lr g / (|g| + eps); AdamW
    first shrinks W by lr x weight_decay, Adam adds weight_decay x W to g (L2)."""
    b1, b2 = group["betas"]
    wd, eps = group["weight_decay"], group["eps"]
    if not decoupled and wd:
        g = g + wd * w
    m_hat = (1 - b1) * g / (1 - b1)
    v_hat = (1 - b2) * g * g / (1 - b2)
    if decoupled:
        w = w * (1 - lr * wd)
    return w - lr * m_hat / (v_hat.sqrt() + eps)


def _entries(g: torch.Tensor) -> list[tuple[int, ...]]:
    """Three entries to follow: the two largest gradients and a typical (median) one."""
    flat = g.abs().flatten()
    order = flat.argsort(descending=True)
    picks = [int(order[0]), int(order[1]), int(order[len(order) // 2])]
    return [tuple(int(v) for v in torch.unravel_index(torch.tensor(i), g.shape)) for i in picks]


def _token_text(data, batch, row: int, t: int) -> tuple[str, str]:
    """The named token (printable) and the text the model read before it."""
    gold = int(batch.tgt_out[row, t])
    if hasattr(data, "tokenizer"):  # a language model: the window's text up to the position
        from .walkthrough_lm import token_shower

        x = batch.inputs[0][row, : t + 1].tolist()
        return token_shower(data.tokenizer)(gold), data.tokenizer.decode(x)[-60:]
    sw = data.subwords
    src, tgt_in = batch.inputs[0][row].tolist(), batch.inputs[1][row, 1: t + 1].tolist()
    return sw.id_to_piece(gold), f"{sw.decode(src)} => {sw.decode(tgt_in)}"


# ---- text -----------------------------------------------------------------------------------

def _header(n: dict, model) -> list[str]:
    start = ("a random initialisation (the run's seed)" if n["from_init"]
             else f"the weights of update {n['weights_step']}")
    b = n["batch_shape"]
    return [f"model: {model.num_parameters():,} parameters, from {start}; a copy in memory "
            "(the run's files are not changed)",
            f"batch: the run's first training batch, {b[0]} rows x {b[1]} positions, {n['scored_tokens']} scored tokens; "
            f"dropout off, fp32 (the run trains with precision {n['precision']})",
            f"optimizer: {'AdamW' if n['optimizer'] == 'adamw' else 'Adam'} (betas {n['betas']}, eps {n['eps']:g}, "
            f"weight decay {n['weight_decay']:g}), "
            + (f"gradient clipping at {n['clip_norm']}" if n["clip_norm"] else "no gradient clipping")
            + f", lr {n['lr']:.3g} "
            f"(the run's schedule at update {n['weights_step'] + 1} unless --lr is given)", ""]


def _steps(n: dict) -> list[Record]:
    return [_loss_step(n), _grad_step(n), _optimizer_step(n), _after_step(n)]


def _loss_step(n: dict) -> Record:
    st = Record("1", "Forward pass and Loss = -log p", "前向传播与损失 Loss = -log p",
                "p = softmax(logits)[the right next token];  Loss = -log p, averaged over the batch's tokens",
                CODE + "update.py: train_step; loss.py")
    st.shapes = [f"batch: (B={n['batch_shape'][0]} rows, T={n['batch_shape'][1]} positions)"]
    st.lines = [f"row {n['row'] + 1}, position {n['position'] + 1}: after ...{n['context']!r}",
                f"the right next token is {n['token']!r}: p = {n['p']:.4f}, -log p = {n['minus_log_p']:.4f}",
                f"batch mean Loss = {n['loss']:.4f} over {n['scored_tokens']} tokens "
                f"(guessing uniformly among the V tokens would give ln V = {n['ln_V']:.4f}; a perfect model 0)"]
    if n["label_smoothing"]:
        st.lines.append(f"(the run trains on a label-smoothed loss, epsilon {n['label_smoothing']}; "
                        "here the article's plain -log p)")
    st.numbers = {k: n[k] for k in ("token", "p", "minus_log_p", "loss", "scored_tokens")}
    return st


def _grad_step(n: dict) -> Record:
    st = Record("2", "Backpropagation: dLoss/dW", "反向传播：dLoss/dW",
                "loss.backward() fills W.grad = dLoss/dW for every matrix W",
                "torch autograd; " + CODE + "update.py: train_step")
    st.shapes = [f"{n['matrix']} ({n['parameter']}): {' x '.join(map(str, n['shape']))}, and so is its gradient"]
    st.lines = [f"|dLoss/dW| of {n['matrix']} = {n['grad_norm']:.4g}; "
                f"of all parameters together {n['total_grad_norm']:.4g}"]
    if n["clip_factor"] < 1.0:
        st.lines.append(f"the run clips the total to {n['clip_norm']}: every gradient is multiplied by "
                        f"{n['clip_factor']:.4f} before the step")
    st.lines += [f"dLoss/dW{_at(e['index'])} = {e['grad']:+.4e}" for e in n["entries"]]
    st.numbers = {k: n[k] for k in ("matrix", "parameter", "shape", "grad_norm", "total_grad_norm", "clip_factor")}
    return st


def _optimizer_step(n: dict) -> Record:
    adamw = n["optimizer"] == "adamw"
    st = Record("3", "The optimizer's step", "优化器更新：W_new = W_old - 学习率 x 梯度",
                "SGD: W_new = W_old - lr g;  Adam: m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, "
                "W_new = W_old - lr m_hat / (sqrt(v_hat) + eps)" + ("  - lr wd W_old (AdamW)" if adamw else ""),
                CODE + "update.py: make_optimizer; torch.optim." + ("AdamW" if adamw else "Adam"))
    lr = n["lr"]
    st.lines = [f"lr = {lr:.4g}; on Adam's first step m_hat = g and v_hat = g^2, so each entry moves by "
                f"lr x g / (|g| + eps), about lr whatever the size of g"]
    for e in n["entries"]:
        st.lines.append(f"W{_at(e['index'])}: old {e['w_old']:+.6f}; SGD {e['sgd_new']:+.6f} (moved "
                        f"{e['sgd_new'] - e['w_old']:+.2e}); Adam {e['adam_new']:+.6f} (moved "
                        f"{e['adam_new'] - e['w_old']:+.2e} = {e['adam_move_over_lr']:+.3f} lr; the formula gives "
                        f"{e['adam_formula']:+.6f})")
    st.lines.append(f"mean |move| / lr over the whole matrix: Adam {n['adam_mean_move_over_lr']:.3f}, SGD "
                    f"{n['sgd_mean_move_over_lr']:.2e} (= mean |g|)")
    st.lines.append("why they differ: SGD moves a weight in proportion to its gradient, so weights with small "
                    "gradients hardly move; Adam divides by the running RMS of each weight's gradient (sqrt(v)), "
                    "so every weight moves by about lr in the direction of its (averaged) gradient")
    st.numbers = {"lr": lr, "entries": n["entries"], "adam_mean_move_over_lr": n["adam_mean_move_over_lr"]}
    return st


def _after_step(n: dict) -> Record:
    st = Record("4", "The loss after the step", "更新后的损失", "the same batch through the updated weights",
                HERE + ": mean_loss")
    st.lines = [f"Loss {n['loss']:.4f} -> {n['loss_after']:.4f} after Adam's step "
                f"({n['loss_after'] - n['loss']:+.4f}); {n['loss_after_sgd']:.4f} after the SGD step with the same lr "
                f"({n['loss_after_sgd'] - n['loss']:+.4f})"]
    st.numbers = {"loss_before": n["loss"], "loss_after": n["loss_after"], "loss_after_sgd": n["loss_after_sgd"]}
    return st


def _at(index: list[int]) -> str:
    return "[" + ", ".join(map(str, index)) + "]"


def format_update(u: Update) -> str:
    from .engine import format_steps

    return "\n".join(u.header + format_steps(u.steps)).rstrip() + "\n"
