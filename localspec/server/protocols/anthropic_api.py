"""Anthropic's Messages API (what Claude Code and the `anthropic` SDKs speak): POST /v1/messages,
streamed as Anthropic's named SSE events, /v1/messages/count_tokens, errors in Anthropic's shape.

The request becomes the internal `ChatRequest` (tool_use and tool_result blocks become the chat
template's tool calls and tool messages, as llama-server converts them); the events come back as
text and tool_use content blocks. `thinking` and `metadata` are accepted and ignored (the model has no
thinking mode); images and documents are refused with a 400 that says so.
"""

from __future__ import annotations

import json
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...chat_format import Message
from ..apierrors import ApiError
from ..bridge import END, KEEPALIVE_S, LENGTH, STOP_SEQUENCE, TOOL_CALLS, End, Idle, Text, named_sse
from ..http import read_body
from ..request import ChatRequest, joined_text, localspec_stats, open_chat, prompt_size, timings
from ..settings import LOCALSPEC_FIELDS, gen_settings, integer
from ..state import ServerState
from ..tools import call_arguments, tool_request

STOP_REASON = {END: "end_turn", STOP_SEQUENCE: "stop_sequence", LENGTH: "max_tokens", TOOL_CALLS: "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
BILLING = "x-anthropic-billing-header:"
SETTINGS = ("temperature", "top_p", "top_k", "stream", "seed", *LOCALSPEC_FIELDS)  # passed through


def errors(e: ApiError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


ERRORS = errors


# --- request in ----------------------------------------------------------------------------------
def _text_of(blocks, where: str) -> str:
    """A string, or text blocks joined (cache_control and citations ignored; a model without thinking
    drops earlier thoughts; images and documents are a 400)."""
    return joined_text(blocks, where, ("text",), ("thinking", "redacted_thinking"))


def _system(blocks) -> str:
    """The system prompt, without Claude Code's billing block: its `cch=` changes with every request and,
    first in the prompt, would make every request's prefix new to the prompt cache (vLLM and
    llama-server drop it too)."""
    if isinstance(blocks, list):
        blocks = [b for b in blocks if not (isinstance(b, dict) and str(b.get("text", "")).startswith(BILLING))]
    return _text_of(blocks, "system")


def _turn(m, i: int, call_ids: set) -> list[Message]:
    """One message as chat turns; call_ids: the tool_use ids of the messages before it (this one's are added)."""
    # Claude Code 2.1 also puts "system" turns among the messages (the agent list); templates render them
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
        raise ApiError(400, f'messages.{i}: each message needs "role": "user" or "assistant"')
    content, where = m.get("content"), f"messages.{i}.content"
    if isinstance(content, str):
        return [Message(m["role"], content)]
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of content blocks")
    out, texts, calls = [], [], []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "tool_result" and m["role"] == "user":
            if not isinstance(b.get("tool_use_id"), str):
                raise ApiError(400, f'{where}.{j}: a tool_result needs its "tool_use_id"')
            if b["tool_use_id"] not in call_ids:
                raise ApiError(400, f"{where}.{j}.tool_use_id: no tool_use block with id {b['tool_use_id']!r} comes "
                                    "before this tool_result")
            result = _text_of(b.get("content") or "", f"{where}.{j}.content")
            if b.get("is_error"):
                result = f"Error: {result}"
            out.append(Message("tool", result, {"tool_call_id": b["tool_use_id"]}))
        elif kind == "tool_use" and m["role"] == "assistant":
            if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                raise ApiError(400, f'{where}.{j}: a tool_use needs a "name" and an "input" object')
            if not isinstance(b.get("id"), str) or not b["id"]:
                raise ApiError(400, f'{where}.{j}.id: a tool_use needs its "id"')
            call_ids.add(b["id"])
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": b.get("input") or {}}})
        else:
            texts.append(_text_of([b], where))
    if texts or calls or not out:
        out.append(Message(m["role"], "".join(texts), {"tool_calls": calls} if calls else None))
    return out


def _tools(body: dict):
    """Anthropic tools ({name, description, input_schema}) and tool_choice as the internal tool request."""
    choice = body.get("tool_choice") or {"type": "auto"}
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise ApiError(400, '"tool_choice" must be {"type": "auto" | "any" | "tool" | "none"}')
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise ApiError(400, '"tools" must be a list of {"name", "description", "input_schema"} objects')
    fns = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            kind = t.get("type") if isinstance(t, dict) else None
            raise ApiError(400, f"tools.{i}: server tools ({kind}) are not supported here; give client tools "
                                '{"name", "description", "input_schema"}')
        if not isinstance(t.get("name"), str) or not isinstance(t.get("input_schema", {}), dict):
            raise ApiError(400, f'tools.{i} needs a "name" and an "input_schema" object')
        fns.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                     "parameters": t.get("input_schema") or {"type": "object"}}})
    kind = choice["type"]
    oai_choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
        {"type": "function", "function": {"name": choice.get("name")}}
    return tool_request({"tools": fns, "tool_choice": oai_choice,
                         "parallel_tool_calls": not choice.get("disable_parallel_tool_use", False)})


def chat_request(body: dict, state: ServerState, need_max_tokens: bool = True) -> ChatRequest:
    if need_max_tokens and integer(body, "max_tokens", 1) is None:
        raise ApiError(400, '"max_tokens" is required (a whole number, 1 or more)')
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, '"messages" must be a non-empty list of {"role", "content"} objects')
    stops = body.get("stop_sequences")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
        raise ApiError(400, '"stop_sequences" must be a list of strings')
    settings = {k: body[k] for k in SETTINGS if k in body}
    cfg, extras = gen_settings({**settings, "max_tokens": body.get("max_tokens"), "stop": stops},
                               state.worker.session.gen, oai=True)
    turns = []
    system = _system(body.get("system") or "")
    if system:
        turns.append(Message("system", system))
    call_ids: set = set()
    for i, m in enumerate(msgs):
        turns += _turn(m, i, call_ids)
    return ChatRequest(cfg, extras, turns, _tools(body))


# --- events out ------------------------------------------------------------------------------------
def _usage(st, prompt_len: int | None = None) -> dict:
    if st is None:
        return {"input_tokens": prompt_len, "output_tokens": 0, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0}
    return {"input_tokens": st.prompt_eval_tokens, "output_tokens": st.tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": st.prompt_tokens - st.prompt_eval_tokens}


def _message(msg_id: str, model: str, content: list, end: End | None, prompt_len: int) -> dict:
    st = end.stats if end else None
    out = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
           "stop_reason": STOP_REASON[end.reason] if end else None,
           "stop_sequence": end.stop_word if end and end.reason == STOP_SEQUENCE else None,
           "usage": _usage(st, prompt_len)}
    if st is not None:  # speculation's figures, beside Anthropic's own fields
        out.update(timings=timings(st), localspec=localspec_stats(st))
    return out


def tool_use_block(call: dict) -> dict:
    data = call_arguments(call["function"]["arguments"])
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"],
            "input": data if isinstance(data, dict) else {"value": data}}


async def messages(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    run = await open_chat(request, state, chat_request(body, state))
    msg_id, model = f"msg_{uuid.uuid4().hex[:24]}", body.get("model") or state.model_id
    if not run.extras.stream:
        a = await run.answer(request)
        content = ([{"type": "text", "text": a.content}] if a.content or not a.calls else [])
        content += [tool_use_block(c) for c in a.calls]
        return JSONResponse(_message(msg_id, model, content, a.end, run.prompt_len))

    async def events():
        yield {"type": "message_start", "message": _message(msg_id, model, [], None, run.prompt_len)}
        yield {"type": "ping"}
        index, text_open = 0, False
        async for ev in run.events(idle_s=KEEPALIVE_S):
            if isinstance(ev, Idle):
                yield {"type": "ping"}
                continue
            if isinstance(ev, Text):
                if not text_open:
                    yield {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
                    text_open = True
                yield {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": ev.text}}
                continue
            if text_open:
                yield {"type": "content_block_stop", "index": index}
                index, text_open = index + 1, False
            if isinstance(ev, End):
                yield {"type": "message_delta",
                       "delta": {"stop_reason": STOP_REASON[ev.reason],
                                 "stop_sequence": ev.stop_word if ev.reason == STOP_SEQUENCE else None},
                       "usage": _usage(ev.stats), "timings": timings(ev.stats),
                       "localspec": localspec_stats(ev.stats)}
                yield {"type": "message_stop"}
                return
            block = tool_use_block(ev.call)
            yield {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            yield {"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}}
            yield {"type": "content_block_stop", "index": index}
            index += 1
    return run.stream(events(), frame=named_sse, errors=errors)


async def count_tokens(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    chat = chat_request(body, state, need_max_tokens=False)
    engine = state.worker.engine
    tools = chat.tools.tools if chat.tools else None
    return JSONResponse({"input_tokens": await prompt_size(engine, chat.messages, tools)})


ROUTES = [
    ("/v1/messages", messages, ["POST"]), ("/v1/messages/count_tokens", count_tokens, ["POST"]),
]
