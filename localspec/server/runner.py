"""Start the server: bind first (a taken port is one clear line), answer /health with 503 while the
pair loads in a thread, then serve until Ctrl-C, which cancels what runs and closes the models."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, LocalspecError
from ..fim.windows import EditorSettings
from ..models.catalog import CatalogEntry
from ..serving.isolated import IsolatedWorker, rpc_servers_of
from ..serving.worker import ModelWorker, open_served
from ..session import GenChoice, ModelChoice, Session
from . import DEFAULT_PORT  # noqa: F401  (re-exported for the CLI)
from .app import ServerState, create_app
from .guard import GuardRules, is_loopback_name
from .router import Budget, Limits, LoadRecipe, Router, Slot, begin_shutdown_all


def is_loopback(host: str) -> bool:
    return is_loopback_name(host.strip("[]").lower())


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror or e}); pass --port N, or stop the "
                          "program using it") from None
    return sock


def model_names(session: Session) -> tuple[str, set[str]]:
    sel = session.selection
    target = Path(sel.target)
    model_id = sel.name if sel.spec is not None else target.stem
    return model_id, {model_id, target.name, target.stem, "localspec", sel.name}


def load_into(state: ServerState, models: ModelChoice, gen: GenChoice, notify: Callable[[str], None],
              editor: EditorSettings | None = None, log_requests: bool = False, isolate: bool = False) -> bool:
    """The model loaded into `state`: in this process, or (isolated, and always for a target split over RPC
    hosts, whose loss llama.cpp answers by aborting the process) in a child process the server outlives."""
    try:
        if isolate or rpc_servers_of(models):
            worker = IsolatedWorker(models, gen, notify, editor, log_requests)
            session = worker.session
        else:
            session = open_served(models, gen, notify)
            worker = None
    except LocalspecError as e:
        state.load_error = str(e)
        return False
    for text in session.notes:
        notify(f"note: {text}")
    state.model_id, state.aliases = model_names(session)
    state.worker = worker or ModelWorker(session, editor, log_requests)
    return True


@dataclass
class ServeOptions:
    """What `localspec serve` was asked for beyond the models and the generation defaults."""
    host: str = "127.0.0.1"
    port: int = 8012
    api_key: str | None = None
    log_requests: bool = False
    cors: list[str] = field(default_factory=list)
    editor: EditorSettings | None = None
    webui: bool = True
    catalog: list[CatalogEntry] | None = None  # serve these models (None: the one pair chosen)
    models_dir: Path | None = None  # where the catalog came from when not the data root's models folder
    limits: Limits = field(default_factory=Limits)
    budget: Budget = field(default_factory=Budget)
    isolate: bool = False  # every model in its own process (a split one always: serving/isolated.py)


def bind_checked(host: str, port: int, api_key: str | None) -> socket.socket:
    if not is_loopback(host) and not api_key:
        raise ConfigError(f"--host {host} would let other machines use the models; add --api-key KEY (or bind "
                          "to 127.0.0.1)")
    return bind(host, port)


def make_router(state: ServerState, models: ModelChoice, gen: GenChoice, notify: Callable[[str], None],
                opts: ServeOptions) -> Router:
    def load(st: ServerState, choice: ModelChoice, g: GenChoice) -> bool:
        return load_into(st, choice, g, notify, opts.editor, opts.log_requests, opts.isolate)
    entries = opts.catalog or [CatalogEntry(models.pair or Path(models.target or "localspec").stem, pair=models.pair)]
    slots = [Slot(e) for e in entries]
    return Router(slots, LoadRecipe(models, gen, load, notify), state, opts.limits, opts.budget, opts.catalog,
                  opts.models_dir)


def serve(models: ModelChoice, gen: GenChoice, notify: Callable[[str], None], on_listen: Callable[[str], None],
          opts: ServeOptions) -> int:
    import uvicorn

    host = opts.host
    sock = bind_checked(host, opts.port, opts.api_key)
    state = ServerState(api_key=opts.api_key, webui=opts.webui)
    router = state.router = make_router(state, models, gen, notify, opts)
    failed = threading.Event()

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # a signal handler: hand the work to threads, take no locks here
            begin_shutdown_all(router)
            super().handle_exit(sig, frame)

    def loaded(task) -> None:
        if not task.cancelled() and task.exception() is not None:
            notify(f"error: {task.exception()}")
        if router.single and router.default.status != "loaded":
            failed.set()
            server.should_exit = True

    @contextlib.asynccontextmanager
    async def lifespan(app):
        router.start()
        if opts.catalog:
            notify(f"serving {len(router.slots)} models: " + ", ".join(s.entry.name for s in router.slots))
        first = asyncio.ensure_future(router.ensure_loaded(router.default))
        first.add_done_callback(loaded)
        yield
        await router.stop()
        if state.history is not None:
            state.history.close()
        freed.append(router.close_all())

    freed: list[bool] = []
    rules = GuardRules(api_key=opts.api_key, bind_host=host, cors=list(opts.cors or []))
    # streams end at the first signal (begin_shutdown), so a second of grace is plenty
    config = uvicorn.Config(create_app(state, lifespan, rules), log_level="info" if opts.log_requests else "warning",
                            access_log=opts.log_requests, timeout_graceful_shutdown=1, lifespan="on")
    server = Server(config)
    shown = f"[{host}]" if ":" in host else host
    on_listen(f"http://{shown}:{sock.getsockname()[1]}")
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its clean shutdown: that is a normal stop
        pass
    finally:
        sock.close()
    if failed.is_set():
        raise LocalspecError(router.default.error or state.load_error or "the models did not load")
    if (freed and not all(freed)) or any(s.status == "loading" for s in router.slots):
        # a generation thread is inside a llama.cpp pass that cannot be interrupted (a long prompt), or a
        # model is still loading: exiting the interpreter under it can crash in llama.cpp's teardown, so
        # leave at once, cleanly
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
