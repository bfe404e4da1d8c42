"""What the chat app is doing: one value at a time, shown first in the status bar."""

from __future__ import annotations

from enum import Enum


class State(Enum):
    LOADING = "loading"
    READY = "ready"
    NO_MODEL = "no model"
    MEASURING = "measuring pass costs on this machine for --spec auto (once)…"
    GENERATING = "generating"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    CONTEXT_FULL = "context full"
    REPLY_FAILED = "reply failed"

    def __str__(self) -> str:
        return self.value


STATE_AFTER_STOP = {"cancelled": State.CANCELLED, "context": State.CONTEXT_FULL}
