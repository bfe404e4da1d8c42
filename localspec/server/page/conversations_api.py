"""Conversations kept on the server, in the same SQLite history as `localspec chat` (`history.py`): the
page at `/` lists, searches, opens, renames and deletes them, and writes each message as it is sent
or confirmed, so `localspec history` and the chat app's `/history ID` see what the page started.

llama-server's page keeps its conversations in the browser (IndexedDB); no peer has an API for this,
so the paths are localspec's own (`/localspec/conversations`), in OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...history import HistoryError, HistoryStore, to_json, to_markdown
from ..apierrors import ApiError
from ..http import read_json
from ..settings import boolean, string
from ..state import ServerState

MAX_TITLE = 200
STOP_REASONS = ("eos", "length", "stop", "cancelled", "context", "error", "limit")
_open_lock = threading.Lock()


def store_of(state: ServerState) -> HistoryStore:
    """The history, opened on first use (a server nobody opens the page of never touches it)."""
    with _open_lock:
        if state.history is None:
            try:
                state.history = HistoryStore()
            except HistoryError as e:
                raise ApiError(503, str(e))
        return state.history


async def in_store(state: ServerState, fn, *args, **kw):
    """A store call off the event loop (a stream in flight never waits on SQLite); unknown ids are 404s,
    a store that cannot be read or written (a full disk, a read-only data root) a 503 that says so."""
    store = await asyncio.to_thread(store_of, state)
    try:
        return await asyncio.to_thread(getattr(store, fn), *args, **kw)
    except HistoryError as e:
        raise ApiError(404, str(e), "not_found_error")
    except sqlite3.Error as e:
        raise ApiError(503, f"the conversation history at {store.path} failed ({e}); check that its disk has "
                            "room and LOCALSPEC_HOME is writable")


def _id(request: Request, name: str) -> int:
    raw = request.path_params[name]
    if not raw.isdigit() or len(raw) > 18:
        raise ApiError(404, f"no conversation or message {raw!r}; ids are whole numbers", "not_found_error")
    return int(raw)


def _settings(body: dict) -> dict | None:
    v = body.get("settings")
    if v is not None and not isinstance(v, dict):
        raise ApiError(400, '"settings" must be an object')
    return v


def _title(body: dict) -> str | None:
    t = string(body, "title")
    if t is not None and len(t) > MAX_TITLE:
        raise ApiError(400, f'"title" must be at most {MAX_TITLE} characters')
    return t


async def list_conversations(request: Request, state: ServerState) -> Response:
    q = request.query_params.get("search", "")
    limit = request.query_params.get("limit", "")
    if limit and not limit.isdigit():
        raise ApiError(400, '"limit" must be a whole number')
    convs = await in_store(state, "list_conversations", int(limit) if limit else None, q)
    return JSONResponse({"object": "list", "data": [c.to_dict(with_messages=False) for c in convs]})


async def create(request: Request, state: ServerState) -> Response:
    body = await read_json(request)
    served, name = state, state.model_id
    if string(body, "model") and not state.router.single:  # the page's picker: the model that will answer
        slot = state.router.find(string(body, "model"))
        served, name = slot.state or state.sibling(), slot.entry.name
    sel = served.worker.session.selection if served.worker is not None else None
    cid = await in_store(state, "new_conversation", pair=name, target=sel.target if sel else None,
                         draft=sel.draft if sel else None, system=string(body, "system"),
                         settings=_settings(body), title=_title(body) or "")
    conv = await in_store(state, "get", cid)
    return JSONResponse(conv.to_dict(), status_code=201)


async def get(request: Request, state: ServerState) -> Response:
    conv = await in_store(state, "get", _id(request, "cid"))
    return JSONResponse(conv.to_dict())


async def export(request: Request, state: ServerState) -> Response:
    """A conversation as a file to keep: Markdown (`?format=md`, the default) or JSON, as
    `localspec history export` writes it."""
    fmt = request.query_params.get("format", "md")
    if fmt not in ("md", "json"):
        raise ApiError(400, '"format" must be md or json')
    conv = await in_store(state, "get", _id(request, "cid"))
    body, media = (to_json(conv), "application/json") if fmt == "json" else (to_markdown(conv), "text/markdown")
    name = f"conversation-{conv.id}.{fmt}"
    return Response(body, media_type=f"{media}; charset=utf-8",
                    headers={"content-disposition": f'attachment; filename="{name}"'})


async def update(request: Request, state: ServerState) -> Response:
    cid, body = _id(request, "cid"), await read_json(request)
    await in_store(state, "get", cid)
    change: dict = {"settings": _settings(body), "title": _title(body)}
    if "system" in body:
        change["system"] = string(body, "system")
    await in_store(state, "update_conversation", cid, **change)
    conv = await in_store(state, "get", cid)
    return JSONResponse(conv.to_dict(with_messages=False))


async def delete(request: Request, state: ServerState) -> Response:
    cid = _id(request, "cid")
    await in_store(state, "get", cid)
    await in_store(state, "delete_conversation", cid)
    return JSONResponse({"id": cid, "deleted": True})


async def add_message(request: Request, state: ServerState) -> Response:
    cid, body = _id(request, "cid"), await read_json(request)
    role, content = string(body, "role"), string(body, "content", "")
    if role not in ("user", "assistant"):
        raise ApiError(400, '"role" must be "user" or "assistant"')
    await in_store(state, "get", cid)
    mid = await in_store(state, "add_message", cid, role, content, complete=boolean(body, "complete", True))
    return JSONResponse({"id": mid, "conversation_id": cid, "role": role}, status_code=201)


async def update_message(request: Request, state: ServerState) -> Response:
    """A reply as it streams (content and provenance so far) and once more at its end (complete, why it
    stopped, its figures)."""
    cid, mid, body = _id(request, "cid"), _id(request, "mid"), await read_json(request)
    await _message_of(state, cid, mid)
    stop_reason = string(body, "stop_reason")
    if stop_reason is not None and stop_reason not in STOP_REASONS:
        raise ApiError(400, f'"stop_reason" must be one of {", ".join(STOP_REASONS)}')
    stats, runs = body.get("stats"), body.get("provenance")
    if stats is not None and not isinstance(stats, dict):
        raise ApiError(400, '"stats" must be an object')
    if runs is not None and not (isinstance(runs, list) and all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r) for r in runs)):
        raise ApiError(400, '"provenance" must be a list of [source, text] pairs')
    await in_store(state, "update_message", mid, string(body, "content", ""), complete=boolean(body, "complete"),
                   stop_reason=stop_reason, error=string(body, "error"), stats=stats, provenance=runs)
    return JSONResponse({"id": mid, "conversation_id": cid})


async def delete_messages(request: Request, state: ServerState) -> Response:
    """This message and every later one: an edited prompt resent, a reply regenerated."""
    cid, mid = _id(request, "cid"), _id(request, "mid")
    await _message_of(state, cid, mid)
    n = await in_store(state, "delete_messages_from", cid, mid)
    return JSONResponse({"conversation_id": cid, "deleted": n})


async def _message_of(state: ServerState, cid: int, mid: int) -> None:
    """404 unless message `mid` is conversation `cid`'s (checked on every save of a streaming reply)."""
    if not await in_store(state, "has_message", cid, mid):
        await in_store(state, "get", cid)  # no such conversation: its own 404
        raise ApiError(404, f"conversation {cid} has no message {mid}", "not_found_error")


BASE = "/localspec/conversations"
ROUTES = [
    (BASE, list_conversations, ["GET"], {"needs_model": False}),
    (BASE, create, ["POST"], {"needs_model": False}),
    (BASE + "/{cid}", get, ["GET"], {"needs_model": False}),
    (BASE + "/{cid}", update, ["PATCH"], {"needs_model": False}),
    (BASE + "/{cid}/export", export, ["GET"], {"needs_model": False}),
    (BASE + "/{cid}", delete, ["DELETE"], {"needs_model": False}),
    (BASE + "/{cid}/messages", add_message, ["POST"], {"needs_model": False}),
    (BASE + "/{cid}/messages/{mid}", update_message, ["PATCH"], {"needs_model": False}),
    (BASE + "/{cid}/messages/{mid}", delete_messages, ["DELETE"], {"needs_model": False}),
]
