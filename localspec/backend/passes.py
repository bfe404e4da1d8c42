"""Where a prompt's evaluation is cut into passes, and which cached prefix a prompt may reuse, so that the
same request gives the same text whatever the cache held before (docs/EXACT.md).

llama.cpp computes a row with other arithmetic depending on the pass it is in (its size, the row's place in
it), so a prompt's rows repeat only when it goes in the same passes. A fresh evaluation cuts a prompt at its
`boundaries`: the messages' starts (the chat template's turn-start tokens) and every `step` tokens within a
message; a prompt reuses a cached prefix only up to a place where the cached passes were cut the same way
(`reuse_point`). A conversation's next turn is the exception that makes follow-ups fast: the cached answer's
rows came from decoding, which no prompt evaluation repeats anyway, so it is reused whole, as llama-server
reuses it, and only what is new is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SHORT = 8  # no cut this close to a message's start or to the prompt's end (the template's header for the
# answer goes in the last message's pass): a few more rows in a pass cost far less than a pass of their own
MESSAGE_MIN = 64  # a message's start is a cut this far after the last one: a short system prompt goes in one
# pass with the first question, as a plain evaluation has it (small passes cost more a row), a long one alone


@dataclass
class Cuts:
    """How a cached sequence's rows were computed. `at`: the positions where a prompt's pass ended or began
    (no pass straddles them), ascending; `dirty_from`: the first row computed otherwise (an answer's decoding,
    a fill that began where no fresh evaluation cuts); `decoded_from`: the first row of an answer's decoding.
    None when there is no such row."""
    at: list[int] = field(default_factory=list)
    dirty_from: int | None = None
    decoded_from: int | None = None

    def truncate(self, n: int) -> None:
        """The sequence keeps its first n rows."""
        while self.at and self.at[-1] > n:
            self.at.pop()
        if self.dirty_from is not None and self.dirty_from >= n:
            self.dirty_from = None
        if self.decoded_from is not None and self.decoded_from >= n:
            self.decoded_from = None

    def copy(self, n: int | None = None) -> "Cuts":
        """The record of the first n rows (all of them by default)."""
        out = Cuts(list(self.at), self.dirty_from, self.decoded_from)
        if n is not None:
            out.truncate(n)
        return out

    def add(self, pos: int) -> None:
        if not self.at or self.at[-1] < pos:
            self.at.append(pos)

    def dirty(self, pos: int) -> None:
        """Rows from `pos` on were not computed as a fresh evaluation of a prompt computes them."""
        self.dirty_from = pos if self.dirty_from is None else min(self.dirty_from, pos)

    def decoded(self, pos: int) -> None:
        """Rows from `pos` on are an answer's (decoding and verify passes)."""
        self.dirty(pos)
        self.decoded_from = pos if self.decoded_from is None else min(self.decoded_from, pos)

    def to_json(self) -> dict:
        return {"at": self.at, "dirty_from": self.dirty_from, "decoded_from": self.decoded_from}

    @classmethod
    def from_json(cls, d) -> "Cuts":
        """A saved record; an unreadable one is an empty one (the prompt then reuses nothing it cannot trust)."""
        try:
            at = sorted({int(x) for x in d["at"]})
            dirty, decoded = d.get("dirty_from"), d.get("decoded_from")
            return cls(at, None if dirty is None else int(dirty), None if decoded is None else int(decoded))
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls()


def boundaries(tokens: list[int], turn_starts: frozenset[int], step: int) -> list[int]:
    """Where a fresh evaluation of `tokens` cuts its passes, ascending, 0 and the end left out: each message's
    start (a turn-start token) at least MESSAGE_MIN after the last such cut, and every `step` tokens after it,
    no cut within MESSAGE_MIN of the next such start or within SHORT of the end. So two prompts that share a
    beginning share its cuts, but for the last MESSAGE_MIN tokens they share."""
    end = len(tokens) - SHORT
    out: list[int] = []
    start = 0  # the last message start that is a cut
    for s in [i for i, t in enumerate(tokens) if 0 < i < end and t in turn_starts] if turn_starts else []:
        if s - start >= MESSAGE_MIN:
            out += range(start + step, s - MESSAGE_MIN + 1, step)
            out.append(s)
            start = s
    out += range(start + step, end + 1, step)
    return out


def pass_ends(bounds: list[int], start: int, length: int) -> list[int]:
    """The ends of the passes that evaluate positions start..length: the boundaries after `start` (none within
    SHORT of it: a fill that resumes after a cached answer merges the answer's last tokens into the next
    message's pass), then the end."""
    return [b for b in bounds if b >= start + SHORT] + [length]


def reuse_point(cuts: Cuts, shared: int, length: int, bounds: list[int]) -> int:
    """How much of a cached prefix (`shared` tokens equal to the prompt's, cut as `cuts` says) a prompt of
    `length` tokens with these `bounds` reuses: up to a cut that a fresh evaluation makes too, with only
    such passes before it (the same rows), or, in a conversation's next turn, the cached answer whole (its
    rows are a decoding's in any case): past an answer's first row, any place no pass straddles will do."""
    limit = min(shared, length - 1)
    dirty, decoded = cuts.dirty_from, cuts.decoded_from
    last = cuts.at[-1] if cuts.at else 0
    if decoded is not None and limit > decoded and limit > last:  # resuming inside a decoded answer
        return limit
    wanted = set(bounds)
    for c in reversed(cuts.at):
        if c <= limit and ((c in wanted and (dirty is None or c <= dirty)) or (decoded is not None and c >= decoded)):
            return c
    return 0
