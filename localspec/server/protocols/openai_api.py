"""OpenAI's Chat Completions and Completions (llama-server's shapes of them, with `timings`), and the
model list: requests in as `ChatRequest`s, events out as JSON or SSE `data:` lines ending in [DONE]."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...chat_format import ROLE_ALIASES, ROLES, Message, canonical_role
from ..apierrors import ApiError
from ..bridge import KEEPALIVE, KEEPALIVE_S, LENGTH, TOOL_CALLS, End, Idle, Run, Text, ToolCall, end_of, stream
from ..http import read_body, require_serving
from ..request import ChatRequest, live_fields, localspec_stats, new_id, open_chat, timings
from ..settings import MISSING, boolean, gen_settings
from ..state import ServerState
from ..tools import call_arguments, tool_request

FINISH = {LENGTH: "length", TOOL_CALLS: "tool_calls"}  # the rest: "stop"


def finish(end: End) -> str:
    return FINISH.get(end.reason, "stop")


async def chat_completions(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    cfg, extras = gen_settings(body, state.worker.session.gen, oai=True)
    chat = ChatRequest(cfg, extras, chat_messages(body), tool_request(body))
    run = await open_chat(request, state, chat)
    obj_id, model = new_id("chatcmpl"), state.model_id
    if not extras.stream:
        a = await run.answer(request)
        return JSONResponse(oai_chat(obj_id, model, a.content, a.end.stats, a.calls, finish(a.end)))

    async def events():
        yield oai_chat_chunk(obj_id, model, {"role": "assistant", "content": None})
        async for ev in run.events(idle_s=KEEPALIVE_S):
            if isinstance(ev, Idle):
                yield KEEPALIVE
            elif isinstance(ev, Text):
                chunk = oai_chat_chunk(obj_id, model, {"content": ev.text})
                yield chunk if ev.live is None else {**chunk, **live_fields(ev.live)}
            elif isinstance(ev, ToolCall):
                yield oai_chat_chunk(obj_id, model, {"tool_calls": [{"index": ev.index, **ev.call}]})
            else:
                last = oai_chat_chunk(obj_id, model, {}, finish(ev))
                for out in stream_end(last, ev.stats, "chat.completion.chunk", extras.include_usage):
                    yield out
    return run.stream(events())


def stream_end(last: dict, st, kind: str, include_usage: bool) -> list:
    """An OpenAI stream's last events: the finishing chunk with the figures, the usage chunk when asked
    for (empty choices), then [DONE]."""
    last.update(timings=timings(st), localspec=localspec_stats(st))
    usage = [usage_chunk(last["id"], last["model"], kind, st)] if include_usage else []
    return [last, *usage, "data: [DONE]\n\n"]


async def completions(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    cfg, extras = gen_settings(body, state.worker.session.gen, oai=True)
    tokens = completion_tokens(body)
    run = Run(state, lambda engine: (tokens(engine), cfg), extras)
    await run.start(request)
    obj_id, model = new_id("cmpl"), state.model_id
    if not extras.stream:
        text, st = await run.collect(request)
        return JSONResponse(oai_completion(obj_id, model, text, st, finish(end_of(st, []))))

    async def events():
        async for text in run.texts():
            chunk = oai_completion(obj_id, model, text)
            yield chunk if run.live is None else {**chunk, **live_fields(run.live)}
        st = run.stats
        last = oai_completion(obj_id, model, "", None, finish(end_of(st, [])))
        for out in stream_end(last, st, "text_completion", extras.include_usage):
            yield out
    return stream(run, events())


async def models(request: Request, state: ServerState) -> Response:
    """One model (its names as aliases), or with several every model the server has, each with
    llama-server's router `status` (unloaded, loading, loaded, failed)."""
    router = state.router
    if router.single:
        require_serving(state)
        return JSONResponse({"object": "list", "data": [_model_entry(state.model_id, state.aliases, state)]})
    data = []
    for slot in router.slots:
        entry = _model_entry(slot.entry.name, slot.entry.aliases, slot.state if slot.status == "loaded" else None)
        entry["status"] = {"value": slot.status, **({"error": slot.error} if slot.error else {})}
        data.append(entry)
    return JSONResponse({"object": "list", "data": data})


def _model_entry(model_id: str, aliases: set[str], state: ServerState | None) -> dict:
    out = {"id": model_id, "object": "model", "created": 0, "owned_by": "localspec",
           "aliases": sorted(aliases - {model_id})}
    if state is not None and state.worker is not None:
        m = state.worker.model
        out["meta"] = {"n_vocab": m.n_vocab, "n_ctx": state.worker.engine.target.n_ctx,
                       "size": m.path.stat().st_size if m.path.exists() else None}
    return out


ROUTES = [
    ("/v1/chat/completions", chat_completions, ["POST"]), ("/chat/completions", chat_completions, ["POST"]),
    ("/v1/completions", completions, ["POST"]),
    ("/v1/models", models, ["GET"], {"needs_model": False}), ("/models", models, ["GET"], {"needs_model": False}),
]


# --- requests in: OpenAI's messages and prompts (llama-server's /completion and /apply-template read them too)
def chat_messages(body: dict) -> list[Message]:
    """OpenAI `messages` -> Messages; text parts of a content array are joined; an assistant's
    tool_calls and a tool result's ids go to the template as it expects them (tools.template_messages)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, '"messages" must be a non-empty list of {"role", "content"} objects')
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f'messages[{i}] must be an object with a string "role"')
        role = canonical_role(m["role"])
        if role is None:
            known = ", ".join([*ROLES, *ROLE_ALIASES])
            raise ApiError(400, f'messages[{i}].role "{m["role"]}" is not a role this server knows ({known})')
        extra = {k: m[k] for k in ("tool_calls", "tool_call_id", "name") if m.get(k) is not None}
        if "tool_calls" in extra:
            extra["tool_calls"] = _template_calls(extra["tool_calls"], i)
        out.append(Message(role, _content_text(m.get("content"), i), extra or None))
    return out


def _template_calls(calls, i: int) -> list[dict]:
    """OpenAI's assistant tool_calls carry arguments as a JSON string; chat templates (like HF's and
    llama.cpp's renderers) expect the object."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise ApiError(400, f"messages[{i}].tool_calls must be a list of tool call objects")
    out = []
    for c in calls:
        fn = dict(c.get("function") or {}) if isinstance(c.get("function"), dict) else {}
        if isinstance(fn.get("arguments"), str):  # not JSON: the template shows the text as it came
            fn["arguments"] = call_arguments(fn["arguments"])
        out.append({**c, "function": fn})
    return out


def _content_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise ApiError(400, f"messages[{i}].content: only text parts are supported by this server")
        return "".join(parts)
    raise ApiError(400, f'messages[{i}].content must be a string or a list of text parts')


def completion_prompt(body: dict) -> str | list[int]:
    """`prompt` as text, or as token ids (llama-server accepts both); one prompt per request."""
    p = body.get("prompt", MISSING)
    if p is MISSING or p is None:
        raise ApiError(400, '"prompt" is required')
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        return p
    if isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return list(p)
    raise ApiError(400, '"prompt" must be a string or a list of token ids (one prompt per request)')


def completion_tokens(body: dict):
    """engine -> the prompt's tokens for `prompt` (text, tokenized with the BOS, or token ids)."""
    prompt = completion_prompt(body)
    parse_special = boolean(body, "parse_special", True)  # localspec's: False reads "<|x|>" as plain text

    def tokens(engine) -> list[int]:
        m = engine.target_model
        if isinstance(prompt, str):
            return m.tokenize(prompt, add_special=True, parse_special=parse_special)
        if any(t < 0 or t >= m.n_vocab for t in prompt):
            raise ApiError(400, f'"prompt" has a token id outside the vocabulary (0..{m.n_vocab - 1})')
        return prompt
    return tokens


# --- OpenAI's response shapes (llama-server's: with `timings` and localspec's figures) ------------------
def usage(st) -> dict:
    return {"completion_tokens": st.tokens, "prompt_tokens": st.prompt_tokens,
            "total_tokens": st.tokens + st.prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": st.prompt_tokens - st.prompt_eval_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0,  # predicted outputs, as OpenAI counts them
                                          "accepted_prediction_tokens": st.prediction_accepted,
                                          "rejected_prediction_tokens": st.prediction_rejected}}


def _oai_head(obj_id: str, model: str, kind: str) -> dict:
    return {"id": obj_id, "object": kind, "created": int(time.time()), "model": model,
            "system_fingerprint": "localspec"}


def oai_completion(obj_id: str, model: str, text: str | None, st=None, finish: str | None = None) -> dict:
    """/v1/completions: the whole answer (st given) or one streamed piece."""
    out = _oai_head(obj_id, model, "text_completion")
    out["choices"] = [{"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish}]
    if st is not None:
        out["usage"] = usage(st)
        out["timings"] = timings(st)
        out["localspec"] = localspec_stats(st)
    return out


def oai_chat(obj_id: str, model: str, text: str, st, tool_calls: list, finish: str) -> dict:
    out = _oai_head(obj_id, model, "chat.completion")
    message = {"role": "assistant", "content": text or (None if tool_calls else text)}
    if tool_calls:
        message["tool_calls"] = tool_calls
    out["choices"] = [{"index": 0, "finish_reason": finish, "message": message}]
    out.update(usage=usage(st), timings=timings(st), localspec=localspec_stats(st))
    return out


def oai_chat_chunk(obj_id: str, model: str, delta: dict, finish: str | None = None) -> dict:
    out = _oai_head(obj_id, model, "chat.completion.chunk")
    out["choices"] = [{"index": 0, "finish_reason": finish, "delta": delta}]
    return out


def usage_chunk(obj_id: str, model: str, kind: str, st) -> dict:
    """The extra last event of stream_options.include_usage: empty choices, the usage."""
    out = _oai_head(obj_id, model, kind)
    out.update(choices=[], usage=usage(st))
    return out
