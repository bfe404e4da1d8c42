"""Errors a server answers: `ApiError` (an error in the protocol's own shape, chosen by http.error_response),
`api_error`, the one mapping from the project's errors to statuses, and the context check every protocol
runs before queueing."""

from __future__ import annotations

from typing import Any

from ..errors import ContextFullError, InternalError, LocalspecError, Unavailable


class ApiError(LocalspecError):
    """An error answered in the OpenAI shape {"error": {"code", "message", "type"}} (llama-server's types).
    A user error like the others, so one raised by a request's own code on the worker thread (its prompt
    built there) comes back as it is."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}

    def __init__(self, status: int, message: str, type_: str | None = None, **extra: Any):
        super().__init__(message)
        self.status, self.message = status, message
        self.type = type_ or self.TYPES.get(status, "server_error")
        self.extra = extra

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}}


def api_error(e: BaseException) -> ApiError:
    """The status and body for an error the serving layer reports (the one place its errors meet HTTP):
    a prompt over the context is llama-server's 400, a server that cannot take work now a 503, a failure
    the request did not cause a 500, any other user error a 400 that says what to do."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, ContextFullError) and e.n_ctx is not None:
        return ApiError(400, f"request ({e.n_prompt} tokens) exceeds the available context size "
                             f"({e.n_ctx} tokens), try increasing it",
                        "exceed_context_size_error", n_prompt_tokens=e.n_prompt, n_ctx=e.n_ctx)
    if isinstance(e, Unavailable):
        return ApiError(503, str(e))
    if isinstance(e, InternalError):
        return ApiError(500, str(e))
    return ApiError(400, str(e))


def check_prompt_fits(engine, prompt: list[int]) -> None:
    """The prompt is not empty and leaves room in the context: else the 400 llama-server answers."""
    try:
        engine.check_prompt(prompt)
    except LocalspecError as e:
        raise api_error(e) from None
