"""The pictures of :mod:`transformer.inspect`: the logit lens (layers x positions, each cell
coloured by the layer's probability of the model's final choice there and labelled with the
layer's top token) and the head map (layers x heads per kind of attention, coloured by the
change of the score when the head is ablated or patched). Matplotlib, Agg backend."""
from __future__ import annotations

from . import fonts
from .heatmap import _pyplot

MAX_LABEL = 8  # characters of a token written in a lens cell


def _short(piece: str) -> str:
    return fonts.displayable(piece if len(piece) <= MAX_LABEL else piece[: MAX_LABEL - 1] + "\u2026")


def _clip(title: str, most: int = 120) -> str:
    return title if len(title) <= most else title[: most - 1] + "\u2026"


def draw_lens(layers: list[str], pieces: list[str], chosen: list[str], prob, top: list[list[str]], title: str):
    """The lens figure. ``prob`` (L + 1, T): each layer's probability of the final choice;
    ``top`` [layer][position]: each layer's most probable token; ``pieces``: what each position
    reads (the x axis), ``chosen``: the final choice at each position (the top axis)."""
    plt = _pyplot()
    n_rows, n_cols = len(layers), len(pieces)
    family = fonts.families([*pieces, *chosen, *(t for row in top for t in row), title])
    fig, ax = plt.subplots(figsize=(min(max(4.0, 0.85 * n_cols + 2.0), 40.0), 0.45 * n_rows + 2.2),
                           layout="constrained")
    image = ax.imshow(prob, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", origin="lower")
    for i in range(n_rows):
        for j in range(n_cols):
            ax.text(j, i, _short(top[i][j]), ha="center", va="center", fontsize=7, family=family,
                    color="black" if prob[i][j] > 0.5 else "white")
    ax.set_yticks(range(n_rows), layers)
    ax.set_ylabel("layer (embed: before the first)")
    ax.set_xticks(range(n_cols), [_short(p) for p in pieces], rotation=90, fontsize=8, family=family)
    ax.set_xlabel("position (the token it reads)")
    top_axis = ax.secondary_xaxis("top")
    top_axis.set_xticks(range(n_cols), [_short(p) for p in chosen], rotation=90, fontsize=8, family=family)
    top_axis.set_xlabel("final choice")
    fig.colorbar(image, ax=ax, label="probability of the final choice", fraction=0.04)
    ax.set_title(fonts.displayable(_clip(title)), fontsize=9, family=family)
    return fig


def draw_heads(effects: dict, labels: dict[str, str], title: str):
    """The head map: one panel per kind, ``effects[kind]`` (L, H) on a colour scale centred
    on 0 (red: the score falls without the head, blue: it rises), each value written."""
    plt = _pyplot()
    kinds = list(effects)
    limit = max((float(t.abs().max()) for t in effects.values() if t.numel()), default=0.0) or 1.0
    n_layers, n_heads = next(iter(effects.values())).shape
    fig, axes = plt.subplots(1, len(kinds), figsize=(max(3.0, 0.6 * n_heads + 1.5) * len(kinds) + 1.0,
                                                     0.5 * n_layers + 2.2), squeeze=False,
                             layout="constrained")
    image = None
    for ax, kind in zip(axes[0], kinds):
        table = effects[kind].numpy()
        image = ax.imshow(table, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
        for i in range(table.shape[0]):
            for j in range(table.shape[1]):
                ax.text(j, i, f"{table[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if abs(table[i, j]) > 0.6 * limit else "black")
        ax.set_xticks(range(table.shape[1]), [str(h + 1) for h in range(table.shape[1])])
        ax.set_yticks(range(table.shape[0]), [str(i + 1) for i in range(table.shape[0])])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(labels[kind], fontsize=9)
    fig.colorbar(image, ax=list(axes[0]), label="change of the score", fraction=0.04)
    family = fonts.families([title])
    fig.suptitle(fonts.displayable(_clip(title)), fontsize=9, family=family)
    return fig
