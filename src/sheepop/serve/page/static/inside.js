// The inside view: POST /v1/inspect on the last text generated (the prompt, or a chat's whole
// templated conversation, and the tokens the model generated after it) or on a text typed
// here; then every head of a layer (heads.js), the next-token distribution and the sampled
// one at any position (tables.js, sampled.js), the logit lens (lens.js) and the positional
// encoding, every number readable on hover or with the keyboard.
import { $, api, el, setStatus, shownToken } from "./common.js";
import { attentionPanel } from "./heads.js";
import { drawLens, drawLensChart } from "./lens.js";
import { decodeLogits, sampledPanel } from "./sampled.js";
import { drawPositions, nextBars } from "./tables.js";

const TOP = 5;

export function insideView(state) {
  const { n_layer: L, n_head: H, max_attention_cells: maxCells } = state.shape;
  const status = $("#inside-status"), layerSelect = $("#layer"), headSelect = $("#head");
  const text = $("#inside-prompt");
  let data = null, request = null, shownText = null, picked = 0;
  let line = "";  // what the status says of the analysis (back after a layer is read)
  const say = (message) => { line = message; setStatus(status, message); };
  let analysedLast = null;  // the state.last analysed (one analysis per generation)
  const attention = new Map();  // layer -> (H, T, rows) weights
  const logits = new Map();  // position -> Float32Array: the final logits z there
  const heads = attentionPanel(H);
  const sampled = sampledPanel(state);

  for (let l = 0; l < L; l++) layerSelect.append(el("option", { value: String(l) }, `${l + 1} of ${L}`));
  for (let h = 0; h < H; h++) headSelect.append(el("option", { value: String(h) }, `${h + 1} of ${H}`));
  if (state.shape.tied) $("#lens-embedding").hidden = false;

  const tokens = () => data.tokens.map((t) => t.text);
  const showHeads = () => heads.show(tokens(), (l) => attention.get(l) ?? null);

  // A layer's weights come with the first answer when they all fit; otherwise one at a time.
  async function showLayer() {
    const layer = Number(layerSelect.value);
    if (!attention.has(layer) && request) {
      setStatus(status, `reading layer ${layer + 1}…`);
      try {
        const more = await api("/v1/inspect", { ...request, layers: [layer], lens: false, top: 1 });
        attention.set(layer, more.attention.weights[0]);
        setStatus(status, line);
      } catch (e) { setStatus(status, e.message, true); return; }
    }
    showHeads();
  }
  layerSelect.addEventListener("change", showLayer);

  // The sampled distribution after position t needs all V logits there (one more request).
  async function showSampled(t) {
    const ids = data.tokens.map((x) => x.id);
    const chosen = t + 1 < ids.length ? ids[t + 1] : null;
    if (!logits.has(t)) {
      const mine = data;
      let got;
      try {
        got = await api("/v1/inspect", { ...request, layers: [], lens: false, top: 1, logits_at: t });
      } catch (e) { setStatus(status, e.message, true); return; }
      if (mine !== data) return;  // another text was analysed meanwhile: these logits are not its
      logits.set(t, decodeLogits(got.logits.float32));
      for (const [id, name] of Object.entries(got.logits.texts)) data.texts.set(Number(id), name);
      if (picked !== t) return;
    }
    const text = (i) => data.texts.get(i) ?? `#${i}`;
    sampled.show(logits.get(t), ids.slice(0, t + 1), chosen, text, t);
  }

  function pick(t) {
    picked = t;
    const strip = $("#positions-strip");
    strip.querySelectorAll("button").forEach((b, i) => b.setAttribute("aria-pressed", String(i === t)));
    nextBars($("#next-bars"), data, t);
    if (data.lens) drawLensChart(data, tokens(), t);
    showSampled(t);
  }

  function drawPositionStrip() {
    const strip = $("#positions-strip"), names = tokens();
    strip.replaceChildren(...names.map((n, t) => el("button", {
      type: "button", "aria-pressed": "false", title: `position ${t}`,
      "aria-label": `position ${t}, token ${JSON.stringify(n)}`, onclick: () => pick(t),
    }, shownToken(n))));
  }

  // Token texts seen in any answer (the sampled table names tokens outside the top 5 too).
  function learnTexts(answer) {
    const put = (ids, texts) => ids.forEach((row, i) => row.forEach((id, j) => data.texts.set(id, texts[i][j])));
    answer.tokens.forEach((t) => data.texts.set(t.id, t.text));
    put(answer.next.ids, answer.next.texts);
    if (answer.lens) answer.lens.ids.forEach((layer, l) => put(layer, answer.lens.texts[l]));
  }

  // A small model: everything in one answer. A larger one (its whole context's attention past
  // the server's bound): one layer's attention and the next tokens first, a forward pass, shown
  // at once; then the logit lens, L + 1 products with the whole vocabulary, most of the time.
  let asked = 0;  // the latest analysis: an older one's late answers are dropped
  async function analyse(body) {
    const mine = ++asked;
    request = body;
    setStatus(status, "looking inside…");
    const T = state.shape.context;  // (the prompt's length is known only from the answer)
    const all = L * H * T * (T + 1) / 2 <= maxCells;
    let got;
    try {
      got = await api("/v1/inspect", { ...body, top: TOP,
        ...(all ? {} : { layers: [Number(layerSelect.value)], lens: false }) });
    } catch (e) { if (mine === asked) setStatus(status, e.message, true); return; }
    if (mine !== asked) return;
    data = { ...got, texts: new Map() };
    learnTexts(got);
    attention.clear(); logits.clear(); sampled.clear();
    data.attention.layers.forEach((l, i) => attention.set(l, data.attention.weights[i]));
    shownText = tokens().join("");
    text.value = shownText;  // what is analysed: a chat's whole template, the generated tokens
    const generated = body.generated?.length ?? 0;
    const shape = `${data.tokens.length} tokens` + (generated ? ` (${generated} generated)` : "") +
      `, ${L} layers × ${H} heads`;
    say(all ? shape : `${shape}; computing the logit lens of ${L + 1} layers…`);
    const pos = data.positions;
    $("#positions-formula").textContent = `${pos.kind}: ${pos.formula}` +
      (pos.scale !== undefined ? `, with s = ${pos.scale}` : "");
    if (!all) $("#logit-lens").replaceChildren();
    await showLayer();
    drawPositionStrip();
    // After a generation: the position its last token was drawn at; else what would come next.
    pick(Math.max(0, data.tokens.length - (generated ? 2 : 1)));
    drawPositions($("#positions"), $("#positions-readout"), data);
    if (!all) {
      try {
        const lens = (await api("/v1/inspect", { ...body, top: TOP, layers: [] })).lens;
        if (mine !== asked) return;
        data.lens = lens;
        lens.ids.forEach((layer, l) => layer.forEach((row, i) => row.forEach((id, j) => data.texts.set(id, lens.texts[l][i][j]))));
      } catch (e) { if (mine === asked) setStatus(status, e.message, true); return; }
      say(shape);
      drawLensChart(data, tokens(), picked);
    }
    drawLens(data, tokens());
  }

  $("#inside-form").addEventListener("submit", (e) => {
    e.preventDefault();
    analyse(request && text.value === shownText ? request : { prompt: text.value });
  });
  window.addEventListener("resize", () => {
    if (!data || $("#inside").hidden) return;
    heads.draw();
    drawPositions($("#positions"), $("#positions-readout"), data);
    if (data.lens) drawLensChart(data, tokens(), picked);
  });

  return {
    show() {  // the last generation (its prompt and the tokens generated), unless analysed
      const last = state.last;
      sampled.follow();
      if (last && last !== analysedLast) {
        analysedLast = last;
        text.value = last.text;
        analyse({ ...(last.messages ? { messages: last.messages } : { prompt: last.prompt }),
                  ...(last.generated?.length ? { generated: last.generated } : {}) });
      } else if (!last && !data) {
        setStatus(status, "Generate from a prompt first, or type one here and Analyse.");
      }
    },
  };
}
