"""User-facing errors: every one carries a one-line message that says what to do next.

The CLI catches `LocalspecError`, prints `error: <message>` to stderr and exits non-zero;
nothing else in the package prints.
"""

from __future__ import annotations


class LocalspecError(Exception):
    exit_code = 1


class ModelLoadError(LocalspecError):
    pass


class IncompatiblePairError(LocalspecError):
    pass


class ContextFullError(LocalspecError):
    """No room in the context; a prompt too long for it carries its size and the context's (a server's
    error names both, as llama-server's)."""

    def __init__(self, message: str, n_prompt: int | None = None, n_ctx: int | None = None):
        super().__init__(message)
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


class ConfigError(LocalspecError):
    exit_code = 2


class Unavailable(LocalspecError):
    """A server cannot take a request now (shutting down, its queue full): the client may try again."""


class InternalError(LocalspecError):
    """Something failed that the request did not cause; the server's log says what."""


class PassInterrupted(LocalspecError):
    """A background pass (the server's idle measurement) stopped inside llama_decode because a request
    came: caught by the background work it ends, never shown to a user."""
