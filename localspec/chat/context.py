"""A conversation that outgrows the context: the oldest turns leave the model's view, never the system
prompt and never the message being answered. The history database keeps every turn; only what the
model is shown slides. The new prompt then differs from the cached one from the first dropped turn
on, so it is evaluated again from there: shifting the cached K/V of the kept turns instead
(llama.cpp's context shift) would leave them computed against text the model no longer sees, and
the output would no longer be what the target gives for this prompt."""

from __future__ import annotations

from typing import Callable


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
