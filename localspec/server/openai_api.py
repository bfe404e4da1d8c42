"""OpenAI's Chat Completions and Completions (llama-server's shapes of them, with `timings`), and the
model list: requests in as `ChatRequest`s, events out as JSON or SSE `data:` lines ending in [DONE]."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import shapes
from .chat import LENGTH, TOOL_CALLS, ChatRequest, End, Idle, Text, ToolCall, end_of, open_chat
from .http import KEEPALIVE, KEEPALIVE_S, Run, ServerState, read_body, stream
from .protocol import chat_messages, completion_tokens, gen_settings
from .tools import tool_request

FINISH = {LENGTH: "length", TOOL_CALLS: "tool_calls"}  # the rest: "stop"


def finish(end: End) -> str:
    return FINISH.get(end.reason, "stop")


async def chat_completions(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    cfg, extras = gen_settings(body, state.server.session.gen, oai=True)
    chat = ChatRequest(cfg, extras, chat_messages(body), tool_request(body))
    run = await open_chat(request, state, chat)
    obj_id, model = shapes.new_id("chatcmpl"), state.model_id
    if not extras.stream:
        a = await run.answer(request)
        return JSONResponse(shapes.oai_chat(obj_id, model, a.content, a.end.stats, a.calls, finish(a.end)))

    async def events():
        yield shapes.oai_chat_chunk(obj_id, model, {"role": "assistant", "content": None})
        async for ev in run.events(idle_s=KEEPALIVE_S):
            if isinstance(ev, Idle):
                yield KEEPALIVE
            elif isinstance(ev, Text):
                chunk = shapes.oai_chat_chunk(obj_id, model, {"content": ev.text})
                yield chunk if ev.live is None else {**chunk, **shapes.live_fields(ev.live)}
            elif isinstance(ev, ToolCall):
                yield shapes.oai_chat_chunk(obj_id, model, {"tool_calls": [{"index": ev.index, **ev.call}]})
            else:
                last = shapes.oai_chat_chunk(obj_id, model, {}, finish(ev))
                for out in stream_end(last, ev.stats, "chat.completion.chunk", extras.include_usage):
                    yield out
    return stream(run.run, events())


def stream_end(last: dict, st, kind: str, include_usage: bool) -> list:
    """An OpenAI stream's last events: the finishing chunk with the figures, the usage chunk when asked
    for (empty choices), then [DONE]."""
    last.update(timings=shapes.timings(st), localspec=shapes.localspec_stats(st))
    usage = [shapes.usage_chunk(last["id"], last["model"], kind, st)] if include_usage else []
    return [last, *usage, "data: [DONE]\n\n"]


async def completions(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    cfg, extras = gen_settings(body, state.server.session.gen, oai=True)
    tokens = completion_tokens(body)
    run = Run(state, lambda engine: (tokens(engine), cfg), extras)
    await run.start(request)
    obj_id, model = shapes.new_id("cmpl"), state.model_id
    if not extras.stream:
        text, st = await run.collect(request)
        return JSONResponse(shapes.oai_completion(obj_id, model, text, st, finish(end_of(st, []))))

    async def events():
        async for text in run.texts():
            chunk = shapes.oai_completion(obj_id, model, text)
            yield chunk if run.live is None else {**chunk, **shapes.live_fields(run.live)}
        st = run.stats
        last = shapes.oai_completion(obj_id, model, "", None, finish(end_of(st, [])))
        for out in stream_end(last, st, "text_completion", extras.include_usage):
            yield out
    return stream(run, events())


async def models(request: Request, state: ServerState) -> Response:
    m = state.server.model
    meta = {"n_vocab": m.n_vocab, "n_ctx": state.server.engine.target.n_ctx,
            "size": m.path.stat().st_size if m.path.exists() else None}
    return JSONResponse({"object": "list", "data": [
        {"id": state.model_id, "object": "model", "created": 0, "owned_by": "localspec",
         "aliases": sorted(state.aliases - {state.model_id}), "meta": meta}]})


ROUTES = [
    ("/v1/chat/completions", chat_completions, ["POST"]), ("/chat/completions", chat_completions, ["POST"]),
    ("/v1/completions", completions, ["POST"]),
    ("/v1/models", models, ["GET"]), ("/models", models, ["GET"]),
]
