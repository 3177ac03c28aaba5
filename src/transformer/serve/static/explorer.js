// The attention explorer: translate a sentence through the JSON API, then draw one
// attention map (which attention, layer, head or the heads' average) as a table heatmap.
// When the server has a language model (GET /health says its kind), generate.js takes over.
//
// Data comes from POST /attention (see transformer/serve/attention_maps.py): maps are
// [layer][head][query][key]; rows are queries (the token being processed or produced),
// columns are keys (the tokens attended to). No framework, no build step, no external URLs.
//
// A server started with a token serves this page and its files without it, but not the API:
// the page takes the token from its address (http://host:port/#token=..., as `transformer
// serve` prints it; a fragment never reaches a server or its logs), keeps it in
// sessionStorage (this tab only), removes it from the address bar, and sends
// "Authorization: Bearer ..." on every call. Refused (401), it asks for the token once, in
// a field on the page.
"use strict";

const $ = (id) => document.getElementById(id);

const KINDS = {
  cross: {
    maps: "cross", rows: "target_tokens", cols: "source_tokens",
    axes: "Rows: the target token being produced. Columns: the source tokens it attends to.",
  },
  encoder: {
    maps: "encoder_self", rows: "source_tokens", cols: "source_tokens",
    axes: "Rows: each source token. Columns: the source tokens it attends to.",
  },
  decoder: {
    maps: "decoder_self", rows: "target_tokens", cols: "target_input_tokens",
    axes: "Rows: the target token being produced. Columns: the decoder's inputs so far (<s> first).",
  },
};

// What is on screen; tests read it through window.explorer.
const state = { data: null, kind: "cross", layer: 0, head: "avg", values: [], rows: [], cols: [] };

// ---- the token ------------------------------------------------------------------------
const TOKEN_KEY = "transformer-serve-token";
const auth = { token: null };

// A refused call: the token form says so, the status line stays quiet.
class TokenRefused extends Error {}

// The token from the address's #token=... (then gone from the address bar), else the one
// this tab stored before.
function readToken() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.has("token")) {
    useToken(fragment.get("token"));
    fragment.delete("token");
    const rest = fragment.toString();
    history.replaceState(history.state, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
    return;
  }
  try {
    auth.token = sessionStorage.getItem(TOKEN_KEY);
  } catch { // storage turned off: the token lives as long as the page
  }
}

function useToken(token) {
  auth.token = token.trim() || null;
  try {
    if (auth.token) sessionStorage.setItem(TOKEN_KEY, auth.token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch { // as in readToken
  }
}

// Shows the token form (once: it is a part of the page, not a dialog).
function askForToken() {
  $("token-message").textContent = auth.token
    ? "The server refused this page's token. Paste the right one:"
    : "This server wants a token. Open the address that transformer serve printed (it ends in " +
      "#token=…), or paste the token here:";
  if ($("token-form").hidden) {
    $("token-form").hidden = false;
    $("token").focus();
  }
}

// The field's token, tried on a call that wants it (GET /stats).
async function submitToken(event) {
  event.preventDefault();
  useToken($("token").value);
  $("token").value = "";
  $("token-form").hidden = true;
  if (await checkToken()) setStatus("The server took the token.");
}

// Whether the server takes this page's token (or wants none); if not, the form asks for one.
async function checkToken() {
  try {
    await api("/stats");
    return true;
  } catch (error) {
    showError(error);
    return false;
  }
}

// ---- talking to the service ----------------------------------------------------------
// fetch() with the token, if the page has one; a 401 asks for it and throws TokenRefused.
async function api(path, options = {}) {
  const headers = { ...options.headers };
  if (auth.token) headers.Authorization = `Bearer ${auth.token}`;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    askForToken();
    throw new TokenRefused("the server wants a token");
  }
  return response;
}

async function postJSON(path, body) {
  const response = await api(path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `the server answered ${response.status}`);
  return data;
}

async function showModelInfo() {
  try {
    const health = await (await api("/health")).json();
    const kind = health.kind === "language-model" ? "language model" : "translation model";
    $("model-info").textContent = `Model ${health.model || ""} (${kind}): ` +
      `${health.n_layers} layers, ${health.n_heads} heads, d_model ${health.d_model}`;
    if (health.kind === "language-model") window.generation.start(health); // generate.js: the page's other mode
  } catch (error) {
    $("model-info").textContent = "The service does not answer.";
  }
}

async function translate(event) {
  event.preventDefault();
  const text = $("source").value;
  const beam = Number($("beam").value);
  const nBest = Math.min(Math.max(Number($("n-best").value) || 1, 1), beam);
  await whileBusy("translate", "Translating…", async () => {
    const [translation, attention] = await Promise.all([
      postJSON("/translate", { text, beam, n_best: nBest }),
      postJSON("/attention", { text, beam }),
    ]);
    showTranslation(translation);
    showAttention(attention);
    setStatus(translation.truncated.length ? "The sentence was too long for the model and was cut." : "");
    await window.inspectView.show(text); // the lens and the head map (inspect.js); its errors are its own
  });
}

// work() with its button disabled and its status shown; an error is shown, and the button is
// enabled again either way (the translation's form, and generate.js's).
async function whileBusy(button, status, work) {
  setStatus(status);
  $(button).disabled = true;
  try {
    await work();
  } catch (error) {
    showError(error);
  } finally {
    $(button).disabled = false;
  }
}

function setStatus(message, isError = false) {
  $("status").textContent = message;
  $("status").classList.toggle("error", isError);
}

function showError(error) {
  if (error instanceof TokenRefused) setStatus(""); // the token form is the message
  else setStatus(error.message, true);
}

// ---- the translation -----------------------------------------------------------------
function showTranslation(response) {
  $("result").hidden = false;
  $("translation").textContent = response.translation;
  const list = $("nbest");
  list.replaceChildren(...response.n_best[0].map((candidate) => {
    const item = document.createElement("li");
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = candidate.score.toFixed(3);
    item.append(candidate.text || "(empty)", " ", score);
    return item;
  }));
  list.hidden = response.n_best[0].length < 2;
}

// ---- the heatmap ---------------------------------------------------------------------
function showAttention(data) {
  showMaps(state, data, data.source_tokens, { section: "attention", layer: "layer", head: "head" }, redraw);
}

// A view's maps arrived (the translation's, or generate.js's): kept in its state, its section
// shown when there are tokens, its pickers (ids) refilled, the view drawn. Options are numbered
// from 1, as people count; a view's state holds indices from 0.
function showMaps(chosen, data, tokens, ids, redrawView) {
  chosen.data = data;
  $(ids.section).hidden = tokens.length === 0;
  fillLayerHead($(ids.layer), $(ids.head), data, chosen);
  redrawView();
}

// The layer and head the pickers show, as indices from 0, into chosen.
function readLayerHead(layerSelect, headSelect, chosen) {
  chosen.layer = Number(layerSelect.value) - 1;
  chosen.head = headSelect.value === "avg" ? "avg" : Number(headSelect.value) - 1;
}

// The weights to draw: the chosen layer's maps ([layer][head][row][col]), one head or their average.
function chosenWeights(maps, chosen) {
  const perHead = maps[chosen.layer]; // [head][row][col]
  return chosen.head === "avg" ? averageHeads(perHead) : perHead[chosen.head];
}

// The layer and head pickers for data's shape, keeping the chosen ones (indices from 0) where they exist.
function fillLayerHead(layerSelect, headSelect, data, chosen) {
  fillSelect(layerSelect, range(data.n_layers).map((i) => [i + 1, `${i + 1} of ${data.n_layers}`]), chosen.layer + 1);
  fillSelect(headSelect, [["avg", "average"], ...range(data.n_heads).map((i) => [i + 1, `${i + 1}`])],
    chosen.head === "avg" ? "avg" : chosen.head + 1);
}

function fillSelect(select, options, keep) {
  select.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
  const values = options.map(([value]) => String(value));
  select.value = values.includes(String(keep)) ? String(keep) : values[0];
}

function readControls() {
  state.kind = document.querySelector('input[name="kind"]:checked').value;
  readLayerHead($("layer"), $("head"), state);
}

function draw() {
  const data = state.data;
  if (!data || data.source_tokens.length === 0) return;
  const kind = KINDS[state.kind];
  state.values = chosenWeights(data[kind.maps], state);
  state.rows = data[kind.rows];
  state.cols = data[kind.cols];
  $("axes").textContent = kind.axes;

  const table = $("heatmap");
  fillHeatmap(table, state.rows, state.cols, state.values);
  table.dataset.kind = state.kind;
  table.dataset.layer = $("layer").value; // as shown: from 1
  table.dataset.head = $("head").value;
  showHover(null);
}

// A table of weights: a header of the column tokens, then one row per row token.
function fillHeatmap(table, rows, cols, values) {
  const header = document.createElement("tr");
  header.append(document.createElement("th"));
  cols.forEach((token, j) => header.append(tokenCell("th", token, { col: j }, "col")));
  const body = values.map((row, i) => {
    const tr = document.createElement("tr");
    tr.append(tokenCell("th", rows[i], { row: i }, "row"));
    row.forEach((weight, j) => {
      const td = document.createElement("td");
      td.dataset.row = i;
      td.dataset.col = j;
      td.dataset.w = weight.toFixed(3);
      td.style.backgroundColor = heat(weight);
      td.title = `${rows[i]} → ${cols[j]}: ${weight.toFixed(3)}`;
      tr.append(td);
    });
    return tr;
  });
  table.replaceChildren(header, ...body);
}

function tokenCell(tag, token, indices, className) {
  const cell = document.createElement(tag);
  cell.className = className;
  Object.assign(cell.dataset, indices);
  const label = document.createElement("span");
  label.textContent = token;
  cell.append(label);
  return cell;
}

function averageHeads(perHead) {
  const heads = perHead.length;
  return perHead[0].map((row, i) => row.map((_, j) => perHead.reduce((sum, h) => sum + h[i][j], 0) / heads));
}

// Weight 0 is white, 1 is the darkest blue.
function heat(weight) {
  const w = Math.min(Math.max(weight, 0), 1);
  return `rgba(25, 80, 160, ${(0.05 + 0.95 * w).toFixed(3)})`;
}

// ---- hovering: what attends to a token -----------------------------------------------
function onHover(event) {
  const cell = event.target.closest("th.col, td");
  showHover(cell ? Number(cell.dataset.col) : null);
}

function showHover(col) {
  const table = $("heatmap");
  table.querySelectorAll(".hover").forEach((el) => el.classList.remove("hover"));
  table.querySelectorAll("th.row").forEach((th) => { th.style.backgroundColor = ""; });
  state.hoverCol = col;
  if (col === null || Number.isNaN(col)) {
    $("hover-info").textContent = "Hover over a column's token to see what attends to it.";
    return;
  }
  table.querySelectorAll(`[data-col="${col}"]`).forEach((el) => el.classList.add("hover"));
  const column = state.values.map((row) => row[col]);
  table.querySelectorAll("th.row").forEach((th) => {
    th.style.backgroundColor = heat(column[Number(th.dataset.row)]);
  });
  const top = column
    .map((weight, i) => [weight, state.rows[i]])
    .sort((a, b) => b[0] - a[0])
    .slice(0, 3)
    .map(([weight, token]) => `${token} (${weight.toFixed(2)})`);
  $("hover-info").textContent = `“${state.cols[col]}” is attended to most by ${top.join(", ")}.`;
}

function range(n) {
  return Array.from({ length: n }, (_, i) => i);
}

// ---- wiring --------------------------------------------------------------------------
function redraw() {
  readControls();
  draw();
}

function start() {
  readToken();
  $("token-form").addEventListener("submit", submitToken);
  $("translate-form").addEventListener("submit", translate);
  $("kind").addEventListener("change", redraw);
  $("layer").addEventListener("change", redraw);
  $("head").addEventListener("change", redraw);
  $("beam").addEventListener("change", () => { $("n-best").max = $("beam").value; });
  $("heatmap").addEventListener("mouseover", onHover);
  $("heatmap").addEventListener("mouseleave", () => showHover(null));
  showModelInfo();
  checkToken();
}

window.explorer = { state, auth };
document.addEventListener("DOMContentLoaded", start);
