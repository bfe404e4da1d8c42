"""The HTTP API: llama-server's endpoints and JSON shapes, on Starlette (run by uvicorn).

Why Starlette + uvicorn: a single-user local server needs SSE streaming, disconnect detection (to
cancel a generation within one round) and a small import; both are plain ASGI with no framework
on top, start in ~0.2 s, and keep request validation in our hands, so unknown fields are ignored
rather than rejected (FastAPI's models would answer 422). Generation runs in the `ServerSession`
worker thread; handlers only parse, queue and stream.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from ..backend import common_prefix
from ..engine import Message
from ..fim import FimUnsupported, fim_stop_tokens, infill_tokens, require_fim
from . import shapes
from .guard import MAX_BODY_BYTES, Guard, GuardRules, require_json_body
from .infill import check_infill_body
from .protocol import (
    ApiError,
    Extras,
    boolean,
    chat_messages,
    completion_prompt,
    gen_settings,
    log_unexpected,
    parse_json,
    pick_fields,
    requested_model,
    string,
)
from .tools import CallStream, call_grammar, require_tools_template, split_calls, tool_request
from .worker import Job, ServerSession

PUBLIC = {"/health", "/v1/health", "/models", "/v1/models"}  # no API key needed, as in llama-server
POLL_S = 0.25  # how often a waiting non-streamed request checks that its client is still there


@dataclass
class ServerState:
    api_key: str | None = None
    server: ServerSession | None = None  # None while loading
    model_id: str = "localspec"
    aliases: set[str] = field(default_factory=set)
    load_error: str | None = None


def error_response(e: ApiError) -> Response:
    # ASCII-escaped: a message may quote what the client sent, lone surrogates included
    return Response(json.dumps(e.body()), status_code=e.status, media_type="application/json")


def endpoint(handler, needs_model: bool = True):
    """Authentication, the loading state and errors, the same for every route: an ApiError is its
    JSON; anything else is one line in the log and an OpenAI-shaped 500, never a traceback page."""
    async def wrapped(request: Request) -> Response:
        state: ServerState = request.app.state.localspec
        try:
            if state.api_key and request.url.path not in PUBLIC and not _authorized(request, state.api_key):
                raise ApiError(401, "Invalid API Key")
            if needs_model:
                _require_serving(state)
            return await handler(request, state)
        except ApiError as e:
            return error_response(e)
        except Exception as e:
            log_unexpected(f"{request.method} {request.url.path}", e)
            return error_response(ApiError(500, "the server failed on this request; see its log"))
    return wrapped


def _require_serving(state: ServerState) -> None:
    """503 unless the pair is loaded and its generation thread takes work."""
    if state.server is None:
        raise ApiError(503, state.load_error or "Loading model")
    if state.server.closing:
        raise ApiError(503, "the server is shutting down")
    if not state.server.alive:
        raise ApiError(503, "the generation thread has stopped; restart the server (its log says why)")


def _authorized(request: Request, key: str) -> bool:
    got = request.headers.get("authorization") or request.headers.get("x-api-key") or ""
    return (got[7:] if got.startswith("Bearer ") else got) == key


BIG_BODY_BYTES = 256 << 10  # parsed off the event loop above this, so /health and streams never stall


async def read_json(request: Request) -> dict:
    """The body as a JSON object: JSON content only, at most MAX_BODY_BYTES, parsed in a thread when big."""
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
    return await asyncio.to_thread(parse_json, raw) if size > BIG_BODY_BYTES else parse_json(raw)


async def _body(request: Request, state: ServerState) -> dict:
    body = await read_json(request)
    requested_model(body)  # any name is served by the one pair; the reply names the served model
    return body


# --- queueing a generation -------------------------------------------------------------------------
class Run:
    """One queued job seen from the event loop: its events arrive on an asyncio queue."""

    def __init__(self, state: ServerState, prepare, extras: Extras, background: bool = False, slot: str | None = None):
        loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()

        def emit(item) -> None:
            try:
                loop.call_soon_threadsafe(self.events.put_nowait, item)
            except RuntimeError:  # the event loop has closed (shutdown)
                pass

        self.job = Job(prepare, extras, emit, background=background, slot=slot)
        self.stats = None  # the engine's Stats, once done
        state.server.submit(self.job)

    async def next(self, request: Request | None = None):
        """The next event; a non-streamed request that lost its client cancels its job."""
        while True:
            try:
                return await asyncio.wait_for(self.events.get(), POLL_S)
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    self.job.cancel.set()
                    raise ApiError(499, "client closed the request")

    async def start(self, request: Request) -> int:
        kind, value = await self.next(request)
        if kind == "error":
            raise value
        return value  # prompt length

    async def collect(self, request: Request):
        parts = []
        while True:
            kind, value = await self.next(request)
            if kind == "text":
                parts.append(value)
            elif kind == "error":
                raise value
            else:
                return "".join(parts), value


def stream(run: Run, events):
    """SSE from an async generator of JSON objects; a hang-up (or any end) cancels the job."""
    async def body():
        try:
            async for obj in events:
                yield obj if isinstance(obj, str) else shapes.sse(obj)
        except ApiError as e:  # the stream ends with an error event, never silently
            yield shapes.sse(e.body())
        except Exception as e:
            log_unexpected("a stream", e)
            yield shapes.sse(ApiError(500, "the server failed while streaming; see its log").body())
        finally:
            run.job.cancel.set()
    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _texts(run: Run):
    """("text", str) events until the end; yields the text, returns via StopAsyncIteration."""
    while True:
        kind, value = await run.next()
        if kind == "text":
            yield value
        elif kind == "error":
            raise value
        else:
            run.stats = value
            return


# --- generation endpoints ----------------------------------------------------------------------------
async def chat_completions(request: Request, state: ServerState) -> Response:
    body = await _body(request, state)
    turns = chat_messages(body)
    system = state.server.session.system  # `serve --system`: for conversations that bring none
    if system and not any(m.role == "system" for m in turns):
        turns.insert(0, Message("system", system))
    cfg, extras = gen_settings(body, state.server.session.gen, oai=True)
    tools = tool_request(body)
    if tools is not None:
        require_tools_template(state.server.engine.chat_template())
        forced = call_grammar(tools)
        if forced and cfg.grammar:
            raise ApiError(400, "a required tool call and a response_format cannot both shape one answer")
        cfg.grammar = forced or cfg.grammar

    def prepare(engine):
        return engine.prompt_tokens(turns, tools=tools.tools if tools else None), cfg

    run = Run(state, prepare, extras)
    await run.start(request)
    obj_id, model = shapes.new_id("chatcmpl"), state.model_id
    if not extras.stream:
        text, st = await run.collect(request)
        content, calls = split_calls(text, tools.names) if tools else (text, [])
        return JSONResponse(shapes.oai_chat(obj_id, model, content, st, calls))

    async def events():
        yield shapes.oai_chat_chunk(obj_id, model, {"role": "assistant", "content": None})
        calls = CallStream(tools.names) if tools else None
        async for text in _texts(run):
            for delta in _chat_deltas(calls, text):
                yield shapes.oai_chat_chunk(obj_id, model, delta)
        for delta in _chat_deltas(calls, None):
            yield shapes.oai_chat_chunk(obj_id, model, delta)
        st = run.stats
        finish = "tool_calls" if calls and calls.calls else shapes.finish_reason(st)
        last = shapes.oai_chat_chunk(obj_id, model, {}, finish)
        for event in _oai_stream_end(last, st, "chat.completion.chunk", extras.include_usage):
            yield event
    return stream(run, events())


def _chat_deltas(calls: CallStream | None, text: str | None) -> list[dict]:
    """Stream deltas for a piece of text (None: the end): content as it comes, each tool call whole once
    its block closes (OpenAI's shape: index, id, type, function name and arguments)."""
    if calls is None:
        return [{"content": text}] if text else []
    before = len(calls.calls)
    content, new = calls.feed(text) if text is not None else calls.finish()
    out = [{"content": content}] if content else []
    out += [{"tool_calls": [{"index": before + i, **c}]} for i, c in enumerate(new)]
    return out


def _oai_stream_end(last: dict, st, kind: str, include_usage: bool) -> list:
    """An OpenAI stream's last events: the finishing chunk with the figures, the usage chunk when asked
    for (empty choices), then [DONE]."""
    last.update(timings=shapes.timings(st), localspec=shapes.localspec_stats(st))
    usage = [shapes.usage_chunk(last["id"], last["model"], kind, st)] if include_usage else []
    return [last, *usage, "data: [DONE]\n\n"]


def _completion_prepare(body: dict, cfg):
    prompt = completion_prompt(body)
    parse_special = boolean(body, "parse_special", True)  # localspec's: False reads "<|x|>" as plain text

    def prepare(engine):
        m = engine.target_model
        if isinstance(prompt, str):
            return m.tokenize(prompt, add_special=True, parse_special=parse_special), cfg
        if any(t < 0 or t >= m.n_vocab for t in prompt):
            raise ApiError(400, f'"prompt" has a token id outside the vocabulary (0..{m.n_vocab - 1})')
        return prompt, cfg
    return prepare


async def completions_oai(request: Request, state: ServerState) -> Response:
    body = await _body(request, state)
    cfg, extras = gen_settings(body, state.server.session.gen, oai=True)
    run = Run(state, _completion_prepare(body, cfg), extras)
    await run.start(request)
    obj_id, model = shapes.new_id("cmpl"), state.model_id
    if not extras.stream:
        text, st = await run.collect(request)
        return JSONResponse(shapes.oai_completion(obj_id, model, text, st, shapes.finish_reason(st)))

    async def events():
        async for text in _texts(run):
            yield shapes.oai_completion(obj_id, model, text)
        st = run.stats
        last = shapes.oai_completion(obj_id, model, "", None, shapes.finish_reason(st))
        for event in _oai_stream_end(last, st, "text_completion", extras.include_usage):
            yield event
    return stream(run, events())


async def _native(request: Request, state: ServerState, run: Run, cfg, extras: Extras) -> Response:
    """/completion and /infill: llama-server's own shape, streamed without [DONE]."""
    prompt_len = await run.start(request)
    if not extras.stream:
        text, st = await run.collect(request)
        out = shapes.native_final(text, st, state.model_id, cfg)
        return JSONResponse(pick_fields(out, extras.response_fields) if extras.response_fields else out)

    async def events():
        n = 0
        async for text in _texts(run):
            n += 1
            yield shapes.native_partial(text, n, prompt_len)
        yield shapes.native_final("", run.stats, state.model_id, cfg)
    return stream(run, events())


async def completion_native(request: Request, state: ServerState) -> Response:
    body = await _body(request, state)
    cfg, extras = gen_settings(body, state.server.session.gen, oai=False)
    return await _native(request, state, Run(state, _completion_prepare(body, cfg), extras), cfg, extras)


async def infill(request: Request, state: ServerState) -> Response:
    try:
        require_fim(state.server.model.fim_tokens())
    except FimUnsupported as e:
        raise ApiError(501, str(e))
    body = await _body(request, state)
    extra = check_infill_body(body)
    cfg, extras = gen_settings(body, state.server.session.gen, oai=False)
    cfg.stop_tokens = fim_stop_tokens(state.server.model)

    windows = state.server.fim
    warmup = cfg.max_tokens == 0

    def prepare(engine):
        if windows is None:  # --fim-layout llama-server
            n_ctx = engine.target.n_ctx
            n_predict = cfg.max_tokens if cfg.max_tokens < n_ctx else 0  # unlimited: no room set aside
            return infill_tokens(engine.target_model, body, extra, n_ctx, n_predict), cfg
        if warmup and not (body["input_prefix"] or body["input_suffix"] or body.get("prompt")):
            return windows.warmup_prompt(extra), cfg  # an editor's new extra context, evaluated in the background
        cache = engine.prompt_cache
        cached = cache.prefix_len if cache else lambda toks: common_prefix(engine.target.tokens, toks)
        prompt, cfg.heal = windows.completion_prompt(body, extra, cached)
        return prompt, cfg

    slot = None if warmup else f"infill/{body.get('id_slot', -1)}"
    return await _native(request, state, Run(state, prepare, extras, background=warmup, slot=slot), cfg, extras)


# --- information endpoints -------------------------------------------------------------------------
async def health(request: Request, state: ServerState) -> Response:
    _require_serving(state)  # the truth: 503 while loading, shutting down, or unable to generate
    return JSONResponse({"status": "ok"})


async def models(request: Request, state: ServerState) -> Response:
    m = state.server.model
    meta = {"n_vocab": m.n_vocab, "n_ctx": state.server.engine.target.n_ctx,
            "size": m.path.stat().st_size if m.path.exists() else None}
    return JSONResponse({"object": "list", "data": [
        {"id": state.model_id, "object": "model", "created": 0, "owned_by": "localspec",
         "aliases": sorted(state.aliases - {state.model_id}), "meta": meta}]})


async def props(request: Request, state: ServerState) -> Response:
    srv = state.server
    sess, m = srv.session, srv.model
    return JSONResponse({
        "default_generation_settings": {"params": shapes.generation_settings(sess.gen),
                                        "n_ctx": srv.engine.target.n_ctx},
        "total_slots": 1, "model_alias": state.model_id, "model_path": str(m.path),
        "modalities": {"vision": False, "audio": False},
        "chat_template": srv.engine.chat_template() or "",
        "bos_token": m.token_text(m.bos) if m.bos >= 0 else "", "eos_token": m.token_text(m.eos) if m.eos >= 0 else "",
        "build_info": "localspec", "is_sleeping": False,
        "localspec": {"target": sess.selection.target, "draft": sess.selection.draft,
                      "fim": bool(m.fim_tokens()), "spec": sess.gen.spec, "drafter": sess.gen.drafter,
                      "load": {"ctx_size": sess.load.n_ctx, "threads": sess.load.n_threads,
                               "n_gpu_layers": sess.load.n_gpu_layers_target, "mmap": sess.load.mmap}},
    })


async def tokenize(request: Request, state: ServerState) -> Response:
    body = await read_json(request)
    content = string(body, "content", "")
    add_special, parse_special = boolean(body, "add_special"), boolean(body, "parse_special", True)
    with_pieces, m = boolean(body, "with_pieces"), state.server.model

    def answer() -> bytes:
        tokens = m.tokenize(content, add_special=add_special, parse_special=parse_special)
        if not with_pieces:  # encoded in slices: one C call over millions of ids would hold the GIL for seconds
            ids = (",".join(map(str, tokens[i:i + 65536])) for i in range(0, len(tokens), 65536))
            return b'{"tokens": [' + ",".join(ids).encode() + b"]}"
        pieces = []
        for t in tokens:
            raw = m.piece(t)
            try:
                piece = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)  # llama-server gives the bytes when a piece is not valid UTF-8 alone
            pieces.append({"id": t, "piece": piece})
        return json.dumps({"tokens": pieces}, ensure_ascii=False).encode()
    # in a thread: a long text takes seconds to tokenize and encode, and the event loop serves every stream
    return Response(await asyncio.to_thread(answer), media_type="application/json")


async def detokenize(request: Request, state: ServerState) -> Response:
    body = await read_json(request)
    tokens = body.get("tokens", [])
    m = state.server.model
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ApiError(400, '"tokens" must be a list of token ids')
    if any(t < 0 or t >= m.n_vocab for t in tokens):
        raise ApiError(400, f'"tokens" has an id outside the vocabulary (0..{m.n_vocab - 1})')
    text = await asyncio.to_thread(lambda: b"".join(m.piece(t) for t in tokens).decode("utf-8", errors="replace"))
    return JSONResponse({"content": text})


async def metrics(request: Request, state: ServerState) -> Response:
    return PlainTextResponse(state.server.metrics.prometheus(), media_type="text/plain; version=0.0.4")


async def not_found(request: Request, exc) -> Response:
    status = getattr(exc, "status_code", 404)
    if status == 405:
        return error_response(ApiError(405, f"{request.method} is not allowed on {request.url.path}",
                                       "invalid_request_error"))
    return error_response(ApiError(404, f"no endpoint {request.url.path}; see GET /props and the README's "
                                        "Serve section", "not_found_error"))


def create_app(state: ServerState, lifespan=None, rules: GuardRules | None = None) -> Starlette:
    def r(path, fn, methods, needs_model=True):
        return Route(path, endpoint(fn, needs_model), methods=methods)

    routes = [
        r("/health", health, ["GET"]), r("/v1/health", health, ["GET"]),
        r("/v1/models", models, ["GET"]), r("/models", models, ["GET"]),
        r("/v1/chat/completions", chat_completions, ["POST"]), r("/chat/completions", chat_completions, ["POST"]),
        r("/v1/completions", completions_oai, ["POST"]),
        r("/completion", completion_native, ["POST"]), r("/completions", completion_native, ["POST"]),
        r("/infill", infill, ["POST"]), r("/props", props, ["GET"]),
        r("/tokenize", tokenize, ["POST"]), r("/detokenize", detokenize, ["POST"]),
        r("/metrics", metrics, ["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found}, lifespan=lifespan,
                    middleware=[Middleware(Guard, rules=rules or GuardRules(api_key=state.api_key))])
    app.state.localspec = state
    return app
