"""User-facing errors: every one carries a one-line message that says what to do next.

The CLI catches `LocalspecError`, prints `error: <message>` to stderr and exits non-zero;
nothing else in the package prints.
"""


class LocalspecError(Exception):
    exit_code = 1


class ModelLoadError(LocalspecError):
    pass


class IncompatiblePairError(LocalspecError):
    pass


class ContextFullError(LocalspecError):
    pass


class ConfigError(LocalspecError):
    exit_code = 2


class PassInterrupted(LocalspecError):
    """A background pass (the server's idle measurement) stopped inside llama_decode because a request
    came: caught by the background work it ends, never shown to a user."""
