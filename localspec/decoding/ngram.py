"""The n-gram drafter (prompt lookup): finds the latest earlier occurrence of the sequence's last n tokens
(prompt, conversation, output, a request's predicted output, earlier answers) and proposes what followed it.
An index of n-gram -> latest position makes each lookup O(1); no model call, so a draft costs ~nothing."""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass

from ..backend import common_prefix
from .draft import Draft


class NgramDrafter:
    """Prompt lookup with long drafts: it proposes the longest continuation its evidence supports and
    leaves k to the policy, which prices it over the whole measured pass curve (on a CPU long passes are
    the cheapest per token, so a copy is best verified in long drafts).

    Where the text comes from, in order: the copy being followed (the source the last proposal came
    from, while the confirmed text keeps matching it: a copied file is followed through repeated lines
    instead of jumping to the latest occurrence of its last n tokens), the request's predicted output
    (OpenAI's `prediction`, re-aligned after the answer inserts or deletes text), the text so far
    (prompt, conversation, output), then the memory of earlier generations. The match length (how far
    the agreement reaches back, up to MATCH_CAP) is the evidence the policy's acceptance buckets read."""

    name = "ngram"

    MATCH_CAP = 64  # how far back a match is measured (its length says how trustworthy it is)
    # a copy resumes after an edit only when it had held this long (a copied file, not a chance match
    # in a chat answer); once after each edit until the resumed copy holds
    RESYNC_AFTER = 8
    WHOLE_ANSWER_COPY = 8  # an answer that has copied one place this long from its first token on is a copy

    def __init__(self, n_min: int = 2, n_max: int = 4, k_max: int = 64, memory: "NgramMemory | None" = None):
        self.n_min, self.n_max, self.k_max = n_min, n_max, k_max
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> position right after its latest occurrence
        self.seq: list[int] = []  # the sequence the index describes (a reference to the engine's list)
        self.indexed = 0  # n-grams ending at positions < indexed are in the index
        # memory of earlier generations (a server's earlier requests and answers, shared by its parallel
        # requests): consulted only when the current text has no match, so a repeated or templated
        # request drafts from past answers
        self.memory = memory if memory is not None else NgramMemory()
        self.recall = True  # whether this run may draft from the memory (not when its answer must be reproducible)
        self.follow: Follow | None = None  # the copy the last proposal came from
        self.answer_start = 0  # where this generation's answer begins in `seq`
        self.prediction = Prediction([], 0, 0)  # the request's predicted output (empty: none)
        self._forget_edits()

    def begin(self, seq: list[int], prediction: list[int] | None = None) -> None:
        """A new generation over `seq` (the engine's list, which grows), with its predicted output if any."""
        self._attach(seq)
        self.answer_start = len(seq)
        self.prediction = Prediction(list(prediction or []), self.n_min, self.n_max)
        # a prediction is the answer's expected text: its first token is the first guess
        self.follow = Follow(self.prediction.tokens, 0, len(seq), self.n_max, "prediction") if prediction else None
        self._forget_edits()

    def _forget_edits(self) -> None:
        """A new answer: what the last one's edits were says nothing about this one's."""
        self.edits = {"replace": 0, "insert": 0}  # the copy's edits so far that resumed it, by kind
        self.rewrites = Rewrites()
        # (source, position, answer index, how long it had held) of a lost copy
        self.broken: tuple[list[int], int, int, int] | None = None

    def _attach(self, seq: list[int]) -> None:
        self.follow = None  # a copy followed in another sequence says nothing about this one
        if common_prefix(self.seq, seq) < self.indexed:  # a different conversation: rebuild
            self.index.clear()
            self.indexed = 0
        self.seq = seq

    def _update(self, seq: list[int]) -> None:
        # index every n-gram that ends before the last token (the suffix itself is the query)
        index, lo, hi = self.index, self.n_min, self.n_max
        for end in range(max(self.indexed, lo), len(seq)):
            for n in range(lo, min(hi, end) + 1):
                index[tuple(seq[end - n:end])] = end
        self.indexed = max(self.indexed, len(seq))

    def lookup(self, seq: list[int], k: int) -> tuple[list[int], int]:
        """(continuation of the longest matching suffix, match length); ([], 0) when none."""
        found = self.find(seq)
        return (found.source[found.pos:found.pos + k], found.match) if found else ([], 0)

    def find(self, seq: list[int]) -> "Follow | None":
        """Where the text continues: the copy being followed while it still matches, else the longest
        suffix match in the prediction, the text so far, then the memory."""
        if self.seq is not seq:
            self._attach(seq)
        self._update(seq)  # the suffix itself is never in the index, so a match is earlier text
        if self.follow is not None:
            resumed = self._resume(self.follow, seq)
            if resumed is not None:
                return resumed
        found = self.prediction.find(seq, self.MATCH_CAP)
        if found is not None:
            return self._refound(found, seq)
        for n in range(min(self.n_max, len(seq) - 1), self.n_min - 1, -1):
            key = tuple(seq[-n:])
            pos = self.index.get(key)
            if pos is not None:
                return self._refound(Follow(seq, pos, len(seq), _extend_match(seq, pos, seq, n, self.MATCH_CAP), "text"), seq)
            past = self.memory.find(key) if self.recall else None
            if past is not None:
                text, pos = past
                return Follow(text, pos, len(seq), _extend_match(text, pos, seq, n, self.MATCH_CAP), "memory")
        return None

    def _resume(self, f: "Follow", seq: list[int]) -> "Follow | None":
        """The copy being followed, where the confirmed text goes on through it. When the target's own
        token broke it (a rename, an edited number, a word put in), the copy resumes right after that
        token: past the source's token it replaced, or at that token when the target's was put in before
        it; the kind that held more often in this answer is tried first, the other when the first fails.
        Without this the suffix after an edit is new text (" upper)") that matches nowhere, or in the
        wrong place, for a few tokens at every edit."""
        new = seq[f.at:]
        if f.skip and self.rewrites.at(f.source, f.pos) is None:  # the rewrite it was in was dropped
            return None
        ahead = self._ahead(f, len(new))
        held = common_prefix(ahead.tokens, new)
        if held < len(ahead.tokens) and ahead.edited[held]:  # a repeated edit the answer did not make here
            self.rewrites.drop(ahead.places[held][3])
            ahead = self._ahead(f, len(new))
            held = common_prefix(ahead.tokens, new)
        if f.resync and not held:  # the other kind of edit?
            kind = "insert" if f.resync == "replace" else "replace"
            alt = Follow(f.source, f.pos - 1 if kind == "insert" else f.pos + 1, f.at, f.match, f.origin, kind, f.copied)
            alt_ahead = self._ahead(alt, len(new)) if alt.pos >= 0 else None
            if alt_ahead is not None and alt_ahead.tokens == new:
                f, ahead, held = alt, alt_ahead, len(new)
        if f.resync and held:
            self.edits[f.resync] += 1
            self._learn(f, seq)
        pos, skip = ahead.after(held, f)
        if f.origin == "prediction":  # the answer went through the prediction this far, at least
            self.prediction.last = pos
        if pos >= len(f.source):
            return None
        if held == len(new):
            return Follow(f.source, pos, len(seq), min(self.MATCH_CAP, f.match + len(new)), f.origin,
                          copied=f.copied, skip=skip)
        copied = max(f.copied, f.match + held)
        if held == len(new) - 1 and (held or not f.resync) and copied >= self.RESYNC_AFTER and not skip:
            # the evidence starts again from the edit (edits come in clusters: a long draft right after
            # one often runs into the next)
            kind = max(("replace", "insert"), key=self.edits.get)
            return Follow(f.source, pos + (kind == "replace"), len(seq), 0, f.origin, resync=kind, copied=copied,
                          broke=(pos, f.at + held))
        if copied >= self.RESYNC_AFTER and not skip:  # lost: where the copy is found again says what the edit was
            self.broken = (f.source, *(f.broke or (pos, f.at + held)), copied)
        return None

    def _refound(self, found: "Follow", seq: list[int]) -> "Follow":
        """The copy lost at an edit of several tokens is found again a little further on: the source's
        tokens in between and the answer's are a rewrite, drafted wherever those source tokens come again
        (a name renamed into other tokens, `_extension_registry` -> `_EXTENSION_REGISTRY`)."""
        if self.broken is None:
            return found
        source, p, at, copied = self.broken
        q, end = found.pos - found.match, len(seq) - found.match  # where the agreement found again begins
        if found.source is source and p <= q <= p + Rewrites.MAX_LEN and at <= end <= at + Rewrites.MAX_LEN:
            key, made = tuple(source[p:q]), tuple(seq[at:end])
            if not key and p and seq[at - 1] == source[p - 1]:  # tokens put in before source[p]
                key, made = (source[p - 1],), (source[p - 1], *made)
            self.rewrites.add(key, made)
            self.broken = None
            found.copied = max(found.copied, copied)  # the same copy, found again: its evidence goes on
        elif len(seq) - at > 2 * Rewrites.MAX_LEN:
            self.broken = None
        return found

    def _learn(self, f: "Follow", seq: list[int]) -> None:
        """A copy resumed after an edit held: the same edit is drafted wherever the source token comes again."""
        if f.pos < 1 or f.at < 2:
            return
        old, new = f.source[f.pos - 1], seq[f.at - 1]
        if f.resync == "replace":
            self.rewrites.add((old,), (new,))
        elif seq[f.at - 2] == old:
            self.rewrites.add((old,), (old, new))

    def _ahead(self, f: "Follow", n: int) -> "Ahead":
        """Up to n tokens of the copy from where `f` stands, with this answer's repeated edits made."""
        source, pos = f.source, f.pos
        if not self.rewrites and not f.skip:  # the common case, every drafting step: the source as it is
            part = source[pos:pos + n]
            return Ahead(part, [(p, 0, 1, (t,)) for p, t in enumerate(part, pos)], [False] * len(part))
        out = Ahead([], [], [])
        while len(out.tokens) < n + f.skip and pos < len(source):
            key = self.rewrites.at(source, pos) if self.rewrites else None
            made = self.rewrites.rules[key] if key else (source[pos],)
            key = key or (source[pos],)
            for j, r in enumerate(made):
                out.tokens.append(r)
                out.places.append((pos, j, len(made), key))
                out.edited.append(j >= len(key) or r != key[j])
            pos += len(key)
        k = slice(f.skip, f.skip + n)
        return Ahead(out.tokens[k], out.places[k], out.edited[k])

    def _held(self, f: "Follow", seq: list[int]) -> int:
        """How long the copy behind a proposal has held: its match, or before an edit it resumes after; an
        answer that has been this copy from its first token on (a file returned whole) counts as fully held."""
        answered = len(seq) - self.answer_start
        if f.match >= answered >= self.WHOLE_ANSWER_COPY and not f.resync:
            return self.MATCH_CAP
        return max(f.match, f.copied)

    def remember(self, seq: list[int]) -> None:
        """Keep a finished generation's whole text (prompt and answer) for later lookups."""
        self.memory.remember(seq, self.n_min, self.n_max)

    def propose(self, seq: list[int], room: int, policy) -> Draft:
        f = self.follow = self.find(seq)
        if f is None:
            return Draft(source=self.name)
        found = self._ahead(f, min(self.k_max, room)).tokens
        k = policy.k_for(self.name, len(found), f.match, f.origin, resync=bool(f.resync),
                         held=self._held(f, seq)) if found else 0
        return Draft(tokens=found[:k], probs=[None] * k, source=self.name, match_len=f.match,
                     shadow=found if found and not k else None, origin=f.origin, resync=bool(f.resync))


class NgramMemory:
    """Earlier generations' whole texts, indexed by their n-grams, most recent kept (MEMORY_TOKENS); one
    per engine, shared by the n-gram drafters of a server's parallel requests (hence the lock)."""

    MEMORY_TOKENS = 32768

    def __init__(self):
        self.texts: list[list[int]] = []
        self.index: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (text id, position after it)
        self.base = 0  # id of texts[0] (ids keep growing as old texts are dropped)
        self.lock = threading.Lock()

    def find(self, key: tuple[int, ...]) -> tuple[list[int], int] | None:
        """(text, position after the n-gram's latest occurrence), or None."""
        with self.lock:
            hit = self.index.get(key)
            return (self.texts[hit[0] - self.base], hit[1]) if hit is not None else None

    def remember(self, seq: list[int], n_min: int, n_max: int) -> None:
        if len(seq) < n_min + 1:
            return
        text = list(seq)
        with self.lock:
            text_id = self.base + len(self.texts)
            self.texts.append(text)
            for end in range(n_min, len(text)):
                for n in range(n_min, min(n_max, end) + 1):
                    self.index[tuple(text[end - n:end])] = (text_id, end)
            while sum(map(len, self.texts)) > self.MEMORY_TOKENS and len(self.texts) > 1:
                self.texts.pop(0)
                self.base += 1
                self.index = {g: h for g, h in self.index.items() if h[0] >= self.base}


@dataclass
class Follow:
    """A place in some text where the confirmed sequence is expected to continue: `source[pos:]` is
    the proposal, made when the sequence was `at` tokens long, with `match` tokens of agreement behind it."""
    source: list[int]
    pos: int
    at: int
    match: int
    origin: str  # "prediction" | "text" | "memory"
    resync: str = ""  # resumed after an edit, not confirmed since: "replace" | "insert" (its guessed kind)
    copied: int = 0  # the longest agreement this copy had before its latest edit
    skip: int = 0  # the source tokens at pos are rewritten: this many of the rewrite's tokens are confirmed
    broke: tuple[int, int] | None = None  # resuming after an edit: (source position, answer index) of the edit


@dataclass
class Ahead:
    """The copy's next tokens with the answer's repeated edits made: for each, the place it stands for
    (source position, its index in the rewrite made there, the rewrite's length, the source tokens
    rewritten) and whether an edit made it (not the source's own token)."""
    tokens: list[int]
    places: list[tuple[int, int, int, tuple[int, ...]]]
    edited: list[bool]

    def after(self, held: int, f: Follow) -> tuple[int, int]:
        """Where the copy stands after `held` of these tokens: (source position, tokens of its rewrite confirmed)."""
        if not held:
            return f.pos, f.skip
        pos, j, size, key = self.places[held - 1]
        return (pos, j + 1) if j + 1 < size else (pos + len(key), 0)


class Rewrites:
    """Edits that repeat through a copied file, learned from the answer's own: source tokens -> what
    the answer wrote for them ((NEW,) for a renamed token, (OLD, NEW) for a token put in after OLD,
    longer for a name renamed into other tokens). Made in the copy's drafts from then on, dropped the
    first time the answer does not make one."""

    MAX_LEN = 8  # tokens on either side: a renamed identifier, not a rewritten paragraph

    def __init__(self):
        self.rules: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.starting: dict[int, list[tuple[int, ...]]] = {}  # first source token -> keys, longest first

    def __bool__(self) -> bool:
        return bool(self.rules)

    def add(self, key: tuple[int, ...], made: tuple[int, ...]) -> None:
        if not key or key == made or len(key) > self.MAX_LEN or len(made) > self.MAX_LEN:
            return
        if key not in self.rules:
            keys = self.starting.setdefault(key[0], [])
            keys.append(key)
            keys.sort(key=len, reverse=True)
        self.rules[key] = made

    def drop(self, key: tuple[int, ...]) -> None:
        if self.rules.pop(key, None) is not None:
            self.starting[key[0]].remove(key)

    def at(self, source: list[int], pos: int) -> tuple[int, ...] | None:
        """The longest learned key that source[pos:] starts with."""
        for key in self.starting.get(source[pos], ()) if pos < len(source) else ():
            if tuple(source[pos:pos + len(key)]) == key:
                return key
        return None


class Prediction:
    """A predicted output, indexed so the answer can be re-aligned with it after an insertion or a
    deletion: a suffix match is looked for at or after the last aligned place first (a prediction
    repeats lines, and the answer moves through it in order)."""

    def __init__(self, tokens: list[int], n_min: int, n_max: int):
        self.tokens, self.n_min, self.n_max = tokens, n_min, n_max
        self.where: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions right after each occurrence
        for end in range(n_min, len(tokens)):
            for n in range(n_min, min(n_max, end) + 1):
                self.where.setdefault(tuple(tokens[end - n:end]), []).append(end)
        self.last = 0  # the last aligned place

    def find(self, seq: list[int], cap: int) -> Follow | None:
        for n in range(min(self.n_max, len(seq) - 1), self.n_min - 1, -1):
            places = self.where.get(tuple(seq[-n:]))
            if places:
                i = bisect_left(places, self.last)  # places are in order: the first one at or after the last
                pos = places[i] if i < len(places) else places[-1]
                self.last = pos
                return Follow(self.tokens, pos, len(seq), _extend_match(self.tokens, pos, seq, n, cap), "prediction")
        return None


def _extend_match(src: list[int], pos: int, seq: list[int], n: int, cap: int) -> int:
    """How far the match of seq's last n tokens with src[pos - n:pos] reaches back (up to cap): a
    suffix that repeats 20 tokens of earlier text (copying a function) is a far better bet than a
    coincidental bigram."""
    end = len(seq)
    while n < cap and pos - n - 1 >= 0 and end - n - 1 >= 0 and src[pos - n - 1] == seq[end - n - 1]:
        n += 1
    return n
