"""The chat page at `/` (as llama-server serves its own there) and its files under `/webui/`.

A browser (a request whose Accept names text/html) gets the page; every other client gets Ollama's
liveness answer, which Ollama's clients probe. The page is static files in `static/`: its own
script and styles plus pinned builds of marked, DOMPurify and highlight.js that
`scripts/webui-vendor` fetches from the npm registry (`static/vendor/MANIFEST`). Nothing is loaded
from elsewhere, so it works offline and under a Content-Security-Policy without inline script.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

from ..apierrors import ApiError
from ..protocols import ollama_api
from ..state import ServerState

STATIC = Path(__file__).parent / "static"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".svg": "image/svg+xml", ".txt": "text/plain; charset=utf-8"}
# the page talks to this server only; model output cannot run script, load images or post forms anywhere
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
           "cache-control": "no-cache"}
_files: dict[str, tuple[bytes, bytes, str]] = {}  # name -> (body, gzipped body, etag)


def wants_page(request: Request, state: ServerState) -> bool:
    return state.webui and "text/html" in request.headers.get("accept", "")


def static_file(name: str) -> tuple[bytes, bytes, str]:
    """A file of the page, read once and kept with its gzip and ETag; 404 for anything outside static/."""
    if name not in _files:
        path = (STATIC / name).resolve()
        if STATIC.resolve() not in path.parents or path.suffix not in TYPES or not path.is_file():
            raise ApiError(404, f"no file {name} in the page", "not_found_error")
        body = path.read_bytes()
        _files[name] = (body, gzip.compress(body, 9, mtime=0), '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
    return _files[name]


def file_response(request: Request, name: str) -> Response:
    body, packed, etag = static_file(name)
    headers = {**HEADERS, "etag": etag, "vary": "Accept, Accept-Encoding"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        body, headers["content-encoding"] = packed, "gzip"
    media = TYPES[Path(name).suffix]
    return Response(body, media_type=media, headers=headers)  # uvicorn sends a HEAD's headers only


async def root(request: Request, state: ServerState) -> Response:
    if wants_page(request, state):
        return file_response(request, "index.html")
    return await ollama_api.root(request, state)


async def asset(request: Request, state: ServerState) -> Response:
    if not state.webui:
        raise ApiError(404, "the page is off (the server was started with --no-webui)", "not_found_error")
    return file_response(request, request.path_params["name"])


ROUTES = [
    ("/", root, ["GET", "HEAD"], {"needs_model": False}),
    ("/webui/{name:path}", asset, ["GET", "HEAD"], {"needs_model": False}),
]
