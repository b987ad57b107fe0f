// The Patching view: activation patching on the served model (POST /v1/patch). Two prompts of
// one length in tokens, a clean and a corrupted one, and two tokens; the metric of a pass is
// m = z[answer] − z[wrong] at the last position. Each cell of the grid is one corrupted pass with
// one value moved in from the clean pass, scored (m − m*) / (m_c − m*): 1 is the clean run, 0
// the corrupted one. Beside it, the attribution estimate of every cell from one backward pass,
// (a − a*) · ∂m/∂a, and how well the two agree (Pearson's r over the cells); below, each part's
// direct share of m (shares.js).
import { $, api, diverging, el, hideTip, setStatus, shortToken, showTip } from "./common.js";
import { sharesPanel } from "./shares.js";

const DOC = "/docs/experiments.md";
const LABEL = 6;  // characters of a token in a column's label (all of it on hover)

// A score in a cell: three decimals, no "−0.000".
function short(v) {
  return Math.abs(v) < 5e-4 ? "0.000" : v.toFixed(3).replace("-", "−");
}

// Pearson's r of two equally long lists (null where either is constant).
export function pearson(xs, ys) {
  const n = xs.length, mx = xs.reduce((s, v) => s + v, 0) / n, my = ys.reduce((s, v) => s + v, 0) / n;
  let sxy = 0, sxx = 0, syy = 0;
  for (let i = 0; i < n; i++) {
    const dx = xs[i] - mx, dy = ys[i] - my;
    sxy += dx * dy; sxx += dx * dx; syy += dy * dy;
  }
  return sxx > 0 && syy > 0 ? sxy / Math.sqrt(sxx * syy) : null;
}

// "12-29", "0, 3, 5", "" (every block) -> a sorted list of block indices, or null when unreadable.
export function blocksOf(text, n) {
  const out = new Set();
  for (const part of text.split(",").map((s) => s.trim()).filter(Boolean)) {
    const m = part.match(/^(\d+)(?:\s*-\s*(\d+))?$/);
    if (!m) return null;
    const a = Number(m[1]), b = m[2] === undefined ? a : Number(m[2]);
    if (b < a || b >= n) return null;
    for (let l = a; l <= b; l++) out.add(l);
  }
  return out.size ? [...out].sort((x, y) => x - y) : [...Array(n).keys()];
}

function legend() {
  const stops = [-1, -0.5, 0, 0.5, 1].map((v) => diverging(v, 1)).join(", ");
  return el("div", { class: "legend", "aria-label": "Colour scale: the score" },
    el("span", {}, "score"),
    el("span", { class: "scale", style: `background:linear-gradient(to right, ${stops})` },
      ...[[-1, "−1"], [0, "0"], [1, "1"]].map(([v, t]) =>
        el("span", { class: "tick", style: `left:${50 + 50 * v}%` }, t))),
    el("span", {}, "0: the corrupted run, 1: the clean run; past ±1 the colour stays"));
}

export function patchView(state) {
  const root = $("#patch");
  const field = (id, label, value, attrs = {}) => el("label", {}, label,
    el("input", { id, "data-testid": id, type: "text", value, spellcheck: "false", ...attrs }));
  const kind = el("select", { id: "patch-kind", "data-testid": "patch-kind" },
    el("option", { value: "positions" }, "layers × positions (block l's output at t)"),
    el("option", { value: "heads" }, "layers × heads (head h's output)"));
  const estimate = el("input", { id: "patch-estimate", type: "checkbox", checked: "" });
  const direct = el("input", { id: "patch-shares", type: "checkbox", checked: "" });
  const form = el("form", { id: "patch-form" },
    field("patch-clean", "Clean prompt", "The capital of France is", { class: "prompt" }),
    field("patch-corrupted", "Corrupted prompt", "The capital of Italy is", { class: "prompt" }),
    el("p", { class: "hint" }, "The two prompts must be the same number of tokens long (a cell moves the value at one position from one pass into the other); the server says which is not."),
    el("div", { class: "controls" },
      field("patch-answer", "Answer", " Paris", { size: "8", title: "one token: its logit counts for m" }),
      field("patch-wrong", "Wrong", " Rome", { size: "8", title: "one token: its logit counts against m" }),
      el("label", {}, "Grid ", kind),
      field("patch-position", "Position", "", { size: "4", placeholder: "every", title: "heads only: patch each head at this position alone (blank: at every position)" }),
      field("patch-blocks", "Blocks", "", { size: "6", placeholder: "every", title: "e.g. 12-29 or 0, 3, 5 (blank: every block)" }),
      el("label", { title: "the attribution estimate: one forward and one backward pass more" }, estimate, "with the estimate"),
      el("label", { title: "each part's share of m on each prompt: four forward passes more" }, direct, "with the direct logit attribution")),
    el("div", { class: "buttons" }, el("button", { type: "submit", "data-testid": "patch-run" }, "Patch")));
  const status = el("p", { id: "patch-status", "data-testid": "patch-status", class: "status", role: "status" });
  const metric = el("p", { id: "patch-metric", "data-testid": "patch-metric", class: "readout" });
  const agreement = el("p", { id: "patch-agreement", "data-testid": "patch-agreement", class: "readout" });
  const grids = el("div", { id: "patch-grids", class: "patch-grids" });
  const readout = el("p", { id: "patch-readout", "data-testid": "patch-readout", class: "readout", "aria-live": "polite" });
  const shares = sharesPanel();
  root.append(
    el("p", { class: "hint" }, "Change one value of a forward pass and see what follows. The model runs the corrupted prompt once per cell, with one value (a block's output at one position, or one head's output) taken from the clean prompt's pass instead, and scores how much of the difference between the two runs that value brings along. Blocks and heads are counted from 0, as the hook points' names (blocks.l.resid_out, blocks.l.attn.heads)."),
    form,
    el("h2", {}, "The metric and the score ", el("a", { class: "doc", href: `${DOC}#activation-patching` }, "activation and attribution patching")),
    el("p", { class: "formula" }, "m = z[answer] − z[wrong] (the logits at the last position) ,  score = (m − m*) / (m", el("sub", {}, "c"), " − m*)"),
    el("p", { class: "hint" }, "m", el("sub", {}, "c"), ": the clean run's m; m*: the corrupted run's; m: the corrupted run with the cell's value a moved in from the clean run. The estimate replaces each cell's pass by the first-order change from the corrupted run, read from one backward pass: m − m* ≈ (a − a*) · ∂m/∂a, the gradient taken at a*, the corrupted value."),
    status, metric, legend(), grids, agreement, readout, shares.root);

  let data = null, asked = 0;

  function describe(i, j) {
    const layer = data.layers[i], col = data.columns[j];
    let where;
    if (data.kind === "positions") {
      const c = data.clean[col].text, x = data.corrupted[col].text;
      where = `block ${layer}, position ${col} ${JSON.stringify(c)}` + (c === x ? "" : ` (corrupted: ${JSON.stringify(x)})`);
    } else {
      where = `block ${layer}, head ${col}` + (data.position === null ? " (every position)" : ` at position ${data.position}`);
    }
    const lines = [where, `exact score ${data.scores[i][j]} (m = ${data.metric[i][j]})`];
    if (data.attribution) {
      const a = data.attribution;
      lines.push(`estimated score ${a.scores[i][j]} (m ≈ ${a.metric[i][j]})`);
    }
    return lines;
  }

  function read(i, j, event) {
    const lines = describe(i, j);
    readout.textContent = lines.join("; ");
    Object.assign(readout.dataset, { layer: String(data.layers[i]), column: String(data.columns[j]) });
    for (const td of grids.querySelectorAll("td.at")) td.classList.remove("at");
    for (const td of grids.querySelectorAll(`td[data-row="${i}"][data-col="${j}"]`)) td.classList.add("at");
    if (event) showTip(lines, event.pageX, event.pageY);
  }

  function table(testid, title, scores) {
    const names = data.clean.map((x) => x.text);
    const header = data.kind === "positions"
      ? data.columns.map((t) => {
        const changed = names[t] !== data.corrupted[t].text;
        return el("th", { scope: "col", class: changed ? "changed" : "",
          title: `position ${t}: ${JSON.stringify(names[t])}` + (changed ? ` / ${JSON.stringify(data.corrupted[t].text)}` : "") },
        shortToken(names[t], LABEL));
      })
      : data.columns.map((h) => el("th", { scope: "col" }, `head ${h}`));
    const rows = data.layers.map((layer, i) => el("tr", {}, el("th", { scope: "row" }, `block ${layer}`),
      ...scores[i].map((v, j) => {
        const td = el("td", { "data-row": String(i), "data-col": String(j), "data-score": String(v),
          style: `background:${diverging(v, 1)};color:${Math.abs(v) > 0.7 ? "#fff" : "#1b1f24"}` }, short(v));
        td.addEventListener("mouseenter", (e) => read(i, j, e));
        td.addEventListener("mouseleave", hideTip);
        return td;
      })));
    const grid = el("table", { "data-testid": testid, class: "patch-grid", tabindex: "0",
      "aria-label": `${title}: the arrow keys read its cells` },
    el("caption", {}, title), el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "block \\ " + (data.kind === "positions" ? "position" : "head")), ...header)),
    el("tbody", {}, ...rows));
    let cursor = null;
    grid.addEventListener("keydown", (e) => {
      const move = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] }[e.key];
      if (!move) return;
      e.preventDefault();
      const last = [data.layers.length - 1, data.columns.length - 1];
      cursor = cursor ? [0, 1].map((k) => Math.max(0, Math.min(last[k], cursor[k] + move[k]))) : last;
      read(cursor[0], cursor[1]);
    });
    return el("div", { class: "scroll" }, grid);
  }

  function draw() {
    const pairs = [], cells = data.scores.length * data.columns.length;
    Object.assign(metric.dataset, { clean: String(data.clean_metric), corrupted: String(data.corrupted_metric) });
    metric.textContent = `m_c = ${data.clean_metric.toFixed(4)} (clean), m* = ${data.corrupted_metric.toFixed(4)} (corrupted): ` +
      `z[${JSON.stringify(data.answer.text)}] − z[${JSON.stringify(data.wrong.text)}] after ` +
      `${data.clean.length} tokens; ${cells} patched passes for the exact grid` +
      (data.attribution ? ", two passes and one backward pass for the estimate" : "");
    const tables = [table("patch-exact", "Exact: one patched pass a cell", data.scores)];
    if (data.attribution) {
      tables.push(table("patch-estimated", "Estimate: (a − a*) · ∂m/∂a", data.attribution.scores));
      data.scores.forEach((row, i) => row.forEach((v, j) => pairs.push([v, data.attribution.scores[i][j]])));
      const r = pearson(pairs.map((p) => p[0]), pairs.map((p) => p[1]));
      let worst = 0, at = [0, 0];
      data.scores.forEach((row, i) => row.forEach((v, j) => {
        const d = Math.abs(v - data.attribution.scores[i][j]);
        if (d > worst) { worst = d; at = [i, j]; }
      }));
      agreement.dataset.r = r === null ? "" : String(r);
      agreement.textContent = `Agreement of the estimate with the exact grid: r = ${r === null ? "– (a constant grid)" : r.toFixed(4)} ` +
        `(Pearson, over the ${cells} cells); largest difference ${worst.toFixed(4)}, at ${describe(...at)[0]}`;
    } else {
      agreement.dataset.r = "";
      agreement.textContent = "No estimate asked.";
    }
    grids.replaceChildren(...tables);
    readout.textContent = "Hover a cell (or focus a grid and use the arrow keys) for its numbers.";
  }

  async function run() {
    const layers = blocksOf($("#patch-blocks").value, state.shape.n_layer);
    if (layers === null) {
      setStatus(status, `Blocks: give indices 0 to ${state.shape.n_layer - 1}, as 12-29 or 0, 3, 5 (blank: every block)`, true);
      return;
    }
    const body = { clean: $("#patch-clean").value, corrupted: $("#patch-corrupted").value,
      answer: $("#patch-answer").value, wrong: $("#patch-wrong").value, kind: kind.value, layers,
      attribution: estimate.checked, logit_attribution: direct.checked };
    const position = $("#patch-position").value.trim();
    if (kind.value === "heads" && position !== "") body.position = Number(position);
    const mine = ++asked;
    setStatus(status, "patching: one forward pass a cell…");
    try {
      const got = await api("/v1/patch", body);
      if (mine !== asked) return;
      data = got;
      setStatus(status, `computed in ${data.seconds.toFixed(3)} s`);
      draw();
      shares.show(data);
    } catch (e) {
      if (mine === asked) setStatus(status, e.message, true);
    }
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); run(); });
  // Each grid is many forward passes: the view computes only when asked.
  return { show() {} };
}
