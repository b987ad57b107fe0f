// The Backprop view: one training step, backwards, on a short text (POST /v1/backward): the loss,
// dZ = (P − Y)/N at the head (one position's row: p minus the one-hot of its target), and the
// norm of every layer's weight gradient, from the NumPy engine's hand-written backward pass.
import { $, api, el, percent, setStatus, shortToken, shownToken } from "./common.js";
import { card, fmt } from "./vectors.js";

const LOSS = "08-loss.md#81-the-loss";
const BACKPROP = "09-backprop.md#92-the-backward-pass-in-order";

function dzTable(data) {
  const rows = data.dz.rows.map((r) => el("tr", { class: r.y ? "actual" : "" },
    el("td", { class: "tok" }, shownToken(r.text)), el("td", { class: "num" }, percent(r.p)),
    el("td", { class: "num" }, String(r.y)),
    el("td", { class: "num" }, fmt(r.p - r.y)),
    el("td", { class: "num dz", "data-value": String(r.dz) }, fmt(r.dz))));
  return el("div", { class: "scroll" }, el("table", { "data-testid": "backward-dz" },
    el("thead", {}, el("tr", {}, ...["token", "p", "y (one-hot)", "p − y", `dZ = (p − y) / ${data.n}`]
      .map((h) => el("th", {}, h)))), el("tbody", {}, ...rows)));
}

const bar = (v, max, width) => el("span", { class: "bar", style: `width:${Math.max(1, width * v / max)}px` });

// One layer's weights, each with the norm of its gradient.
function weightTable(g) {
  const max = Math.max(...g.params.map((p) => p.norm));
  return el("table", { "data-testid": "backward-weights-table", "aria-label": `${g.layer}: each weight's gradient` },
    el("caption", { class: "hint" }, `${g.layer}: each weight's ‖dL/dW‖` + (g.layer.startsWith("block") ? " (the weights' names count blocks from 0)" : "")),
    el("tbody", {}, ...g.params.map((p) => el("tr", { "data-name": p.name, "data-norm": String(p.norm) },
      el("td", { class: "tok" }, p.name), el("td", {}, p.shape.join(" × ")),
      el("td", { class: "num" }, fmt(p.norm)), el("td", {}, bar(p.norm, max, 120))))));
}

// Each layer's gradient norm (its weights together); a row opens its weights below.
function gradientTable(data, open) {
  const max = Math.max(...data.layers.map((g) => g.norm));
  const weights = el("div", { id: "backward-weights" });
  const rows = data.layers.map((g) => {
    const row = el("tr", { tabindex: "0", "data-layer": g.layer, "data-norm": String(g.norm),
      title: "show this layer's weights" },
    el("td", {}, g.layer), el("td", { class: "num" }, fmt(g.norm)), el("td", {}, bar(g.norm, max, 200)));
    const pick = () => {
      for (const r of rows) r.classList.toggle("open", r === row);
      weights.replaceChildren(weightTable(g));
      open.layer = g.layer;
    };
    row.addEventListener("click", pick);
    row.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(); } });
    row.pick = pick;
    return row;
  });
  (rows.find((r) => r.dataset.layer === open.layer) || rows[1] || rows[0]).pick();
  return el("div", { class: "side-by-side" }, el("div", { class: "scroll" }, el("table", { "data-testid": "backward-grads", class: "norms" },
    el("thead", {}, el("tr", {}, ...["weights", "‖dL/dW‖", ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows))), el("div", { class: "scroll sticky" }, weights));
}

export function backwardView(state) {
  const root = $("#backward");
  const text = el("textarea", { id: "backward-prompt", rows: "2", spellcheck: "false" });
  const strip = el("div", { id: "backward-tokens", role: "group", "aria-label": "Position" });
  const status = el("p", { class: "status", role: "status", id: "backward-status" });
  const out = el("div", { id: "backward-steps" });
  root.append(
    el("p", { class: "hint" }, "One training step, backwards: the loss of a short text, the gradient at the head, and how large each layer's weight gradient is. These are the NumPy engine's hand-written derivatives (gpt_backward); torch's autograd on the same weights gives the same numbers (to 1e-5 relative, checked by tests/arch/test_trace.py). Nothing is updated: the served model is left as it is."),
    el("form", { id: "backward-form" }, el("label", { for: "backward-prompt" }, "Text (2 to 128 tokens)"), text,
      el("div", { class: "buttons" }, el("button", { type: "submit", "data-testid": "backward-run" }, "Step backwards"))),
    strip, status, out);
  let data = null, position = null, asked = 0, seenLast = null;
  const open = { layer: null };  // the layer whose weights are listed

  async function run() {
    const mine = ++asked;
    setStatus(status, "forward and backward…");
    try {
      const got = await api("/v1/backward", { prompt: text.value, ...(position === null ? {} : { position }) });
      if (mine !== asked) return;
      data = got;
      position = data.position;
      setStatus(status, `${data.tokens.length} tokens, ${data.n} predicted; computed in ${data.seconds.toFixed(3)} s`);
      draw();
    } catch (e) { if (mine === asked) setStatus(status, e.message, true); }
  }

  function draw() {
    const t = position, names = data.tokens.map((x) => x.text);
    strip.replaceChildren(...names.slice(0, -1).map((n, i) => {
      const b = el("button", { type: "button", "data-testid": "backward-token", "aria-pressed": String(i === t),
        title: `position ${i}: ${JSON.stringify(n)} predicts ${JSON.stringify(names[i + 1])}` }, shortToken(n, 8));
      b.addEventListener("click", () => { position = i; run(); });
      return b;
    }));
    out.replaceChildren(
      card(1, "The loss",
        `L = (1/N) Σ<sub>t</sub> −log p<sub>t</sub>[y<sub>t</sub>] , y<sub>t</sub> = x<sub>t+1</sub> , N = ${data.n} targets`,
        LOSS, el("p", { "data-testid": "backward-loss", "data-loss": String(data.loss) },
          `L = ${fmt(data.loss)} nats (perplexity e^L = ${fmt(data.perplexity)}). At position ${t}, `,
          el("b", {}, shownToken(names[t])), ` predicts `, el("b", {}, shownToken(data.target.text)),
          ` with p = ${percent(data.target.p)}: its share of L is −log p / N = ${fmt(-Math.log(data.target.p) / data.n)}.`)),
      card(2, `The gradient at the head, row ${t}`,
        `dZ = (P − Y) / N : row t is p<sub>t</sub> minus the one-hot of y<sub>t</sub>, divided by N = ${data.n}. It sums to 0 (${fmt(data.dz.sum)}); ‖dZ<sub>t</sub>‖ = ${fmt(data.dz.norm)} over the ${data.dz.size}-token vocabulary`,
        BACKPROP, el("p", { class: "hint" }, "The target's entry is negative (raise its logit), every other is positive (lower it), in proportion to p. Below: the target and the likeliest tokens."),
        dzTable(data)),
      card(3, "Every layer's weight gradient",
        `dW = ∂L/∂W by the chain rule, from dZ back to the embedding (head, final norm, blocks ${data.layers.length - 2} … 1, embedding)${data.tied ? "; the head is tied to E, so the embedding's gradient holds the head's dW too" : ""}. Total ‖∇‖ = ${fmt(data.total_norm)}`,
        BACKPROP, el("p", { class: "hint" }, "Each row: the norm of the gradients of that layer's weights together; click a row (or Enter) for each of its weights."),
        gradientTable(data, open)),
    );
  }

  $("#backward-form", root).addEventListener("submit", (e) => { e.preventDefault(); position = null; run(); });
  return {
    show() {
      const last = state.last;
      let fresh = false;
      if (last && last !== seenLast) {  // the last prompt (a chat's: its last message)
        seenLast = last;
        fresh = text.value !== last.text;
        text.value = last.text;
      }
      if (!text.value) text.value = "The capital of France is Paris.";
      if (!data || fresh) { position = null; run(); }
    },
  };
}
