"""What every protocol's handlers share: the server's state, authentication and the loading state,
errors in the protocol's own shape, JSON bodies (parsed strictly, the model they name), a queued
generation seen from the event loop, and streamed responses. Protocol modules build on this, on
`settings` (each field validated on its own) and on `chat`; none imports another.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .guard import MAX_BODY_BYTES
from .apierrors import ApiError, log_unexpected
from .settings import Extras
from .state import ServerState
from .worker import Job

# no API key needed, as in llama-server (health, the model list) and Ollama (its liveness answer)
PUBLIC = {"/", "/health", "/v1/health", "/models", "/v1/models", "/api/version"}
PUBLIC_PREFIX = "/webui/"  # the page's files: the page asks for the key, then sends it on every call
POLL_S = 0.25  # how often a waiting non-streamed request checks that its client is still there
BIG_BODY_BYTES = 256 << 10  # parsed off the event loop above this, so /health and streams never stall

ErrorShape = Callable[[ApiError], dict]  # a protocol's error body
# While a long prompt evaluates (an agent's 10-20k tokens take minutes on a laptop CPU) an SSE stream sends
# a comment this often: SSE parsers skip it, and clients that end a silent stream (Node's fetch after 300 s)
# see bytes arrive.
KEEPALIVE_S = 10.0
KEEPALIVE = ": keep-alive\n\n"


def openai_error(e: ApiError) -> dict:
    return e.body()


def error_response(e: ApiError, shape: ErrorShape = openai_error) -> Response:
    # ASCII-escaped: a message may quote what the client sent, lone surrogates included
    return Response(json.dumps(shape(e)), status_code=e.status, media_type="application/json")


def endpoint(handler, needs_model: bool = True, errors: ErrorShape = openai_error):
    """Authentication, the model a request names (loaded on demand) and errors, the same for every route:
    an ApiError is its JSON in the protocol's shape; anything else is one line in the log and a 500,
    never a traceback."""
    async def wrapped(request: Request) -> Response:
        state: ServerState = request.app.state.localspec
        try:
            if state.api_key and not is_public(request.url.path) and not _authorized(request, state.api_key):
                raise ApiError(401, "Invalid API Key")
            if not needs_model:
                return await handler(request, state)
            name, keep_alive = await requested(request, state.router)
            async with state.router.use(name, keep_alive) as model_state:
                require_serving(model_state)
                return await handler(request, model_state)
        except ApiError as e:
            return error_response(e, errors)
        except Exception as e:
            log_unexpected(f"{request.method} {request.url.path}", e)
            return error_response(ApiError(500, "the server failed on this request; see its log"), errors)
    return wrapped


async def requested(request: Request, router) -> tuple[str | None, float | None]:
    """The model a request names (the body's `model`, Ollama's `name`, or `?model=`) and its Ollama
    `keep_alive` in seconds; with one model served nothing is read (every name is that model)."""
    if router.single:
        return None, None
    if request.method != "POST":  # no ?model=: the model last used, so a probe loads nothing
        return request.query_params.get("model") or router.last_used_name(), None
    body = await read_json(request)
    name = body.get("model") or body.get("name")
    return (name if isinstance(name, str) else None), keep_alive_seconds(body.get("keep_alive"))


def is_public(path: str) -> bool:
    return path in PUBLIC or path.startswith(PUBLIC_PREFIX)


def require_serving(state: ServerState) -> None:
    """503 unless the pair is loaded and its generation thread takes work."""
    if state.server is None:
        raise ApiError(503, state.load_error or "Loading model")
    if state.server.closing:
        raise ApiError(503, "the server is shutting down")
    if not state.server.alive:
        raise ApiError(503, "the generation thread has stopped; restart the server (its log says why)")


def _authorized(request: Request, key: str) -> bool:
    """A bearer key (OpenAI clients) or `x-api-key` (Anthropic's clients)."""
    got = request.headers.get("authorization") or request.headers.get("x-api-key") or ""
    return (got[7:] if got.startswith("Bearer ") else got) == key


# --- request bodies: JSON only, parsed strictly; the model a body names -----------------------------
JSON_TYPES = ("application/json",)


def require_json_body(content_type: str | None) -> str | None:
    """Why a body of this Content-Type is refused (None: it is fine). JSON, or no type at all; the
    form and text types a web page can send without a preflight are refused."""
    if not content_type:
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media in JSON_TYPES or media.endswith("+json"):
        return None
    return f"Content-Type {media} is not accepted; send the body as JSON with Content-Type: application/json"


# JSON's escapes for UTF-16 surrogates: only a body that has one can hold a lone surrogate
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8; send JSON text")
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply")
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})")
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate(body, "")
        if where is not None:
            raise ApiError(400, f'{where or "the body"} has a lone UTF-16 surrogate (half of an emoji?); '
                                "send whole characters")
    return body


def _lone_surrogate(v: Any, path: str, depth: int = 0) -> str | None:
    """The path of the first string (value or key) that is not valid Unicode text, or None."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if depth > 64:
        return None
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        name = k.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(k, str) else k
        sub = f"{path}[{k}]" if isinstance(k, int) else f"{path}.{name}" if path else name
        if isinstance(k, str) and _lone_surrogate(k, sub) is not None:
            return sub
        found = _lone_surrogate(x, sub, depth + 1)
        if found is not None:
            return found
    return None


def requested_model(body: dict) -> str | None:
    """`model`: with one model served any string names it, as llama-server does with one model (clients
    send "", "gpt-4o", their own alias); replies name the served model. Only a non-string is wrong."""
    v = body.get("model")
    if v is not None and not isinstance(v, str):
        raise ApiError(400, '"model" must be a string: a name GET /v1/models lists')
    return v


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def keep_alive_seconds(v) -> float | None:
    """Ollama's `keep_alive`: seconds as a number, or a Go duration ("5m", "1h30m", "-1", "0");
    negative: stay loaded; 0: unload once the request ends; None: the server's default."""
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        text = v.strip()
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            return float(text)
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT_S[u] for n, u in parts)
    raise ApiError(400, '"keep_alive" must be seconds or a duration such as "5m", "1h", "-1" (stay) or 0 (unload)')


async def read_json(request: Request) -> dict:
    """The body as a JSON object: JSON content only, at most MAX_BODY_BYTES, parsed in a thread when big."""
    cached = getattr(request.state, "json_body", None)
    if cached is not None:  # the router read it to find the model
        return cached
    refused = require_json_body(request.headers.get("content-type"))
    if refused:
        raise ApiError(415, refused, "invalid_request_error")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes, the most this server takes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    body = await asyncio.to_thread(parse_json, raw) if size > BIG_BODY_BYTES else parse_json(raw)
    request.state.json_body = body
    return body


async def read_body(request: Request) -> dict:
    """A generation request's body; its model name was routed already (replies name the served model)."""
    body = await read_json(request)
    requested_model(body)
    return body


class Run:
    """One queued job seen from the event loop: its events arrive on an asyncio queue."""

    def __init__(self, state: ServerState, prepare, extras: Extras, background: bool = False, slot: str | None = None,
                 priority: bool = False):
        loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()

        def emit(item) -> None:
            try:
                loop.call_soon_threadsafe(self.events.put_nowait, item)
            except RuntimeError:  # the event loop has closed (shutdown)
                pass

        self.job = Job(prepare, extras, emit, background=background, slot=slot, priority=priority)
        self.stats = None  # the engine's Stats, once done
        self.live = None  # (source, Stats so far) of the latest text piece, when the request asked for them
        self.jobs = state.server.jobs
        state.server.submit(self.job)

    def cancel(self) -> None:
        """The client is gone, or the response ended: the job ends (leaving the queue if it still waits)."""
        self.jobs.withdraw(self.job)

    async def next(self, request: Request | None = None, idle_s: float | None = None):
        """The next event; a non-streamed request that lost its client cancels its job; ("idle", None)
        after idle_s seconds without one (a long prompt evaluating), for streams that send keep-alives."""
        waited = 0.0
        while True:
            try:
                return await asyncio.wait_for(self.events.get(), POLL_S)
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    self.cancel()
                    raise ApiError(499, "client closed the request")
                waited += POLL_S
                if idle_s is not None and waited >= idle_s:
                    return "idle", None

    async def start(self, request: Request) -> int:
        kind, value = await self.next(request)
        if kind == "error":
            raise value
        return value  # prompt length

    async def texts(self, request: Request | None = None, idle_s: float | None = None):
        """The answer's text pieces until the end (then `self.stats` is set); an error event raises;
        None after idle_s seconds without text."""
        while True:
            kind, value = await self.next(request, idle_s)
            if kind == "idle":
                yield None
            elif kind == "live":
                self.live = value
            elif kind == "text":
                yield value
            elif kind == "error":
                raise value
            else:
                self.stats = value
                return

    async def collect(self, request: Request):
        parts = [t async for t in self.texts(request)]
        return "".join(parts), self.stats


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def named_sse(obj: dict) -> str:
    """SSE with each event named by its type (Anthropic's and the Responses API's framing)."""
    return f"event: {obj.get('type', 'error')}\n{sse(obj)}"


def stream(run: Run, events, media_type: str = "text/event-stream", frame=sse, errors: ErrorShape = openai_error):
    """A streamed response from an async generator of objects (framed by `frame`; a str passes as it is);
    an error ends the stream with an error object in the protocol's shape, never silently; a hang-up (or
    any end) cancels the job."""
    async def body():
        try:
            async for obj in events:
                yield obj if isinstance(obj, str) else frame(obj)
        except ApiError as e:
            yield frame(errors(e))
        except Exception as e:
            log_unexpected("a stream", e)
            yield frame(errors(ApiError(500, "the server failed while streaming; see its log")))
        finally:
            run.cancel()
    return StreamingResponse(body(), media_type=media_type,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
