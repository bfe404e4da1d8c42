"""FIM prompts for an editor that types: windows chosen so consecutive requests share an exact prefix.

llama-server's layout (`fim.infill_tokens`) puts the text typed on the current line before the
suffix and takes "the last N tokens" of the prefix, so every keystroke changes the prompt early
and the suffix (and often the whole prefix) is evaluated again. Here, with the same FIM tokens:

    [REP]myproject\\n [SEP]file\\n chunk ...   [SEP]filename\\n [PRE] anchor [SUF] suffix [MID] moved

- **anchor**: the prefix from a line-aligned start up to a line at or above the cursor. It is
  kept while the cursor stays below it and the text between it and the cursor (`moved`, which
  goes after FIM_MID as the start of the middle) fits `middle` tokens: typing, new lines and
  accepting a suggestion then only append to the prompt. Otherwise a new anchor ends at the
  cursor's line, and its start stays where the last one started while the window fits `prefix`
  tokens, or moves in one line-aligned step to three quarters of it.
- **suffix**: the first `suffix` tokens of the text after the cursor, cut at a line end.
- **extra context**: whole chunks, newest first, within `extra` tokens. A completion uses the
  newest set or, when an older set is cached and the newer one is not, the older one: editors'
  warm-up requests (n_predict 0) evaluate a new set in the background (`warmup_prompt`), and the
  completions switch to it once it is ready.

The prefix budget follows the measured prompt speed: about PREFIX_S seconds of evaluation
between PREFIX_MIN and llama-server's 1,536 tokens, unless `serve --fim-prefix` sets it; so does the
suffix's (SUFFIX_S, SUFFIX_MIN to SUFFIX_MAX), decided when an anchor is made and kept while it holds
(a suffix cut anew would be evaluated anew).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .layout import require_fim

PREFIX_S = 2.0  # a jump to a new area of a file costs about this much evaluation (typing then costs ~nothing)
PREFIX_MIN, PREFIX_MAX = 256, 1536
PREFIX_UNMEASURED = 384  # until a prompt evaluation has been timed
# A jump evaluates the suffix too: below ~100 suffix tokens a second of evaluation buys first-line quality,
# above it little (scripts/fim-quality; docs/BENCHMARKS.md, "Figures behind the code's rules").
SUFFIX_S = 1.0
SUFFIX_MIN, SUFFIX_MAX = 96, 160
NEWER_HEAD_SLACK = 16  # tokens more to evaluate that the newest extra context is still worth
KEEP_ANCHORS = 8
KEEP_HEADS = 3


@dataclass
class FimBudget:
    prefix: int = 0  # tokens before the anchor; 0 = sized by the measured prompt speed
    suffix: int = 0  # tokens after the cursor; 0 = sized by the measured prompt speed
    middle: int = 256  # tokens between the anchor and the cursor before the anchor moves
    extra: int = 1024


@dataclass
class EditorSettings:
    """`serve`'s choices for editors: the FIM layout and its budgets (the prompt caches are LoadConfig's)."""
    layout: str = "editor"  # "editor" (these windows) | "llama-server" (fim.infill_tokens)
    budget: FimBudget = field(default_factory=FimBudget)


@dataclass
class EditorWindows:
    model: object
    budget: FimBudget = field(default_factory=FimBudget)
    prompt_tps: float = 0.0  # measured prompt evaluation speed (tokens/s), 0 until known
    anchors: list[str] = field(default_factory=list)  # recent anchor texts, newest last
    heads: list[list[int]] = field(default_factory=list)  # recent extra-context token runs, newest last
    last_local: list[int] = field(default_factory=list)
    anchor_suffix: int = 0  # the suffix budget decided with the anchor in use

    def tok(self, text: str) -> list[int]:
        return self.model.tokenize(text, add_special=False, parse_special=False) if text else []

    def prefix_budget(self) -> int:
        return self._sized(self.budget.prefix, PREFIX_S, PREFIX_MIN, PREFIX_MAX, PREFIX_UNMEASURED)

    def suffix_budget(self) -> int:
        return self._sized(self.budget.suffix, SUFFIX_S, SUFFIX_MIN, SUFFIX_MAX, SUFFIX_MAX)

    def _sized(self, given: int, seconds: float, least: int, most: int, unmeasured: int) -> int:
        """`given` tokens when set, else about `seconds` of the measured prompt speed within [least, most]."""
        if given:
            return given
        if not self.prompt_tps:
            return unmeasured
        return int(min(most, max(least, self.prompt_tps * seconds)))

    def observe(self, tokens: int, seconds: float) -> None:
        """A prompt evaluation's speed (only long ones say anything about it)."""
        if tokens >= 64 and seconds > 0:
            tps = tokens / seconds
            self.prompt_tps = tps if not self.prompt_tps else 0.7 * self.prompt_tps + 0.3 * tps

    # --- the local context ----------------------------------------------------------------------
    def local(self, prefix: str, middle: str, suffix: str) -> tuple[list[int], str]:
        """The local context's tokens, and the text of its last token when that is left out (token
        healing: a prompt that ends inside a word or an indentation continues it badly, so the
        output must start with that text instead; `GenConfig.heal`)."""
        fim = self.model.fim_tokens()
        require_fim(fim)
        anchor, moved = self._anchor(prefix, middle)
        head = [fim["sep"], *self.tok("filename\n")] if "sep" in fim else []
        bos = [self.model.bos] if self.model.add_bos else []
        moved_toks, heal = self.tok(moved), ""
        if moved_toks:
            try:
                heal = self.model.piece(moved_toks[-1]).decode("utf-8")
                moved_toks.pop()
            except UnicodeDecodeError:  # part of a character: keep the token
                heal = ""
        toks = [*head, *bos, fim["pre"], *self.tok(anchor), fim["suf"], *self._suffix(suffix), fim["mid"], *moved_toks]
        self.last_local = toks
        return toks, heal

    def _anchor(self, prefix: str, middle: str) -> tuple[str, str]:
        before = prefix + middle
        for a in reversed(self.anchors):
            i = before.rfind(a) if a else 0
            if i >= 0 and (i == 0 or before[i - 1] == "\n") and i + len(a) <= len(prefix):
                moved = before[i + len(a):]
                if len(self.tok(moved)) <= self.budget.middle:
                    self._remember(a)
                    return a, moved
        anchor = prefix[self._start(prefix):]
        self._remember(anchor)
        return anchor, middle

    def _remember(self, anchor: str) -> None:
        if not self.anchor_suffix or anchor != self.anchors[-1]:
            self.anchor_suffix = self.suffix_budget()  # another area: its suffix is evaluated anyway
        if anchor in self.anchors:
            self.anchors.remove(anchor)
        self.anchors = [*self.anchors, anchor][-KEEP_ANCHORS:]

    def _start(self, prefix: str) -> int:
        """Where a new anchor's window starts: the last window's start while it fits, else a step."""
        budget = self.prefix_budget()
        for a in reversed(self.anchors):
            mark = a[:256]
            i = prefix.find(mark) if mark else -1
            if i >= 0 and (i == 0 or prefix[i - 1] == "\n") and len(self.tok(prefix[i:])) <= budget:
                return i
        return _fit_from_end(prefix, budget * 3 // 4, self.tok)

    def _suffix(self, suffix: str) -> list[int]:
        end = _fit_from_start(suffix, self.anchor_suffix, self.tok)  # set by _anchor, which local() calls first
        return self.tok(suffix[:end])

    # --- the extra context ----------------------------------------------------------------------
    def head(self, chunks: list[dict]) -> list[int]:
        """[REP]myproject\\n then whole chunks, newest kept, within the extra budget."""
        fim = self.model.fim_tokens()
        parts, used = [], 0
        for chunk in reversed(chunks):
            name = chunk.get("filename") or "tmp"
            sep = [fim["sep"], *self.tok(name + "\n")] if "sep" in fim else self.tok("\n\n--- snippet ---\n\n")
            toks = sep + self.tok(chunk["text"])
            if used + len(toks) > self.budget.extra:
                break
            parts.append(toks)
            used += len(toks)
        rep = [fim["rep"], *self.tok("myproject\n")] if "rep" in fim else []
        return rep + [t for p in reversed(parts) for t in p]

    def completion_prompt(self, body: dict, chunks: list[dict], cached_prefix) -> tuple[list[int], str]:
        """The prompt for a completion and its healed text (`local`). `cached_prefix(tokens)` says how
        much of a prompt is cached. The newest extra context serves unless a set used before, cached
        whole, leaves more than NEWER_HEAD_SLACK tokens less to evaluate: then the one that leaves
        least. (A newest set half evaluated by an interrupted warm-up is more cached than the set in
        use and still leaves the whole local context to evaluate.)"""
        local, heal = self.local(body["input_prefix"], body.get("prompt") or "", body["input_suffix"])
        newest = self.head(chunks)
        best, best_left = newest + local, len(newest) + len(local) - cached_prefix(newest + local)
        least, better = best_left, best
        for h in reversed(self.heads):
            if h == newest:
                continue
            n = cached_prefix(h + local)
            if n >= len(h) and len(h) + len(local) - n < least:
                least, better = len(h) + len(local) - n, h + local
        if least + NEWER_HEAD_SLACK < best_left:
            best = better
        self._use_head(best[:len(best) - len(local)])
        return best, heal

    def warmup_prompt(self, chunks: list[dict]) -> list[int]:
        """An editor's warm-up (new extra context, n_predict 0): the new set followed by the last
        completion's local context, so the next completion nearby starts from a cached prefix."""
        head = self.head(chunks)
        self._use_head(head)
        return head + self.last_local if self.last_local else head

    def _use_head(self, head: list[int]) -> None:
        self.heads = [h for h in self.heads if h != head][-(KEEP_HEADS - 1):] + [head]


def _fit_from_end(text: str, budget: int, tok) -> int:
    """The earliest line start s with tokens(text[s:]) <= budget (binary search over lines)."""
    starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n" and i + 1 < len(text)]
    lo, hi = 0, len(starts) - 1  # find the smallest index whose tail fits
    if len(tok(text[starts[hi]:])) > budget:
        return starts[hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tok(text[starts[mid]:])) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return starts[lo]


def _fit_from_start(text: str, budget: int, tok) -> int:
    """The latest line end e with tokens(text[:e]) <= budget (binary search over lines; 0 if none)."""
    ends = [i + 1 for i, c in enumerate(text) if c == "\n"]
    if not ends or ends[-1] != len(text):
        ends.append(len(text))
    lo, hi = -1, len(ends) - 1  # the largest index that fits (-1: none)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tok(text[:ends[mid]])) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return ends[lo] if lo >= 0 else 0
