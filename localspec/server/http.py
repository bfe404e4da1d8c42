"""What every route shares on the way in: authentication, the model a request names (loaded on demand by the
router), the loading state, JSON bodies parsed strictly, and errors in the protocol's own shape. What a
request becomes after that is `bridge.Run`'s."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import Response

from ..serving.log import log_unexpected
from .apierrors import ApiError
from .guard import MAX_BODY_BYTES
from .settings import keep_alive_seconds
from .state import ServerState

# no API key needed, as in llama-server (health, the model list) and Ollama (its liveness answer)
PUBLIC = {"/", "/health", "/v1/health", "/models", "/v1/models", "/api/version"}
PUBLIC_PREFIX = "/webui/"  # the page's files: the page asks for the key, then sends it on every call
BIG_BODY_BYTES = 256 << 10  # parsed off the event loop above this, so /health and streams never stall

ErrorShape = Callable[[ApiError], dict]  # a protocol's error body


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
    if state.worker is None:
        raise ApiError(503, state.load_error or "Loading model")
    if state.worker.closing:
        raise ApiError(503, "the server is shutting down")
    if state.worker.lost:  # its process died (serving/isolated.py): why, until the router loads it again
        raise ApiError(503, state.worker.lost)
    if not state.worker.alive:
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
