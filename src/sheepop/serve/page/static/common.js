// Small helpers shared by the three views: requests, elements, colours, canvases, a tooltip.

export const $ = (selector, root = document) => root.querySelector(selector);

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

// The API key the user gave (a server started with --api-key wants it on every API call),
// kept for this tab only.
export const KEY_STORE = "sheepop-api-key";
export function authHeaders(headers = {}) {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? { ...headers, authorization: `Bearer ${key}` } : headers;
}

// The server's JSON (GET without a body, POST with one); its error message as an Error.
export async function api(path, body) {
  const init = body === undefined ? { headers: authHeaders() } : {
    method: "POST", headers: authHeaders({ "content-type": "application/json" }),
    body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error?.message || `${response.status} ${response.statusText}`);
  return data;
}

// A token's text with its invisible characters shown: space as ␣, line break as ⏎, tab as ⇥.
export function shownToken(text) {
  return text.replace(/ /g, "\u2423").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5");
}

// A token as a short label: shownToken's text cut to `max` characters, "…" where it was cut.
export function shortToken(text, max) {
  const chars = [...shownToken(text)];
  return chars.length > max ? chars.slice(0, max - 1).join("") + "\u2026" : chars.join("");
}

export function percent(p) {
  if (p === null || p === undefined) return "–";
  const v = 100 * p;
  return (v >= 10 ? v.toFixed(1) : v >= 0.1 ? v.toFixed(2) : v.toExponential(1)) + "%";
}

// Probability -> tint: red (unlikely) through yellow to green (certain), light enough to read on.
export function probabilityTint(p) {
  return `hsl(${Math.round(130 * Math.max(0, Math.min(1, p)))}, 70%, 83%)`;
}

// Weight in [0, 1] -> white .. dark blue (the heatmaps).
export function heat(v) {
  const t = Math.max(0, Math.min(1, v));
  const r = Math.round(255 - t * (255 - 8)), g = Math.round(255 - t * (255 - 48));
  const b = Math.round(255 - t * (255 - 107));
  return `rgb(${r},${g},${b})`;
}

// Signed value -> blue (negative) .. white .. red (positive), scaled by `limit`.
export function diverging(v, limit) {
  const t = Math.max(-1, Math.min(1, v / (limit || 1)));
  const fade = Math.round(255 * (1 - Math.abs(t)));
  return t >= 0 ? `rgb(255,${fade},${fade})` : `rgb(${fade},${fade},255)`;
}

// Size a canvas to `width` x `height` CSS pixels, sharp on high-density screens.
export function sizeCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

// The floating tooltip: text lines near the pointer (or an element), hidden on leave.
const tip = () => $("#tip");
export function showTip(lines, x, y) {
  const t = tip();
  t.replaceChildren(...lines.map((line) => el("div", {}, line)));
  t.hidden = false;
  const w = t.offsetWidth;
  const left = Math.min(x + 14, window.scrollX + document.documentElement.clientWidth - w - 6);
  t.style.left = `${Math.max(window.scrollX + 4, left)}px`;
  t.style.top = `${y + 16}px`;
}
export function hideTip() { tip().hidden = true; }

export function setStatus(node, message, error = false) {
  node.textContent = message;
  node.classList.toggle("error", error);
}
