"""Messages the worker threads post to the UI (Textual's thread-safe way to talk to it)."""

from __future__ import annotations

from textual.message import Message as UIMessage

from .status import Live


class LoadStep(UIMessage):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class Loaded(UIMessage):
    def __init__(self, session, seconds: float) -> None:
        super().__init__()
        self.session, self.seconds = session, seconds


class LoadFailed(UIMessage):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class ReplyDelta(UIMessage):
    def __init__(self, view, pieces: list[tuple[str, str]], live: Live | None) -> None:
        super().__init__()
        self.view, self.pieces, self.live = view, pieces, live


class ReplyNote(UIMessage):
    """The reply is waiting on something slow (measuring pass costs)."""


class ReplyDone(UIMessage):
    def __init__(self, turn: "Turn", text: str, stats, live: Live | None, error: str | None) -> None:
        super().__init__()
        self.turn, self.text, self.stats, self.live, self.error = turn, text, stats, live, error


class Turn:
    """One exchange in flight: the prompt, its rows in the history, the reply's view."""

    def __init__(self, prompt: str, view, user_id: int | None, reply_id: int | None):
        self.prompt, self.view, self.user_id, self.reply_id = prompt, view, user_id, reply_id
