"""Where one generation runs (`Lane`): a server has one per --parallel request, the CLI and the chat app one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .decoding.ngram import NgramDrafter
from .stats import Stats


@dataclass
class Lane:
    """Where one generation runs: the target's cache (the Context, or one sequence of a shared one),
    the draft model's (made on first use), an n-gram drafter over this lane's text, the last run's stats.
    One lane per generation at a time: a server has one per --parallel request."""
    target: object
    draft_source: Callable[[], object]
    ngram: NgramDrafter
    seq: int = 0
    last_stats: Stats | None = None
    last_used: float = 0.0
    _draft: object = None

    def draft(self):
        if self._draft is None:
            self._draft = self.draft_source()
        return self._draft

    def draft_decode_s(self) -> float:
        return self._draft.decode_s if self._draft is not None else 0.0
