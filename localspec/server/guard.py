"""What a request must be before any handler sees it: from this machine's names, from no foreign web
page, JSON, and of a size a local model can use.

A key-less server on loopback is reachable by every web page the user opens: a page can POST to
127.0.0.1 without a preflight when the body is `text/plain`, and through DNS rebinding a page's own
host name can resolve to 127.0.0.1 (the class of Ollama's CVE-2024-28224). So, as Ollama and
llama-server harden theirs: without an API key only loopback Host names (and the `--host` value)
are served; a request a browser marks with an `Origin` is refused unless `--cors` names that origin;
bodies are JSON only (`http.require_json_body`, where bodies are read). Editors, SDKs and curl send no
Origin and are unaffected.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field

from .apierrors import ApiError

MAX_BODY_BYTES = 32 << 20  # a context of 128k tokens is under 1 MB of text; this bounds what one client makes us hold
CORS_HEADERS = "Authorization, Content-Type, X-Api-Key"


@dataclass
class GuardRules:
    api_key: str | None = None
    bind_host: str = "127.0.0.1"
    cors: list[str] = field(default_factory=list)  # allowed browser origins; "*" = any


def host_name(header: str) -> str:
    """The name in a Host header, without the port ("[::1]:8012" -> "::1")."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def is_loopback_name(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_allowed(header: str, rules: GuardRules) -> bool:
    if rules.api_key:  # a key protects the server wherever its name points
        return True
    name = host_name(header)
    return is_loopback_name(name) or name == host_name(rules.bind_host)


def origin_allowed(origin: str, host_header: str, rules: GuardRules) -> bool:
    if "*" in rules.cors or origin in rules.cors:
        return True
    # the server's own origin (a page it served itself) is not cross-origin
    return origin.lower().rstrip("/") in (f"http://{host_header.lower()}", f"https://{host_header.lower()}")


class Guard:
    """ASGI middleware: Host, Origin (with CORS preflights for allowed origins) and body size."""

    def __init__(self, app, rules: GuardRules):
        self.app, self.rules = app, rules

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host, origin = headers.get("host", ""), headers.get("origin")
        if not host_allowed(host, self.rules):
            return await _refuse(send, 403, f"Host '{host}' is not served: without --api-key only loopback names "
                                            "are (use http://127.0.0.1, or start the server with --api-key KEY)")
        if origin is not None and not origin_allowed(origin, host, self.rules):
            return await _refuse(send, 403, f"cross-origin requests from {origin} are refused; start the server "
                                            f"with --cors {origin} to allow that page")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return await _refuse(send, 413, f"the request body is {int(length)} bytes; the most this server takes "
                                            f"is {MAX_BODY_BYTES}")
        if origin is None:
            return await self.app(scope, receive, send)
        if scope["method"] == "OPTIONS":  # an allowed origin's preflight
            return await _send(send, 204, b"", self._cors(origin) + [
                (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"access-control-allow-headers", CORS_HEADERS.encode()), (b"access-control-max-age", b"600")])

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self._cors(origin)]}
            await send(message)
        return await self.app(scope, receive, send_with_cors)

    def _cors(self, origin: str) -> list[tuple[bytes, bytes]]:
        return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


def error_body(status: int, message: str) -> bytes:
    return json.dumps(ApiError(status, message).body()).encode()


async def _refuse(send, status: int, message: str) -> None:
    await _send(send, status, error_body(status, message), [(b"content-type", b"application/json")])


async def _send(send, status: int, body: bytes, headers: list) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
