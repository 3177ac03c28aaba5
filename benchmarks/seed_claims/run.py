"""The seed article's claims about RNNs vs the Transformer, measured on a CPU (and (1) on a GPU).

(1) throughput: training tokens/s (forward + backward + Adam step) as the sequence length
    grows, for parameter-matched models: "RNNs cannot be parallelised".
(2) memory: a copy task - the first token must be recalled after k distractors - learned
    under the same budget (steps x batch) by each model: "RNNs only remember 10-20 steps".
(3) vanishing gradients: |d loss / d embedding of token 0|, for untrained models and for
    the models trained in (2): "gradients decay exponentially with the number of steps".

    .venv/bin/python benchmarks/seed_claims/run.py            # all three, a few CPU minutes
    .venv/bin/python benchmarks/seed_claims/run.py --parts 2 --ks 5,50 --steps 100   # a smoke run
    .venv/bin/python benchmarks/seed_claims/run.py --parts 1 --device cuda --tokens 16384   # (1) on a GPU

(1) on a GPU is recorded beside the CPU's (``throughput_cuda`` in results.json, throughput_cuda.png):
there the Transformer's positions are computed in parallel and the RNN's steps are not.

Writes results.json and throughput.png, long_range.png, gradients.png beside this file
(or under --out).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from transformer import ModelConfig, Transformer, hardware
from transformer.baselines.rnn import RNNSeq2Seq, hidden_size_for

HERE = Path(__file__).resolve().parent
PAD, BOS, EOS = 0, 1, 2


# ---- models ---------------------------------------------------------------------------------

def body_parameters(model: nn.Module) -> int:
    """Parameters outside the embeddings and the output layer."""
    skip = set()
    for name in ("src_embed", "tgt_embed", "out", "out_proj"):
        m = getattr(model, name, None)
        if isinstance(m, nn.Module):
            skip |= {id(p) for p in m.parameters()}
    if isinstance(model, Transformer) and model.out_bias is not None:
        skip.add(id(model.out_bias))
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def build(name: str, vocab: int, d_model: int, d_ff: int, n_layers: int, max_len: int, rnn_layers: int,
          seed: int) -> nn.Module:
    """``transformer``, or ``lstm`` / ``rnn`` (tanh) with ``+attn`` (Luong) or without, the
    RNNs sized to the Transformer's body parameter count."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, d_model=d_model, n_heads=4, d_ff=d_ff, n_layers=n_layers,
                      dropout=0.0, max_len=max_len)
    if name == "transformer":
        return Transformer(cfg)
    budget = body_parameters(Transformer(cfg))
    cell, _, attn = name.partition("+")
    attention = "luong" if attn == "attn" else None
    hidden = hidden_size_for(budget, d_model, rnn_layers, cell, attention)
    torch.manual_seed(seed)
    return RNNSeq2Seq(vocab, d_emb=d_model, d_hidden=hidden, n_layers=rnn_layers, cell=cell, attention=attention)


def describe(model: nn.Module) -> dict:
    d = {"body_parameters": body_parameters(model), "parameters": sum(p.numel() for p in model.parameters())}
    if isinstance(model, RNNSeq2Seq):
        d["d_hidden"] = model.encoder.hidden_size
        d["layers"] = model.encoder.num_layers
    return d


def train_step(model, opt, src, tgt_in, tgt_out) -> float:
    """One update; returns its loss (a read from the device: on a GPU, the update has finished)."""
    logits = model(src, tgt_in)  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


# ---- (1) throughput -----------------------------------------------------------------------

def throughput(models: list[str], lengths: list[int], tokens: int, reps: int, rounds: int, seed: int,
               device: torch.device = torch.device("cpu")) -> dict:
    """Training tokens/s (source + target), forward + backward + Adam step, on ``device`` (fp32), in two settings:
    ``fixed`` tokens per batch (batch = tokens // length, as in training), and ``batch-1``
    (one sequence: nothing to work on in parallel but the positions of that sequence).
    The models take turns at each point, and the whole sweep is repeated ``rounds`` times,
    so that load from other processes hits every model and length alike; each point is
    the median of its rounds x reps timed steps."""
    vocab = 1000
    out = {"tokens_per_batch": tokens, "reps": reps, "rounds": rounds, "models": {}, "rows": [],
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    gen = torch.Generator().manual_seed(seed)
    built = {}
    for name in models:
        model = build(name, vocab, 128, 512, 2, max(lengths) + 1, 2, seed).to(device).train()
        built[name] = (model, torch.optim.Adam(model.parameters(), lr=1e-4))
        out["models"][name] = describe(model)
    points = [(mode, length) for mode in ("fixed", "batch-1") for length in lengths]
    batches = {}
    for mode, length in points:
        b = max(1, tokens // length) if mode == "fixed" else 1
        batches[mode, length] = tuple(torch.randint(3, vocab, (b, length), generator=gen).to(device) for _ in range(3))
    times: dict[tuple, list[float]] = {}
    for r in range(rounds):
        for mode, length in points:
            for name, (model, opt) in built.items():
                train_step(model, opt, *batches[mode, length])  # warm-up
                for _ in range(reps):
                    t = time.perf_counter()
                    train_step(model, opt, *batches[mode, length])
                    times.setdefault((mode, name, length), []).append(time.perf_counter() - t)
        print(f"  throughput: round {r + 1} of {rounds} done", flush=True)
    for (mode, name, length), ts in times.items():
        b = batches[mode, length][0].size(0)
        sec = statistics.median(ts)
        row = {"mode": mode, "model": name, "length": length, "batch": b, "seconds_per_step": sec,
               "tokens_per_s": 2 * b * length / sec, "spread": (max(ts) - min(ts)) / sec}
        out["rows"].append(row)
        print(f"  throughput {mode:7s} {name:12s} L={length:4d} B={b:4d}: {row['tokens_per_s']:9.0f} tokens/s "
              f"({sec * 1000:.0f} ms/step, spread {row['spread']:.0%})", flush=True)
    return out


# ---- (2) memory: copy the first token after k distractors ------------------------------------

SIGNALS = 8  # the token to remember is one of ids 3 .. 10; distractors are 11 .. VOCAB-1
VOCAB = 32


def copy_batch(k: int, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """src = [x, d_1 .. d_k, EOS], the target is x: it lies k + 1 steps before the end."""
    x = torch.randint(3, 3 + SIGNALS, (batch, 1), generator=gen)
    distract = torch.randint(3 + SIGNALS, VOCAB, (batch, k), generator=gen)
    src = torch.cat([x, distract, torch.full((batch, 1), EOS)], dim=1)
    tgt_in = torch.full((batch, 1), BOS)
    return src, tgt_in, x


def long_range(models: list[str], ks: list[int], steps: int, batch: int, lr: float, seed: int,
               keep: dict | None = None) -> dict:
    """Accuracy on held-out copy_batch examples after ``steps`` x ``batch`` training
    examples (Adam, constant ``lr``, gradient norm clipped at 1, the same for every model)."""
    out = {"steps": steps, "batch": batch, "lr": lr, "signals": SIGNALS, "chance": 1 / SIGNALS, "rows": []}
    for name in models:
        for k in ks:
            model = build(name, VOCAB, 64, 128, 2, max(ks) + 8, 1, seed).train()
            out.setdefault("models", {})[name] = describe(model)
            opt = torch.optim.Adam(model.parameters(), lr=lr)
            gen = torch.Generator().manual_seed(seed + k)
            t = time.perf_counter()
            for _ in range(steps):
                loss = train_step(model, opt, *copy_batch(k, batch, gen))
            model.eval()
            src, tgt_in, x = copy_batch(k, 1000, torch.Generator().manual_seed(10_000 + k))
            with torch.no_grad():
                acc = float((model(src, tgt_in)[:, 0].argmax(-1) == x[:, 0]).float().mean())
            out["rows"].append({"model": name, "k": k, "steps": steps, "accuracy": acc, "final_loss": loss,
                                "seconds": time.perf_counter() - t})
            print(f"  copy-after-k {name:16s} k={k:4d} steps={steps}: accuracy {acc:6.1%}  loss {loss:.3f}  "
                  f"({time.perf_counter() - t:.0f}s)", flush=True)
            if keep is not None:
                keep[(name, k)] = model
    return out


# ---- (3) gradients reaching the first token ---------------------------------------------------

def embedding_grads(model: nn.Module, src, tgt_in, target) -> torch.Tensor:
    """(B, S) norms of d loss_b / d (source embedding of each position)."""
    grabbed = {}

    def hook(module, args, output):
        if "x" in grabbed:  # a tied embedding is called again for the target side
            return None
        leaf = output.detach().requires_grad_(True)
        grabbed["x"] = leaf
        return leaf

    h = model.src_embed.register_forward_hook(hook)
    try:
        model.zero_grad(set_to_none=True)
        logits = model(src, tgt_in)[:, 0]  # (B, V)
        F.cross_entropy(logits, target, reduction="sum").backward()  # each sentence's own loss
    finally:
        h.remove()
    return grabbed["x"].grad.norm(dim=-1)  # (B, S)


def gradients(models: list[str], lengths: list[int], trained: dict, seed: int) -> dict:
    """Median over 64 inputs of |dL/d emb(token 0)| and of its ratio to |dL/d emb(last token)|,
    computed in float64."""
    out = {"dtype": "float64", "rows": []}
    for name in models:
        for length in lengths:
            k = length - 2
            src, tgt_in, x = copy_batch(k, 64, torch.Generator().manual_seed(20_000 + k))
            runs = [("untrained", build(name, VOCAB, 64, 128, 2, max(lengths) + 8, 1, seed + 1).eval())]
            if (name, k) in trained:
                runs.append(("trained", trained[(name, k)].eval()))
            for state, model in runs:
                # float64: in float32 the RNNs' gradient underflows to exactly 0 past ~100 steps
                g = embedding_grads(copy.deepcopy(model).double(), src, tgt_in, x[:, 0])
                first, last = g[:, 0], g[:, -1]
                row = {"model": name, "state": state, "length": length,
                       "grad_first": float(first.median()), "grad_last": float(last.median()),
                       "ratio_first_to_last": float((first / last).median())}
                out["rows"].append(row)
                print(f"  gradient {name:16s} {state:9s} L={length:4d}: |g_0| {row['grad_first']:.2e}  "
                      f"|g_0|/|g_last| {row['ratio_first_to_last']:.2e}", flush=True)
    return out


# ---- plots ------------------------------------------------------------------------------------

STYLE = {"transformer": ("tab:blue", "o"), "lstm+attn": ("tab:orange", "s"), "lstm": ("tab:red", "^"),
         "rnn+attn": ("tab:purple", "D"), "rnn": ("tab:gray", "v")}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    from transformer.run.files import atomic_write

    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    _plt().close(fig)


def plot_throughput(res: dict, path: Path) -> None:
    where = "CPU" if res.get("device", "cpu") == "cpu" else res["device"]
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    titles = {"fixed": f"{res['tokens_per_batch']} source tokens per batch", "batch-1": "one sequence per batch"}
    for ax, mode in zip(axes, ("fixed", "batch-1")):
        for name in res["models"]:
            rows = [r for r in res["rows"] if r["model"] == name and r.get("mode", "fixed") == mode]
            c, m = STYLE.get(name, ("k", "x"))
            ax.plot([r["length"] for r in rows], [r["tokens_per_s"] for r in rows], marker=m, color=c,
                    label=f"{name} ({res['models'][name]['body_parameters'] / 1e6:.2f} M body parameters)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (source = target)")
        ax.set_title(titles[mode])
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("training tokens / s (forward + backward + Adam)")
    axes[0].legend(fontsize=8)
    threads = f", {res.get('threads', 1)} thread(s)" if where == "CPU" else ""
    fig.suptitle(f"(1) training throughput vs sequence length, {where}{threads}")
    fig.tight_layout()
    _save(fig, path)


def plot_long_range(res: dict, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in res["models"]:
        rows = [r for r in res["rows"] if r["model"] == name]
        c, m = STYLE.get(name, ("k", "x"))
        ax.plot([r["k"] for r in rows], [r["accuracy"] for r in rows], marker=m, color=c, label=name)
    longer = res.get("longer_budget")
    for name in (longer or {}).get("models", {}):
        rows = [r for r in longer["rows"] if r["model"] == name]
        c, m = STYLE.get(name, ("k", "x"))
        ax.plot([r["k"] for r in rows], [r["accuracy"] for r in rows], marker=m, color=c, ls="--", mfc="none",
                label=f"{name}, {longer['steps']} steps")
    ax.axhline(res["chance"], color="k", ls=":", lw=1, label="chance")
    ax.axvspan(10, 20, color="gold", alpha=0.2, label="the seed's \"10-20 steps\"")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("k: distractors between the token and the end of the input")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"(2) recall the first token after k distractors ({res['steps']} steps x {res['batch']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def plot_gradients(res: dict, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, state in zip(axes, ("untrained", "trained")):
        for name in dict.fromkeys(r["model"] for r in res["rows"]):
            rows = [r for r in res["rows"] if r["model"] == name and r["state"] == state]
            if rows:
                c, m = STYLE.get(name, ("k", "x"))
                ax.plot([r["length"] for r in rows], [r["ratio_first_to_last"] for r in rows], marker=m,
                        color=c, label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("input length")
        ax.set_title(f"{state}" + (" (trained on that length in (2))" if state == "trained" else " (at initialisation)"))
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("|dL/d emb(token 0)| / |dL/d emb(last token)|")
    axes[0].legend(fontsize=8)
    fig.suptitle("(3) how much gradient reaches the first input token")
    fig.tight_layout()
    _save(fig, path)


# ---- the README's tables ----------------------------------------------------------------------

def report(results: dict) -> str:
    """Markdown tables of whatever parts ``results`` holds."""
    out = []
    for tp in (results.get("throughput"), results.get("throughput_cuda")):
        if not tp:
            continue
        names = list(tp["models"])
        where = "CPU" if tp.get("device", "cpu") == "cpu" else tp["device"]
        for mode in ("fixed", "batch-1"):
            rows = [r for r in tp["rows"] if r.get("mode", "fixed") == mode]
            lengths = sorted({r["length"] for r in rows})
            what = f"{tp['tokens_per_batch']} source tokens per batch" if mode == "fixed" else "batch of 1"
            out += [f"(1) training tokens/s on the {where}, {what}:", "", "| length | " + " | ".join(names) + " |",
                    "|---:|" + "---:|" * len(names)]
            for n in lengths:
                cells = [next(f"{r['tokens_per_s']:,.0f}" for r in rows if r["model"] == m and r["length"] == n)
                         for m in names]
                out.append(f"| {n} | " + " | ".join(cells) + " |")
            out.append("")
    lr = results.get("long_range")
    if lr:
        tables = [(lr, f"{lr['steps']} steps")]
        if lr.get("longer_budget"):
            tables.append((lr["longer_budget"], f"{lr['longer_budget']['steps']} steps"))
        ks = sorted({r["k"] for r in lr["rows"]})
        out += [f"(2) held-out accuracy, first token recalled after k distractors (batch {lr['batch']}, "
                f"chance {lr['chance']:.1%}):", "", "| model | budget | " + " | ".join(f"k={k}" for k in ks) + " |",
                "|---|---|" + "---:|" * len(ks)]
        for res, budget in tables:
            for m in res["models"]:
                acc = {r["k"]: r["accuracy"] for r in res["rows"] if r["model"] == m}
                out.append(f"| {m} | {budget} | " + " | ".join(f"{acc[k]:.1%}" if k in acc else "" for k in ks) + " |")
        out.append("")
    gr = results.get("gradients")
    if gr:
        lengths = sorted({r["length"] for r in gr["rows"]})
        out += ["(3) median |dL/d emb(token 0)| / |dL/d emb(last token)| (float64):", "",
                "| model | state | " + " | ".join(f"L={n}" for n in lengths) + " |", "|---|---|" + "---:|" * len(lengths)]
        for m in dict.fromkeys(r["model"] for r in gr["rows"]):
            for state in ("untrained", "trained"):
                v = {r["length"]: r["ratio_first_to_last"] for r in gr["rows"] if r["model"] == m and r["state"] == state}
                if v:
                    out.append(f"| {m} | {state} | " + " | ".join(f"{v[n]:.1e}" for n in lengths) + " |")
        out.append("")
    return "\n".join(out)


# ---- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="1,2,3", help="which measurements (3 reuses the models of 2)")
    p.add_argument("--lengths", default="16,32,64,128,256,512", help="(1) sequence lengths")
    p.add_argument("--tokens", type=int, default=2048, help="(1) source tokens per batch")
    p.add_argument("--reps", type=int, default=2, help="(1) timed steps per point and round")
    p.add_argument("--rounds", type=int, default=3, help="(1) sweeps over all points (median of all)")
    p.add_argument("--ks", default="5,10,20,50,100,200", help="(2) distractor counts")
    p.add_argument("--steps", type=int, default=300, help="(2) training steps per point")
    p.add_argument("--batch", type=int, default=32, help="(2) sentences per step")
    p.add_argument("--lr", type=float, default=2e-3, help="(2) Adam learning rate (all models)")
    p.add_argument("--long-steps", type=int, default=900, help="(2) the recurrent models again with this many steps")
    p.add_argument("--long-ks", default="20,50", help="(2) ... at these k (empty: skip)")
    p.add_argument("--device", default="cpu", help="(1) cpu or cuda; (2) and (3) always run on the CPU (they "
                                                   "measure what is learned, not how fast)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--report", action="store_true", help="print the tables of the saved results.json and stop")
    args = p.parse_args(argv)
    if args.report:
        print(report(json.loads((args.out / "results.json").read_text(encoding="utf-8"))))
        return 0
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU here")
    print(f"machine: {hardware.describe_line()}", flush=True)
    parts = {int(x) for x in args.parts.split(",")}
    ks = [int(x) for x in args.ks.split(",")]
    # Parts run separately are merged into one results.json; each records its command.
    path = args.out / "results.json"
    results = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    command = " ".join([".venv/bin/python benchmarks/seed_claims/run.py", *(argv or [])])
    machine = {"torch": torch.__version__, "threads": args.threads, "machine": hardware.describe(),
               "cpus": __import__("os").cpu_count()}
    if device.type == "cpu":  # a GPU's run records its machine in its own part, beside the CPU's results
        results.update(machine)
    started = time.perf_counter()
    trained: dict = {}
    if 1 in parts:
        key = "throughput" if device.type == "cpu" else f"throughput_{device.type}"  # the CPU's table is kept
        print(f"(1) throughput on {device}", flush=True)
        results[key] = throughput(["transformer", "lstm+attn", "rnn+attn"], [int(x) for x in args.lengths.split(",")],
                                  args.tokens, args.reps, args.rounds, args.seed, device)
        results[key].update(command=command, threads=args.threads, **({} if device.type == "cpu" else machine))
        plot_throughput(results[key], args.out / f"{key}.png")
    if 2 in parts or 3 in parts:
        print("(2) copy the first token after k distractors", flush=True)
        results["long_range"] = long_range(["transformer", "lstm+attn", "lstm", "rnn"], ks, args.steps, args.batch,
                                           args.lr, args.seed, trained)
        results["long_range"]["command"] = command
        if args.long_ks:
            print(f"(2b) the recurrent models with {args.long_steps} steps", flush=True)
            results["long_range"]["longer_budget"] = long_range(
                ["lstm+attn", "lstm", "rnn"], [int(x) for x in args.long_ks.split(",")], args.long_steps,
                args.batch, args.lr, args.seed)
        plot_long_range(results["long_range"], args.out / "long_range.png")
    if 3 in parts:
        print("(3) gradient reaching the first token", flush=True)
        results["gradients"] = gradients(["transformer", "lstm+attn", "lstm", "rnn"], [k + 2 for k in ks], trained,
                                         args.seed)
        results["gradients"]["command"] = command
        plot_gradients(results["gradients"], args.out / "gradients.png")
    from transformer.run.files import write_text_atomic

    write_text_atomic(path, json.dumps(results, indent=1) + "\n")
    print(f"wrote {path} in {time.perf_counter() - started:.0f}s\n")
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
