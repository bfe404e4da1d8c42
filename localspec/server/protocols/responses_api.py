"""OpenAI's Responses API (what Codex CLI and the OpenAI Agents SDK speak): POST /v1/responses, streamed
as typed events with a `sequence_number`, and /v1/responses/input_tokens.

`input` (a string or items: messages, function_call, function_call_output) becomes the internal
`ChatRequest`; text and function calls come back as output items. `previous_response_id` continues a
conversation this server answered (kept in a bounded memory, as `store` asks; the process forgets on
restart). Reasoning items are accepted and dropped (the model has no reasoning mode); tools other than
functions (web_search and the other hosted tools, Codex's tool namespaces) are not offered to the model,
as llama-server does, with a line in the server's log.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...chat_format import Message
from ...serving.log import log_note
from ..apierrors import ApiError
from ..bridge import KEEPALIVE, KEEPALIVE_S, LENGTH, Answer, End, Idle, Text, ToolCall, named_sse
from ..http import read_body
from ..request import ChatRequest, joined_text, localspec_stats, open_chat, prompt_size, timings
from ..settings import LOCALSPEC_FIELDS, boolean, gen_settings, integer, string
from ..state import ServerState
from ..tools import call_arguments, tool_request

REMEMBERED = 256  # responses kept for previous_response_id, oldest forgotten first
SETTINGS = ("temperature", "top_p", "top_k", "stream", "seed", "parallel_tool_calls", *LOCALSPEC_FIELDS)
ROLES = ("user", "assistant", "system", "developer")


class Memory:
    """The conversations behind recent responses: id -> the messages up to and including the answer."""

    def __init__(self, size: int = REMEMBERED):
        self.size, self.items = size, OrderedDict()

    def get(self, response_id: str) -> list[Message]:
        if response_id not in self.items:
            raise ApiError(400, f'"previous_response_id": no response {response_id!r} is remembered by this '
                                "server (it keeps the last few hundred while it runs); send the whole input")
        self.items.move_to_end(response_id)
        return list(self.items[response_id])

    def put(self, response_id: str, messages: list[Message]) -> None:
        self.items[response_id] = messages
        while len(self.items) > self.size:
            self.items.popitem(last=False)


def _memory(request: Request) -> Memory:
    app_state = request.app.state
    if not hasattr(app_state, "responses_memory"):
        app_state.responses_memory = Memory()
    return app_state.responses_memory


# --- request in ----------------------------------------------------------------------------------
def _text(content, where: str) -> str:
    return joined_text(content, where, ("input_text", "output_text", "text"), ("refusal",))


def _items(items, turns: list[Message]) -> None:
    if isinstance(items, str):
        turns.append(Message("user", items))
        return
    if not isinstance(items, list):
        raise ApiError(400, '"input" must be a string or a list of input items')
    for i, it in enumerate(items):
        kind = it.get("type", "message") if isinstance(it, dict) else None
        where = f"input[{i}]"
        if kind == "message" and it.get("role") in ROLES:
            role = "system" if it["role"] == "developer" else it["role"]
            turns.append(Message(role, _text(it.get("content"), f"{where}.content")))
        elif kind == "function_call":
            if not isinstance(it.get("name"), str):
                raise ApiError(400, f'{where}: a function_call needs its "name"')
            call = {"id": it.get("call_id") or it.get("id") or "", "type": "function",
                    "function": {"name": it["name"], "arguments": call_arguments(it.get("arguments"))}}
            last = turns[-1] if turns else None
            if last is not None and last.role == "assistant" and last.extra and "tool_calls" in last.extra:
                last.extra["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                turns.append(Message("assistant", "", {"tool_calls": [call]}))
        elif kind == "function_call_output":
            call_id = it.get("call_id")
            if call_id not in _call_ids(turns):
                raise ApiError(400, f"{where}.call_id: no function_call with call_id {call_id!r} comes before this "
                                    "function_call_output (in the input or the previous response)")
            output = it.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            turns.append(Message("tool", text, {"tool_call_id": call_id}))
        elif kind != "reasoning":
            raise ApiError(400, f"{where}: {kind!r} items are not supported here (messages, function_call, "
                                "function_call_output are)")


def _call_ids(turns: list[Message]) -> set:
    return {c["id"] for t in turns if t.extra for c in t.extra.get("tool_calls", ())}


def _tools(body: dict):
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise ApiError(400, '"tools" must be a list of {"type": "function", "name", "parameters"} objects')
    fns, skipped = [], []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("type"), str):
            raise ApiError(400, f'tools[{i}] must be an object with a "type"')
        if t["type"] != "function":  # hosted tools only OpenAI runs (web_search, ...): as llama-server, left out
            skipped.append(t["type"])
            continue
        if not isinstance(t.get("name"), str):
            raise ApiError(400, f'tools[{i}]: a function tool needs its "name"')
        fns.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}})
    if skipped:
        log_note(f"/v1/responses: tools of type {', '.join(sorted(set(skipped)))} are not offered to the model "
                 "(only function tools are)")
    if not fns:
        return None
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return tool_request({"tools": fns, "tool_choice": choice,
                         "parallel_tool_calls": body.get("parallel_tool_calls", True)})


def _format(body: dict) -> dict:
    """`text.format` as the chat request's response_format."""
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return {}
    if not isinstance(fmt, dict):
        raise ApiError(400, '"text.format" must be {"type": "text" | "json_object" | "json_schema", ...}')
    if fmt.get("type") == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}}
    return {"response_format": {"type": fmt.get("type")}}


def chat_request(body: dict, request: Request, state: ServerState) -> ChatRequest:
    settings = {k: body[k] for k in SETTINGS if k in body}
    cfg, extras = gen_settings({**settings, "max_tokens": integer(body, "max_output_tokens", 1), **_format(body)},
                               state.worker.session.gen, oai=True)
    turns = []
    if string(body, "instructions"):
        turns.append(Message("system", body["instructions"]))
    boolean(body, "store", True)  # read again once answered: a bad value is a 400 before any byte
    prev = string(body, "previous_response_id")
    if prev:
        turns += _memory(request).get(prev)
    if body.get("input") is None:
        raise ApiError(400, '"input" is required: a string or a list of input items')
    _items(body["input"], turns)
    return ChatRequest(cfg, extras, turns, _tools(body))


# --- events out ------------------------------------------------------------------------------------
def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(call: dict, status: str = "completed") -> dict:
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] if status == "completed" else "", "status": status}


class ResponseObject:
    """The response object as it grows."""

    def __init__(self, body: dict, model: str, prev: str | None):
        self.id, self.created = f"resp_{uuid.uuid4().hex[:24]}", int(time.time())
        self.body, self.model, self.prev = body, model, prev

    def obj(self, status: str, output: list, end: End | None = None) -> dict:
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "error": None, "incomplete_details": None, "instructions": self.body.get("instructions"),
               "max_output_tokens": self.body.get("max_output_tokens"), "model": self.model, "output": output,
               "parallel_tool_calls": self.body.get("parallel_tool_calls", True),
               "previous_response_id": self.prev, "store": self.body.get("store", True),
               "temperature": self.body.get("temperature"), "top_p": self.body.get("top_p"),
               "text": self.body.get("text") or {"format": {"type": "text"}},
               "tool_choice": self.body.get("tool_choice", "auto"), "tools": self.body.get("tools") or [],
               "metadata": self.body.get("metadata") or {}, "usage": None}
        if end is not None:
            st = end.stats
            if end.reason == LENGTH:
                out["status"], out["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            out["usage"] = {"input_tokens": st.prompt_tokens, "output_tokens": st.tokens,
                            "total_tokens": st.prompt_tokens + st.tokens,
                            "input_tokens_details": {"cached_tokens": st.prompt_tokens - st.prompt_eval_tokens},
                            "output_tokens_details": {"reasoning_tokens": 0}}
            out.update(timings=timings(st), localspec=localspec_stats(st))
        return out


def _remember(request: Request, chat: ChatRequest, resp: ResponseObject, a: Answer) -> None:
    calls = [{**c, "function": {**c["function"], "arguments": call_arguments(c["function"]["arguments"])}} for c in a.calls]
    answer = Message("assistant", a.content, {"tool_calls": calls} if calls else None)
    _memory(request).put(resp.id, [*chat.messages, answer])


async def responses(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    chat = chat_request(body, request, state)
    run = await open_chat(request, state, chat)
    resp = ResponseObject(body, string(body, "model") or state.model_id, string(body, "previous_response_id"))
    if not chat.extras.stream:
        a = await run.answer(request)
        output = ([_message_item(f"msg_{uuid.uuid4().hex[:24]}", a.content)] if a.content or not a.calls else [])
        output += [_call_item(c) for c in a.calls]
        if boolean(body, "store", True):
            _remember(request, chat, resp, a)
        return JSONResponse(resp.obj("completed", output, a.end))
    return run.stream(_events(request, body, chat, run, resp), frame=named_sse)


async def _events(request: Request, body: dict, chat: ChatRequest, run, resp: ResponseObject):
    seq = 0

    def ev(kind: str, **fields) -> dict:
        nonlocal seq
        seq += 1
        return {"type": kind, "sequence_number": seq - 1, **fields}

    yield ev("response.created", response=resp.obj("in_progress", []))
    yield ev("response.in_progress", response=resp.obj("in_progress", []))
    output, text, msg_id, calls = [], [], None, []
    async for e in run.events(idle_s=KEEPALIVE_S):
        if isinstance(e, Idle):
            yield KEEPALIVE
            continue
        if isinstance(e, Text):
            if msg_id is None:
                msg_id = f"msg_{uuid.uuid4().hex[:24]}"
                yield ev("response.output_item.added", output_index=len(output), item=_message_item(msg_id, "", "in_progress"))
                yield ev("response.content_part.added", item_id=msg_id, output_index=len(output), content_index=0,
                         part={"type": "output_text", "text": "", "annotations": []})
            text.append(e.text)
            yield ev("response.output_text.delta", item_id=msg_id, output_index=len(output), content_index=0,
                     delta=e.text, logprobs=[])
            continue
        if msg_id is not None:  # the message ends where a call or the end begins
            whole = "".join(text)
            yield ev("response.output_text.done", item_id=msg_id, output_index=len(output), content_index=0,
                     text=whole, logprobs=[])
            yield ev("response.content_part.done", item_id=msg_id, output_index=len(output), content_index=0,
                     part={"type": "output_text", "text": whole, "annotations": []})
            output.append(_message_item(msg_id, whole))
            yield ev("response.output_item.done", output_index=len(output) - 1, item=output[-1])
            msg_id, text = None, []
        if isinstance(e, ToolCall):
            calls.append(e.call)
            item = _call_item(e.call)
            yield ev("response.output_item.added", output_index=len(output), item=_call_item(e.call, "in_progress"))
            yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=len(output),
                     delta=item["arguments"])
            yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=len(output),
                     arguments=item["arguments"])
            output.append(item)
            yield ev("response.output_item.done", output_index=len(output) - 1, item=item)
        elif isinstance(e, End):
            content = "".join(o["content"][0]["text"] for o in output if o["type"] == "message")
            if boolean(body, "store", True):
                _remember(request, chat, resp, Answer(content, calls, e))
            final = resp.obj("completed", output, e)
            yield ev("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)


async def input_tokens(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    chat = chat_request(body, request, state)
    n = await prompt_size(state.worker.engine, chat.messages, chat.tools.tools if chat.tools else None)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})


ROUTES = [("/v1/responses", responses, ["POST"]), ("/v1/responses/input_tokens", input_tokens, ["POST"])]
