"""Ollama's API (what Open WebUI, Enchanted, Continue's `ollama` provider, the `ollama` libraries and
`llm-ollama` speak): /api/chat and /api/generate streamed as NDJSON by default, /api/tags, /api/show,
/api/ps, /api/version, and "Ollama is running" at the base address.

A request's `model` picks the model (any name when the server has one); the model list, pull and
delete are `ollama_models`. /api/create, /api/push and /api/copy are refused with an error that names
`localspec pull`.
Options this engine has no sampler for (repeat_penalty, mirostat, ...) are ignored, as Ollama ignores
options a model does not use; `num_ctx` cannot change a loaded context and is ignored too.
"""

from __future__ import annotations

import datetime as dt
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...chat_format import Message
from ...fim.layout import FimUnsupported, fim_stop_tokens, infill_tokens, require_fim
from ...models.gguf_header import read_header_file
from ..apierrors import ApiError
from ..bridge import LENGTH, End, Text, ToolCall
from ..http import read_body, require_serving
from ..request import ChatRequest, localspec_stats, open_chat
from ..settings import LOCALSPEC_FIELDS, boolean, gen_settings, keep_alive_seconds, string
from ..state import ServerState
from ..tools import call_arguments, renders_tools, tool_request
from .ollama_models import entry, loaded_entry

VERSION = "0.12.6"  # the Ollama API level answered here (clients compare it against their minimum)
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
           "stop": "stop"}  # Ollama option -> generation field (num_predict is below)
MANAGEMENT = ("push", "create", "copy", "blobs/{digest}")


def errors(e: ApiError) -> dict:
    return {"error": e.message}


ERRORS = errors


def ndjson(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")


# --- request in ----------------------------------------------------------------------------------
def _settings(body: dict, state: ServerState):
    """`options`, `format`, `stream` (on unless false) and localspec's own fields as a GenConfig."""
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, '"options" must be an object like {"temperature": 0, "num_predict": 128}')
    fields = {OPTIONS[k]: v for k, v in options.items() if k in OPTIONS}
    n = options.get("num_predict")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise ApiError(400, '"options.num_predict" must be a whole number (-1: no limit)')
        fields["n_predict"] = n if n >= 0 else -1
    fmt = body.get("format")
    if fmt == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        fields["json_schema"] = fmt
    elif fmt not in (None, ""):
        raise ApiError(400, '"format" must be "json" or a JSON schema object')
    for k in LOCALSPEC_FIELDS:  # localspec's own, at the top level or among the options
        if k in body or k in options:
            fields[k] = body.get(k, options.get(k))
    fields["stream"] = boolean(body, "stream", True)
    return gen_settings(fields, state.worker.session.gen, oai=False)


def _images(m: dict, where: str) -> None:
    if m.get("images"):
        raise ApiError(400, f"{where}: images are not supported by this model")


def _messages(body: dict) -> list[Message]:
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise ApiError(400, '"messages" must be a list of {"role", "content"} objects')
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise ApiError(400, f'messages[{i}] needs "role": "system", "user", "assistant" or "tool"')
        _images(m, f"messages[{i}]")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string")
        extra = {}
        if m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                      for c in calls):
                raise ApiError(400, f'messages[{i}].tool_calls must be a list of {{"function": {{"name", "arguments"}}}}')
            extra["tool_calls"] = [{"type": "function", "function": c["function"]} for c in calls]
        if m.get("tool_name"):
            extra["name"] = m["tool_name"]
        out.append(Message(m["role"], content, extra or None))
    if not out:
        raise ApiError(400, '"messages" is empty: nothing to answer')
    return out


# --- events out ------------------------------------------------------------------------------------
def _figures(end: End) -> dict:
    """Ollama's closing fields (durations in nanoseconds), with speculation's figures beside them."""
    st = end.stats
    out = {"done": True, "done_reason": "length" if end.reason == LENGTH else "stop",
           "total_duration": int((st.prompt_eval_s + st.generation_s) * 1e9), "load_duration": 0,
           "prompt_eval_count": st.prompt_tokens, "prompt_eval_duration": int(st.prompt_eval_s * 1e9),
           "eval_count": st.tokens, "eval_duration": int(st.generation_s * 1e9),
           "draft_n": st.drafted, "draft_n_accepted": st.accepted}
    out["localspec"] = localspec_stats(st)
    return out


def _call(c: dict, index: int) -> dict:
    return {"id": c["id"], "function": {"index": index, "name": c["function"]["name"],
                                        "arguments": call_arguments(c["function"]["arguments"])}}


async def _reply(request: Request, state: ServerState, chat: ChatRequest, model: str, chat_api: bool) -> Response:
    run = await open_chat(request, state, chat)

    def piece(text: str, calls: list | None = None) -> dict:
        head = {"model": model, "created_at": _now()}
        if not chat_api:
            return {**head, "response": text, "done": False}
        msg = {"role": "assistant", "content": text}
        if calls:
            msg["tool_calls"] = calls
        return {**head, "message": msg, "done": False}

    if not chat.extras.stream:
        a = await run.answer(request)
        return JSONResponse({**piece(a.content, [_call(c, i) for i, c in enumerate(a.calls)]), **_figures(a.end)})

    async def events():
        async for ev in run.events():
            if isinstance(ev, Text):
                yield piece(ev.text)
            elif isinstance(ev, ToolCall):
                yield piece("", [_call(ev.call, ev.index)])
            else:
                yield {**piece(""), **_figures(ev)}
    return run.stream(events(), media_type="application/x-ndjson", frame=ndjson, errors=errors)


async def chat(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    cfg, extras = _settings(body, state)
    model = string(body, "model") or state.model_id
    msgs = _messages(body)
    return await _reply(request, state, ChatRequest(cfg, extras, msgs, tool_request(body)), model, chat_api=True)


def _fim(state: ServerState, prompt: str, suffix: str, cfg):
    m = state.worker.model
    try:
        require_fim(m.fim_tokens())
    except FimUnsupported as e:
        raise ApiError(400, f'"suffix": {e}')
    cfg.stop_tokens = fim_stop_tokens(m)
    parts = {"input_prefix": prompt, "input_suffix": suffix, "prompt": ""}

    def tokens(engine) -> list[int]:
        n_ctx = engine.target.n_ctx
        return infill_tokens(engine.target_model, parts, [], n_ctx, cfg.max_tokens if cfg.max_tokens < n_ctx else 0)
    return tokens


async def generate(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    cfg, extras = _settings(body, state)
    model = string(body, "model") or state.model_id
    prompt, suffix, system = string(body, "prompt", ""), string(body, "suffix", ""), string(body, "system", "")
    _images(body, "the request")
    if body.get("template"):
        raise ApiError(400, '"template" is not supported: the GGUF\'s own chat template is used (or "raw": true)')
    if not prompt and not suffix:  # Ollama's way to load a model (loaded by now), or with keep_alive 0 to unload it
        reason = "unload" if keep_alive_seconds(body.get("keep_alive")) == 0 else "load"
        return JSONResponse({"model": model, "created_at": _now(), "response": "", "done": True, "done_reason": reason})
    chat = ChatRequest(cfg, extras)
    if suffix:
        chat.prompt = _fim(state, prompt, suffix, cfg)
    elif boolean(body, "raw"):
        chat.prompt = lambda engine: engine.target_model.tokenize(prompt, add_special=True, parse_special=True)
    else:
        chat.messages = ([Message("system", system)] if system else []) + [Message("user", prompt)]
    return await _reply(request, state, chat, model, chat_api=False)


# --- information about a model --------------------------------------------------------------------
async def show(request: Request, state: ServerState) -> Response:
    """A loaded model's facts from llama.cpp; with several models, an unloaded one's from its GGUF header
    (showing a model does not load it, as in Ollama)."""
    body = await read_body(request)
    name = string(body, "model") or string(body, "name")
    router = state.router
    if router.single:
        require_serving(state)
        served, slot = state, None
    else:
        slot = router.find(name)
        served = slot.state if slot.status == "loaded" else None
    if served is not None and served.worker is not None:
        srv, m = served.worker, served.worker.model
        facts = (m.meta, srv.engine.target.n_ctx, srv.engine.chat_template() or "", bool(m.fim_tokens()))
        e = loaded_entry(served, served.model_id)
    else:
        path = (slot.entry.files or [None])[0]
        if path is None:
            raise ApiError(404, f"model '{slot.entry.name}' has no file on disk yet; it is assembled when it loads")
        header = read_header_file(path)
        arch = header.architecture or ""
        facts = (header.get, header.get(f"{arch}.context_length") or 0, header.get("tokenizer.chat_template") or "",
                 header.get("tokenizer.ggml.fim_pre_token_id") is not None)
        e = entry(slot.entry.name, path, slot.entry.size)
    meta, n_ctx, template, fim = facts
    arch = meta("general.architecture") or "llama"
    info = {"general.architecture": arch, f"{arch}.context_length": n_ctx, "general.parameter_count": _param_count(meta)}
    return JSONResponse({"modelfile": f"# served by localspec: {e['name']}\n", "parameters": "", "template": template,
                         "details": e["details"], "model_info": info,
                         "capabilities": ["completion", *(["tools"] if renders_tools(template) else []),
                                          *(["insert"] if fim else [])],
                         "modified_at": e["modified_at"], "model": name or e["name"]})


def _param_count(meta) -> int:
    """From the GGUF's size label ("1.5B"), 0 when it has none."""
    try:
        return int(float((meta("general.size_label") or "0").upper().rstrip("B")) * 1e9)
    except ValueError:
        return 0


async def version(request: Request, state: ServerState) -> Response:
    return JSONResponse({"version": VERSION})


async def root(request: Request, state: ServerState) -> Response:
    return Response("Ollama is running" if request.method == "GET" else b"", media_type="text/plain")


async def management(request: Request, state: ServerState) -> Response:
    raise ApiError(501, f"{request.url.path} is not served: localspec serves the GGUF models it finds on this "
                        "machine; fetch one with `localspec pull NAME` (or POST /api/pull)")


async def not_supported(request: Request, state: ServerState) -> Response:
    raise ApiError(501, f"{request.url.path} is not supported by localspec (no embedding model is loaded)")


ROUTES = [
    ("/api/chat", chat, ["POST"]), ("/api/generate", generate, ["POST"]),
    ("/api/show", show, ["POST"], {"needs_model": False}),
    ("/api/version", version, ["GET"], {"needs_model": False}),
    *((f"/api/{p}", management, ["POST", "DELETE", "HEAD"], {"needs_model": False}) for p in MANAGEMENT),
    ("/api/embed", not_supported, ["POST"]), ("/api/embeddings", not_supported, ["POST"]),
]
