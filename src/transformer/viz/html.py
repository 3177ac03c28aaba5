"""A self-contained HTML page of the attention weights: the data embedded as JSON, plain
JavaScript, no network access. The reader picks the kind, layer and head (or the mean of
the heads) and hovers a cell for its exact weight."""
from __future__ import annotations

import json
from pathlib import Path

from .maps import KIND_TITLES, AttentionMaps, PromptMaps


def page_data(maps: AttentionMaps | PromptMaps, decimals: int = 4) -> dict:
    """The JSON the page embeds: labels and weights [layer][head][row][col], rounded;
    ``heading``: the (label, text) lines above the plot (source and translation, or prompt)."""
    kinds = {}
    for kind in maps.kinds:
        rows, cols = maps.labels(kind)
        w = maps.weights(kind)
        kinds[kind] = {"title": KIND_TITLES[kind], "rows": rows, "cols": cols,
                       "weights": [[[[round(float(x), decimals) for x in row] for row in head]
                                    for head in layer] for layer in w.tolist()]}
    return {"source": maps.source, "translation": maps.translation, "heading": [list(h) for h in maps.heading()],
            "n_layers": maps.n_layers, "n_heads": maps.n_heads, "kinds": kinds}


def _embed(data: dict) -> str:
    # "/" escaped as "\/" (valid JSON): no "</script>" can end the block early and no
    # URL-looking text from a sentence appears in the page.
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("/", "\\/")


def render_html(maps: AttentionMaps | PromptMaps) -> str:
    return _TEMPLATE.replace("__DATA__", _embed(page_data(maps)))


def write_html(maps: AttentionMaps | PromptMaps, path: str | Path) -> Path:
    from ..run.files import write_text_atomic

    return write_text_atomic(path, render_html(maps))


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Attention weights</title>
<style>
  body { font-family: sans-serif; margin: 1.5em; color: #222; }
  .controls label { margin-right: 1.2em; }
  table.heat { border-collapse: collapse; margin-top: 1em; font-size: 13px; }
  table.heat td { width: 2.2em; height: 1.6em; border: 1px solid #fff; }
  table.heat th { font-weight: normal; padding: 0 .4em; white-space: nowrap; }
  table.heat th.col { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }
  #info { margin-top: .8em; min-height: 1.4em; font-family: monospace; }
  .sent { margin: .2em 0; }
</style>
</head>
<body>
<h1>Attention weights</h1>
<div id="heading"></div>
<div class="controls">
  <label>kind <select id="kind"></select></label>
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
</div>
<div id="info">hover a cell: row attends to column with this weight (each row sums to 1)</div>
<div id="plot"></div>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
DATA.heading.forEach(([label, text]) => {
  const p = document.createElement("p"), b = document.createElement("b"), span = document.createElement("span");
  p.className = "sent"; b.textContent = label + ": "; span.textContent = text;
  p.append(b, span); $("heading").appendChild(p);
});

function fill(select, items) {
  select.innerHTML = "";
  items.forEach(([value, text]) => {
    const o = document.createElement("option");
    o.value = value; o.textContent = text; select.appendChild(o);
  });
}
fill($("kind"), Object.keys(DATA.kinds).map((k) => [k, DATA.kinds[k].title]));
fill($("layer"), [...Array(DATA.n_layers).keys()].map((i) => [i, String(i + 1)]));
fill($("head"), [["mean", "mean of heads"], ...[...Array(DATA.n_heads).keys()].map((i) => [i, String(i + 1)])]);
$("layer").value = String(DATA.n_layers - 1);
$("head").value = "0";

function matrix(kind, layer, head) {
  const heads = DATA.kinds[kind].weights[layer];
  if (head !== "mean") return heads[Number(head)];
  return heads[0].map((row, i) => row.map((_, j) => heads.reduce((s, h) => s + h[i][j], 0) / heads.length));
}

function colour(w) {  // white (0) to dark blue (1)
  const t = Math.max(0, Math.min(1, w));
  const r = Math.round(255 - 227 * t), g = Math.round(255 - 187 * t), b = Math.round(255 - 135 * t);
  return "rgb(" + r + "," + g + "," + b + ")";
}

function draw() {
  const kind = $("kind").value, k = DATA.kinds[kind];
  const m = matrix(kind, Number($("layer").value), $("head").value);
  const table = document.createElement("table");
  table.className = "heat";
  const head = table.insertRow();
  head.appendChild(document.createElement("th"));
  k.cols.forEach((c) => { const th = document.createElement("th"); th.className = "col"; th.textContent = c; head.appendChild(th); });
  m.forEach((row, i) => {
    const tr = table.insertRow();
    const th = document.createElement("th"); th.textContent = k.rows[i]; tr.appendChild(th);
    row.forEach((w, j) => {
      const td = tr.insertCell();
      td.style.background = colour(w);
      td.title = k.rows[i] + " \\u2192 " + k.cols[j] + ": " + w.toFixed(4);
      td.onmouseenter = () => { $("info").textContent = k.rows[i] + " \\u2192 " + k.cols[j] + "  " + w.toFixed(4); };
    });
  });
  $("plot").replaceChildren(table);
}
["kind", "layer", "head"].forEach((id) => $(id).addEventListener("change", draw));
draw();
</script>
</body>
</html>
"""
