"""Ollama's model endpoints: /api/tags (every model the server has), /api/ps (the loaded ones, their size
and when they unload), /api/pull (`localspec pull` with Ollama's NDJSON progress) and /api/delete (the
files `localspec pull` fetched). With one model served, its names are listed, as before."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import time
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...errors import LocalspecError
from ...models.gguf_header import read_header_file
from ..apierrors import ApiError
from ..http import read_json, require_serving
from ..settings import boolean
from ..state import ServerState

FOREVER = dt.datetime(2318, 1, 1, tzinfo=dt.timezone.utc)  # Ollama's "loaded until stopped"


def errors(e: ApiError) -> dict:
    return {"error": e.message}


ERRORS = errors


def _iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def details(path: Path | None, meta=None) -> dict:
    """Ollama's `details` from a loaded model's metadata (`meta(key)`) or else the GGUF header."""
    if meta is None and path is not None:
        try:
            header = read_header_file(path)
            meta = header.get
        except (LocalspecError, OSError):
            meta = None
    meta = meta or (lambda key: None)
    arch = meta("general.architecture") or ""
    quant = path.stem.rsplit("-", 1)[-1].upper() if path else ""  # "...-q4_k_m.gguf" -> "Q4_K_M", as Ollama names it
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": meta("general.size_label") or "", "quantization_level": quant}


def entry(name: str, path: Path | None, size: int, meta=None) -> dict:
    exists = path is not None and path.exists()
    mtime = dt.datetime.fromtimestamp(path.stat().st_mtime if exists else 0, dt.timezone.utc)
    return {"name": name, "model": name, "modified_at": _iso(mtime), "size": size,
            "digest": hashlib.sha256(str(path or name).encode()).hexdigest(), "details": details(path, meta)}


def loaded_entry(state: ServerState, name: str) -> dict:
    m = state.worker.model
    return entry(name, m.path, m.path.stat().st_size if m.path.exists() else 0, m.meta)


async def tags(request: Request, state: ServerState) -> Response:
    router = state.router
    if router.single:
        require_serving(state)
        names = [state.model_id, *sorted(state.aliases - {state.model_id})]
        return JSONResponse({"models": [loaded_entry(state, n) for n in names]})
    out = []
    for slot in router.slots:
        s = slot.state if slot.status == "loaded" else None
        out.append(loaded_entry(s, slot.entry.name) if s is not None and s.worker is not None
                   else entry(slot.entry.name, (slot.entry.files or [None])[0], slot.entry.size))
    return JSONResponse({"models": out})


async def ps(request: Request, state: ServerState) -> Response:
    router, now = state.router, time.monotonic()
    if router.single:
        require_serving(state)
    out = []
    for slot, s in router.loaded_states():
        until = FOREVER if router.single or slot.expires_at is None else (
            dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=max(0.0, slot.expires_at - now)))
        e = loaded_entry(s, s.model_id)
        out.append({**e, "size": max(e["size"], slot.estimate), "expires_at": _iso(until), "size_vram": 0,
                    "context_length": s.worker.engine.target.n_ctx})
    return JSONResponse({"models": out})


async def pull(request: Request, state: ServerState) -> Response:
    """`localspec pull NAME`: a pair from models.yaml, its files from the bundle or the Hugging Face hub."""
    from ...models.manage import pull_pair
    from ...models.registry import get_pair

    body = await read_json(request)
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, '"model" must name a pair (`localspec models` lists them)')
    try:
        get_pair(name.removesuffix(":latest"))
    except LocalspecError as e:
        raise ApiError(404, f"{e}; `localspec models` lists the pairs `localspec pull` fetches")
    loop, events = asyncio.get_running_loop(), asyncio.Queue()

    def note(text: str) -> None:
        loop.call_soon_threadsafe(events.put_nowait, {"status": text.strip()})

    def work() -> None:
        try:
            pull_pair(name.removesuffix(":latest"), note)
            state.router.rescan()
            loop.call_soon_threadsafe(events.put_nowait, {"status": "success"})
        except LocalspecError as e:
            loop.call_soon_threadsafe(events.put_nowait, {"error": f"pull {name}: {e}"})
        except Exception as e:  # a network library's own error: one line, never a traceback
            loop.call_soon_threadsafe(events.put_nowait, {"error": f"pull {name}: {type(e).__name__}: {e}"})

    task = asyncio.ensure_future(asyncio.to_thread(work))
    if not boolean(body, "stream", True):
        await task
        last = {}
        while not events.empty():
            last = events.get_nowait()
        return JSONResponse(last, status_code=500 if "error" in last else 200)

    async def lines():
        while True:
            ev = await events.get()
            yield json.dumps(ev) + "\n"
            if "error" in ev or ev.get("status") == "success":
                return
    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def delete(request: Request, state: ServerState) -> Response:
    """The files `localspec pull` fetched for a pair (never a file the user put somewhere), unloaded first."""
    from ...models.manage import remove_pair

    body = await read_json(request)
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, '"model" must name a model GET /api/tags lists')
    if state.router.single and name.removesuffix(":latest") in {state.model_id, *state.aliases}:
        raise ApiError(409, f"{name} is the model this server runs; stop the server, then `localspec rm {name}`")
    slot = state.router.find(name) if not state.router.single else None
    pair = slot.entry.pair if slot is not None else name.removesuffix(":latest")
    if slot is not None and slot.entry.pair is None:
        raise ApiError(400, f"{slot.entry.name} was not fetched by `localspec pull`; delete {slot.entry.target} "
                            "yourself")
    if slot is not None:
        await state.router.unload(slot, why="deleted")
    try:
        removed = await asyncio.to_thread(remove_pair, pair)
    except LocalspecError as e:
        raise ApiError(404, str(e))
    if not removed:
        raise ApiError(404, f"model '{name}' has no files fetched by `localspec pull`")
    state.router.rescan()
    return Response(status_code=200)


ROUTES = [
    ("/api/tags", tags, ["GET", "HEAD"], {"needs_model": False}), ("/api/ps", ps, ["GET"], {"needs_model": False}),
    ("/api/pull", pull, ["POST"], {"needs_model": False}), ("/api/delete", delete, ["DELETE"], {"needs_model": False}),
]
