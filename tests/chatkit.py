"""What the chat app's Pilot tests share: waiting on a condition, sending a message, reading notices and the status line."""

from __future__ import annotations

import time

from localspec.chat.app import ChatApp
from localspec.chat.widgets import (
    AssistantMessage,
    Notice,
    PromptInput,
)

SIZE = (100, 30)


# One llama.cpp thread: the tiny models gain nothing from more, and on a shared 2-core machine two
# spinning threads make a 2-layer model up to 100x slower whenever another process holds a core.
TIMEOUT_S = 30.0  # generous: the machine may be shared; a passing run takes a fraction of this


async def wait_until(pilot, condition, what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            shown = "\n".join(notices(pilot.app)[-3:])
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last notices:\n{shown}")
        await pilot.pause(0.05)


async def send(pilot, app: ChatApp, text: str) -> AssistantMessage:
    """Type `text`, press Enter, wait for the whole reply; return its view."""
    n = app.replies
    box = app.query_one(PromptInput)
    box.focus()
    box.load_text(text)
    await pilot.press("enter")
    await wait_until(pilot, lambda: app.replies > n, "the reply")
    return list(app.query(AssistantMessage))[-1]


def notices(app: ChatApp, kind: str | None = None) -> list[str]:
    return [str(n.content) for n in app.query(Notice) if kind is None or n.has_class(kind)]


def status_text(app: ChatApp) -> str:
    return str(app.query_one("#status").content)
