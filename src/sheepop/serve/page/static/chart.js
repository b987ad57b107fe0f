// A line chart on a canvas: axes with round ticks, one or more series, the nearest point's
// numbers on hover and with the arrow keys. Series: {name, color, points: [[x, y], ...], dots,
// describe}: describe([x, y]) is the point's reading (default: "name at x: y"). Points whose y
// is null are left out.
import { el, hideTip, showTip, sizeCanvas } from "./common.js";

function ticks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-12 * step; v += step) out.push(+v.toPrecision(12));
  return out;
}

const label = (v) => (Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-2)
  ? v.toExponential(1) : String(+v.toPrecision(4)));

// The y axis of values `ys`: {ticks, at(y)}, at(y) the height of y as a fraction of the plot (0:
// bottom, 1: top). "linear"; or "log1p", y drawn at log10(1 + y), for quantities >= 0 where one
// value dwarfs the others: the logit lens's KL is ~100 nats at the embedding and 0.1-10 after
// it, which a linear axis draws as a flat line along 0 (its ticks: 0, 0.1, 0.3, 1, 3, 10, ...).
export function yAxis(ys, scale = "linear") {
  const log = scale === "log1p";
  const f = log ? (y) => Math.log10(1 + Math.max(0, y)) : (y) => y;
  let lo = Math.min(...ys.map(f)), hi = Math.max(...ys.map(f));
  if (hi === lo) { lo -= Math.abs(lo) * 0.1 || 1; hi += Math.abs(hi) * 0.1 || 1; }
  const pad = (hi - lo) * 0.05; lo -= pad; hi += pad;
  if (log) lo = Math.max(lo, 0);
  const candidates = [0];
  for (let e = -1; e <= 8; e++) candidates.push(10 ** e, 3 * 10 ** e);
  const at = (y) => (f(y) - lo) / (hi - lo);
  // log: 0, 0.1 and 0.3 crowd the bottom on a short range: a tick keeps an eighth of the
  // height from the last one kept, so no two labels overlap
  const marks = log ? candidates.map((v) => +v.toPrecision(3)).filter((v) => f(v) >= lo && f(v) <= hi)
    .filter(function (v) { const keep = !(at(v) - this.last < 0.125); if (keep) this.last = at(v); return keep; }, { last: -1 })
    : ticks(lo, hi);
  return { ticks: marks, at };
}

export function drawChart(canvas, readout, series,
  { xLabel = "step", yLabel = "", height = 260, yScale = "linear" } = {}) {
  series = series.map((s) => ({ ...s, points: s.points.filter((p) => p[1] !== null && p[1] !== undefined) }));
  const width = Math.max(240, canvas.parentElement.clientWidth - 2);
  const ctx = sizeCanvas(canvas, width, height);
  const all = series.flatMap((s) => s.points);
  canvas.dataset.points = String(all.length);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, width, height);
  ctx.font = "12px system-ui, sans-serif"; ctx.fillStyle = "#57606a";
  if (!all.length) {
    ctx.fillText("no rows yet", 12, 24);
    canvas.onmousemove = null;
    return;
  }
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  if (x1 === x0) x1 = x0 + 1;
  const axis = yAxis(ys, yScale);
  canvas.dataset.yScale = yScale;
  canvas.dataset.yTicks = axis.ticks.map(label).join(" ");
  const m = { left: 58, right: 12, top: 24, bottom: 34 };
  const X = (x) => m.left + ((x - x0) / (x1 - x0)) * (width - m.left - m.right);
  const Y = (y) => height - m.bottom - axis.at(y) * (height - m.top - m.bottom);
  ctx.strokeStyle = "#eaeef2"; ctx.lineWidth = 1;
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (const v of axis.ticks) {
    ctx.beginPath(); ctx.moveTo(m.left, Y(v)); ctx.lineTo(width - m.right, Y(v)); ctx.stroke();
    ctx.fillText(label(v), m.left - 6, Y(v));
  }
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  const whole = xs.every(Number.isInteger);  // (layers, steps: no tick between two)
  for (const v of ticks(x0, x1, Math.max(2, Math.floor(width / 110))).filter((t) => !whole || Number.isInteger(t))) {
    ctx.beginPath(); ctx.moveTo(X(v), m.top); ctx.lineTo(X(v), height - m.bottom); ctx.stroke();
    ctx.fillText(label(v), X(v), height - m.bottom + 4);
  }
  ctx.fillText(xLabel, (m.left + width - m.right) / 2, height - 16);
  ctx.save(); ctx.translate(12, (m.top + height - m.bottom) / 2); ctx.rotate(-Math.PI / 2);
  ctx.textBaseline = "middle"; ctx.fillText(yLabel, 0, 0); ctx.restore();
  let legend = m.left;
  for (const s of series) {
    ctx.strokeStyle = s.color; ctx.fillStyle = s.color; ctx.lineWidth = 1.6;
    ctx.beginPath();
    s.points.forEach(([x, y], i) => (i ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y))));
    ctx.stroke();
    if (s.dots || s.points.length === 1) {
      for (const [x, y] of s.points) { ctx.beginPath(); ctx.arc(X(x), Y(y), 2.8, 0, 7); ctx.fill(); }
    }
    if (s.points.length) {
      ctx.fillRect(legend, 8, 14, 3);
      ctx.fillStyle = "#1b1f24"; ctx.textAlign = "left"; ctx.textBaseline = "middle";
      ctx.fillText(s.name, legend + 18, 10);
      legend += 30 + ctx.measureText(s.name).width;
    }
  }
  const flat = series.flatMap((s) => s.points.map((p) => ({ s, p })));
  const describe = ({ s, p }) => (s.describe ? s.describe(p) : `${s.name} at ${xLabel} ${p[0]}: ${p[1]}`);
  canvas.onmousemove = (e) => {
    const box = canvas.getBoundingClientRect(), x = e.clientX - box.left, y = e.clientY - box.top;
    let best = null, bestD = Infinity;
    for (const f of flat) {
      const d = (X(f.p[0]) - x) ** 2 + (Y(f.p[1]) - y) ** 2;
      if (d < bestD) { bestD = d; best = f; }
    }
    if (!best || bestD > 900) { hideTip(); return; }
    readout.textContent = describe(best);
    showTip([describe(best)], e.pageX, e.pageY);
  };
  canvas.onmouseleave = hideTip;
  let at = flat.length - 1;
  canvas.onkeydown = (e) => {
    const step = { ArrowLeft: -1, ArrowRight: 1 }[e.key];
    if (!step) return;
    e.preventDefault();
    at = Math.max(0, Math.min(flat.length - 1, at + step));
    readout.textContent = describe(flat[at]);
  };
  canvas.replaceChildren(el("span", {}, `${series.map((s) => `${s.name}: ${s.points.length} points`).join(", ")}`));
}
