// The page's entry: the model's shape, the three views and the tabs between them.
import { $, api, el, KEY_STORE } from "./common.js";
import { generateView } from "./generate.js";
import { insideView } from "./inside.js";
import { runsView } from "./runs.js";
import { stepView } from "./step.js";  // the Step and Backprop views
import { backwardView } from "./backward.js";
import { patchView } from "./patch.js";

// What the views share: the model's shape and the last prompt generated from
// ({prompt: text} or {messages: [...]} for a chat model: what /v1/inspect is asked).
const state = { shape: null, last: null };
const views = {};
const tabs = [...document.querySelectorAll('[role="tab"]')];

function select(name, focus = false) {
  for (const tab of tabs) {
    const on = tab.dataset.view === name;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(`#${tab.dataset.view}`).hidden = !on;
    if (on && focus) tab.focus();
  }
  if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
  views[name]?.show();
}

for (const tab of tabs) {
  tab.addEventListener("click", () => select(tab.dataset.view));
  tab.addEventListener("keydown", (e) => {  // the tabs pattern: arrows move between tabs
    const i = tabs.indexOf(tab);
    const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
    const to = step ? tabs[(i + step + tabs.length) % tabs.length]
      : e.key === "Home" ? tabs[0] : e.key === "End" ? tabs[tabs.length - 1] : null;
    if (to) { e.preventDefault(); select(to.dataset.view, true); }
  });
}

async function start() {
  const key = $("#api-key");
  key.value = sessionStorage.getItem(KEY_STORE) || "";
  key.addEventListener("change", () => {  // the new key for this tab; start again with it
    sessionStorage.setItem(KEY_STORE, key.value.trim());
    location.reload();
  });
  try {
    state.shape = await api("/v1/inspect");
  } catch (e) {
    $("#model-line").textContent = `cannot reach the model: ${e.message}`;
    return;
  }
  const s = state.shape;
  for (const [key, id] of [["temperature", "#temperature"], ["top_k", "#top-k"], ["top_p", "#top-p"], ["min_p", "#min-p"]]) {
    if (s.sampling && s.sampling[key] !== undefined) $(id).value = String(s.sampling[key]);  // the server's defaults
  }
  if (s.steering?.length) {  // the server's steering vectors (serve --steer): one may be added
    $("#steer-vector").append(...s.steering.map((v) => el("option", { value: v.name },
      `${v.name} (block ${v.layer})`)));
    $("#steering-controls").hidden = false;
  }
  $("#model-line").textContent = `${s.model}: ${s.n_layer} layers, ${s.n_head} heads, width ` +
    `${s.n_embd}, context ${s.context}, ${s.pos_encoding} positions, ${s.engine} engine` +
    (s.chat ? ", chat" : "");
  views.generate = generateView(state);
  views.inside = insideView(state);
  views.runs = runsView(state);
  views.step = stepView(state);
  views.backward = backwardView(state);
  views.patch = patchView(state);
  const first = location.hash.slice(1);
  select(views[first] ? first : "generate");
}

start();
