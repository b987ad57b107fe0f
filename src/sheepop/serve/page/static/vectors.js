// Numbers and vectors for the Step and Backprop views: a vector too long to read is summarised
// (size, norm, min, max, its first entries, a strip of its colours) with every entry a click away.
import { diverging, el } from "./common.js";

const FIRST = 8;  // entries shown before "all"

export function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (v === -Infinity) return "−∞";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-4)) return v.toExponential(3).replace("-", "−");
  return (Math.round(v * 1e5) / 1e5).toString().replace("-", "−");
}

export function norm(values) {
  return Math.sqrt(values.reduce((s, v) => s + v * v, 0));
}

// Each entry as a thin column, blue negative, red positive: where a vector is large, at a glance.
function strip(values) {
  const limit = Math.max(...values.map(Math.abs)) || 1;
  const canvas = el("canvas", { class: "strip", "aria-hidden": "true" });
  const width = Math.min(288, Math.max(values.length * 4, 96)), height = 10;
  canvas.width = width; canvas.height = height;
  canvas.style.width = `${width}px`;
  const ctx = canvas.getContext("2d");
  const w = width / values.length;
  values.forEach((v, i) => {
    ctx.fillStyle = diverging(v, limit);
    ctx.fillRect(Math.floor(i * w), 0, Math.max(1, Math.ceil(w)), height);
  });
  return canvas;
}

// One named vector: "name (d = 576)  ‖v‖ = …  min … max …  [first entries …]  all 576".
export function vector(name, values, note = "") {
  const n = values.length;
  const min = Math.min(...values), max = Math.max(...values);
  const head = el("div", { class: "vec-head" },
    el("span", { class: "vec-name" }, name),
    el("span", { class: "vec-stats" },
      `${n} numbers · ‖·‖ = ${fmt(norm(values))} · min ${fmt(min)} · max ${fmt(max)}`),
    note ? el("span", { class: "hint" }, note) : "");
  const node = el("div", { class: "vec", "data-name": name, "data-size": String(n) }, head);
  const short = n <= FIRST * 2;
  const shown = el("code", { class: "vec-values" },
    `[${(short ? values : values.slice(0, FIRST)).map(fmt).join(", ")}${short ? "" : ", …"}]`);
  node.append(strip(values), shown);
  if (!short) {
    const all = el("pre", { class: "vec-all", hidden: "" });
    const button = el("button", { type: "button", class: "more", "aria-expanded": "false" },
      `all ${n}`);
    button.addEventListener("click", () => {
      if (!all.textContent) all.textContent = values.map((v, i) => `${i}: ${fmt(v)}`).join("\n");
      all.hidden = !all.hidden;
      button.setAttribute("aria-expanded", String(!all.hidden));
      button.textContent = all.hidden ? `all ${n}` : "fewer";
    });
    node.append(button, all);
  }
  return node;
}

// A number with its name: "μ = 0.0123".
export function scalar(name, value, note = "") {
  return el("div", { class: "scalar" }, el("span", { class: "vec-name" }, name), ` = ${fmt(value)}`,
    note ? el("span", { class: "hint" }, ` ${note}`) : "");
}

// A step of the docs: a numbered card with its formula (HTML), a link to its page, its numbers.
export function card(number, title, formula, doc, ...children) {
  const link = el("a", { class: "doc", href: `/docs/math/${doc}` }, "the mathematics");
  const f = el("p", { class: "formula" });
  f.innerHTML = formula;  // the page's own constant strings: sub, sup and entities only
  return el("section", { class: "step-card", "data-step": String(number) },
    el("h3", {}, `${number}. ${title} `, link), f, ...children);
}
