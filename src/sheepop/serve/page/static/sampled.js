// The sampled distribution: the model's p next to what the sampler draws from after each of its
// steps, computed here from the position's logits z (all V of them, /v1/inspect's logits_at)
// by the rule of sheepop.generation.generate.next_token, and redrawn as the controls move:
//
//   penalty   z_i <- z_i / theta if z_i > 0 else z_i * theta, for each token already in the text
//   T         softmax(z / T)                                   (T = 0: all of q on the argmax)
//   top-k     keep the k largest, renormalise                  (0: off; ties at the k-th kept)
//   top-p     sort descending, keep the smallest prefix whose mass reaches p, renormalise
//   min-p     keep the tokens with q_i >= m * max q, renormalise      (0: off)
import { $, el, percent, shownToken } from "./common.js";

const ROWS = 12;  // tokens listed: the likeliest after penalty and temperature, and the chosen one

// float32 little-endian in base64 -> Float32Array (never-generated ids arrive as -Infinity).
export function decodeLogits(b64) {
  const raw = atob(b64), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return new Float32Array(bytes.buffer);
}

function softmax(z, scale = 1) {
  let peak = -Infinity;
  for (const v of z) if (v > peak) peak = v;
  const p = new Float64Array(z.length);
  let total = 0;
  for (let i = 0; i < z.length; i++) { p[i] = Math.exp((z[i] - peak) / scale); total += p[i]; }
  for (let i = 0; i < z.length; i++) p[i] /= total;
  return p;
}

function renormalised(p, keep) {
  let total = 0;
  for (let i = 0; i < p.length; i++) if (keep(i)) total += p[i];
  return p.map((v, i) => (keep(i) ? v / total : 0));
}

// Every stage of the sampler on logits z: {p, tempered, topK, topP, q} (Float64Array each).
export function stages(z, seen, { temperature, topK, topP, minP = 0, penalty }) {
  const p = softmax(z);
  const penalised = Float64Array.from(z);
  if (penalty !== 1) for (const i of seen) penalised[i] = z[i] > 0 ? z[i] / penalty : z[i] * penalty;
  let tempered;
  if (temperature <= 0) {  // greedy: the first argmax
    let best = 0;
    for (let i = 1; i < z.length; i++) if (penalised[i] > penalised[best]) best = i;
    tempered = new Float64Array(z.length); tempered[best] = 1;
    return { p, tempered, topK: tempered, topP: tempered, q: tempered };
  }
  tempered = softmax(penalised, temperature);
  let afterK = tempered;
  if (topK > 0 && topK < z.length) {
    const kth = Float64Array.from(tempered).sort()[z.length - topK];
    afterK = renormalised(tempered, (i) => tempered[i] >= kth);
  }
  let afterP = afterK;
  if (topP < 1) {
    const order = [...afterK.keys()].sort((a, b) => afterK[b] - afterK[a] || a - b);
    const keep = new Uint8Array(z.length);
    let before = 0;
    for (const i of order) { if (before < topP) keep[i] = 1; before += afterK[i]; }
    afterP = renormalised(afterK, (i) => keep[i] === 1);
  }
  let q = afterP;
  if (minP > 0) {  // (the likeliest token always stays)
    let peak = 0;
    for (const v of afterP) if (v > peak) peak = v;
    q = renormalised(afterP, (i) => afterP[i] >= minP * peak);
  }
  return { p, tempered, topK: afterK, topP: afterP, q };
}

// The panel: controls, and one row per token with p and each stage side by side.
export function sampledPanel(state) {
  const table = $("#sampled"), summary = $("#sampled-summary");
  const inputs = { temperature: $("#s-temperature"), topK: $("#s-top-k"), topP: $("#s-top-p"),
                   minP: $("#s-min-p"), penalty: $("#s-penalty") };
  let current = null;  // {z, seen, chosen, names, t}

  function settings() {
    return { temperature: Number(inputs.temperature.value), topK: Math.max(0, Math.round(Number(inputs.topK.value))),
             topP: Math.min(1, Math.max(0.01, Number(inputs.topP.value))),
             minP: Math.min(1, Math.max(0, Number(inputs.minP.value) || 0)), penalty: Number(inputs.penalty.value) || 1 };
  }

  function draw() {
    for (const input of Object.values(inputs)) {
      const out = $(`output[for="${input.id}"]`);
      if (out) out.textContent = input.value;
    }
    if (!current) return;
    const { z, seen, chosen, text, t } = current, s = settings();
    const st = stages(z, seen, s);
    let kept = 0, sum = 0;
    for (const v of st.q) { if (v > 0) kept++; sum += v; }
    const order = [...st.tempered.keys()].sort((a, b) => st.tempered[b] - st.tempered[a] || a - b);
    const ids = order.filter((i) => st.p[i] > 0).slice(0, ROWS);  // (not the never-generated)
    if (chosen !== null && !ids.includes(chosen)) ids.push(chosen);
    const cells = (v) => [el("td", { class: "p" }, v > 0 ? percent(v) : "0"),
      el("td", {}, el("span", { class: "bar", style: `width:${Math.max(v > 0 ? 1 : 0, 70 * v)}px` }))];
    const rows = ids.map((i) => el("tr", {
      class: i === chosen ? "chosen" : "", "data-id": String(i), "data-p": st.p[i].toPrecision(9),
      "data-q": st.q[i].toPrecision(9) },
    el("td", {}, shownToken(text(i)) + (i === chosen ? "  ◀ drawn" : "")),
    ...cells(st.p[i]), ...cells(st.tempered[i]), ...cells(st.topK[i]), ...cells(st.topP[i]), ...cells(st.q[i])));
    const head = el("tr", {}, el("th", { scope: "col" }, "token"),
      el("th", { scope: "col", colspan: "2" }, "p: the model"),
      el("th", { scope: "col", colspan: "2" }, s.penalty === 1 ? `softmax(z/${s.temperature})` : `penalty ${s.penalty}, T ${s.temperature}`),
      el("th", { scope: "col", colspan: "2" }, s.topK ? `top-k ${s.topK}` : "top-k off"),
      el("th", { scope: "col", colspan: "2" }, `top-p ${s.topP}`),
      el("th", { scope: "col", colspan: "2" }, s.minP ? `min-p ${s.minP}: q` : "min-p off: q"));
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    summary.dataset.kept = String(kept);
    summary.dataset.sum = sum.toFixed(12);
    summary.dataset.position = String(t);
    const drawn = chosen === null ? "the text ends here: nothing drawn yet"
      : `the text goes on with ${JSON.stringify(text(chosen))}: p = ${percent(st.p[chosen])}, q = ${percent(st.q[chosen])}`;
    summary.textContent = `after position ${t}: q keeps ${kept.toLocaleString("en")} of ${z.length.toLocaleString("en")} ` +
      `tokens (their q sum to ${sum.toFixed(6)}); ${drawn}`;
  }
  for (const input of Object.values(inputs)) input.addEventListener("input", draw);

  return {
    // z: the logits after position t; context: the ids up to t (the repetition penalty's seen).
    show(z, context, chosen, text, t) {
      current = { z, seen: new Set(context), chosen, text, t };
      draw();
    },
    // The Generate view's settings, when the inside view opens.
    follow() {
      inputs.temperature.value = $("#temperature").value;
      inputs.topK.value = $("#top-k").value;
      inputs.topP.value = $("#top-p").value;
      inputs.minP.value = $("#min-p").value;
      draw();
    },
    clear() { current = null; table.replaceChildren(); summary.textContent = ""; },
  };
}
