"""``transformer train``: train a translation model or a language model from a YAML config.

On several processes: ``torchrun --nproc_per_node N -m transformer train ...`` (one process
per GPU with ``--device cuda``; gloo on CPUs otherwise). See docs/distributed.md."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a translation or language model from a config (resumes when RUN_DIR holds a run)")
    p.add_argument("--config", required=True, help="YAML config, e.g. configs/multi30k-en-de.yaml or configs/shakespeare-char.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set max_steps=200 --set model.dropout=0.1")
    p.add_argument("--out", help="run directory (default: runs/<config name>)")
    p.add_argument("--data-dir", help="folder holding the downloaded corpora, multi30k/ and tinyshakespeare/ "
                                      "(default: $TRANSFORMER_DATA, else ~/.cache/transformer/data, where a "
                                      "missing corpus is downloaded once)")
    p.add_argument("--device", default="auto", help="auto (the default: a CUDA GPU when there is one, else the CPU), "
                   "cpu or cuda[:N]; under torchrun, cuda means cuda:LOCAL_RANK for each process")
    p.set_defaults(func=run, memory_remedy="lower max_tokens or, for a language model, batch_size "
                              "(--set max_tokens=N; raise accum_steps to keep the batch)")


def run(args: argparse.Namespace) -> int:
    from ..train import distributed
    from ..train.train_config import load_config
    from ..train.trainer import Trainer

    overrides = list(args.overrides)
    if args.data_dir:
        overrides.append(f"data_dir={args.data_dir}")
    cfg = load_config(args.config, overrides)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    group = distributed.from_env(args.device)  # a single process unless started by torchrun
    try:
        result = Trainer(cfg, out, dist=group).train()
    finally:
        distributed.shutdown()
    if group.is_main:
        print(f"run directory: {out}")
    return 0 if result["reason"] not in ("SIGINT", "SIGTERM") else 130
