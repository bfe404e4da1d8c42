"""llama-server's router endpoints: POST /models/load and /models/unload (`{"model": NAME}` ->
`{"success": true}`); the list with each model's status is GET /models (`openai_api.models`). An unload
asked while the model has requests running or waiting happens when they end."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..apierrors import ApiError
from ..http import read_json
from ..state import ServerState


async def _slot(request: Request, state: ServerState):
    body = await read_json(request)
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise ApiError(400, '"model" must be a model name (GET /models lists them)')
    if state.router.single:
        raise ApiError(400, "this server runs one model, chosen when it started; start `localspec serve` without a "
                            "pair to load models by name")
    return state.router.find(name)


async def load(request: Request, state: ServerState) -> Response:
    slot = await _slot(request, state)
    await state.router.ensure_loaded(slot)
    return JSONResponse({"success": True})


async def unload(request: Request, state: ServerState) -> Response:
    slot = await _slot(request, state)
    if slot.status != "loaded":
        raise ApiError(400, f"model '{slot.entry.name}' is not loaded")
    if slot.busy:
        slot.unload_when_idle = True  # the expiry loop unloads it once its requests end
    else:
        await state.router.unload(slot, why="asked")
    return JSONResponse({"success": True})


ROUTES = [
    ("/models/load", load, ["POST"], {"needs_model": False}),
    ("/models/unload", unload, ["POST"], {"needs_model": False}),
]
