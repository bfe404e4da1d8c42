"""The conversation the chat app holds: `Conversation` (its turns as the model sees them, the system prompt, its
id in the history store, whether older turns slid out of view), shared by the app, the slash commands and
resuming a saved one.

A conversation that outgrows the context drops its oldest turns from the model's view, never the system prompt
and never the message being answered; the history keeps every turn. The new prompt then differs from the
cached one from the first dropped turn on, so it is evaluated again from there: shifting the cached K/V of the
kept turns instead (llama.cpp's context shift) would leave them computed against text the model no longer
sees, and the output would no longer be what the target gives for this prompt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..chat_format import Message
from ..history import HistoryStore


def reply_reserve(n_ctx: int, max_tokens: int) -> int:
    """Room kept free for the reply: its token limit, but at most a quarter of the context."""
    return max(1, min(max_tokens, n_ctx // 4))


def turns_to_drop(prompt_len: Callable[[list], int], system: list, turns: list, n_ctx: int, reserve: int) -> int:
    """How many of the oldest turns to leave out so system + the rest + the reply fit. Turns leave
    in user/assistant pairs; the last turn (the new message) always stays."""
    drop = 0
    while drop < len(turns) - 1 and prompt_len(system + turns[drop:]) + reserve > n_ctx:
        drop += 2 if drop + 2 < len(turns) else 1
    return drop


@dataclass
class Conversation:
    store: HistoryStore | None  # None when the history could not be opened: the chat goes on unsaved
    system: str | None = None
    turns: list[Message] = field(default_factory=list)  # user/assistant, as the model sees them
    id: int | None = None  # in the store, once its first message is saved
    sliding: bool = False  # the conversation has outgrown the context (old turns are left out)

    def messages(self) -> list[Message]:
        """What the model is asked: the system prompt, then the turns in view."""
        return ([Message("system", self.system)] if self.system else []) + list(self.turns)

    def start_new(self, system: str | None) -> None:
        self.turns, self.sliding, self.id, self.system = [], False, None, system

    def set_system(self, text: str | None) -> None:
        self.system = text
        if self.id is not None and self.store is not None:
            self.store.update_conversation(self.id, system=text)

    def save_settings(self, settings: dict) -> None:
        if self.id is not None and self.store is not None:
            self.store.update_conversation(self.id, settings=settings)

    def saved_id(self, sel, settings: dict) -> int:
        """Its id in the store, the conversation created there with its first message."""
        if self.id is None:
            self.id = self.store.new_conversation(
                pair=sel.name if sel else None, target=sel.target if sel else None,
                draft=sel.draft if sel else None, system=self.system, settings=settings)
        return self.id

    def fit(self, prompt_len: Callable[[list], int], n_ctx: int, max_tokens: int) -> bool:
        """Slide the oldest turns out of view when the next reply would not fit; True the first time."""
        system = [Message("system", self.system)] if self.system else []
        drop = turns_to_drop(prompt_len, system, self.turns, n_ctx, reply_reserve(n_ctx, max_tokens))
        if not drop:
            return False
        self.turns = self.turns[drop:]
        first, self.sliding = not self.sliding, True
        return first

    def resume(self, cid: int, system: str | None):
        """A saved conversation continued: its id, its system prompt (`system`, --system, over the saved one)
        and its turns; returns what the store holds, for the views."""
        conv = self.store.get(cid)
        self.turns, self.sliding, self.id = [], False, conv.id
        self.system = system or conv.system
        if self.system != conv.system:
            self.store.update_conversation(conv.id, system=self.system)
        for m in conv.messages:
            if m.role == "user" or (m.role == "assistant" and (m.content or not (m.error or not m.complete))):
                self.turns.append(Message(m.role, m.content))
        return conv
