// The chat page: conversations kept by the server (the same history as `localspec chat`), replies
// streamed over /v1/chat/completions with each token's source, figures under each reply.
import { call, conversations, streamChat } from "/webui/api.js";
import { LiveChart } from "/webui/chart.js";
import { readText } from "/webui/files.js";
import { figures, note } from "/webui/figures.js";
import { withKey } from "/webui/keys.js";
import { joined, renderPlain, renderReply, renderStreaming } from "/webui/render.js";

const $ = (id) => document.getElementById(id);
const SAVE_EVERY_MS = 1000; // a reply in flight is written this often (a closed tab loses at most this)
// A streaming reply is redrawn at most this often: on a laptop the browser's redraws take CPU from the
// model's decoding on the same cores (docs/WEBUI.md, the page's pace).
const REDRAW_EVERY_MS = 250;
const SETTINGS = ["temperature", "max_tokens", "spec", "k"];

const state = { conv: null, defaults: {}, running: null, attachments: [], sources: true, model: null };

// --- the server's defaults -----------------------------------------------------------------------
function banner(text, kind = "error") {
  const b = $("banner");
  b.hidden = !text;
  b.textContent = text || "";
  b.className = kind;
}

async function loadDefaults() {
  for (;;) {
    try {
      const query = state.model ? "?model=" + encodeURIComponent(state.model) : "";
      const props = await withKey(() => call("GET", "/props" + query));
      const p = props.default_generation_settings.params;
      state.defaults = { temperature: p.temperature, max_tokens: p.n_predict, spec: p.spec, k: p["speculative.n_max"] };
      const draft = props.localspec?.draft ? " · draft " + props.localspec.draft.split("/").pop() : " · n-gram drafts";
      await listModels(props.model_alias);
      $("model").textContent = props.model_alias + draft; // last: the page is ready once the model shows
      banner("");
      return;
    } catch (e) {
      if (e.status !== 503) throw e;
      banner("The server is loading its model: " + e.message, "info");
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
}

// With several models on the server, a picker: the chosen one answers (loaded on demand by the server).
async function listModels(current) {
  const list = await withKey(() => call("GET", "/v1/models"));
  const pick = $("model-pick");
  if (list.data.length < 2) return;
  pick.replaceChildren(...list.data.map((m) => {
    const o = document.createElement("option");
    const status = m.status?.value;
    o.value = m.id;
    o.textContent = m.id + (status && status !== "loaded" ? ` (${status})` : "");
    return o;
  }));
  state.model = state.model || current;
  pick.value = state.model;
  pick.hidden = false;
}

async function pickModel() {
  state.model = $("model-pick").value;
  banner("Loading " + state.model + "…", "info");
  try {
    await loadDefaults();
  } catch (e) {
    banner(e.message);
  }
}

function showSettings(settings = {}, system = "") {
  $("set-system").value = system || "";
  for (const name of SETTINGS) {
    const el = $("set-" + name);
    el.value = settings[name] ?? "";
    const d = state.defaults[name];
    if (el.tagName === "SELECT") el.options[0].textContent = `server default (${d ?? "?"})`;
    else el.placeholder = d === undefined ? "" : String(d);
  }
}

function readSettings() {
  const out = {};
  for (const name of SETTINGS) {
    const v = $("set-" + name).value;
    if (v !== "") out[name] = name === "spec" ? v : Number(v);
  }
  return out;
}

// --- conversations --------------------------------------------------------------------------------
let listed = 0; // the latest refresh: an older one's answer, arriving late, is dropped
async function refreshList() {
  const mine = ++listed;
  const list = await withKey(() => conversations.list($("search").value.trim()));
  if (mine !== listed) return;
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of list.data) {
    const editing = $("title").querySelector("input"); // a rename in progress keeps its box
    if (state.conv && state.conv.id === c.id && !editing) renderPlain($("title"), c.title || `Conversation ${c.id}`);
    const li = document.createElement("li");
    const a = document.createElement("a");
    a.href = "#c=" + c.id;
    renderPlain(a, c.title || `Conversation ${c.id}`);
    if (state.conv && state.conv.id === c.id) a.setAttribute("aria-current", "page");
    li.append(a);
    ul.append(li);
  }
}

async function openConversation(id) {
  const conv = await withKey(() => conversations.get(id));
  state.conv = conv;
  $("messages").replaceChildren();
  for (const m of conv.messages) addView(m);
  renderPlain($("title"), conv.title || `Conversation ${conv.id}`);
  showSettings(conv.settings, conv.system);
  const pick = $("model-pick");
  if (!pick.hidden && conv.pair && conv.pair !== state.model && [...pick.options].some((o) => o.value === conv.pair)) {
    pick.value = conv.pair; // the conversation goes on with the model that answered it
    await pickModel();
  }
  await refreshList();
}

function newChat() {
  stop();
  state.conv = null;
  if (location.hash) history.replaceState(null, "", location.pathname);
  $("messages").replaceChildren();
  renderPlain($("title"), "New chat");
  showSettings();
  refreshList().catch((e) => banner(e.message));
  $("prompt").focus();
}

async function route() {
  const m = /^#c=(\d+)$/.exec(location.hash);
  if (m && state.conv && state.conv.id === Number(m[1])) return;
  if (!m) return newChat();
  stop();
  try {
    await openConversation(Number(m[1]));
  } catch (e) {
    banner(e.message);
    newChat();
  }
}

// --- messages on screen ---------------------------------------------------------------------------
function addView(m) {
  const art = document.createElement("article");
  art.className = "msg " + m.role;
  art.dataset.id = m.id ?? "";
  const body = document.createElement("div");
  body.className = "body";
  const meta = document.createElement("div");
  meta.className = "meta";
  const figs = document.createElement("span");
  figs.className = "figures";
  meta.append(figs);
  const actions = document.createElement("div");
  actions.className = "actions";
  art.append(body, meta, actions);
  art.runs = m.provenance?.length ? m.provenance : [["target", m.content]];
  if (m.role === "user") {
    renderPlain(body, m.content);
    actions.append(button("Edit", () => editFrom(art)));
  } else {
    renderReply(body, art.runs, { sources: state.sources });
    figs.textContent = [figures(m.stats), note(m)].filter(Boolean).join(" · ");
    actions.append(button("Regenerate", () => regenerate(art)), button("Copy", () => copyText(art)));
  }
  $("messages").append(art);
  art.scrollIntoView({ block: "end" });
  return art;
}

function button(label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}

async function copyText(art) {
  await navigator.clipboard.writeText(joined(art.runs)).catch(() => banner("the browser refused the clipboard"));
}

function rerenderAll() {
  for (const art of document.querySelectorAll("article.assistant")) {
    const render = art === state.running?.art ? renderStreaming : renderReply;
    render(art.querySelector(".body"), art.runs, { sources: state.sources });
  }
}

// --- sending and streaming ------------------------------------------------------------------------
// The reply streams at once; the history's writes (a new conversation, the prompt, the reply's row) start
// with its first token (or its end, when none comes), in order: while the prompt evaluates, the browser
// and the server leave the cores to it.
async function send() {
  const text = composed();
  if (!text.trim() || state.running) return;
  $("prompt").value = "";
  state.attachments = [];
  showAttachments();
  const art = addView({ role: "user", content: text });
  const fields = { system: $("set-system").value || null, settings: readSettings(), model: state.model };
  const conv = state.conv;
  const writePrompt = () => (conv ? Promise.resolve(conv) : withKey(() => conversations.create(fields)).then((c) => {
    state.conv = c;
    history.replaceState(null, "", "#c=" + c.id);
    return c;
  })).then((c) => withKey(() => conversations.addMessage(c.id, "user", text)))
    .then((msg) => { art.dataset.id = msg.id; });
  await generate(writePrompt);
  await refreshList().catch((e) => banner(e.message));
}

function composed() {
  const files = state.attachments.map((f) => `\n\n\`\`\`${f.name}\n${f.text}\n\`\`\``).join("");
  return $("prompt").value + files;
}

function turns() {
  const out = [];
  const system = $("set-system").value;
  if (system) out.push({ role: "system", content: system });
  for (const art of $("messages").querySelectorAll("article.msg")) {
    if (art === state.running?.art) continue;
    const content = art.classList.contains("user") ? art.querySelector(".body").textContent : joined(art.runs);
    if (content) out.push({ role: art.classList.contains("user") ? "user" : "assistant", content });
  }
  return out;
}

function requestBody() {
  const s = readSettings();
  const body = { messages: turns() };
  if (state.model) body.model = state.model;
  if (s.temperature !== undefined) body.temperature = s.temperature;
  if (s.max_tokens !== undefined) body.max_tokens = s.max_tokens;
  if (s.spec) body.spec = s.spec;
  if (s.k !== undefined) body["speculative.n_max"] = s.k;
  const predicted = $("prediction").value;
  if (predicted) body.prediction = { type: "content", content: predicted };
  return body;
}

async function generate(writeBefore = () => Promise.resolve()) {
  const body = requestBody();
  const art = addView({ role: "assistant", content: "" });
  art.runs = [];
  const run = { art, controller: new AbortController(), chart: new LiveChart(art.querySelector(".meta")),
    timer: 0, shown: 0, tokens: 0 };
  state.running = run;
  setRunning(true);
  // the reply's row, written after the prompt's; every later write of it waits for it
  let started = null;
  const start = () => started ??= writeBefore()
    .then(() => withKey(() => conversations.addMessage(state.conv.id, "assistant", "", false)))
    .then((msg) => { art.dataset.id = msg.id; });
  let saved = Promise.resolve();
  let lastSave = performance.now();
  const save = (fields) => {
    const runs = art.runs.map((r) => [...r]);
    saved = saved.then(start).then(() => conversations.updateMessage(state.conv.id, art.dataset.id,
      { content: joined(art.runs), provenance: runs, ...fields }));
  };
  const onPiece = (piece, source, live) => {
    const last = art.runs[art.runs.length - 1];
    if (last && last[0] === source) last[1] += piece;
    else art.runs.push([source, piece]);
    run.tokens += 1;
    run.live = live;
    if (run.tokens === 1) saved = saved.then(start);
    if (!run.timer) {
      const wait = Math.max(0, run.shown + REDRAW_EVERY_MS - performance.now());
      run.timer = setTimeout(() => requestAnimationFrame(() => showProgress(run)), wait);
    }
    if (performance.now() - lastSave > SAVE_EVERY_MS) {
      lastSave = performance.now();
      save({ complete: false });
    }
  };
  let end = {};
  try {
    const last = await withKey(() => streamChat(body, run.controller.signal, onPiece));
    end = { complete: true, stop_reason: last?.localspec?.stop_reason || "eos", stats: last?.localspec?.stats };
  } catch (e) {
    end = e.name === "AbortError" ? { complete: true, stop_reason: "cancelled" }
      : { complete: true, stop_reason: "error", error: e.message };
    if (e.name !== "AbortError") banner(e.message);
  }
  clearTimeout(run.timer);
  run.done = true;
  state.running = null;
  setRunning(false);
  renderReply(art.querySelector(".body"), art.runs, { sources: state.sources });
  art.dataset.tokens = String(run.tokens);
  art.querySelector(".figures").textContent = [figures(end.stats), note(end)].filter(Boolean).join(" · ");
  save(end);
  await saved.catch((e) => banner("the conversation could not be saved: " + e.message));
  art.dataset.done = "1";
}

function showProgress(run) {
  run.timer = 0;
  if (run.done) return;
  run.shown = performance.now();
  const { art } = run;
  renderStreaming(art.querySelector(".body"), art.runs, { sources: state.sources });
  art.dataset.tokens = String(run.tokens);
  run.chart.add(run.live);
  follow(art);
}

// Keeps a streaming reply's end in view by scrolling half a screen at a time, not a line per redraw:
// each scroll repaints the whole list, which on a software-rendered laptop costs the decoding CPU.
function follow(art) {
  const box = $("messages");
  const below = art.getBoundingClientRect().bottom - box.getBoundingClientRect().bottom;
  if (below > 0) box.scrollTop += below + box.clientHeight / 2;
}

function setRunning(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
}

function stop() {
  state.running?.controller.abort();
}

async function editFrom(art) {
  if (state.running) return;
  $("prompt").value = art.querySelector(".body").textContent;
  await dropFrom(art);
  $("prompt").focus();
}

async function regenerate(art) {
  if (state.running) return;
  await dropFrom(art);
  await generate();
}

async function dropFrom(art) {
  await withKey(() => conversations.removeFrom(state.conv.id, art.dataset.id));
  let el = art;
  while (el) {
    const next = el.nextElementSibling;
    el.remove();
    el = next;
  }
}

// --- files ----------------------------------------------------------------------------------------
async function attach(files) {
  for (const f of files) {
    try {
      state.attachments.push({ name: f.name, text: await readText(f) });
      banner("");
    } catch (e) {
      banner(e.message);
    }
  }
  showAttachments();
}

function showAttachments() {
  const box = $("attachments");
  box.replaceChildren(...state.attachments.map((f, i) => button(`${f.name} ✕`, () => {
    state.attachments.splice(i, 1);
    showAttachments();
  })));
}

// --- wiring -----------------------------------------------------------------------------------------
async function saveSettings() {
  if (!state.conv) return;
  await withKey(() => conversations.update(state.conv.id, { system: $("set-system").value || null, settings: readSettings() }))
    .catch((e) => banner(e.message));
}

function rename() {
  if (!state.conv || $("title").querySelector("input")) return;
  const title = $("title"), before = title.textContent;
  const input = document.createElement("input");
  input.value = before;
  input.maxLength = 200;
  input.setAttribute("aria-label", "Conversation title (Enter saves, Escape keeps it)");
  title.replaceChildren(input);
  input.focus();
  input.select();
  let done = false;
  const finish = async (keep) => {
    if (done) return;
    done = true;
    const name = input.value.trim();
    renderPlain(title, keep && name ? name : before);
    if (!keep || !name || name === before) return;
    await withKey(() => conversations.update(state.conv.id, { title: name })).catch((e) => banner(e.message));
    await refreshList().catch((e) => banner(e.message));
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === "Escape") {
      e.preventDefault();
      finish(e.key === "Enter");
    }
  });
  input.addEventListener("blur", () => finish(false));
}

let confirmDelete = 0;
async function removeConversation() {
  if (!state.conv) return;
  if (Date.now() - confirmDelete > 3000) {
    confirmDelete = Date.now();
    $("delete").textContent = "Delete? Click again";
    setTimeout(() => { $("delete").textContent = "Delete"; }, 3000);
    return;
  }
  await withKey(() => conversations.remove(state.conv.id));
  $("delete").textContent = "Delete";
  newChat();
}

function wire() {
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  $("rename").addEventListener("click", rename);
  $("delete").addEventListener("click", removeConversation);
  $("export").addEventListener("click", (e) => {
    if (state.conv) withKey(() => conversations.export(state.conv.id, e.shiftKey ? "json" : "md")).catch((err) => banner(err.message));
  });
  $("search").addEventListener("input", () => refreshList().catch((e) => banner(e.message)));
  $("attach").addEventListener("change", (e) => { attach([...e.target.files]); e.target.value = ""; });
  $("prediction-file").addEventListener("change", async (e) => {
    const f = e.target.files[0];
    if (f) $("prediction").value = await readText(f).catch((err) => { banner(err.message); return ""; });
  });
  $("show-sources").addEventListener("change", (e) => { state.sources = e.target.checked; rerenderAll(); });
  $("settings-toggle").addEventListener("click", () => {
    const open = $("settings").hidden;
    $("settings").hidden = !open;
    $("settings-toggle").setAttribute("aria-expanded", String(open));
  });
  for (const id of ["set-system", ...SETTINGS.map((s) => "set-" + s)]) $(id).addEventListener("change", saveSettings);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.running) stop();
    else if (e.altKey && e.key.toLowerCase() === "t") { $("show-sources").click(); e.preventDefault(); }
    else if (e.ctrlKey && e.shiftKey && e.key.toLowerCase() === "o") { e.preventDefault(); newChat(); }
    else if (e.ctrlKey && e.key.toLowerCase() === "k") { e.preventDefault(); $("search").focus(); }
  });
  window.addEventListener("hashchange", route);
  $("model-pick").addEventListener("change", pickModel);
}

async function main() {
  wire();
  try {
    await loadDefaults();
    await route();
  } catch (e) {
    banner(e.message);
  }
}

main();
