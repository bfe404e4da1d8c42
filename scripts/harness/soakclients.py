"""One request of each protocol `localspec serve` speaks, as its clients send it, timed: scripts/soak's clients.

`send(url, req)` posts one request (streamed or not), reads its text as that protocol's clients do, and
returns an `Outcome`: the text, seconds to the first byte of text and to the whole answer, and, when it was
not an answer, the kind of failure. A failure is anything but the answer, a hang-up the client chose, or the
protocol's documented error for an overload (a 503 in the protocol's error shape: `overloaded`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

TIMEOUT = httpx.Timeout(600.0, connect=10.0)


@dataclass
class Request:
    protocol: str  # a key of PROTOCOLS
    model: str  # the name sent ("" to llama-server, which serves one)
    body: dict  # the protocol's body, without model and stream
    stream: bool = True
    hangup_after: int | None = None  # close the stream after this many pieces of text
    greedy: bool = True  # temperature 0: compared with a quiet server's answer
    exempt: str = ""  # why its greedy text may part from a quiet server's (docs/EXACT.md), "" if it may not

    def key(self) -> str:
        """The same request, however sent (streamed or not): what its quiet answer is looked up by."""
        return json.dumps([self.protocol, self.model, self.body], sort_keys=True)


@dataclass
class Outcome:
    req: Request
    started: float  # time.monotonic() at sending
    status: int | None = None
    text: str = ""
    first_s: float | None = None
    total_s: float = 0.0
    failure: str = ""  # "" for an answer; `overloaded` and `hung-up` are not failures
    detail: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def answered(self) -> bool:
        return not self.failure


def _chat_body(b: dict, n: int) -> dict:
    return {"messages": b["messages"], "max_tokens": n, "temperature": 0}


# protocol -> (path, body builder (request body, max tokens) -> dict, streamed piece, whole answer's text)
PROTOCOLS = {
    "openai-chat": ("/v1/chat/completions", lambda b, n: _chat_body(b, n),
                    lambda ev: (ev.get("choices") or [{}])[0].get("delta", {}).get("content"),
                    lambda r: r["choices"][0]["message"]["content"]),
    "openai-completions": ("/v1/completions", lambda b, n: {"prompt": b["prompt"], "max_tokens": n, "temperature": 0},
                           lambda ev: (ev.get("choices") or [{}])[0].get("text"), lambda r: r["choices"][0]["text"]),
    "anthropic": ("/v1/messages", lambda b, n: {**{k: v for k, v in b.items() if k in ("system", "messages")},
                                                "max_tokens": n, "temperature": 0},
                  lambda ev: ev.get("delta", {}).get("text") if ev.get("type") == "content_block_delta" else None,
                  lambda r: "".join(c.get("text", "") for c in r["content"])),
    "responses": ("/v1/responses", lambda b, n: {"input": b["input"], "max_output_tokens": n, "temperature": 0},
                  lambda ev: ev.get("delta") if ev.get("type") == "response.output_text.delta" else None,
                  lambda r: "".join(c.get("text", "") for o in r["output"] for c in o.get("content", []))),
    "ollama-chat": ("/api/chat", lambda b, n: {"messages": b["messages"], "options": {"temperature": 0, "num_predict": n}},
                    lambda ev: ev.get("message", {}).get("content"), lambda r: r["message"]["content"]),
    "ollama-generate": ("/api/generate", lambda b, n: {"prompt": b["prompt"], "options": {"temperature": 0, "num_predict": n}},
                        lambda ev: ev.get("response"), lambda r: r["response"]),
    "completion": ("/completion", lambda b, n: {"prompt": b["prompt"], "n_predict": n, "temperature": 0},
                   lambda ev: ev.get("content"), lambda r: r["content"]),
    "infill": ("/infill", lambda b, n: {**b, "n_predict": n, "temperature": 0},
               lambda ev: ev.get("content"), lambda r: r["content"]),
}
NDJSON = ("ollama-chat", "ollama-generate")


def body_of(req: Request) -> dict:
    path, build, _, _ = PROTOCOLS[req.protocol]
    body = build(req.body, req.body["max"])
    if req.body.get("exact"):  # localspec's batch-invariant mode: the same text however loaded (docs/EXACT.md)
        body["exact"] = True
    if req.model:
        body["model"] = req.model
    body["stream"] = req.stream
    return body


def send(client: httpx.Client, url: str, req: Request, on_piece=None) -> Outcome:
    """on_piece(text): called with each streamed piece (the page saves its reply as it streams); what it
    raises ends the request as a `page-write` failure."""
    out = Outcome(req, time.monotonic())
    path, _, piece_of, text_of = PROTOCOLS[req.protocol]
    try:
        if req.stream:
            _stream(client, url + path, req, out, piece_of, on_piece)
        else:
            r = client.post(url + path, json=body_of(req), timeout=TIMEOUT)
            out.status = r.status_code
            if r.status_code == 200:
                out.text = text_of(r.json())
                out.first_s = time.monotonic() - out.started
            else:
                _refused(out, r.status_code, r.text)
    except httpx.HTTPError as e:
        out.failure, out.detail = "connection", f"{type(e).__name__}: {str(e)[:120]}"
    except (ValueError, KeyError, TypeError, IndexError) as e:
        out.failure, out.detail = "malformed", f"{type(e).__name__}: {str(e)[:120]}"
    out.total_s = time.monotonic() - out.started
    return out


def _stream(client: httpx.Client, url: str, req: Request, out: Outcome, piece_of, on_piece) -> None:
    pieces: list[str] = []
    with client.stream("POST", url, json=body_of(req), timeout=TIMEOUT) as r:
        out.status = r.status_code
        if r.status_code != 200:
            _refused(out, r.status_code, r.read().decode("utf-8", "replace"))
            return
        for line in r.iter_lines():
            ev = _event(line, req.protocol in NDJSON)
            if ev is None:
                continue
            if "error" in ev or ev.get("type") in ("response.failed", "error"):  # an error after the 200
                out.failure, out.detail = "error-event", json.dumps(ev)[:160]
                return
            piece = piece_of(ev)
            if piece:
                if out.first_s is None:
                    out.first_s = time.monotonic() - out.started
                pieces.append(piece)
                if on_piece is not None:
                    try:
                        on_piece(piece)
                    except Exception as e:  # noqa: BLE001 (the page's write failed: reported, not raised)
                        out.failure, out.detail = "page-write", str(e)[:160]
                        break
                if req.hangup_after is not None and len(pieces) >= req.hangup_after:
                    out.failure = "hung-up"  # the client's choice: closing the stream is its hang-up
                    break
    out.text = "".join(pieces)


def _event(line: str, ndjson: bool) -> dict | None:
    if ndjson:
        return json.loads(line) if line.strip() else None
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    return None if not data or data == "[DONE]" else json.loads(data)


def _refused(out: Outcome, status: int, text: str) -> None:
    """A status other than 200: the documented overload (a 503 with an error body), else a failure."""
    shaped = False
    try:
        doc = json.loads(text)
        shaped = isinstance(doc, dict) and "error" in doc
    except ValueError:
        pass
    out.failure = "overloaded" if status == 503 and shaped else f"http {status}"
    out.detail = text[:160]


NOT_FAILURES = ("", "overloaded", "hung-up")
