// Direct logit attribution in the Patching view: each part's share of m = z[answer] − z[wrong] at
// the last position, as one bar per part (the embedding, then each block's heads, its attention
// bias, its feed-forward; the final norm's β and the head's bias), from /v1/patch's
// `logit_attribution`. The stream leaving the last block is the sum of what each part wrote;
// with the final norm's scale s frozen at that stream's own, m splits into
// share(c) = s (c − mean(c)) · (γ ⊙ (W_head[answer] − W_head[wrong])) (RMSNorm: c itself).
import { el, hideTip, showTip, sizeCanvas } from "./common.js";

const HEIGHT = 180, LEFT = 52, BOTTOM = 22, TOP = 8;
const COLOUR = { head: "#0b5cad", ffn: "#e36209", other: "#8c959f" };

// "blocks.3.attn.head.2" -> { text: "head 3.2", kind: "head", block: 3 }, and the others.
export function partOf(name) {
  let m = name.match(/^blocks\.(\d+)\.attn\.head\.(\d+)$/);
  if (m) return { text: `head ${m[1]}.${m[2]}`, kind: "head", block: Number(m[1]) };
  m = name.match(/^blocks\.(\d+)\.(attn\.bias|ffn)$/);
  if (m) {
    return { text: m[2] === "ffn" ? `block ${m[1]}'s feed-forward` : `block ${m[1]}'s attention bias b_proj`,
      kind: m[2] === "ffn" ? "ffn" : "other", block: Number(m[1]) };
  }
  const text = { embed: "the embedding", "final_norm.bias": "the final norm's β", "head.bias": "the head's bias" }[name];
  return { text: text || name, kind: "other", block: null };
}

const signed = (v) => (v >= 0 ? "+" : "−") + Math.abs(v).toFixed(4);

export function sharesPanel() {
  const pick = el("select", { id: "shares-prompt", "data-testid": "shares-prompt" },
    el("option", { value: "clean" }, "the clean prompt"), el("option", { value: "corrupted" }, "the corrupted prompt"));
  const canvas = el("canvas", { id: "shares", "data-testid": "shares", tabindex: "0", role: "img",
    "aria-label": "Each part's share of m: use the arrow keys to read the bars" });
  const summary = el("p", { id: "shares-summary", "data-testid": "shares-summary", class: "readout" });
  const readout = el("p", { id: "shares-readout", "data-testid": "shares-readout", class: "readout", "aria-live": "polite" });
  const root = el("div", { id: "shares-panel", hidden: "" },
    el("h2", {}, "Direct logit attribution ", el("a", { class: "doc", href: "/docs/experiments.md#direct-logit-attribution" }, "each part's share of m")),
    el("p", { class: "formula" }, "m = Σ", el("sub", {}, "c"), " share(c) ,  share(c) = s (c − mean(c)) · (γ ⊙ (W", el("sub", {}, "head"),
      "[answer] − W", el("sub", {}, "head"), "[wrong]))"),
    el("p", { class: "hint" }, "At the last position, the stream leaving the last block is the sum of what each part wrote into it: the embedding, each head (its output through its columns of W_proj), each attention bias and each feed-forward. With the final norm's scale s frozen at that stream's own (RMSNorm: c, no mean removed), m is the sum of their shares, plus the final norm's β and the head's bias. One bar per part: ",
      el("span", { class: "swatch", style: `background:${COLOUR.head}` }), " heads, ",
      el("span", { class: "swatch", style: `background:${COLOUR.ffn}` }), " feed-forwards, ",
      el("span", { class: "swatch", style: `background:${COLOUR.other}` }), " the rest."),
    el("div", { class: "controls" }, el("label", {}, "On ", pick)),
    el("div", { class: "scroll" }, canvas), summary, readout);
  let data = null, bar = 0, cursor = null;

  const values = () => data.logit_attribution[pick.value].shares;
  function describe(k) {
    const v = values()[k];
    return `${partOf(data.logit_attribution.names[k]).text}: share ${v} of m (${pick.value} prompt)`;
  }
  function read(k, event) {
    readout.textContent = describe(k);
    readout.dataset.bar = String(k);
    if (event) showTip([describe(k)], event.pageX, event.pageY);
  }

  function draw() {
    const names = data.logit_attribution.names, v = values(), n = v.length;
    const room = Math.max(240, Math.min((canvas.parentElement.clientWidth || 600) - 4, 1200));
    bar = Math.max(2, Math.min(14, Math.floor((room - LEFT - 8) / n)));
    const width = LEFT + bar * n + 8;
    const ctx = sizeCanvas(canvas, width, HEIGHT);
    const limit = Math.max(...v.map(Math.abs)) || 1, mid = TOP + (HEIGHT - TOP - BOTTOM) / 2;
    const scale = (HEIGHT - TOP - BOTTOM) / 2 / limit;
    ctx.font = "11px ui-monospace, monospace"; ctx.fillStyle = "#57606a"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    for (const y of [limit, 0, -limit]) ctx.fillText((y >= 0 ? "" : "−") + Math.abs(y).toPrecision(3), LEFT - 4, mid - y * scale);
    ctx.strokeStyle = "#d0d7de"; ctx.beginPath(); ctx.moveTo(LEFT, mid); ctx.lineTo(LEFT + bar * n, mid); ctx.stroke();
    const parts = names.map(partOf);
    let lastBlock = null;
    const every = Math.max(1, Math.ceil(24 / (bar * (parts.filter((p) => p.block === 0).length || 1))));
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    parts.forEach((p, k) => {
      ctx.fillStyle = COLOUR[p.kind];
      const h = v[k] * scale;
      ctx.fillRect(LEFT + k * bar, h >= 0 ? mid - h : mid, Math.max(1, bar - 1), Math.max(1, Math.abs(h)));
      if (p.block !== null && p.block !== lastBlock) {  // a block begins: a tick, every n-th named
        lastBlock = p.block;
        ctx.fillStyle = "#57606a";
        ctx.fillRect(LEFT + k * bar, HEIGHT - BOTTOM, 1, 4);
        if (p.block % every === 0) ctx.fillText(String(p.block), LEFT + k * bar + 4, HEIGHT - BOTTOM + 5);
      }
    });
    if (cursor !== null) {
      ctx.strokeStyle = "#e36209"; ctx.lineWidth = 2;
      ctx.strokeRect(LEFT + cursor * bar, TOP, bar, HEIGHT - TOP - BOTTOM);
    }
    Object.assign(canvas.dataset, { left: String(LEFT), bar: String(bar), bars: String(n), top: String(TOP),
      plot: String(HEIGHT - TOP - BOTTOM) });
    const sum = v.reduce((s, x) => s + x, 0), m = data[`${pick.value}_metric`];
    const largest = v.map((x, k) => [x, k]).sort((a, b) => Math.abs(b[0]) - Math.abs(a[0])).slice(0, 6);
    summary.dataset.sum = String(sum);
    summary.textContent = `${n} parts (block numbers under their first bar); Σ shares = ${sum.toFixed(4)}, m = ${m.toFixed(4)}. ` +
      `Largest: ${largest.map(([x, k]) => `${parts[k].text} ${signed(x)}`).join(", ")}`;
  }

  function at(event) {
    const box = canvas.getBoundingClientRect(), k = Math.floor((event.clientX - box.left - LEFT) / bar);
    return data && k >= 0 && k < values().length ? k : null;
  }
  canvas.addEventListener("mousemove", (e) => { const k = at(e); if (k === null) hideTip(); else read(k, e); });
  canvas.addEventListener("mouseleave", hideTip);
  canvas.addEventListener("keydown", (e) => {
    const step = { ArrowLeft: -1, ArrowRight: 1, Home: -Infinity, End: Infinity }[e.key];
    if (!data || step === undefined) return;
    e.preventDefault();
    cursor = Math.max(0, Math.min(values().length - 1, (cursor ?? -1) + step));
    draw();
    read(cursor);
  });
  canvas.addEventListener("blur", () => { if (data && cursor !== null) { cursor = null; draw(); } });
  pick.addEventListener("change", () => { if (data) { draw(); readout.textContent = ""; } });

  return {
    root,
    // data: /v1/patch's answer; without `logit_attribution` the panel hides.
    show(got) {
      data = got.logit_attribution ? got : null;
      cursor = null;
      root.hidden = !data;
      readout.textContent = "";
      if (data) draw();
    },
  };
}
