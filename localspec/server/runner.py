"""Start the server: bind first (a taken port is one clear line), answer /health with 503 while the
pair loads in a thread, then serve until Ctrl-C, which cancels what runs and closes the models."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, LocalspecError
from ..session import GenChoice, ModelChoice, Session
from . import DEFAULT_PORT  # noqa: F401  (re-exported for the CLI)
from .app import ServerState, create_app
from .worker import ServerSession

UNLIMITED_TOKENS = 1 << 30  # like llama-server's n_predict -1: until EOS, a stop, or the context is full


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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


def load_into(state: ServerState, models: ModelChoice, gen: GenChoice, notify: Callable[[str], None]) -> bool:
    try:
        session = Session.open(models, gen, notify)
        if session.gen.max_tokens < 0:
            session.gen.max_tokens = UNLIMITED_TOKENS
        session.ensure_profile(notify)  # auto's pass costs now, not on the first request
    except LocalspecError as e:
        state.load_error = str(e)
        return False
    for text in session.notes:
        notify(f"note: {text}")
    state.model_id, state.aliases = model_names(session)
    state.server = ServerSession(session)
    return True


def serve(models: ModelChoice, gen: GenChoice, host: str, port: int, api_key: str | None,
          notify: Callable[[str], None], on_listen: Callable[[str], None], log_requests: bool = False) -> int:
    import uvicorn

    if not is_loopback(host) and not api_key:
        raise ConfigError(f"--host {host} would let other machines use the models; add --api-key KEY (or bind "
                          "to 127.0.0.1)")
    sock = bind(host, port)
    state = ServerState(api_key=api_key)
    failed = threading.Event()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        def load():
            if load_into(state, models, gen, notify):
                notify(f"ready: {state.model_id} ({state.server.session.selection.describe()})")
            else:
                failed.set()
                server.should_exit = True
        threading.Thread(target=load, name="localspec-load", daemon=True).start()
        yield
        if state.server is not None:
            state.server.close()

    config = uvicorn.Config(create_app(state, lifespan), log_level="info" if log_requests else "warning",
                            access_log=log_requests, timeout_graceful_shutdown=3, lifespan="on")
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    on_listen(f"http://{shown}:{sock.getsockname()[1]}")
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its clean shutdown: that is a normal stop
        pass
    finally:
        sock.close()
    if failed.is_set():
        raise LocalspecError(state.load_error or "the models did not load")
    return 0
