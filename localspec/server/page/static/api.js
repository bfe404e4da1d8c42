// The server's API as the page uses it: JSON calls with the key, the chat stream, the conversations.

const KEY_ITEM = "localspec.apiKey";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export const key = {
  get: () => localStorage.getItem(KEY_ITEM) || "",
  set: (value) => localStorage.setItem(KEY_ITEM, value),
};

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (key.get()) h["Authorization"] = "Bearer " + key.get();
  return h;
}

async function failure(res) {
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    message = body?.error?.message || body?.error || message;
  } catch { /* not JSON: the status says it */ }
  return new ApiError(res.status, String(message));
}

// A conversation as a file: the server writes it (Markdown or JSON), the browser saves it.
export async function download(path, name) {
  const res = await fetch(path, { headers: headers(false) });
  if (!res.ok) throw await failure(res);
  const a = document.createElement("a");
  a.href = URL.createObjectURL(await res.blob());
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
}

export async function call(method, path, body) {
  const res = await fetch(path, {
    method, headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) throw await failure(res);
  return res.status === 204 ? null : res.json();
}

// Streams /v1/chat/completions; onPiece(text, source, liveStats) per piece, resolves with the last
// chunk (finish_reason, timings, localspec figures). `signal` aborts: the server cancels within a round.
export async function streamChat(body, signal, onPiece) {
  const res = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers(true), signal,
    body: JSON.stringify({ ...body, stream: true, timings_per_token: true }),
  });
  if (!res.ok) throw await failure(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "", last = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        if (chunk.error) throw new ApiError(500, chunk.error.message || "the answer failed");
        const choice = chunk.choices?.[0];
        if (choice?.delta?.content) {
          onPiece(choice.delta.content, chunk.localspec?.source || "target", chunk.localspec?.stats);
        }
        if (choice?.finish_reason) last = chunk;
      }
    }
  }
  return last;
}

const BASE = "/localspec/conversations";
export const conversations = {
  list: (search) => call("GET", BASE + (search ? "?search=" + encodeURIComponent(search) : "")),
  get: (id) => call("GET", `${BASE}/${id}`),
  create: (fields) => call("POST", BASE, fields),
  update: (id, fields) => call("PATCH", `${BASE}/${id}`, fields),
  remove: (id) => call("DELETE", `${BASE}/${id}`),
  export: (id, format) => download(`${BASE}/${id}/export?format=${format}`, `conversation-${id}.${format}`),
  addMessage: (id, role, content, complete = true) =>
    call("POST", `${BASE}/${id}/messages`, { role, content, complete }),
  updateMessage: (id, mid, fields) => call("PATCH", `${BASE}/${id}/messages/${mid}`, fields),
  removeFrom: (id, mid) => call("DELETE", `${BASE}/${id}/messages/${mid}`),
};
