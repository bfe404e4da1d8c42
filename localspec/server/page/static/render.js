// A reply's text as the page shows it: markdown (marked) made safe (DOMPurify), code highlighted
// (highlight.js), and each character tinted by the source of the token it came from.
import { Marked } from "/webui/vendor/marked.esm.js";
import DOMPurify from "/webui/vendor/purify.es.mjs";
import hljs from "/webui/vendor/highlight.min.js";

// Model output may hold any HTML: nothing that runs, loads or styles itself survives (the page's CSP
// would refuse it anyway, with an error in the console).
const PURIFY = {
  FORBID_TAGS: ["style", "img", "video", "audio", "source", "picture", "iframe", "object", "embed", "form",
    "input", "button", "textarea", "select", "link", "meta", "base", "svg", "math"],
  FORBID_ATTR: ["style", "srcset", "action", "formaction"],
};
const SOURCES = { model: "src-model", ngram: "src-ngram", mtp: "src-mtp" }; // the target's own tokens stay untinted
const SEARCH = 400; // how far ahead a rendered character is looked for in the reply's text
const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ENTITIES[c]);

// HTML a model writes is shown as the text it is (a reply about HTML shows its tags); only the markdown
// is rendered. Whatever marked makes of links still goes through DOMPurify.
const markdown = new Marked({ gfm: true, breaks: false, renderer: { html: ({ text }) => escapeHtml(text) } });

export function safeHtml(text) {
  return DOMPurify.sanitize(markdown.parse(text), PURIFY);
}

// Renders `runs` ([[source, text], ...], the history's provenance) into `el`: a whole reply, highlighted.
export function renderReply(el, runs, { sources = true } = {}) {
  forget(el);
  fill(el, el, joined(runs), sources ? sourceOfEachChar(runs) : null, true);
}

// While a reply streams, what lies before its last paragraph break outside a code fence no longer
// changes: each such stretch is rendered once, into a block of its own, and only the tail is redrawn.
export function renderStreaming(el, runs, { sources = true } = {}) {
  let s = streams.get(el);
  if (!s || s.sources !== sources) {
    forget(el);
    s = { upto: 0, sources, tail: document.createElement("div") };
    el.replaceChildren(s.tail);
    streams.set(el, s);
  }
  const text = joined(runs), srcs = sources ? sourceOfEachChar(runs) : null;
  const settled = settledUpTo(text, s.upto);
  if (settled > s.upto) {
    const part = document.createElement("div");
    fill(part, el, text.slice(s.upto, settled), srcs?.slice(s.upto, settled), false);
    s.tail.before(part);
    s.upto = settled;
  }
  untint(s.tail);
  fill(s.tail, s.tail, text.slice(s.upto), srcs?.slice(s.upto), false);
}

const streams = new WeakMap(); // a streaming reply's element -> { upto, sources, tail }

function forget(el) {
  const s = streams.get(el);
  if (s) untint(s.tail);
  streams.delete(el);
  untint(el);
}

function settledUpTo(text, from) {
  let fenced = false, at = from, pos = from;
  for (const line of text.slice(from).split("\n")) {
    pos += line.length + 1;
    if (/^ {0,3}(```|~~~)/.test(line)) fenced = !fenced;
    else if (!fenced && !line.trim() && pos <= text.length) at = pos;
  }
  return at;
}

// `text` as safe HTML in `container`; its sources' ranges are held by `owner` (untint(owner) drops them).
function fill(container, owner, text, sources, final) {
  container.innerHTML = safeHtml(text);
  for (const a of container.querySelectorAll("a[href]")) {
    a.target = "_blank";
    a.rel = "noopener noreferrer";
  }
  if (final) for (const code of container.querySelectorAll("pre code")) hljs.highlightElement(code);
  if (sources) tint(owner, container, text, sources);
  for (const pre of container.querySelectorAll("pre")) addCopyButton(pre);
}

export const joined = (runs) => runs.map((r) => r[1]).join(""); // a reply's text from its runs

function sourceOfEachChar(runs) {
  const out = [];
  for (const [source, text] of runs) for (let i = 0; i < text.length; i++) out.push(source);
  return out;
}

// The sources are ranges of the CSS Custom Highlight API, styled by ::highlight(src-model): no element is
// added, so redrawing a streaming reply costs no more layout than its markdown (spans where unsupported).
const HIGHLIGHTS = globalThis.CSS?.highlights
  ? Object.fromEntries(Object.entries(SOURCES).map(([source, name]) => {
    const h = new Highlight();
    CSS.highlights.set(name, h);
    return [source, h];
  }))
  : null;
const ranges = new WeakMap(); // element -> [[highlight, range], ...] it holds

function untint(el) {
  for (const [h, r] of ranges.get(el) || []) h.delete(r);
  ranges.delete(el);
}

// Markdown drops its syntax (`**`, `#`, fences) but keeps the text in order: each rendered character is
// matched to the next equal character of the reply's text, and runs from a draft are marked.
function tint(owner, el, text, sources) {
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  const nodes = [];
  while (walker.nextNode()) nodes.push(walker.currentNode);
  let j = 0;
  for (const node of nodes) {
    const shown = node.data;
    const marks = new Array(shown.length);
    for (let i = 0; i < shown.length; i++) {
      const at = text.indexOf(shown[i], j);
      if (at >= 0 && at - j < SEARCH) {
        marks[i] = sources[at];
        j = at + 1;
      } else {
        marks[i] = "target";
      }
    }
    if (HIGHLIGHTS) markRuns(owner, node, marks);
    else wrapRuns(node, shown, marks);
  }
}

function markRuns(el, node, marks) {
  const held = ranges.get(el) || [];
  let start = 0;
  for (let i = 1; i <= marks.length; i++) {
    if (i < marks.length && marks[i] === marks[start]) continue;
    const h = HIGHLIGHTS[marks[start]];
    if (h) {
      const r = new Range();
      r.setStart(node, start);
      r.setEnd(node, i);
      h.add(r);
      held.push([h, r]);
    }
    start = i;
  }
  ranges.set(el, held);
}

function wrapRuns(node, shown, marks) {
  if (!marks.some((m) => m in SOURCES)) return;
  const frag = document.createDocumentFragment();
  let start = 0;
  for (let i = 1; i <= shown.length; i++) {
    if (i < shown.length && marks[i] === marks[start]) continue;
    const piece = shown.slice(start, i);
    const cls = SOURCES[marks[start]];
    if (cls) {
      const span = document.createElement("span");
      span.className = cls;
      span.textContent = piece;
      frag.append(span);
    } else {
      frag.append(piece);
    }
    start = i;
  }
  node.replaceWith(frag);
}

function addCopyButton(pre) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = "Copy";
  button.title = "Copy this code";
  button.addEventListener("click", async () => {
    const code = pre.querySelector("code")?.innerText ?? pre.innerText;
    try {
      await navigator.clipboard.writeText(code);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  pre.append(button);
}

// Plain text (a prompt, a title, a file) shown as it is: never parsed as HTML.
export function renderPlain(el, text) {
  el.textContent = text;
}
