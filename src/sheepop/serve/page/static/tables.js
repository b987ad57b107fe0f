// The inside view's smaller pictures: the next-token bars at one position and the positional
// encoding's heatmap.
import { $, diverging, el, hideTip, percent, showTip, shownToken, sizeCanvas } from "./common.js";

// p(. | x_<=t): the top tokens at position t as bars, and the prompt's own next token.
export function nextBars(node, data, t) {
  const next = data.next, names = data.tokens.map((x) => x.text);
  const actual = t + 1 < names.length ? names[t + 1] : null;
  const rows = next.texts[t].map((tok, i) => {
    const p = next.probs[t][i];
    return el("tr", { class: tok === actual ? "actual" : "" },
      el("td", {}, shownToken(tok)), el("td", {}, percent(p)),
      el("td", {}, el("span", { class: "bar", style: `width:${Math.max(1, 160 * p)}px` })));
  });
  const p = next.next_prob[t];
  const loss = p > 0 ? `loss -ln p = ${(-Math.log(p)).toFixed(4)}` : "never generated (padding, BOS or unknown: p = 0)";
  const caption = `after position ${t} (${JSON.stringify(names[t])})` + (actual === null
    ? ": the model's next token" : `; the text goes on with ${JSON.stringify(actual)}, ` +
      `p = ${percent(p)}, ${loss}`) + (next.entropy ? `; entropy ${next.entropy[t].toFixed(3)} nats` : "");
  node.replaceChildren(el("p", { class: "readout" }, caption),
    el("table", { "aria-label": caption }, el("tbody", {}, ...rows)));
}

// Positions x columns: the rows P[t] added to the embeddings (blue negative, red positive), or
// RoPE's angles t * omega_i shown as cos(angle).
export function drawPositions(canvas, readout, data) {
  const pos = data.positions, values = pos.values, T = values.length;
  const C = T ? values[0].length : 0;
  if (!C) return;
  const rope = pos.kind === "rope";
  let limit = 0;
  for (const row of values) for (const v of row) limit = Math.max(limit, Math.abs(v));
  const room = Math.min(canvas.parentElement.clientWidth - 4, 620);
  const cw = Math.max(2, Math.min(16, Math.floor(room / C)));
  const ch = Math.max(2, Math.min(16, Math.floor(360 / T)));
  const ctx = sizeCanvas(canvas, cw * C, ch * T);
  for (let t = 0; t < T; t++) {
    for (let c = 0; c < C; c++) {
      ctx.fillStyle = rope ? diverging(Math.cos(values[t][c]), 1) : diverging(values[t][c], limit);
      ctx.fillRect(c * cw, t * ch, cw, ch);
    }
  }
  const describe = (t, c) => rope
    ? `position ${t}, pair ${c}: angle ${values[t][c].toFixed(6)} rad, cos ${Math.cos(values[t][c]).toFixed(6)}`
    : `position ${t}, column ${c}: P = ${values[t][c].toFixed(7)}`;
  const shown = C < pos.columns ? ` (the first ${C} of ${pos.columns} columns)` : "";
  readout.textContent = `${T} positions (rows, t from 0 down) × ${C} ${rope ? "pairs i" : "columns i"}` +
    `${shown}; hover a cell`;
  const top = rope ? 1 : limit, fmt = (v) => String(+v.toPrecision(3));
  $("#positions-legend").replaceChildren(
    el("span", {}, `${rope ? "cos(angle)" : "P[t, i]"} = ${fmt(-top)}`),
    el("span", { class: "scale", style: `background:linear-gradient(to right, ${diverging(-1, 1)}, #fff, ${diverging(1, 1)})` },
      ...[-1, 0, 1].map((v) => el("span", { class: "tick", style: `left:${50 + 50 * v}%` }, fmt(v * top)))),
    el("span", {}, fmt(top)));
  canvas.onmousemove = (e) => {
    const box = canvas.getBoundingClientRect();
    const c = Math.floor((e.clientX - box.left) / cw), t = Math.floor((e.clientY - box.top) / ch);
    if (t < 0 || c < 0 || t >= T || c >= C) { hideTip(); return; }
    readout.textContent = describe(t, c);
    showTip([describe(t, c)], e.pageX, e.pageY);
  };
  canvas.onmouseleave = hideTip;
  let at = { t: 0, c: 0 };
  canvas.onkeydown = (e) => {
    const move = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] }[e.key];
    if (!move) return;
    e.preventDefault();
    at = { t: Math.max(0, Math.min(T - 1, at.t + move[0])), c: Math.max(0, Math.min(C - 1, at.c + move[1])) };
    readout.textContent = describe(at.t, at.c);
  };
}
