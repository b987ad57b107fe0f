// The generate view: a prompt (or a conversation, for a chat model), sampling controls, and
// the answer streamed token by token from /v1/completions or /v1/chat/completions, each token
// tinted by q, the probability it was drawn with (the API's `sampled`: after temperature, top-k
// and top-p), with its alternatives on hover or focus: q beside the model's own p (`logprob`).
import { $, authHeaders, el, percent, probabilityTint, setStatus, shownToken } from "./common.js";

const TOP_LOGPROBS = 5;

// The stream's chunks as token entries {text, logprob, top: [[token, logprob], ...], sampled}:
// logprob and top are the model's log p; sampled ({id, logprob, top_logprobs}) is log q.
function entries(chunk, chat) {
  const choice = chunk.choices?.[0];
  if (!choice) return { text: "", tokens: [] };
  const text = chat ? choice.delta?.content ?? "" : choice.text ?? "";
  const lp = choice.logprobs;
  let tokens = [];
  if (chat && lp?.content) {
    tokens = lp.content.map((t) => ({
      text: t.token, logprob: t.logprob, top: t.top_logprobs.map((a) => [a.token, a.logprob]),
      sampled: t.sampled,
    }));
  } else if (!chat && lp?.tokens) {
    tokens = lp.tokens.map((t, i) => ({
      text: t, logprob: lp.token_logprobs[i], top: Object.entries(lp.top_logprobs[i] || {}),
      sampled: lp.sampled?.[i],
    }));
  }
  return { text, tokens };
}

// Server-sent events from a fetch response: each `data:` payload, parsed, until [DONE].
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data: "))
        .map((l) => l.slice(6)).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

// How the prompt was computed: the tokens the server's prefix cache held, and the chunks the
// rest took between the running batch's decode steps (usage's cached_tokens, prefill_chunks).
function promptLine(usage) {
  if (!usage) return "";
  const cached = usage.prompt_tokens_details?.cached_tokens ?? 0, chunks = usage.prefill_chunks ?? 0;
  return `; prompt ${usage.prompt_tokens} tokens: ${cached} from the prefix cache, ` +
    `${usage.prompt_tokens - cached} computed in ${chunks} chunk${chunks === 1 ? "" : "s"}`;
}

// What speculative decoding did: the tokens proposed from the text and those the model kept
// (usage's completion_tokens_details, OpenAI's names; the server speculates when it is started
// with --speculate and the request runs alone).
function proposalLine(usage) {
  const d = usage?.completion_tokens_details;
  if (!d) return "";
  const kept = d.accepted_prediction_tokens ?? 0, proposed = kept + (d.rejected_prediction_tokens ?? 0);
  return proposed ? `; ${kept} of ${proposed} proposed tokens accepted` : "";
}

export function generateView(state) {
  const chat = state.shape.chat;
  const form = $("#generate-form"), answer = $("#answer"), status = $("#generate-status");
  const panel = $("#alternatives"), conversation = $("#conversation");
  const prompt = $("#prompt"), stop = $("#stop-button"), go = $("#generate-button");
  const history = [];  // a chat model's conversation: {role, content}
  let controller = null;
  conversation.hidden = !chat;
  if (chat) $('label[for="prompt"]').textContent = "Your message";
  const maxTokens = $("#max-tokens");
  maxTokens.max = String(state.shape.context - 1);
  maxTokens.value = String(Math.min(Number(maxTokens.value), Math.floor(state.shape.context / 2)));

  // The alternatives the token was drawn among: q (what the sampler drew from) and the model's p.
  function showAlternatives(span, entry) {
    const p = Math.exp(entry.logprob), s = entry.sampled;
    const modelP = new Map(entry.top.map(([token, lp]) => [token, Math.exp(lp)]));
    const listed = s ? s.top_logprobs.map((a) => [a.token, Math.exp(a.logprob), Math.exp(a.model_logprob)])
      : entry.top.map(([token, lp]) => [token, null, Math.exp(lp)]);
    const rows = listed.map(([token, q, pm]) => el("tr", { class: token === entry.text ? "chosen" : "" },
      el("td", {}, shownToken(token)), el("td", { class: "p" }, q === null ? "–" : percent(q)),
      el("td", { class: "model-p" }, percent(pm ?? modelP.get(token))),
      el("td", {}, el("span", { class: "bar", style: `width:${Math.max(1, 60 * (q ?? pm))}px` }))));
    const settings = entry.settings;
    panel.replaceChildren(
      el("div", {}, `drawn ${JSON.stringify(entry.text)}: ` +
        (s ? `q = ${percent(Math.exp(s.logprob))} (T = ${settings.temperature}, top-k ${settings.top_k || "off"}, ` +
             `top-p ${settings.top_p}, min-p ${settings.min_p || "off"}); the model's p = ${percent(p)}` : `p = ${percent(p)}`)),
      el("table", { "aria-label": "Alternatives" },
        el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, "q: drawn from"),
          el("th", {}, "p: the model"), el("th", {}, ""))),
        el("tbody", {}, ...rows)));
    const box = span.getBoundingClientRect();
    panel.hidden = false;
    const left = Math.min(box.left + window.scrollX,
      window.scrollX + document.documentElement.clientWidth - panel.offsetWidth - 6);
    panel.style.left = `${Math.max(4, left)}px`;
    panel.style.top = `${box.bottom + window.scrollY + 4}px`;
  }
  const hide = () => { panel.hidden = true; };

  function addToken(text, entry) {
    if (!entry) { answer.append(text); return; }
    const p = Math.exp(entry.logprob);
    const q = entry.sampled ? Math.exp(entry.sampled.logprob) : p;
    const span = el("span", {
      class: "token", tabindex: "0", "data-testid": "token", "data-prob": q.toFixed(6),
      "data-model-prob": p.toFixed(6), style: `background:${probabilityTint(q)}`,
      "aria-label": `${JSON.stringify(entry.text)}, drawn with probability ${percent(q)}, the model's p ${percent(p)}`,
    }, text);
    span.addEventListener("mouseenter", () => showAlternatives(span, entry));
    span.addEventListener("focus", () => showAlternatives(span, entry));
    span.addEventListener("mouseleave", hide);
    span.addEventListener("blur", hide);
    answer.append(span);
  }

  function showConversation() {
    conversation.replaceChildren(...history.map((m) => el("div", { class: "turn" },
      el("span", { class: "role" }, `${m.role}:`), m.content)));
  }

  function request() {
    const number = (id) => Number($(id).value);
    const body = { stream: true, stream_options: { include_usage: true },
                   temperature: number("#temperature"), top_p: number("#top-p"),
                   top_k: number("#top-k"), min_p: number("#min-p"), max_tokens: number("#max-tokens") };
    const vector = $("#steer-vector").value;  // (docs/steering.md: h + s v at its block)
    if (vector) body.steering = { [vector]: number("#steer-strength") };
    if (chat) {
      history.push({ role: "user", content: prompt.value });
      showConversation();
      state.last = { messages: history.map((m) => ({ ...m })), text: prompt.value, generated: [] };
      return ["/v1/chat/completions",
              { ...body, messages: history, logprobs: true, top_logprobs: TOP_LOGPROBS }];
    }
    state.last = { prompt: prompt.value, text: prompt.value, generated: [] };
    return ["/v1/completions", { ...body, prompt: prompt.value, logprobs: TOP_LOGPROBS }];
  }

  async function generate() {
    if (controller) return;
    hide();
    const [path, body] = request();
    const settings = { temperature: body.temperature, top_k: body.top_k, top_p: body.top_p, min_p: body.min_p };
    const generated = state.last.generated;  // the ids drawn: the inside view analyses them too
    answer.replaceChildren();
    if (!chat) answer.append(el("span", { class: "prompt-text" }, prompt.value));
    controller = new AbortController();
    go.disabled = true; stop.disabled = false;
    setStatus(status, "generating…");
    let count = 0, reply = "", usage = null;
    const started = performance.now();
    try {
      const response = await fetch(path, {
        method: "POST", headers: authHeaders({ "content-type": "application/json" }),
        body: JSON.stringify(body), signal: controller.signal });
      if (!response.ok) {
        const data = await response.json().catch(() => ({}));
        throw new Error(data.error?.message || `${response.status} ${response.statusText}`);
      }
      for await (const chunk of events(response)) {
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        const { text, tokens } = entries(chunk, chat);
        reply += text;
        for (const t of tokens) {
          t.settings = settings;
          if (t.sampled) generated.push(t.sampled.id);
        }
        if (tokens.length === 1) addToken(text, tokens[0]);
        else if (tokens.length > 1) tokens.forEach((t) => addToken(t.text, t));
        else if (text) addToken(text, null);
        count += tokens.length;
      }
      const seconds = (performance.now() - started) / 1000;
      setStatus(status, `${count} tokens in ${seconds.toFixed(2)} s` + proposalLine(usage) +
                promptLine(usage));
    } catch (e) {
      if (e.name === "AbortError") setStatus(status, `stopped after ${count} tokens`);
      else setStatus(status, e.message, true);
    } finally {
      controller = null;
      go.disabled = false; stop.disabled = true;
      if (chat) {  // a failed turn leaves the conversation, and its message stays in the box
        if (reply) { history.push({ role: "assistant", content: reply }); prompt.value = ""; }
        else history.pop();
        showConversation();
      }
    }
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); generate(); });
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); generate(); }
  });
  stop.addEventListener("click", () => controller?.abort());
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") hide(); });
  return { show() {} };
}
