"""Attention heatmaps as PNG (matplotlib, Agg backend).

One figure with a section per attention kind. Each section holds the grid of all layers
(rows) x heads (columns) as small unlabelled heatmaps, and beside it one head enlarged
with its axes labelled by the subword pieces. Every heatmap uses the same colour scale,
0 to 1, so heads can be compared by eye; the scale is a square root (PowerNorm 0.5) so
that diffuse attention (weights near 1/S) is still visible.
"""
from __future__ import annotations

from pathlib import Path

from . import fonts
from .maps import KIND_TITLES, AttentionMaps, PromptMaps

MIN_CELL_IN, MAX_CELL_IN = 1.0, 2.2  # inches per small heatmap
DPI = 100


def _norm():
    from matplotlib.colors import PowerNorm

    return PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_attention(maps: AttentionMaps | PromptMaps, layer: int | None = None, head: int = 0,
                   kinds: tuple[str, ...] | None = None):
    """The figure (not yet saved).

    Args:
        maps: from :func:`~transformer.viz.maps.collect_attention` (a translation) or
            :func:`~transformer.viz.maps.collect_prompt_attention` (a language model's prompt).
        layer, head: the head to enlarge, counted from 0 (default: the last layer, head 0).
        kinds: which sections to draw, in order (default: every kind the maps hold).

    Returns:
        A matplotlib Figure. Each heatmap axes carries a label ``"KIND/L<l>/H<h>"`` (from 0)
        for the grid, ``"KIND/focus"`` for the enlarged head.
    """
    plt = _pyplot()
    n_l, n_h = maps.n_layers, maps.n_heads
    layer = n_l - 1 if layer is None else layer
    kinds = maps.kinds if kinds is None else kinds
    longest = maps.longest
    big_in = min(max(4.5, 0.22 * longest + 2.0), 12.0)  # room for one label per row / column
    cell = min(max((big_in - 0.8) / n_l, MIN_CELL_IN), MAX_CELL_IN)
    grid_w, grid_h = n_h * cell + 0.5, n_l * cell + 0.8
    section_h = max(grid_h, big_in)
    # The fallback list is set on each text that may hold any script (it then does not
    # depend on rcParams at drawing time); the rest uses matplotlib's defaults.
    family = fonts.families(maps.texts())
    with plt.rc_context({"font.size": 8}):
        fig = plt.figure(figsize=(grid_w + big_in + 1.0, section_h * len(kinds) + 0.6), dpi=DPI,
                         layout="constrained")
        fig.suptitle(_title(maps), fontsize=10, fontfamily=family)
        sections = fig.subfigures(len(kinds), 1, squeeze=False)[:, 0]
        for sf, kind in zip(sections, kinds):
            grid_sf, big_sf = sf.subfigures(1, 2, width_ratios=[grid_w, big_in + 1.0])
            _draw_grid(grid_sf, maps, kind)
            _draw_one(big_sf, maps, kind, layer, head, family)
    return fig


def _title(maps: AttentionMaps | PromptMaps, width: int = 110) -> str:
    cut = lambda s: s if len(s) <= width else s[: width - 3] + "..."  # noqa: E731
    one_line = lambda s: s.replace("\n", " / ")  # noqa: E731  (a prompt may hold line breaks)
    return "\n".join(fonts.displayable(f"{label}: {cut(one_line(text))}") for label, text in maps.heading())


def _draw_grid(sf, maps: AttentionMaps | PromptMaps, kind: str) -> None:
    w = maps.weights(kind).numpy()  # (L, H, rows, cols)
    axes = sf.subplots(maps.n_layers, maps.n_heads, squeeze=False)
    sf.suptitle(f"{KIND_TITLES[kind]}\nlayers down, heads across", fontsize=9)
    for layer in range(maps.n_layers):
        for head in range(maps.n_heads):
            ax = axes[layer, head]
            ax.imshow(w[layer, head], norm=_norm(), cmap="viridis", interpolation="nearest")
            ax.set_label(f"{kind}/L{layer}/H{head}")
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head + 1}", fontsize=7)
            if head == 0:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=7)


def _draw_one(sf, maps: AttentionMaps | PromptMaps, kind: str, layer: int, head: int, family: list[str]) -> None:
    rows, cols = maps.labels(kind)
    size = 8 if max(len(rows), len(cols)) <= 40 else 6
    ax = sf.subplots(1, 1)
    image = ax.imshow(maps.weights(kind)[layer, head].numpy(), norm=_norm(), cmap="viridis",
                      interpolation="nearest")
    ax.set_label(f"{kind}/focus")
    ax.set_xticks(range(len(cols)), [fonts.displayable(p) for p in cols], rotation=90, fontfamily=family, fontsize=size)
    ax.set_yticks(range(len(rows)), [fonts.displayable(p) for p in rows], fontfamily=family, fontsize=size)
    ax.set_xlabel("keys (attended to)")
    ax.set_ylabel("predicting" if kind == "cross" else "queries (attending)")
    ax.set_title(f"{KIND_TITLES[kind]}, layer {layer + 1}, head {head + 1}", fontsize=9)
    sf.colorbar(image, cax=ax.inset_axes([1.03, 0.0, 0.04, 1.0]), ticks=[0, 0.05, 0.2, 0.4, 0.6, 0.8, 1.0])


def save_png(fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` atomically and close it."""
    from ..run.files import atomic_write

    plt = _pyplot()
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI))
    finally:
        plt.close(fig)
