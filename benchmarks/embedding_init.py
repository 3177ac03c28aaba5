"""Word vectors for ``embedding_init``: gensim's word2vec trained on the Multi30k training text,
both sides of a language pair in one vector space (the model's embedding is one matrix shared by
source and target), written in word2vec's binary format. The comparison it serves, learned
embeddings against these, and its commands and results are in benchmarks/embedding_init.md.

gensim is not a dependency of the package (its readers are the package's own); install it for
this script only:

    pip install gensim        # or: pip install -e ".[wordvectors]"
    TRANSFORMER_DATA=DATA_DIR .venv/bin/python benchmarks/embedding_init.py --out w2v.bin [--dim 300]

Words are the training text split into runs of letters/digits and single punctuation marks,
so that "bike." gives "bike" and ".", the words sentencepiece's pieces "▁bike" and "." match.
Skip-gram, one worker and a fixed hash of each word: the same text and seed give the same vectors.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

from transformer import hardware
from transformer.data import clean_pairs, load_multi30k

WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    return WORD.findall(text)


def stable_hash(text: str) -> int:
    """gensim seeds each word's first vector with hash(word + seed): Python's str hash differs
    between processes, this one does not."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=4).digest(), "little")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the vector file to write (word2vec binary)")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--data-dir", help="folder holding multi30k/ (default: $TRANSFORMER_DATA)")
    p.add_argument("--dim", type=int, default=300, help="vector size (300: the published word2vec and GloVe size)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--min-count", type=int, default=2, help="leave out words seen fewer times")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--text", action="store_true", help="write word2vec's text format instead")
    args = p.parse_args(argv)
    print(f"machine: {hardware.describe_line()}", flush=True)
    try:
        from gensim.models import Word2Vec
    except ImportError:
        print("this script needs gensim: pip install gensim", file=sys.stderr)
        return 2
    pairs, _ = clean_pairs(load_multi30k("train", args.src_lang, args.tgt_lang, data_dir=args.data_dir))
    sentences = [words(s) for s, _ in pairs] + [words(t) for _, t in pairs]
    model = Word2Vec(sentences, vector_size=args.dim, window=5, min_count=args.min_count, sg=1,
                     epochs=args.epochs, seed=args.seed, workers=1, hashfxn=stable_hash)
    model.wv.save_word2vec_format(str(Path(args.out)), binary=not args.text)
    print(f"{len(model.wv):,} words x {args.dim} from {len(sentences):,} sentences -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
