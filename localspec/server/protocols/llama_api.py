"""llama-server's own endpoints: /completion and /infill (its native shape, streamed without [DONE]),
/health, /props, /tokenize, /detokenize, /apply-template and /metrics."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ...errors import LocalspecError
from ...fim.layout import FimUnsupported, fim_stop_tokens, infill_tokens, require_fim
from ...serving.metrics import prometheus_text
from ..apierrors import ApiError
from ..bridge import Run, stream
from ..http import read_body, read_json, require_serving
from ..infill import check_infill_body
from ..request import conversation, live_fields, localspec_stats, timings
from ..settings import MISSING, Extras, boolean, gen_settings, string
from ..state import ServerState
from ..tools import tool_request
from .openai_api import chat_messages, completion_tokens

STOP_TYPE = {"eos": "eos", "stop": "word"}  # anything else -> "limit"


def native_final(content: str, st, model: str, cfg, stopping_word: str = "") -> dict:
    """/completion and /infill (non-streamed, or the last streamed event with content "")."""
    return {
        "index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True, "model": model,
        "tokens_predicted": st.tokens, "tokens_evaluated": st.prompt_tokens,
        "generation_settings": generation_settings(cfg), "prompt": "",
        "has_new_line": "\n" in content, "truncated": st.stop_reason == "context",
        "stop_type": STOP_TYPE.get(st.stop_reason, "limit"), "stopping_word": stopping_word,
        "tokens_cached": st.prompt_tokens + st.tokens, "timings": timings(st), "localspec": localspec_stats(st),
    }


def native_partial(text: str, n_decoded: int, prompt_len: int) -> dict:
    return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": 0,
            "tokens_predicted": n_decoded, "tokens_evaluated": prompt_len}


def generation_settings(cfg) -> dict:
    return {"n_predict": cfg.max_tokens, "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
            "min_p": cfg.min_p, "seed": -1 if cfg.seed is None else cfg.seed, "stop": list(cfg.stop),
            "speculative.n_max": cfg.draft_max, "speculative.n_min": cfg.draft_min, "speculative.p_min": cfg.p_min,
            "spec": cfg.spec, "drafter": cfg.drafter}


def pick_fields(obj: dict, paths: list[str]) -> dict:
    """llama-server's `response_fields`: {"timings/prompt_n": ..., "content": ...}, flat, paths that
    exist only."""
    out = {}
    for path in paths:
        cur: Any = obj
        for part in path.split("/"):
            if not isinstance(cur, dict) or part not in cur:
                cur = MISSING
                break
            cur = cur[part]
        if cur is not MISSING:
            out[path] = cur
    return out


async def _native(request: Request, state: ServerState, run: Run, cfg, extras: Extras) -> Response:
    prompt_len = await run.start(request)
    if not extras.stream:
        text, st = await run.collect(request)
        out = native_final(text, st, state.model_id, cfg)
        return JSONResponse(pick_fields(out, extras.response_fields) if extras.response_fields else out)

    async def events():
        n = 0
        async for text in run.texts():
            n += 1
            chunk = native_partial(text, n, prompt_len)
            yield chunk if run.live is None else {**chunk, **live_fields(run.live)}
        yield native_final("", run.stats, state.model_id, cfg)
    return stream(run, events())


async def completion(request: Request, state: ServerState) -> Response:
    body = await read_body(request)
    cfg, extras = gen_settings(body, state.worker.session.gen, oai=False)
    tokens = completion_tokens(body)
    return await _native(request, state, Run(state, lambda engine: (tokens(engine), cfg), extras), cfg, extras)


def infill_prompt(state: ServerState, body: dict, cfg):
    """engine -> the FIM prompt for an editor's request (`extra` checked), setting cfg.heal."""
    extra = check_infill_body(body)
    windows = state.worker.fim
    warmup = cfg.max_tokens == 0

    def tokens(engine) -> list[int]:
        if windows is None:  # --fim-layout llama-server
            n_ctx = engine.target.n_ctx
            n_predict = cfg.max_tokens if cfg.max_tokens < n_ctx else 0  # unlimited: no room set aside
            return infill_tokens(engine.target_model, body, extra, n_ctx, n_predict)
        if warmup and not (body["input_prefix"] or body["input_suffix"] or body.get("prompt")):
            return windows.warmup_prompt(extra)  # an editor's new extra context, evaluated in the background
        prompt, cfg.heal = windows.completion_prompt(body, extra, engine.cached_prefix)
        return prompt
    return tokens


def require_infill(state: ServerState) -> None:
    try:
        require_fim(state.worker.model.fim_tokens())
    except FimUnsupported as e:
        raise ApiError(501, str(e))


async def infill(request: Request, state: ServerState) -> Response:
    require_infill(state)
    body = await read_body(request)
    cfg, extras = gen_settings(body, state.worker.session.gen, oai=False)
    cfg.stop_tokens = fim_stop_tokens(state.worker.model)
    cfg.repeatable = False  # an editor waits on every keystroke: its prompt reuses the cache whole, drafts recall
    tokens = infill_prompt(state, body, cfg)
    warmup = cfg.max_tokens == 0
    slot = None if warmup else f"infill/{body.get('id_slot', -1)}"
    # an editor's completion goes ahead of the other requests' decoding (the user is waiting at the cursor)
    run = Run(state, lambda engine: (tokens(engine), cfg), extras, background=warmup, slot=slot, priority=not warmup)
    return await _native(request, state, run, cfg, extras)


async def health(request: Request, state: ServerState) -> Response:
    router = state.router
    if router.single:
        require_serving(state)  # the truth: 503 while loading, shutting down, or unable to generate
    elif router.loads == 0 and router.default.status == "loading":
        raise ApiError(503, "Loading model")  # ready once the default is: later, models load on demand
    return JSONResponse({"status": "ok"})  # several models: each one's state is in /models


async def props(request: Request, state: ServerState) -> Response:
    srv = state.worker
    sess, m = srv.session, srv.model
    facts = await asyncio.to_thread(srv.facts)
    return JSONResponse({
        "default_generation_settings": {"params": generation_settings(sess.gen), "n_ctx": facts["n_ctx"]},
        "total_slots": facts["total_slots"], "model_alias": state.model_id, "model_path": str(m.path),
        "modalities": {"vision": False, "audio": False},
        "chat_template": srv.engine.chat_template() or "",
        "bos_token": m.token_text(m.bos) if m.bos >= 0 else "", "eos_token": m.token_text(m.eos) if m.eos >= 0 else "",
        "build_info": "localspec", "is_sleeping": False,
        "localspec": {"target": sess.selection.target, "draft": sess.selection.draft,
                      "fim": bool(m.fim_tokens()), "spec": sess.gen.spec, "drafter": sess.gen.drafter,
                      "add_bos": bool(m.add_bos), "bos_id": m.bos,
                      "profile": facts["profile"], "measurement": facts["measurement"], "rollback": facts["rollback"],
                      "isolated": bool(getattr(srv, "isolated", False)), "pid": facts["pid"],
                      "load": {"ctx_size": sess.load.n_ctx, "threads": sess.load.n_threads,
                               "n_gpu_layers": sess.load.n_gpu_layers_target, "mmap": sess.load.mmap,
                               "flash_attn": sess.load.flash_attn, "flash_attn_in_use": facts["flash_attn_in_use"],
                               "exact": sess.load.exact, "rpc_servers": sess.load.rpc_servers}},
    })


async def tokenize(request: Request, state: ServerState) -> Response:
    body = await read_json(request)
    content = string(body, "content", "")
    add_special, parse_special = boolean(body, "add_special"), boolean(body, "parse_special", True)
    with_pieces, m = boolean(body, "with_pieces"), state.worker.model

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


async def apply_template(request: Request, state: ServerState) -> Response:
    """llama-server's /apply-template: a conversation as the prompt text a chat request would evaluate."""
    body = await read_json(request)
    turns, tools = conversation(state, chat_messages(body)), tool_request(body)
    try:
        text = await asyncio.to_thread(state.worker.engine.chat_text, turns, tools.tools if tools else None)
    except LocalspecError as e:  # a template that refuses the conversation
        raise ApiError(400, str(e))
    return JSONResponse({"prompt": text})


async def detokenize(request: Request, state: ServerState) -> Response:
    body = await read_json(request)
    tokens = body.get("tokens", [])
    m = state.worker.model
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ApiError(400, '"tokens" must be a list of token ids')
    if any(t < 0 or t >= m.n_vocab for t in tokens):
        raise ApiError(400, f'"tokens" has an id outside the vocabulary (0..{m.n_vocab - 1})')
    text = await asyncio.to_thread(lambda: b"".join(m.piece(t) for t in tokens).decode("utf-8", errors="replace"))
    return JSONResponse({"content": text})


async def metrics(request: Request, state: ServerState) -> Response:
    """llama-server's counters; with several models, each loaded model's with a `model` label."""
    router = state.router
    if router.single:
        require_serving(state)
    groups = []
    for slot, s in router.loaded_states():
        samples = await asyncio.to_thread(s.worker.metric_samples)
        groups.append(("" if router.single else f'model="{slot.entry.name}"', samples))
    groups.append(("", router.samples()))
    return PlainTextResponse(prometheus_text(groups), media_type="text/plain; version=0.0.4")


ROUTES = [
    ("/health", health, ["GET"], {"needs_model": False}), ("/v1/health", health, ["GET"], {"needs_model": False}),
    ("/completion", completion, ["POST"]), ("/completions", completion, ["POST"]),
    ("/infill", infill, ["POST"]), ("/props", props, ["GET"]),
    ("/tokenize", tokenize, ["POST"]), ("/detokenize", detokenize, ["POST"]),
    ("/apply-template", apply_template, ["POST"]),
    ("/metrics", metrics, ["GET"], {"needs_model": False}),
]
