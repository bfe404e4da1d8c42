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
const SOURCES = { model: "src-model", ngram: "src-ngram" }; // the target's own tokens stay untinted
const SEARCH = 400; // how far ahead a rendered character is looked for in the reply's text
const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ENTITIES[c]);

// HTML a model writes is shown as the text it is (a reply about HTML shows its tags); only the markdown
// is rendered. Whatever marked makes of links still goes through DOMPurify.
const markdown = new Marked({ gfm: true, breaks: false, renderer: { html: ({ text }) => escapeHtml(text) } });

export function safeHtml(text) {
  return DOMPurify.sanitize(markdown.parse(text), PURIFY);
}

// Renders `runs` ([[source, text], ...], the history's provenance) into `el`.
export function renderReply(el, runs, { sources = true, final = true } = {}) {
  const text = runs.map((r) => r[1]).join("");
  el.innerHTML = safeHtml(text);
  for (const a of el.querySelectorAll("a[href]")) {
    a.target = "_blank";
    a.rel = "noopener noreferrer";
  }
  if (final) for (const code of el.querySelectorAll("pre code")) hljs.highlightElement(code);
  if (sources) tint(el, text, sourceOfEachChar(runs));
  for (const pre of el.querySelectorAll("pre")) addCopyButton(pre);
}

function sourceOfEachChar(runs) {
  const out = [];
  for (const [source, text] of runs) for (let i = 0; i < text.length; i++) out.push(source);
  return out;
}

// Markdown drops its syntax (`**`, `#`, fences) but keeps the text in order: each rendered character is
// matched to the next equal character of the reply's text, and runs from a draft are wrapped in a span.
function tint(el, text, sources) {
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
    wrapRuns(node, shown, marks);
  }
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
