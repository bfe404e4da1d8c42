"""A pass llama.cpp may give up: between graph nodes it asks its abort callback, which puts the caller's question
(a background pass giving way to a request), at most every POLL_S."""

from __future__ import annotations

import time
from typing import Callable


class PassAbort:
    POLL_S = 0.005  # a request waits about this long at most for a background pass to end

    def __init__(self, L, ctx_ptr):
        self.L, self.ptr = L, ctx_ptr
        self._ask: Callable[[], bool] | None = None
        self._next = 0.0
        self._cb = L.ggml_abort_callback(self._should_abort)  # kept alive as long as the context
        self._none = L.ggml_abort_callback()  # NULL: llama.cpp asks nothing

    def decode(self, batch, ask: Callable[[], bool] | None) -> int:
        """llama_decode, given up (code 2) once `ask()` says so; set only around passes that may give way."""
        if ask is None:
            return self.L.llama_decode(self.ptr, batch)
        self._ask, self._next = ask, 0.0
        self.L.llama_set_abort_callback(self.ptr, self._cb, None)
        try:
            return self.L.llama_decode(self.ptr, batch)
        finally:
            self.L.llama_set_abort_callback(self.ptr, self._none, None)
            self._ask = None

    def _should_abort(self, _data) -> bool:
        now = time.perf_counter()
        if now < self._next:
            return False
        self._next = now + self.POLL_S
        try:
            return bool(self._ask is not None and self._ask())
        except Exception:  # an exception cannot cross into llama.cpp: go on with the pass
            return False
