// The attention panel: every head of one layer at once as small heatmaps, one of them enlarged
// with its tokens as labels, and the colour scale they share. A = softmax(QK^T/sqrt(d_k) + M):
// row q (a query) over columns k (the keys), white 0 .. dark blue 1, grey above the diagonal
// (masked: the future). Every weight is read on hover, with the arrow keys, or by a click.
import { $, el, heat, hideTip, showTip, shortToken } from "./common.js";

const LABEL = 8;       // characters of a token in the labels (all of it on hover)
const MIN_CELL = 8;    // the enlarged head's cells, at least, so that each token has its label
const MAX_SIDE = 4000; // past this many pixels a side, cells shrink and every n-th token is labelled
const MASKED = [233, 236, 239];

function heatRGB(v) {  // the same colour as heat(v), as numbers
  const t = Math.max(0, Math.min(1, v));
  return [Math.round(255 - t * 247), Math.round(255 - t * 207), Math.round(255 - t * 148)];
}

// One head's weights (T rows of t+1 numbers) as a T x T image, drawn scaled onto `canvas`.
function drawSmall(canvas, weights, side) {
  const T = weights.length, image = new ImageData(T, T);
  for (let q = 0; q < T; q++) {
    for (let k = 0; k < T; k++) {
      const [r, g, b] = k <= q ? heatRGB(weights[q][k]) : MASKED, at = 4 * (q * T + k);
      image.data[at] = r; image.data[at + 1] = g; image.data[at + 2] = b; image.data[at + 3] = 255;
    }
  }
  const source = document.createElement("canvas");
  source.width = T; source.height = T;
  source.getContext("2d").putImageData(image, 0, 0);
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(side * ratio); canvas.height = Math.round(side * ratio);
  canvas.style.width = `${side}px`; canvas.style.height = `${side}px`;
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(source, 0, 0, canvas.width, canvas.height);
}

export function attentionPanel(H) {
  const canvas = $("#attention"), readout = $("#attention-readout"), grid = $("#heads");
  const layerSelect = $("#layer"), headSelect = $("#head");
  let names = [], weightsOf = () => null, cursor = null, geometry = null;

  $("#attention-legend").replaceChildren(
    el("span", {}, "A = 0"),
    el("span", { class: "scale", style: `background:linear-gradient(to right, ${heat(0)}, ${heat(1)})` },
      ...[0, 0.25, 0.5, 0.75, 1].map((v) => el("span", { class: "tick", style: `left:${100 * v}%` }, String(v)))),
    el("span", {}, "1"),
    el("span", { class: "swatch", style: `background:rgb(${MASKED})` }), el("span", {}, "masked (a later key)"));

  function drawHeads() {
    const layer = Number(layerSelect.value), all = weightsOf(layer);
    if (!all) return;
    // As many columns as fit at about 110 px (all 9 of SmolLM2's on a desktop, 3 x 3 on a phone).
    const room = grid.clientWidth || 300;
    const cols = Math.max(1, Math.min(H, Math.floor(room / 110)));
    const side = Math.max(48, Math.min(150, Math.floor((room - 8 * (cols - 1)) / cols) - 10));
    grid.style.gridTemplateColumns = `repeat(${cols}, ${side + 10}px)`;
    grid.replaceChildren(...all.map((w, h) => {
      const small = el("canvas", { role: "img", "aria-label": `head ${h + 1}` });
      drawSmall(small, w, side);
      return el("button", { type: "button", class: "head", "data-testid": "head-thumb", "data-head": String(h),
        "aria-pressed": String(h === Number(headSelect.value)), title: `layer ${layer + 1}, head ${h + 1}: enlarge`,
        onclick: () => { headSelect.value = String(h); drawAll(); } },
      small, el("span", {}, `head ${h + 1}`));
    }));
  }

  function drawAttention() {
    const layer = Number(layerSelect.value), head = Number(headSelect.value);
    canvas.dataset.layer = String(layer);
    canvas.dataset.head = String(head);
    const weights = weightsOf(layer)?.[head];
    if (!weights) return;
    const T = weights.length, labels = names.map((n) => shortToken(n, LABEL));
    const room = Math.max(200, Math.min(canvas.parentElement.clientWidth - 4, 760));
    const ctx = canvas.getContext("2d");
    // Cells of MIN_CELL px at least, so every token keeps its label (the box scrolls sideways);
    // past MAX_SIDE px they shrink, and every `every`-th token is labelled.
    let cell = Math.max(MIN_CELL, Math.min(28, Math.floor((room - 40) / T)));
    if (cell * T > MAX_SIDE) cell = Math.max(1, Math.floor(MAX_SIDE / T));
    const every = Math.ceil(MIN_CELL / cell);
    const font = `${Math.min(12, Math.max(MIN_CELL, cell) - 1)}px ui-monospace, monospace`;
    ctx.font = font;
    const margin = Math.max(34, Math.ceil(Math.max(...labels.map((n) => ctx.measureText(n).width))) + 8);
    const size = margin + cell * T;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(size * ratio); canvas.height = Math.round(size * ratio);
    canvas.style.width = `${size}px`; canvas.style.height = `${size}px`;
    canvas.dataset.margin = String(margin); canvas.dataset.cell = String(cell);
    canvas.dataset.labelEvery = String(every);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, size, size);
    for (let q = 0; q < T; q++) {
      for (let k = 0; k < T; k++) {
        ctx.fillStyle = k <= q ? heat(weights[q][k]) : `rgb(${MASKED})`;
        ctx.fillRect(margin + k * cell, margin + q * cell, cell, cell);
      }
    }
    // Token labels: queries down the side, keys along the top (read upwards when wider than a
    // column).
    ctx.fillStyle = "#1b1f24"; ctx.font = font; ctx.textBaseline = "middle"; ctx.textAlign = "right";
    const shown = labels.map((n, i) => (i % every === 0 ? n : null));
    shown.forEach((n, i) => n !== null && ctx.fillText(n, margin - 4, margin + (i + 0.5) * cell));
    const upright = labels.every((n) => ctx.measureText(n).width <= cell * every - 1);
    ctx.textAlign = upright ? "center" : "left";
    shown.forEach((n, i) => {
      if (n === null) return;
      ctx.save();
      ctx.translate(margin + (i + 0.5) * cell, upright ? margin / 2 : margin - 4);
      if (!upright) ctx.rotate(-Math.PI / 2);
      ctx.fillText(n, 0, 0);
      ctx.restore();
    });
    if (cursor) {
      ctx.strokeStyle = "#e36209"; ctx.lineWidth = 2;
      ctx.strokeRect(margin + cursor.k * cell + 1, margin + cursor.q * cell + 1, Math.max(1, cell - 2), Math.max(1, cell - 2));
    }
    geometry = { margin, cell, T };
    $("#attention-caption").textContent = `layer ${layer + 1}, head ${head + 1} of ${H}, enlarged: ` +
      `${T} queries × ${T} keys` + (every > 1 ? `, every ${every}th token labelled` : "");
  }

  function drawAll() {
    drawHeads();
    drawAttention();
  }

  function describeCell(q, k) {
    const layer = Number(layerSelect.value), head = Number(headSelect.value);
    const w = weightsOf(layer)[head][q][k];
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
  headSelect.addEventListener("change", drawAll);

  return {
    // tokens: the analysed tokens' texts; weights(layer): (H, T, rows) or null while unread.
    show(tokens, weights) { names = tokens; weightsOf = weights; cursor = null; drawAll(); },
    draw: drawAll,
  };
}
