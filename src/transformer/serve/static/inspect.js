// Two views beside the attention maps, for both kinds of model: the logit lens of the sentence
// (POST /lens: layers x positions, the top token in each cell, coloured by the probability of
// the model's final choice) and the head map (POST /heads: layer x head per kind of attention,
// coloured by how much the score changes when that head is ablated, or patched in from a
// corrupted sentence). explorer.js (after a translation) and generate.js (after a
// continuation) call inspectView.show(text); the heads are measured when asked (the button).
// Uses explorer.js's $, postJSON, tokenCell, heat, range and showError's TokenRefused.
"use strict";

// What is on screen; tests read it through window.inspectView.state.
const inspectState = { text: "", lens: null, heads: null };

async function showInspect(text) {
  inspectState.text = text;
  $("heads").hidden = false;
  $("head-maps").replaceChildren();
  setInfo("heads-info", "");
  try {
    const lens = await postJSON("/lens", { text, top: 3 });
    inspectState.lens = lens;
    drawLens(lens);
    setInfo("lens-info", lens.translation === null ? `The text and the token after it.`
      : `The decoder, reading its translation “${lens.translation}”.`);
  } catch (error) {
    inspectState.lens = null;
    $("lens-grid").replaceChildren();
    if (!(error instanceof TokenRefused)) setInfo("lens-info", error.message, true);
  }
  $("lens").hidden = false;
}

function setInfo(id, message, isError = false) {
  $(id).textContent = message;
  $(id).classList.toggle("error", isError);
}

// Rows: the last layer at the top, "embed" at the bottom; a header of what each position
// reads, and a footer of the final choice.
function drawLens(data) {
  const table = $("lens-grid");
  const header = document.createElement("tr");
  header.append(document.createElement("th"));
  data.positions.forEach((token, j) => header.append(tokenCell("th", token, { col: j }, "col")));
  const rows = range(data.layers.length).reverse().map((r) => {
    const tr = document.createElement("tr");
    const label = data.layers[r] === "embed" ? "embed" : `layer ${data.layers[r]}`;
    tr.append(tokenCell("th", label, { row: r }, "row"));
    data.positions.forEach((_, t) => {
      const p = data.final_choice_prob[r][t];
      const [top, q] = data.top[r][t][0];
      const td = document.createElement("td");
      td.dataset.row = r;
      td.dataset.col = t;
      td.dataset.p = p.toFixed(3);
      td.textContent = top;
      td.style.backgroundColor = heat(p);
      td.classList.toggle("dark", p > 0.5);
      td.title = `${label}, after “${data.positions[t]}”: p(${data.final_choice[t]}) = ${p.toFixed(3)}; top: ` +
        data.top[r][t].map(([tok, prob]) => `${tok} ${prob.toFixed(3)}`).join(", ");
      tr.append(td);
    });
    return tr;
  });
  const footer = document.createElement("tr");
  footer.append(tokenCell("th", "final choice", {}, "row"));
  data.final_choice.forEach((token, j) => footer.append(tokenCell("th", token, { col: j }, "col")));
  table.replaceChildren(header, ...rows, footer);
}

async function measureHeads(event) {
  event.preventDefault();
  const body = { text: inspectState.text };
  const corrupt = $("heads-corrupt").value;
  const token = $("heads-token").value.trim();
  const vs = $("heads-vs").value.trim();
  if (corrupt.trim()) body.corrupt = corrupt;
  if (token) body.token = token;
  if (vs) body.vs = vs;
  setInfo("heads-info", "Measuring every head…");
  $("measure-heads").disabled = true;
  try {
    const found = await postJSON("/heads", body);
    inspectState.heads = found;
    drawHeads(found);
    const corrupted = found.corrupt === null ? "" : `, ${found.corrupt.toFixed(3)} on the corrupted sentence`;
    const skipped = Object.entries(found.skipped).map(([kind, why]) => ` ${kind}: not patched (${why}).`).join("");
    setInfo("heads-info", `Score: ${found.score} = ${found.clean.toFixed(3)}${corrupted}.${skipped}`);
  } catch (error) {
    inspectState.heads = null;
    $("head-maps").replaceChildren();
    if (!(error instanceof TokenRefused)) setInfo("heads-info", error.message, true);
    else setInfo("heads-info", "");
  } finally {
    $("measure-heads").disabled = false;
  }
}

// One table per kind: rows layers (from 1), columns heads; red where the score falls without
// the head, blue where it rises, on one scale for all kinds.
function drawHeads(found) {
  const values = found.kinds.flatMap((k) => k.effects.flat()).filter((v) => v !== null);
  const limit = Math.max(...values.map(Math.abs), 1e-9);
  $("head-maps").replaceChildren(...found.kinds.map((kind) => {
    const table = document.createElement("table");
    table.className = "heatmap head-map";
    table.dataset.kind = kind.kind;
    const caption = document.createElement("caption");
    caption.textContent = kind.label;
    const header = document.createElement("tr");
    header.append(document.createElement("th"));
    range(found.n_heads).forEach((h) => header.append(tokenCell("th", `head ${h + 1}`, { col: h }, "col")));
    const rows = kind.effects.map((row, i) => {
      const tr = document.createElement("tr");
      tr.append(tokenCell("th", `layer ${i + 1}`, { row: i }, "row"));
      row.forEach((v, h) => {
        const td = document.createElement("td");
        td.dataset.row = i;
        td.dataset.col = h;
        if (v === null) {
          td.textContent = "–";
        } else {
          td.dataset.effect = v.toFixed(3);
          td.textContent = v.toFixed(2);
          td.style.backgroundColor = diverging(v / limit);
          td.classList.toggle("dark", Math.abs(v / limit) > 0.6);
          td.title = `${kind.label}, layer ${i + 1}, head ${h + 1}: ${v >= 0 ? "+" : ""}${v.toFixed(3)}`;
        }
        tr.append(td);
      });
      return tr;
    });
    table.replaceChildren(caption, header, ...rows);
    return table;
  }));
}

// -1 (the score falls most) is the deepest red, 0 white, +1 the deepest blue.
function diverging(x) {
  const a = Math.min(Math.abs(x), 1);
  return x < 0 ? `rgba(178, 24, 43, ${a.toFixed(3)})` : `rgba(33, 102, 172, ${a.toFixed(3)})`;
}

document.addEventListener("DOMContentLoaded", () => {
  $("heads-form").addEventListener("submit", measureHeads);
});

window.inspectView = { show: showInspect, state: inspectState };
