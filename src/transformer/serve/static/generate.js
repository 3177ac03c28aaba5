// The explorer's generation mode, for a server with a language model: continue a prompt
// through POST /generate, showing the tokens as they arrive (server-sent events), then draw
// the causal self-attention of prompt + continuation (POST /attention) for one layer and
// head (or the heads' average): a strip of tokens and a token-by-token heatmap. Hovering a
// token shades the tokens it attends to. Uses explorer.js's helpers ($, api, postJSON,
// setStatus, showError, fillSelect, averageHeads, heat, range). No framework, no build step,
// no external URLs.
"use strict";

// What is on screen; tests read it through window.generation.state.
const lm = { data: null, layer: 0, head: "avg", values: [], events: 0, done: null };

function startGeneration(health) {
  $("translate-form").hidden = true;
  $("generate-form").hidden = false;
  $("max-new-tokens").max = health.new_tokens_limit;
  // The server's defaults, but a short continuation: the attention grid grows as its square.
  $("max-new-tokens").value = Math.min(health.max_new_tokens, 64);
  $("temperature").value = health.temperature;
  $("top-k").value = health.top_k;
  $("top-p").value = health.top_p;
  $("generate-form").addEventListener("submit", generateText);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { // Enter generates; Shift+Enter is a new line
      event.preventDefault();
      $("generate-form").requestSubmit();
    }
  });
  $("lm-layer").addEventListener("change", redrawLM);
  $("lm-head").addEventListener("change", redrawLM);
  $("lm-tokens").addEventListener("mouseover", (event) => hoverLM(event.target.closest(".tok")));
  $("lm-heatmap").addEventListener("mouseover", (event) => hoverLM(event.target.closest("th.row, td")));
  $("lm-tokens").addEventListener("mouseleave", () => showLMHover(null));
  $("lm-heatmap").addEventListener("mouseleave", () => showLMHover(null));
}

// ---- generating ----------------------------------------------------------------------
function generationRequest() {
  const body = { prompt: $("prompt").value };
  for (const [id, key] of [["max-new-tokens", "max_new_tokens"], ["top-k", "top_k"], ["seed", "seed"]]) {
    if ($(id).value !== "") body[key] = Math.trunc(Number($(id).value));
  }
  for (const [id, key] of [["temperature", "temperature"], ["top-p", "top_p"]]) {
    if ($(id).value !== "") body[key] = Number($(id).value);
  }
  return body;
}

async function generateText(event) {
  event.preventDefault();
  const body = generationRequest();
  lm.events = 0;
  lm.done = null;
  $("lm-attention").hidden = true;
  $("prompt-text").textContent = body.prompt;
  $("continuation").textContent = "";
  $("generation").hidden = false;
  await whileBusy("generate", "Generating…", async () => {
    const done = await streamGeneration(body, (token) => {
      $("continuation").textContent += token.text;
      lm.events += 1;
    });
    lm.done = done;
    $("continuation").textContent = done.text; // the whole text: the same as the pieces joined
    const cut = done.truncated ? " The prompt was longer than the model's context: its end was continued." : "";
    setStatus(`${done.tokens} tokens, seed ${done.seed}.${cut}`);
    const text = body.prompt + done.text;
    if (text.trim()) { // a blank one is a 422: nothing to show
      showLMAttention(await postJSON("/attention", { text }));
      await window.inspectView.show(text); // the lens and the head map (inspect.js)
    }
  });
}

// POST /generate as server-sent events: onToken({text, token}) for each token; resolves
// with the final "done" event's answer.
async function streamGeneration(body, onToken) {
  const response = await api("/generate", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify(body),
  });
  if (!response.ok) {
    const data = await response.json().catch(() => ({}));
    throw new Error(data.error || `the server answered ${response.status}`);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const { event, data } = parseEvent(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (event === "done") return data;
      if (event === "error") throw new Error(data.error);
      onToken(data);
    }
  }
  throw new Error("the stream ended before the generation was done");
}

function parseEvent(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  return { event, data: JSON.parse(data.join("\n")) };
}

// ---- the attention -------------------------------------------------------------------
function showLMAttention(data) {
  showMaps(lm, data, data.tokens, { section: "lm-attention", layer: "lm-layer", head: "lm-head" }, redrawLM);
}

function redrawLM() {
  readLayerHead($("lm-layer"), $("lm-head"), lm);
  drawLM();
}

// How a token reads on screen: spaces and line ends made visible.
function visible(token) {
  return token.replaceAll(" ", "␣").replaceAll("\n", "↵").replaceAll("\t", "⇥");
}

function drawLM() {
  const data = lm.data;
  if (!data || data.tokens.length === 0) return;
  lm.values = chosenWeights(data.self_attention, lm);
  const tokens = data.tokens.map(visible);

  $("lm-tokens").replaceChildren(...tokens.map((token, i) => {
    const span = document.createElement("span");
    span.className = "tok";
    span.dataset.i = i;
    span.textContent = token;
    return span;
  }));

  const table = $("lm-heatmap");
  fillHeatmap(table, tokens, tokens, lm.values);
  table.dataset.layer = $("lm-layer").value; // as shown: from 1
  table.dataset.head = $("lm-head").value;
  showLMHover(null);
}

// ---- hovering: what a token attends to -----------------------------------------------
function hoverLM(element) {
  if (!element) return;
  const i = Number(element.dataset.i ?? element.dataset.row);
  showLMHover(Number.isNaN(i) ? null : i);
}

function showLMHover(i) {
  const strip = $("lm-tokens");
  const table = $("lm-heatmap");
  table.querySelectorAll(".hover").forEach((el) => el.classList.remove("hover"));
  strip.querySelectorAll(".tok").forEach((span) => {
    span.style.backgroundColor = "";
    span.classList.remove("focus");
  });
  lm.hover = i;
  if (i === null) {
    $("lm-hover-info").textContent = "Hover over a token to see what it attends to.";
    return;
  }
  const row = lm.values[i]; // token i's weights over the tokens 0..i (later ones are 0: causal)
  strip.querySelectorAll(".tok").forEach((span) => {
    const j = Number(span.dataset.i);
    if (j <= i) span.style.backgroundColor = heat(row[j]);
  });
  strip.querySelector(`.tok[data-i="${i}"]`).classList.add("focus");
  table.querySelectorAll(`[data-row="${i}"]`).forEach((el) => el.classList.add("hover"));
  const tokens = lm.data.tokens.map(visible);
  const top = row
    .map((weight, j) => [weight, tokens[j]])
    .slice(0, i + 1)
    .sort((a, b) => b[0] - a[0])
    .slice(0, 3)
    .map(([weight, token]) => `${token} (${weight.toFixed(2)})`);
  $("lm-hover-info").textContent = `“${tokens[i]}” attends most to ${top.join(", ")}.`;
}

window.generation = { start: startGeneration, state: lm };
