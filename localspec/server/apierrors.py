"""Errors a server answers and the lines it logs: `ApiError` (an error in the protocol's own shape, chosen by
http.error_response), the context check every protocol runs before queueing, and the server's stderr notes."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

from ..errors import ContextFullError, LocalspecError


class ApiError(Exception):
    """An error answered in the OpenAI shape {"error": {"code", "message", "type"}} (llama-server's types)."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}

    def __init__(self, status: int, message: str, type_: str | None = None, **extra: Any):
        super().__init__(message)
        self.status, self.message = status, message
        self.type = type_ or self.TYPES.get(status, "server_error")
        self.extra = extra

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}}


def check_prompt_fits(engine, prompt: list[int]) -> None:
    """The prompt is not empty and leaves room in the context: else the 400 llama-server answers."""
    try:
        engine.check_prompt(prompt)
    except ContextFullError:
        raise ApiError(400, f"request ({len(prompt)} tokens) exceeds the available context size "
                            f"({engine.target.n_ctx} tokens), try increasing it",
                       "exceed_context_size_error", n_prompt_tokens=len(prompt), n_ctx=engine.target.n_ctx) from None
    except LocalspecError as e:
        raise ApiError(400, str(e)) from None


def log_unexpected(where: str, e: BaseException) -> None:
    """One line on the server's stderr for a failure nobody anticipated (the traceback only with
    LOCALSPEC_DEBUG=1): the client gets an error JSON, the log stays readable."""
    if os.environ.get("LOCALSPEC_DEBUG"):
        traceback.print_exception(e)
    sys.stderr.write(f"localspec serve: unexpected error in {where}: {type(e).__name__}: {e} "
                     "(LOCALSPEC_DEBUG=1 shows the traceback)\n")
    sys.stderr.flush()


_NOTED: set[str] = set()


def log_note(message: str) -> None:
    """A line on the server's stderr about a request the server served differently than asked, once
    per distinct message (an agent sends the same tools on every turn)."""
    if message not in _NOTED:
        _NOTED.add(message)
        sys.stderr.write(f"localspec serve: {message}\n")
        sys.stderr.flush()
