"""`localspec run` as a client of a running `localspec serve`: the pair is already loaded, so a
one-shot prompt costs only the model's own time.

The probe gives up within ~100 ms (a refused loopback connection answers at once). Only a server
holding the same target and draft files is used; the request spells out every generation setting,
so the answer is the one the in-process run would give (up to greedy near-ties: the server's
caches and n-gram memory change which passes are batched; see README, "Exactness, honestly"). Stdlib
only (http.client): no import cost.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import time
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import quote, urlsplit

from ..stats import Stats

PROBE_TIMEOUT_S = 0.1
LOAD_TIMEOUT_S = 300.0  # a server with several models loads the one asked for before it answers /props
# The longest silence `run` waits out from a server: a queue ahead of it and a long prompt's evaluation
# (a minute for thousands of tokens on a small CPU) send nothing for a while; a wedged one must not hang a shell.
SILENCE_S = 180.0


def silence_s() -> float:
    """SILENCE_S, or LOCALSPEC_SERVER_TIMEOUT's seconds when that is a positive number."""
    try:
        v = float(os.environ.get("LOCALSPEC_SERVER_TIMEOUT", ""))
    except ValueError:
        return SILENCE_S
    return v if math.isfinite(v) and v > 0 else SILENCE_S
STAT_FIELDS = {f.name for f in fields(Stats)}


@dataclass
class Endpoint:
    host: str
    port: int
    api_key: str | None = None
    model: str | None = None  # a server with several models: the one every request names

    def payload(self, body: dict) -> bytes:
        return json.dumps({**body, "model": self.model} if self.model else body).encode()

    def connection(self, timeout: float | None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self) -> dict:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def configured_endpoint() -> Endpoint:
    """LOCALSPEC_SERVER (a URL or host:port), else the default port on loopback."""
    from ..server import DEFAULT_PORT  # the one place the port is set (import-free package)

    raw = os.environ.get("LOCALSPEC_SERVER", "").strip()
    key = os.environ.get("LOCALSPEC_API_KEY") or None
    if not raw:
        return Endpoint("127.0.0.1", DEFAULT_PORT, key)
    try:
        parts = urlsplit(raw if "//" in raw else f"http://{raw}")
        return Endpoint(parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORT, key)
    except ValueError:
        from ..errors import ConfigError

        raise ConfigError(f"LOCALSPEC_SERVER={raw!r} is not host:port or a URL; fix it or unset it") from None


def probe(ep: Endpoint, budget_s: float = PROBE_TIMEOUT_S, path: str = "/props") -> dict | None:
    """The server's /props when a localspec server answers in time, else None (never raises)."""
    t_end = time.monotonic() + budget_s
    try:
        conn = ep.connection(budget_s)
        conn.request("GET", path, headers=ep.headers())
        conn.sock.settimeout(max(0.01, t_end - time.monotonic()))
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
    except (OSError, http.client.HTTPException, socket.timeout, ValueError):
        return None
    if resp.status != 200:
        return None
    try:
        props = json.loads(body)
    except ValueError:
        return None
    return props if isinstance(props, dict) and isinstance(props.get("localspec"), dict) else None


def find_server(models, notify=None):
    """(endpoint, its /props, the selection) of the running server when it holds the pair `models` resolves
    to, loaded as asked; None when none answers or it holds another."""
    from ..session import select_models

    ep = configured_endpoint()
    props = probe(ep)
    if props is None:
        return None
    sel = select_models(models, notify)
    if same_pair(props, sel.target, sel.draft, load_flags(models)):
        return ep, props, sel
    listed = served_name(ep, sel)  # a server with several models may have this one too
    if listed is None:
        return None
    props = probe(Endpoint(ep.host, ep.port, ep.api_key), LOAD_TIMEOUT_S, f"/props?model={quote(listed)}")
    if props is None or not same_pair(props, sel.target, sel.draft, load_flags(models)):
        return None
    return Endpoint(ep.host, ep.port, ep.api_key, listed), props, sel


def served_name(ep: Endpoint, sel) -> str | None:
    """The name a server with several models lists for this selection (its pair name or its file's)."""
    try:
        conn = ep.connection(PROBE_TIMEOUT_S * 5)
        conn.request("GET", "/v1/models", headers=ep.headers())
        resp = conn.getresponse()
        data = json.loads(resp.read()) if resp.status == 200 else {}
        conn.close()
    except (OSError, http.client.HTTPException, socket.timeout, ValueError):
        return None
    wanted = {sel.name, Path(sel.target).stem, Path(sel.target).name}
    for m in data.get("data", []) if isinstance(data, dict) else []:
        if isinstance(m, dict) and "status" in m and ({m.get("id"), *m.get("aliases", [])} & wanted):
            return m.get("id")
    return None


def same_pair(props: dict, target: str, draft: str | None, load: dict | None = None) -> bool:
    """The server holds these files, loaded with every setting the user gave (load: flag -> value)."""
    def real(p):
        return os.path.realpath(p) if p else None
    info = props["localspec"]
    if real(info.get("target")) != real(target) or real(info.get("draft")) != real(draft):
        return False
    held = info.get("load") or {}
    return all(held.get(k) == v for k, v in (load or {}).items())


def load_flags(models) -> dict:
    """The load settings a user gave (a ModelChoice's): a server loaded with other ones is not used."""
    given = {"ctx_size": models.ctx_size, "threads": models.threads, "n_gpu_layers": models.n_gpu_layers,
             "mmap": models.mmap, "flash_attn": models.flash_attn, "exact": models.exact or None}
    return {k: v for k, v in given.items() if v is not None}


def request_body(messages: list[tuple[str, str]] | str, cfg, raw: bool) -> tuple[str, dict]:
    """(path, body) with every setting of the in-process run spelled out."""
    body = {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p, "min_p": cfg.min_p,
            "seed": -1 if cfg.seed is None else cfg.seed, "stop": list(cfg.stop), "stream": True,
            "spec": cfg.spec, "drafter": cfg.drafter,
            "speculative": {"n_max": cfg.draft_max, "n_min": cfg.draft_min, "p_min": cfg.p_min,
                            "ngram_n_max": cfg.ngram_draft_max}}
    if cfg.prediction:
        body["prediction"] = {"type": "content", "content": cfg.prediction}
    if raw:
        body.update(prompt=messages, n_predict=cfg.max_tokens, parse_special=False)
        return "/completion", body
    body.update(messages=[{"role": r, "content": c} for r, c in messages], max_tokens=cfg.max_tokens)
    return "/v1/chat/completions", body


class ServerFailed(Exception):
    pass


def stream_events(ep: Endpoint, path: str, body: dict):
    """POST, then each SSE event as a dict; an error event or a status other than 200 raises
    ServerFailed, and so does a server silent for SILENCE_S. Closing the generator hangs up (the
    server then cancels the answer)."""
    wait_s = silence_s()
    conn = ep.connection(wait_s)
    try:
        conn.request("POST", path, body=ep.payload(body), headers=ep.headers())
        resp = conn.getresponse()
        if resp.status != 200:
            raise ServerFailed(error_message(resp.read()))
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise ServerFailed(event["error"].get("message", "the server failed"))
            yield event
    except (socket.timeout, TimeoutError):
        raise ServerFailed(f"the server sent nothing for {wait_s:g} s; rerun with --local, or raise "
                           "LOCALSPEC_SERVER_TIMEOUT") from None
    finally:
        conn.close()


def stream_run(ep: Endpoint, path: str, body: dict, on_text) -> Stats:
    """POST, call on_text(piece) for each confirmed piece, return the run's Stats."""
    stats = None
    for event in stream_events(ep, path, body):
        text = event_text(event)
        if text:
            on_text(text)
        stats = event_stats(event) or stats
    if stats is None:
        raise ServerFailed("the server's answer ended without its figures")
    return stats


def event_stats(event: dict) -> Stats | None:
    """The figures an event carries (the last one's; every one's with timings_per_token), else None."""
    st = (event.get("localspec") or {}).get("stats")
    return Stats(**{k: v for k, v in st.items() if k in STAT_FIELDS}) if isinstance(st, dict) else None


def event_text(event: dict) -> str:
    if "choices" in event:
        choices = event["choices"]
        return (choices[0].get("delta") or {}).get("content") or "" if choices else ""
    return event.get("content", "") if not event.get("stop") else ""


def error_message(raw: bytes) -> str:
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace")[:200]


def server_label(props: dict) -> str:
    return f"{props.get('model_alias', '?')} ({Path(props['localspec'].get('target') or '?').name})"
