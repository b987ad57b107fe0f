// The inside view: POST /v1/inspect on a prompt (the last one generated from, by default), then
// the attention heatmaps by layer and head, the next-token distribution at any position, the
// logit lens and the positional encoding, every number readable on hover or with the keyboard.
import { $, api, el, heat, hideTip, percent, setStatus, showTip, shortToken, shownToken } from "./common.js";
import { drawPositions, nextBars } from "./tables.js";

const TOP = 5;
const LABEL = 8;  // characters of a token in the heatmap's and the lens's labels (all on hover)

export function insideView(state) {
  const { n_layer: L, n_head: H, max_attention_cells: maxCells } = state.shape;
  const canvas = $("#attention"), readout = $("#attention-readout"), status = $("#inside-status");
  const layerSelect = $("#layer"), headSelect = $("#head"), text = $("#inside-prompt");
  let data = null, request = null, cursor = null, geometry = null;
  let line = "";  // what the status says of the analysis (back after a layer is read)
  const say = (text) => { line = text; setStatus(status, text); };
  let analysedLast = null;  // the state.last analysed (one analysis per prompt)
  const attention = new Map();  // layer -> (H, T, rows) weights

  for (let l = 0; l < L; l++) layerSelect.append(el("option", { value: String(l) }, `${l + 1} of ${L}`));
  for (let h = 0; h < H; h++) headSelect.append(el("option", { value: String(h) }, `${h + 1} of ${H}`));

  const tokens = () => data.tokens.map((t) => t.text);

  function drawAttention() {
    const layer = Number(layerSelect.value), head = Number(headSelect.value);
    canvas.dataset.layer = String(layer);
    canvas.dataset.head = String(head);
    const weights = attention.get(layer)?.[head];
    if (!weights) return;
    const T = weights.length, labels = tokens().map((n) => shortToken(n, LABEL));
    const room = Math.min(canvas.parentElement.clientWidth - 4, 760);
    // Token labels while a cell is 7 px or more; the margin holds the longest label (a real
    // model's tokens: " capital", <|im_start|>), and at least 34 px.
    const fontOf = (cell) => `${Math.min(12, cell - 1)}px ui-monospace, monospace`;
    const ctx = canvas.getContext("2d");
    let margin = 4, cell = Math.floor((room - 34) / T);
    if (cell >= 7) {
      ctx.font = fontOf(cell);
      margin = Math.max(34, Math.ceil(Math.max(...labels.map((n) => ctx.measureText(n).width))) + 8);
    }
    cell = Math.max(2, Math.min(28, Math.floor((room - margin) / T)));
    const size = margin + cell * T;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(size * ratio); canvas.height = Math.round(size * ratio);
    canvas.style.width = `${size}px`; canvas.style.height = `${size}px`;
    canvas.dataset.margin = String(margin); canvas.dataset.cell = String(cell);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, size, size);
    for (let q = 0; q < T; q++) {
      for (let k = 0; k < T; k++) {
        ctx.fillStyle = k <= q ? heat(weights[q][k]) : "#e9ecef";  // masked: the future
        ctx.fillRect(margin + k * cell, margin + q * cell, cell, cell);
      }
    }
    if (margin > 4) {  // token labels: queries down the side, keys along the top
      ctx.fillStyle = "#1b1f24";
      ctx.font = fontOf(cell);
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      labels.forEach((n, i) => ctx.fillText(n, margin - 4, margin + (i + 0.5) * cell));
      const upright = labels.every((n) => ctx.measureText(n).width <= cell - 1);
      ctx.textAlign = upright ? "center" : "left";  // too wide for a column: read upwards
      labels.forEach((n, i) => {
        ctx.save();
        ctx.translate(margin + (i + 0.5) * cell, upright ? margin / 2 : margin - 4);
        if (!upright) ctx.rotate(-Math.PI / 2);
        ctx.fillText(n, 0, 0);
        ctx.restore();
      });
    }
    if (cursor) {
      ctx.strokeStyle = "#e36209"; ctx.lineWidth = 2;
      ctx.strokeRect(margin + cursor.k * cell + 1, margin + cursor.q * cell + 1, cell - 2, cell - 2);
    }
    geometry = { margin, cell, T };
  }

  function describeCell(q, k) {
    const names = tokens(), layer = Number(layerSelect.value), head = Number(headSelect.value);
    const w = attention.get(layer)[head][q][k];
    const value = k <= q ? w.toFixed(7) : "0 (masked: a key after the query)";
    return `layer ${layer + 1}, head ${head + 1}: query ${q} ${JSON.stringify(names[q])} → ` +
           `key ${k} ${JSON.stringify(names[k])}: A = ${value}`;
  }

  function cellAt(event) {
    if (!geometry) return null;
    const box = canvas.getBoundingClientRect();
    const k = Math.floor((event.clientX - box.left - geometry.margin) / geometry.cell);
    const q = Math.floor((event.clientY - box.top - geometry.margin) / geometry.cell);
    return q >= 0 && k >= 0 && q < geometry.T && k < geometry.T ? { q, k } : null;
  }

  canvas.addEventListener("mousemove", (e) => {
    const at = cellAt(e);
    if (!at) { hideTip(); return; }
    const line = describeCell(at.q, at.k);
    readout.textContent = line;
    showTip([line], e.pageX, e.pageY);
  });
  canvas.addEventListener("mouseleave", hideTip);
  canvas.addEventListener("keydown", (e) => {
    if (!geometry) return;
    const move = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] }[e.key];
    if (!move) return;
    e.preventDefault();
    cursor = cursor || { q: geometry.T - 1, k: 0 };
    cursor = { q: Math.max(0, Math.min(geometry.T - 1, cursor.q + move[0])),
               k: Math.max(0, Math.min(geometry.T - 1, cursor.k + move[1])) };
    readout.textContent = describeCell(cursor.q, cursor.k);
    drawAttention();
  });
  canvas.addEventListener("blur", () => { cursor = null; drawAttention(); });

  // A layer's weights come with the first answer when they all fit; otherwise one at a time.
  async function showLayer() {
    const layer = Number(layerSelect.value);
    if (!attention.has(layer) && request) {
      setStatus(status, `reading layer ${layer + 1}…`);
      try {
        const more = await api("/v1/inspect", { ...request, layers: [layer], lens: false, top: 1 });
        attention.set(layer, more.attention.weights[0]);
        setStatus(status, line);
      } catch (e) { setStatus(status, e.message, true); return; }
    }
    drawAttention();
  }
  layerSelect.addEventListener("change", showLayer);
  headSelect.addEventListener("change", drawAttention);

  function drawLens() {
    const table = $("#logit-lens"), lens = data.lens, names = tokens();
    const head = el("tr", {}, el("th", { scope: "col" }, "layer \\ position"),
      ...names.map((n, t) => el("th", { scope: "col", title: `position ${t}: ${JSON.stringify(n)}` },
        shortToken(n, LABEL))));
    const rows = lens.layers.map((layerName, l) => el("tr", {},
      el("th", { scope: "row" }, layerName),
      ...names.map((_, t) => {
        const p = lens.probs[l][t][0], top = lens.texts[l][t][0];
        const lines = lens.texts[l][t].map((tok, i) =>
          `${JSON.stringify(tok)}  ${percent(lens.probs[l][t][i])}`);
        const actual = lens.next_prob[l][t];
        if (actual !== null) lines.push(`the prompt's next ${JSON.stringify(names[t + 1])}: ${percent(actual)}`);
        const cell = el("td", { style: `background:${heat(p * 0.75)};color:${p > 0.6 ? "#fff" : "#1b1f24"}`,
          "data-prob": p.toFixed(6), "aria-label": `${layerName}, position ${t}: ${lines.join("; ")}` },
          shortToken(top, LABEL));
        cell.addEventListener("mouseenter", (e) => showTip([`${layerName}, after position ${t}:`, ...lines], e.pageX, e.pageY));
        cell.addEventListener("mouseleave", hideTip);
        return cell;
      })));
    table.setAttribute("aria-label", "Top token of each layer at each position");
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
  }

  function drawPositionStrip() {
    const strip = $("#positions-strip"), names = tokens();
    const pick = (t) => {
      strip.querySelectorAll("button").forEach((b, i) => b.setAttribute("aria-pressed", String(i === t)));
      nextBars($("#next-bars"), data, t);
    };
    strip.replaceChildren(...names.map((n, t) => el("button", {
      type: "button", "aria-pressed": "false", title: `position ${t}`,
      "aria-label": `position ${t}, token ${JSON.stringify(n)}`, onclick: () => pick(t),
    }, shownToken(n))));
    pick(names.length - 1);
  }

  // A small model: everything in one answer. A larger one (its whole context's attention past
  // the server's bound): one layer's attention and the next tokens first, a forward pass, shown
  // at once; then the logit lens, L + 1 products with the whole vocabulary, most of the time.
  let asked = 0;  // the latest analysis: an older one's late answers are dropped
  async function analyse(body) {
    const mine = ++asked;
    request = body;
    setStatus(status, "looking inside…");
    const T = state.shape.context;  // (the prompt's length is known only from the answer)
    const all = L * H * T * (T + 1) / 2 <= maxCells;
    let got;
    try {
      got = await api("/v1/inspect", { ...body, top: TOP,
        ...(all ? {} : { layers: [Number(layerSelect.value)], lens: false }) });
    } catch (e) { if (mine === asked) setStatus(status, e.message, true); return; }
    if (mine !== asked) return;
    data = got;
    attention.clear();
    data.attention.layers.forEach((l, i) => attention.set(l, data.attention.weights[i]));
    const shape = `${data.tokens.length} tokens, ${L} layers × ${H} heads`;
    say(all ? shape : `${shape}; computing the logit lens of ${L + 1} layers…`);
    $("#positions-formula").textContent = `${data.positions.kind}: ${data.positions.formula}`;
    if (!all) $("#logit-lens").replaceChildren();
    await showLayer();
    drawPositionStrip();
    drawPositions($("#positions"), $("#positions-readout"), data);
    if (!all) {
      try {
        const lens = (await api("/v1/inspect", { ...body, top: TOP, layers: [] })).lens;
        if (mine !== asked) return;
        data.lens = lens;
      } catch (e) { if (mine === asked) setStatus(status, e.message, true); return; }
      say(shape);
    }
    drawLens();
  }

  $("#inside-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const last = state.last;
    analyse(last?.messages && text.value === last.text ? { messages: last.messages }
      : { prompt: text.value });
  });
  window.addEventListener("resize", () => { if (data) { drawAttention(); drawPositions($("#positions"), $("#positions-readout"), data); } });

  return {
    show() {  // the last prompt, unless it was analysed already
      const last = state.last;
      if (last && last !== analysedLast) {
        analysedLast = last;
        text.value = last.text;
        analyse(last.messages ? { messages: last.messages } : { prompt: last.prompt });
      } else if (!last && !data) {
        setStatus(status, "Generate from a prompt first, or type one here and Analyse.");
      }
    },
  };
}
