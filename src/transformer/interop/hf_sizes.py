"""The sizes in a Hugging Face ``config.json``, checked against the checkpoint's tensors before
anything is built from them, transformers' config class included. config.json is text anyone
can edit (a hub repository ships its own): ``n_layer: 1000000000`` built a model of 10**9
layers on the meta device, a Marian folder's ``encoder_layers`` listed 10**9 layers' tensor
names, and Qwen2's config class makes a list of one entry per layer, until the memory ran out.

So the file is read as JSON first, and each size it gives must be a positive whole number and
the one the checkpoint's tensors have: the number of layers at most the layers the checkpoint
holds (fewer reads the first ones, with a warning), the vocabulary and the widths those of the
embedding and the first layer. The shapes come from the safetensors headers, which the library
checks against the file's length, so nothing is loaded and no size can exceed what the files
hold. A size no tensor holds, the positions of a rotary or sinusoidal model, may not ask for a
position table larger than the weights (the limit :func:`~transformer.run.weights.load_model`
puts on every run's weights, so the import never writes a run that no command opens). A key
the file leaves out takes transformers' default, which is small. One line, naming config.json
and the key.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..data.hf_tokenizer import read_json
from ..errors import UserError
from .hf_files import HFWeights

CONFIG_JSON = "config.json"


def check_sizes(family: str, folder: Path, weights: HFWeights) -> None:
    """UserError, one line naming ``folder``'s config.json and the key, when a size it gives
    (``family``: gpt2, llama, mistral, qwen2 or marian) is no positive whole number or not
    what ``weights`` hold."""
    config = read_json(folder / CONFIG_JSON)
    c = _Sizes(config if isinstance(config, dict) else {}, weights, folder / CONFIG_JSON)
    if family == "gpt2":
        vocab, width = c.whole("vocab_size"), c.whole("n_embd")
        c.whole("n_head")
        c.layers("n_layer", "transformer.h.")
        c.tensor("transformer.wte.weight", vocab_size=vocab, n_embd=width)
        c.tensor("transformer.wpe.weight", n_positions=c.whole("n_positions"), n_embd=width)
        c.tensor("transformer.h.0.mlp.c_fc.weight", n_embd=width, n_inner=c.whole("n_inner"))  # Conv1D: (in, out)
    elif family == "marian":
        width = c.whole("d_model")
        for stack in ("encoder", "decoder"):
            c.whole(f"{stack}_attention_heads")
            c.layers(f"{stack}_layers", f"model.{stack}.layers.")
            c.tensor(f"model.{stack}.layers.0.fc1.weight", **{f"{stack}_ffn_dim": c.whole(f"{stack}_ffn_dim")},
                     d_model=width)
        c.tensor(c.first("model.shared.weight", "model.encoder.embed_tokens.weight"), vocab_size=c.whole("vocab_size"),
                 d_model=width)
        if config.get("share_encoder_decoder_embeddings") is False:
            c.tensor("model.decoder.embed_tokens.weight", decoder_vocab_size=c.whole("decoder_vocab_size"),
                     d_model=width)
        positions = c.whole("max_position_embeddings")
        if "model.encoder.embed_positions.weight" in weights:  # older conversions store the sinusoids
            c.tensor("model.encoder.embed_positions.weight", max_position_embeddings=positions, d_model=width)
        else:
            c.table("max_position_embeddings", positions, width or 1)
    else:  # llama-shaped
        vocab, width, heads = c.whole("vocab_size"), c.whole("hidden_size"), c.whole("num_attention_heads")
        c.whole("num_key_value_heads")
        head = c.whole("head_dim") or (width // heads if width and heads and heads <= width else 1)
        c.layers("num_hidden_layers", "model.layers.")
        c.tensor("model.embed_tokens.weight", vocab_size=vocab, hidden_size=width)
        c.tensor("model.layers.0.mlp.up_proj.weight", intermediate_size=c.whole("intermediate_size"),
                 hidden_size=width)
        c.table("max_position_embeddings", c.whole("max_position_embeddings"), head)


class _Sizes:
    def __init__(self, config: dict, weights: HFWeights, config_json: Path) -> None:
        self.config, self.weights, self.path = config, weights, config_json

    def whole(self, key: str) -> int | None:
        """The config's ``key``, a positive whole number; None when the file leaves it out."""
        value = self.config.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{self.path}: {key} must be a positive whole number, got {_short(value)}")
        return value

    def first(self, *names: str) -> str:
        """The first of ``names`` the checkpoint has (the last when it has none: named as missing)."""
        return next((name for name in names if name in self.weights), names[-1])

    def layers(self, key: str, prefix: str) -> None:
        """``key`` layers at most, each found in the checkpoint under ``prefix`` + its index."""
        wanted = self.whole(key)
        if wanted is None:
            return
        pattern = re.compile(re.escape(prefix.removeprefix("transformer.")) + r"(\d+)\.")
        held = {int(m.group(1)) for n in self.weights.names() if (m := pattern.match(n.removeprefix("transformer.")))}
        missing = next((i for i in range(min(wanted, len(held) + 1)) if i not in held), None)
        if missing is not None:
            raise UserError(f"{self.path}: {key} is {_short(wanted)}, but the checkpoint has {len(held)} layer(s) "
                            f"({prefix}N) and no {prefix}{missing}; the weights and config.json do not belong together")

    def tensor(self, name: str, **sizes: int | None) -> None:
        """The checkpoint's tensor ``name`` has the shape ``sizes`` (key: size, in order; a size
        None, left out of the file, is not compared)."""
        if all(size is None for size in sizes.values()):
            return
        shape = self.weights.shape(name)
        for i, (key, size) in enumerate(sizes.items()):
            if size is not None and (len(shape) != len(sizes) or shape[i] != size):
                raise UserError(f"{self.path}: {key} is {_short(size)}, but the checkpoint's {name} has the shape "
                                f"{tuple(shape)}; the weights and config.json do not belong together")

    def table(self, key: str, positions: int | None, width: int) -> None:
        """A position table of ``positions`` x ``width`` numbers, no larger than the weights."""
        from ..run.weights import TABLE_SLACK

        if positions is None:
            return
        held = self.weights.numbers()
        if positions * width > held + TABLE_SLACK:
            raise UserError(f"{self.path}: {key} is {_short(positions)}: a position table of {_short(positions * width)} "
                            f"numbers, where the checkpoint holds {held}; not a size of this model (config.json edited "
                            "or damaged)")


def _short(value) -> str:
    """``value`` for a one-line message: a number of over 15 digits as its power of ten."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 15:
        return f"about 10**{int(abs(value).bit_length() * 0.30103)}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
