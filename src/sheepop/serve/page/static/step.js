// The Step view: one token through the model, every step of docs/math with its real numbers
// (POST /v1/trace), in the docs' order and notation. Pick a position (a prompt or a generated
// token), a layer and a head; the sampling controls redraw the last steps.
import { $, api, el, percent, setStatus, shortToken, shownToken } from "./common.js";
import { card, fmt, scalar, vector } from "./vectors.js";

const M = "/docs/math/";  // the pages' anchors (their headings' GitHub slugs)
const DOC = {
  embedding: "02-embedding.md", sinusoidal: "03-positions.md#the-sinusoidal-table",
  learned: "03-positions.md#learned-positions", rope: "03-positions.md#rotary-positions-rope",
  none: "03-positions.md", layernorm: "06-layernorm.md", rmsnorm: "06-layernorm.md#rmsnorm",
  qkv: "04-attention.md#42-heads", scores: "04-attention.md#43-scaled-scores-and-why-1sqrtd_k",
  mask: "04-attention.md#44-the-causal-mask",
  softmax: "04-attention.md#45-softmax-weighted-values-concatenation-output",
  gqa: "04-attention.md#46-grouped-query-attention",
  residual: "07-transformer.md#71-the-block-and-its-residual-paths",
  mlp: "05-feed-forward.md", swiglu: "05-feed-forward.md#swiglu",
  head: "07-transformer.md#73-the-output-head-and-weight-tying",
  forward: "07-transformer.md#72-the-whole-forward-pass",
  sampling: "12-generation.md#121-from-logits-to-a-token",
};

function options(select, n) {
  for (let i = 0; i < n; i++) select.append(el("option", { value: String(i) }, `${i + 1} of ${n}`));
  return select;
}

function normCard(number, title, n, input, output, eps, doc) {
  const layer = n.kind === "layernorm";
  const formula = layer
    ? `μ = mean(${input}) , σ² = mean((${input} − μ)²) , x̂ = (${input} − μ) / √(σ² + ε) , ${output} = γ ⊙ x̂ + β`
    : `ms = mean(${input}²) , x̂ = ${input} / √(ms + ε) , ${output} = γ ⊙ x̂  (RMSNorm: no centring, no β)`;
  return card(number, title, formula, doc,
    vector(`${input} (its input)`, n.x),
    layer ? scalar("μ", n.mean) : "", scalar(layer ? "σ²" : "ms", n.var, `ε = ${eps}`),
    vector("x̂", n.x_hat, layer ? "mean 0, variance ≈ 1" : "mean square ≈ 1"),
    vector(output, n.y));
}

function keysTable(data, head, t, columns, testid) {
  const names = data.tokens.map((x) => x.text);
  const rows = names.map((name, j) => el("tr", { class: head.allowed[j] ? "" : "masked" },
    el("td", {}, String(j)), el("td", { class: "tok" }, shortToken(name, 10)),
    ...columns.map((c) => c(j))));
  const heads = ["j", "key token", ...columns.map((c) => c.title)];
  return el("div", { class: "scroll keys" }, el("table", { "data-testid": testid },
    el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))), el("tbody", {}, ...rows)));
}

function column(title, value, attrs = () => ({})) {
  const c = (j) => el("td", { class: "num", ...attrs(j) }, value(j));
  c.title = title;
  return c;
}

function attentionCards(data, h, t) {
  const s = data.shape, head = data.block.heads[h], rope = s.pos_encoding === "rope";
  const group = s.n_head / s.n_kv_head;
  const sqrt = Math.sqrt(s.d_k).toFixed(4);
  const S = (j) => head.allowed[j] ? head.raw[j] : -Infinity;
  return [
    card(4, `Queries, keys and values of head ${h + 1}`,
      `[Q | K | V] = y W<sub>qkv</sub><sup>T</sup> + b<sub>qkv</sub> ; head h takes columns h d<sub>k</sub> … (h+1) d<sub>k</sub> − 1` +
      (rope ? ` ; RoPE turns pair (2i, 2i+1) of q and k by the angle t·θ<sup>−2i/d<sub>k</sub></sup> (θ = ${s.rope_theta})` : ""),
      DOC.qkv,
      group > 1 ? el("p", { class: "hint" }, `Grouped-query attention: ${s.n_head} query heads share ${s.n_kv_head} key/value heads, ${group} each; head ${h + 1} reads key/value head ${head.kv_head + 1}. `, el("a", { class: "doc", href: M + DOC.gqa }, "why")) : "",
      ...(rope ? [vector("q_t before RoPE", head.q_pre),
        vector(`q_t after RoPE (t = ${t})`, head.q, "same length, turned"),
        vector("k_t before RoPE", head.k_pre), vector("k_t after RoPE", head.k)]
        : [vector("q_t", head.q), vector("k_t", head.k)]),
      vector("v_t", head.v)),
    card(5, "Scores with the causal mask",
      `S<sub>t</sub> = q<sub>t</sub> K<sup>T</sup> / √d<sub>k</sub> + M<sub>t</sub> ; √d<sub>k</sub> = ${sqrt} ; M<sub>tj</sub> = 0 for j ≤ t, −∞ after (the future)`,
      DOC.mask,
      keysTable(data, head, t, [
        column("q·k_j / √d_k", (j) => fmt(head.raw[j])),
        column("M_tj", (j) => head.allowed[j] ? "0" : "−∞"),
        column("S_tj", (j) => fmt(S(j)))], "step-scores")),
    card(6, "Softmax: the attention weights",
      `A<sub>tj</sub> = exp(S<sub>tj</sub> − max S<sub>t</sub>) / Σ<sub>j'</sub> exp(S<sub>tj'</sub> − max S<sub>t</sub>) : e<sup>−∞</sup> = 0, so the future gets nothing; the row sums to ${fmt(head.weights.reduce((a, b) => a + b, 0))}`,
      DOC.softmax,
      keysTable(data, head, t, [
        column("S_tj", (j) => fmt(S(j))),
        column("A_tj", (j) => fmt(head.weights[j]), (j) => ({ class: "num a", "data-value": String(head.weights[j]) })),
        column("", (j) => el("span", { class: "bar", style: `width:${Math.max(head.weights[j] ? 1 : 0, 120 * head.weights[j])}px` }))],
      "step-softmax")),
    card(7, "The weighted sum of the values",
      `Y<sub>h</sub>[t] = Σ<sub>j≤t</sub> A<sub>tj</sub> v<sub>j</sub> = A<sub>t</sub> V<sub>h</sub> : an average of the values of positions 0 … ${t}`,
      DOC.softmax, vector(`Y_${h + 1}[t]`, head.out)),
  ];
}

function ffnCards(data) {
  const f = data.block.ffn, s = data.shape;
  if (f.kind === "swiglu") {
    return card(11, "The feed-forward network (SwiGLU)",
      "g = y W<sub>gate</sub><sup>T</sup> , u = y W<sub>up</sub><sup>T</sup> , FFN(y) = (silu(g) ⊙ u) W<sub>proj</sub><sup>T</sup> , silu(g) = g σ(g)",
      DOC.swiglu, vector("g (gate, pre-activation)", f.pre), vector("u (up)", f.up),
      vector("silu(g)", f.gate_act), vector("silu(g) ⊙ u", f.act, `d_ff = ${s.d_ff}`),
      vector("FFN(y)", f.out));
  }
  const phi = { gelu: "GELU: u Φ(u)", gelu_tanh: "GELU-tanh", relu: "ReLU: max(u, 0)", silu: "SiLU" }[f.activation] || f.activation;
  return card(11, "The feed-forward network",
    `u = y W<sub>fc</sub><sup>T</sup> + b<sub>fc</sub> , φ(u) (${phi}) , FFN(y) = φ(u) W<sub>proj</sub><sup>T</sup> + b<sub>proj</sub>`,
    DOC.mlp, vector("u (pre-activation)", f.pre, `d_ff = ${s.d_ff}`), vector("φ(u)", f.act),
    vector("FFN(y)", f.out));
}

function streamNorms(norms, layer) {
  const max = Math.max(...norms);
  return el("table", { class: "norms", "data-testid": "step-stream" }, el("tbody", {},
    ...norms.map((n, i) => el("tr", { class: i === layer || i === layer + 1 ? "here" : "" },
      el("td", {}, "h", el("sup", {}, `(${i})`), i === 0 ? " embedding" : ` after block ${i}`), el("td", { class: "num" }, fmt(n)),
      el("td", {}, el("span", { class: "bar", style: `width:${Math.max(1, 160 * n / max)}px` }))))));
}

function samplingCards(data, more) {
  const s = data.sampling, z = data.logits, t = data.position, V = data.shape.vocab_size;
  const pct = (p) => (p ? percent(p) : "0");
  const rows = s.rows.map((r) => el("tr", { "data-id": String(r.id), class: [r.id === s.draw.id ? "drawn" : "", r.id === s.actual?.id ? "actual" : ""].join(" ") },
    el("td", { class: "tok" }, shownToken(r.text)), el("td", { class: "num" }, fmt(r.z)),
    el("td", { class: "num", "data-p": String(r.p) }, pct(r.p)),
    el("td", { class: "num", "data-p": String(r.p_tau) }, pct(r.p_tau)),
    el("td", { class: "num", "data-p": String(r.p_k) }, pct(r.p_k)),
    el("td", { class: "num", "data-p": String(r.p_p) }, pct(r.p_p)),
    el("td", { class: "num", "data-p": String(r.p_final) }, pct(r.p_final))));
  const table = el("div", { class: "scroll" }, el("table", { "data-testid": "step-sampling" },
    el("thead", {}, el("tr", {}, ...["token", "z", "p = softmax(z)", `p_τ (τ = ${s.temperature})`,
      `top-k (k = ${s.top_k || "off"})`, `top-p (p = ${s.top_p})`, `min-p (m = ${s.min_p || "off"})`].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows)));
  const banned = s.banned.length ? ` Tokens never generated get z = −∞ before any of this (so p is the p of the Generate and Inside views): ${s.banned.map((b) => shownToken(b.text)).join(", ")}.` : "";
  const full = el("div", {});
  const button = el("button", { type: "button", class: "more" }, `all ${V} logits`);
  button.addEventListener("click", async () => {
    button.disabled = true;
    const got = await more();
    full.replaceChildren(vector("z_t (every logit)", got.logits.full), vector("softmax(z_t)", got.logits.probs));
  });
  return [
    card(14, "The logits",
      `z<sub>t</sub> = Norm<sub>f</sub>(h<sup>(L)</sup><sub>t</sub>) W<sub>head</sub><sup>T</sup>${data.shape.head_bias ? " + b<sub>head</sub>" : ""}${data.shape.tied ? " , W<sub>head</sub> = E (tied)" : ""} : one score per token of the vocabulary`,
      DOC.head,
      el("div", { class: "vec", "data-testid": "step-logits" }, el("div", { class: "vec-head" },
        el("span", { class: "vec-name" }, "z_t"),
        el("span", { class: "vec-stats" }, `${z.size} numbers · ‖·‖ = ${fmt(z.norm)} · min ${fmt(z.min)} · max ${fmt(z.max)} · mean ${fmt(z.mean)}`)),
      el("code", { class: "vec-values" }, `[${z.first.map(fmt).join(", ")}, …]`),
      el("p", { class: "hint" }, "largest: " + z.top.map((x) => `${shownToken(x.text)} ${fmt(x.z)}`).join(" · "))),
      button, full),
    card(15, "The probabilities, as generation draws them",
      `p = softmax(z) ; p<sub>τ</sub> = softmax(z / τ) ; top-k keeps the k likeliest ; top-p keeps the smallest prefix whose sum reaches p<sub>top</sub> ; min-p keeps p<sub>i</sub> ≥ m max p ; each renormalised`,
      DOC.sampling,
      el("p", { class: "hint" }, `Top-k keeps ${s.kept_k} tokens (their probabilities sum to ${fmt(s.sum_k)}), top-p then ${s.kept_p}, min-p then ${s.kept_min_p}.${banned} Change τ, k, p, m above: these columns follow.`),
      table),
    card(16, "The draw",
      `u ~ U[0, 1) from seed ${s.seed} ; the token is the first i (in vocabulary order) whose cumulative probability c<sub>i</sub> = p<sub>0</sub> + … + p<sub>i</sub> exceeds u`,
      DOC.sampling,
      el("p", { "data-testid": "step-draw" }, `u = ${fmt(s.draw.u)}: c passes it at `, el("b", {}, shownToken(s.draw.text)),
        ` (id ${s.draw.id}: c goes from ${fmt(s.draw.cdf_before)} to ${fmt(s.draw.cdf_at)}).`,
        s.actual ? ` The text goes on with ${shownToken(s.actual.text)}${t + 1 >= data.prompt_tokens ? " (generated)" : ""}.` : " This is the last token: the drawn one would come next.")),
  ];
}

export function stepView(state) {
  const { n_layer: L, n_head: H } = state.shape;
  const root = $("#step");
  const text = el("textarea", { id: "step-prompt", rows: "2", spellcheck: "false" });
  const layer = options(el("select", { id: "step-layer", "data-testid": "step-layer" }), L);
  const head = options(el("select", { id: "step-head", "data-testid": "step-head" }), H);
  const num = (id, value, attrs) => el("input", { id, type: "number", value, ...attrs });
  const tau = num("step-temperature", "1", { min: "0", max: "100", step: "any" });
  const topK = num("step-top-k", "0", { min: "0", step: "1", title: "0: off" });
  const topP = num("step-top-p", "1", { min: "0.01", max: "1", step: "any" });
  const minP = num("step-min-p", "0", { min: "0", max: "1", step: "any", title: "0: off" });
  const seed = num("step-seed", "0", { min: "0", step: "1" });
  const strip = el("div", { id: "step-tokens", role: "group", "aria-label": "Position" });
  const status = el("p", { class: "status", role: "status", id: "step-status" });
  const steps = el("div", { id: "step-steps" });
  const label = (name, input) => el("label", {}, name, input);
  root.append(
    el("p", { class: "hint" }, "Every step of the forward pass for one token, with the model's real numbers, in the notation of the mathematics pages. Pick a token (generated ones are underlined), a layer and a head."),
    el("form", { id: "step-form" }, el("label", { for: "step-prompt" }, "Text (the last prompt and its answer by default)"), text,
      el("div", { class: "buttons" }, el("button", { type: "submit" }, "Trace"))),
    el("div", { class: "controls" }, label("Layer", layer), label("Head", head), label("Temperature τ", tau),
      label("Top-k", topK), label("Top-p", topP), label("Min-p", minP), label("Seed", seed)),
    strip, status, steps);

  let body = null, data = null, position = null, asked = 0, seenLast = null;
  const settings = () => ({ temperature: Number(tau.value), top_k: Number(topK.value),
    top_p: Number(topP.value), min_p: Number(minP.value), seed: Number(seed.value) });
  const ask = (extra = {}) => api("/v1/trace", {
    ...body, ...(position === null ? {} : { position }), layer: Number(layer.value), ...settings(), ...extra });

  async function run() {
    if (!body) return;
    const mine = ++asked;
    setStatus(status, "tracing…");
    try {
      const got = await ask();
      if (mine !== asked) return;
      data = got;
      position = data.position;
      setStatus(status, `${data.tokens.length} tokens; position ${position}, layer ${data.layer + 1} of ${L}: computed in ${data.seconds.toFixed(3)} s`);
      draw();
    } catch (e) { if (mine === asked) setStatus(status, e.message, true); }
  }

  function drawStrip() {
    strip.replaceChildren(...data.tokens.map((x, i) => {
      const b = el("button", { type: "button", "data-testid": "step-token", "data-position": String(i), "data-text": x.text,
        class: i >= data.prompt_tokens ? "generated" : "", "aria-pressed": String(i === position),
        title: `position ${i}: ${JSON.stringify(x.text)}${i >= data.prompt_tokens ? " (generated)" : ""}` }, shortToken(x.text, 8));
      b.addEventListener("click", () => { position = i; run(); });
      return b;
    }));
  }

  function draw() {
    drawStrip();
    const s = data.shape, t = position, l = data.layer, h = Number(head.value), b = data.block;
    const tok = `“${shownToken(data.tokens[t].text)}”`, kind = s.pos_encoding;
    const pos = data.embedding.position;
    steps.replaceChildren(
      card(1, `Embedding of ${tok} at position ${t}`,
        kind === "rope" || kind === "none" ? `h<sup>(0)</sup><sub>t</sub> = E[x<sub>t</sub>] (${kind === "rope" ? "RoPE: no position term here; it turns q and k in step 4" : "no positional encoding"})`
          : `h<sup>(0)</sup><sub>t</sub> = E[x<sub>t</sub>] + ${kind === "sinusoidal" ? `s P[t] (s = ${fmt(s.pos_scale)})` : "P[t] (learned)"}`,
        kind === "none" ? DOC.embedding : DOC[kind],
        vector(`E[x_t] (row ${data.tokens[t].id} of E)`, data.embedding.token),
        pos ? vector(kind === "sinusoidal" ? "s P[t]" : "P[t]", pos) : "",
        pos ? vector("h^(0)_t", data.embedding.token.map((v, i) => v + pos[i])) : ""),
      card(2, `The residual stream at position ${t}, into block ${l + 1}`,
        `h<sup>(ℓ)</sup> = Block<sub>ℓ</sub>(h<sup>(ℓ−1)</sup>) : its length before and after every block (block ${l + 1} marked)`,
        DOC.forward, el("div", { class: "scroll keys" }, streamNorms(data.stream_norms, l)), vector(`h^(${l})_t`, b.h_in)),
      normCard(3, "The first norm", b.norm1, "x", "y", s.eps, DOC[s.norm]),
      ...attentionCards(data, h, t),
      card(8, "Heads side by side, and the output projection",
        `out<sub>t</sub> = [Y<sub>1</sub>[t] | … | Y<sub>H</sub>[t]] W<sub>proj</sub><sup>T</sup> + b<sub>proj</sub> (W<sub>proj</sub>: the W<sub>O</sub> of the papers)`,
        DOC.softmax, vector(`[Y_1 … Y_${s.n_head}] (${s.n_head} × ${s.d_k})`, b.concat), vector("out_t", b.attn_out)),
      card(9, "The residual add", "x<sub>1</sub> = x + Attn(Norm<sub>1</sub>(x))", DOC.residual, vector("x₁", b.x1)),
      normCard(10, "The second norm", b.norm2, "x₁", "y", s.eps, DOC[s.norm]),
      ffnCards(data),
      card(12, "The second residual add", `h<sup>(${l + 1})</sup> = x<sub>2</sub> = x<sub>1</sub> + FFN(Norm<sub>2</sub>(x<sub>1</sub>))`,
        DOC.residual, vector(`h^(${l + 1})_t`, b.x2)),
      normCard(13, `The final norm, after the last block (${L})`, data.final_norm, `h^(${L})`, "Norm_f", s.eps, DOC.head),
      ...samplingCards(data, () => ask({ full_vocab: true })));
  }

  head.addEventListener("change", () => { if (data) draw(); });
  for (const input of [layer, tau, topK, topP, minP, seed]) input.addEventListener("change", run);
  $("#step-form", root).addEventListener("submit", (e) => {
    e.preventDefault();
    const last = state.last;
    body = last?.messages && text.value === last.text ? { messages: last.messages } : { prompt: text.value };
    position = null;
    run();
  });

  return {
    show() {  // the last prompt and the tokens generated after it, once
      for (const [mine, theirs] of [[tau, "#temperature"], [topK, "#top-k"], [topP, "#top-p"], [minP, "#min-p"]]) {
        if (!data && $(theirs)) mine.value = $(theirs).value;
      }
      const last = state.last;
      if (last && last !== seenLast) {
        seenLast = last;
        text.value = last.text;
        const continuation = [...document.querySelectorAll("#answer [data-testid=token]")].map((x) => x.textContent);
        body = { ...(last.messages ? { messages: last.messages } : { prompt: last.prompt }), continuation };
        position = null;
        run();
      } else if (!body) {
        setStatus(status, "Generate from a prompt first, or type a text here and Trace.");
      }
    },
  };
}
