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

export function drawChart(canvas, readout, series, { xLabel = "step", yLabel = "", height = 260 } = {}) {
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
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const m = { left: 58, right: 12, top: 24, bottom: 34 };
  const X = (x) => m.left + ((x - x0) / (x1 - x0)) * (width - m.left - m.right);
  const Y = (y) => height - m.bottom - ((y - y0) / (y1 - y0)) * (height - m.top - m.bottom);
  ctx.strokeStyle = "#eaeef2"; ctx.lineWidth = 1;
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (const v of ticks(y0, y1)) {
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
