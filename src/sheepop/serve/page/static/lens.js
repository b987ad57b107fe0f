// The logit lens: each layer's residual stream h_l read through the final norm and the head,
// p_l = softmax(Norm_f(h_l) W_head^T). A table (layers x positions, the top token of each, a ✓
// where it is the text's actual next token) and, at the picked position, a chart by layer of
// how likely and how highly ranked the actual next token is, the entropy H(p_l) and the
// divergence KL(p_L || p_l) from the model's final distribution.
import { $, el, heat, hideTip, percent, showTip, shortToken } from "./common.js";
import { drawChart } from "./chart.js";

const LABEL = 8;

export function drawLens(data, names) {
  const table = $("#logit-lens"), lens = data.lens;
  const head = el("tr", {}, el("th", { scope: "col" }, "layer \\ position"),
    ...names.map((n, t) => el("th", { scope: "col", title: `position ${t}: ${JSON.stringify(n)}` },
      shortToken(n, LABEL))));
  const actualIds = data.tokens.map((x) => x.id).slice(1);
  let hits = 0;
  const rows = lens.layers.map((layerName, l) => el("tr", {},
    el("th", { scope: "row" }, layerName),
    ...names.map((_, t) => {
      const p = lens.probs[l][t][0], top = lens.texts[l][t][0];
      const hit = t < actualIds.length && lens.ids[l][t][0] === actualIds[t];
      hits += hit ? 1 : 0;
      const lines = lens.texts[l][t].map((tok, i) => `${JSON.stringify(tok)}  ${percent(lens.probs[l][t][i])}`);
      const actual = lens.next_prob[l][t];
      if (actual !== null) {
        lines.push(`the text's next ${JSON.stringify(names[t + 1])}: p = ${percent(actual)}, rank ${lens.rank[l][t]}` +
                   (hit ? " (the top token: right)" : ""));
      }
      lines.push(`entropy ${lens.entropy[l][t].toFixed(3)} nats, KL to the final ${lens.kl[l][t].toFixed(3)} nats`);
      const cell = el("td", {
        class: hit ? "hit" : "", style: `background:${heat(p * 0.75)};color:${p > 0.6 ? "#fff" : "#1b1f24"}`,
        "data-prob": p.toFixed(6), "data-hit": hit ? "1" : "0",
        "aria-label": `${layerName}, position ${t}: ${lines.join("; ")}` },
      (hit ? "✓" : "") + shortToken(top, LABEL));
      cell.addEventListener("mouseenter", (e) => showTip([`${layerName}, after position ${t}:`, ...lines], e.pageX, e.pageY));
      cell.addEventListener("mouseleave", hideTip);
      return cell;
    })));
  table.setAttribute("aria-label", "Top token of each layer at each position; ✓: the text's actual next token");
  table.dataset.hits = String(hits);
  table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
}

// The chart of one position t, by layer (0: the embedding).
export function drawLensChart(data, names, t) {
  const lens = data.lens, readout = $("#lens-readout");
  const layers = lens.layers.map((_, l) => l);
  const name = (l) => lens.layers[l];
  const nats = [
    { name: "entropy H(p_l)", color: "#6639ba", dots: true, points: layers.map((l) => [l, lens.entropy[l][t]]),
      describe: ([l, v]) => `${name(l)}: entropy ${v.toFixed(4)} nats` },
    { name: "KL(p_L || p_l)", color: "#e36209", dots: true, points: layers.map((l) => [l, lens.kl[l][t]]),
      describe: ([l, v]) => `${name(l)}: KL to the final distribution ${v.toFixed(4)} nats` },
  ];
  // log(1 + nats): the embedding's KL (~100 nats on SmolLM2) would flatten every later layer's
  drawChart($("#lens-nats"), readout, nats,
    { xLabel: "layer (0: embedding)", yLabel: "nats (log scale)", height: 200, yScale: "log1p" });
  const actual = t + 1 < names.length;
  const next = actual ? [{
    name: `p_l(${JSON.stringify(names[t + 1])})`, color: "#0b5cad", dots: true,
    points: layers.map((l) => [l, lens.next_prob[l][t]]),
    describe: ([l, v]) => `${name(l)}: p(${JSON.stringify(names[t + 1])}) = ${percent(v)}, rank ${lens.rank[l][t]}`,
  }] : [];
  drawChart($("#lens-next"), readout, next, { xLabel: "layer (0: embedding)", yLabel: "p of the next token", height: 200 });
  const ranks = actual ? layers.map((l) => `${l}:${lens.rank[l][t]}`).join(" ") : "";
  $("#lens-chart-caption").textContent = actual
    ? `After position ${t} ${JSON.stringify(names[t])} the text goes on with ${JSON.stringify(names[t + 1])}; ` +
      `its rank by layer (1: the top token): ${ranks}`
    : `Position ${t} is the last: nothing follows it in the text, so only the entropy and the KL are drawn. Pick another position above.`;
}
