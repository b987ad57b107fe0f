// The runs view: a run's metrics.jsonl as curves (loss, bits per byte, learning rate), read
// again every POLL_MS while the view is shown: only the rows appended since are fetched.
import { $, api, el, setStatus } from "./common.js";
import { drawChart } from "./chart.js";

const POLL_MS = 2000;

export function runsView() {
  const select = $("#run-select"), status = $("#runs-status"), readout = $("#chart-readout");
  let rows = [], run = null, timer = null, busy = false;
  const hasMetrics = new Map();  // run -> whether it has a metrics.jsonl (an imported model has none)

  function draw() {
    const series = (key, name, color, dots = false) => ({
      name, color, dots, points: rows.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]),
    });
    drawChart($("#loss-chart"), readout, [series("loss", "train loss", "#0b5cad"),
      series("val_loss", "validation loss", "#e36209", true)], { yLabel: "nats / token" });
    drawChart($("#bpb-chart"), readout, [series("val_bpb", "validation bits per byte", "#6639ba", true)],
      { yLabel: "bits / byte", height: 200 });
    drawChart($("#lr-chart"), readout, [series("lr", "learning rate", "#1a7f37")],
      { yLabel: "lr", height: 180 });
  }

  async function poll() {
    if (!run || busy) return;
    busy = true;
    try {
      const name = run;
      const got = await api(`/v1/runs/${encodeURI(name)}/metrics?since=${rows.length}`);
      if (name !== run) return;
      rows = got.reset ? got.rows : rows.concat(got.rows);
      const last = rows[rows.length - 1];
      setStatus(status, (!rows.length && hasMetrics.get(name) === false
        ? `${name} has no metrics.jsonl: it was not trained here (an imported model has none)`
        : `${rows.length} rows` + (last ? `, step ${last.step}` : "")) +
        ` (read every ${POLL_MS / 1000} s)`);
      if (got.rows.length || got.reset) draw();
    } catch (e) {
      setStatus(status, e.message, true);
    } finally { busy = false; }
  }

  function choose(name) {
    run = name; rows = [];
    draw();
    poll();
  }
  select.addEventListener("change", () => choose(select.value));

  async function listRuns() {
    try {
      const got = await api("/v1/runs");
      const names = got.data.map((r) => r.name);
      got.data.forEach((r) => hasMetrics.set(r.name, r.metrics));
      select.replaceChildren(...got.data.map((r) => el("option", { value: r.name },
        r.served ? `${r.name} (served)` : r.name)));
      if (!names.length) { setStatus(status, "no run with a metrics.jsonl here"); return; }
      const firstWithRows = got.data.find((r) => r.metrics)?.name ?? names[0];
      select.value = names.includes(run) ? run : firstWithRows;
      if (select.value !== run) choose(select.value);
    } catch (e) { setStatus(status, e.message, true); }
  }

  window.addEventListener("resize", () => { if (!$("#runs").hidden) draw(); });
  return {
    show() {
      listRuns();
      if (!timer) {
        timer = setInterval(() => { if (!$("#runs").hidden) poll(); }, POLL_MS);
      }
    },
  };
}
