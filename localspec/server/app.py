"""The HTTP server: each protocol's routes (its own module), behind the guard, on Starlette (run by uvicorn).

Why Starlette + uvicorn: a single-user local server needs SSE streaming, disconnect detection (to
cancel a generation within one round) and a small import; both are plain ASGI with no framework
on top, start in ~0.2 s, and keep request validation in our hands, so unknown fields are ignored
rather than rejected (FastAPI's models would answer 422). Generation runs in the `ModelWorker`
worker thread; handlers only translate, queue and stream.

Protocols (each a module with ROUTES and, where it differs from OpenAI's, ERRORS):
llama-server's native endpoints (`llama_api`), OpenAI Chat Completions (`openai_api`), Anthropic
Messages (`anthropic_api`), OpenAI Responses (`responses_api`) and Ollama's API (`ollama_api`, its model
list, pull and delete in `ollama_models`), llama-server's router's load and unload (`models_api`); beside
them the chat page (`webui`: `/`, which answers other clients as Ollama does) and its conversations
(`conversations_api`).
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .apierrors import ApiError
from .guard import Guard, GuardRules
from .http import endpoint, error_response, openai_error
from .page import conversations_api, webui
from .protocols import anthropic_api, llama_api, models_api, ollama_api, ollama_models, openai_api, responses_api
from .router import placeholder_router
from .state import ServerState

PROTOCOLS = (llama_api, openai_api, anthropic_api, responses_api, ollama_api, ollama_models, models_api)
PAGE = (webui, conversations_api)  # the chat page and the conversations it keeps on the server

__all__ = ["ServerState", "create_app"]


async def not_found(request: Request, exc) -> Response:
    """404 and 405 in the error shape of the protocol whose paths the request's path is nearest."""
    status, path = getattr(exc, "status_code", 404), request.url.path
    shape = errors_for(path)
    if status == 405:
        return error_response(ApiError(405, f"{request.method} is not allowed on {path}", "invalid_request_error"), shape)
    return error_response(ApiError(404, f"no endpoint {path}; see GET /props and docs/SERVE.md",
                                   "not_found_error"), shape)


def errors_for(path: str):
    """The error shape of the protocol with a route sharing the most leading path segments with `path`
    (`/api/nope` is Ollama's, `/v1/messages` Anthropic's); OpenAI's where none shares more than `/v1`."""
    def shared(route: str) -> int:  # `v1` alone says nothing: every OpenAI-style protocol starts with it
        a, b = route.strip("/").split("/"), path.strip("/").split("/")
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return n - (a[0] == "v1" and n > 0)
    best, shape = 0, openai_error
    for module in PROTOCOLS:
        n = max(shared(r[0]) for r in module.ROUTES)
        if n > best:
            best, shape = n, getattr(module, "ERRORS", openai_error)
    return shape


def routes() -> list[Route]:
    out = []
    for module in (*PROTOCOLS, *PAGE):
        errors = getattr(module, "ERRORS", openai_error)
        for path, handler, methods, *opts in module.ROUTES:
            needs_model = (opts[0] if opts else {}).get("needs_model", True)
            out.append(Route(path, endpoint(handler, needs_model, errors), methods=methods))
    return out


def create_app(state: ServerState, lifespan=None, rules: GuardRules | None = None) -> Starlette:
    if state.router is None:  # a state made by hand (tests of the page): one model, loading until set
        state.router = placeholder_router(state)
    app = Starlette(routes=routes(), exception_handlers={404: not_found, 405: not_found}, lifespan=lifespan,
                    middleware=[Middleware(Guard, rules=rules or GuardRules(api_key=state.api_key))])
    app.state.localspec = state
    return app
