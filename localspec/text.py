"""Confirmed tokens -> text: incremental UTF-8 decoding and stop strings.

A token may end in the middle of a multi-byte character (byte-fallback tokens, BPE splits), so
bytes are buffered until they decode. Text that could still be the start of a stop string is
held back; once a stop string appears, nothing from it onward is ever emitted, even when it
arrived in the middle of an accepted draft.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass
class Chunk:
    """A piece of confirmed output, as a generation yields it."""
    text: str  # text now safe to show (may be "" while a UTF-8 char or a stop string is pending)
    token: int | None = None
    source: str | None = None  # "model" | "ngram" (an accepted draft token) | "target"


class TextStream:
    def __init__(self, stop: list[str] | None = None, skip: str = ""):
        """skip: text the output starts with that is not shown (a healed token's text, already in the prompt)."""
        self.stop = [s for s in (stop or []) if s]
        self._skip = len(skip)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded, not yet emitted (could be a stop-string prefix)
        self.stopped = False
        self.stop_word = ""  # the stop string that ended the text
        self.text = ""  # everything emitted so far

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that is now safe to emit."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(piece)
        if self._skip:
            n = min(self._skip, len(self._pending))
            self._pending, self._skip = self._pending[n:], self._skip - n
        return self._release(final=False)

    def flush(self) -> str:
        """End of generation: emit what was held back (it can no longer become a stop string)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stop:
            hits = [(i, s) for i, s in ((self._pending.find(s), s) for s in self.stop) if i >= 0]
            if hits:
                at, self.stop_word = min(hits)
                out = self._pending[:at]
                self._pending = ""
                self.stopped = True
                self.text += out
                return out
        keep = 0 if final else self._held_back()
        out = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep:]
        self.text += out
        return out

    def _held_back(self) -> int:
        """Length of the longest suffix of pending text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:n]):
                    best = n
                    break
        return best
