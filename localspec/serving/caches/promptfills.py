"""Prompts being evaluated right now, per sequence (`PromptFills`): a request whose prompt starts like
another lane's waits for that lane's cache to hold the shared part, then shares its cells."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import NamedTuple

from ...backend import common_prefix


class _Fill(NamedTuple):
    """A prompt some sequence is evaluating now (PromptFills)."""
    tokens: list[int]
    cache: object
    generates: bool  # a token's pass follows the fill (a generation's; a warm-up's prefill has none)


class PromptFills:
    """The prompts being evaluated right now, per sequence. A request whose prompt starts like one of
    them (four requests at once under one system prompt) waits until that one's cache holds the shared
    part, then shares its cells (the prompt cache copies them), instead of evaluating the same tokens
    beside it. A request only ever waits for one registered before it, so no two wait for each other."""

    SHARE_MIN = 256  # shorter shared prefixes are cheaper to evaluate again than to wait for
    POLL_S = 0.01

    def __init__(self):
        self.lock = threading.Lock()
        self.filling: dict[int, _Fill] = {}  # seq -> what it is evaluating

    @contextmanager
    def evaluating(self, seq: int, cache, tokens: list[int], should_stop=None, on_wait=None, generates: bool = True):
        """on_wait(): called once before waiting for another lane (the engine parks this lane's old
        conversation: its cells would sit beside the other's fill, which attends over every cell in use).
        generates: a token's pass follows this fill (a generation's; a warm-up's prefill has none)."""
        with self.lock:
            best, best_n = None, common_prefix(list(cache.tokens), tokens) + self.SHARE_MIN - 1
            for other_seq, fill in self.filling.items():
                n = common_prefix(fill.tokens, tokens)
                if n > best_n:
                    best, best_n = (other_seq, fill), n
            self.filling[seq] = _Fill(tokens, cache, generates)
        try:
            if best is not None:  # it may finish at any moment from here: its cache was taken under the lock
                other_seq, fill = best
                if on_wait is not None:
                    on_wait()
                self._wait(other_seq, fill.cache, tokens, best_n, should_stop)
                if fill.generates:  # a warm-up's fill is never followed by a token: nothing to wait for
                    self._first_token(fill.cache, len(fill.tokens), should_stop)
            yield
        finally:
            with self.lock:
                self.filling.pop(seq, None)


    FIRST_TOKEN_WAIT_S = 2.0  # at most this long for the filler's first token (a cancelled one never comes)

    def _first_token(self, other, filled: int, should_stop) -> None:
        """Until the lane that filled the shared prompt has taken its first token's pass (its cache holds
        more than it filled). That pass is one token; the waiters' own prompt tails (~16 tokens each)
        would otherwise share its step, and the request that evaluated the shared prompt first would
        show its first text ~0.6 s later than it could (all four of a burst then start together)."""
        end = time.monotonic() + self.FIRST_TOKEN_WAIT_S
        while len(other.tokens) <= filled and time.monotonic() < end and not (should_stop and should_stop()):
            time.sleep(self.POLL_S)

    def _wait(self, seq: int, other, tokens: list[int], n: int, should_stop) -> None:
        """Until sequence `seq` holds tokens[:n] (or stopped filling). Its cache may still hold an older
        conversation, longer than n, until its fill begins: the prefix is checked, but only when the
        length changed (a few times a pass: a check per poll, in three waiting threads, took the GIL
        from the batch thread often enough to slow every pass)."""
        seen = -1
        while seq in self.filling and not (should_stop and should_stop()):
            if len(other.tokens) != seen:
                have = list(other.tokens)
                seen = len(have)
                if seen >= n and common_prefix(have, tokens) >= n:
                    return
            time.sleep(self.POLL_S)
