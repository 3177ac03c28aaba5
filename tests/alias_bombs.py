"""YAML whose aliases multiply: ``levels`` anchors of ``width`` aliases of the one before are
width**levels values once expanded (9**9: 387 million, gigabytes once printed or walked),
in a few hundred bytes."""
from __future__ import annotations


def alias_list(levels: int = 9, width: int = 9) -> str:
    """The anchors as one flow list (a value on one line, as ``--set`` takes it)."""
    anchors = ["&a0 [lol]"] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return f"[{', '.join(anchors)}]"


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A document whose ``decoding: {alpha: ...}`` is the last anchor."""
    lines = ["a0: &a0 [lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\ndecoding: {{alpha: *a{levels}}}\n"
