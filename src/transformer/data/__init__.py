"""Data: reading parallel corpora, the dataset registry, subword vocabularies and token batching.

Knows nothing of the model; the only contract is the special ids (pad=0, bos=1, eos=2).
"""

from .batching import Batch, Example, TokenBatchSampler, collate, example_lengths, filter_long, fits
from .corpus import clean_pairs, count_lines, decode_lines, hold_out, iter_lines, open_lines, read_lines, read_parallel, read_tsv
from .registry import DATA_ENV_VAR, MULTI30K, Dataset, fetch_url, find_data_dir, load_multi30k
from .subwords import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Subwords, train_subwords

__all__ = [
    "read_lines", "decode_lines", "open_lines", "iter_lines", "count_lines", "read_parallel", "read_tsv", "clean_pairs",
    "hold_out",
    "Dataset", "MULTI30K", "DATA_ENV_VAR", "find_data_dir", "load_multi30k", "fetch_url",
    "Subwords", "train_subwords", "PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID",
    "Example", "Batch", "filter_long", "fits", "example_lengths", "TokenBatchSampler", "collate",
]
