"""Fault probes against a real `localspec serve` process: what a hostile page, a broken client, a flaky
disk or an impatient user does. Each probe returns a list of `Finding`s (ok or not, and what was seen);
tests/server/test_faults.py asserts them on the tiny models, scripts/fault-check runs them all on any pair and
prints the table, then the soak.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Finding:
    probe: str
    ok: bool
    seen: str


def request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            timeout: float = 120) -> tuple[int, dict, bytes]:
    """One raw HTTP request (http.client sends headers as given: empty bearers, foreign Hosts)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def post_json(port: int, path: str, body, headers: dict | None = None, timeout: float = 120):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request(port, "POST", path, raw, {"Content-Type": "application/json", **(headers or {})}, timeout)


def is_error_json(status: int, raw: bytes, want_status: int) -> tuple[bool, str]:
    try:
        err = json.loads(raw)["error"]
        shaped = {"code", "message", "type"} <= set(err)
    except (ValueError, KeyError, TypeError):
        return False, f"{status}: not an error JSON: {raw[:120]!r}"
    return status == want_status and shaped, f"{status}: {err.get('message', '')[:100]}"


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

# (probe name, path, body bytes, expected status)
HOSTILE_BODIES = [
    ("nested 100k deep", "/v1/chat/completions", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 400),
    ("model is a list", "/v1/chat/completions", json.dumps({**CHAT, "model": ["x"]}).encode(), 400),
    ("lone surrogate in chat", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "half \\ud83d"}], "max_tokens": 2}', 400),
    ("lone surrogate in /tokenize", "/tokenize", b'{"content": "x\\udc00y"}', 400),
    ("lone surrogate in /infill", "/infill", b'{"input_prefix": "a\\ud800", "input_suffix": "", "n_predict": 2}', 400),
    ("lone surrogate in a key", "/v1/chat/completions", b'{"\\ud800": 1, "messages": []}', 400),
    ("not JSON", "/v1/chat/completions", b"{nope", 400),
    ("not UTF-8", "/completion", b"\xff\xfe\xfd", 400),
    ("JSON array", "/completion", b"[1,2,3]", 400),
    ("huge number", "/completion", b'{"prompt": "a", "n_predict": 1' + b"0" * 5000 + b"}", 400),
    ("NaN literal", "/completion", b'{"prompt": "a", "temperature": NaN}', 400),
    ("unknown role", "/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400),
    ("token id out of range", "/completion", json.dumps({"prompt": [10**12], "n_predict": 1}).encode(), 400),
    ("negative token id", "/detokenize", json.dumps({"tokens": [-1]}).encode(), 400),
    ("logit_bias of a string", "/v1/chat/completions", json.dumps({**CHAT, "logit_bias": {"1": "x"}}).encode(), 400),
    ("logit_bias id out of range", "/v1/chat/completions", json.dumps({**CHAT, "logit_bias": {"99999999": 1}}).encode(), 400),
    ("samplers not a list", "/completion", json.dumps({"prompt": "a", "samplers": 5}).encode(), 400),
    ("n_probs huge", "/completion", json.dumps({"prompt": "a", "n_predict": 1, "n_probs": 10**9}).encode(), 200),
    ("store not a boolean, streamed", "/v1/responses",
     json.dumps({"input": "hi", "store": "no", "stream": True, "max_output_tokens": 2}).encode(), 400),
    ("a prompt over the context, streamed", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": "cache " * 40_000}], "stream": True}).encode(), 400),
]


def probe_hostile_bodies(port: int) -> list[Finding]:
    out = []
    for name, path, body, want in HOSTILE_BODIES:
        status, _, raw = post_json(port, path, body)
        if want == 200:
            ok, seen = status == 200, f"{status}"
        else:
            ok, seen = is_error_json(status, raw, want)
        out.append(Finding(f"body: {name}", ok, seen))
    return out


def probe_foreign_pages(port: int) -> list[Finding]:
    """DNS rebinding (a foreign Host), a cross-site form or text POST (an Origin, a non-JSON type)."""
    out = []
    s, _, raw = request(port, "GET", "/props", headers={"Host": f"evil.example:{port}"})
    out.append(Finding("foreign Host (DNS rebinding)", *is_error_json(s, raw, 403)))
    s, _, raw = post_json(port, "/completion", {"prompt": "a", "n_predict": 1},
                          {"Origin": "http://evil.example"})
    out.append(Finding("cross-origin POST", *is_error_json(s, raw, 403)))
    s, _, raw = request(port, "POST", "/completion", b'{"prompt": "a", "n_predict": 1}',
                        {"Content-Type": "text/plain"})
    out.append(Finding("text/plain body (no preflight)", *is_error_json(s, raw, 415)))
    s, _, raw = request(port, "POST", "/completion", b"prompt=a", {"Content-Type": "application/x-www-form-urlencoded"})
    out.append(Finding("form body", *is_error_json(s, raw, 415)))
    s, _, _ = request(port, "GET", "/health", headers={"Host": f"localhost:{port}"})
    out.append(Finding("localhost Host still served", s == 200, str(s)))
    s, _, _ = request(port, "GET", "/health", headers={"Host": f"[::1]:{port}"})
    out.append(Finding("[::1] Host still served", s == 200, str(s)))
    return out


def probe_big_inputs(port: int, stall_s: float = 1.0) -> list[Finding]:
    """A 10 MB /tokenize must not stall the event loop: /health answers while it runs (main: nothing
    answered for the ~3 s it took)."""
    out = []
    done = {}

    def tokenize():
        t0 = time.monotonic()
        s, _, _ = post_json(port, "/tokenize", {"content": "the cache " * 1_000_000}, timeout=300)
        done["tokenize"] = (s, time.monotonic() - t0)
    t = threading.Thread(target=tokenize)
    t.start()
    time.sleep(0.3)
    health = []
    while t.is_alive() and len(health) < 50:
        t0 = time.monotonic()
        s, _, _ = request(port, "GET", "/health", timeout=30)
        health.append((s, time.monotonic() - t0, t.is_alive()))
        time.sleep(0.05)
    t.join()
    answered_during = [h for h in health if h[2]]
    worst = max((h[1] for h in answered_during), default=0.0)
    out.append(Finding("/health during a 10 MB /tokenize", bool(answered_during) and worst < stall_s,
                       f"tokenize {done['tokenize'][0]} in {done['tokenize'][1]:.1f} s; {len(answered_during)} health "
                       f"answers meanwhile, slowest {worst * 1000:.0f} ms"))
    s, _, raw = request(port, "POST", "/completion", b"{}", {"Content-Type": "application/json",
                                                             "Content-Length": str(1 << 30)}, timeout=30)
    out.append(Finding("a 1 GB Content-Length", *is_error_json(s, raw, 413)))
    return out


def probe_hangups(port: int) -> list[Finding]:
    """Clients that vanish: mid-body, mid-stream, before reading. The server must keep serving."""
    with socket.create_connection(("127.0.0.1", port)) as sk:  # a body that never arrives whole
        sk.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
    with socket.create_connection(("127.0.0.1", port)) as sk:  # a stream dropped after its first bytes
        body = json.dumps({"prompt": "the cache", "n_predict": 64, "stream": True}).encode()
        sk.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        sk.recv(64)
    s, _, raw = post_json(port, "/completion", {"prompt": "the model", "n_predict": 4}, timeout=120)
    return [Finding("serving after hang-ups", s == 200, f"{s}")]


# (probe name, method, path, body, expected status, the protocol's error shape: a key path to a message)
FOREIGN_PATHS = [
    ("GET on Anthropic's path", "GET", "/v1/messages", None, 405, ("error", "message"), ("type",)),
    ("unknown Ollama path", "POST", "/api/nope", b"{}", 404, ("error",), ()),
    ("unknown OpenAI path", "GET", "/v1/nope", None, 404, ("error", "message"), ("error", "code")),
]


def probe_error_shapes(port: int) -> list[Finding]:
    """A path no route has answers in the error shape of the protocol its path belongs to."""
    out = []
    for name, method, path, body, want, msg_path, extra in FOREIGN_PATHS:
        s, _, raw = request(port, method, path, body, {"Content-Type": "application/json"} if body else {})
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        ok = s == want and isinstance(_at(obj, msg_path), str) and _at(obj, extra) is not None
        out.append(Finding(name, ok, f"{s}: {raw[:100]!r}"))
    return out


def _at(obj, path):
    """obj[path[0]][path[1]]..., or None where a key is missing."""
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return None
        obj = obj[k]
    return obj


USER = {"role": "user", "content": "weather?"}
TOOL_USE = {"type": "tool_use", "name": "weather", "input": {}}
# (probe name, path, body, the field the 400 must name)
BAD_CALL_IDS = [
    ("Anthropic tool_use without id", "/v1/messages",
     {"max_tokens": 4, "messages": [USER, {"role": "assistant", "content": [TOOL_USE]}]}, "messages.1.content.0.id"),
    ("Anthropic tool_result for an unknown id", "/v1/messages",
     {"max_tokens": 4, "messages": [USER, {"role": "assistant", "content": [{**TOOL_USE, "id": "toolu_1"}]},
                                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2",
                                                                  "content": "sunny"}]}]}, "tool_use_id"),
    ("Responses output for an unknown call_id", "/v1/responses",
     {"max_output_tokens": 4, "input": [{"type": "function_call_output", "call_id": "call_9", "output": "sunny"}]},
     "call_id"),
]


def probe_call_ids(port: int) -> list[Finding]:
    """Tool results that answer no call: a 400 naming the field, as Anthropic's and OpenAI's APIs answer."""
    out = []
    for name, path, body, field in BAD_CALL_IDS:
        s, _, raw = post_json(port, path, body)
        out.append(Finding(name, s == 400 and field.encode() in raw, f"{s}: {raw[:140]!r}"))
    return out


def probe_abandoned_waiters(port: int, lanes: int, waiters: int = 68, hold: dict | None = None) -> list[Finding]:
    """Every lane held by a long stream, `waiters` more clients send and hang up: none of them is counted as
    waiting afterwards (a new request is queued, not refused with a 503)."""
    hold = hold or {"prompt": "the cache", "n_predict": 100_000, "ignore_eos": True, "stream": True}
    streams = []
    for _ in range(lanes):
        sk = socket.create_connection(("127.0.0.1", port))
        body = json.dumps(hold).encode()
        sk.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        sk.recv(64)  # it streams: the lane is taken
        streams.append(sk)
    try:
        for _ in range(waiters):
            try:
                post_json(port, "/v1/chat/completions", CHAT, timeout=0.05)
            except OSError:  # gave up waiting: the client is gone
                pass
        deadline, deferred = time.monotonic() + 2.0, None
        while time.monotonic() < deadline:
            _, _, raw = request(port, "GET", "/metrics")
            deferred = next((float(line.split()[-1]) for line in raw.decode().splitlines()
                             if line.startswith("llamacpp:requests_deferred")), None)
            if deferred == 0:
                break
            time.sleep(0.1)
        s, _, raw = post_json(port, "/v1/chat/completions", CHAT, timeout=0.5) if deferred == 0 else (0, {}, b"")
    except OSError as e:  # still waiting for a lane after 0.5 s: queued, as it should be
        s, raw = 202, str(e).encode()
    finally:
        for sk in streams:
            sk.close()
    return [Finding(f"{waiters} abandoned waiters leave the queue", deferred == 0, f"deferred {deferred}"),
            Finding("a new request is queued, not refused", s in (200, 202), f"{s}: {raw[:80]!r}")]


def text_of(port: int, n_tokens: int, seed: str = "the cache") -> str:
    """A prompt of about n_tokens tokens of the served model's (measured through /tokenize)."""
    unit = f" {seed} keeps its cells;"
    per = len(json.loads(post_json(port, "/tokenize", {"content": unit * 50})[2])["tokens"]) / 50
    return unit * max(1, int(n_tokens / per))


def probe_long_prompts_together(port: int, n_ctx: int, lanes: int) -> list[Finding]:
    """The shared cache under long prompts: two prompts that each fit the context alone but not together,
    sent at once, both answer whole; `lanes` short conversations left in the lanes, then a prompt that
    fills the context alone, answers (nothing is refused that waiting would serve)."""
    out = []
    n = 16
    got: list = [None, None]

    def send(i: int) -> None:
        body = {"prompt": text_of(port, int(n_ctx * 0.55), f"lane {i}"), "n_predict": n, "ignore_eos": True}
        got[i] = post_json(port, "/completion", body, timeout=600)
    ts = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    seen = [(s, json.loads(raw).get("tokens_predicted") if s == 200 else raw[:100]) for s, _, raw in got]
    out.append(Finding("two prompts that fit alone, sent together", seen == [(200, n), (200, n)], str(seen)))
    for i in range(lanes):
        post_json(port, "/completion", {"prompt": f"short {i}", "n_predict": 4}, timeout=300)
    s, _, raw = post_json(port, "/completion", {"prompt": text_of(port, n_ctx - 24), "n_predict": 4,
                                                "ignore_eos": True}, timeout=600)
    out.append(Finding("short idle lanes, then a prompt that fills the context", s == 200,
                       f"{s}: {raw[:100]!r}"))
    return out


def probe_damaged_saved_prompts(start, home, n_tokens: int = 1100) -> list[Finding]:
    """A long prompt's saved entry under the data root replaced by JSON of another shape ([], null, 7) or by
    garbage, the server restarted, the same prompt again: each answered (evaluated afresh), and the log
    names each dropped entry in one line. start(): a ServerProcess on `home`."""
    out = []
    srv = start()
    body = {"prompt": text_of(srv.port, n_tokens, "saved"), "n_predict": 2}
    first = post_json(srv.port, "/completion", body, timeout=600)[0]
    srv.stop()
    metas = sorted(Path(home).rglob("prompt-cache/*/*.json"))
    out.append(Finding("a long prompt is saved on disk", first == 200 and bool(metas), f"{first}, {len(metas)} entries"))
    for bad in (b"[]", b"null", b"7", b"{not json"):
        for m in metas:
            m.write_bytes(bad)
        srv = start()
        s, _, raw = post_json(srv.port, "/completion", body, timeout=600)
        srv.stop()
        log = srv.output()
        out.append(Finding(f"saved entry {bad.decode()!r}: answered, one line in the log", s == 200 and
                           "dropping the saved prompt" in log and "Traceback" not in log, f"{s}: {raw[:80]!r}"))
        metas = sorted(Path(home).rglob("prompt-cache/*/*.json")) or metas
    return out


def probe_concurrent_streams(port: int, clients: int = 8, each: int = 3) -> list[Finding]:
    errors: list[str] = []

    def client(i):
        for j in range(each):
            s, _, raw = post_json(port, "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": f"count {i} {j}"}], "max_tokens": 8,
                                   "stream": True}, timeout=300)
            if s != 200 or not raw.rstrip().endswith(b"data: [DONE]"):
                errors.append(f"{s} {raw[-80:]!r}")
    ts = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return [Finding(f"{clients}x{each} concurrent streams", not errors, errors[0] if errors else "all ended with [DONE]")]


def stream_then_signal(proc, port: int, sig: int = signal.SIGTERM, body: dict | None = None) -> Finding:
    """Start a long stream, send `sig` once it flows; the stream must end with an error event and the
    process must be gone within a few seconds."""
    body = body or {"prompt": "the cache", "n_predict": 100_000, "stream": True, "ignore_eos": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    first = r.readline()
    t0 = time.monotonic()
    os.kill(proc.pid, sig)
    tail = b""
    try:
        tail = r.read()
    except (http.client.IncompleteRead, OSError) as e:
        tail = getattr(e, "partial", b"") or b""
    conn.close()
    try:
        proc.wait(timeout=10)
    except Exception:
        proc.kill()
        return Finding(f"{signal.Signals(sig).name} mid-stream", False, "still running 10 s after the signal")
    took = time.monotonic() - t0
    events = [ln for ln in tail.splitlines() if ln.startswith(b"data: ")]
    last = events[-1] if events else b""
    ended_with_error = b'"error"' in last and b"shutting down" in last
    return Finding(f"{signal.Signals(sig).name} mid-stream", bool(first) and ended_with_error and took < 3.0,
                   f"exit {proc.returncode} after {took:.2f} s; last event {last[:90]!r}")


def soak(port: int, n: int, pid: int) -> dict:
    """n mixed requests (chat, stream, completion, tokenize, bad bodies, hang-ups) one after another;
    RSS and open files of the server at the start and the end, errors by kind, /health at the end."""
    def rss_and_fds():
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return rss // 1024, len(os.listdir(f"/proc/{pid}/fd"))
    kinds = {
        "chat": lambda i: post_json(port, "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": f"say {i}"}], "max_tokens": 4}),
        "stream": lambda i: post_json(port, "/v1/chat/completions",
                                      {"messages": [{"role": "user", "content": f"n {i}"}], "max_tokens": 4,
                                       "stream": True}),
        "completion": lambda i: post_json(port, "/completion", {"prompt": f"the {i}", "n_predict": 4}),
        "tokenize": lambda i: post_json(port, "/tokenize", {"content": f"token {i} " * 20}),
        "bad": lambda i: post_json(port, "/v1/chat/completions", HOSTILE_BODIES[i % 6][2]),
        "health": lambda i: request(port, "GET", "/health"),
    }
    expected = {"bad": 400}
    names = list(kinds)
    start = rss_and_fds()
    errors: dict[str, int] = {}
    t0 = time.monotonic()
    for i in range(n):
        name = names[i % len(names)]
        try:
            status = kinds[name](i)[0]
        except OSError as e:
            status = type(e).__name__
        if status != expected.get(name, 200):
            errors[f"{name}: {status}"] = errors.get(f"{name}: {status}", 0) + 1
    end = rss_and_fds()
    health = request(port, "GET", "/health")[0]
    return {"requests": n, "seconds": round(time.monotonic() - t0, 1), "errors": errors,
            "rss_mb": [start[0], end[0]], "open_files": [start[1], end[1]], "health": health}
