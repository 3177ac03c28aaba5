"""What the frozen config dataclasses share: :class:`~transformer.model.config.ModelConfig`,
:class:`~transformer.decode.decoding_config.DecodingConfig` and :class:`~transformer.train.train_config.TrainConfig`.

A config is a frozen dataclass validated once in ``__post_init__``; a config made of parts
(decoding: search, sampling, runtime; training: data, optimiser, schedule, ...) declares each
part as a dataclass of its own and gives it back with :func:`part`. This module imports
nothing but the standard library, so reading a config loads no model.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

FLOATS = ("float", "float | None")  # the annotations a whole number is read as (YAML and JSON give 1 for 1.0)


class Frozen:
    """The methods every config has: a changed copy, and a plain dict to save beside the weights."""

    def replace(self, **changes: Any):
        """A copy with ``changes``, validated again."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def part(kind: type) -> property:
    """A property that gives back the ``kind`` part of a flat config: its fields, as they are
    (checked already), e.g. ``search = part(SearchConfig)``."""
    def get(config):
        return kind(**{f.name: getattr(config, f.name) for f in dataclasses.fields(kind)})

    return property(get, doc=f"The :class:`{kind.__name__}` part of this config.")


def unknown_keys(kind: type, d: dict[str, Any]) -> list[str]:
    """The keys of ``d`` that name no field of the dataclass ``kind``, sorted."""
    return sorted(set(d) - {f.name for f in dataclasses.fields(kind)})


def known_keys(kind: type, d: dict[str, Any], message: str) -> dict[str, Any]:
    """``d`` when every key names a field of ``kind``; else ValueError(``message``, its
    ``{unknown}`` replaced by the keys that do not)."""
    if unknown := unknown_keys(kind, d):
        raise ValueError(message.replace("{unknown}", str(unknown)))
    return d


def whole_numbers_as_floats(config, names: Iterable[str] | None = None) -> None:
    """The float fields of ``config`` (those in ``names``, if given) that hold a whole number,
    made floats: YAML and JSON give 1 for 1.0."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if ((names is None or f.name in names) and f.type in FLOATS
                and isinstance(value, int) and not isinstance(value, bool)):
            object.__setattr__(config, f.name, float(value))


TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
              "str | None": "a string", "dict[str, Any]": "a mapping", "float | None": "a number",
              "list[str]": "a list of strings", "list[float]": "a list of numbers", "int | None": "an integer",
              "bool | None": "true or false", "dict[str, float] | None": "a mapping"}


def has_type(value: Any, annotation: str) -> bool:
    """Whether ``value`` is of the type a field's ``annotation`` names (one of :data:`TYPE_NAMES`)."""
    if annotation.endswith(" | None"):
        return value is None or has_type(value, annotation.removesuffix(" | None"))
    if annotation.startswith("list["):
        return isinstance(value, list) and all(has_type(v, annotation[len("list["):-1]) for v in value)
    if annotation.startswith("dict["):
        return isinstance(value, dict)
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    kind = {"float": float, "bool": bool, "str": str}.get(annotation)
    return kind is None or isinstance(value, kind)
